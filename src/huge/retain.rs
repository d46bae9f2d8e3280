//! The process-wide retention cache of [`CkHuge`](super::CkHuge): freed
//! huge-page blocks kept mapped and handed out again, bounded by a byte cap
//! and given back to the kernel after a decay delay.
//!
//! # Layout
//!
//! [`SHARDS`] shards of [`SLOTS`] slots, each slot one block: an atomic word
//! (`EMPTY`, `BUSY`, or the block's address, which is 2 MiB aligned and so
//! never 0 or 1), the block's exact length and a decay stamp. A thread
//! claims a slot with one compare-and-swap of its word and releases it with a
//! store: there is no lock to wait for, only slots to skip. Each thread
//! starts its search at its home shard (assigned round-robin the first time
//! it frees or allocates a block) and then looks at the others, so two
//! threads rarely touch the same cache lines and a block freed by one thread
//! serves another. A block an exiting thread freed stays in the shared
//! slots; the thread-local state (a thread number and a call counter) is two
//! `Cell`s without destructors.
//!
//! # Lengths, carving and coalescing
//!
//! A request takes a block of exactly its 2 MiB-rounded length when one is
//! retained, the most recently freed of such blocks (last in, first out, as
//! glibc's tcache and jemalloc's tcache bins hand out the newest free chunk:
//! its pages are the likeliest to be in the CPU caches and the TLB). Else it
//! carves the shortest longer block whose address meets its alignment: the
//! request gets the block's first bytes, and the rest stays in the same slot
//! as a shorter block, all without a system call (a block is an address
//! range: carving it needs no `munmap`, and the kernel splits the VMA only
//! when a piece is unmapped or advised on its own). Every block handed out
//! therefore has exactly the length `dealloc` and `realloc` rebuild from the
//! layout. When a block comes back, `put` merges it with a retained block
//! that ends where it starts or starts where it ends (unless it is another
//! thread's whole block: see [Threads](owner#threads)), so the pieces of a
//! carved block become one block again and serve long requests. A request of
//! the preload library's C API that needs no zeroing (not `calloc`) and finds
//! no block of its length or longer takes the longest shorter one
//! ([`take_longest`]) and grows it with `mremap`: only the added bytes are
//! fresh memory.
//!
//! # Threads
//!
//! A request looks at its own thread's blocks first: see [`owner`].
//!
//! # Decay
//!
//! Every [`TICK_EVERY`] allocator calls of a thread (mapped-path calls, and
//! small-path calls while some block is retained) run one decay step: it
//! reads the monotonic clock, stamps blocks that have no stamp yet with it,
//! and gives back to the kernel at most [`DECAY_PER_STEP`] blocks whose stamp
//! is at least the decay delay old. A block is therefore kept at least the
//! delay and at most the delay plus the time to the next step after it was
//! freed, in the thread that makes the step. With no allocator calls there is
//! no step: a process that frees blocks and then sleeps keeps them (up to the
//! cap) until its next allocator calls or [`release_retained`].

use super::stats::COUNTERS;
use super::unmap;
use crate::env;
use crate::fork::{Hooks, Stage};
use crate::sys;
use owner::{me, Owner};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// Shards of the cache.
pub(crate) const SHARDS: usize = 4;
/// Slots (blocks) per shard.
pub(crate) const SLOTS: usize = 16;
/// Allocator calls of one thread between two decay steps.
pub(crate) const TICK_EVERY: u32 = 256;
/// Blocks one decay step gives back at most.
pub(crate) const DECAY_PER_STEP: usize = 4;

const EMPTY: usize = 0;
const BUSY: usize = 1;

struct Slot {
    word: AtomicUsize,
    len: AtomicUsize,
    /// Monotonic ns of the first decay step that saw the block; 0: none yet.
    stamp: AtomicU64,
    /// The block's place in the order of [`put`]s ([`PUTS`]): [`take`]
    /// prefers the most recent of equally long blocks.
    seq: AtomicU64,
    /// Who the block belongs to: an [`Owner`] as a word.
    owner: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            word: AtomicUsize::new(EMPTY),
            len: AtomicUsize::new(0),
            stamp: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            owner: AtomicU64::new(0),
        }
    }
}

#[repr(align(128))]
struct Shard {
    slots: [Slot; SLOTS],
}

