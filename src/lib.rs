//! ckalloc: memory for model-serving programs.
//!
//! Three pieces, each usable alone, all built on one OS layer (`sys`, the
//! only place that calls `libc`):
//!
//! 1. **Huge pages** — [`HugeRegion`], [`huge_alloc`] / [`huge_free`] and the
//!    [`CkHuge`] allocator (`#[global_allocator]` and
//!    `allocator_api2::alloc::Allocator`). Each mapping walks a tier ladder —
//!    hugetlb (`MAP_HUGETLB`), then 2 MiB-aligned THP memory
//!    (`MADV_HUGEPAGE`), then normal pages — and reports the tier it got
//!    ([`Backing`]); [`huge_page_coverage`] measures what the kernel actually
//!    gave, [`probe`] what the system offers, [`huge_stats`] the counters.
//! 2. **Bump arena** — [`BumpArena`]: one contiguous range holding a model's
//!    weights (at the same offsets as in the weights file) and its runtime
//!    buffers; its documentation draws the layout and lists the modes and
//!    builder options.
//!    `Vec::new_in(&arena)` allocates in the runtime region with a lock-free
//!    bump pointer; [`LocalArena`] bumps without atomics for one thread. The
//!    `weights.bump` container of C-Kernel-Engine is read and written by
//!    [`weights`] (feature `weights`, on by default).
//! 3. **Caching allocator** — [`caching::CachingAllocator`] wraps any
//!    `allocator_api2` allocator (for example [`CkHuge`], where a miss costs
//!    an `mmap`, page faults and zeroing) with pools configured by IREE's HAL
//!    caching-allocator spec (`device_local=1gib;1gib;8`).
//!
//! A C ABI compatible with C-Kernel-Engine's `ckernel_alloc.h` is in the `capi` module
//! (feature `capi`; header in `include/`). The engine of the preload
//! library `libckalloc_preload.so`, which serves unmodified C, C++ and
//! Python programs through `LD_PRELOAD`, is [`preload`] (feature
//! `preload`). Every environment variable the
//! crate reads is listed, and read, in [`env`](mod@env).
//!
//! Modules form a stack; each uses only modules below it:
//!
//! | module | uses |
//! | --- | --- |
//! | `sys` (the OS calls), `par` (work split over threads), `bits` (atomic bitmaps of 512 bits), `lock` (the spin lock), `escape` ([`Escaped`]), `units` ([`human_bytes`], the size syntax), `zero_size` (the block of a zero-size request) | nothing of the crate |
//! | `fork` (the `pthread_atfork` registrar) | `sys` |
//! | `prefault` (`MADV_POPULATE_WRITE` on several threads) | `par`, `sys` |
//! | [`env`](mod@env) (environment variables) | `sys`, `units` |
//! | `tier` ([`Backing`], the kernel's THP mode) | `env`, `sys` |
//! | `probe` ([`probe()`], [`huge_page_coverage`]) | `sys`, `tier`, `units` |
//! | [`weights`] (the `weights.bump` format) | `sys`, `escape` |
//! | [`huge`] (the tier ladder, [`HugeRegion`], the huge-page engine behind [`CkHuge`], [`huge_stats`]) | `bits`, `env`, `fork`, `prefault`, `probe`, `sys`, `tier`, `units`, `zero_size` |
//! | the arena ([`BumpArena`]) | `env`, `escape`, `huge`, `par`, `probe`, `sys`, `tier`, `weights`, `zero_size` |
//! | [`caching`] | `env`, `escape`, `fork`, `lock`, `units`, `zero_size` |
//! | `capi` | `arena`, `fork`, `huge`, `lock`, `sys` |
//! | [`preload`] (the engine of `libckalloc_preload.so`) | `env`, `huge`, `sys`, `units` |
//!
//! On top, this file's re-exports and test hooks, and the `ckalloc` CLI
//! (`src/bin/ckalloc`), which uses the public API only. Subsystems that must
//! act around `fork()` add their hooks to `fork`'s table when the library
//! is loaded; `fork` knows none of them.
//!
//! ```
//! use allocator_api2::vec::Vec;
//! use ckalloc::{BumpArena, HugeRegion};
//!
//! let region = HugeRegion::new(8 << 20)?;
//! println!("8 MiB on {}", region.backing());
//!
//! let arena = BumpArena::builder(64 << 20).build().expect("arena");
//! let mut acts: Vec<f32, _> = Vec::new_in(&arena);
//! acts.extend((0..1024).map(|i| i as f32));
//! assert_eq!(arena.offset_of(acts.as_ptr().cast()).map(|o| o < 64 << 20), Some(true));
//! # Ok::<(), ckalloc::HugeError>(())
//! ```
//!
//! Thread-safety: every type is `Send + Sync` except [`LocalArena`] (`!Sync`).
//! Units are bytes throughout.
//!
//! # Memory that reads zero
//!
//! What reads zero is stated once, in `docs/reliability.md` ("Memory that
//! reads zero"): fresh mappings, `allocate_zeroed` / `grow_zeroed` through
//! every allocator of the crate (including the caching allocator's cache
//! hits), and the runtime region of an arena built with
//! [`release_on_reset(true)`](ArenaBuilder::release_on_reset) after
//! [`BumpArena::reset`] or [`BumpArena::rewind_to`], up to the high-water
//! mark, whatever the page size or the kernel's answer to `MADV_DONTNEED`.
//! A zero-size request of any alignment gets an aligned pointer from every
//! allocator, never an error: dangling, or in an arena at its bump pointer
//! (taking the alignment padding) when the alignment fits before the end.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod sys;

