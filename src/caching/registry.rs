//! The process-wide registry of live caching allocators, so the crate's
//! `pthread_atfork` handlers (`crate::fork`) reach every instance's locks.
//!
//! An entry points at the instance's heap data (its boxed pools and the
//! boxed shards of its block table), which stays put when the
//! `CachingAllocator` value moves. The registry is an intrusive doubly linked
//! list of boxed nodes behind one [`PoolLock`]: a node is allocated before
//! the lock is taken and freed after it is released, so nothing under the
//! registry lock allocates or calls out of the crate. Registration happens
//! once per instance (construction) and is undone in `Drop`; the cache hit
//! and release paths never touch the registry.

use std::ptr::{self, NonNull};

use super::heap_slice::HeapSlice;
use super::pool::Pool;
use super::table::TableShard;
use crate::fork::{Hooks, Stage};
use crate::lock::{HeldLock, PoolLock};

struct Node {
    pools: NonNull<[Pool]>,
    table: NonNull<[TableShard]>,
    prev: *mut Node,
    next: *mut Node,
}

struct List {
    head: *mut Node,
}

// SAFETY: the list's nodes are only reached under the registry lock; the
// data they point to is `Sync` (locks and atomics) and outlives the node.
unsafe impl Send for List {}

static INSTANCES: PoolLock<List> = PoolLock::new(List {
    head: ptr::null_mut(),
});

/// An instance's entry in the registry; dropping it removes the entry.
pub(crate) struct Registration(NonNull<Node>);

// SAFETY: the node is only read or written under the registry lock (and by
// the owner in `drop`, after unlinking it under that lock).
unsafe impl Send for Registration {}
// SAFETY: as above; `&Registration` gives no access to the node.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers the locks of an instance whose pools and table shards are
    /// `pools` and `table`; they must stay allocated until the returned value
    /// is dropped.
    pub(crate) fn new(pools: &HeapSlice<Pool>, table: &HeapSlice<TableShard>) -> Registration {
        // Not an allocation path: retry registering the fork handlers if
        // that failed when the library was loaded.
        crate::fork::ensure_registered();
        let node = NonNull::from(Box::leak(Box::new(Node {
            pools: pools.0,
            table: table.0,
            prev: ptr::null_mut(),
            next: ptr::null_mut(),
        })));
        let mut list = INSTANCES.lock();
        let n = node.as_ptr();
        // SAFETY: `n` is the fresh node; `head`, when non-null, is a live
        // node of the list; both are only accessed under the registry lock.
        unsafe {
            (*n).next = list.head;
            if !list.head.is_null() {
                (*list.head).prev = n;
            }
        }
        list.head = n;
        drop(list);
        Registration(node)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let n = self.0.as_ptr();
        let mut list = INSTANCES.lock();
        // SAFETY: `n` and its neighbours are live nodes of the list, only
        // accessed under the registry lock.
        unsafe {
            let (prev, next) = ((*n).prev, (*n).next);
            if prev.is_null() {
                list.head = next;
            } else {
                (*prev).next = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
        }
        drop(list);
        // SAFETY: created by `Box::leak` in `new` and now unreachable from
        // the list.
        drop(unsafe { Box::from_raw(n) });
    }
}

/// The fork hooks of stage `CachingAllocators` (`crate::fork`), added when
/// the library is loaded.
static FORK_HOOKS: Hooks = Hooks {
    prepare: lock_instances_for_fork,
    parent: unlock_instances_after_fork,
    child: unlock_instances_after_fork,
};

crate::fork::at_load!(ADD_CACHING_FORK_HOOKS, {
    crate::fork::add(Stage::CachingAllocators, &FORK_HOOKS);
});

/// The fork prepare hook: the registry lock, then every instance's pool
/// shard locks (pool order, shard order) and block-table shard locks (shard
/// order), instances in list order.
pub(crate) fn lock_instances_for_fork() {
    INSTANCES.raw_lock();
    // SAFETY: the registry lock is held (by this thread, until
    // `unlock_instances_after_fork`), so every node and the data it points
    // to stay alive: an instance unregisters under this lock before its
    // pools and table are freed.
    unsafe {
        let mut n = (*INSTANCES.as_ptr()).head;
        while !n.is_null() {
            for pool in (*n).pools.as_ref() {
                for shard in pool.shards.iter() {
                    shard.state.raw_lock();
                }
            }
            for t in (*n).table.as_ref() {
                t.0.raw_lock();
            }
            n = (*n).next;
        }
    }
}

/// The fork parent and child hook: releases what
/// [`lock_instances_for_fork`] took, in the reverse order.
///
/// # Safety
/// The calling thread ran [`lock_instances_for_fork`] and holds its locks.
pub(crate) unsafe fn unlock_instances_after_fork() {
    // SAFETY: the caller holds the registry lock, so the list is as
    // `lock_instances_for_fork` walked it, and holds every instance lock it
    // took through `raw_lock`.
    unsafe {
        let mut n = (*INSTANCES.as_ptr()).head;
        while !n.is_null() {
            for t in (*n).table.as_ref().iter().rev() {
                t.0.force_unlock();
            }
            for pool in (*n).pools.as_ref().iter().rev() {
                for shard in pool.shards.iter().rev() {
                    shard.state.force_unlock();
                }
            }
            n = (*n).next;
        }
        INSTANCES.force_unlock();
    }
}

/// Holds the registry lock (test hook).
pub(crate) fn hold_registry() -> HeldLock<'static> {
    INSTANCES.hold()
}

/// Whether the registry holds an entry for pools starting at `pools`
/// (for the allocator's tests).
#[cfg(test)]
pub(super) fn is_registered(pools: *const u8) -> bool {
    let list = INSTANCES.lock();
    let mut n = list.head;
    while !n.is_null() {
        // SAFETY: nodes of the list stay alive under the registry lock.
        unsafe {
            if (*n).pools.as_ptr().cast::<u8>().cast_const() == pools {
                return true;
            }
            n = (*n).next;
        }
    }
    false
}
