//! The preload library's C API (`ckalloc::preload`) under every memory
//! fault: a failed huge mapping falls to a lower tier or returns null with
//! `errno = ENOMEM`, a failed `mremap` copies instead, a block that fails
//! to grow is left as it was; nothing panics, every byte is kept, and
//! nothing stays mapped once the blocks are freed and the retention cache
//! released.

use crate::{serial, OPS};
use ckalloc::fault::{self, Op};
use ckalloc::preload as c;
use ckalloc::{huge_stats, release_retained};
use std::ffi::c_void;

const MIB: usize = 1 << 20;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn fill(p: *mut c_void, n: usize, seed: u8) {
    for i in (0..n).step_by(4096).chain(n.checked_sub(1)) {
        // SAFETY: `i < n`, inside a live block of `n` bytes.
        unsafe { p.cast::<u8>().add(i).write(seed ^ (i / 4096) as u8) };
    }
}

fn holds(p: *mut c_void, n: usize, filled: usize, seed: u8) -> bool {
    (0..n.min(filled))
        .step_by(4096)
        .chain(filled.checked_sub(1).filter(|&l| l < n))
        // SAFETY: inside the block (`i < min(n, filled)`).
        .all(|i| unsafe { p.cast::<u8>().add(i).read() } == seed ^ (i / 4096) as u8)
}

#[test]
fn the_c_api_under_every_fault() {
    let _g = serial();
    release_retained();
    let start = huge_stats().live_bytes();
    for op in OPS {
        for n in 1..=6 {
            fault::fail_nth(op, n, libc::ENOMEM);
            let big = 8 * MIB + 5;
            let p = c::malloc(big);
            if p.is_null() {
                assert_eq!(errno(), libc::ENOMEM, "{op:?} #{n}");
            } else {
                fill(p, big, 1);
                // SAFETY: a live block of the API.
                let q = unsafe { c::realloc(p, 40 * MIB) };
                let p = if q.is_null() {
                    assert_eq!(errno(), libc::ENOMEM, "{op:?} #{n}");
                    assert!(
                        holds(p, big, big, 1),
                        "{op:?} #{n}: a failed grow lost bytes"
                    );
                    p
                } else {
                    assert!(holds(q, 40 * MIB, big, 1), "{op:?} #{n}: grow lost bytes");
                    fill(q, 40 * MIB, 2);
                    q
                };
                // Down across the threshold: glibc's memory.
                let filled = if q.is_null() { big } else { 40 * MIB };
                let seed = if q.is_null() { 1 } else { 2 };
                // SAFETY: a live block of the API.
                let r = unsafe { c::realloc(p, 100) };
                assert!(!r.is_null(), "{op:?} #{n}");
                assert!(
                    holds(r, 100, filled, seed),
                    "{op:?} #{n}: shrink lost bytes"
                );
                // SAFETY: a live block of the API.
                unsafe { c::free(r) };
            }
            let z = c::calloc(3, 2 * MIB);
            if z.is_null() {
                assert_eq!(errno(), libc::ENOMEM, "{op:?} #{n}");
            } else {
                // SAFETY: 6 MiB of a live block.
                let s = unsafe { std::slice::from_raw_parts(z.cast::<u8>(), 6 * MIB) };
                assert!(s.iter().step_by(512).all(|&b| b == 0), "{op:?} #{n}");
                // SAFETY: a live block of the API.
                unsafe { c::free(z) };
            }
            let a = c::memalign(4 * MIB, 3 * MIB);
            if a.is_null() {
                assert_eq!(errno(), libc::ENOMEM, "{op:?} #{n}");
            } else {
                assert_eq!(a as usize % (4 * MIB), 0);
                fill(a, 3 * MIB, 3);
                // SAFETY: a live block of the API.
                unsafe { c::free(a) };
            }
            fault::reset();
            release_retained();
            assert_eq!(huge_stats().live_bytes(), start, "{op:?} #{n} leaked");
        }
    }
}

