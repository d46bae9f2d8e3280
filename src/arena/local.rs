//! Bump allocation in the runtime region: `Allocator for &BumpArena` (shared,
//! lock-free) and [`LocalArena`] (one thread, no atomics).
//!
//! Both bump **upward**, so the most recent allocation can grow in place,
//! and `end` addresses compare directly against a limit. The arithmetic never
//! overflows: every cursor and limit is at most `base + total_size <=
//! isize::MAX` (checked when the arena is mapped), and a [`Layout`] has
//! `size + align - 1 <= isize::MAX`, so every sum stays below `usize::MAX`.

use super::BumpArena;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;

/// First chunk a [`LocalArena`] takes from the shared pointer, in bytes.
const FIRST_CHUNK: usize = 16 << 10;
/// Chunks double up to this size, in bytes.
const MAX_CHUNK: usize = 2 << 20;

/// Align `cur` up to `layout.align()` and add `layout.size()`: the block
/// `(start, end)` when `end <= limit`.
#[inline(always)]
fn bump(cur: usize, limit: usize, layout: Layout) -> Option<(usize, usize)> {
    let align = layout.align();
    // No overflow: see the module docs.
    let start = cur.wrapping_add(align - 1) & align.wrapping_neg();
    let end = start.wrapping_add(layout.size());
    if end <= limit {
        Some((start, end))
    } else {
        None
    }
}

/// A pointer to `addr` with the provenance of the arena's base pointer.
#[inline(always)]
fn at(base: NonNull<u8>, addr: usize) -> NonNull<u8> {
    // SAFETY: `addr` lies inside (or one past the end of) the arena's
    // mapping, which starts at a non-null address.
    unsafe { NonNull::new_unchecked(base.as_ptr().with_addr(addr)) }
}

#[inline(always)]
fn block(base: NonNull<u8>, addr: usize, size: usize) -> NonNull<[u8]> {
    NonNull::slice_from_raw_parts(at(base, addr), size)
}

impl BumpArena {
    #[inline]
    fn alloc_shared(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let mut cur = self.cursor.load(Relaxed);
        loop {
            let (start, end) = bump(cur, self.end, layout).ok_or(AllocError)?;
            // Relaxed suffices: disjointness follows from the single total
            // order of read-modify-writes on `cursor`; handing data between
            // threads is the caller's synchronisation.
            match self
                .cursor
                .compare_exchange_weak(cur, end, Relaxed, Relaxed)
            {
                Ok(_) => return Ok(block(self.storage.base, start, layout.size())),
                Err(now) => cur = now,
            }
        }
    }

    /// Move the bump pointer from `from` to `to` if it is still at `from`.
    fn cas_cursor(&self, from: usize, to: usize) -> bool {
        let ok = self
            .cursor
            .compare_exchange(from, to, Relaxed, Relaxed)
            .is_ok();
        if ok && to < from {
            self.hwm.fetch_max(from, Relaxed);
        }
        ok
    }

    /// Allocate `new`, copy `copy` bytes from `ptr` (which stays allocated).
    ///
    /// # Safety
    /// `ptr` is valid for `copy` reads.
    unsafe fn move_block(
        &self,
        ptr: NonNull<u8>,
        copy: usize,
        new: Layout,
        alloc: impl FnOnce(Layout) -> Result<NonNull<[u8]>, AllocError>,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let p = alloc(new)?;
        // SAFETY: the new block is fresh (disjoint from `ptr`) and at least
        // `copy` bytes long; `ptr` is readable for `copy` bytes.
        unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr(), p.as_ptr().cast::<u8>(), copy) };
        Ok(p)
    }
}

// SAFETY: blocks are disjoint ranges of the runtime region handed out by a
// compare-and-swap on the bump pointer; they stay valid until the arena is
// reset, rewound or dropped, each of which needs `&mut BumpArena` (or
// ownership), so no `&BumpArena` (and no block borrowed from it) is alive.
// A block is never handed out twice while allocated: the pointer only moves
// back over the most recent block, when that block is freed or shrunk.
unsafe impl Allocator for &BumpArena {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.alloc_shared(layout)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let a = ptr.as_ptr() as usize;
        // Only the most recent block can be given back; others stay until
        // reset, as in any bump allocator.
        self.cas_cursor(a + layout.size(), a);
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let a = ptr.as_ptr() as usize;
        if a & (new.align() - 1) == 0 {
            let new_end = a + new.size();
            if new_end <= self.end && self.cas_cursor(a + old.size(), new_end) {
                return Ok(block(self.storage.base, a, new.size()));
            }
        }
        // SAFETY: the caller guarantees `ptr` holds `old.size()` bytes.
        unsafe { self.move_block(ptr, old.size(), new, |l| self.alloc_shared(l)) }
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
            // Give the tail back when this is the most recent block; keep it
            // otherwise (it is freed on reset).
            self.cas_cursor(a + old.size(), a + new.size());
            return Ok(block(self.storage.base, a, new.size()));
        }
        // SAFETY: the caller guarantees `ptr` holds `old.size() >= new.size()` bytes.
        unsafe { self.move_block(ptr, new.size(), new, |l| self.alloc_shared(l)) }
    }
}

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
    /// Next free address in the current chunk.
    cur: Cell<usize>,
    /// End of the current chunk.
    limit: Cell<usize>,
    base: NonNull<u8>,
    chunk_start: Cell<usize>,
    next_chunk: Cell<usize>,
    arena: &'a BumpArena,
}

