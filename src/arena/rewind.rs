//! Moving the bump pointer back: [`Checkpoint`], [`BumpArena::rewind_to`]
//! and [`BumpArena::reset`], and the release of freed runtime bytes that
//! `release_on_reset` asks for.

use super::{new_token, shared, ArenaError, BumpArena};
use crate::sys;

/// A position of the bump pointer, from [`BumpArena::checkpoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    arena_id: u64,
    used: usize,
}

impl Checkpoint {
    /// Runtime bytes in use when the checkpoint was taken.
    pub fn used(&self) -> usize {
        self.used
    }
}

impl BumpArena {
    /// The current position of the bump pointer, to return to with
    /// [`rewind_to`](Self::rewind_to).
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            arena_id: self.id,
            used: self.used(),
        }
    }

    /// Free everything allocated after `checkpoint` (the `&mut` borrow
    /// proves none of it is alive). With `release_on_reset` every runtime
    /// byte above the new bump pointer reads zero afterwards: the whole pages
    /// go back to the kernel (`MADV_DONTNEED`) and the rest (the partial page
    /// at the bump pointer, or everything up to the high-water mark when the
    /// kernel refuses the purge) is cleared with a memset. See [the zeroing
    /// guarantee](crate#memory-that-reads-zero).
    ///
    /// A checkpoint taken on another thread is valid too. It counts the
    /// chunk tails that thread saw held by others (see
    /// [`ArenaBuilder::thread_chunks`](super::ArenaBuilder::thread_chunks));
    /// blocks allocated later inside such a tail lie below the checkpoint
    /// and stay allocated until [`reset`](Self::reset) or a rewind to an
    /// earlier checkpoint. For the same reason a stale checkpoint that lies
    /// within the unused tail of a chunk is accepted: the bump pointer then
    /// moves up to it, leaving at most that tail unused until the next reset
    /// or rewind.
    ///
    /// # Errors
    /// [`ArenaError::BadCheckpoint`] for a checkpoint of another arena or one
    /// above the shared bump pointer (taken before a reset or an earlier
    /// rewind, and not within a chunk's unused tail as above; with
    /// `thread_chunks(false)` no tail is held, so every such checkpoint is
    /// refused); nothing changes then.
    pub fn rewind_to(&mut self, checkpoint: Checkpoint) -> Result<(), ArenaError> {
        // Every thread's view is at or below the shared pointer.
        let used = *self.cursor.get_mut() - self.runtime_start();
        if checkpoint.arena_id != self.id || checkpoint.used > used {
            return Err(ArenaError::BadCheckpoint {
                checkpoint_used: checkpoint.used,
                used,
                same_arena: checkpoint.arena_id == self.id,
            });
        }
        self.set_cursor(self.runtime_start() + checkpoint.used);
        Ok(())
    }

    /// Free every runtime allocation (the `&mut` borrow proves none is
    /// alive). The weights region is untouched, including the bytes of a
    /// page it shares with the runtime region. With `release_on_reset` the
    /// whole runtime region reads zero afterwards, as for
    /// [`rewind_to`](Self::rewind_to).
    pub fn reset(&mut self) {
        self.set_cursor(self.runtime_start());
    }

    fn set_cursor(&mut self, new: usize) {
        let old = self.exact_cursor();
        let hwm = self.hwm.get_mut();
        *hwm = (*hwm).max(old);
        let shared = *self.cursor.get_mut();
        let hwm_shared = self.hwm_shared.get_mut();
        *hwm_shared = (*hwm_shared).max(shared);
        *self.cursor.get_mut() = new;
        // Every thread's chunk belongs to the old epoch now.
        if self.token != shared::NO_THREAD_CHUNKS {
            self.token = new_token();
        }
        if self.parts.release_on_reset {
            self.release_above(new);
        }
    }

    /// Make the runtime bytes from `from` up to the high-water mark read
    /// zero (see "Memory that reads zero" in `docs/reliability.md`):
    /// `MADV_DONTNEED` over the whole pages (of the runtime region's page
    /// size: 4 KiB, or 2 MiB / 1 GiB for hugetlb) and a memset of the rest,
    /// which is the partial page at `from` (it may hold weights, which must
    /// stay) and, when the kernel refuses the purge, the whole range.
    /// Nothing above the high-water mark was ever written, so nothing there
    /// needs clearing.
    fn release_above(&mut self, from: usize) {
        let top = (*self.hwm.get_mut())
            .max(*self.hwm_shared.get_mut())
            .min(self.end);
        if top <= from {
            return;
        }
        let pg = self.parts.storage.page_size;
        let map_end = self.parts.storage.map_ptr.as_ptr() as usize + self.parts.storage.map_len;
        // Bytes `from..memset_to` are cleared by hand.
        let mut memset_to = top;
        if let (Some(start), Some(stop)) = (sys::round_up(from, pg), sys::round_up(top, pg)) {
            let stop = stop.min(map_end);
            if start < top && stop > start {
                let p = self.addr_ptr(start);
                if sys::madvise(p, stop - start, sys::Advice::DontNeed).is_ok() {
                    memset_to = start;
                }
            }
        }
        // SAFETY: `from..memset_to` lies in the runtime region (at or above
        // `activations_base`, below `end`), which is read-write anonymous
        // memory in both modes; `&mut self` proves no allocation into it is
        // alive.
        unsafe { self.addr_ptr(from).write_bytes(0, memset_to - from) };
        // Everything above `from` reads zero now: the next release needs to
        // clear only what is written from here on.
        let (hwm, hwm_shared) = (self.hwm.get_mut(), self.hwm_shared.get_mut());
        self.peak = self.peak.max(*hwm);
        self.peak_shared = self.peak_shared.max(*hwm_shared);
        *hwm = from;
        *hwm_shared = from;
    }

    /// The pointer to address `addr` inside the mapping, with the
    /// provenance of the base pointer.
    fn addr_ptr(&self, addr: usize) -> *mut u8 {
        self.parts.storage.base.as_ptr().with_addr(addr)
    }
}
