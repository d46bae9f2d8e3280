//! A chunk of the runtime region owned by one thread: the bump pointer that
//! both [`LocalArena`](super::LocalArena) and the per-thread chunks behind
//! `&BumpArena` move with plain loads and stores.
//!
//! Chunks bump **upward**, so the most recent allocation can grow in place,
//! and `end` addresses compare directly against a limit. The arithmetic never
//! overflows: every cursor and limit is at most `base + total_size <=
//! isize::MAX` (checked when the arena is mapped), and a [`Layout`] has
//! `size + align - 1 <= isize::MAX`, so every sum stays below `usize::MAX`.

use super::BumpArena;
use allocator_api2::alloc::{AllocError, Layout};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// Align `cur` up to `layout.align()` and add `layout.size()`: the block
/// `(start, end)` when `end <= limit`.
#[inline(always)]
pub(super) fn bump(cur: usize, limit: usize, layout: Layout) -> Option<(usize, usize)> {
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

/// The block of `size` bytes at `addr`.
#[inline(always)]
pub(super) fn block(base: NonNull<u8>, addr: usize, size: usize) -> NonNull<[u8]> {
    NonNull::slice_from_raw_parts(at(base, addr), size)
}

/// Zero bytes `from..to` of a block that grew (bump memory may hold bytes of
/// blocks freed by a rewind or a last-block free).
pub(super) fn zero_tail(p: NonNull<[u8]>, from: usize, to: usize) {
    // SAFETY: the block holds at least `to >= from` bytes.
    unsafe { p.as_ptr().cast::<u8>().add(from).write_bytes(0, to - from) };
}

/// Chunk sizes, in bytes: the first chunk and the largest (chunks double).
#[derive(Clone, Copy)]
pub(super) struct ChunkSizes {
    pub first: usize,
    pub max: usize,
}

/// `[start, limit)` taken from the shared bump pointer; `cur` is the next
/// free address. An empty chunk has `cur == limit`.
pub(super) struct Chunk {
    cur: Cell<usize>,
    limit: Cell<usize>,
    start: Cell<usize>,
    /// Size of the next chunk to take, in bytes.
    next: Cell<usize>,
}

impl Chunk {
    /// An empty chunk at address `at` (the arena's end: the first allocation
    /// takes the refill path).
    pub(super) const fn empty(at: usize, first: usize) -> Chunk {
        Chunk {
            cur: Cell::new(at),
            limit: Cell::new(at),
            start: Cell::new(at),
            next: Cell::new(first),
        }
    }

    /// Forget the current chunk (its tail stays taken until reset).
    pub(super) fn clear(&self, at: usize, first: usize) {
        self.cur.set(at);
        self.limit.set(at);
        self.start.set(at);
        self.next.set(first);
    }

    pub(super) fn cur(&self) -> usize {
        self.cur.get()
    }

    pub(super) fn limit(&self) -> usize {
        self.limit.get()
    }

    pub(super) fn remaining(&self) -> usize {
        self.limit.get() - self.cur.get()
    }

    /// Bump inside the chunk; `None` when it does not fit.
    #[inline(always)]
    pub(super) fn try_bump(&self, base: NonNull<u8>, layout: Layout) -> Option<NonNull<[u8]>> {
        let (start, end) = bump(self.cur.get(), self.limit.get(), layout)?;
        self.cur.set(end);
        Some(block(base, start, layout.size()))
    }

    /// Take a new chunk from the shared pointer (or extend this one when
    /// nothing was allocated after it), then allocate `layout` from it.
    #[inline]
    pub(super) fn refill(
        &self,
        arena: &BumpArena,
        layout: Layout,
        sizes: ChunkSizes,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let pref = self.next.get();
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
            // Acquire: the range may hold blocks another thread wrote and
            // freed (see `BumpArena::cas_cursor`).
            match arena
                .cursor
                .compare_exchange_weak(shared, chunk_end, Acquire, Relaxed)
            {
                Ok(_) => {
                    if !extend {
                        self.start.set(shared);
                    }
                    self.cur.set(end);
                    self.limit.set(chunk_end);
                    self.next.set((pref * 2).min(sizes.max));
                    return Ok(block(arena.parts.storage.base, start, layout.size()));
                }
                Err(now) => shared = now,
            }
        }
    }

    /// End the chunk at its cursor (its tail went back to the shared
    /// pointer).
    pub(super) fn truncate(&self) {
        self.limit.set(self.cur.get());
    }

    /// Whether `a..a+size` is the most recent block of this chunk.
    #[inline]
    pub(super) fn is_last(&self, a: usize, size: usize) -> bool {
        a >= self.start.get() && a + size == self.cur.get()
    }

    /// Move the chunk's bump pointer back to `to` (the start or the new end
    /// of its most recent block).
    #[inline]
    pub(super) fn set_cur(&self, to: usize) {
        self.cur.set(to);
    }

    /// Make the chunk reach `new_end` by taking more from the shared
    /// pointer, when nothing was allocated after the chunk.
    pub(super) fn extend_to(&self, arena: &BumpArena, new_end: usize) -> bool {
        let limit = self.limit.get();
        if new_end <= limit {
            return true;
        }
        if new_end > arena.end {
            return false;
        }
        let want = limit.saturating_add(self.next.get()).max(new_end);
        let chunk_end = if want <= arena.end { want } else { new_end };
        if arena
            .cursor
            .compare_exchange(limit, chunk_end, Acquire, Relaxed)
            .is_ok()
        {
            self.limit.set(chunk_end);
            true
        } else {
            false
        }
    }

    /// Grow the most recent block `a..a+old` to `new` bytes in place.
    pub(super) fn grow_last(&self, arena: &BumpArena, a: usize, old: usize, new: usize) -> bool {
        let new_end = a + new;
        if self.is_last(a, old) && self.extend_to(arena, new_end) {
            self.cur.set(new_end);
            return true;
        }
        false
    }

    /// Give the unused tail back to the shared pointer when nothing was
    /// allocated after the chunk.
    pub(super) fn give_back(&self, arena: &BumpArena) {
        let (cur, limit) = (self.cur.get(), self.limit.get());
        if cur < limit {
            arena.cas_cursor(limit, cur);
        }
    }
}
