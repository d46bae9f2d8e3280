//! Fault injection into the OS layer under the huge-page paths: every
//! failure gives a typed error (or null / `AllocError`), nothing panics,
//! nothing stays mapped, and the counters return to where they started.
#![cfg(ckalloc_fault_injection)]

mod common;
use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::fault::{self, Op};
use ckalloc::*;
use common::*;

const MIB: usize = 1 << 20;

const OPS: [Op; 6] = [
    Op::Mmap,
    Op::Munmap,
    Op::Madvise,
    Op::Mremap,
    Op::Mbind,
    Op::Mlock,
];

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
            // SAFETY: 4 MiB block.
            unsafe { p.as_ptr().write_bytes(0x3C, 4 * MIB) };
            // Occupy the address space after the block so growth must move.
            let blocker = HugeRegion::new(2 * MIB).ok();
            fault::fail_nth(op, n, libc::ENOMEM);
            let l2 = Layout::from_size_align(40 * MIB, 8).unwrap();
            // SAFETY: our block.
            let r = unsafe { a.grow(p, l, l2) };
            fault::reset();
            let (q, lq) = match r {
                Ok(q) => (q.cast::<u8>(), l2),
                Err(_) => (p, l), // the old block must be intact
            };
            // SAFETY: q holds at least 4 MiB.
            let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), 4 * MIB) };
            assert!(s.iter().all(|&b| b == 0x3C), "{op:?} #{n}: contents lost");
            // SAFETY: our block with its current layout.
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
                let blocker = common::map_blocker_page(p.wrapping_add(6 * MIB));
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
                    common::unmap_blocker_page(b);
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
    // SAFETY: non-zero layouts.
    let p = unsafe { a.alloc(l) };
    let z = unsafe { a.alloc_zeroed(l) };
    // The small path is System's and unaffected.
    let small = std::alloc::Layout::from_size_align(64, 8).unwrap();
    let s = unsafe { a.alloc(small) };
    fault::reset();
    assert!(p.is_null() && z.is_null());
    assert!(!s.is_null());
    unsafe { a.dealloc(s, small) };
    assert!(huge_alloc(4 * MIB)
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
    // SAFETY: non-zero layout; freed with it.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { a.dealloc(p, l) };
    let calls: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    for op in OPS {
        fault::fail_from(op, 1, libc::ENOMEM);
    }
    // A hit and a free back into the cache, with every call armed to fail.
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    let q = unsafe { a.alloc(l) };
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { a.dealloc(q, l) };
    fault::reset();
    assert_eq!(q, p, "served from the cache");
    let after: Vec<u64> = OPS.iter().map(|&op| fault::calls(op)).collect();
    assert_eq!(after, calls, "no system call on a hit or a retained free");

    // A zeroed hit above the memset cutoff whose MADV_DONTNEED fails is
    // cleared by memset instead.
    let big = std::alloc::Layout::from_size_align(32 * MIB, 8).unwrap();
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    let b = unsafe { a.alloc(big) };
    assert!(!b.is_null());
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { b.write_bytes(0xAB, 32 * MIB) };
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { a.dealloc(b, big) };
    fault::fail_from(Op::Madvise, 1, libc::EINVAL);
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    let z = unsafe { a.alloc_zeroed(big) };
    fault::reset();
    assert_eq!(z, b);
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    let s = unsafe { std::slice::from_raw_parts(z, 32 * MIB) };
    assert!(s.iter().all(|&x| x == 0), "not zeroed");
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { a.dealloc(z, big) };

    // A miss that would trim a longer block keeps it whole when the trim
    // fails, and maps afresh.
    release_retained();
    let l8 = std::alloc::Layout::from_size_align(8 * MIB, 8).unwrap();
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    let c = unsafe { a.alloc(l8) };
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { a.dealloc(c, l8) };
    fault::fail_nth(Op::Munmap, 1, libc::ENOMEM);
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    let d = unsafe { a.alloc(l) };
    fault::reset();
    assert!(!d.is_null());
    assert_ne!(d, c, "the trim failed, so the request was mapped afresh");
    assert_eq!(huge_stats().retained_bytes, 8 * MIB as u64);
    // SAFETY: blocks of `a` with their layouts; reads within the block.
    unsafe { a.dealloc(d, l) };
    release_retained();
    assert_eq!(huge_stats().live_bytes(), start);
    assert_eq!(huge_stats().retained_bytes, 0);
}
