//! Finding 3: `CKALLOC_THP=off` left THP advice on, although docs/arena.md says
//! the crate's `CKALLOC_*` knobs (unlike `CK_BUMP_*`) treat `off` as false.
//! Own test binary: the knob is read once per process.

#[test]
#[cfg_attr(miri, ignore)]
fn review_ckalloc_thp_off_disables_thp() {
    // Set before the first mapping of this process (the knob is cached).
    std::env::set_var("CKALLOC_THP", "off");
    std::env::set_var("CKALLOC_HUGETLB", "OFF");
    let r = ckalloc::HugeRegion::new(4 << 20).unwrap();
    assert_eq!(
        r.backing(),
        ckalloc::Backing::Normal,
        "CKALLOC_THP=off must disable THP advice"
    );
    assert_eq!(
        ckalloc::huge_stats().hugetlb_fallbacks,
        0,
        "CKALLOC_HUGETLB=OFF must skip the hugetlb tier"
    );
}
