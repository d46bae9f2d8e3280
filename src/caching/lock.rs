//! [`PoolLock`]: the lock of a free-list shard and of a block-table shard.
//!
//! Every pool and table lock is this one type, so replacing the lock
//! implementation is a change to this file only.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
};

/// A test-and-test-and-set spin lock for the short critical sections of the
/// caching allocator (a few loads and stores, a `VecDeque`/`HashMap`
/// operation): one compare-and-swap to take it and one release store to give
/// it back, no poisoning (nothing under these locks panics), no allocation,
/// `const` construction. Waiters spin 64 times, then yield the CPU
/// (`sched_yield`) between attempts.
///
/// The lock state is one `AtomicBool`, so the lock can be released by force
/// (a store of `false`), which a `pthread_atfork` child handler needs for
/// locks held by threads that do not exist in the child.
///
/// Measured against `std::sync::Mutex` (futex) and `parking_lot::Mutex` with
/// `cargo bench --bench compare -- pool_lock` (the critical sections of a
/// cache hit and its release, twice per operation; see
/// `benches/compare/alloc.rs`); the numbers are in
/// `docs/caching-lock.md`.
pub struct PoolLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives one thread at a time access to the value.
unsafe impl<T: Send> Sync for PoolLock<T> {}
// SAFETY: moving the lock moves the value.
unsafe impl<T: Send> Send for PoolLock<T> {}

impl<T: Default> Default for PoolLock<T> {
    fn default() -> Self {
        PoolLock::new(T::default())
    }
}

/// Holds a [`PoolLock`]; dropping it releases the lock.
pub struct PoolLockGuard<'a, T>(&'a PoolLock<T>);

impl<T> PoolLock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> PoolLock<T> {
        PoolLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, spinning and then yielding while another thread holds it.
    #[inline]
    pub fn lock(&self) -> PoolLockGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        PoolLockGuard(self)
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Relaxed) {
                if spins < 64 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Acquire, Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// The value, through exclusive access to the lock (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T> Deref for PoolLockGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> DerefMut for PoolLockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock exclusively.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for PoolLockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.0.locked.store(false, Release);
    }
}
