//! Huge-page memory: the tier ladder, [`HugeRegion`], and the huge-page
//! engine behind [`CkHuge`], [`huge_alloc`] / [`huge_free`], the preload
//! library's `malloc` and the C ABI's `ck_huge_alloc`.
//!
//! Every block and mapping walks a tier ladder and records the rung it
//! stopped at ([`Backing`]): **hugetlb** (`MAP_HUGETLB`; pages reserved in
//! `/proc/sys/vm/nr_hugepages`; skipped for `CKALLOC_HUGETLB_BACKOFF_MS`
//! after a failure, see [`reset_hugetlb_backoff`]), **THP** (2 MiB-aligned
//! memory advised `MADV_HUGEPAGE`; [`huge_page_coverage`](crate::huge_page_coverage)
//! measures what the kernel gave), **normal pages**. A [`HugeRegion`] is a
//! mapping of its own with [`HugeOptions`].
//!
//! The engine serves [`CkHuge`], the preload library's C API
//! ([`preload`](crate::preload)) and [`huge_alloc`] / `ck_huge_alloc`, each
//! front a `const` [`Policy`]. It manages address space, not mappings:
//! blocks are 2 MiB units of spans of reserved address space, found by
//! address in a lock-free extent map; freed units are retained, purged
//! (`MADV_DONTNEED`) after `CKALLOC_RETAIN_DECAY_MS`, and idle spans
//! unmapped; a block grows over the free units after it or moves its pages
//! with `mremap`. Its rules (a row per [`Policy`] field, a column per
//! front), design and limits are
//! [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md);
//! [`huge_stats`] counts what it did, [`release_retained`] gives back what
//! it retains. Its paths never allocate, lock, panic or print; the
//! environment is read once, without allocating ([`env`](crate::env)).

mod alloc;
mod background;
mod demand;
mod engine;
mod error;
mod extents;
mod fault_check;
mod first_touch;
mod global;
mod ladder;
mod options;
mod os;
mod place;
mod policy;
mod promote;
mod region;
mod relocate;
mod resize;
mod retain;
mod span;
mod stats;
mod upkeep;

pub use crate::tier::Backing;
pub use alloc::{huge_alloc, huge_free};
pub use background::BackgroundThread;
#[doc(hidden)]
pub use engine::{hold_first_touch_base_pages, hold_retained_bytes};
pub use engine::{huge_stats, release_retained, reset_hugetlb_backoff};
pub use error::HugeError;
pub use global::CkHuge;
pub use options::HugeOptions;
pub use policy::{CapRule, FirstTouch, OnMiss, Policy, WhenFull, Zeroing, ZERO_BY_MEMSET_MAX};
pub use region::HugeRegion;
pub use stats::{HugeStats, Syscalls, TierStats};
pub use upkeep::enable_background_thread;

#[cfg(feature = "preload")]
pub(crate) use engine::ResizeError;
pub(crate) use engine::{map_huge, unmap};
#[cfg(any(feature = "capi", feature = "preload"))]
pub(crate) use engine::{Fill, ENGINE};
#[cfg(target_os = "linux")]
pub(crate) use ladder::apply_options;
