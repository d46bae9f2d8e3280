//! Pool behaviour with a counting inner allocator: reuse, size bands,
//! capacity and eviction, free count, trim order, failure + retry,
//! alignment, grow/shrink, Drop, statistics.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::common::caching::{Counting, Event};
use allocator_api2::alloc::{Allocator, Global};
use allocator_api2::vec::Vec as AVec;
use ckalloc::caching::{CachingAllocator, Heap, PoolParams, RoundUp};

const KIB: usize = 1024;

fn l(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

fn alloc<A: Allocator>(a: &A, size: usize) -> NonNull<u8> {
    a.allocate(l(size)).unwrap().cast()
}

/// Give `p` back to `a`.
///
/// # Safety
///
/// `p` came from `alloc(a, size)` (layout `l(size)`) and was not freed since.
unsafe fn free<A: Allocator>(a: &A, p: NonNull<u8>, size: usize) {
    // SAFETY: the caller's contract: a live block of `a` with layout `l(size)`.
    unsafe { a.deallocate(p, l(size)) }
}

#[test]
fn reuse_same_size_most_recent_first() {
    let inner = Counting::new();
    let c = CachingAllocator::unbounded(&inner);
    let a = alloc(&c, 4 * KIB);
    let b = alloc(&c, 4 * KIB);
    // SAFETY: `a` and `b` are live 4 KiB blocks of `c`, each freed once.
    unsafe {
        free(&c, a, 4 * KIB);
        free(&c, b, 4 * KIB);
    }
    assert_eq!(inner.allocs.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Most recently freed (b) comes back first.
    assert_eq!(alloc(&c, 4 * KIB), b);
    assert_eq!(alloc(&c, 4 * KIB), a);
    // A different size is a miss.
    let d = alloc(&c, 8 * KIB);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.bypasses), (2, 3, 0));
    assert_eq!(s.live_bytes, (16 * KIB) as u64);
    assert_eq!(s.cached_bytes, 0);
    assert_eq!(s.peak_bytes, (16 * KIB) as u64);
    // SAFETY: `a` and `b` were handed out again by the two 4 KiB requests
    // above and `d` by the 8 KiB one; each is freed once, with its size.
    unsafe {
        free(&c, a, 4 * KIB);
        free(&c, b, 4 * KIB);
        free(&c, d, 8 * KIB);
    }
    let s = c.stats();
    assert_eq!(
        (s.live_bytes, s.cached_bytes, s.cached_blocks),
        (0, (16 * KIB) as u64, 3)
    );
    drop(c);
    assert_eq!(inner.live_blocks(), 0, "Drop returns every cached block");
}

#[test]
fn size_bands_choose_first_pool_by_size() {
    // IREE's documented example, scaled down: at most one block over 100 KiB
    // kept, up to ten under it.
    let inner = Counting::new();
    let c = CachingAllocator::from_spec(&inner, "*=100kib;*;10,*=*;*;1").unwrap();
    let small: Vec<_> = (0..12).map(|_| alloc(&c, 10 * KIB)).collect();
    let big: Vec<_> = (0..3).map(|_| alloc(&c, 200 * KIB)).collect();
    for p in &small {
        // SAFETY: each 10 KiB block of `c` is freed once.
        unsafe { free(&c, *p, 10 * KIB) };
    }
    for p in &big {
        // SAFETY: each 200 KiB block of `c` is freed once.
        unsafe { free(&c, *p, 200 * KIB) };
    }
    let s = c.stats();
    assert_eq!(s.pools[0].cached_blocks, 10);
    assert_eq!(s.pools[0].misses, 12);
    assert_eq!(s.pools[1].cached_blocks, 1);
    assert_eq!(s.pools[1].misses, 3);
    assert_eq!(s.cached_bytes, (10 * 10 * KIB + 200 * KIB) as u64);
    // 2 small + 2 big went back to the inner allocator at release.
    assert_eq!(inner.live_blocks(), 11);
    // Exactly the band edge goes to the first pool.
    let e = alloc(&c, 100 * KIB);
    assert_eq!(c.stats().pools[0].misses, 13);
    // SAFETY: `e` is the live 100 KiB block allocated just above.
    unsafe { free(&c, e, 100 * KIB) };
    assert_eq!(c.stats().pools[0].cached_blocks, 10, "free count holds");
}

#[test]
fn no_matching_pool_bypasses() {
    let inner = Counting::new();
    let c = CachingAllocator::from_spec(&inner, "*=1kib").unwrap();
    let p = alloc(&c, 2 * KIB);
    let s = c.stats();
    assert_eq!((s.bypasses, s.misses, s.pools[0].bypasses), (1, 0, 0));
    assert_eq!(s.live_bytes, (2 * KIB) as u64);
    // SAFETY: `p` is the live 2 KiB block allocated above.
    unsafe { free(&c, p, 2 * KIB) };
    assert_eq!(inner.live_blocks(), 0, "unpooled blocks go straight back");
    assert_eq!(c.stats().live_bytes, 0);
}

