//! The crate's `pthread_atfork(3)` handlers for the C ABI's registries and
//! every live [`CachingAllocator`](crate::caching::CachingAllocator)'s
//! locks; `docs/reliability.md` ("Fork safety") states the guarantee.
//!
//! `prepare` takes every lock below in this fixed order, `parent` and `child`
//! release them all (the child has one thread, the one that called `fork`,
//! which holds them; the registries' contents are the parent's, which is
//! right, as the child inherits the mappings they describe):
//!
//! 1. the C ABI's arena registry (`ck_bump_alloc_*`), feature `capi`;
//! 2. the C ABI's block registry (`ck_huge_alloc` / `ck_huge_free`);
//! 3. the registry of live caching allocators;
//! 4. for each live caching allocator (registry order): each pool's
//!    free-list shard locks (pool order, shard order), then the block
//!    table's shard locks (shard order).
//!
//! No thread other than the prepare handler holds two of these locks at
//! once, and none waits for anything but the global allocator while holding
//! one, so any thread holding one releases it and the fixed order cannot
//! deadlock.
//!
//! A thread holding one of these locks may be inside the global allocator.
//! `CkHuge` never waits there (its retention cache claims slots with a
//! compare-and-swap and skips busy ones) and registers only a child handler
//! of its own (`huge::retain`). A global allocator that takes locks of its
//! own must register its handlers before these (POSIX runs prepare handlers
//! in the reverse order of registration, so its prepare handler then runs
//! after this one).

use std::sync::atomic::{AtomicU8, Ordering};

const UNREGISTERED: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREGISTERED);

/// Registers the handlers on the first call in the process; later calls are
/// one atomic load.
///
/// Not a `std::sync::Once`: a `fork()` between the registration and the
/// `Once` marking itself complete would leave the child's `Once` running
/// forever, and every caller in the child would wait for it. Here a caller
/// that finds another thread registering goes on without waiting. If
/// `pthread_atfork` fails (`ENOMEM`), the next call tries again.
#[inline]
pub(crate) fn ensure_handlers() {
    if STATE.load(Ordering::Acquire) != REGISTERED {
        register();
    }
}

#[cold]
fn register() {
    if STATE
        .compare_exchange(
            UNREGISTERED,
            REGISTERING,
            Ordering::Acquire,
            Ordering::Acquire,
        )
        .is_err()
    {
        return;
    }
    // Miri implements neither `pthread_atfork` nor `fork`.
    let done = cfg!(miri) || crate::sys::register_atfork(prepare, parent, child).is_ok();
    STATE.store(
        if done { REGISTERED } else { UNREGISTERED },
        Ordering::Release,
    );
}

/// Takes every lock, in the order of the module documentation.
unsafe extern "C" fn prepare() {
    #[cfg(feature = "capi")]
    crate::capi::lock_registries_for_fork();
    crate::caching::lock_instances_for_fork();
}

/// Releases every lock `prepare` took, in the reverse order.
unsafe extern "C" fn release() {
    // SAFETY: runs after `prepare` in the thread that took the locks (the
    // parent's forking thread, or the child's only thread).
    unsafe {
        crate::caching::unlock_instances_after_fork();
        #[cfg(feature = "capi")]
        crate::capi::unlock_registries_after_fork();
    }
}

unsafe extern "C" fn parent() {
    // SAFETY: as `release`.
    unsafe { release() }
}

unsafe extern "C" fn child() {
    // SAFETY: as `release`.
    unsafe { release() }
}

/// Test hooks: hold one of the locks the fork handlers take, on the calling
/// thread, until the returned value is dropped. Not part of the supported
/// API.
#[doc(hidden)]
pub mod hooks {
    pub use crate::lock::HeldLock;

    /// Holds the lock of the registry of live caching allocators.
    pub fn hold_caching_registry() -> HeldLock<'static> {
        crate::caching::hold_registry()
    }

    /// Holds the C ABI's `ck_huge_alloc` block registry lock.
    #[cfg(feature = "capi")]
    pub fn hold_c_block_registry() -> HeldLock<'static> {
        crate::capi::hold_block_registry()
    }

    /// Holds the C ABI's `ck_bump_alloc_*` arena registry lock.
    #[cfg(feature = "capi")]
    pub fn hold_c_arena_registry() -> HeldLock<'static> {
        crate::capi::hold_arena_registry()
    }
}
