//! Under the caching allocator over `CkHuge`: every failed OS call on the
//! allocation and resize paths gives `AllocError` (never a panic), the
//! caller's block is intact after a failed grow, the cache is trimmed before
//! a failed inner allocation is tried again, a cache hit needs no OS call,
//! and afterwards the caching statistics and the huge-page statistics
//! return to their starting values (no span left behind).

use crate::{serial, OPS};
use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::caching::{CachingAllocator, RoundUp};
use ckalloc::fault::{self, Op};
use ckalloc::{huge_stats, release_retained, reset_hugetlb_backoff, CkHuge};
use std::ptr::NonNull;

const MIB: usize = 1 << 20;

fn cache() -> CachingAllocator<CkHuge> {
    CachingAllocator::builder(CkHuge::new())
        .spec("*=4gib;8gib;8".parse().unwrap())
        .round_up(RoundUp::PowerOfTwoDivisions(1))
        .build()
        .unwrap()
}

fn filled(p: NonNull<u8>, len: usize, byte: u8) -> bool {
    // SAFETY: the caller owns `len` bytes at `p`.
    let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
    s.iter().step_by(509).all(|&b| b == byte) && s[len - 1] == byte
}

#[test]
fn allocate_under_every_fault_is_alloc_error_or_a_good_block() {
    let _g = serial();
    let start = huge_stats().live_bytes;
    let mut errors = 0;
    for op in OPS {
        for n in 1..=4 {
            for zeroed in [false, true] {
                for sticky in [false, true] {
                    reset_hugetlb_backoff();
                    // No span: the engine's first block reserves one, and
                    // each of its calls can fail.
                    release_retained();
                    assert_eq!(huge_stats().spans, 0, "a span was left behind");
                    let c = cache();
                    let l = Layout::from_size_align(3 * MIB, 64).unwrap();
                    let calls_before = fault::calls(op);
                    if sticky {
                        fault::fail_from(op, n, libc::ENOMEM);
                    } else {
                        fault::fail_nth(op, n, libc::ENOMEM);
                    }
                    let r = if zeroed {
                        c.allocate_zeroed(l)
                    } else {
                        c.allocate(l)
                    };
                    let fired = fault::calls(op) - calls_before >= n;
                    fault::reset();
                    let st = c.stats();
                    match r {
                        Ok(b) => {
                            let p = b.cast::<u8>();
                            assert!(b.len() >= 3 * MIB);
                            if zeroed {
                                assert!(filled(p, b.len(), 0), "{op:?} #{n}: not zeroed");
                            }
                            // SAFETY: a live block of `b.len()` bytes.
                            unsafe { p.as_ptr().write_bytes(0xA5, b.len()) };
                            assert!(filled(p, b.len(), 0xA5));
                            // SAFETY: allocated above with `l`.
                            unsafe { c.deallocate(p, l) };
                            drop(c);
                        }
                        Err(_) => {
                            errors += 1;
                            assert!(fired, "{op:?} #{n}: failed without a fault");
                            // The first call failed, the cache was trimmed, the
                            // retry failed too.
                            assert_eq!(st.inner_failures, 2, "{op:?} #{n}: {st}");
                            assert_eq!(st.live_bytes, 0, "{op:?} #{n}: {st}");
                            assert_eq!(st.cached_bytes, 0, "{op:?} #{n}: {st}");
                            drop(c);
                        }
                    }
                    assert_eq!(
                        huge_stats().live_bytes,
                        start,
                        "{op:?} #{n} zeroed={zeroed} sticky={sticky}: leaked a mapping"
                    );
                }
            }
        }
    }
    // A sticky mmap failure must fail the mapping path.
    assert!(errors >= 2, "faults were injected ({errors} errors)");
}

#[test]
fn a_cache_hit_needs_no_os_call_and_a_miss_trims_before_failing() {
    let _g = serial();
    release_retained();
    let start = huge_stats().live_bytes;
    let c = cache();
    let l3 = Layout::from_size_align(3 * MIB, 8).unwrap();
    let l5 = Layout::from_size_align(5 * MIB, 8).unwrap();
    let a = c.allocate(l3).unwrap().cast::<u8>();
    let b = c.allocate(l5).unwrap().cast::<u8>();
    // SAFETY: both live; then released into the cache.
    unsafe {
        c.deallocate(a, l3);
        c.deallocate(b, l5);
    }
    assert_eq!(c.stats().cached_blocks, 2);

    fault::fail_from(Op::Mmap, 1, libc::ENOMEM);
    let mmaps = fault::calls(Op::Mmap);
    // A hit: the cached 4 MiB block comes back without any mmap.
    let again = c.allocate(l3);
    assert_eq!(fault::calls(Op::Mmap), mmaps, "a hit made an OS call");
    let again = again.expect("cache hit under a failing mmap").cast::<u8>();
    assert_eq!(again, a, "the cached block is reused");
    // A miss longer than a span (it needs one of its own, and every mmap
    // fails): the inner allocator fails, the cache is trimmed (the 8 MiB
    // block goes back), the retry fails too.
    let huge = Layout::from_size_align(1536 * MIB, 8).unwrap();
    assert!(c.allocate(huge).is_err());
    fault::reset();
    let st = c.stats();
    assert_eq!(st.inner_failures, 2, "{st}");
    assert_eq!(st.cached_blocks, 0, "trimmed before failing: {st}");
    assert_eq!(st.trimmed, 1, "{st}");
    assert_eq!(st.live_bytes, 4 * MIB as u64, "{st}");
    // SAFETY: the live block from the hit.
    unsafe { c.deallocate(again, l3) };
    drop(c);
    assert_eq!(huge_stats().live_bytes, start);
}

#[test]
fn failed_grow_keeps_the_block_and_its_contents() {
    let _g = serial();
    let start = huge_stats().live_bytes;
    for op in OPS {
        for n in 1..=3 {
            let c = cache();
            let old = Layout::from_size_align(3 * MIB, 8).unwrap();
            let p = c.allocate(old).unwrap().cast::<u8>();
            // SAFETY: live block of at least 3 MiB.
            unsafe { p.as_ptr().write_bytes(0x5A, 3 * MIB) };
            let new = Layout::from_size_align(9 * MIB, 8).unwrap();
            fault::fail_from(op, n, libc::ENOMEM);
            // SAFETY: live block allocated with `old`.
            let r = unsafe { c.grow(p, old, new) };
            fault::reset();
            let (q, lq) = match r {
                Ok(q) => (q.cast::<u8>(), new),
                Err(_) => {
                    // A new span needs mmap and munmap (trimming an aligned
                    // over-reservation), committing units mprotect; the other
                    // calls are hints.
                    assert!(
                        matches!(op, Op::Mmap | Op::Munmap | Op::Mprotect),
                        "{op:?} #{n}: a hint failed the grow"
                    );
                    (p, old)
                }
            };
            assert!(filled(q, 3 * MIB, 0x5A), "{op:?} #{n}: contents lost");
            assert_eq!(c.stats().live_bytes, c.stats().pools[0].live_bytes);
            // SAFETY: the block now live, with its layout.
            unsafe { c.deallocate(q, lq) };
            assert_eq!(c.stats().live_bytes, 0, "{op:?} #{n}");
            drop(c);
            assert_eq!(huge_stats().live_bytes, start, "{op:?} #{n}: leaked");
        }
    }
}
