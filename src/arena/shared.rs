//! `Allocator for &BumpArena`: a per-thread chunk (a thread-local bump
//! pointer) in front of the shared atomic bump pointer.
//!
//! Each thread keeps, per arena, a [`Chunk`] taken from the shared pointer
//! (16 KiB doubling to 256 KiB) and bumps inside it with plain loads and
//! stores; only a refill touches the atomic. A thread's chunks live in a
//! small thread-local table of [`SLOTS`] entries; an arena always uses the
//! entry `id % SLOTS`, tagged with the arena's *token*. The token is unique
//! per arena and is renewed by every `&mut` cursor move (reset, rewind), so a
//! chunk of a dropped arena or of an earlier epoch never matches again and
//! needs no cleanup. Arenas built with `thread_chunks(false)` skip the table
//! and move the shared pointer with one compare-and-swap per allocation.

use super::chunk::{block, zero_tail, Chunk, ChunkSizes};
use super::BumpArena;
use crate::zero_size::empty_block;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

/// Entries in each thread's chunk table (a power of two): up to this many
/// arenas (consecutive ids) keep their own chunk in one thread.
pub(super) const SLOTS: usize = 8;
static_assertions::const_assert!(SLOTS.is_power_of_two());

/// Slots held by live arenas with thread chunks (bit `i`: slot `i`).
static HELD: AtomicU32 = AtomicU32::new(0);
static_assertions::const_assert!(SLOTS <= 32);

/// The entry of a new arena (id `id`) in every thread's chunk table: the
/// first slot at or after `id % SLOTS` that no live arena holds, so up to
/// [`SLOTS`] live arenas never share a slot (ids alone would collide
/// whenever they are equal modulo `SLOTS`, e.g. after arenas were built and
/// dropped in between). When every slot is held: `id % SLOTS`, shared.
/// Returns the slot and whether the arena holds it (to release on drop).
/// Only a placement hint: tokens keep shared slots correct.
pub(super) fn claim_slot(id: u64) -> (usize, bool) {
    let first = (id % SLOTS as u64) as usize;
    let mut held = HELD.load(Relaxed);
    loop {
        let free = (0..SLOTS)
            .map(|k| (first + k) % SLOTS)
            .find(|&s| held & (1 << s) == 0);
        let Some(slot) = free else {
            return (first, false);
        };
        match HELD.compare_exchange_weak(held, held | 1 << slot, Relaxed, Relaxed) {
            Ok(_) => return (slot, true),
            Err(now) => held = now,
        }
    }
}

/// Give back a slot from [`claim_slot`].
pub(super) fn release_slot(slot: usize) {
    HELD.fetch_and(!(1 << slot), Relaxed);
}

/// Chunk sizes of the per-thread chunks, in bytes.
pub(super) const THREAD_SIZES: ChunkSizes = ChunkSizes {
    first: 16 << 10,
    max: 256 << 10,
};

/// Token of an arena built with `thread_chunks(false)`: no slot ever holds
/// it, so the fast path always misses and the slow path uses the shared
/// pointer.
pub(super) const NO_THREAD_CHUNKS: u64 = u64::MAX;

/// Allocations an arena makes through the shared pointer before it takes a
/// slot whose chunk another arena (alive or dropped on another thread) still
/// holds, abandoning that chunk's tail. So two arenas alternating on one
/// slot of one thread abandon at most one tail per `ADOPT_AFTER`
/// allocations, and an arena dropped elsewhere blocks a slot only that long.
pub(super) const ADOPT_AFTER: u32 = 256;

/// One entry of a thread's chunk table.
struct Slot {
    /// Token of the arena epoch the chunk belongs to (0: none).
    token: Cell<u64>,
    /// Id of that arena.
    arena_id: Cell<u64>,
    /// Allocations another arena made through the shared pointer while this
    /// slot was held.
    misses: Cell<u32>,
    chunk: Chunk,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            token: Cell::new(0),
            arena_id: Cell::new(0),
            misses: Cell::new(0),
            chunk: Chunk::empty(0, THREAD_SIZES.first),
        }
    }
}

thread_local! {
    // `const` initialised and without a destructor: access is a plain
    // thread-pointer-relative address, with no lazy-initialisation check.
    static TABLE: [Slot; SLOTS] = const { [const { Slot::empty() }; SLOTS] };
}

impl BumpArena {
    /// Run `f` on this thread's slot for this arena.
    #[inline(always)]
    fn with_slot<R>(&self, f: impl FnOnce(&Slot) -> R) -> R {
        TABLE.with(|t| f(&t[self.slot & (SLOTS - 1)]))
    }

