//! [`CachingAllocator`]: the request path, the free lists' upkeep, trim,
//! statistics and the `Allocator` implementation.

use std::alloc::Layout;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use allocator_api2::alloc::{AllocError, Allocator};

use super::clock::{home_shard, SHARDS};
use super::heap::Heap;
use super::heap_slice::HeapSlice;
use super::params::PoolParams;
use super::pool::{add, sub, Pool};
use super::registry::Registration;
use super::stats::{CacheStats, PoolStats};
use super::table::{BlockPtr, BlockTable, Desc, DescPtr, FreeBlock, UNPOOLED};
use crate::lock::HeldLock;
use crate::zero_size::empty_block;

/// A caching allocator over the inner allocator `A`.
///
/// See the [module documentation](super) for the request path. Blocks are
/// counted (capacity, statistics) by the size they were allocated with from
/// `A`; a block remembers that layout and goes back to `A` with it.
/// Allocations return the whole block (its length may exceed the request
/// when a pool rounds sizes). Zero-size requests get a dangling, aligned
/// pointer and never reach `A`.
///
/// Dropping the allocator returns every cached block to `A`. Blocks still
/// live at that point are not returned (they cannot be in safe code: every
/// borrowing collection must be dropped first).
pub struct CachingAllocator<A: Allocator> {
    /// The entry of the process-wide registry the fork handlers walk. Declared
    /// first so it is dropped (unregistered) before `pools` and `table`.
    _registration: Registration,
    inner: A,
    heap: Heap,
    pools: HeapSlice<Pool>,
    table: BlockTable,
    no_pool_bypasses: AtomicU64,
    no_pool_failures: AtomicU64,
    /// Bytes of unpooled (bypass) blocks currently live.
    unpooled_live: AtomicU64,
    /// Bytes currently held from the inner allocator (live + cached).
    held: AtomicU64,
    peak: AtomicU64,
}

impl<A: Allocator> fmt::Debug for CachingAllocator<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("heap", &self.heap)
            .field("pools", &self.pool_params())
            .finish_non_exhaustive()
    }
}

impl<A: Allocator> CachingAllocator<A> {
    /// An allocator with these pools over `inner` (its heap `heap`),
    /// registered for the fork handlers: what every constructor builds.
    pub(super) fn assemble(inner: A, heap: Heap, pools: HeapSlice<Pool>) -> CachingAllocator<A> {
        let table = BlockTable::new();
        CachingAllocator {
            _registration: Registration::new(&pools, table.shards()),
            inner,
            heap,
            pools,
            table,
            no_pool_bypasses: AtomicU64::new(0),
            no_pool_failures: AtomicU64::new(0),
            unpooled_live: AtomicU64::new(0),
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// The inner allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// The inner allocator's heap.
    pub fn heap(&self) -> Heap {
        self.heap
    }

    /// The pools' parameters, in priority order.
    pub fn pool_params(&self) -> Vec<PoolParams> {
        self.pools.iter().map(|p| p.params).collect()
    }

    /// Holds the lock of free-list shard `shard` of pool `pool` on the
    /// calling thread until the returned value is dropped; `None` if there is
    /// no such pool or shard. A test hook, not part of the supported API.
    #[doc(hidden)]
    pub fn hold_pool_shard_lock(&self, pool: usize, shard: usize) -> Option<HeldLock<'_>> {
        Some(self.pools.get(pool)?.shards.get(shard)?.state.hold())
    }

    /// The number of free-list shards of each pool (test hook).
    #[doc(hidden)]
    pub fn pool_shard_count(&self) -> usize {
        SHARDS
    }

    /// Holds every shard lock of the block table on the calling thread until
    /// the returned values are dropped. A test hook, not part of the
    /// supported API.
    #[doc(hidden)]
    pub fn hold_block_table_locks(&self) -> Vec<HeldLock<'_>> {
        self.table.shards().iter().map(|t| t.0.hold()).collect()
    }

