//! Under the huge-page paths (`HugeRegion`, `huge_alloc`, `CkHuge` through
//! `allocator_api2` and `GlobalAlloc`, the retention cache, populating on
//! several threads): every failure gives a typed error (or null /
//! `AllocError`), nothing panics, nothing stays mapped, and the counters
//! return to where they started.

use crate::common::*;
use crate::{serial, OPS};
use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::fault::{self, Op};
use ckalloc::*;

const MIB: usize = 1 << 20;

#[test]
fn region_constructor_under_every_fault() {
    let _g = serial();
    let opts = HugeOptions::new()
        .hugetlb(false)
        .populate(true)
        .mlock(true)
        .numa_node(Some(0));
    let start = huge_stats().live_bytes();
    for op in OPS {
        for n in 1..=4 {
            fault::fail_nth(op, n, libc::ENOMEM);
            let r = HugeRegion::with_options(6 * MIB, &opts);
            let fired = !fault::pending(op);
            fault::reset();
            match r {
                Ok(r) => {
                    // A failed madvise(MADV_HUGEPAGE) is a lower tier, not a failure.
                    if fired && op == Op::Madvise && n == 1 {
                        assert_eq!(r.backing(), Backing::Normal, "{op:?} #{n}");
                    }
                    assert!(r.as_slice().iter().step_by(4096).all(|&b| b == 0));
                    let (p, len) = (r.as_ptr() as usize, r.mapped_len());
                    drop(r);
                    assert_unmapped(p, len);
                }
                Err(e) => {
                    assert!(fired, "{op:?} #{n}: error without a fault: {e}");
                    assert!(!e.to_string().is_empty());
                    match op {
                        Op::Mmap => assert!(matches!(e, HugeError::Map { .. }), "{e}"),
                        Op::Mbind => assert!(matches!(e, HugeError::Mbind { .. }), "{e}"),
                        Op::Mlock => assert!(matches!(e, HugeError::Mlock { .. }), "{e}"),
                        Op::Madvise => assert!(matches!(e, HugeError::Populate { .. }), "{e}"),
                        Op::Munmap => assert!(matches!(e, HugeError::Map { .. }), "{e}"),
                        _ => {}
                    }
                }
            }
            assert_eq!(huge_stats().live_bytes(), start, "{op:?} #{n} leaked");
        }
    }
}

#[test]
fn huge_alloc_under_every_fault_with_hugetlb_tier() {
    let _g = serial();
    let start = huge_stats().live_bytes();
    for op in OPS {
        for n in 1..=3 {
            reset_hugetlb_backoff();
            fault::fail_nth(op, n, libc::ENOMEM);
            let p = huge_alloc(3 * MIB);
            fault::reset();
            if let Some(p) = p {
                let addr = p.as_ptr() as usize;
                // SAFETY: from huge_alloc(3 MiB).
                unsafe { huge_free(p, 3 * MIB) };
                assert_unmapped(addr, 4 * MIB);
            }
            assert_eq!(huge_stats().live_bytes(), start, "{op:?} #{n} leaked");
        }
    }
}

#[test]
fn ckhuge_grow_failure_keeps_the_block() {
    let _g = serial();
    let a = CkHuge::new();
    for op in [Op::Mmap, Op::Mremap, Op::Munmap] {
        for n in 1..=4 {
            let start = huge_stats().live_bytes();
            let l = Layout::from_size_align(4 * MIB, 8).unwrap();
            let p = a.allocate(l).unwrap().cast::<u8>();
            // SAFETY: `p` is a fresh block of 4 MiB.
            unsafe { p.as_ptr().write_bytes(0x3C, 4 * MIB) };
            // Occupy the address space after the block so growth must move.
            let blocker = HugeRegion::new(2 * MIB).ok();
            fault::fail_nth(op, n, libc::ENOMEM);
            let l2 = Layout::from_size_align(40 * MIB, 8).unwrap();
            // SAFETY: `p` is live with layout `l`; `l2` is not smaller.
            let r = unsafe { a.grow(p, l, l2) };
            fault::reset();
            let (q, lq) = match r {
                Ok(q) => (q.cast::<u8>(), l2),
                Err(_) => (p, l), // the old block must be intact
            };
            // SAFETY: q holds at least 4 MiB.
            let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), 4 * MIB) };
            assert!(s.iter().all(|&b| b == 0x3C), "{op:?} #{n}: contents lost");
            // SAFETY: `q` is the live block (moved or kept) and `lq` its
            // layout; `s` is not used after.
            unsafe { a.deallocate(q, lq) };
            drop(blocker);
            assert_eq!(huge_stats().live_bytes(), start, "{op:?} #{n} leaked");
        }
    }
}