#[test]
fn capacity_evicts_oldest_then_bypasses() {
    let inner = Counting::new();
    let c = CachingAllocator::from_spec(&inner, "*=*;10kib;*").unwrap();
    let a = alloc(&c, 3 * KIB);
    let b = alloc(&c, 4 * KIB);
    // SAFETY: `a` (3 KiB) and `b` (4 KiB) are live blocks of `c`, freed once.
    unsafe {
        free(&c, a, 3 * KIB);
        free(&c, b, 4 * KIB);
    }
    inner.clear_events();
    // 7 KiB committed; a 5 KiB block needs 2 KiB more: evict the oldest (a, 3 KiB).
    let d = alloc(&c, 5 * KIB);
    assert_eq!(
        inner.events(),
        vec![Event::Dealloc(3 * KIB, 8), Event::Alloc(5 * KIB, 8)]
    );
    let s = c.stats();
    assert_eq!((s.evictions, s.cached_blocks, s.misses), (1, 1, 3));
    assert_eq!(
        s.pools[0].live_bytes + s.pools[0].cached_bytes,
        (9 * KIB) as u64
    );
    // Live 5 KiB + 6 KiB > 10 KiB even with nothing cached: served unpooled,
    // and the cached block is not evicted for nothing.
    inner.clear_events();
    let e = alloc(&c, 6 * KIB);
    assert_eq!(inner.events(), vec![Event::Alloc(6 * KIB, 8)]);
    let s = c.stats();
    assert_eq!((s.bypasses, s.pools[0].bypasses, s.evictions), (1, 1, 1));
    // A request larger than the whole capacity is a bypass too.
    let f = alloc(&c, 11 * KIB);
    assert_eq!(c.stats().bypasses, 2);
    assert!(c.stats().pools[0].peak_bytes <= (10 * KIB) as u64);
    // SAFETY: `d`, `e` and `f` are live blocks of `c` of the sizes they were
    // allocated with, each freed once.
    unsafe {
        free(&c, d, 5 * KIB);
        free(&c, e, 6 * KIB);
        free(&c, f, 11 * KIB);
    }
    let s = c.stats();
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.cached_bytes, (9 * KIB) as u64);
    assert_eq!(inner.live_blocks(), 2);
}

#[test]
fn free_count_zero_caches_nothing() {
    let inner = Counting::new();
    let c = CachingAllocator::from_spec(&inner, "*=*;*;0").unwrap();
    let p = alloc(&c, KIB);
    // SAFETY: `p` is the live 1 KiB block allocated above.
    unsafe { free(&c, p, KIB) };
    assert_eq!(inner.live_blocks(), 0);
    assert_eq!(c.stats().cached_blocks, 0);
}

#[test]
fn trim_returns_oldest_first_across_pools() {
    let inner = Counting::new();
    let c = CachingAllocator::from_spec(&inner, "*=2kib,*").unwrap();
    let sizes = [KIB, 4 * KIB, 2 * KIB, 8 * KIB, 3 * KIB];
    let ptrs: Vec<_> = sizes.iter().map(|&s| alloc(&c, s)).collect();
    // Free in a scrambled order; trim must follow free order.
    let order = [3, 0, 4, 1, 2];
    for &i in &order {
        // SAFETY: `order` names each index once, so every block is freed once,
        // with the size it was allocated with.
        unsafe { free(&c, ptrs[i], sizes[i]) };
    }
    inner.clear_events();
    c.trim_to((5 * KIB) as u64); // 18 KiB cached: drop 8, 1, 3, 4 KiB (oldest first) to reach <= 5 KiB
    let got: Vec<_> = inner.events();
    assert_eq!(
        got,
        vec![
            Event::Dealloc(8 * KIB, 8),
            Event::Dealloc(KIB, 8),
            Event::Dealloc(3 * KIB, 8),
            Event::Dealloc(4 * KIB, 8)
        ]
    );
    assert_eq!(c.stats().cached_bytes, (2 * KIB) as u64);
    c.trim();
    assert_eq!(inner.live_blocks(), 0);
    let s = c.stats();
    assert_eq!((s.cached_blocks, s.cached_bytes, s.trimmed), (0, 0, 5));
}