    /// A snapshot of the statistics (exact when no other thread is allocating).
    pub fn stats(&self) -> CacheStats {
        let mut s = CacheStats::default();
        for (index, p) in self.pools.iter().enumerate() {
            let ps = PoolStats {
                index,
                max_allocation_size: p.params.max_allocation_size,
                max_allocation_capacity: p.params.max_allocation_capacity,
                max_free_allocation_count: p.params.max_free_allocation_count,
                hits: p.sum_locked(|s| s.hits),
                misses: p.sum(|c| &c.misses),
                bypasses: p.sum(|c| &c.bypasses),
                evictions: p.sum(|c| &c.evictions),
                trimmed: p.sum(|c| &c.trimmed),
                live_bytes: p.sum_locked(|s| s.live_bytes),
                cached_bytes: p.sum_locked(|s| s.cached_bytes),
                cached_blocks: p.sum_locked(|s| s.free.len() as u64),
                peak_bytes: p.peak.load(Relaxed),
                inner_failures: p.sum(|c| &c.inner_failures),
            };
            s.hits += ps.hits;
            s.misses += ps.misses;
            s.bypasses += ps.bypasses;
            s.evictions += ps.evictions;
            s.trimmed += ps.trimmed;
            s.live_bytes += ps.live_bytes;
            s.cached_bytes += ps.cached_bytes;
            s.cached_blocks += ps.cached_blocks;
            s.inner_failures += ps.inner_failures;
            s.pools.push(ps);
        }
        s.bypasses += self.no_pool_bypasses.load(Relaxed);
        s.inner_failures += self.no_pool_failures.load(Relaxed);
        s.live_bytes += self.unpooled_live.load(Relaxed);
        s.peak_bytes = self.peak.load(Relaxed);
        s
    }

    /// Returns every cached block to the inner allocator, oldest first.
    pub fn trim(&self) {
        self.trim_to(0);
    }

