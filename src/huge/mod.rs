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
//! the global allocator. [`CkHuge`]'s retention cache takes no lock either
//! (slots are claimed with one compare-and-swap and never waited for). The one exception, prefaulting on several threads
//! ([`HugeOptions::populate_threads`]), spawns scoped threads and is only
//! reached from explicit constructors, never from [`CkHuge`] or
//! [`huge_alloc`], whose options are fixed.
//!
//! # Options
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
//! | [`CkHuge::with_threshold`] | 2 MiB | requests of at least this many bytes get a mapping of their own |
//! | [`CkHuge::uncached`], [`CkHuge::retain_max_bytes`] | retain blocks up to the process-wide cap | never retain / retain only blocks up to this length (see [`CkHuge`]'s retention section) |
//!
//! The environment switches of this layer (`CKALLOC_HUGETLB`, `CKALLOC_THP`,
//! `CKALLOC_HUGETLB_BACKOFF_MS`, and `CkHuge`'s `CKALLOC_RETAIN_BYTES` and
//! `CKALLOC_RETAIN_DECAY_MS`) are read once, without allocating, on first
//! use; [`env`](crate::env) lists them with every other variable.
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
//! (THP modes, hugetlb pools, `RLIMIT_MEMLOCK`) and
//! [`huge_stats`] the per-tier counters (mappings, bytes,
//! fallbacks).
//!
//! # What the kernel gave
//!
//! [`huge_page_coverage`](crate::huge_page_coverage) measures a range page
//! by page with the `PAGEMAP_SCAN` ioctl (Linux 6.7+), or per VMA from
//! `/proc/self/smaps` on older kernels
//! ([`HugeCoverage::exact`](crate::HugeCoverage::exact) says which).
//!
//! # Growing
//!
//! [`CkHuge`] grows a mapped block with `mremap`: in place when the address
//! space after it is free, else moved with `MREMAP_FIXED` into an aligned
//! reservation so the alignment is kept. Hugetlb blocks cannot grow that way
//! and are copied.

mod alloc;
mod error;
mod global;
mod ladder;
mod options;
mod prefault;
mod region;
mod retain;
mod stats;

pub use crate::tier::Backing;
pub use alloc::{huge_alloc, huge_free};
pub use error::HugeError;
pub use global::CkHuge;
pub use ladder::reset_hugetlb_backoff;
pub use options::HugeOptions;
pub use region::HugeRegion;
#[doc(hidden)]
pub use retain::hold_retention_slots;
pub use retain::release_retained;
pub use stats::{huge_stats, HugeStats, TierStats};

pub(crate) use ladder::{apply_options, map_huge, unmap, Mapping};