#[test]
fn a_retained_block_that_fails_to_grow_leaves_a_fresh_mapping_to_serve() {
    let _g = serial();
    for op in OPS {
        for n in 1..=4 {
            release_retained();
            let start = huge_stats().live_bytes();
            let hugetlb = huge_stats().hugetlb.mappings;
            let p = c::malloc(8 * MIB);
            assert!(!p.is_null());
            // hugetlb blocks cannot grow: only a THP or normal-page block
            // shows the growth.
            let growable = huge_stats().hugetlb.mappings == hugetlb;
            fill(p, 8 * MIB, 4);
            // SAFETY: a live block of the API.
            unsafe { c::free(p) };
            // No retained block is long enough: the 8 MiB one grows, or on
            // a failure goes back to the cache and a fresh mapping serves
            // (`fail_nth` fails one call only, so one of the two works).
            let grows = huge_stats().retention_grows;
            fault::fail_nth(op, n, libc::ENOMEM);
            let q = c::malloc(40 * MIB);
            fault::reset();
            assert!(!q.is_null(), "{op:?} #{n}");
            if growable && matches!(op, Op::Mbind | Op::Mlock) {
                assert_eq!(huge_stats().retention_grows, grows + 1, "{op:?} #{n}");
            }
            fill(q, 40 * MIB, 5);
            assert!(holds(q, 40 * MIB, 40 * MIB, 5), "{op:?} #{n}");
            // SAFETY: a live block of the API.
            unsafe { c::free(q) };
            release_retained();
            assert_eq!(huge_stats().live_bytes(), start, "{op:?} #{n} leaked");
        }
    }
}

#[test]
fn a_failed_mapping_gives_the_cache_back_and_tries_again() {
    let _g = serial();
    release_retained();
    let start = huge_stats().live_bytes();
    let p = c::malloc(16 * MIB);
    assert!(!p.is_null());
    // SAFETY: a live block of the API.
    unsafe { c::free(p) };
    assert_eq!(huge_stats().retained_bytes, 16 * MIB as u64);
    // A `calloc` never grows a retained block. Every mapping fails: the
    // first try's failure gives the cache back before the second try.
    fault::fail_from(Op::Mmap, 1, libc::ENOMEM);
    let z = c::calloc(1, 40 * MIB);
    let err = errno();
    fault::reset();
    assert!(z.is_null());
    assert_eq!(err, libc::ENOMEM);
    assert_eq!(huge_stats().retained_bytes, 0, "the cache was given back");
    // With the mappings working again the request is served.
    let z = c::calloc(1, 40 * MIB);
    assert!(!z.is_null());
    // SAFETY: 40 MiB of a live block.
    let s = unsafe { std::slice::from_raw_parts(z.cast::<u8>(), 40 * MIB) };
    assert!(s.iter().step_by(4096).all(|&b| b == 0));
    // SAFETY: a live block of the API.
    unsafe { c::free(z) };
    release_retained();
    assert_eq!(huge_stats().live_bytes(), start, "leaked");
}

#[test]
fn a_block_of_several_vmas_that_fails_to_move_keeps_every_byte() {
    let _g = serial();
    // `Op::Open` is also the `PROCMAP_QUERY` that finds each VMA.
    for op in OPS.into_iter().chain([Op::Open]) {
        for n in 1..=6 {
            release_retained();
            let start = huge_stats().live_bytes();
            // 8 MiB + 5 bytes: a short tail, so two VMAs, and a page mapped
            // right after the block: it cannot grow in place, and moves VMA
            // by VMA, or is copied.
            let big = 8 * MIB + 5;
            let p = c::malloc(big);
            assert!(!p.is_null());
            fill(p, big, 6);
            let blocker = crate::common::map_blocker_page(p.cast::<u8>().wrapping_add(10 * MIB));
            fault::fail_nth(op, n, libc::ENOMEM);
            // SAFETY: a live block of the API.
            let q = unsafe { c::realloc(p, 40 * MIB) };
            let err = errno();
            fault::reset();
            let live = if q.is_null() {
                assert_eq!(err, libc::ENOMEM, "{op:?} #{n}");
                assert!(
                    holds(p, big, big, 6),
                    "{op:?} #{n}: a failed grow lost bytes"
                );
                p
            } else {
                assert!(holds(q, 40 * MIB, big, 6), "{op:?} #{n}: grow lost bytes");
                // Moved or copied out of, the old block is unmapped, never
                // retained: it may hold a range the program changed.
                crate::common::assert_unmapped(p as usize, 10 * MIB);
                fill(q, 40 * MIB, 7);
                assert!(holds(q, 40 * MIB, 40 * MIB, 7), "{op:?} #{n}");
                q
            };
            // SAFETY: a live block of the API.
            unsafe { c::free(live) };
            if let Some(b) = blocker {
                crate::common::unmap_blocker_page(b);
            }
            release_retained();
            assert_eq!(huge_stats().live_bytes(), start, "{op:?} #{n} leaked");
            crate::common::assert_unmapped(p as usize, 10 * MIB);
        }
    }
}
