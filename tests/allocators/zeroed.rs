//! `allocate_zeroed` and `grow_zeroed` read zero through every allocator of
//! the crate, also when the memory they hand out held bytes of a freed or
//! shrunk block (a bump pointer moved back, a cached block, a mapping kept
//! by a shrink).

use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::caching::CachingAllocator;
use ckalloc::{BumpArena, CkHuge};
use std::ptr::NonNull;

fn fill(p: NonNull<[u8]>, byte: u8) {
    // SAFETY: a live block of `p.len()` bytes.
    unsafe { p.cast::<u8>().as_ptr().write_bytes(byte, p.len()) };
}

fn bytes(p: NonNull<[u8]>) -> &'static [u8] {
    // SAFETY: a live block of `p.len()` bytes, read before it is freed.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>().as_ptr(), p.len()) }
}

/// Free a dirty block, then `allocate_zeroed` the same layout; shrink a
/// dirty block, then `grow_zeroed` it back.
/// `reuses`: the allocator hands the freed block out again (so the zeroed
/// block held the 0xFF bytes).
fn zeroed_reads_zero(a: impl Allocator, size: usize, what: &str, reuses: bool) {
    let l = Layout::from_size_align(size, 64).unwrap();
    let p = a.allocate(l).unwrap();
    fill(p, 0xFF);
    // SAFETY: allocated above with `l`.
    unsafe { a.deallocate(p.cast(), l) };
    let z = a.allocate_zeroed(l).unwrap();
    if reuses {
        assert_eq!(
            z.cast::<u8>(),
            p.cast::<u8>(),
            "{what}: the freed block again"
        );
    }
    assert!(bytes(z).iter().all(|&b| b == 0), "{what}: allocate_zeroed");

    let small = Layout::from_size_align(size / 4, 64).unwrap();
    fill(z, 0xEE);
    // SAFETY: `z` is live with layout `l`; `small` is not larger.
    let s = unsafe { a.shrink(z.cast(), l, small) }.unwrap();
    // SAFETY: `s` is live with layout `small`; `l` is not smaller.
    let g = unsafe { a.grow_zeroed(s.cast(), small, l) }.unwrap();
    let g_bytes = bytes(g);
    assert!(
        g_bytes[..size / 4].iter().all(|&b| b == 0xEE),
        "{what}: kept bytes"
    );
    assert!(
        g_bytes[size / 4..].iter().all(|&b| b == 0),
        "{what}: grow_zeroed"
    );
    // SAFETY: live with layout `l`.
    unsafe { a.deallocate(g.cast(), l) };
}

#[test]
fn bump_arena_zeroed_paths_read_zero() {
    for chunks in [true, false] {
        let arena = BumpArena::builder(8 << 20)
            .thread_chunks(chunks)
            .build()
            .unwrap();
        zeroed_reads_zero(&arena, 64 << 10, "&BumpArena", true);
    }
}

#[test]
fn local_arena_zeroed_paths_read_zero() {
    let arena = BumpArena::builder(8 << 20).build().unwrap();
    let local = arena.local();
    zeroed_reads_zero(&local, 64 << 10, "&LocalArena", true);
}

#[test]
fn ck_huge_zeroed_paths_read_zero() {
    // Below the mapping threshold (the system allocator) and above it.
    zeroed_reads_zero(CkHuge::new(), 4 << 10, "CkHuge small", false);
    zeroed_reads_zero(CkHuge::new(), 8 << 20, "CkHuge mapped", false);
}

#[test]
fn caching_allocator_zeroed_hits_read_zero() {
    let c = CachingAllocator::from_spec(CkHuge::new(), "*=*;*;8").unwrap();
    zeroed_reads_zero(&c, 64 << 10, "CachingAllocator<CkHuge>", true);
    let arena = BumpArena::builder(8 << 20).build().unwrap();
    let c = CachingAllocator::from_spec(&arena, "*=*;*;8").unwrap();
    zeroed_reads_zero(&c, 64 << 10, "CachingAllocator<&BumpArena>", true);
}

#[test]
fn ck_huge_global_alloc_zeroed_hits_read_zero_over_a_partly_cleared_block() {
    use std::alloc::GlobalAlloc;
    // A retained 4 MiB block served to `alloc_zeroed(3 MiB)` has only the
    // request's 3 MiB cleared (all a `GlobalAlloc` caller owns); freed again
    // with nothing written, the next `alloc_zeroed(4 MiB)` must read zero
    // over the last MiB too, which still holds the first block's bytes.
    let a = CkHuge::new();
    let (l3, l4) = (
        std::alloc::Layout::from_size_align(3 << 20, 64).unwrap(),
        std::alloc::Layout::from_size_align(4 << 20, 64).unwrap(),
    );
    // SAFETY: non-zero sizes; each block is freed with its layout and not
    // used after.
    unsafe {
        let p = a.alloc(l4);
        assert!(!p.is_null());
        p.write_bytes(0xFF, 4 << 20);
        a.dealloc(p, l4);
        let q = a.alloc_zeroed(l3);
        assert!(!q.is_null());
        let s = std::slice::from_raw_parts(q, 3 << 20);
        assert!(s.iter().all(|&b| b == 0), "alloc_zeroed(3 MiB)");
        a.dealloc(q, l3);
        let r = a.alloc_zeroed(l4);
        assert!(!r.is_null());
        let s = std::slice::from_raw_parts(r, 4 << 20);
        assert!(s.iter().all(|&b| b == 0), "alloc_zeroed(4 MiB)");
        a.dealloc(r, l4);
    }
}
