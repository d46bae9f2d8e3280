//! The block table: every block held from the inner allocator (live or
//! cached), by address, sharded by address, with its descriptor
//! ([`Desc`]); and the pointers the free lists carry.

use std::alloc::Layout;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::clock::tick;
use super::heap_slice::HeapSlice;
use crate::lock::PoolLock;

/// Shards of the block table (chosen by address).
const TABLE_SHARDS: usize = 64;
/// `Desc::pool` of a block served unpooled.
pub(crate) const UNPOOLED: u32 = u32::MAX;

/// What the allocator remembers about a block held from the inner allocator.
/// Padded to its own cache lines: the thread using a block writes `live` on
/// every hit and release, and descriptors of blocks used by different
/// threads must not share a line.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Desc {
    /// The layout the block was allocated with from the inner allocator.
    pub layout: Layout,
    /// Owning pool index, or [`UNPOOLED`].
    pub pool: u32,
    /// Handed out (not in a free list).
    pub live: AtomicBool,
    /// Release sequence number while cached; written before the block is
    /// pushed on a free list and read under that list's lock.
    pub seq: AtomicU64,
}

/// An owning pointer to a boxed [`Desc`]; the block table owns it while the
/// block is held from the inner allocator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DescPtr(NonNull<Desc>);

// SAFETY: a `DescPtr` points to a heap `Desc` (plain data plus an atomic)
// owned by the block table; it is freed only after being removed from the
// table under its lock, by the one path that owns the block.
unsafe impl Send for DescPtr {}
// SAFETY: as above; shared access only reads `layout`/`pool` and uses `live`
// atomically.
unsafe impl Sync for DescPtr {}

impl DescPtr {
    pub fn new(layout: Layout, pool: u32, live: bool) -> DescPtr {
        DescPtr(NonNull::from(Box::leak(Box::new(Desc {
            layout,
            pool,
            live: AtomicBool::new(live),
            seq: AtomicU64::new(0),
        }))))
    }

    #[inline]
    pub fn get(&self) -> &Desc {
        // SAFETY: the descriptor lives until `free`, which only the owner of
        // the block calls, after removing it from the table and every list.
        unsafe { self.0.as_ref() }
    }

    /// Frees the descriptor.
    ///
    /// # Safety
    /// No other copy of this pointer is used afterwards.
    pub unsafe fn free(self) {
        // SAFETY: created by `Box::leak` in `new`; the caller owns it.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
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

/// A cached block: its pointer and its descriptor (which holds its size and
/// release sequence number).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FreeBlock {
    pub ptr: BlockPtr,
    pub desc: DescPtr,
}

impl FreeBlock {
    /// A released block, stamped with the calling thread's next sequence number.
    #[inline]
    pub fn released(ptr: NonNull<u8>, desc: DescPtr) -> FreeBlock {
        desc.get().seq.store(tick(), Relaxed);
        FreeBlock {
            ptr: BlockPtr(ptr),
            desc,
        }
    }
    /// Size in bytes (the inner layout's).
    #[inline]
    pub fn size(&self) -> usize {
        self.desc.get().layout.size()
    }
    /// Release sequence number (for oldest-first).
    #[inline]
    pub fn seq(&self) -> u64 {
        self.desc.get().seq.load(Relaxed)
    }
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

type Map = HashMap<usize, DescPtr, BuildHasherDefault<AddrHasher>>;

/// One shard of the block table, padded to its own cache lines.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct TableShard(pub(crate) PoolLock<Map>);

/// Every block held from the inner allocator (live or cached), by address,
/// sharded by address. Owns the descriptors.
pub(crate) struct BlockTable {
    shards: HeapSlice<TableShard>,
}

impl BlockTable {
    pub fn new() -> BlockTable {
        BlockTable {
            shards: HeapSlice::new((0..TABLE_SHARDS).map(|_| TableShard::default()).collect()),
        }
    }
    /// The shards (heap data: it stays put when the table moves).
    pub fn shards(&self) -> &HeapSlice<TableShard> {
        &self.shards
    }
    #[inline]
    fn shard(&self, addr: usize) -> &PoolLock<Map> {
        let h = (addr as u64).wrapping_mul(K) >> (64 - TABLE_SHARDS.trailing_zeros());
        &self.shards[h as usize].0
    }
    /// Records a new live block.
    #[inline]
    pub fn insert(&self, addr: usize, layout: Layout, pool: u32) -> DescPtr {
        let d = DescPtr::new(layout, pool, true);
        if let Some(old) = self.shard(addr).lock().insert(addr, d) {
            // The inner allocator cannot hand out an address we still hold;
            // keep the table consistent anyway.
            // SAFETY: removed from the table; nothing else refers to it.
            unsafe { old.free() };
        }
        d
    }
    /// The descriptor of a live block.
    #[inline]
    pub fn get_live(&self, addr: usize) -> Option<DescPtr> {
        let m = self.shard(addr).lock();
        m.get(&addr).copied().filter(|d| d.get().live.load(Relaxed))
    }
    /// Marks a live block as no longer live; `None` if the address is not a
    /// live block (a contract violation the caller ignores).
    #[inline]
    pub fn release(&self, addr: usize) -> Option<DescPtr> {
        let m = self.shard(addr).lock();
        let d = *m.get(&addr)?;
        d.get().live.swap(false, Relaxed).then_some(d)
    }
    /// Forgets a block (before it goes back to the inner allocator) and frees
    /// its descriptor; returns the block's inner layout.
    pub fn forget(&self, addr: usize) -> Option<Layout> {
        let d = self.shard(addr).lock().remove(&addr)?;
        let layout = d.get().layout;
        // SAFETY: removed from the table under its lock; the caller owns the
        // block (it is neither live nor in a free list), so no other copy of
        // the pointer is used again.
        unsafe { d.free() };
        Some(layout)
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        for s in self.shards.iter_mut() {
            let m = s.0.get_mut();
            for (_, d) in m.drain() {
                // SAFETY: the table is being dropped; nothing else uses it.
                unsafe { d.free() };
            }
        }
    }
}