static CACHE: [Shard; SHARDS] = [const {
    Shard {
        slots: [const { Slot::new() }; SLOTS],
    }
}; SHARDS];

/// Bytes in retained blocks (counted before a block becomes visible in a
/// slot and after it leaves one): `COUNTERS.retained`, which `huge_stats`
/// reads.
static RETAINED: &AtomicUsize = &COUNTERS.retained;
/// [`put`]s so far: the source of [`Slot::seq`].
static PUTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

/// The shard a thread numbered `me` starts its searches at: threads are
/// spread round-robin.
#[inline]
fn home(me: u32) -> usize {
    me as usize % SHARDS
}

/// Counts one allocator call; every [`TICK_EVERY`] calls runs a decay step.
#[inline]
pub(crate) fn tick() {
    let due = CALLS
        .try_with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n % TICK_EVERY == 0
        })
        .unwrap_or(false);
    if due {
        decay_step();
    }
}

/// Counts a small-path call when some block is retained (one load otherwise).
#[inline]
pub(crate) fn tick_small() {
    if RETAINED.load(Relaxed) != 0 {
        tick();
    }
}

/// A retained block of exactly `len` bytes aligned to `align`, removed from
/// the cache (the most recently freed of several), or carved from the
/// shortest longer one, looking at the calling thread's blocks first (see
/// [Threads](owner#threads)); `None` when there is none. Never makes a system
/// call.
#[inline]
pub(crate) fn take(len: usize, align: usize) -> Option<NonNull<u8>> {
    if len > RETAINED.load(Relaxed) {
        // Fewer bytes are retained than the request needs.
        COUNTERS.retain_misses.fetch_add(1, Relaxed);
        return None;
    }
    // By group first; within it, exact length is the shortest that fits,
    // and among equal lengths the newest wins.
    let me = me();
    let Some((slot, w, l)) = claim_best(
        align,
        me,
        |l| l >= len,
        |a, b| {
            (a.group, a.len, std::cmp::Reverse(a.seq)) < (b.group, b.len, std::cmp::Reverse(b.seq))
        },
    ) else {
        COUNTERS.retain_misses.fetch_add(1, Relaxed);
        return None;
    };
    // `w + l` is the block's end, an address: no overflow; `l >= len`.
    let back = w + l - len;
    let owner = Owner::from_word(slot.owner.load(Relaxed));
    let p = if l == len {
        slot.word.store(EMPTY, Release);
        w
    } else if owner.group(me) == 2 && back & (align - 1) == 0 {
        // Another thread carves the block's front: take its last bytes.
        // The rest, `w .. back`, keeps its owner (one more piece out at
        // its end), decay stamp and put sequence number.
        let backs = owner.backs.saturating_add(1).min(Owner::MAX_BACKS);
        slot.owner.store(Owner { backs, ..owner }.word(), Relaxed);
        slot.len.store(l - len, Relaxed);
        slot.word.store(w, Release);
        COUNTERS.retain_carves.fetch_add(1, Relaxed);
        back
    } else {
        // The rest, `w + len .. w + l`, is 2 MiB aligned (both lengths
        // are multiples of 2 MiB) and keeps the block's decay stamp, put
        // sequence number and pieces out at its end; this thread carves it
        // now.
        let carver = Owner {
            thread: me,
            carved: true,
            ..owner
        };
        slot.owner.store(carver.word(), Relaxed);
        slot.len.store(l - len, Relaxed);
        slot.word.store(w + len, Release);
        COUNTERS.retain_carves.fetch_add(1, Relaxed);
        w
    };
    RETAINED.fetch_sub(len, Relaxed);
    COUNTERS.retain_hits.fetch_add(1, Relaxed);
    COUNTERS.note_live();
    NonNull::new(p as *mut u8)
}

/// A block [`take_longest`] removed from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    /// Its decay stamp, for [`MergedAge::Kept`] if it goes back.
    pub(crate) stamp: u64,
}

