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

/// The engine's live and retained bytes, spans and their address space
/// after everything retained is released: where they started once every
/// block is freed, so no block was lost.
fn engine() -> (u64, u64, u64, u64) {
    release_retained();
    let s = huge_stats();
    (s.live_bytes, s.retained_bytes, s.spans, s.span_bytes)
}

#[test]
fn the_c_api_under_every_fault() {
    let _g = serial();
    let start = engine();
    for op in OPS {
        for sticky in [false, true] {
            for n in 1..=6 {
                let what = format!("{op:?} #{n} sticky {sticky}");
                if sticky {
                    fault::fail_from(op, n, libc::ENOMEM);
                } else {
                    fault::fail_nth(op, n, libc::ENOMEM);
                }
                let big = 8 * MIB + 5;
                let p = c::malloc(big);
                if p.is_null() {
                    assert_eq!(errno(), libc::ENOMEM, "{what}");
                } else {
                    fill(p, big, 1);
                    let next = c::malloc(2 * MIB);
                    // SAFETY: a live block of the API.
                    let q = unsafe { c::realloc(p, 40 * MIB) };
                    let p = if q.is_null() {
                        assert_eq!(errno(), libc::ENOMEM, "{what}");
                        assert!(holds(p, big, big, 1), "{what}: a failed grow lost bytes");
                        p
                    } else {
                        assert!(holds(q, 40 * MIB, big, 1), "{what}: grow lost bytes");
                        fill(q, 40 * MIB, 2);
                        q
                    };
                    // Down across the threshold: glibc's memory.
                    let filled = if q.is_null() { big } else { 40 * MIB };
                    let seed = if q.is_null() { 1 } else { 2 };
                    // SAFETY: a live block of the API.
                    let r = unsafe { c::realloc(p, 100) };
                    assert!(!r.is_null(), "{what}");
                    assert!(holds(r, 100, filled, seed), "{what}: shrink lost bytes");
                    // SAFETY: live blocks of the API.
                    unsafe {
                        c::free(r);
                        c::free(next);
                    }
                }
                let z = c::calloc(3, 2 * MIB);
                if z.is_null() {
                    assert_eq!(errno(), libc::ENOMEM, "{what}");
                } else {
                    // SAFETY: 6 MiB of a live block.
                    let s = unsafe { std::slice::from_raw_parts(z.cast::<u8>(), 6 * MIB) };
                    assert!(s.iter().step_by(512).all(|&b| b == 0), "{what}");
                    // SAFETY: a live block of the API.
                    unsafe { c::free(z) };
                }
                let a = c::memalign(4 * MIB, 3 * MIB);
                if a.is_null() {
                    assert_eq!(errno(), libc::ENOMEM, "{what}");
                } else {
                    assert_eq!(a as usize % (4 * MIB), 0);
                    fill(a, 3 * MIB, 3);
                    // SAFETY: a live block of the API.
                    unsafe { c::free(a) };
                }
                c::malloc_trim(0);
                fault::reset();
                assert_eq!(engine(), start, "{what}: lost");
            }
        }
    }
}

#[test]
fn a_retained_run_that_cannot_be_extended_leaves_fresh_units_to_serve() {
    let _g = serial();
    for op in OPS {
        for n in 1..=4 {
            let start = engine();
            let hugetlb = huge_stats().hugetlb.blocks;
            let p = c::malloc(8 * MIB);
            assert!(!p.is_null());
            // A hugetlb span holds one block's length: only THP or
            // normal-page units show the extension.
            let growable = huge_stats().hugetlb.blocks == hugetlb;
            fill(p, 8 * MIB, 4);
            // SAFETY: a live block of the API.
            unsafe { c::free(p) };
            // No retained run is long enough: the 8 MiB one is extended, or
            // on a failure stays retained and fresh units serve (`fail_nth`
            // fails one call only, so one of the two works).
            let extends = huge_stats().retention_extends;
            fault::fail_nth(op, n, libc::ENOMEM);
            let q = c::malloc(40 * MIB);
            fault::reset();
            assert!(!q.is_null(), "{op:?} #{n}");
            if growable && matches!(op, Op::Mbind | Op::Mlock | Op::Munlock | Op::Mremap) {
                assert_eq!(huge_stats().retention_extends, extends + 1, "{op:?} #{n}");
            }
            fill(q, 40 * MIB, 5);
            assert!(holds(q, 40 * MIB, 40 * MIB, 5), "{op:?} #{n}");
            // SAFETY: a live block of the API.
            unsafe { c::free(q) };
            assert_eq!(engine(), start, "{op:?} #{n} lost");
        }
    }
}

