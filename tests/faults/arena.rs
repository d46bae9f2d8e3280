//! Every OS call of the arena's constructors and of materialization failing
//! in turn: a typed error (or a successful lower tier), no panic, no leaked
//! mapping, huge-page statistics back to their starting values, and the
//! arena still usable after a failed materialization.

use crate::common::under_asan;
use crate::serial;
use ckalloc::fault::{self, Op};
use ckalloc::*;
use std::collections::BTreeSet;
use std::path::Path;

const MIB: usize = 1 << 20;

/// Mappings of at least 1 MiB (the arena's pieces are all bigger or lie
/// inside its reservation).
fn big_mappings() -> BTreeSet<(usize, usize)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (b - a >= MIB).then_some((a, b))
        })
        .collect()
}

fn build(policy: ModePolicy, path: &Path) -> Result<BumpArena, ArenaError> {
    BumpArena::builder(24 * MIB + 5)
        .weights_file(path)
        // Inside a page, as is `activations_base`: mixed mode reads both
        // partial pages of the weights with `pread`.
        .weights_base(4096 + 152)
        .activations_base(8 * MIB + 100)
        .policy(policy)
        .huge(HugeOptions::new().populate(true))
        .dont_dump(true)
        .build()
}

#[test]
fn every_failed_os_call_is_a_typed_error_without_leaks() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w");
    std::fs::write(&path, vec![7u8; 8 * MIB + 100]).unwrap();
    let mut policies = vec![ModePolicy::AnonOnly, ModePolicy::Auto];
    if cfg!(target_os = "linux") {
        policies.push(ModePolicy::MixedOnly);
    }
    // Warm up (thread-local malloc arenas, lazily read knobs).
    drop(build(ModePolicy::AnonOnly, &path).unwrap());

    let ops = [
        Op::Mmap,
        Op::Munmap,
        Op::Madvise,
        Op::Mremap,
        Op::Mprotect,
        Op::Mbind,
        Op::Mlock,
        Op::Open,
        Op::Fstat,
        Op::Pread,
        Op::Fadvise,
    ];
    let mut errors_seen = 0;
    let check_maps = !under_asan();
    for policy in policies {
        for op in ops {
            for n in 1..=12 {
                let before = big_mappings();
                let stats_before = huge_stats();
                fault::fail_nth(op, n, libc::ENOMEM);
                let r = build(policy, &path);
                let fired = !fault::pending(op);
                fault::reset();
                match r {
                    Ok(mut a) => {
                        // A fault that did not fail the build must have been
                        // absorbed (a lower tier, a hint), or another mode
                        // took over under Auto.
                        if policy == ModePolicy::AnonOnly {
                            assert_eq!(a.mode(), ArenaMode::Anon);
                        }
                        a.materialize_weights().unwrap();
                        assert!(a.weights().iter().all(|&b| b == 7));
                        let (p, len) = a.mapping();
                        drop(a);
                        assert!(
                            !check_maps
                                || !big_mappings()
                                    .iter()
                                    .any(|&(s, e)| s < p as usize + len && e > p as usize),
                            "{policy:?} {op:?} #{n}: still mapped after drop"
                        );
                    }
                    Err(e) => {
                        errors_seen += 1;
                        assert!(fired, "{policy:?} {op:?} #{n}: error without a fault: {e}");
                        assert!(!e.to_string().is_empty());
                        let after = big_mappings();
                        let leaked: Vec<_> = after.difference(&before).collect();
                        assert!(
                            !check_maps || leaked.is_empty(),
                            "{policy:?} {op:?} #{n}: {e}: leaked {leaked:x?}"
                        );
                        let s = huge_stats();
                        assert_eq!(
                            s.live_bytes, stats_before.live_bytes,
                            "{policy:?} {op:?} #{n}: stats unbalanced"
                        );
                    }
                }
                if !fired {
                    // Fewer than n calls of this op: later n cannot fire.
                    break;
                }
            }
        }
    }
    assert!(
        errors_seen > 10,
        "faults were injected ({errors_seen} errors)"
    );

    // Materialization: a failed read leaves the arena usable; a retry works.
    let mut a = build(ModePolicy::AnonOnly, &path).unwrap();
    for (op, n) in [(Op::Pread, 1), (Op::Fstat, 1), (Op::Fstat, 2)] {
        fault::fail_nth(op, n, libc::EIO);
        let e = a.materialize_weights().unwrap_err();
        fault::reset();
        assert!(
            matches!(
                e,
                ArenaError::ReadWeights { .. } | ArenaError::StatWeights { .. }
            ),
            "{op:?}: {e:?}"
        );
        assert!(a.needs_weight_materialization());
        let mut v = allocator_api2::vec::Vec::new_in(&a);
        v.resize(MIB, 1u8);
    }
    fault::fail_nth(Op::Fadvise, 1, libc::EINVAL);
    a.materialize_weights().unwrap();
    fault::reset();
    assert!(a.weights().iter().all(|&b| b == 7));
}

/// A regular file whose `mmap` hook refuses every mapping: a sysfs
/// attribute (4096 bytes by `stat`, `ENODEV` from `mmap`).
#[cfg(target_os = "linux")]
fn unmappable_file() -> Option<&'static Path> {
    [
        "/sys/devices/system/cpu/online",
        "/sys/kernel/mm/transparent_hugepage/enabled",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists())
}

#[cfg(target_os = "linux")]
#[test]
fn a_file_that_refuses_to_map_fails_before_the_reservation_exists() {
    let _g = serial();
    let Some(path) = unmappable_file() else {
        eprintln!("no sysfs attribute here: skipped");
        return;
    };
    let before = big_mappings();
    let mmaps = fault::calls(Op::Mmap);
    let e = BumpArena::builder(4 * MIB)
        .weights_file(path)
        .activations_base(4096)
        .policy(ModePolicy::MixedOnly)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            ArenaError::MixedMap {
                step: "weights",
                ..
            }
        ),
        "{e:?}"
    );
    // One mmap, the trial one: the refusal came before any reservation, so
    // no `MAP_FIXED` mapping was refused inside one.
    assert_eq!(fault::calls(Op::Mmap) - mmaps, 1, "{e}");
    assert!(under_asan() || big_mappings() == before);
}
