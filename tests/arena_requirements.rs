//! Every `HugeOptions` requirement (`require`, `populate`, `mlock`,
//! `numa_node`) is honoured or refused with a typed error in each arena mode
//! (anon, mixed: the options apply to the runtime region); preferences
//! (`hugetlb(true)`, `allow_1gib`) may fall back and `backing()` reports the
//! tier. One test per cell of the table in `docs/arena.md`.
//!
//! "Beyond the pool" requests ask for one 2 MiB hugetlb page more than the
//! machine's pool holds, so hugetlb cannot serve them on any machine (CI
//! reserves 512 pages); no test changes `nr_hugepages`.

mod common;

use ckalloc::*;
use std::io::Write;
use tempfile::NamedTempFile;

const MIB: usize = 1 << 20;
/// The weights end 50 bytes into the third page.
const AB: usize = 8192 + 50;

fn read_usize(path: &str) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The most 2 MiB hugetlb pages the kernel can hand out: the pool plus the
/// surplus it may add. (Not the free count: pages other tests hold now may
/// be free again by the time the request is made.)
fn pool_2m_pages() -> usize {
    let d = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    read_usize(&format!("{d}/nr_hugepages")) + read_usize(&format!("{d}/nr_overcommit_hugepages"))
}

/// An arena size that the 2 MiB hugetlb pool can never serve.
fn beyond_pool() -> usize {
    (pool_2m_pages() + 1).max(2) * 2 * MIB
}

fn thp_on() -> bool {
    let mode = common::thp_setting("enabled");
    let env_off = std::env::var("CKALLOC_THP")
        .map(|v| matches!(v.trim(), "" | "0" | "false" | "no" | "off"))
        .unwrap_or(false);
    !env_off && (mode.contains("[always]") || mode.contains("[madvise]"))
}

fn weights_file() -> NamedTempFile {
    let mut f = NamedTempFile::new().unwrap();
    f.write_all(&[0x42; AB]).unwrap();
    f.flush().unwrap();
    f
}

fn arena(total: usize, policy: ModePolicy, opts: HugeOptions, f: &NamedTempFile) -> ArenaBuilder {
    BumpArena::builder(total)
        .weights_file(f.path())
        .activations_base(AB)
        .policy(policy)
        .huge(opts)
}

fn is_tier_unavailable(e: &HugeError, tier: Backing) -> bool {
    matches!(e, HugeError::TierUnavailable { required, .. } if *required == tier)
}

/// The source of an anon-mode or mixed-mode options failure.
fn huge_source(e: &ArenaError) -> Option<&HugeError> {
    match e {
        ArenaError::Anon { source, .. } | ArenaError::MixedOptions { source } => Some(source),
        _ => None,
    }
}