#[test]
fn inner_failure_trims_and_retries_once() {
    let inner = Counting::new();
    let c = CachingAllocator::unbounded(&inner);
    let a = alloc(&c, 16 * KIB);
    // SAFETY: `a` is the live 16 KiB block allocated above.
    unsafe { free(&c, a, 16 * KIB) };
    inner.clear_events();
    inner.fail(1);
    let b = alloc(&c, 32 * KIB);
    assert_eq!(
        inner.events(),
        vec![
            Event::Fail(32 * KIB),
            Event::Dealloc(16 * KIB, 8),
            Event::Alloc(32 * KIB, 8)
        ]
    );
    let s = c.stats();
    assert_eq!((s.inner_failures, s.misses, s.cached_blocks), (1, 2, 0));
    // Two failures in a row: AllocError, nothing leaked, stats unchanged.
    inner.fail(2);
    assert!(c.allocate(l(64 * KIB)).is_err());
    let s2 = c.stats();
    assert_eq!(s2.inner_failures, 3);
    assert_eq!((s2.misses, s2.live_bytes), (2, (32 * KIB) as u64));
    assert_eq!(
        s2.pools[0].live_bytes + s2.pools[0].cached_bytes,
        (32 * KIB) as u64
    );
    // Unpooled path retries too.
    let d = CachingAllocator::with_pools(&inner, []).unwrap();
    inner.fail(1);
    let p = alloc(&d, KIB);
    assert_eq!(d.stats().inner_failures, 1);
    // SAFETY: `p` is `d`'s live 1 KiB block, `b` is `c`'s live 32 KiB block.
    unsafe {
        free(&d, p, KIB);
        free(&c, b, 32 * KIB);
    }
}

#[test]
fn alignment_reuse_keeps_original_layout() {
    let inner = Counting::new();
    let c = CachingAllocator::unbounded(&inner);
    let big = Layout::from_size_align(4 * KIB, 4 * KIB).unwrap();
    let p = c.allocate(big).unwrap().cast::<u8>();
    // SAFETY: `p` is the live block allocated with `big` just above.
    unsafe { c.deallocate(p, big) };
    // A smaller alignment is satisfied by the 4 KiB-aligned block.
    let small = Layout::from_size_align(4 * KIB, 16).unwrap();
    let q = c.allocate(small).unwrap().cast::<u8>();
    assert_eq!(p, q);
    assert_eq!(c.stats().hits, 1);
    // SAFETY: `q` was allocated with `small`: the caller's layout is the one
    // to free with, whatever block the cache served it from.
    unsafe { c.deallocate(q, small) };
    // A larger alignment than the block has is a miss unless the address happens to satisfy it.
    let small_block = c
        .allocate(Layout::from_size_align(64, 8).unwrap())
        .unwrap()
        .cast::<u8>();
    // SAFETY: `small_block` is live and was allocated with this layout.
    unsafe { c.deallocate(small_block, Layout::from_size_align(64, 8).unwrap()) };
    let huge_align = Layout::from_size_align(64, 1 << 16).unwrap();
    let r = c.allocate(huge_align).unwrap().cast::<u8>();
    assert_eq!(r.as_ptr() as usize % (1 << 16), 0);
    // SAFETY: `r` is live and was allocated with `huge_align`.
    unsafe { c.deallocate(r, huge_align) };
    drop(c);
    // Counting asserts every block went back with its original layout.
    assert_eq!(inner.live_blocks(), 0);
}

#[test]
fn zero_size_never_reaches_inner() {
    let inner = Counting::new();
    let c = CachingAllocator::unbounded(&inner);
    let z = Layout::from_size_align(0, 64).unwrap();
    let p = c.allocate(z).unwrap();
    assert_eq!(p.len(), 0);
    assert_eq!(p.cast::<u8>().as_ptr() as usize % 64, 0);
    // SAFETY: the zero-size block `c` handed out for `z`, freed with `z`.
    unsafe { c.deallocate(p.cast(), z) };
    assert!(inner.events().is_empty());
}

#[test]
fn vec_grow_and_shrink_go_through_the_cache() {
    let inner = Counting::new();
    let c = CachingAllocator::unbounded(&inner);
    {
        let mut v: AVec<u32, _> = AVec::new_in(&c);
        for i in 0..1000u32 {
            v.push(i);
        }
        v.shrink_to_fit();
        assert!(v.iter().copied().eq(0..1000));
        v.truncate(10);
        v.shrink_to_fit();
        assert_eq!(&v[..], &(0..10).collect::<Vec<_>>()[..]);
    }
    let s = c.stats();
    assert_eq!(s.live_bytes, 0);
    assert!(s.cached_blocks > 0);
    // A second identical workload is served entirely from the cache.
    let misses = s.misses;
    {
        let mut v: AVec<u32, _> = AVec::new_in(&c);
        for i in 0..1000u32 {
            v.push(i);
        }
        v.shrink_to_fit();
        v.truncate(10);
        v.shrink_to_fit();
    }
    assert_eq!(c.stats().misses, misses, "second run: all hits");
}

