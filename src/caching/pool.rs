//! Pools, their sharded free lists, and the table of blocks held from the
//! inner allocator.
//!
//! Hot path (a cache hit and the matching release) takes one uncontended
//! lock (the calling thread's home shard of the pool, a [`PoolLock`]), and
//! does no hash lookup on the hit and none on a release by the thread that
//! took the block (the shard's ring of recently handed-out blocks; one
//! lookup otherwise); it touches no cache line that another thread writes
//! in steady state:
//! - the counters a hit or release changes (`hits`, `live`, `cached_bytes`)
//!   are plain integers under the shard mutex, summed (wrapping) by
//!   [`stats`](super::CachingAllocator::stats), which keeps them exact;
//! - the free-count limit is enforced with **slots**: a shard keeps the
//!   slots it reserved from the pool-wide `slots` counter (at most
//!   `max_free_allocation_count`) when one of its blocks is handed out, so a
//!   release into a shard with a spare slot needs no atomic; a release into a
//!   full shard reserves a new slot (compare-and-swap) or takes a spare slot
//!   from another shard, and only when every slot holds a block is the block
//!   returned to the inner allocator. The number of cached blocks therefore
//!   never exceeds the limit, and a block is refused only when the pool's
//!   free lists hold `max_free_allocation_count` blocks;
//! - release order comes from a per-thread clock (a Lamport clock: a thread
//!   that takes a block released by another thread advances its clock past
//!   the block's), so "most recently freed" and "oldest" are exact within a
//!   thread and consistent with causality across threads;
//! - every block held from the inner allocator has a descriptor (its inner
//!   layout, its pool, and whether it is live) that stays in the table from
//!   the inner allocation to the inner deallocation; the free list entry
//!   carries the descriptor, so a hit needs no table access.
//!
//! No lock is held while the inner allocator runs; no two shard locks are
//! held at once (so there is no lock order to get wrong), except by the
//! `fork()` prepare handler, which takes them all in a fixed order
//! (`crate::fork`).

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::clock::{observe, SHARDS};
use super::params::{PoolParams, RoundUp};
use super::table::{DescPtr, FreeBlock};
use crate::lock::PoolLock;

/// Slow-path counters of a shard (wrapping; summed on read).
#[derive(Default)]
pub(crate) struct ShardCounters {
    pub misses: AtomicU64,
    pub bypasses: AtomicU64,
    pub evictions: AtomicU64,
    pub trimmed: AtomicU64,
    pub inner_failures: AtomicU64,
}

#[inline]
pub(crate) fn add(a: &AtomicU64, v: u64) {
    a.fetch_add(v, Relaxed);
}
#[inline]
pub(crate) fn sub(a: &AtomicU64, v: u64) {
    a.fetch_sub(v, Relaxed);
}

/// Entries of a shard's ring of recently handed-out blocks.
const RECENT: usize = 4;

/// What a shard's mutex protects.
#[derive(Default)]
pub(crate) struct ShardState {
    /// Oldest at the front, most recently freed at the back.
    pub free: FreeList,
    /// Blocks this shard handed out recently (address, descriptor; address 0
    /// = empty): a cache of the block table, so a release on the thread
    /// that allocated needs no table lookup. An entry may outlive the
    /// block's stay in this shard (the block may be freed and handed out
    /// elsewhere); it stays correct because a descriptor belongs to one
    /// address while the block is held, and `scrub` removes the entries of a
    /// block before its descriptor is freed.
    recent: [(usize, Option<DescPtr>); RECENT],
    next_recent: usize,
    /// Free-count slots this shard holds (`>= free.len()`).
    pub slots: u64,
    /// Cache hits served by this shard (wrapping; summed over shards on read).
    pub hits: u64,
    /// Bytes of live pooled blocks counted in this shard (wrapping; summed
    /// over shards on read, so one shard's share may "go negative").
    pub live_bytes: u64,
    /// Bytes of the blocks in this shard's free list (wrapping, as `live_bytes`).
    pub cached_bytes: u64,
}

/// One free-list shard, padded to its own cache lines.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Shard {
    pub state: PoolLock<ShardState>,
    pub counters: ShardCounters,
}

pub(crate) struct Pool {
    pub params: PoolParams,
    pub round_up: RoundUp,
    pub shards: Box<[Shard]>,
    /// Free-count slots reserved by the shards (at most the pool's
    /// `max_free_allocation_count`).
    pub slots: AtomicU64,
    /// Live pooled bytes + cached bytes (the quantity the capacity limits).
    pub committed: AtomicU64,
    /// High-water mark of `committed`.
    pub peak: AtomicU64,
}