// SAFETY: the handle holds a shared reference to a `Sync` arena and plain
// cursors into memory it alone may bump; moving it to another thread moves
// that exclusive right with it. It is not `Sync` (the `Cell`s).
unsafe impl Send for LocalArena<'_> {}

impl<'a> LocalArena<'a> {
    pub(super) fn new(arena: &'a BumpArena) -> Self {
        // Start with an empty chunk at the arena's end: the first allocation
        // takes the slow path.
        LocalArena {
            cur: Cell::new(arena.end),
            limit: Cell::new(arena.end),
            base: arena.storage.base,
            chunk_start: Cell::new(arena.end),
            next_chunk: Cell::new(FIRST_CHUNK),
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
        self.limit.get() - self.cur.get()
    }

    #[inline(always)]
    fn alloc_fast(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        match bump(self.cur.get(), self.limit.get(), layout) {
            Some((start, end)) => {
                self.cur.set(end);
                Ok(block(self.base, start, layout.size()))
            }
            None => self.alloc_slow(layout),
        }
    }

    /// Refill from the shared pointer, then allocate.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let arena = self.arena;
        let pref = self.next_chunk.get();
        let mut shared = arena.cursor.load(Relaxed);
        loop {
            // Extend the current chunk when nothing was allocated after it;
            // else start a new chunk at the shared pointer.
            let extend = shared == self.limit.get();
            let from = if extend { self.cur.get() } else { shared };
            let (start, end) = bump(from, arena.end, layout).ok_or(AllocError)?;
            // Take `pref` bytes when the arena has them, else only what this
            // allocation needs (leave the rest to other users).
            let want = shared.saturating_add(pref).max(end);
            let chunk_end = if want <= arena.end { want } else { end };
            match arena
                .cursor
                .compare_exchange_weak(shared, chunk_end, Relaxed, Relaxed)
            {
                Ok(_) => {
                    if !extend {
                        self.chunk_start.set(shared);
                    }
                    self.cur.set(end);
                    self.limit.set(chunk_end);
                    self.next_chunk.set((pref * 2).min(MAX_CHUNK));
                    return Ok(block(self.base, start, layout.size()));
                }
                Err(now) => shared = now,
            }
        }
    }

    /// Whether `a..a+size` is the most recent block of the current chunk.
    fn is_last(&self, a: usize, size: usize) -> bool {
        a >= self.chunk_start.get() && a + size == self.cur.get()
    }

    /// Make the current chunk reach `new_end` by taking more from the shared
    /// pointer, when nothing was allocated after the chunk.
    fn extend_to(&self, new_end: usize) -> bool {
        let arena = self.arena;
        let limit = self.limit.get();
        if new_end <= limit {
            return true;
        }
        if new_end > arena.end {
            return false;
        }
        let want = limit.saturating_add(self.next_chunk.get()).max(new_end);
        let chunk_end = if want <= arena.end { want } else { new_end };
        if arena
            .cursor
            .compare_exchange(limit, chunk_end, Relaxed, Relaxed)
            .is_ok()
        {
            self.limit.set(chunk_end);
            true
        } else {
            false
        }
    }
}

impl Drop for LocalArena<'_> {
    fn drop(&mut self) {
        let (cur, limit) = (self.cur.get(), self.limit.get());
        if cur < limit {
            // Give back the unused tail when nothing was allocated after it.
            self.arena.cas_cursor(limit, cur);
        }
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
        if self.is_last(a, layout.size()) {
            self.cur.set(a);
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let a = ptr.as_ptr() as usize;
        if a & (new.align() - 1) == 0 && self.is_last(a, old.size()) {
            let new_end = a + new.size();
            if self.extend_to(new_end) {
                self.cur.set(new_end);
                return Ok(block(self.base, a, new.size()));
            }
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
            if self.is_last(a, old.size()) {
                self.cur.set(a + new.size());
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

/// Zero bytes `from..to` of a block that grew (bump memory may hold bytes of
/// blocks freed by a rewind or a last-block free).
fn zero_tail(p: NonNull<[u8]>, from: usize, to: usize) {
    // SAFETY: the block holds at least `to >= from` bytes.
    unsafe { p.as_ptr().cast::<u8>().add(from).write_bytes(0, to - from) };
}
