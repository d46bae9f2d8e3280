//! Finding 4 (arena; not fixed here, src/arena/** is being rewritten): with
//! `CK_BUMP_FORCE_MIXED` set and no weights file, `build()` (and the C ABI's
//! `ck_bump_alloc_init(a, NULL, ...)`) fails with `NoWeightsFile` — "no weights
//! file: mixed mode and materialization need one (builder .weights_file(path))" —
//! which does not say that the environment variable is why anonymous mode
//! was skipped. Own test binary: it sets the environment.

#[test]
#[cfg_attr(miri, ignore)]
#[ignore = "finding 4: CK_BUMP_FORCE_MIXED without a weights file gives an error that does not name the variable (src/arena/mod.rs ArenaBuilder::auto)"]
fn review_force_mixed_without_file_names_the_variable() {
    std::env::set_var("CK_BUMP_FORCE_MIXED", "1");
    let err = ckalloc::BumpArena::builder(1 << 20)
        .build()
        .expect_err("mixed mode needs a file");
    let msg = err.to_string();
    assert!(
        msg.contains("CK_BUMP_FORCE_MIXED"),
        "the error must name the variable that skipped anonymous mode: {msg}"
    );
}