    /// The bump pointer as this thread sees it: the shared pointer, or the
    /// thread's own chunk cursor when that chunk is the last thing taken
    /// from the shared pointer (so a single thread sees exact figures).
    pub(super) fn exact_cursor(&self) -> usize {
        let shared = self.cursor.load(Relaxed);
        if self.token == NO_THREAD_CHUNKS {
            return shared;
        }
        self.with_slot(|s| {
            if s.token.get() == self.token && s.chunk.limit() == shared {
                s.chunk.cur()
            } else {
                shared
            }
        })
    }

    /// Whether this thread holds (or held, in an earlier epoch) a chunk of
    /// this arena: it then sees its own exact view of the figures.
    pub(super) fn allocates_here(&self) -> bool {
        self.token != NO_THREAD_CHUNKS && self.with_slot(|s| s.arena_id.get() == self.id)
    }

    /// Record `cur` in the high-water mark before a chunk's pointer moves
    /// back (one plain load unless `cur` is a new peak).
    #[inline]
    fn note_peak(&self, cur: usize) {
        if cur > self.hwm.load(Relaxed) {
            self.hwm.fetch_max(cur, Relaxed);
        }
    }

    /// The thread's chunk is full, or the slot holds another arena (or
    /// another epoch): refill, take the slot over, or allocate from the
    /// shared pointer. Takes the same arguments as the fast path so the fast
    /// path reaches it with a plain jump.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let r = self.with_slot(|s| {
            if s.token.get() == self.token {
                s.chunk.refill(self, layout, THREAD_SIZES)
            } else {
                self.alloc_unowned(s, layout)
            }
        });
        // A zero-size request that does not fit (a full arena, an alignment
        // past the end) is served all the same.
        match r {
            Err(_) if layout.size() == 0 => Ok(empty_block(layout.align())),
            r => r,
        }
    }

    fn alloc_unowned(&self, s: &Slot, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self.token == NO_THREAD_CHUNKS {
            return self.alloc_shared(layout);
        }
        let held_by_other = s.arena_id.get() != self.id && s.chunk.remaining() > 0;
        if held_by_other && s.misses.get() < ADOPT_AFTER {
            s.misses.set(s.misses.get() + 1);
            return self.alloc_shared(layout);
        }
        // The old chunk's tail stays taken until its arena is reset.
        s.token.set(self.token);
        s.arena_id.set(self.id);
        s.misses.set(0);
        s.chunk.clear(self.end, THREAD_SIZES.first);
        s.chunk.refill(self, layout, THREAD_SIZES)
    }

    /// Empty this thread's slot if it holds this arena (on drop: a later
    /// arena on the same slot then takes it at once).
    pub(super) fn release_thread_slot(&self) {
        if self.token == NO_THREAD_CHUNKS {
            return;
        }
        // `try_with`: an arena dropped during thread teardown finds the
        // table gone or going; nothing to release then.
        let _ = TABLE.try_with(|t| {
            let s = &t[self.slot & (SLOTS - 1)];
            if s.arena_id.get() == self.id {
                s.token.set(0);
                s.arena_id.set(0);
                s.misses.set(0);
                s.chunk.clear(0, THREAD_SIZES.first);
            }
        });
    }

    /// Give this thread's unused chunk tail back to the shared pointer when
    /// nothing was taken after it, so that a [`LocalArena`](super::LocalArena)
    /// made on this thread starts where this thread's blocks end (as
    /// `remaining()` promised). The chunk then ends at its cursor; a later
    /// `&BumpArena` allocation extends it again while the pointer allows.
    pub(super) fn give_back_thread_tail(&self) {
        if self.token == NO_THREAD_CHUNKS {
            return;
        }
        self.with_slot(|s| {
            if s.token.get() != self.token {
                return;
            }
            let (cur, limit) = (s.chunk.cur(), s.chunk.limit());
            // Release: freed blocks in the tail may hold this thread's
            // writes. No high-water mark update: this thread counted the
            // tail as free already.
            if cur < limit
                && self
                    .cursor
                    .compare_exchange(limit, cur, AcqRel, Relaxed)
                    .is_ok()
            {
                s.chunk.truncate();
            }
        });
    }

    /// Allocate straight from the shared pointer (one compare-and-swap).
    pub(super) fn alloc_shared(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let mut cur = self.cursor.load(Relaxed);
        loop {
            let (start, end) = super::chunk::bump(cur, self.end, layout).ok_or(AllocError)?;
            // Disjointness follows from the single total order of
            // read-modify-writes on `cursor`. Acquire: the range may hold a
            // block another thread wrote and then freed (a `Release` move
            // back in `cas_cursor`); its writes must happen before ours.
            match self
                .cursor
                .compare_exchange_weak(cur, end, Acquire, Relaxed)
            {
                Ok(_) => return Ok(block(self.parts.storage.base, start, layout.size())),
                Err(now) => cur = now,
            }
        }
    }

    /// Move the shared pointer from `from` to `to` if it is still at `from`.
    ///
    /// `AcqRel`: moving back frees memory that this thread may have
    /// written (release, paired with the acquire of whoever allocates it
    /// next); moving forward takes memory another thread may have freed
    /// (acquire).
    pub(super) fn cas_cursor(&self, from: usize, to: usize) -> bool {
        let ok = self
            .cursor
            .compare_exchange(from, to, AcqRel, Relaxed)
            .is_ok();
        if ok && to < from {
            self.hwm.fetch_max(from, Relaxed);
            self.hwm_shared.fetch_max(from, Relaxed);
        }
        ok
    }

    /// The path of `grow` that cannot grow in place: a new block and a copy
    /// of `old_size` bytes. Out of line, so the in-place path stays small.
    ///
    /// # Safety
    /// `ptr` is valid for `old_size` reads.
    #[cold]
    #[inline(never)]
    unsafe fn grow_by_moving(
        &self,
        ptr: NonNull<u8>,
        old_size: usize,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.move_block(ptr, old_size, new, |l| Allocator::allocate(&self, l)) }
    }

    /// Allocate `new`, copy `copy` bytes from `ptr` (which stays allocated).
    ///
    /// # Safety
    /// `ptr` is valid for `copy` reads.
    pub(super) unsafe fn move_block(
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

// SAFETY: blocks are disjoint ranges of the runtime region: each comes from
// a chunk that the shared bump pointer (moved only by compare-and-swap) gave
// to one thread's slot alone, or straight from the shared pointer. A slot is
// only used while its token matches the arena's current token, which is
// unique to this arena and renewed by every `&mut` cursor move, so no chunk
// outlives the epoch that handed it out. Blocks stay valid until the arena
// is reset, rewound or dropped, each of which needs `&mut BumpArena` (or
// ownership), so no `&BumpArena` (and no block borrowed from it) is alive. A
// block is never handed out twice while allocated: a pointer only moves back
// over the most recent block of its chunk (or of the shared pointer), when
// that block is freed or shrunk. Memory handed from one thread to another
// through the shared pointer is ordered: a move back releases, every move
// forward acquires (see `cas_cursor`), so the old owner's writes happen
// before the new owner's.
unsafe impl Allocator for &BumpArena {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let arena: &BumpArena = self;
        let fast = arena.with_slot(|s| {
            if s.token.get() == arena.token {
                s.chunk.try_bump(arena.parts.storage.base, layout)
            } else {
                None
            }
        });
        match fast {
            Some(b) => Ok(b),
            None => arena.alloc_slow(layout),
        }
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let (a, size) = (ptr.as_ptr() as usize, layout.size());
        // Only the most recent block (of this thread's chunk, or of the
        // shared pointer) can be given back; others stay until reset, as in
        // any bump allocator.
        let done = self.with_slot(|s| {
            let mine = s.token.get() == self.token && s.chunk.is_last(a, size);
            if mine {
                self.note_peak(s.chunk.cur());
                s.chunk.set_cur(a);
            }
            mine
        });
        if !done {
            self.cas_cursor(a + size, a);
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let a = ptr.as_ptr() as usize;
        if a & (new.align() - 1) == 0 {
            let in_chunk = self.with_slot(|s| {
                s.token.get() == self.token && s.chunk.grow_last(self, a, old.size(), new.size())
            });
            let new_end = a + new.size();
            if in_chunk || (new_end <= self.end && self.cas_cursor(a + old.size(), new_end)) {
                return Ok(block(self.parts.storage.base, a, new.size()));
            }
        }
        // SAFETY: the caller guarantees `ptr` holds `old.size()` bytes.
        unsafe { self.grow_by_moving(ptr, old.size(), new) }
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
            let in_chunk = self.with_slot(|s| {
                let mine = s.token.get() == self.token && s.chunk.is_last(a, old.size());
                if mine {
                    self.note_peak(s.chunk.cur());
                    s.chunk.set_cur(a + new.size());
                }
                mine
            });
            if !in_chunk {
                self.cas_cursor(a + old.size(), a + new.size());
            }
            return Ok(block(self.parts.storage.base, a, new.size()));
        }
        // SAFETY: the caller guarantees `ptr` holds `old.size() >= new.size()` bytes.
        unsafe { self.move_block(ptr, new.size(), new, |l| self.allocate(l)) }
    }
}
