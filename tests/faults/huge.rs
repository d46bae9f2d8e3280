//! Under the huge-page paths (`HugeRegion`, populating on several threads,
//! and the engine behind `huge_alloc` and `CkHuge` through `allocator_api2`
//! and `GlobalAlloc`): every failure of every call gives a typed error (or
//! null / `AllocError`) or a block with every byte, nothing panics, and
//! nothing is lost: once everything is freed and released, the engine's
//! live and retained bytes, spans and address space are where they started.

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
    let start = huge_stats().live_bytes;
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
            assert_eq!(huge_stats().live_bytes, start, "{op:?} #{n} leaked");
        }
    }
}

/// The engine's state that must come back once every block is freed and
/// everything retained is released: no block lost (its units would keep
/// their span) and no address space kept.
#[derive(Debug, PartialEq, Eq)]
struct Engine {
    live: u64,
    retained: u64,
    spans: u64,
    span_bytes: u64,
}

fn engine() -> Engine {
    release_retained();
    let s = huge_stats();
    Engine {
        live: s.live_bytes,
        retained: s.retained_bytes,
        spans: s.spans,
        span_bytes: s.span_bytes,
    }
}

/// Every call of each kind the engine makes, failed in turn: the `n`-th
/// from now once, or (`sticky`) from the `n`-th on.
fn each_fault(ops: &[Op], max: u64, mut body: impl FnMut(Op, u64, bool)) {
    for &op in ops {
        for sticky in [false, true] {
            for n in 1..=max {
                reset_hugetlb_backoff();
                if sticky {
                    fault::fail_from(op, n, libc::ENOMEM);
                } else {
                    fault::fail_nth(op, n, libc::ENOMEM);
                }
                body(op, n, sticky);
                fault::reset();
            }
        }
    }
}

#[test]
fn huge_alloc_under_every_fault_loses_nothing() {
    let _g = serial();
    let start = engine();
    each_fault(&OPS, 3, |op, n, sticky| {
        let p = huge_alloc(3 * MIB);
        if let Some(p) = p {
            // SAFETY: `huge_alloc` blocks read zero; ours, 3 MiB.
            let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), 3 * MIB) };
            assert!(
                s.iter().step_by(4096).all(|&b| b == 0),
                "{op:?} #{n} {sticky}"
            );
            // SAFETY: from huge_alloc(3 MiB), freed once.
            unsafe { huge_free(p, 3 * MIB) };
        }
    });
    assert_eq!(engine(), start);
}

/// A pattern byte for offset `i`.
fn byte(i: usize, seed: u8) -> u8 {
    (i / 4096) as u8 ^ seed
}

fn fill(p: *mut u8, n: usize, seed: u8) {
    for i in (0..n).step_by(4096) {
        // SAFETY: `i < n`, inside the caller's block.
        unsafe { p.add(i).write(byte(i, seed)) };
    }
}

fn holds(p: *const u8, n: usize, seed: u8) -> bool {
    // SAFETY: `i < n`, inside the caller's block.
    (0..n)
        .step_by(4096)
        .all(|i| unsafe { p.add(i).read() } == byte(i, seed))
}

#[test]
fn every_fault_of_every_engine_call_keeps_the_bytes_and_loses_no_block() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    let a = CkHuge::new();
    let l = |size| std::alloc::Layout::from_size_align(size, 8).unwrap();
    let start = engine();
    each_fault(&OPS, 6, |op, n, sticky| {
        let what = format!("{op:?} #{n} sticky {sticky}");
        // SAFETY: blocks of `a` with the layouts they were allocated with
        // (a failed call returns null and keeps the old block).
        unsafe {
            let p = a.alloc(l(6 * MIB + 3));
            if p.is_null() {
                return;
            }
            fill(p, 6 * MIB + 3, 1);
            // A neighbour: growing `p` moves it.
            let next = a.alloc(l(2 * MIB));
            let q = a.realloc(p, l(6 * MIB + 3), 40 * MIB);
            let (mut p, mut size) = if q.is_null() {
                (p, 6 * MIB + 3)
            } else {
                (q, 40 * MIB)
            };
            assert!(holds(p, 6 * MIB + 3, 1), "{what}: grow");
            // Shrink, free into the cache, a zeroed hit, over the cap.
            let r = a.realloc(p, l(size), 3 * MIB);
            if !r.is_null() {
                (p, size) = (r, 3 * MIB);
            }
            assert!(holds(p, 3 * MIB, 1), "{what}: shrink");
            a.dealloc(p, l(size));
            let z = a.alloc_zeroed(l(4 * MIB));
            if !z.is_null() {
                let s = std::slice::from_raw_parts(z, 4 * MIB);
                assert!(s.iter().all(|&b| b == 0), "{what}: zeroed");
                a.dealloc(z, l(4 * MIB));
            }
            let big = a.alloc(l(200 * MIB));
            if !big.is_null() {
                fill(big, 200 * MIB, 2);
                a.dealloc(big, l(200 * MIB));
            }
            if !next.is_null() {
                a.dealloc(next, l(2 * MIB));
            }
        }
        release_retained();
    });
    assert_eq!(engine(), start, "a block or span was lost");
}