/// After a miss of [`take`] for `len` bytes: the longest retained block
/// shorter than `len` whose address meets `align` (the fewest fresh bytes;
/// of equally long ones, the first in the order of [Threads](owner#threads)),
/// removed from the cache
/// (no longer counted as retained); `None` when there is none. The caller
/// grows it to `len` with `mremap`, or puts it back with
/// [`MergedAge::Kept`] so that it goes on ageing. Never makes a system
/// call.
#[cold]
pub(crate) fn take_longest(len: usize, align: usize) -> Option<Taken> {
    let (slot, w, l) = claim_best(
        align,
        me(),
        |l| l < len,
        |a, b| (std::cmp::Reverse(a.len), a.group) < (std::cmp::Reverse(b.len), b.group),
    )?;
    let stamp = slot.stamp.load(Relaxed);
    slot.word.store(EMPTY, Release);
    RETAINED.fetch_sub(l, Relaxed);
    NonNull::new(w as *mut u8).map(|ptr| Taken { ptr, len: l, stamp })
}

/// A retained block as [`claim_best`] compares it.
#[derive(Clone, Copy)]
struct Candidate {
    /// Its [`Owner::group`] for the searching thread.
    group: u8,
    len: usize,
    /// When it was put: larger is more recent.
    seq: u64,
}

/// Claims (marks `BUSY`) the slot of the retained block whose address meets
/// `align`, whose length `fits`, and that `better` prefers (`better(a,
/// best)`: block `a` over block `best`) to every other such block; returns
/// the slot, the block's address and its length, which still `fits`. `None`
/// when no block fits. Thread `me` searches, from its home shard on; a slot
/// another thread claims between the scan and the compare-and-swap starts a
/// new scan.
fn claim_best(
    align: usize,
    me: u32,
    fits: impl Fn(usize) -> bool,
    better: impl Fn(Candidate, Candidate) -> bool,
) -> Option<(&'static Slot, usize, usize)> {
    let mask = align - 1;
    loop {
        let mut best: Option<(&'static Slot, usize, Candidate)> = None;
        for i in 0..SHARDS {
            for slot in &CACHE[(home(me) + i) % SHARDS].slots {
                let w = slot.word.load(Relaxed);
                if w <= BUSY || w & mask != 0 {
                    continue;
                }
                let c = Candidate {
                    group: Owner::from_word(slot.owner.load(Relaxed)).group(me),
                    len: slot.len.load(Relaxed),
                    seq: slot.seq.load(Relaxed),
                };
                if fits(c.len) && best.is_none_or(|(_, _, b)| better(c, b)) {
                    best = Some((slot, w, c));
                }
            }
        }
        let (slot, w, _) = best?;
        if slot
            .word
            .compare_exchange(w, BUSY, Acquire, Relaxed)
            .is_err()
        {
            continue;
        }
        // The slot is ours: its block may have changed since the scan.
        let l = slot.len.load(Relaxed);
        if fits(l) {
            return Some((slot, w, l));
        }
        slot.word.store(w, Release);
    }
}

/// The decay stamp of a block merged with retained neighbours in [`put`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MergedAge {
    /// The merged block starts a new delay: its newest part was just freed.
    Reset,
    /// The merged block keeps the stamp of its oldest part, so a block that
    /// requests keep being carved from and merged back into still ages.
    Oldest,
    /// A block taken out and put back unused (a growth that failed) keeps
    /// its own stamp, or a neighbour's if that is older: it goes on ageing.
    Kept(u64),
}

/// Keep the block `ptr` of `len` bytes (2 MiB aligned, a multiple of 2 MiB)
/// for reuse, merged with the retained blocks right before and after it
/// (stamped as `age` says); `false` when `cap` (the most bytes retained at
/// once) or a full cache refuses it (the caller then unmaps it). Never makes
/// a system call.
#[inline]
pub(crate) fn put(ptr: NonNull<u8>, len: usize, cap: usize, age: MergedAge) -> bool {
    if len > cap {
        return false;
    }
    let before = RETAINED.fetch_add(len, Relaxed);
    if before + len > cap {
        RETAINED.fetch_sub(len, Relaxed);
        return false;
    }
    let me = me();
    for i in 0..SHARDS {
        for slot in &CACHE[(home(me) + i) % SHARDS].slots {
            if slot.word.load(Relaxed) == EMPTY
                && slot
                    .word
                    .compare_exchange(EMPTY, BUSY, Acquire, Relaxed)
                    .is_ok()
            {
                // With nothing else retained there is no neighbour to merge
                // (the common case of one block freed and taken in turn):
                // skip the scan of every slot.
                let (start, len, oldest, owner) = if before == 0 {
                    (ptr.as_ptr() as usize, len, 0, Owner::freed_by(me))
                } else {
                    coalesce(ptr.as_ptr() as usize, len, me)
                };
                slot.len.store(len, Relaxed);
                let stamp = match age {
                    MergedAge::Reset => 0,
                    MergedAge::Oldest => oldest,
                    // The older of two stamps; 0 is no stamp.
                    MergedAge::Kept(0) => oldest,
                    MergedAge::Kept(own) if oldest == 0 => own,
                    MergedAge::Kept(own) => own.min(oldest),
                };
                slot.stamp.store(stamp, Relaxed);
                slot.seq.store(PUTS.fetch_add(1, Relaxed), Relaxed);
                slot.owner.store(owner.word(), Relaxed);
                slot.word.store(start, Release);
                return true;
            }
        }
    }
    RETAINED.fetch_sub(len, Relaxed);
    false
}