#[test]
fn a_failed_reservation_gives_the_cache_back_and_tries_again() {
    let _g = serial();
    let start = engine();
    let p = c::malloc(16 * MIB);
    assert!(!p.is_null());
    // SAFETY: a live block of the API.
    unsafe { c::free(p) };
    assert_eq!(huge_stats().retained_bytes, 16 * MIB as u64);
    // Longer than a span: a span of its own. Every mapping fails: the
    // first try's failure gives the cache back before the second try, and
    // then glibc serves the request.
    let size = 1100 * MIB;
    fault::fail_from(Op::Mmap, 1, libc::ENOMEM);
    let z = c::calloc(1, size);
    fault::reset();
    assert_eq!(huge_stats().retained_bytes, 0, "the cache was given back");
    // SAFETY: a live block of the API (glibc's: every engine mapping
    // failed), or null.
    unsafe { c::free(z) };
    // With the mappings working again the request is the engine's.
    let z = c::calloc(1, size);
    assert!(!z.is_null());
    // SAFETY: `size` bytes of a live block.
    let s = unsafe { std::slice::from_raw_parts(z.cast::<u8>(), size) };
    assert!(s.iter().step_by(4096).all(|&b| b == 0));
    // SAFETY: a live block of the API.
    unsafe { c::free(z) };
    assert_eq!(engine(), start, "lost");
}

#[test]
fn a_block_the_program_split_that_fails_to_move_keeps_every_byte() {
    let _g = serial();
    for op in OPS {
        for sticky in [false, true] {
            for n in 1..=6 {
                let what = format!("{op:?} #{n} sticky {sticky}");
                let start = engine();
                let big = 8 * MIB + 5;
                let p = c::malloc(big);
                assert!(!p.is_null());
                fill(p, big, 6);
                // Read-only in the middle (three VMAs), and a block right
                // after it: the growth moves the block.
                let ro = p.cast::<u8>().wrapping_add(2 * MIB);
                // SAFETY: 2 MiB inside the block, made read-only only.
                assert_eq!(
                    unsafe { libc::mprotect(ro.cast(), 2 * MIB, libc::PROT_READ) },
                    0
                );
                let next = c::malloc(2 * MIB);
                if sticky {
                    fault::fail_from(op, n, libc::ENOMEM);
                } else {
                    fault::fail_nth(op, n, libc::ENOMEM);
                }
                // SAFETY: a live block of the API.
                let q = unsafe { c::realloc(p, 40 * MIB) };
                let err = errno();
                fault::reset();
                let live = if q.is_null() {
                    assert_eq!(err, libc::ENOMEM, "{what}");
                    assert!(holds(p, big, big, 6), "{what}: a failed grow lost bytes");
                    p
                } else {
                    assert!(holds(q, 40 * MIB, big, 6), "{what}: grow lost bytes");
                    q
                };
                // SAFETY: the program restores what it changed (in the
                // engine's block: a copy in glibc's memory is read-write),
                // then frees.
                unsafe {
                    if live == p || (live as usize).is_multiple_of(2 * MIB) {
                        let rw = live.cast::<u8>().wrapping_add(2 * MIB);
                        let rc =
                            libc::mprotect(rw.cast(), 2 * MIB, libc::PROT_READ | libc::PROT_WRITE);
                        assert_eq!(rc, 0, "{what}: {}", std::io::Error::last_os_error());
                    }
                    c::free(live);
                    c::free(next);
                }
                assert_eq!(engine(), start, "{what}: lost");
            }
        }
    }
}
