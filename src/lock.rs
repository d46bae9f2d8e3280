//! [`PoolLock`]: the spin lock of every short critical section in the crate
//! (the caching allocator's free-list and block-table shards, the C ABI's
//! registries), kept below every module that takes a lock so each can use it.

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
/// # Measurements
///
/// Against `std::sync::Mutex` (futex) and `parking_lot::Mutex`, on the lock
/// traffic of a cache hit + release of 4 MiB (two critical sections with the
/// hot counter updates; `benches/compare/alloc.rs`, row 7), the three
/// interleaved in every repetition; medians of 9 repetitions, 4 runs of
/// `cargo bench -p ckalloc-benches --bench compare -- pool_lock` on the
/// 2-core development machine with no other work running (load average
/// about 1.5; ranges over the runs):
///
/// | per hit + release | `PoolLock` | `std::sync::Mutex` | `parking_lot::Mutex` |
/// | --- | --- | --- | --- |
/// | 1 thread | 12.9-14.5 ns | 23.0-26.4 ns (1.76-1.81x) | 22.6-25.2 ns (1.70-1.78x) |
/// | 2 threads, a shard each | 13.4-15.1 ns | 23.0-26.6 ns (1.68-1.83x) | 23.8-27.4 ns (1.69-1.81x) |
/// | 2 threads, one shared shard | 95.9-109.2 ns | 116.2-120.5 ns (1.04-1.21x) | 79.7-86.5 ns (0.74-0.85x) |
///
/// (ratio = the other lock's time / `PoolLock`'s, median of per-repetition
/// ratios.) `PoolLock` is kept: it is 1.7x faster in the cases the caching
/// allocator is built for (threads spread over the shards), while
/// `parking_lot::Mutex` is 1.2-1.35x faster only when two threads hammer one
/// shard, the worst case of that design; both can be released by force in
/// a fork child, so the fork constraint does not decide. Instruction counts
/// of the same sequence, uncontended (`cargo bench -p ckalloc-benches
/// --bench instructions`, group `pool_lock`): `PoolLock` 38,
/// `parking_lot::Mutex` 38, `std::sync::Mutex` 69 (poison bookkeeping). The
/// release is a plain store here and a read-modify-write (a locked
/// instruction) in both others, the likely source of the uncontended gap.
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

    /// Takes the lock without a guard, as [`lock`](Self::lock) does; the
    /// caller gives it back with [`force_unlock`](Self::force_unlock). For
    /// the `pthread_atfork` prepare handler, which takes every lock of the
    /// crate in one function and releases them in two others (see
    /// `docs/reliability.md`, "Fork safety").
    #[inline]
    pub(crate) fn raw_lock(&self) {
        std::mem::forget(self.lock());
    }

    /// A pointer to the value, for a caller that holds the lock without a
    /// guard ([`raw_lock`](Self::raw_lock)); dereferencing it without holding
    /// the lock is a data race.
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.value.get()
    }

    /// Releases the lock (a release store of `false`) whoever holds it.
    ///
    /// # Safety
    /// No guard of this lock is used afterwards: the caller took it with
    /// [`raw_lock`](Self::raw_lock), or (in a `fork()` child, which has one
    /// thread) the thread holding it does not exist.
    #[inline]
    pub(crate) unsafe fn force_unlock(&self) {
        self.locked.store(false, Release);
    }

    /// Takes the lock and returns a guard that gives no access to the value,
    /// for tests that hold a lock on one thread while another thread forks.
    /// Not part of the supported API.
    #[doc(hidden)]
    pub fn hold(&self) -> HeldLock<'_> {
        std::mem::forget(self.lock());
        HeldLock(&self.locked)
    }

    /// The value, through exclusive access to the lock (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// A held [`PoolLock`] without access to its value (from
/// [`PoolLock::hold`]); dropping it releases the lock. Test-only.
#[doc(hidden)]
#[must_use = "dropping it releases the lock"]
pub struct HeldLock<'a>(&'a AtomicBool);

impl Drop for HeldLock<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

impl std::fmt::Debug for HeldLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldLock")
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

#[cfg(test)]
mod tests {
    use super::PoolLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn a_held_lock_blocks_others_until_released() {
        let lock = PoolLock::new(0u32);
        let taken = AtomicBool::new(false);
        std::thread::scope(|s| {
            let held = lock.hold();
            let waiter = s.spawn(|| {
                *lock.lock() += 1;
                taken.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!taken.load(Ordering::SeqCst), "taken while held");
            drop(held);
            waiter.join().unwrap();
        });
        assert!(taken.load(Ordering::SeqCst));
        assert_eq!(*lock.lock(), 1);
    }

    #[test]
    fn raw_lock_is_released_by_force_unlock() {
        let lock = PoolLock::new(5u32);
        lock.raw_lock();
        // SAFETY: this thread holds the lock; the value is not shared.
        unsafe {
            *lock.as_ptr() += 1;
            lock.force_unlock();
        }
        assert_eq!(*lock.lock(), 6);
        drop(lock.lock()); // taken again: the release left it free
    }
}
