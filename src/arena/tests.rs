//! Bump logic over heap-backed storage (runs under Miri).

use super::BumpArena;
use allocator_api2::alloc::{Allocator, Layout};
use allocator_api2::vec::Vec;

#[test]
fn seed_env_flag_matches_seed() {
    use crate::huge::env_flag as f;
    assert!(!f(None));
    for off in [&b""[..], b"0", b"false", b"FALSE", b"No", b"no"] {
        assert!(!f(Some(off)), "{off:?}");
    }
    // The seed neither trims nor knows "off".
    for on in [&b"1"[..], b"yes", b"off", b" 0", b"true", b"2"] {
        assert!(f(Some(on)), "{on:?}");
    }
}

#[test]
fn shared_bump_aligns_frees_last_and_grows_in_place() {
    let arena = BumpArena::heap_for_tests(1 << 16, 100);
    let a = &arena;
    let l8 = Layout::from_size_align(8, 8).unwrap();
    let p = a.allocate(l8).unwrap();
    assert_eq!(p.as_ptr().cast::<u8>() as usize % 8, 0);
    assert_eq!(arena.offset_of(p.as_ptr().cast()), Some(104));
    let q = a.allocate(Layout::from_size_align(3, 1).unwrap()).unwrap();
    assert_eq!(arena.offset_of(q.as_ptr().cast()), Some(112));
    // SAFETY: q is the most recent block.
    unsafe { a.deallocate(q.cast(), Layout::from_size_align(3, 1).unwrap()) };
    assert_eq!(arena.used(), 12);
    // Grow p in place: it is the most recent block again.
    // SAFETY: p is live with layout l8.
    let g = unsafe { a.grow(p.cast(), l8, Layout::from_size_align(64, 8).unwrap()) }.unwrap();
    assert_eq!(g.cast::<u8>(), p.cast::<u8>());
    assert_eq!(arena.used(), 68);
    assert_eq!(arena.high_water_mark(), 68);
}

#[test]
fn vec_and_local_arena_over_heap_storage() {
    let mut arena = BumpArena::heap_for_tests(1 << 20, 0);
    {
        let mut v: Vec<u64, _> = Vec::new_in(&arena);
        for i in 0..1000 {
            v.push(i);
        }
        assert_eq!(v.iter().sum::<u64>(), 999 * 1000 / 2);
        // Doubling growth in place: nothing but the final vector is used.
        assert_eq!(arena.used(), v.capacity() * 8);
    }
    let cp = arena.checkpoint();
    {
        let local = arena.local();
        let mut w: Vec<u8, _> = Vec::new_in(&local);
        w.extend(0..=255u8);
        assert_eq!(w[200], 200);
        let x = allocator_api2::boxed::Box::new_in(5u32, &local);
        assert_eq!(*x, 5);
    }
    arena.rewind_to(cp).unwrap();
    assert_eq!(arena.used(), cp.used());
    arena.reset();
    assert_eq!(arena.used(), 0);
    assert!(arena.high_water_mark() >= 8000);
}

#[test]
fn exhaustion_is_an_error() {
    let arena = BumpArena::heap_for_tests(4096, 0);
    let a = &arena;
    assert!(a
        .allocate(Layout::from_size_align(4097, 1).unwrap())
        .is_err());
    assert!(a
        .allocate(Layout::from_size_align(4096, 1).unwrap())
        .is_ok());
    assert!(a.allocate(Layout::from_size_align(1, 1).unwrap()).is_err());
    let local = arena.local();
    assert!((&local)
        .allocate(Layout::from_size_align(1, 1).unwrap())
        .is_err());
}

const L64: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// An arena on the same thread-chunk slot as `slot` (others built on the way
/// are kept alive in `keep`).
fn arena_on_slot(slot: usize, keep: &mut std::vec::Vec<BumpArena>) -> BumpArena {
    loop {
        let a = BumpArena::heap_for_tests(1 << 20, 0);
        if a.slot_for_tests() == slot {
            return a;
        }
        keep.push(a);
    }
}

fn off(arena: &BumpArena, p: std::ptr::NonNull<[u8]>) -> usize {
    arena.offset_of(p.as_ptr().cast::<u8>()).unwrap()
}

/// A dropped arena's chunk is never bumped again, even by an arena on the
/// same slot (whose memory may sit at the same address).
#[test]
fn dropped_arenas_chunk_is_not_reused() {
    let a = BumpArena::heap_for_tests(1 << 20, 0);
    let slot = a.slot_for_tests();
    assert_eq!(off(&a, (&a).allocate(L64).unwrap()), 0);
    drop(a);
    let mut keep = std::vec::Vec::new();
    let b = arena_on_slot(slot, &mut keep);
    assert_eq!(off(&b, (&b).allocate(L64).unwrap()), 0);
    assert_eq!(b.used(), 64);
}

