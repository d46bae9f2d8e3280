//! A zero-size request of any alignment gets an aligned pointer from every
//! allocator of the crate, never `AllocError`: also from a full arena, and
//! for alignments up to 1 MiB. The arenas place it at the bump pointer when
//! the alignment fits before their end, else it dangles.

use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::caching::CachingAllocator;
use ckalloc::{BumpArena, CkHuge};

const ALIGNS: [usize; 6] = [1, 8, 64, 4096, 1 << 16, 1 << 20];

/// Every alignment: `Ok`, length 0, aligned; and the block can be freed,
/// grown and freed again.
fn serves_zero_size(a: impl Allocator, what: &str) {
    for align in ALIGNS {
        let l = Layout::from_size_align(0, align).unwrap();
        let b = a
            .allocate(l)
            .unwrap_or_else(|_| panic!("{what}: align {align}"));
        assert_eq!(b.len(), 0, "{what}");
        assert_eq!(
            b.cast::<u8>().as_ptr() as usize % align,
            0,
            "{what}: align {align}"
        );
        let z = a
            .allocate_zeroed(l)
            .unwrap_or_else(|_| panic!("{what}: zeroed, align {align}"));
        assert_eq!(
            z.cast::<u8>().as_ptr() as usize % align,
            0,
            "{what}: align {align}"
        );
        // SAFETY: blocks of this allocator with layout `l`.
        unsafe {
            a.deallocate(z.cast(), l);
            a.deallocate(b.cast(), l);
        }
    }
}

/// An arena whose runtime region has no byte left.
fn full_arena(thread_chunks: bool) -> BumpArena {
    let arena = BumpArena::builder(4 << 20)
        .thread_chunks(thread_chunks)
        .build()
        .unwrap();
    let n = arena.remaining();
    Allocator::allocate(&&arena, Layout::from_size_align(n, 1).unwrap()).unwrap();
    assert_eq!(arena.remaining(), 0);
    // A one-byte request fails: the arena is full.
    assert!(Allocator::allocate(&&arena, Layout::new::<u8>()).is_err());
    arena
}

#[test]
fn bump_arena_serves_zero_size_when_full() {
    for chunks in [true, false] {
        let arena = full_arena(chunks);
        serves_zero_size(&arena, "&BumpArena");
    }
}

#[test]
fn bump_arena_serves_zero_size_with_room_left() {
    // Alignment 1 MiB does not fit in the 1 MiB runtime region left after
    // the first byte.
    let arena = BumpArena::builder(2 << 20)
        .activations_base(1 << 20)
        .build()
        .unwrap();
    Allocator::allocate(&&arena, Layout::new::<u8>()).unwrap();
    serves_zero_size(&arena, "&BumpArena");
}

/// A zero-size request whose alignment only the arena's end meets sits at
/// the end and takes the padding before it, as any aligned request does:
/// nothing is left afterwards, in both allocation modes.
#[test]
fn bump_arena_zero_size_aligned_to_the_end_takes_the_padding() {
    for chunks in [true, false] {
        // `base + page_floor(activations_base)` is 2 MiB aligned, so the
        // arena's end is too, and no address between its base and its end
        // is: past the first byte, only the end meets a 2 MiB alignment.
        let arena = BumpArena::builder(2 << 20)
            .thread_chunks(chunks)
            .build()
            .unwrap();
        let end = arena.as_ptr() as usize + (2 << 20);
        Allocator::allocate(&&arena, Layout::new::<u8>()).unwrap();
        let z = Allocator::allocate(&&arena, Layout::from_size_align(0, 2 << 20).unwrap()).unwrap();
        assert_eq!(z.cast::<u8>().as_ptr() as usize, end, "chunks {chunks}");
        assert_eq!(arena.remaining(), 0, "chunks {chunks}");
        assert!(Allocator::allocate(&&arena, Layout::new::<u8>()).is_err());
    }
}

#[test]
fn local_arena_serves_zero_size_when_full() {
    for chunks in [true, false] {
        let arena = full_arena(chunks);
        let local = arena.local();
        serves_zero_size(&local, "&LocalArena");
    }
}

#[test]
fn ck_huge_serves_zero_size() {
    serves_zero_size(CkHuge::new(), "CkHuge");
}

#[test]
fn caching_allocator_serves_zero_size() {
    let c = CachingAllocator::from_spec(CkHuge::new(), "*=*;*;8").unwrap();
    serves_zero_size(&c, "CachingAllocator");
    // Over a full arena too: the request never reaches the inner allocator.
    let arena = full_arena(true);
    let c = CachingAllocator::unbounded(&arena);
    serves_zero_size(&c, "CachingAllocator<&BumpArena>");
}