#[test]
fn global_short_tail_grow_failure_keeps_the_block() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    let a = CkHuge::uncached();
    // A short tail (its last 2 MiB page advised apart from the rest) grown
    // into another short tail, with growth in place blocked so the block
    // moves: every failure of each step leaves the block whole (or a
    // complete copy), nothing leaks.
    let l = Layout::from_size_align(4 * MIB + 256 * 1024, 8).unwrap();
    let grown = 8 * MIB + 256 * 1024;
    for sticky in [false, true] {
        for op in [Op::Mmap, Op::Mremap, Op::Munmap, Op::Madvise] {
            for n in 1..=5 {
                let start = huge_stats().live_bytes();
                // SAFETY: non-zero size.
                let p = unsafe { a.alloc(l) };
                assert!(!p.is_null());
                // SAFETY: `l.size()` bytes are ours.
                unsafe { p.write_bytes(0x5A, l.size()) };
                // A page right after the block (or whatever is mapped there
                // already) keeps it from growing in place.
                let blocker = map_blocker_page(p.wrapping_add(6 * MIB));
                if sticky {
                    fault::fail_from(op, n, libc::ENOMEM);
                } else {
                    fault::fail_nth(op, n, libc::ENOMEM);
                }
                // SAFETY: `p` came from `a` with `l`.
                let q = unsafe { a.realloc(p, l, grown) };
                fault::reset();
                let (q, lq) = if q.is_null() {
                    (p, l)
                } else {
                    (q, Layout::from_size_align(grown, 8).unwrap())
                };
                // SAFETY: `q` holds at least `l.size()` bytes.
                let s = unsafe { std::slice::from_raw_parts(q, l.size()) };
                assert!(
                    s.iter().all(|&b| b == 0x5A),
                    "{op:?} #{n} sticky {sticky}: contents lost"
                );
                // SAFETY: `q` came from `a` with `lq`.
                unsafe { a.dealloc(q, lq) };
                assert_unmapped(q as usize, lq.size().next_multiple_of(2 * MIB));
                if q != p {
                    assert_unmapped(p as usize, 6 * MIB);
                }
                if let Some(b) = blocker {
                    unmap_blocker_page(b);
                }
                assert_eq!(
                    huge_stats().live_bytes(),
                    start,
                    "{op:?} #{n} sticky {sticky} leaked"
                );
            }
        }
    }
}

#[test]
fn global_alloc_returns_null_when_mmap_is_refused() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    // Uncached: every request maps, so a refused mmap is a null.
    let a = CkHuge::uncached();
    let l = std::alloc::Layout::from_size_align(8 * MIB, 4096).unwrap();
    let start = huge_stats().live_bytes();
    reset_hugetlb_backoff();
    fault::fail_from(Op::Mmap, 1, libc::ENOMEM);
    // SAFETY: `GlobalAlloc::alloc` needs a non-zero size: 8 MiB.
    let p = unsafe { a.alloc(l) };
    // SAFETY: as above.
    let z = unsafe { a.alloc_zeroed(l) };
    // The small path is System's and unaffected.
    let small = std::alloc::Layout::from_size_align(64, 8).unwrap();
    // SAFETY: a non-zero size: 64 bytes.
    let s = unsafe { a.alloc(small) };
    fault::reset();
    assert!(p.is_null() && z.is_null());
    assert!(!s.is_null());
    // SAFETY: `s` is not null (asserted), so a live block of `a` from `small`.
    unsafe { a.dealloc(s, small) };
    assert!(huge_alloc(4 * MIB)
        // SAFETY: the block `huge_alloc(4 MiB)` just returned, freed once
        // with the same length.
        .map(|p| unsafe { huge_free(p, 4 * MIB) })
        .is_some());
    assert_eq!(huge_stats().live_bytes(), start);
}

