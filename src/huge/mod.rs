//! Huge-page memory: the tier ladder, [`HugeRegion`], and the huge-page
//! engine behind [`CkHuge`], [`huge_alloc`] / [`huge_free`], the preload
//! library's `malloc` and the C ABI's `ck_huge_alloc`.
//!
//! # Tiers
//!
//! Every block and mapping walks a ladder and records the rung it stopped
//! at ([`Backing`]):
//!
//! 1. **hugetlb** — `mmap(MAP_HUGETLB | MAP_HUGE_2MB)` (or `MAP_HUGE_1GB`
//!    when [`HugeOptions::allow_1gib`] is set). Needs pages reserved in
//!    `/proc/sys/vm/nr_hugepages`. After a failure the tier is skipped for a
//!    back-off period ([`env::hugetlb_backoff_ms`](crate::env::hugetlb_backoff_ms),
//!    default 1000 ms), as mimalloc does; see [`reset_hugetlb_backoff`].
//! 2. **THP** — anonymous memory, 2 MiB aligned, advised `madvise(MADV_HUGEPAGE)`
//!    (transparent huge pages back only whole, aligned 2 MiB extents).
//!    [`Backing::TransparentHuge`] means the range is eligible;
//!    [`huge_page_coverage`](crate::huge_page_coverage) measures what the
//!    kernel gave.
//! 3. **normal pages** — the same without THP advice (THP is `never`,
//!    turned off with `CKALLOC_THP=0`, or `madvise` failed).
//!
//! A [`HugeRegion`] is a mapping of its own, with [`HugeOptions`]; by
//! default its ladder goes all the way down, and [`HugeOptions::require`]
//! turns a lower rung into an error. Sizes are rounded up to 2 MiB (1 GiB
//! for 1 GiB hugetlb pages); a rounding that overflows is an error, never a
//! wrap.
//!
//! # The engine
//!
//! One engine serves three fronts: [`CkHuge`] (Rust, `GlobalAlloc` and
//! `allocator_api2`), the preload library's C API
//! ([`preload`](crate::preload)) and [`huge_alloc`] / `ck_huge_alloc`. It
//! manages address space, not mappings:
//!
//! - **Spans**: it reserves spans of address space (1 GiB of `PROT_NONE`,
//!   or one hugetlb mapping of a block's length) and hands out blocks of
//!   2 MiB units from them, the calling thread's spans first; each span
//!   keeps atomic bitmaps of its units (in use, retained, advised to base
//!   pages), so allocating and freeing take no lock. A span commits its
//!   units read-write from its start on, so its blocks share one VMA
//!   however many there are.
//! - **Blocks**: a block is found from its address alone in the extent map
//!   (a lock-free radix map), whose descriptor holds the block's length,
//!   tail, span and tier: `free`, `realloc` and `malloc_usable_size` need
//!   no size.
//! - **Retention**: a freed block's units keep their pages (retained) for
//!   later requests of any length, up to a cap, and are purged
//!   (`MADV_DONTNEED`) after a delay (`CKALLOC_RETAIN_DECAY_MS`); a purge
//!   keeps the address space. A span none of whose units is in use goes
//!   back to the kernel (`munmap`) after the delay. [`release_retained`]
//!   gives everything back at once.
//! - **Growth**: `realloc` grows a block in place over the free units after
//!   it; else the block's pages move with `mremap` (copied only for
//!   hugetlb, a kernel before 5.7, or a range the kernel will not move).
//!   A shrink frees the units after the new end: it never fails.
//! - **Policies**: what differs between the fronts (first touch, zeroing,
//!   the retention cap, what a full cache does, what a miss takes) is a
//!   [`Policy`] value per front; the table of every rule and every
//!   front's value is
//!   [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md),
//!   the one specification of the engine.
//!
//! Nothing on the engine's paths allocates, locks, panics or prints: they
//! are global allocators. The one exception on this module's paths,
//! prefaulting on several threads ([`HugeOptions::populate_threads`]),
//! spawns scoped threads and is only reached from [`HugeRegion`].
//!
//! # Options of a region
//!
//! | option | default | effect |
//! | --- | --- | --- |
//! | [`HugeOptions::require`] | `Backing::Normal` | fail with [`HugeError::TierUnavailable`] instead of falling below this tier |
//! | [`HugeOptions::hugetlb`] | `true` | try the hugetlb tier at all |
//! | [`HugeOptions::allow_1gib`] | `false` | try 1 GiB hugetlb pages first (the size is rounded up to 1 GiB) |
//! | [`HugeOptions::populate`] | `false` | prefault with `MADV_POPULATE_WRITE` (Linux 5.14+), which reports failure, unlike `MAP_POPULATE` |
//! | [`HugeOptions::populate_threads`] | 1 | prefault on up to `n` threads, each on its own 8 MiB chunks of whole huge pages; 0 = `available_parallelism()` |
//! | [`HugeOptions::mlock`] | `false` | `mlock` the mapping (counts against `RLIMIT_MEMLOCK`) |
//! | [`HugeOptions::numa_node`] | `None` | `mbind(MPOL_BIND)` to one node, before prefaulting |
//! | [`HugeOptions::dont_dump`] | `false` | `MADV_DONTDUMP`: leave the mapping out of core dumps |
//!
//! The environment switches of this layer (`CKALLOC_HUGETLB`, `CKALLOC_THP`,
//! `CKALLOC_HUGETLB_BACKOFF_MS`, `CKALLOC_FIRST_TOUCH_PROBE`,
//! `CKALLOC_RETAIN_BYTES`, `CKALLOC_RETAIN_DECAY_MS`) are read once, without
//! allocating, on first use; [`env`](crate::env) lists them.
//!
//! # Reserving hugetlb pages
//!
//! ```text
//! cat /proc/sys/vm/nr_hugepages                 # 0 on most machines
//! echo 512 | sudo tee /proc/sys/vm/nr_hugepages # 512 x 2 MiB = 1 GiB
//! echo 1 | sudo tee /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages   # one 1 GiB page
//! echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled           # THP on request
//! ```
//!
//! Hugetlb pages are taken from RAM when reserved and never swapped; write 0
//! to give them back. [`probe`](crate::probe) reports the system's state
//! (THP modes, hugetlb pools, `RLIMIT_MEMLOCK`) and [`huge_stats`] the
//! engine's counters (blocks per tier, system calls, spans, retention).
//!
//! # What the kernel gave
//!
//! [`huge_page_coverage`](crate::huge_page_coverage) measures a range page
//! by page with the `PAGEMAP_SCAN` ioctl (Linux 6.7+), or per VMA from
//! `/proc/self/smaps` on older kernels
//! ([`HugeCoverage::exact`](crate::HugeCoverage::exact) says which).

mod alloc;
mod bits;
mod engine;
mod error;
mod extents;
mod first_touch;
mod global;
mod ladder;
mod options;
mod os;
mod place;
mod policy;
mod prefault;
mod region;
mod relocate;
mod retain;
mod span;
mod stats;

pub use crate::tier::Backing;
pub use alloc::{huge_alloc, huge_free};
#[doc(hidden)]
pub use engine::{hold_first_touch_base_pages, hold_retained_bytes};
pub use engine::{huge_stats, release_retained, reset_hugetlb_backoff};
pub use error::HugeError;
pub use global::CkHuge;
pub use options::HugeOptions;
pub use policy::{CapRule, FirstTouch, OnMiss, Policy, WhenFull, Zeroing, ZERO_BY_MEMSET_MAX};
pub use region::HugeRegion;
pub use stats::{HugeStats, Syscalls, TierStats};

#[cfg(feature = "preload")]
pub(crate) use engine::ResizeError;
pub(crate) use engine::{map_huge, unmap};
#[cfg(any(feature = "capi", feature = "preload"))]
pub(crate) use engine::{Fill, ENGINE};
#[cfg(target_os = "linux")]
pub(crate) use ladder::apply_options;