mod arena;
mod bits;
pub mod caching;
#[cfg(feature = "capi")]
pub mod capi;
pub mod env;
mod escape;
mod fork;
pub mod huge;
mod lock;
mod par;
mod prefault;
#[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
pub mod preload;
mod probe;
mod thp;
mod tier;
mod units;
#[cfg(feature = "weights")]
pub mod weights;
mod zero_size;

pub use arena::{
    ArenaBuilder, ArenaCoverage, ArenaError, ArenaMode, BumpArena, Checkpoint, FallbackReason,
    LocalArena, ModePolicy,
};
pub use escape::Escaped;
pub use huge::{
    huge_alloc, huge_free, huge_stats, release_retained, reset_hugetlb_backoff, Backing, CkHuge,
    HugeError, HugeOptions, HugeRegion, HugeStats, TierStats,
};
pub use probe::{huge_page_coverage, probe, HugeCoverage, HugetlbPool, SystemHugePages};
pub use thp::{thp_settings, Khugepaged, ThpDefrag, ThpEnabled, ThpSettings};
pub use units::{human_bytes, HumanBytes};

/// Test-only fault injection into the OS layer (`--cfg ckalloc_fault_injection`).
#[cfg(ckalloc_fault_injection)]
#[doc(hidden)]
pub mod fault {
    pub use crate::sys::fault::{calls, fail_from, fail_nth, pending, reset, Op};
}

/// Test hooks that hold the locks the fork handlers take (not part of the
/// supported API).
#[doc(hidden)]
pub mod fork_hooks {
    pub use crate::lock::HeldLock;

    /// Holds the lock of the registry of live caching allocators.
    pub fn hold_caching_registry() -> HeldLock<'static> {
        crate::caching::hold_registry()
    }

    /// Holds the C ABI's `ck_bump_alloc_*` arena registry lock.
    #[cfg(feature = "capi")]
    pub fn hold_c_arena_registry() -> HeldLock<'static> {
        crate::capi::hold_arena_registry()
    }

    /// True once the crate's `pthread_atfork` handlers are registered
    /// (when the library is loaded).
    pub fn fork_handlers_registered() -> bool {
        crate::fork::registered()
    }
}

/// The examples of README.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The examples of docs/arena.md, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/arena.md")]
pub struct ArenaDocDoctests;