/// Two live arenas on one slot: the second allocates through the shared
/// pointer (packed exactly) until it has missed `ADOPT_AFTER` times, then
/// takes the slot; every block stays disjoint and the abandoned chunk tails
/// are bounded.
#[test]
fn arenas_sharing_a_slot_stay_correct_and_bounded() {
    use super::shared::{ADOPT_AFTER, THREAD_SIZES};
    let a = BumpArena::heap_for_tests(1 << 20, 0);
    let mut keep = std::vec::Vec::new();
    let b = arena_on_slot(a.slot_for_tests(), &mut keep);
    // `a` holds the slot.
    let _ = (&a).allocate(L64).unwrap();
    for i in 0..ADOPT_AFTER as usize {
        let p = (&b).allocate(L64).unwrap();
        assert_eq!(off(&b, p), i * 64, "shared pointer, packed");
    }
    let n = if cfg!(miri) { 600 } else { 3000 };
    let mut blocks = std::vec::Vec::new();
    for i in 0..n {
        for (k, arena) in [&a, &b].into_iter().enumerate() {
            let p = arena.allocate(L64).unwrap().cast::<u8>();
            let tag = (i * 2 + k) as u8;
            // SAFETY: a fresh 64-byte block.
            unsafe { p.as_ptr().write_bytes(tag, 64) };
            blocks.push((p.as_ptr() as usize, tag));
        }
    }
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    for w in sorted.windows(2) {
        assert!(w[0].0 + 64 <= w[1].0, "overlap");
    }
    for &(p, tag) in &blocks {
        // SAFETY: every block is live and 64 bytes long.
        let s = unsafe { std::slice::from_raw_parts(p as *const u8, 64) };
        assert!(s.iter().all(|&x| x == tag));
    }
    let live = (2 * n + ADOPT_AFTER as usize + 1) * 64;
    // After a steal the chunk restarts at 16 KiB; ADOPT_AFTER blocks of 64
    // bytes (16 KiB) fit in two chunks, so each steal abandons < 32 KiB.
    let steals = 2 * n / ADOPT_AFTER as usize + 2;
    eprintln!("used {} + {} for {live} live bytes", a.used(), b.used());
    assert!(
        a.used() + b.used() <= live + steals * 2 * THREAD_SIZES.first,
        "used {} + {} for {live} live bytes",
        a.used(),
        b.used()
    );
}

// ---- review3: cross-thread reuse, ordering, views --------------------------

use std::sync::atomic::Ordering::Relaxed;

const L16K: Layout = match Layout::from_size_align(16 << 10, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// A block written and freed on one thread, then handed out again on
/// another thread that never synchronised with the first, must not race:
/// the free has to publish the old writes (release) and the allocation
/// has to see them (acquire). Under Miri a `Relaxed` handover is reported
/// as a data race; natively (x86) this test cannot fail.
fn freed_block_reaches_other_thread_in_order(arena: &BumpArena) {
    let start = arena.cursor.load(Relaxed);
    // Fill this thread's first chunk exactly (or take one block from the
    // shared pointer): the block ends at the shared pointer.
    let p = (&arena).allocate(L16K).unwrap().cast::<u8>();
    assert_eq!(
        p.as_ptr() as usize + L16K.size(),
        arena.cursor.load(Relaxed)
    );
    let p = SendPtr(p);
    std::thread::scope(|s| {
        s.spawn(move || {
            let p = p;
            // SAFETY: a live 16 KiB block owned by this thread now.
            unsafe { p.0.as_ptr().write_bytes(0xAA, L16K.size()) };
            // SAFETY: allocated from `arena` with L16K, not used after.
            unsafe { (&arena).deallocate(p.0, L16K) };
        });
        s.spawn(move || {
            // Wait (without synchronising) until the block is free again.
            while arena.cursor.load(Relaxed) != start {
                std::thread::yield_now();
            }
            let q = (&arena).allocate(L64).unwrap().cast::<u8>();
            assert_eq!(q.as_ptr() as usize, start, "the freed block is reused");
            // SAFETY: a fresh 64-byte block.
            unsafe { q.as_ptr().write_bytes(0x55, 64) };
        });
    });
}

struct SendPtr(std::ptr::NonNull<u8>);
// SAFETY: test-only carrier of a block that moves to another thread.
unsafe impl Send for SendPtr {}

#[test]
fn cross_thread_free_then_reuse_is_ordered_thread_chunks() {
    let arena = BumpArena::heap_for_tests(1 << 17, 0);
    freed_block_reaches_other_thread_in_order(&arena);
}

#[test]
fn cross_thread_free_then_reuse_is_ordered_shared_pointer() {
    let mut arena = BumpArena::heap_for_tests(1 << 17, 0);
    arena.token = super::shared::NO_THREAD_CHUNKS;
    freed_block_reaches_other_thread_in_order(&arena);
}

/// The same through a [`LocalArena`](super::LocalArena) whose dropped
/// handle gives its chunk back: bytes it wrote into a freed block must be
/// ordered before the next owner's writes.
#[test]
fn local_arena_give_back_then_reuse_is_ordered() {
    let arena = BumpArena::heap_for_tests(1 << 17, 0);
    let start = arena.cursor.load(Relaxed);
    let arena = &arena;
    // Relaxed flag: signals without synchronising.
    let taken = &std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(move || {
            let local = arena.local();
            let p = (&local).allocate(L64).unwrap().cast::<u8>();
            taken.store(true, Relaxed);
            // SAFETY: a fresh 64-byte block.
            unsafe { p.as_ptr().write_bytes(0xAA, 64) };
            // SAFETY: the most recent block, allocated with L64.
            unsafe { (&local).deallocate(p, L64) };
            drop(local); // gives the whole chunk back
        });
        s.spawn(move || {
            // Wait until a chunk was taken and given back (without
            // synchronising).
            while !taken.load(Relaxed) || arena.cursor.load(Relaxed) != start {
                std::thread::yield_now();
            }
            let q = arena.allocate(L64).unwrap().cast::<u8>();
            assert_eq!(q.as_ptr() as usize, start);
            // SAFETY: a fresh 64-byte block.
            unsafe { q.as_ptr().write_bytes(0x55, 64) };
        });
    });
}
