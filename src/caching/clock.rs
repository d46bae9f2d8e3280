//! The calling thread's home shard (threads are spread over the shards
//! round-robin) and its release clock (a Lamport clock: "most recently
//! freed" and "oldest" are exact within a thread and consistent with
//! causality across threads).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Free-list shards per pool.
pub(crate) const SHARDS: usize = 4;

static NEXT_HOME: AtomicUsize = AtomicUsize::new(0);

struct ThreadState {
    home: Cell<usize>,
    clock: Cell<u64>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState { home: Cell::new(usize::MAX), clock: Cell::new(0) }
    };
}

/// The calling thread's home shard: assigned round-robin on first use.
#[inline]
pub(crate) fn home_shard() -> usize {
    THREAD
        .try_with(|t| {
            let v = t.home.get();
            if v != usize::MAX {
                v
            } else {
                let n = NEXT_HOME.fetch_add(1, Relaxed) % SHARDS;
                t.home.set(n);
                n
            }
        })
        .unwrap_or(0)
}

/// The next release sequence number of the calling thread.
#[inline]
pub(crate) fn tick() -> u64 {
    THREAD
        .try_with(|t| {
            let v = t.clock.get().wrapping_add(1);
            t.clock.set(v);
            v
        })
        .unwrap_or(u64::MAX)
}

/// Advance the calling thread's clock past `seq` (a block it took).
#[inline]
pub(crate) fn observe(seq: u64) {
    let _ = THREAD.try_with(|t| {
        if t.clock.get() < seq {
            t.clock.set(seq);
        }
    });
}
