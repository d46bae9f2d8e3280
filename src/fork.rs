//! The crate's one set of `pthread_atfork(3)` handlers, and the table of
//! fork hooks that subsystems add themselves to; `docs/reliability.md`
//! ("Fork safety") states the guarantee.
//!
//! As in jemalloc (one prefork/postfork set registered at initialisation,
//! calling each subsystem's hook in a fixed order), the handlers are
//! registered once, when the library is loaded (an ELF constructor, before
//! `main` or `dlopen` returns), and never from an allocation path. A
//! subsystem adds its [`Hooks`] to its [`Stage`]'s slot of a static table,
//! also when the library is loaded ([`at_load!`](crate::at_load)); adding
//! is one atomic store, nothing allocates. This module knows no subsystem:
//! the stages are positions in the order, the hooks are function pointers.
//!
//! `prepare` runs every stage's prepare hook in stage order; `parent` and
//! `child` run the parent or child hooks in the reverse order, so locks are
//! taken in one order and released in the other. The stages, in order:
//!
//! 1. [`Stage::CArenas`]: the C ABI's arena registry (`ck_bump_alloc_*`);
//! 2. [`Stage::CachingAllocators`]: the registry of live caching
//!    allocators, then each one's pool shard locks (pool order, shard order)
//!    and block-table shard locks;
//! 3. [`Stage::Retention`]: `CkHuge`'s retention cache, which takes no lock
//!    and only repairs, in the child, slots a thread of the parent held mid
//!    operation;
//! 4. [`Stage::PreloadCounters`]: the preload library's counters, which
//!    take no lock; the child notes how many huge blocks it inherited.
//!
//! No thread other than the prepare handler holds two of these locks at
//! once, and none waits for anything but the global allocator while holding
//! one, so any thread holding one releases it and the fixed order cannot
//! deadlock. A thread holding one of these locks may be inside the global
//! allocator; `CkHuge` never waits there. A global allocator that takes
//! locks of its own must register its handlers before these (POSIX runs
//! prepare handlers in the reverse order of registration).

use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

/// A subsystem's three fork hooks.
pub(crate) struct Hooks {
    /// Before `fork`, in the forking thread: take the subsystem's locks.
    pub(crate) prepare: unsafe fn(),
    /// After `fork`, in the parent: release what `prepare` took.
    pub(crate) parent: unsafe fn(),
    /// After `fork`, in the child's only thread: release what `prepare`
    /// took, and repair state other threads left half done.
    pub(crate) child: unsafe fn(),
}

/// A position in the order of the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    #[cfg_attr(not(feature = "capi"), allow(dead_code))]
    CArenas = 0,
    CachingAllocators = 1,
    Retention = 2,
    #[cfg_attr(not(feature = "preload"), allow(dead_code))]
    PreloadCounters = 3,
}

const STAGES: usize = 4;

static TABLE: [AtomicPtr<Hooks>; STAGES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; STAGES];

/// Put `hooks` in `stage`'s slot (replacing what was there). One atomic
/// store: callable from any path, an allocation path included.
pub(crate) fn add(stage: Stage, hooks: &'static Hooks) {
    TABLE[stage as usize].store(std::ptr::from_ref(hooks).cast_mut(), Ordering::Release);
}

/// The hooks of stage `i`, if a subsystem added them.
fn hooks(i: usize) -> Option<&'static Hooks> {
    let p = TABLE[i].load(Ordering::Acquire);
    // SAFETY: non-null pointers in the table come from `add`, which takes
    // a `&'static Hooks`; nothing is ever freed.
    unsafe { p.as_ref() }
}

const UNREGISTERED: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREGISTERED);

/// Registers the handlers with `pthread_atfork` unless they are: at load
/// time ([`at_load!`](crate::at_load) below), and again from explicit
/// constructors (a `CachingAllocator`, a C arena), never from an allocation
/// path, in case registering failed at load (`ENOMEM`). Later calls are one
/// atomic load.
///
/// Not a `std::sync::Once`: a `fork()` between the registration and the
/// `Once` marking itself complete would leave the child's `Once` running
/// forever. A caller that finds another thread registering goes on without
/// waiting.
#[inline]
pub(crate) fn ensure_registered() {
    if STATE.load(Ordering::Acquire) != REGISTERED {
        register();
    }
}

/// True once the handlers are registered (test hook).
pub(crate) fn registered() -> bool {
    STATE.load(Ordering::Acquire) == REGISTERED
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

unsafe extern "C" fn prepare() {
    for i in 0..STAGES {
        if let Some(h) = hooks(i) {
            // SAFETY: `prepare` is the pthread_atfork prepare handler, the
            // context the prepare hooks are written for.
            unsafe { (h.prepare)() }
        }
    }
}

unsafe extern "C" fn parent() {
    for i in (0..STAGES).rev() {
        if let Some(h) = hooks(i) {
            // SAFETY: the parent handler, after `prepare` ran every prepare
            // hook in this thread.
            unsafe { (h.parent)() }
        }
    }
}

unsafe extern "C" fn child() {
    for i in (0..STAGES).rev() {
        if let Some(h) = hooks(i) {
            // SAFETY: the child handler, in the child's only thread, which
            // ran every prepare hook before the fork.
            unsafe { (h.child)() }
        }
    }
}

/// Runs a block when the library is loaded: an entry in the constructor
/// section (ELF `.init_array`; Mach-O `__mod_init_func`), which the dynamic
/// loader (or the C runtime of a static executable) calls before `main`, or
/// before `dlopen` returns. The block must not panic. Not under Miri, which
/// has no constructors (and no `fork`); elsewhere the explicit calls of
/// [`ensure_registered`] stand in.
macro_rules! at_load {
    ($name:ident, $body:block) => {
        #[cfg(not(miri))]
        #[used]
        #[cfg_attr(
            any(target_os = "macos", target_os = "ios"),
            link_section = "__DATA,__mod_init_func"
        )]
        #[cfg_attr(
            not(any(target_os = "macos", target_os = "ios")),
            link_section = ".init_array"
        )]
        static $name: extern "C" fn() = {
            extern "C" fn run() $body
            run
        };
    };
}
pub(crate) use at_load;

at_load!(REGISTER_FORK_HANDLERS, {
    ensure_registered();
});