impl Pool {
    pub fn new(params: PoolParams, round_up: RoundUp) -> Pool {
        Pool {
            params,
            round_up,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            slots: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// The block size in bytes for a request of `size` bytes.
    #[inline]
    pub fn block_size(&self, size: usize) -> usize {
        self.round_up.apply(size)
    }

    /// Sum of one slow-path counter over all shards.
    pub fn sum(&self, f: impl Fn(&ShardCounters) -> &AtomicU64) -> u64 {
        self.shards.iter().fold(0u64, |acc, s| {
            acc.wrapping_add(f(&s.counters).load(Relaxed))
        })
    }

    /// Sum of one locked quantity over all shards.
    pub fn sum_locked(&self, f: impl Fn(&ShardState) -> u64) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |acc, s| acc.wrapping_add(f(&s.state.lock())))
    }

    /// Takes the most recently freed block of exactly `size` bytes whose
    /// address satisfies `align`, home shard first, and counts the hit.
    #[inline]
    pub fn take(&self, home: usize, size: usize, align: usize) -> Option<FreeBlock> {
        match self.take_from(home, size, align) {
            Some(block) => Some(block),
            None => self.take_other(home, size, align),
        }
    }

    #[cold]
    #[inline(never)]
    fn take_other(&self, home: usize, size: usize, align: usize) -> Option<FreeBlock> {
        let block = (1..SHARDS).find_map(|k| self.take_from((home + k) % SHARDS, size, align))?;
        observe(block.seq());
        Some(block)
    }

    /// The cache hit: takes the most recently freed block of `size` bytes
    /// whose address is a multiple of `align` (a power of two) from `shard`.
    /// The shard keeps the block's free-count slot for its release.
    #[inline]
    fn take_from(&self, shard: usize, size: usize, align: usize) -> Option<FreeBlock> {
        let mut state = self.shards[shard].state.lock();
        let fits = |block: &FreeBlock| block.size() == size && block.ptr.addr() & (align - 1) == 0;
        let block = state.free.remove_last(fits)?;
        state.remember(block.ptr.addr(), block.desc);
        state.count_hit(size as u64);
        drop(state);
        block.desc.get().live.store(true, Relaxed);
        Some(block)
    }

    /// Counts `b` new live bytes (a miss) in shard `home`.
    pub fn add_live(&self, home: usize, b: u64, addr: usize, desc: DescPtr) {
        let mut state = self.shards[home].state.lock();
        state.remember(addr, desc);
        state.live_bytes = state.live_bytes.wrapping_add(b);
    }

    /// Removes every ring entry of `addr` (before its descriptor is freed).
    pub fn scrub(&self, addr: usize) {
        for s in self.shards.iter() {
            let mut state = s.state.lock();
            for e in state.recent.iter_mut() {
                if e.0 == addr {
                    *e = (0, None);
                }
            }
        }
    }

    /// The release fast path: if shard `home` handed out the block at
    /// `addr` recently, marks it not live and caches it when the shard has a
    /// spare slot. Returns `None` when the block is not in the ring (use the
    /// table), `Some(Ok(()))` when done (cached, or a double free ignored),
    /// `Some(Err(block))` when the block needs [`put`](Self::put).
    #[inline]
    pub fn release_recent(&self, home: usize, ptr: NonNull<u8>) -> Option<Result<(), FreeBlock>> {
        let addr = ptr.as_ptr() as usize;
        let mut state = self.shards[home].state.lock();
        // The most recently handed-out block first.
        let last = state.next_recent.wrapping_sub(1) % RECENT;
        let i = if state.recent[last].0 == addr {
            last
        } else {
            state.recent.iter().position(|e| e.0 == addr)?
        };
        // The entry stays: it remains correct while the block is held.
        let desc = state.recent[i].1?;
        // SAFETY (lifetime): the entry was in the ring under its lock, and
        // `scrub` removes it under the same lock before the descriptor is freed.
        let d = desc.get();
        if !d.live.swap(false, Relaxed) {
            return Some(Ok(()));
        }
        let size = d.layout.size() as u64;
        let block = FreeBlock::released(ptr, desc);
        if (state.free.len() as u64) < state.slots {
            state.count_release(size);
            state.free.push_back(block);
            return Some(Ok(()));
        }
        Some(Err(block))
    }

    /// Releases a block into shard `home`'s free list if the pool's free
    /// count allows; returns the block back if it does not.
    #[inline]
    pub fn put(&self, home: usize, block: FreeBlock) -> Result<(), FreeBlock> {
        let b = block.size() as u64;
        let shard = &self.shards[home];
        {
            let mut state = shard.state.lock();
            state.live_bytes = state.live_bytes.wrapping_sub(b);
            if (state.free.len() as u64) < state.slots || self.reserve_slot() {
                if (state.free.len() as u64) >= state.slots {
                    state.slots += 1;
                }
                state.cached_bytes = state.cached_bytes.wrapping_add(b);
                state.free.push_back(block);
                return Ok(());
            }
        }
        // Every slot is reserved: take a spare one from another shard.
        for k in 1..SHARDS {
            let mut other = self.shards[(home + k) % SHARDS].state.lock();
            if other.slots > other.free.len() as u64 {
                other.slots -= 1;
                drop(other);
                let mut state = shard.state.lock();
                state.slots += 1;
                state.cached_bytes = state.cached_bytes.wrapping_add(b);
                state.free.push_back(block);
                return Ok(());
            }
        }
        Err(block)
    }