#[test]
fn grow_zeroed_and_rounding_in_place() {
    let inner = Counting::new();
    let c = CachingAllocator::builder(&inner)
        .round_up(RoundUp::PowerOfTwoDivisions(4))
        .build()
        .unwrap();
    let p = c.allocate(l(1100)).unwrap();
    assert_eq!(p.len(), 1280, "rounded block is returned whole");
    let p = p.cast::<u8>();
    // SAFETY: the block is 1280 bytes long (`p.len()` above) and ours.
    unsafe { p.as_ptr().write_bytes(0xAB, 1100) };
    // 1100 -> 1200 rounds to the same block: in place, tail zeroed.
    // SAFETY: `p` is live with layout `l(1100)`; 1200 is not smaller.
    let q = unsafe { c.grow_zeroed(p, l(1100), l(1200)) }.unwrap();
    assert_eq!(q.cast::<u8>(), p);
    // SAFETY: the grown block is still at `p` (asserted above) and
    // `grow_zeroed` hands out the whole rounded block, 1280 bytes, with
    // every byte past the old 1100 zeroed, so all of it is initialised.
    let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), 1280) };
    assert!(bytes[..1100].iter().all(|&b| b == 0xAB));
    assert!(bytes[1100..].iter().all(|&b| b == 0));
    // 1200 -> 3000 moves to a new block (3072), contents kept.
    // SAFETY: `p` is live with layout `l(1200)` after the grow above, and
    // `bytes` is not used past this point.
    let r = unsafe { c.grow(p, l(1200), l(3000)) }.unwrap();
    assert_eq!(r.len(), 3072);
    let r = r.cast::<u8>();
    // SAFETY: `r` is live and its first 1100 bytes were copied from `p`.
    assert!(unsafe { std::slice::from_raw_parts(r.as_ptr(), 1100) }
        .iter()
        .all(|&b| b == 0xAB));
    // The old block went to the cache.
    assert_eq!(c.stats().cached_blocks, 1);
    // SAFETY: `r` is live with layout `l(3000)`; 1100 is not larger.
    let s = unsafe { c.shrink(r, l(3000), l(1100)) }.unwrap();
    assert_eq!(
        s.cast::<u8>(),
        p,
        "shrink reuses the cached 1280-byte block"
    );
    // SAFETY: `s` is live with layout `l(1100)` after the shrink.
    unsafe { c.deallocate(s.cast(), l(1100)) };
    let st = c.stats();
    assert_eq!((st.live_bytes, st.cached_bytes), (0, 1280 + 3072));
}

#[test]
fn per_pool_round_up() {
    let c = CachingAllocator::builder(Global)
        .spec("*=4kib,*".parse().unwrap())
        .pool_round_up(1, RoundUp::PowerOfTwoDivisions(1))
        .build()
        .unwrap();
    let a = c.allocate(l(3000)).unwrap();
    assert_eq!(a.len(), 3000, "pool 0 does not round");
    let b = c.allocate(l(5000)).unwrap();
    assert_eq!(b.len(), 8192, "pool 1 rounds to a power of two");
    // SAFETY: `a` and `b` are live blocks of `c`, freed once with the layouts
    // they were requested with.
    unsafe {
        c.deallocate(a.cast(), l(3000));
        c.deallocate(b.cast(), l(5000));
    }
    assert_eq!(c.stats().pools[1].cached_bytes, 8192);
}

#[test]
fn stats_display_is_a_table() {
    let c = CachingAllocator::from_spec(Global, "*=1mib;64mib;8,*").unwrap();
    let a = c.allocate(l(4 * KIB)).unwrap();
    // SAFETY: `a` is the live block allocated with `l(4 * KIB)` above.
    unsafe { c.deallocate(a.cast(), l(4 * KIB)) };
    let b = c.allocate(l(4 * KIB)).unwrap();
    let text = c.stats().to_string();
    assert!(text.contains("hits"), "{text}");
    assert!(text.contains("64mib"), "{text}");
    assert!(text.contains("4.0 KiB"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        2,
        "{text}"
    );
    // SAFETY: `b` is the live block allocated with `l(4 * KIB)` above.
    unsafe { c.deallocate(b.cast(), l(4 * KIB)) };
}

#[test]
fn with_pools_defaults() {
    let p = PoolParams::new(Heap::host());
    assert_eq!(p.max_free_allocation_count, 64);
    assert_eq!(p.max_allocation_capacity, u64::MAX);
    let c = CachingAllocator::with_pools(Global, [p]).unwrap();
    assert_eq!(c.pool_params(), vec![p]);
}