#[test]
fn a_growth_that_fails_keeps_the_block_through_allocator_api2() {
    let _g = serial();
    let a = CkHuge::new();
    let start = engine();
    each_fault(
        &[Op::Mmap, Op::Mremap, Op::Madvise, Op::Mprotect],
        4,
        |op, n, sticky| {
            let l = Layout::from_size_align(4 * MIB, 8).unwrap();
            fault::reset();
            let p = a.allocate(l).unwrap().cast::<u8>();
            fill(p.as_ptr(), 4 * MIB, 3);
            // A neighbour: the growth moves.
            let next = a.allocate(l).unwrap();
            if sticky {
                fault::fail_from(op, n, libc::ENOMEM);
            } else {
                fault::fail_nth(op, n, libc::ENOMEM);
            }
            let l2 = Layout::from_size_align(40 * MIB, 8).unwrap();
            // SAFETY: `p` is live with layout `l`; `l2` is not smaller.
            let r = unsafe { a.grow(p, l, l2) };
            fault::reset();
            let (q, lq) = match r {
                Ok(q) => (q.cast::<u8>(), l2),
                Err(_) => (p, l),
            };
            assert!(
                holds(q.as_ptr(), 4 * MIB, 3),
                "{op:?} #{n} {sticky}: contents lost"
            );
            // SAFETY: the live blocks and their layouts.
            unsafe {
                a.deallocate(q, lq);
                a.deallocate(next.cast(), l);
            }
        },
    );
    assert_eq!(engine(), start);
}

#[test]
fn global_alloc_returns_null_when_no_span_can_be_reserved() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    let a = CkHuge::uncached();
    // Longer than any span: it needs a span of its own.
    let l = std::alloc::Layout::from_size_align(3 << 30, 4096).unwrap();
    let start = engine();
    reset_hugetlb_backoff();
    fault::fail_from(Op::Mmap, 1, libc::ENOMEM);
    // SAFETY: `GlobalAlloc::alloc` needs a non-zero size: 3 GiB.
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
    assert_eq!(engine(), start);
}

#[test]
fn retention_hits_make_no_system_call() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    let a = CkHuge::new();
    let start = engine();
    let l = std::alloc::Layout::from_size_align(4 * MIB, 8).unwrap();
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

    // A zeroed hit above the memset cutoff whose purge fails is not handed
    // out: fresh units serve, reading zero, and the retained units stay.
    // Hugetlb units are cleared with memset, no purge: they serve.
    let big = std::alloc::Layout::from_size_align(32 * MIB, 8).unwrap();
    let hugetlb_blocks = huge_stats().hugetlb.blocks;
    // SAFETY: a non-zero size (32 MiB).
    let b = unsafe { a.alloc(big) };
    assert!(!b.is_null());
    let on_hugetlb = huge_stats().hugetlb.blocks > hugetlb_blocks;
    // SAFETY: `b` is a live block of `big.size()` bytes.
    unsafe { b.write_bytes(0xAB, 32 * MIB) };
    // SAFETY: `b` is a live block of `a` allocated with `big`.
    unsafe { a.dealloc(b, big) };
    let retained = huge_stats().retained_bytes;
    fault::fail_from(Op::Madvise, 1, libc::EINVAL);
    // SAFETY: a non-zero size.
    let z = unsafe { a.alloc_zeroed(big) };
    fault::reset();
    assert!(!z.is_null());
    // SAFETY: `z` is a live block of 32 MiB, and `alloc_zeroed` initialised
    // every byte.
    let s = unsafe { std::slice::from_raw_parts(z, 32 * MIB) };
    assert!(s.iter().all(|&x| x == 0), "not zeroed");
    if on_hugetlb {
        assert_eq!(z, b, "hugetlb units zeroed by memset serve");
    } else {
        assert!(
            huge_stats().retained_bytes >= retained,
            "the retained units stayed"
        );
    }
    // SAFETY: `z` is a live block of `a` allocated with `big`; `s` is not used
    // after.
    unsafe { a.dealloc(z, big) };

    // A request carved from a longer retained run makes no system call
    // (every call armed to fail), and the freed piece is part of the run
    // again.
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
    assert_eq!(d, c, "carved from the front of the longer run");
    assert_eq!(carved, (8 * MIB - 4 * MIB) as u64);
    let after: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    assert_eq!(after, calls, "no system call to carve or to free");
    // SAFETY: a non-zero size.
    let e = unsafe { a.alloc(l8) };
    assert_eq!(e, c, "the run is whole again");
    // SAFETY: `e` is a live block of `a` allocated with `l8`.
    unsafe { a.dealloc(e, l8) };
    assert_eq!(engine(), start);
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

    let start = huge_stats().live_bytes;
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
        assert_eq!(huge_stats().live_bytes, start, "chunk {chunk}: counted");
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

#[test]
fn a_background_thread_that_cannot_start_leaves_the_engine_working_without_it() {
    use ckalloc::huge::{enable_background_thread, BackgroundThread};
    let _g = serial();
    // `pthread_create` refused (a pid limit, a seccomp filter).
    fault::fail_nth(Op::Thread, 1, libc::EAGAIN);
    if enable_background_thread() == BackgroundThread::Disabled {
        eprintln!("SKIP: CKALLOC_BACKGROUND_THREAD is off");
        return;
    }
    let p = huge_alloc(8 * MIB).expect("a block without the thread");
    assert_eq!(fault::calls(Op::Thread), 1);
    assert_eq!(huge_stats().background_thread, BackgroundThread::Failed);
    // SAFETY: `huge_alloc` blocks read zero; ours, 8 MiB.
    let s = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), 8 * MIB) };
    assert!(s.iter().step_by(4096).all(|&b| b == 0));
    s.fill(7);
    // Tried once: the next allocations go on without it, silently.
    let q = huge_alloc(4 * MIB).expect("a second block");
    assert_eq!(fault::calls(Op::Thread), 1);
    assert_eq!(huge_stats().background_thread, BackgroundThread::Failed);
    // SAFETY: from huge_alloc with these lengths, freed once.
    unsafe {
        huge_free(q, 4 * MIB);
        huge_free(p, 8 * MIB);
    }
}
