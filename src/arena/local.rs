//! [`LocalArena`]: a single-thread handle that bumps inside chunks taken
//! from the shared bump pointer, without atomics.

use super::chunk::{block, zero_tail, Chunk, ChunkSizes};
use super::BumpArena;
use crate::zero_size::empty_block;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::ptr::NonNull;

/// Chunk sizes of a [`LocalArena`], in bytes: 16 KiB doubling to 2 MiB.
const LOCAL_SIZES: ChunkSizes = ChunkSizes {
    first: 16 << 10,
    max: 2 << 20,
};

/// A single-thread handle on a [`BumpArena`] (from [`BumpArena::local`]):
/// takes chunks (16 KiB doubling to 2 MiB) from the shared bump pointer and
/// bumps inside them with plain loads and stores.
///
/// `LocalArena` is `Send` but not `Sync`; `&LocalArena` is an
/// [`Allocator`]. When the shared pointer still sits at the end of the
/// current chunk (no other thread allocated since), the chunk is extended in
/// place, so a single thread wastes nothing; otherwise the tail of the old
/// chunk is left unused until reset. Dropping the handle gives the unused tail
/// of its chunk back when nothing was allocated after it. Blocks stay valid
/// until the arena is reset, rewound past them or dropped.
///
/// ```
/// use allocator_api2::boxed::Box;
/// use ckalloc::BumpArena;
/// let arena = BumpArena::builder(4 << 20).build().unwrap();
/// let local = arena.local();
/// let b = Box::new_in([7u8; 64], &local);
/// assert_eq!(arena.offset_of(b.as_ptr()), Some(0));
/// ```
pub struct LocalArena<'a> {
    chunk: Chunk,
    base: NonNull<u8>,
    arena: &'a BumpArena,
}

// SAFETY: the handle holds a shared reference to a `Sync` arena and plain
// cursors into memory it alone may bump; moving it to another thread moves
// that exclusive right with it. It is not `Sync` (the `Cell`s).
unsafe impl Send for LocalArena<'_> {}

impl<'a> LocalArena<'a> {
    pub(super) fn new(arena: &'a BumpArena) -> Self {
        // This thread's `&BumpArena` chunk tail would be out of reach.
        arena.give_back_thread_tail();
        // Start with an empty chunk at the arena's end: the first allocation
        // takes the refill path.
        LocalArena {
            chunk: Chunk::empty(arena.end, LOCAL_SIZES.first),
            base: arena.parts.storage.base,
            arena,
        }
    }

    /// The arena this handle allocates from.
    pub fn arena(&self) -> &'a BumpArena {
        self.arena
    }

    /// Bytes left in the current chunk (allocations up to this size need no
    /// atomic operation).
    pub fn chunk_remaining(&self) -> usize {
        self.chunk.remaining()
    }

    #[inline(always)]
    fn alloc_fast(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        match self.chunk.try_bump(self.base, layout) {
            Some(b) => Ok(b),
            None => self.alloc_slow(layout),
        }
    }

    /// Refill, then allocate. Takes the same arguments as the fast path so
    /// the fast path reaches it with a plain jump.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        // A zero-size request that does not fit (a full arena, an alignment
        // past the end) is served all the same.
        match self.chunk.refill(self.arena, layout, LOCAL_SIZES) {
            Err(_) if layout.size() == 0 => Ok(empty_block(layout.align())),
            r => r,
        }
    }
}

impl Drop for LocalArena<'_> {
    fn drop(&mut self) {
        self.chunk.give_back(self.arena);
    }
}

impl std::fmt::Debug for LocalArena<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalArena")
            .field("chunk_remaining", &self.chunk_remaining())
            .finish_non_exhaustive()
    }
}

// SAFETY: blocks come from chunks that the shared bump pointer handed to this
// handle alone; inside a chunk the cursor only moves back over the most recent
// block when it is freed or shrunk. Blocks stay valid until the arena is reset
// or rewound (needs `&mut BumpArena`, impossible while this handle borrows it)
// or dropped.
unsafe impl Allocator for &LocalArena<'_> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.alloc_fast(layout)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let a = ptr.as_ptr() as usize;
        if self.chunk.is_last(a, layout.size()) {
            self.chunk.set_cur(a);
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let a = ptr.as_ptr() as usize;
        if a & (new.align() - 1) == 0 && self.chunk.grow_last(self.arena, a, old.size(), new.size())
        {
            return Ok(block(self.base, a, new.size()));
        }
        // SAFETY: the caller guarantees `ptr` holds `old.size()` bytes.
        unsafe {
            self.arena
                .move_block(ptr, old.size(), new, |l| self.alloc_fast(l))
        }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        let p = unsafe { self.grow(ptr, old, new)? };
        zero_tail(p, old.size(), new.size());
        Ok(p)
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let a = ptr.as_ptr() as usize;
        if a & (new.align() - 1) == 0 {
            if self.chunk.is_last(a, old.size()) {
                self.chunk.set_cur(a + new.size());
            }
            return Ok(block(self.base, a, new.size()));
        }
        // SAFETY: the caller guarantees `ptr` holds `old.size() >= new.size()` bytes.
        unsafe {
            self.arena
                .move_block(ptr, new.size(), new, |l| self.alloc_fast(l))
        }
    }
}