#[test]
fn retention_hits_make_no_system_call_and_survive_failures() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    let a = CkHuge::new();
    release_retained();
    let l = std::alloc::Layout::from_size_align(4 * MIB, 8).unwrap();
    let start = huge_stats().live_bytes();
    // SAFETY: a non-zero size (4 MiB).
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    // SAFETY: `p` is a live block of `a` allocated with `l`.
    unsafe { a.dealloc(p, l) };
    let calls: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    for op in OPS {
        fault::fail_from(op, 1, libc::ENOMEM);
    }
    // A hit and a free back into the cache, with every call armed to fail.
    // SAFETY: a non-zero size.
    let q = unsafe { a.alloc(l) };
    assert!(!q.is_null());
    // SAFETY: `q` is a live block of `a` (not null) allocated with `l`.
    unsafe { a.dealloc(q, l) };
    fault::reset();
    assert_eq!(q, p, "served from the cache");
    let after: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    assert_eq!(after, calls, "no system call on a hit or a retained free");

    // A zeroed hit above the memset cutoff whose MADV_DONTNEED fails is
    // cleared by memset instead.
    let big = std::alloc::Layout::from_size_align(32 * MIB, 8).unwrap();
    // SAFETY: a non-zero size (32 MiB).
    let b = unsafe { a.alloc(big) };
    assert!(!b.is_null());
    // SAFETY: `b` is a live block of `big.size()` bytes.
    unsafe { b.write_bytes(0xAB, 32 * MIB) };
    // SAFETY: `b` is a live block of `a` allocated with `big`.
    unsafe { a.dealloc(b, big) };
    fault::fail_from(Op::Madvise, 1, libc::EINVAL);
    // SAFETY: a non-zero size.
    let z = unsafe { a.alloc_zeroed(big) };
    fault::reset();
    assert_eq!(z, b);
    // SAFETY: `z` (equal to `b`, so not null) is a live block of 32 MiB, and
    // `alloc_zeroed` initialised every byte.
    let s = unsafe { std::slice::from_raw_parts(z, 32 * MIB) };
    assert!(s.iter().all(|&x| x == 0), "not zeroed");
    // SAFETY: `z` is a live block of `a` allocated with `big`; `s` is not used
    // after.
    unsafe { a.dealloc(z, big) };

    // A request carved from a longer retained block makes no system call
    // (every call armed to fail), and the freed piece merges back into one
    // block with the rest.
    release_retained();
    let l8 = std::alloc::Layout::from_size_align(8 * MIB, 8).unwrap();
    // SAFETY: a non-zero size (8 MiB).
    let c = unsafe { a.alloc(l8) };
    assert!(!c.is_null());
    // SAFETY: `c` is a live block of `a` allocated with `l8`.
    unsafe { a.dealloc(c, l8) };
    let calls: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    for op in OPS {
        fault::fail_from(op, 1, libc::ENOMEM);
    }
    // SAFETY: a non-zero size.
    let d = unsafe { a.alloc(l) };
    let carved = huge_stats().retained_bytes;
    // SAFETY: `d` (checked below) is a live block of `a` allocated with `l`.
    unsafe { a.dealloc(d, l) };
    fault::reset();
    assert_eq!(d, c, "carved from the front of the longer block");
    assert_eq!(
        carved,
        (8 * MIB - l.size().next_multiple_of(2 * MIB)) as u64
    );
    let after: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    assert_eq!(after, calls, "no system call to carve or to merge");
    // SAFETY: a non-zero size.
    let e = unsafe { a.alloc(l8) };
    assert_eq!(e, c, "the pieces merged back into one 8 MiB block");
    // SAFETY: `e` is a live block of `a` allocated with `l8`.
    unsafe { a.dealloc(e, l8) };
    release_retained();
    assert_eq!(huge_stats().live_bytes(), start);
    assert_eq!(huge_stats().retained_bytes, 0);
}