    /// Reserves one new slot from the pool's free count.
    #[inline]
    fn reserve_slot(&self) -> bool {
        let max = u64::from(self.params.max_free_allocation_count);
        self.slots
            .fetch_update(Relaxed, Relaxed, |c| (c < max).then_some(c + 1))
            .is_ok()
    }

    /// The shard holding this pool's oldest cached block, with its sequence number.
    pub fn oldest(&self) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for (i, s) in self.shards.iter().enumerate() {
            if let Some(f) = s.state.lock().free.front() {
                if best.is_none_or(|(seq, _)| f.seq() < seq) {
                    best = Some((f.seq(), i));
                }
            }
        }
        best
    }

    /// Pops the block with sequence number `seq` if it is still the front of
    /// `shard`, giving its slot back to the pool.
    pub fn pop_if_front(&self, shard: usize, seq: u64) -> Option<FreeBlock> {
        let mut state = self.shards[shard].state.lock();
        if state.free.front().map(|f| f.seq()) != Some(seq) {
            return None;
        }
        let block = state.free.pop_front()?;
        state.slots -= 1;
        state.cached_bytes = state.cached_bytes.wrapping_sub(block.size() as u64);
        sub(&self.slots, 1);
        Some(block)
    }

    /// Pops this pool's oldest cached block.
    pub fn pop_oldest(&self) -> Option<FreeBlock> {
        loop {
            let (seq, shard) = self.oldest()?;
            if let Some(f) = self.pop_if_front(shard, seq) {
                return Some(f);
            }
        }
    }
}

/// A free list: oldest at the front, most recently freed at the back. The
/// most recently freed block is kept out of the deque (`top`, newer than
/// every block in `rest`), so the steady state of one thread (release a
/// block, take it again) is a store and a load.
#[derive(Default)]
pub(crate) struct FreeList {
    rest: VecDeque<FreeBlock>,
    top: Option<FreeBlock>,
}

impl FreeList {
    #[inline]
    pub fn len(&self) -> usize {
        self.rest.len() + usize::from(self.top.is_some())
    }
    #[inline]
    pub fn push_back(&mut self, block: FreeBlock) {
        if let Some(t) = self.top.replace(block) {
            self.rest.push_back(t);
        }
    }
    pub fn front(&self) -> Option<&FreeBlock> {
        self.rest.front().or(self.top.as_ref())
    }
    pub fn pop_front(&mut self) -> Option<FreeBlock> {
        self.rest.pop_front().or_else(|| self.top.take())
    }
    /// Removes the most recent block matching `f`.
    #[inline]
    pub fn remove_last(&mut self, f: impl Fn(&FreeBlock) -> bool) -> Option<FreeBlock> {
        match &self.top {
            // The common case: the most recent block fits.
            Some(t) if f(t) => self.top.take(),
            _ if self.rest.is_empty() => None,
            _ => self.remove_last_slow(f),
        }
    }

    #[inline(never)]
    fn remove_last_slow(&mut self, f: impl Fn(&FreeBlock) -> bool) -> Option<FreeBlock> {
        let pos = self.rest.iter().rposition(f)?;
        self.rest.remove(pos)
    }
}

impl ShardState {
    /// A hit: `bytes` move from cached to live.
    #[inline]
    fn count_hit(&mut self, bytes: u64) {
        self.hits = self.hits.wrapping_add(1);
        self.live_bytes = self.live_bytes.wrapping_add(bytes);
        self.cached_bytes = self.cached_bytes.wrapping_sub(bytes);
    }

    /// A release into this shard's free list: `bytes` move from live to cached.
    #[inline]
    fn count_release(&mut self, bytes: u64) {
        self.live_bytes = self.live_bytes.wrapping_sub(bytes);
        self.cached_bytes = self.cached_bytes.wrapping_add(bytes);
    }

    #[inline]
    fn remember(&mut self, addr: usize, desc: DescPtr) {
        let last = self.next_recent.wrapping_sub(1) % RECENT;
        if self.recent[last].0 == addr {
            // Already there (entries stay valid while the block is held).
            return;
        }
        let i = self.next_recent % RECENT;
        self.recent[i] = (addr, Some(desc));
        self.next_recent = i + 1;
    }
}