    /// Returns cached blocks to the inner allocator, oldest first across all
    /// pools, until at most `bytes` bytes stay cached.
    pub fn trim_to(&self, bytes: u64) {
        let home = home_shard();
        loop {
            let cached: u64 = self.pools.iter().fold(0u64, |acc, p| {
                acc.wrapping_add(p.sum_locked(|s| s.cached_bytes))
            });
            if cached <= bytes {
                return;
            }
            let oldest = self
                .pools
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.oldest().map(|(seq, shard)| (seq, i, shard)))
                .min();
            let Some((seq, pi, shard)) = oldest else {
                return;
            };
            let pool = &self.pools[pi];
            if let Some(fb) = pool.pop_if_front(shard, seq) {
                add(&pool.shards[home].counters.trimmed, 1);
                self.free_cached(pool, fb);
            }
        }
    }

    /// Accounts for a block that left a free list (popped with its slot and
    /// cached bytes accounted) for the inner allocator, and frees it.
    fn free_cached(&self, pool: &Pool, fb: FreeBlock) {
        let b = fb.size() as u64;
        sub(&pool.committed, b);
        sub(&self.held, b);
        self.free_to_inner(fb.ptr, fb.desc);
    }

    /// Forgets a block that is neither live nor cached and returns it to the
    /// inner allocator with its layout.
    fn free_to_inner(&self, ptr: BlockPtr, desc: DescPtr) {
        let pool = desc.get().pool;
        if pool != UNPOOLED {
            self.pools[pool as usize].scrub(ptr.addr());
        }
        if let Some(layout) = self.table.forget(ptr.addr()) {
            // SAFETY: the block was allocated by `self.inner` with exactly
            // `layout` (its descriptor), is not live, and is no longer
            // reachable from any list or the table.
            unsafe { self.inner.deallocate(ptr.0, layout) };
        }
    }

    #[inline]
    fn pool_for(&self, size: usize) -> Option<usize> {
        // The common configuration: the first pool takes it.
        if let Some(p) = self.pools.first() {
            if size as u64 <= p.params.max_allocation_size {
                return Some(0);
            }
        }
        self.pools
            .iter()
            .position(|p| size as u64 <= p.params.max_allocation_size)
    }

    /// Reserves `b` bytes of capacity in pool `pi`, evicting cached blocks
    /// oldest first if that makes room. Returns the new committed total.
    fn reserve(&self, pi: usize, home: usize, b: u64) -> Option<u64> {
        let pool = &self.pools[pi];
        let cap = pool.params.max_allocation_capacity;
        if b > cap {
            return None;
        }
        loop {
            let cur = pool.committed.load(Relaxed);
            if cur.checked_add(b).is_some_and(|n| n <= cap) {
                if pool
                    .committed
                    .compare_exchange_weak(cur, cur + b, Relaxed, Relaxed)
                    .is_ok()
                {
                    return Some(cur + b);
                }
                continue;
            }
            // Evict only if dropping every cached block could make room.
            let cached = pool.sum_locked(|s| s.cached_bytes);
            let live = cur.wrapping_sub(cached);
            if live.checked_add(b).is_none_or(|n| n > cap) {
                return None;
            }
            let fb = pool.pop_oldest()?;
            add(&pool.shards[home].counters.evictions, 1);
            self.free_cached(pool, fb);
        }
    }

    /// Calls the inner allocator (no lock held); on failure trims the cache
    /// and retries once.
    fn inner_alloc(
        &self,
        layout: Layout,
        zeroed: bool,
        pool: Option<usize>,
        home: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let call = || {
            if zeroed {
                self.inner.allocate_zeroed(layout)
            } else {
                self.inner.allocate(layout)
            }
        };
        let fail = || match pool {
            Some(pi) => add(&self.pools[pi].shards[home].counters.inner_failures, 1),
            None => add(&self.no_pool_failures, 1),
        };
        match call() {
            Ok(p) => Ok(p.cast()),
            Err(_) => {
                fail();
                self.trim();
                match call() {
                    Ok(p) => Ok(p.cast()),
                    Err(e) => {
                        fail();
                        Err(e)
                    }
                }
            }
        }
    }

    fn note_held(&self, b: u64) {
        let now = self.held.fetch_add(b, Relaxed) + b;
        self.peak.fetch_max(now, Relaxed);
    }

    /// Serves `layout` straight from the inner allocator (a bypass).
    fn alloc_unpooled(
        &self,
        layout: Layout,
        zeroed: bool,
        pool: Option<usize>,
        home: usize,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let p = self.inner_alloc(layout, zeroed, pool, home)?;
        let b = layout.size() as u64;
        match pool {
            Some(pi) => add(&self.pools[pi].shards[home].counters.bypasses, 1),
            None => add(&self.no_pool_bypasses, 1),
        }
        add(&self.unpooled_live, b);
        self.note_held(b);
        self.table.insert(p.as_ptr() as usize, layout, UNPOOLED);
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    fn alloc_impl(&self, layout: Layout, zeroed: bool) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(empty_block(layout.align()));
        }
        let home = home_shard();
        let Some(pi) = self.pool_for(layout.size()) else {
            return self.alloc_unpooled(layout, zeroed, None, home);
        };
        let pool = &self.pools[pi];
        let b = pool.block_size(layout.size());
        // The cache hit (see `Pool::take_from`).
        if let Some(block) = pool.take(home, b, layout.align()) {
            let start = block.ptr.0;
            if zeroed {
                // SAFETY: the block is `b` bytes long and now owned by this call.
                unsafe { ptr::write_bytes(start.as_ptr(), 0, b) };
            }
            return Ok(NonNull::slice_from_raw_parts(start, b));
        }
        let block_layout = Layout::from_size_align(b, layout.align()).map_err(|_| AllocError)?;
        let counters = &pool.shards[home].counters;
        if self.reserve(pi, home, b as u64).is_none() {
            return self.alloc_unpooled(layout, zeroed, Some(pi), home);
        }
        match self.inner_alloc(block_layout, zeroed, Some(pi), home) {
            Ok(p) => {
                add(&counters.misses, 1);
                // After the call: a retry may have trimmed this pool meanwhile.
                pool.peak.fetch_max(pool.committed.load(Relaxed), Relaxed);
                self.note_held(b as u64);
                let addr = p.as_ptr() as usize;
                let desc = self.table.insert(addr, block_layout, pi as u32);
                pool.add_live(home, b as u64, addr, desc);
                Ok(NonNull::slice_from_raw_parts(p, b))
            }
            Err(e) => {
                sub(&pool.committed, b as u64);
                Err(e)
            }
        }
    }

    /// Releases a live block (its descriptor was just marked not live).
    #[inline]
    fn release(&self, ptr: NonNull<u8>, desc: DescPtr) {
        let d = desc.get();
        let b = d.layout.size() as u64;
        if d.pool == UNPOOLED {
            sub(&self.unpooled_live, b);
            sub(&self.held, b);
            self.free_to_inner(BlockPtr(ptr), desc);
            return;
        }
        self.put(home_shard(), FreeBlock::released(ptr, desc));
    }

    /// Caches a released pooled block, or returns it to the inner allocator
    /// when the pool's free count is reached.
    fn put(&self, home: usize, fb: FreeBlock) {
        let pool = &self.pools[fb.desc.get().pool as usize];
        if let Err(fb) = pool.put(home, fb) {
            self.free_cached(pool, fb);
        }
    }

    /// True if a live block can serve `new` without moving.
    fn fits_in_place(&self, addr: usize, info: &Desc, new: Layout) -> bool {
        if !addr.is_multiple_of(new.align()) {
            return false;
        }
        let b = info.layout.size();
        if info.pool == UNPOOLED {
            return new.size() == b;
        }
        self.pool_for(new.size()) == Some(info.pool as usize)
            && self.pools[info.pool as usize].block_size(new.size()) == b
    }

    /// Shared body of grow/shrink: in place if the block fits, else a new
    /// block through the cache, a copy, and the old block released to the cache.
    ///
    /// # Safety
    /// As [`Allocator::grow`] / [`Allocator::shrink`].
    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
        zeroed: bool,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 {
            return self.alloc_impl(new, zeroed);
        }
        let addr = ptr.as_ptr() as usize;
        let desc = self.table.get_live(addr).ok_or(AllocError)?;
        let b = desc.get().layout.size();
        if new.size() != 0 && self.fits_in_place(addr, desc.get(), new) {
            if zeroed && b > old.size() {
                // SAFETY: bytes old.size()..b lie inside the caller's live block.
                unsafe { ptr::write_bytes(ptr.as_ptr().add(old.size()), 0, b - old.size()) };
            }
            return Ok(NonNull::slice_from_raw_parts(ptr, b));
        }
        let fresh = self.alloc_impl(new, false)?;
        let keep = old.size().min(new.size());
        // SAFETY: both blocks are live and distinct (the old one is still in
        // the table, so the cache could not hand it out again); `keep` bytes
        // fit in both.
        unsafe {
            ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.cast::<u8>().as_ptr(), keep);
            if zeroed {
                let len = fresh.len();
                ptr::write_bytes(fresh.cast::<u8>().as_ptr().add(keep), 0, len - keep);
            }
        }
        if let Some(desc) = self.table.release(addr) {
            self.release(ptr, desc);
        }
        Ok(fresh)
    }
}

