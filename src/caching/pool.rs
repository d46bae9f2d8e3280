//! Pools, their sharded free lists, and the table of live blocks.
//!
//! Locking: every free list shard and every live-table shard has its own
//! mutex, held only for a few loads and stores; no lock is held while the
//! inner allocator runs. Limits (capacity, free count) are enforced with
//! compare-and-swap on per-pool atomics; the other counters live in the
//! shard of the thread that changes them and are summed (wrapping) on
//! [`stats`](super::CachingAllocator::stats), which keeps them exact without
//! a shared cache line on the hot path.

use std::alloc::Layout;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{PoolParams, RoundUp};

/// Free-list shards per pool (threads are spread over them round-robin).
pub(crate) const SHARDS: usize = 4;
/// Shards of the live-block table (chosen by address).
const TABLE_SHARDS: usize = 64;
/// `BlockInfo::pool` of a block served unpooled.
pub(crate) const UNPOOLED: u32 = u32::MAX;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while one of these locks is held (only plain
    // loads, stores and VecDeque/HashMap operations run under them), so a
    // poisoned lock still protects consistent data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static NEXT_HOME: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's home shard: assigned round-robin on first use.
#[inline]
pub(crate) fn home_shard() -> usize {
    HOME.try_with(|h| {
        let v = h.get();
        if v != usize::MAX {
            v
        } else {
            let n = NEXT_HOME.fetch_add(1, Relaxed) % SHARDS;
            h.set(n);
            n
        }
    })
    .unwrap_or(0)
}

/// A block's start pointer, as returned by the inner allocator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockPtr(pub NonNull<u8>);

// SAFETY: a `BlockPtr` is an owned, unaliased memory block (it sits in exactly
// one free list); moving the address between threads is what the inner
// allocator's own `Send`/`Sync` already permit for its allocations.
unsafe impl Send for BlockPtr {}
// SAFETY: shared references to a `BlockPtr` only read the address.
unsafe impl Sync for BlockPtr {}

impl BlockPtr {
    #[inline]
    pub fn addr(self) -> usize {
        self.0.as_ptr() as usize
    }
}

/// A cached block: its pointer, the layout it was allocated with from the
/// inner allocator, and its release sequence number (for oldest-first).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FreeBlock {
    pub ptr: BlockPtr,
    pub layout: Layout,
    pub seq: u64,
}

/// Counters a thread updates in its home shard (wrapping; summed on read).
#[derive(Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bypasses: AtomicU64,
    pub evictions: AtomicU64,
    pub trimmed: AtomicU64,
    pub live: AtomicU64,
    pub cached_bytes: AtomicU64,
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

/// One free-list shard, padded to its own cache lines.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Shard {
    /// Oldest at the front, most recently freed at the back.
    pub free: Mutex<VecDeque<FreeBlock>>,
    pub counters: Counters,
}

pub(crate) struct Pool {
    pub params: PoolParams,
    pub round_up: RoundUp,
    pub shards: Box<[Shard]>,
    /// Live pooled bytes + cached bytes (the quantity the capacity limits).
    pub committed: AtomicU64,
    /// Blocks in all free lists (the quantity the free count limits).
    pub cached_blocks: AtomicU64,
    /// High-water mark of `committed`.
    pub peak: AtomicU64,
}

impl Pool {
    pub fn new(params: PoolParams, round_up: RoundUp) -> Pool {
        Pool {
            params,
            round_up,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            committed: AtomicU64::new(0),
            cached_blocks: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// The block size in bytes for a request of `size` bytes.
    #[inline]
    pub fn block_size(&self, size: usize) -> usize {
        self.round_up.apply(size)
    }

    /// Sum of one counter over all shards.
    pub fn sum(&self, f: impl Fn(&Counters) -> &AtomicU64) -> u64 {
        self.shards.iter().fold(0u64, |acc, s| {
            acc.wrapping_add(f(&s.counters).load(Relaxed))
        })
    }

    /// Takes the most recently freed block of exactly `size` bytes whose
    /// address satisfies `align`, home shard first.
    #[inline]
    pub fn take(&self, home: usize, size: usize, align: usize) -> Option<FreeBlock> {
        if self.cached_blocks.load(Relaxed) == 0 {
            return None;
        }
        for k in 0..SHARDS {
            let mut list = lock(&self.shards[(home + k) % SHARDS].free);
            if let Some(pos) = list
                .iter()
                .rposition(|f| f.layout.size() == size && f.ptr.addr() % align == 0)
            {
                return list.remove(pos);
            }
        }
        None
    }

    /// The shard holding this pool's oldest cached block, with its sequence number.
    pub fn oldest(&self) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for (i, s) in self.shards.iter().enumerate() {
            if let Some(f) = lock(&s.free).front() {
                if best.is_none_or(|(seq, _)| f.seq < seq) {
                    best = Some((f.seq, i));
                }
            }
        }
        best
    }

    /// Pops the block with sequence number `seq` if it is still the front of `shard`.
    pub fn pop_if_front(&self, shard: usize, seq: u64) -> Option<FreeBlock> {
        let mut list = lock(&self.shards[shard].free);
        if list.front().map(|f| f.seq) == Some(seq) {
            list.pop_front()
        } else {
            None
        }
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

/// What the allocator remembers about a live block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockInfo {
    /// The layout the block was allocated with from the inner allocator.
    pub layout: Layout,
    /// Owning pool index, or [`UNPOOLED`].
    pub pool: u32,
}

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// A cheap multiplicative hash for addresses.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);
impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(K);
        }
    }
    fn write_usize(&mut self, x: usize) {
        self.0 = (x as u64).wrapping_mul(K);
    }
}

type Map = HashMap<usize, BlockInfo, BuildHasherDefault<AddrHasher>>;

#[repr(align(128))]
#[derive(Default)]
struct TableShard(Mutex<Map>);

/// Live blocks by address, sharded by address.
pub(crate) struct BlockTable {
    shards: Box<[TableShard]>,
}

impl BlockTable {
    pub fn new() -> BlockTable {
        BlockTable {
            shards: (0..TABLE_SHARDS).map(|_| TableShard::default()).collect(),
        }
    }
    #[inline]
    fn shard(&self, addr: usize) -> &Mutex<Map> {
        let h = (addr as u64).wrapping_mul(K) >> (64 - TABLE_SHARDS.trailing_zeros());
        &self.shards[h as usize].0
    }
    #[inline]
    pub fn insert(&self, addr: usize, info: BlockInfo) {
        lock(self.shard(addr)).insert(addr, info);
    }
    #[inline]
    pub fn remove(&self, addr: usize) -> Option<BlockInfo> {
        lock(self.shard(addr)).remove(&addr)
    }
    #[inline]
    pub fn get(&self, addr: usize) -> Option<BlockInfo> {
        lock(self.shard(addr)).get(&addr).copied()
    }
}
