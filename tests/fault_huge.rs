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