impl<A: Allocator> Drop for CachingAllocator<A> {
    fn drop(&mut self) {
        self.trim();
    }
}

// SAFETY: blocks handed out come from `inner` (which upholds the Allocator
// contract) and stay valid until deallocated through this allocator; a block
// is in at most one of {live table, one free list} at a time, so no block is
// handed out twice; moving the allocator keeps `inner` and so the blocks.
unsafe impl<A: Allocator> Allocator for CachingAllocator<A> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.alloc_impl(layout, false)
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.alloc_impl(layout, true)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let addr = ptr.as_ptr() as usize;
        // Fast path: the pool this size maps to, the calling thread's shard
        // handed the block out recently.
        if let Some(pi) = self.pool_for(layout.size()) {
            let home = home_shard();
            match self.pools[pi].release_recent(home, ptr) {
                Some(Ok(())) => return,
                Some(Err(fb)) => {
                    // `release_recent` marked it not live and left its live
                    // bytes counted; `put` moves them.
                    self.put(home, fb);
                    return;
                }
                None => {}
            }
        }
        // A pointer not in the table violates the caller contract; ignoring
        // it is the only option that cannot corrupt the cache.
        if let Some(desc) = self.table.release(addr) {
            self.release(ptr, desc);
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded caller contract.
        unsafe { self.resize(ptr, old, new, false) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded caller contract.
        unsafe { self.resize(ptr, old, new, true) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if new.size() == 0 {
            // SAFETY: forwarded caller contract.
            unsafe { self.deallocate(ptr, old) };
            return Ok(empty_block(new.align()));
        }
        // SAFETY: forwarded caller contract.
        unsafe { self.resize(ptr, old, new, false) }
    }
}

const _: () = assert!(SHARDS.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::CachingAllocator;
    use crate::caching::registry::{
        is_registered, lock_instances_for_fork, unlock_instances_after_fork,
    };
    use allocator_api2::alloc::Global;

    #[test]
    fn instances_stay_registered_when_moved_and_leave_on_drop() {
        let a = CachingAllocator::unbounded(Global);
        let b = CachingAllocator::unbounded(Global);
        let (pa, pb) = (a.pools.as_ptr().cast::<u8>(), b.pools.as_ptr().cast::<u8>());
        let moved = vec![a, b];
        assert!(is_registered(pa) && is_registered(pb));
        let mut moved = moved;
        let b = moved.pop().unwrap();
        drop(moved);
        assert!(!is_registered(pa), "dropped instance still registered");
        assert!(is_registered(pb));
        drop(b);
        assert!(!is_registered(pb));
    }

    #[test]
    fn fork_handlers_lock_and_release_every_registered_lock() {
        let a = CachingAllocator::unbounded(Global);
        lock_instances_for_fork();
        // SAFETY: this thread took the locks just above.
        unsafe { unlock_instances_after_fork() };
        // Every lock is free again: the allocator works.
        let layout = std::alloc::Layout::from_size_align(4096, 8).unwrap();
        let p = allocator_api2::alloc::Allocator::allocate(&a, layout).unwrap();
        // SAFETY: allocated above with `layout`.
        unsafe { allocator_api2::alloc::Allocator::deallocate(&a, p.cast(), layout) };
        assert_eq!(a.stats().misses, 1);
    }
}
