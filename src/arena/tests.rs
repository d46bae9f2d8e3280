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
