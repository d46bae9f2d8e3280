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