/// The `/proc/self/maps` lines of mappings at least `min` bytes long.
fn big_mappings(min: usize) -> Vec<String> {
    mappings_overlapping(0, usize::MAX >> 1)
        .into_iter()
        .filter(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            b - a >= min
        })
        .collect()
}

/// Runs its body, [`child_populate_threads_one_failed_chunk`], in a child
/// process of this binary: the body compares every mapping of 64 MiB or more
/// before and after, and in a process that has run the other tests the heaps
/// of the C library's `malloc` (reserved 64 MiB at a time, their unused parts
/// merged into larger `---p` mappings) can grow meanwhile and change those
/// lines.
#[test]
fn populate_threads_one_failed_chunk_fails_and_releases_all() {
    let _serial = serial();
    run_child("huge::child_populate_threads_one_failed_chunk", &[]);
}

#[test]
#[ignore = "run by populate_threads_one_failed_chunk_fails_and_releases_all in a child process"]
fn child_populate_threads_one_failed_chunk() {
    let _serial = serial();
    fault::reset();
    let bytes = 64 * MIB;
    let opts = HugeOptions::new().hugetlb(false).populate_threads(2);
    // A successful mapping shows how many madvise calls it makes: the THP
    // advice (if THP is on), then one MADV_POPULATE_WRITE per 8 MiB chunk
    // when 2 threads share the work (one call in all on a 1-core machine).
    // Chunks are cut at multiples of 8 MiB in address space, so a mapping
    // that is only 2 MiB aligned spans one chunk more.
    let before = fault::calls(Op::Madvise);
    let r = HugeRegion::with_options(bytes, &opts).unwrap();
    let calls = fault::calls(Op::Madvise) - before;
    let (start, end) = (r.as_ptr() as usize, r.as_ptr() as usize + r.mapped_len());
    drop(r);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spanned = (end.div_ceil(8 * MIB) - start / (8 * MIB)) as u64;
    let advice = u64::from(thp_available());
    let expected = if cores >= 2 { spanned } else { 1 };
    assert_eq!(calls, advice + expected, "THP advice + one call per chunk");
    // Every later mapping has at least this many chunks, whatever its address.
    let chunks = if cores >= 2 {
        (bytes / (8 * MIB)) as u64
    } else {
        1
    };

    let start = huge_stats().live_bytes();
    let maps_before = big_mappings(bytes);
    // The first, second, a middle and the last MADV_POPULATE_WRITE call
    // (whichever thread makes it) fail in turn.
    let mut which: Vec<u64> = [1, 2, chunks / 2 + 1, chunks]
        .into_iter()
        .filter(|&k| k <= chunks)
        .collect();
    which.dedup();
    for chunk in which {
        fault::fail_nth(Op::Madvise, advice + chunk, libc::ENOMEM);
        let err = HugeRegion::with_options(bytes, &opts).unwrap_err();
        let fired = !fault::pending(Op::Madvise);
        fault::reset();
        assert!(fired, "chunk {chunk}: the fault was reached");
        match &err {
            HugeError::Populate { bytes: b, source } => {
                assert_eq!(*b, bytes, "the error names the whole mapping");
                assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
            }
            other => panic!("chunk {chunk}: {other}"),
        }
        assert!(err.to_string().contains("MADV_POPULATE_WRITE"), "{err}");
        assert_eq!(huge_stats().live_bytes(), start, "chunk {chunk}: counted");
        if !under_asan() {
            assert_eq!(
                big_mappings(bytes),
                maps_before,
                "chunk {chunk}: the mapping was released"
            );
        }
    }
    // The same options work again once the fault is gone.
    let r = HugeRegion::with_options(bytes, &opts).unwrap();
    assert_eq!(r.coverage().unwrap().mapped_bytes, bytes as u64);
}