/// `Locked:` of the VMA holding `addr` in `/proc/self/smaps`, in kB.
fn locked_kb(addr: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("Locked:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    0
}

// ---- require(Backing::Hugetlb)

#[test]
fn require_hugetlb_in_anon_mode_fails_beyond_the_pool_and_holds_within() {
    let f = weights_file();
    let opts = HugeOptions::new().require(Backing::Hugetlb);
    let e = arena(beyond_pool(), ModePolicy::AnonOnly, opts, &f)
        .build()
        .unwrap_err();
    assert!(
        huge_source(&e).is_some_and(|h| is_tier_unavailable(h, Backing::Hugetlb)),
        "{e:?}"
    );
    match arena(8 * MIB, ModePolicy::AnonOnly, opts, &f).build() {
        Ok(a) => assert_eq!(a.backing(), Backing::Hugetlb),
        Err(e) => println!("within the pool skipped: no free 2 MiB hugetlb pages ({e})"),
    }
}

#[test]
fn require_hugetlb_in_mixed_mode_fails_beyond_the_pool_and_holds_within() {
    let f = weights_file();
    let opts = HugeOptions::new().require(Backing::Hugetlb);
    let e = arena(beyond_pool(), ModePolicy::MixedOnly, opts, &f)
        .build()
        .unwrap_err();
    assert!(
        matches!(&e, ArenaError::MixedOptions { source } if is_tier_unavailable(source, Backing::Hugetlb)),
        "{e:?}"
    );
    match arena(8 * MIB, ModePolicy::MixedOnly, opts, &f).build() {
        Ok(a) => {
            assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
            assert_eq!(a.backing(), Backing::Hugetlb);
            assert!(a.weights().iter().all(|&b| b == 0x42));
        }
        Err(e) => println!("within the pool skipped: no free 2 MiB hugetlb pages ({e})"),
    }
}

#[test]
fn require_hugetlb_under_auto_reports_both_modes_failures() {
    // A weights file, hugetlb required, no hugetlb page for the request:
    // neither mode may fall back to THP.
    let f = weights_file();
    let opts = HugeOptions::new().require(Backing::Hugetlb);
    let e = arena(beyond_pool(), ModePolicy::Auto, opts, &f)
        .build()
        .unwrap_err();
    let ArenaError::BothModesFailed { anon, mixed } = &e else {
        panic!("expected both modes' failures, got {e:?}");
    };
    assert!(
        huge_source(anon).is_some_and(|h| is_tier_unavailable(h, Backing::Hugetlb)),
        "{anon:?}"
    );
    assert!(
        matches!(&**mixed, ArenaError::MixedOptions { source } if is_tier_unavailable(source, Backing::Hugetlb)),
        "{mixed:?}"
    );
}

// ---- require(Backing::TransparentHuge)

#[test]
fn require_thp_in_anon_mode_gives_thp_or_fails_typed() {
    let f = weights_file();
    let opts = HugeOptions::new()
        .hugetlb(false)
        .require(Backing::TransparentHuge);
    match arena(8 * MIB, ModePolicy::AnonOnly, opts, &f).build() {
        Ok(a) => {
            assert!(thp_on());
            assert_eq!(a.backing(), Backing::TransparentHuge);
        }
        Err(e) => {
            assert!(!thp_on(), "{e}");
            assert!(
                huge_source(&e).is_some_and(|h| is_tier_unavailable(h, Backing::TransparentHuge))
            );
        }
    }
}

#[test]
fn require_thp_in_mixed_mode_gives_thp_or_fails_typed() {
    let f = weights_file();
    let opts = HugeOptions::new().require(Backing::TransparentHuge);
    match arena(8 * MIB, ModePolicy::MixedOnly, opts, &f).build() {
        Ok(a) => {
            assert!(thp_on());
            assert_eq!(a.backing(), Backing::TransparentHuge);
        }
        Err(e) => {
            assert!(!thp_on(), "{e}");
            assert!(
                matches!(&e, ArenaError::MixedOptions { source } if is_tier_unavailable(source, Backing::TransparentHuge)),
                "{e:?}"
            );
        }
    }
}

// ---- populate

fn runtime_resident(a: &BumpArena) -> u64 {
    a.coverage().unwrap().runtime.mapped_bytes
}

#[test]
fn populate_in_anon_mode_prefaults_the_mapping() {
    let f = weights_file();
    let opts = HugeOptions::new().populate(true);
    let a = arena(8 * MIB, ModePolicy::AnonOnly, opts, &f)
        .build()
        .unwrap();
    assert!(runtime_resident(&a) >= (8 * MIB - 4 * 4096) as u64);
}

#[test]
fn populate_in_mixed_mode_prefaults_the_runtime_region() {
    let f = weights_file();
    let opts = HugeOptions::new().populate(true);
    let a = arena(8 * MIB, ModePolicy::MixedOnly, opts, &f)
        .build()
        .unwrap();
    assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
    assert!(runtime_resident(&a) >= (8 * MIB - 4 * 4096) as u64);
    let unpopulated = arena(8 * MIB, ModePolicy::MixedOnly, HugeOptions::new(), &f)
        .build()
        .unwrap();
    // Only the page that the copy of the partial last weights page faults
    // in: 4 KiB, or a whole 2 MiB huge page where THP backs it.
    assert!(runtime_resident(&unpopulated) <= (2 * MIB) as u64);
}

// ---- mlock

fn check_mlock(policy: ModePolicy) {
    let f = weights_file();
    let opts = HugeOptions::new().mlock(true);
    match arena(8 * MIB, policy, opts, &f).build() {
        // AddressSanitizer intercepts `mlock` and does nothing, so there
        // the pages are not locked.
        Ok(_) if common::under_asan() => println!("Locked: check skipped under AddressSanitizer"),
        Ok(a) => {
            let runtime = a.ptr_at(AB + 4096).unwrap().as_ptr() as usize;
            assert!(locked_kb(runtime) > 0, "runtime region locked");
        }
        Err(e) => assert!(
            matches!(huge_source(&e), Some(HugeError::Mlock { .. })),
            "refused with a typed error: {e:?}"
        ),
    }
}

#[test]
fn mlock_in_anon_mode_locks_the_mapping_or_fails_typed() {
    check_mlock(ModePolicy::AnonOnly);
}

#[test]
fn mlock_in_mixed_mode_locks_the_runtime_region_or_fails_typed() {
    check_mlock(ModePolicy::MixedOnly);
}

// ---- numa_node

fn check_numa(policy: ModePolicy) {
    let f = weights_file();
    // No machine has node 1000: the binding is refused, with a typed error.
    let e = arena(
        8 * MIB,
        policy,
        HugeOptions::new().numa_node(Some(1000)),
        &f,
    )
    .build()
    .unwrap_err();
    assert!(
        matches!(huge_source(&e), Some(HugeError::Mbind { node: 1000, .. })),
        "{e:?}"
    );
    // Node 0 exists: honoured, or refused with the same typed error where
    // the kernel has no NUMA support.
    if let Err(e) = arena(8 * MIB, policy, HugeOptions::new().numa_node(Some(0)), &f).build() {
        assert!(
            matches!(huge_source(&e), Some(HugeError::Mbind { node: 0, .. })),
            "{e:?}"
        );
    }
}

#[test]
fn numa_node_in_anon_mode_binds_or_fails_typed() {
    check_numa(ModePolicy::AnonOnly);
}

#[test]
fn numa_node_in_mixed_mode_binds_or_fails_typed() {
    check_numa(ModePolicy::MixedOnly);
}

// ---- preferences

#[test]
fn hugetlb_preference_in_anon_mode_falls_back_and_reports_the_tier() {
    let f = weights_file();
    let a = arena(beyond_pool(), ModePolicy::AnonOnly, HugeOptions::new(), &f)
        .build()
        .unwrap();
    assert_ne!(a.backing(), Backing::Hugetlb);
    let expect = if thp_on() {
        Backing::TransparentHuge
    } else {
        Backing::Normal
    };
    assert_eq!(a.backing(), expect);
}

#[test]
fn hugetlb_preference_in_mixed_mode_falls_back_to_thp_or_normal_pages() {
    let f = weights_file();
    let a = arena(
        8 * MIB,
        ModePolicy::MixedOnly,
        HugeOptions::new().hugetlb(true),
        &f,
    )
    .build()
    .unwrap();
    let expect = if thp_on() {
        Backing::TransparentHuge
    } else {
        Backing::Normal
    };
    assert_eq!(a.backing(), expect);
}

#[test]
fn allow_1gib_preference_in_anon_mode_falls_back_and_reports_the_tier() {
    let f = weights_file();
    let opts = HugeOptions::new().allow_1gib(true);
    let a = arena(beyond_pool(), ModePolicy::AnonOnly, opts, &f)
        .build()
        .unwrap();
    let gib = a.mapping().1.is_multiple_of(1 << 30);
    // Either 1 GiB pages served it, or it fell below hugetlb (2 MiB pages
    // cannot: the request is beyond their pool).
    assert_eq!(a.backing() == Backing::Hugetlb, gib, "{:?}", a.backing());
}

#[test]
fn allow_1gib_preference_in_mixed_mode_falls_back_to_thp_or_normal_pages() {
    let f = weights_file();
    let opts = HugeOptions::new().allow_1gib(true);
    let a = arena(8 * MIB, ModePolicy::MixedOnly, opts, &f)
        .build()
        .unwrap();
    assert_ne!(a.backing(), Backing::Hugetlb);
}
