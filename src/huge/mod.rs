//! Huge-page memory: the tier ladder, [`HugeRegion`], [`huge_alloc`] /
//! [`huge_free`] and the [`CkHuge`] allocator.
//!
//! # Tiers
//!
//! Every mapping walks a ladder and records the rung it stopped at
//! ([`Backing`]):
//!
//! 1. **hugetlb** — `mmap(MAP_HUGETLB | MAP_HUGE_2MB)` (or `MAP_HUGE_1GB` when
//!    [`HugeOptions::allow_1gib`] is set). Needs pages reserved in
//!    `/proc/sys/vm/nr_hugepages`. After a failure the tier is skipped for a
//!    back-off period
//!    ([`env::hugetlb_backoff_ms`](crate::env::hugetlb_backoff_ms), default
//!    1000 ms) instead of paying a failed system call on every allocation,
//!    as mimalloc does; see [`reset_hugetlb_backoff`].
//! 2. **THP** — anonymous memory over-reserved and trimmed to a 2 MiB-aligned
//!    range, then `madvise(MADV_HUGEPAGE)` (transparent huge pages back only
//!    whole, aligned 2 MiB extents). [`Backing::TransparentHuge`] means the range
//!    is eligible; [`huge_page_coverage`](crate::huge_page_coverage) measures
//!    what the kernel actually gave.
//! 3. **plain pages** — the same aligned mapping without THP advice (THP is
//!    `never`, turned off with `CKALLOC_THP=0`, or `madvise` failed).
//!
//! By default the ladder goes all the way down; [`HugeOptions::require`] turns a
//! lower rung into an error instead. Sizes are rounded up to 2 MiB (1 GiB for
//! 1 GiB hugetlb pages); a rounding that overflows is an error, never a wrap.
//!
//! Nothing on these paths allocates, locks, panics or prints: they are used by
//! the global allocator. The one exception, prefaulting on several threads
//! ([`HugeOptions::populate_threads`]), spawns scoped threads and is only
//! reached from explicit constructors, never from [`CkHuge`] or
//! [`huge_alloc`], whose options are fixed.
//!
//! The environment variables that steer the ladder (`CKALLOC_HUGETLB`,
//! `CKALLOC_THP`, `CKALLOC_HUGETLB_BACKOFF_MS`) are listed in [`env`](crate::env).

mod alloc;
mod error;
mod global;
mod ladder;
mod options;
mod prefault;
mod region;

pub use crate::tier::Backing;
pub use alloc::{huge_alloc, huge_free};
pub use error::HugeError;
pub use global::CkHuge;
pub use ladder::reset_hugetlb_backoff;
pub use options::HugeOptions;
pub use region::HugeRegion;

pub(crate) use ladder::{apply_options, map_huge, unmap, Mapping};