/// The block `start..start+len` that thread `me` frees, grown by the
/// retained blocks that end where it starts and start where it ends (each
/// taken out of its slot, its bytes staying counted in [`RETAINED`]), the
/// oldest decay stamp among those (0 when none has one), and the merged
/// block's owner.
///
/// Another thread's whole block is no piece of this one, only its neighbour
/// in the address space (the kernel places mappings side by side): it stays
/// apart, so each thread keeps reusing its own block. The exception is a
/// block that ends where this one starts while pieces carved from its end
/// are out: this one is taken for such a piece coming back. A merge with a
/// block another thread carves (or with such an end) leaves the merged
/// block to that thread, which goes on carving its front while `me` carves
/// the back. One pass over the slots finds at most one of each: retained
/// blocks never overlap.
fn coalesce(mut start: usize, mut len: usize, me: u32) -> (usize, usize, u64, Owner) {
    let mut oldest = 0;
    let mut merged = Owner::freed_by(me);
    // How the block `w..w+l` owned by `o` merges: `None` when it does not,
    // `Some(true)` when it ends where `start..start+len` starts and takes
    // it for a piece carved from its end.
    let merge = |w: usize, l: usize, o: Owner, start: usize, len: usize| {
        let theirs_whole = o.group(me) == 1;
        if w == start + len && !theirs_whole {
            Some(false)
        } else if w.checked_add(l) == Some(start) && (!theirs_whole || o.backs > 0) {
            Some(o.backs > 0)
        } else {
            None
        }
    };
    let mut backs = 0u8;
    for shard in &CACHE {
        for slot in &shard.slots {
            let w = slot.word.load(Relaxed);
            if w <= BUSY {
                continue;
            }
            let o = Owner::from_word(slot.owner.load(Relaxed));
            if merge(w, slot.len.load(Relaxed), o, start, len).is_none()
                || slot
                    .word
                    .compare_exchange(w, BUSY, Acquire, Relaxed)
                    .is_err()
            {
                continue;
            }
            // The slot is ours; recheck its block against ours.
            let l = slot.len.load(Relaxed);
            let o = Owner::from_word(slot.owner.load(Relaxed));
            let Some(back_piece) = merge(w, l, o, start, len) else {
                slot.word.store(w, Release);
                continue;
            };
            start = start.min(w);
            len += l;
            let stamp = slot.stamp.load(Relaxed);
            if stamp != 0 && (oldest == 0 || stamp < oldest) {
                oldest = stamp;
            }
            let left = if back_piece { o.backs - 1 } else { o.backs };
            backs = backs.saturating_add(left).min(Owner::MAX_BACKS);
            if o.group(me) != 0 && (o.carved || back_piece) {
                merged = o;
            }
            slot.word.store(EMPTY, Release);
        }
    }
    (start, len, oldest, Owner { backs, ..merged })
}

/// Take the block in `slot` if it holds one that `keep` rejects; returns its
/// address and length. The slot is left empty; the block's bytes stay counted
/// in [`RETAINED`] until [`give_back`] unmaps it.
fn evict(slot: &Slot, keep: impl Fn(&Slot) -> bool) -> Option<(NonNull<u8>, usize)> {
    let w = slot.word.load(Relaxed);
    if w <= BUSY || keep(slot) {
        return None;
    }
    if slot
        .word
        .compare_exchange(w, BUSY, Acquire, Relaxed)
        .is_err()
    {
        return None;
    }
    if keep(slot) {
        slot.word.store(w, Release);
        return None;
    }
    let len = slot.len.load(Relaxed);
    slot.word.store(EMPTY, Release);
    // `w > BUSY`: never null.
    NonNull::new(w as *mut u8).map(|p| (p, len))
}

