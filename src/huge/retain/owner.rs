//! Who a retained block belongs to: each thread's number, and the owner
//! word every slot of the retention cache holds.
//!
//! # Threads
//!
//! Each slot of the [retention cache](super) records who its block belongs
//! to ([`Owner`]): the thread that freed it or carves its front, and how many pieces other threads carved
//! from its end are out. A request looks first at its own thread's blocks,
//! then at other threads' whole blocks, and only then at a block another
//! thread is carving from; the cache's length rules choose within the first
//! of these groups that has a block that fits. A block freed by a thread that has
//! since exited counts as another thread's whole block. A request that does
//! carve a block another thread is carving takes the block's last bytes
//! instead of its first.
//!
//! A freed block merges with its own thread's neighbours, with a block
//! another thread is carving (which stays that thread's), and with a block
//! it was carved from the end of (even once that block is whole again),
//! never otherwise with another thread's whole block: they are neighbours
//! only because the kernel placed the mappings side by side. So each thread
//! carves its own end of a block, its pieces merge back there, and a thread
//! that frees and asks for one length again gets its own block back, as
//! each thread of jemalloc takes memory from its own arena (whose extents
//! merge only with each other). Without this, two threads carving one block
//! each hold a piece of the other's request: neither piece merges back into
//! the whole block while the other is out, and the next request for the
//! whole length misses and maps fresh memory. The price: whole blocks that
//! threads which have exited freed side by side stay apart until a thread
//! carves them (its pieces then merge as its own).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// The last thread number handed out by [`me`].
static THREADS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static ME: Cell<u32> = const { Cell::new(0) };
}

/// This thread's number, given the first time it frees or allocates a
/// block (1, 2, ...; after 2^32 threads numbers repeat, which only blurs
/// the preference for a thread's own blocks); 0 while its thread-locals
/// are gone, a number no slot's owner has.
#[inline]
pub(super) fn me() -> u32 {
    ME.try_with(|c| {
        let v = c.get();
        if v != 0 {
            return v;
        }
        let n = THREADS.fetch_add(1, Relaxed).wrapping_add(1).max(1);
        c.set(n);
        n
    })
    .unwrap_or(0)
}

/// Who a retained block belongs to ([`Slot::owner`](super::Slot::owner); see
/// [Threads](self#threads)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    /// The thread ([`me`]) that freed the block or carves its front.
    pub(super) thread: u32,
    /// Whether that thread carves it: a piece of its front is out.
    pub(super) carved: bool,
    /// Pieces other threads carved from its end that are still out (at
    /// most [`Owner::MAX_BACKS`]).
    pub(super) backs: u8,
}

impl Owner {
    pub(super) const MAX_BACKS: u8 = 127;

    /// A block thread `me` freed whole.
    pub(super) const fn freed_by(me: u32) -> Owner {
        Owner {
            thread: me,
            carved: false,
            backs: 0,
        }
    }

    pub(super) const fn word(self) -> u64 {
        ((self.thread as u64) << 8) | ((self.backs as u64) << 1) | self.carved as u64
    }

    pub(super) const fn from_word(w: u64) -> Owner {
        Owner {
            thread: (w >> 8) as u32,
            carved: w & 1 == 1,
            backs: ((w >> 1) & 0x7f) as u8,
        }
    }

    /// Which group of the search order the block is for thread `me`: 0 its
    /// own, 1 another thread's whole block, 2 a block another thread
    /// carves.
    pub(super) fn group(self, me: u32) -> u8 {
        if me != 0 && self.thread == me {
            0
        } else if !self.carved {
            1
        } else {
            2
        }
    }
}