/// Unmap an evicted block, then stop counting it as retained. In this order
/// the mapped bytes drop first, so a thread that reads both counters
/// meanwhile (the high-water mark of live bytes is mapped minus retained)
/// never counts the block as live.
fn give_back(p: NonNull<u8>, len: usize) {
    unmap(p, len);
    RETAINED.fetch_sub(len, Relaxed);
}

/// Give retained blocks back to the kernel until a block of `len` bytes fits
/// under `cap` with them; `false` when it cannot (`len` alone is over the
/// cap). The block about to be freed is the one most likely to be asked for
/// again, so the blocks already retained make room for it.
#[cold]
pub(crate) fn make_room(len: usize, cap: usize) -> bool {
    if len > cap {
        return false;
    }
    for shard in &CACHE {
        for slot in &shard.slots {
            if RETAINED.load(Relaxed) + len <= cap {
                return true;
            }
            if let Some((p, l)) = evict(slot, |_| false) {
                give_back(p, l);
            }
        }
    }
    RETAINED.load(Relaxed) + len <= cap
}

/// One decay step (see the [module docs](self)).
#[cold]
fn decay_step() {
    let now = sys::monotonic_ns().max(1);
    let delay = env::retain_decay_ms().saturating_mul(1_000_000);
    let mut given = 0;
    for shard in &CACHE {
        for slot in &shard.slots {
            if given == DECAY_PER_STEP {
                return;
            }
            let young = |s: &Slot| {
                let stamp = s.stamp.load(Relaxed);
                if stamp == 0 {
                    // Racing stampers store nearly the same time.
                    s.stamp.store(now, Relaxed);
                    delay > 0
                } else {
                    now.saturating_sub(stamp) < delay
                }
            };
            if let Some((p, len)) = evict(slot, young) {
                give_back(p, len);
                COUNTERS.decayed_bytes.fetch_add(len as u64, Relaxed);
                given += 1;
            }
        }
    }
}

/// Gives every retained huge-page block back to the kernel (`munmap`) and
/// returns how many bytes that released. Blocks other threads free
/// meanwhile may be retained again. Never allocates; thread-safe.
pub fn release_retained() -> usize {
    let mut released = 0;
    for shard in &CACHE {
        for slot in &shard.slots {
            if let Some((p, len)) = evict(slot, |_| false) {
                give_back(p, len);
                released += len;
            }
        }
    }
    released
}

/// `pthread_atfork` child handler: slots a thread of the parent held mid
/// operation are left `BUSY` in the child, where that thread does not exist;
/// they become empty again (a block being freed or taken at that moment
/// stays mapped in the child and is not reused). Such a thread may also have
/// counted its block in [`RETAINED`] without a slot holding it, so the child
/// recounts the bytes of the blocks its slots hold (the child has one
/// thread: nothing changes the slots meanwhile).
unsafe fn fork_child() {
    let mut held = 0usize;
    for shard in &CACHE {
        for slot in &shard.slots {
            match slot.word.load(Relaxed) {
                BUSY => slot.word.store(EMPTY, Relaxed),
                EMPTY => {}
                _ => held = held.saturating_add(slot.len.load(Relaxed)),
            }
        }
    }
    RETAINED.store(held, Relaxed);
}

fn fork_nothing() {}

/// The fork hooks of stage `Retention` (`crate::fork`), added when the
/// library is loaded: nothing to take before `fork()`, the slots to repair
/// in the child.
static FORK_HOOKS: Hooks = Hooks {
    prepare: fork_nothing,
    parent: fork_nothing,
    child: fork_child,
};

crate::fork::at_load!(ADD_RETENTION_FORK_HOOKS, {
    crate::fork::add(Stage::Retention, &FORK_HOOKS);
});

/// Test hook: marks every empty slot busy (`true`) as a thread caught mid
/// operation would, or frees the slots so marked (`false`).
#[doc(hidden)]
pub fn hold_retention_slots(hold: bool) {
    for shard in &CACHE {
        for slot in &shard.slots {
            let (from, to) = if hold { (EMPTY, BUSY) } else { (BUSY, EMPTY) };
            let _ = slot.word.compare_exchange(from, to, Relaxed, Relaxed);
        }
    }
}

mod owner;
#[cfg(test)]
mod tests;
