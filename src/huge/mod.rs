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
//!    back-off period (`CKALLOC_HUGETLB_BACKOFF_MS`, default 1000 ms) instead of
//!    paying a failed system call on every allocation, as mimalloc does; see
//!    [`reset_hugetlb_backoff`].
//! 2. **THP** — anonymous memory over-reserved and trimmed to a 2 MiB-aligned
//!    range, then `madvise(MADV_HUGEPAGE)` (transparent huge pages back only
//!    whole, aligned 2 MiB extents). [`Backing::TransparentHuge`] means the range
//!    is eligible; [`huge_page_coverage`](crate::huge_page_coverage) measures
//!    what the kernel actually gave.
//! 3. **plain pages** — the same aligned mapping without THP advice (THP is
//!    `never`, disabled with `CKALLOC_THP=0`, or `madvise` failed).
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
//!
//! The environment switches of this layer (`CKALLOC_HUGETLB`, `CKALLOC_THP`,
//! `CKALLOC_HUGETLB_BACKOFF_MS`) are read once, without allocating, on first
//! use; the crate's `env` module lists them with every other variable.
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
//! [`huge_stats`](crate::huge_stats) the per-tier counters (mappings, bytes,
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

mod global;
mod region;

pub use global::CkHuge;
pub use region::HugeRegion;

use crate::stats::COUNTERS;
use crate::sys::{self, Advice, HugetlbSize, HUGE_PAGE_1G, HUGE_PAGE_2M};
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// What kind of pages back a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backing {
    /// Base pages (4 KiB on x86-64): no huge-page backing was asked for or
    /// available.
    Normal,
    /// Anonymous memory, 2 MiB aligned, advised with `MADV_HUGEPAGE`: the
    /// kernel backs aligned 2 MiB extents with transparent huge pages when it
    /// can (at fault time or later by khugepaged).
    TransparentHuge,
    /// Explicit hugetlb pages (`MAP_HUGETLB`), reserved up front; never split
    /// or swapped.
    Hugetlb,
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backing::Normal => "normal pages",
            Backing::TransparentHuge => "THP",
            Backing::Hugetlb => "hugetlb",
        })
    }
}

/// Options for a huge-page mapping (a small `const` builder).
///
/// ```
/// use ckalloc::{Backing, HugeOptions, HugeRegion};
/// let opts = HugeOptions::new().populate(true);
/// let region = HugeRegion::with_options(4 << 20, &opts).unwrap();
/// assert!(region.backing() >= Backing::Normal);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugeOptions {
    require: Backing,
    hugetlb: bool,
    gigantic: bool,
    populate: bool,
    populate_threads: usize,
    mlock: bool,
    numa_node: Option<u32>,
    dont_dump: bool,
}

impl Default for HugeOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl HugeOptions {
    /// Defaults: try hugetlb (2 MiB), then THP, then plain pages; no 1 GiB
    /// pages, no prefault (one thread when enabled), no `mlock`, no NUMA
    /// binding.
    pub const fn new() -> Self {
        HugeOptions {
            require: Backing::Normal,
            hugetlb: true,
            gigantic: false,
            populate: false,
            populate_threads: 1,
            mlock: false,
            numa_node: None,
            dont_dump: false,
        }
    }

    /// Fail with [`HugeError::TierUnavailable`] instead of falling below
    /// `tier`. `Backing::Normal` (the default) accepts any tier.
    pub const fn require(mut self, tier: Backing) -> Self {
        self.require = tier;
        self
    }

    /// Whether to try the hugetlb tier at all (default `true`).
    pub const fn hugetlb(mut self, yes: bool) -> Self {
        self.hugetlb = yes;
        self
    }

    /// Allow 1 GiB hugetlb pages (`MAP_HUGE_1GB`, tried before 2 MiB pages);
    /// the mapping is then rounded up to 1 GiB. Default `false`.
    pub const fn allow_1gib(mut self, yes: bool) -> Self {
        self.gigantic = yes;
        self
    }

    /// Prefault every page with `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+),
    /// after NUMA binding. Unlike `MAP_POPULATE` this reports failure (for
    /// example `ENOMEM` under a cgroup limit) as [`HugeError::Populate`].
    /// Default `false`.
    pub const fn populate(mut self, yes: bool) -> Self {
        self.populate = yes;
        self
    }

    /// Prefault as [`populate(true)`](Self::populate) does, with up to
    /// `threads` threads working on disjoint chunks of the mapping at once.
    ///
    /// The kernel zeroes each page at first touch; for huge pages that
    /// clearing is most of the mapping's cost and runs on the faulting CPU,
    /// so one thread is bound by what one core can clear. On an idle 2-core
    /// VM (README, "Performance") two threads prefault 256 MiB of THP memory
    /// about 1.9× and 1 GiB about 1.7× faster than one. The gain needs idle
    /// cores: with both cores busy, two threads take as long as one.
    ///
    /// - **Count**: `threads == 1` (the default) prefaults on the calling
    ///   thread with one `madvise(MADV_POPULATE_WRITE)`, as `populate(true)`
    ///   does; `threads == 0` means [`std::thread::available_parallelism`].
    ///   The count actually used is at most `available_parallelism` and at
    ///   most one per chunk: a mapping of one chunk (8 MiB or less) is
    ///   prefaulted by the calling thread alone.
    /// - **Chunks**: the mapping is cut at multiples of 8 MiB in address
    ///   space (of 1 GiB for 1 GiB hugetlb pages), so a chunk holds whole huge
    ///   pages and no huge page is faulted by two threads. The threads take
    ///   chunks from a shared counter, one `madvise` per chunk, until none is
    ///   left: a thread that starts late or is scheduled out holds back at
    ///   most one chunk.
    /// - **Threads**: the calling thread works too; the others are
    ///   `threads - 1` scoped threads (`std::thread::scope`, 64 KiB stacks),
    ///   all joined before the constructor returns, so no thread outlives
    ///   the call and the mapping is not visible to anyone before every chunk
    ///   is done. A thread that cannot be spawned is not an error: the others
    ///   take its chunks.
    /// - **Errors**: if any chunk fails, no new chunk is started, and after
    ///   every thread has been joined the call fails with
    ///   [`HugeError::Populate`] (the error of the lowest failed chunk, the
    ///   full mapping length); the mapping is released, so no partially
    ///   prefaulted region is returned.
    /// - **Where**: spawning threads allocates, so this is only for explicit
    ///   constructors ([`HugeRegion::with_options`], the arena's
    ///   [`huge`](crate::ArenaBuilder::huge) options); the global-allocator
    ///   path ([`CkHuge`], [`huge_alloc`], the C ABI) uses fixed options that
    ///   never prefault.
    ///
    /// A later `populate(false)` turns prefaulting off again.
    ///
    /// ```
    /// use ckalloc::{HugeOptions, HugeRegion};
    /// // 64 MiB, resident before `with_options` returns, cleared by 2 threads.
    /// let opts = HugeOptions::new().populate_threads(2);
    /// let region = HugeRegion::with_options(64 << 20, &opts).unwrap();
    /// assert!(region.coverage().unwrap().mapped_bytes >= 64 << 20);
    /// ```
    pub const fn populate_threads(mut self, threads: usize) -> Self {
        self.populate = true;
        self.populate_threads = threads;
        self
    }

    /// Lock the mapping into RAM with `mlock` (counts against
    /// `RLIMIT_MEMLOCK`). Default `false`.
    pub const fn mlock(mut self, yes: bool) -> Self {
        self.mlock = yes;
        self
    }

    /// Bind the mapping to a NUMA node (`mbind(MPOL_BIND)`). Default `None`.
    pub const fn numa_node(mut self, node: Option<u32>) -> Self {
        self.numa_node = node;
        self
    }

    /// Leave the mapping out of core dumps (`MADV_DONTDUMP`). Default `false`.
    pub const fn dont_dump(mut self, yes: bool) -> Self {
        self.dont_dump = yes;
        self
    }

    /// The minimum tier this configuration accepts.
    pub const fn required_tier(&self) -> Backing {
        self.require
    }

    /// Whether prefaulting is enabled.
    pub const fn populates(&self) -> bool {
        self.populate
    }

    /// The prefault thread count asked for with
    /// [`populate_threads`](Self::populate_threads) (1 by default; 0 means
    /// `available_parallelism`). Only meaningful when [`populates`](Self::populates).
    pub const fn populate_thread_limit(&self) -> usize {
        self.populate_threads
    }
}

/// Why a huge-page mapping failed. Every variant names the request (bytes)
/// and, where the OS refused, the errno and a remedy.
#[derive(Debug)]
#[non_exhaustive]
pub enum HugeError {
    /// A zero-byte request.
    ZeroSize,
    /// `requested` bytes cannot be rounded up to the page size without
    /// overflowing, or exceed `isize::MAX`.
    TooLarge {
        /// Requested bytes.
        requested: usize,
    },
    /// The alignment is not a power of two.
    BadAlignment {
        /// Requested alignment in bytes.
        align: usize,
    },
    /// The kernel refused the mapping itself (`mmap`).
    Map {
        /// Requested bytes.
        requested: usize,
        /// Bytes the mapping would have covered.
        mapped_len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// [`HugeOptions::require`] asked for a tier that is not available.
    TierUnavailable {
        /// Requested bytes.
        requested: usize,
        /// The tier that was required.
        required: Backing,
        /// The error of the last attempt at that tier, if one was made.
        source: Option<io::Error>,
    },
    /// NUMA binding failed.
    Mbind {
        /// The node asked for.
        node: u32,
        /// The OS error.
        source: io::Error,
    },
    /// Prefaulting (`MADV_POPULATE_WRITE`) failed.
    Populate {
        /// Bytes that were to be prefaulted.
        bytes: usize,
        /// The OS error.
        source: io::Error,
    },
    /// `mlock` failed.
    Mlock {
        /// Bytes that were to be locked.
        bytes: usize,
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for HugeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HugeError::ZeroSize => write!(f, "huge-page allocation of 0 bytes"),
            HugeError::TooLarge { requested } => write!(
                f,
                "huge-page allocation of {requested} bytes: rounding up to the page size overflows \
                 or exceeds isize::MAX"
            ),
            HugeError::BadAlignment { align } => {
                write!(f, "alignment {align} is not a power of two")
            }
            HugeError::Map {
                requested,
                mapped_len,
                source,
            } => write!(
                f,
                "mmap of {mapped_len} bytes (for {requested} requested) failed: {source}; \
                 check RLIMIT_AS, vm.overcommit_memory and the cgroup memory limit"
            ),
            HugeError::TierUnavailable {
                requested,
                required,
                source,
            } => {
                write!(
                    f,
                    "{required} pages required for {requested} bytes but not available"
                )?;
                if let Some(e) = source {
                    write!(f, " ({e})")?;
                }
                match required {
                    Backing::Hugetlb => write!(
                        f,
                        "; reserve pages, e.g. `echo 512 > /proc/sys/vm/nr_hugepages` \
                         (1 GiB pages: /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages)"
                    ),
                    Backing::TransparentHuge => write!(
                        f,
                        "; enable THP: `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` \
                         and unset CKALLOC_THP=0"
                    ),
                    Backing::Normal => Ok(()),
                }
            }
            HugeError::Mbind { node, source } => write!(
                f,
                "binding to NUMA node {node} failed: {source}; check the node exists \
                 (/sys/devices/system/node) and the cpuset allows it"
            ),
            HugeError::Populate { bytes, source } => write!(
                f,
                "prefaulting {bytes} bytes (MADV_POPULATE_WRITE) failed: {source}; \
                 the memory or cgroup limit is too low, or the kernel is older than 5.14"
            ),
            HugeError::Mlock { bytes, source } => write!(
                f,
                "mlock of {bytes} bytes failed: {source}; raise RLIMIT_MEMLOCK (`ulimit -l`) \
                 or run with CAP_IPC_LOCK"
            ),
        }
    }
}

impl std::error::Error for HugeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HugeError::Map { source, .. }
            | HugeError::Mbind { source, .. }
            | HugeError::Populate { source, .. }
            | HugeError::Mlock { source, .. } => Some(source),
            HugeError::TierUnavailable {
                source: Some(s), ..
            } => Some(s),
            _ => None,
        }
    }
}

/// One mapping produced by the ladder.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub ptr: NonNull<u8>,
    pub mapped_len: usize,
    pub backing: Backing,
    /// Page size of the backing: 2 MiB or 1 GiB for hugetlb, else the base page.
    pub page_size: usize,
}

// ---- process-wide knobs (read once from the environment, without allocating)

const ENV_UNREAD: u8 = 0;
const ENV_OFF: u8 = 1;
const ENV_ON: u8 = 2;

static HUGETLB_ENV: AtomicU8 = AtomicU8::new(ENV_UNREAD);
static THP_ENV: AtomicU8 = AtomicU8::new(ENV_UNREAD);
static HUGETLB_RETRY_AT_NS: AtomicU64 = AtomicU64::new(0);
static BACKOFF_NS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Whether an environment flag is set, by C-Kernel-Engine's rule (which the
/// `CK_BUMP_*` variables must follow exactly): present and not empty, `0`,
/// `false` or `no` (case-insensitive, no trimming).
pub(crate) fn env_flag(value: Option<&[u8]>) -> bool {
    match value {
        None => false,
        Some(v) => {
            !(v.is_empty()
                || v == b"0"
                || v.eq_ignore_ascii_case(b"false")
                || v.eq_ignore_ascii_case(b"no"))
        }
    }
}

/// An on/off knob that defaults to on: off only when set to a false value.
fn knob_enabled(cache: &AtomicU8, name: &std::ffi::CStr) -> bool {
    match cache.load(Ordering::Relaxed) {
        ENV_ON => true,
        ENV_OFF => false,
        _ => {
            // `off` also counts as false here (docs/arena.md), unlike the
            // seed's `CK_BUMP_*` rule in `env_flag`.
            let on = match sys::getenv(name) {
                None => true,
                Some(v) => env_flag(Some(v)) && !v.eq_ignore_ascii_case(b"off"),
            };
            cache.store(if on { ENV_ON } else { ENV_OFF }, Ordering::Relaxed);
            on
        }
    }
}

fn hugetlb_enabled() -> bool {
    knob_enabled(&HUGETLB_ENV, c"CKALLOC_HUGETLB")
}

/// THP is usable when `CKALLOC_THP` is not false and the kernel's mode is not
/// `never` (read once from `/sys/kernel/mm/transparent_hugepage/enabled`).
pub(crate) fn thp_enabled() -> bool {
    if !knob_enabled(&THP_ENV, c"CKALLOC_THP") {
        return false;
    }
    !matches!(thp_mode(), ThpMode::Never | ThpMode::Unsupported)
}

/// The kernel's THP mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ThpMode {
    Always,
    Madvise,
    Never,
    Unsupported,
}

fn thp_mode() -> ThpMode {
    static MODE: AtomicU8 = AtomicU8::new(0);
    let m = MODE.load(Ordering::Relaxed);
    let decode = |m| match m {
        1 => ThpMode::Always,
        2 => ThpMode::Madvise,
        3 => ThpMode::Never,
        _ => ThpMode::Unsupported,
    };
    if m != 0 {
        return decode(m);
    }
    let mut buf = [0u8; 128];
    let m = match sys::read_small_file(c"/sys/kernel/mm/transparent_hugepage/enabled", &mut buf) {
        Some(text) => match selected_word(text) {
            Some(b"always") => 1,
            Some(b"madvise") => 2,
            Some(b"never") => 3,
            _ => 4,
        },
        None => 4,
    };
    MODE.store(m, Ordering::Relaxed);
    decode(m)
}

/// The bracketed word of a sysfs choice file: `always [madvise] never`.
pub(crate) fn selected_word(text: &[u8]) -> Option<&[u8]> {
    let open = text.iter().position(|&b| b == b'[')?;
    let close = text[open..].iter().position(|&b| b == b']')? + open;
    Some(&text[open + 1..close])
}

fn backoff_ns() -> u64 {
    let b = BACKOFF_NS.load(Ordering::Relaxed);
    if b != u64::MAX {
        return b;
    }
    let ms = sys::getenv(c"CKALLOC_HUGETLB_BACKOFF_MS")
        .and_then(parse_u64)
        .unwrap_or(1000);
    let ns = ms.saturating_mul(1_000_000);
    BACKOFF_NS.store(ns, Ordering::Relaxed);
    ns
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

fn hugetlb_backing_off() -> bool {
    let until = HUGETLB_RETRY_AT_NS.load(Ordering::Relaxed);
    until != 0 && sys::monotonic_ns() < until
}

fn start_hugetlb_backoff() {
    let until = sys::monotonic_ns().saturating_add(backoff_ns());
    HUGETLB_RETRY_AT_NS.store(until.max(1), Ordering::Relaxed);
}

/// Forget a previous hugetlb failure so the next allocation tries the
/// hugetlb tier again at once (for example after reserving pages).
pub fn reset_hugetlb_backoff() {
    HUGETLB_RETRY_AT_NS.store(0, Ordering::Relaxed);
}

// ---- the ladder

/// Map `bytes` (rounded up to 2 MiB, or 1 GiB for gigantic pages) aligned to
/// at least `align` bytes, walking the tier ladder. Never allocates.
pub(crate) fn map_huge(
    bytes: usize,
    align: usize,
    opts: &HugeOptions,
) -> Result<Mapping, HugeError> {
    if bytes == 0 {
        return Err(HugeError::ZeroSize);
    }
    if !align.is_power_of_two() {
        return Err(HugeError::BadAlignment { align });
    }
    let too_large = HugeError::TooLarge { requested: bytes };
    let len_2m = match sys::round_up(bytes, HUGE_PAGE_2M) {
        Some(l) if l <= isize::MAX as usize => l,
        _ => return Err(too_large),
    };
    let align = align.max(HUGE_PAGE_2M);
    // Aligning needs up to `align` bytes of slack in the address space; an
    // alignment that cannot fit is the request's fault, not the kernel's.
    if len_2m
        .checked_add(align)
        .is_none_or(|n| n > isize::MAX as usize)
    {
        return Err(too_large);
    }

    // Tier 1: hugetlb. hugetlb mappings are aligned to their page size, so
    // larger alignments skip the tier.
    let mut hugetlb_err = None;
    let want_hugetlb = opts.hugetlb && (opts.require == Backing::Hugetlb || hugetlb_enabled());
    if want_hugetlb && (opts.require == Backing::Hugetlb || !hugetlb_backing_off()) {
        if opts.gigantic && align <= HUGE_PAGE_1G {
            if let Some(len_1g) =
                sys::round_up(bytes, HUGE_PAGE_1G).filter(|&l| l <= isize::MAX as usize)
            {
                match sys::map_hugetlb(len_1g, HugetlbSize::Size1G) {
                    Ok(ptr) => {
                        return finish(bytes, ptr, len_1g, Backing::Hugetlb, HUGE_PAGE_1G, opts)
                    }
                    Err(e) => {
                        COUNTERS.hugetlb_fallbacks.fetch_add(1, Ordering::Relaxed);
                        hugetlb_err = Some(e);
                    }
                }
            }
        }
        if align <= HUGE_PAGE_2M {
            match sys::map_hugetlb(len_2m, HugetlbSize::Size2M) {
                Ok(ptr) => return finish(bytes, ptr, len_2m, Backing::Hugetlb, HUGE_PAGE_2M, opts),
                Err(e) => {
                    COUNTERS.hugetlb_fallbacks.fetch_add(1, Ordering::Relaxed);
                    start_hugetlb_backoff();
                    hugetlb_err = Some(e);
                }
            }
        }
    } else if want_hugetlb {
        COUNTERS.hugetlb_skipped.fetch_add(1, Ordering::Relaxed);
    }
    if opts.require == Backing::Hugetlb {
        return Err(HugeError::TierUnavailable {
            requested: bytes,
            required: Backing::Hugetlb,
            source: hugetlb_err,
        });
    }

    // Tiers 2 and 3 share one aligned anonymous mapping; only the advice
    // differs, so a failed mapping here is final.
    let ptr = sys::map_anon_aligned(len_2m, align).map_err(|source| HugeError::Map {
        requested: bytes,
        mapped_len: len_2m,
        source,
    })?;
    let (backing, thp_err) = if thp_enabled() {
        match sys::madvise(ptr.as_ptr(), len_2m, Advice::HugePage) {
            Ok(()) => (Backing::TransparentHuge, None),
            Err(e) => {
                COUNTERS.thp_fallbacks.fetch_add(1, Ordering::Relaxed);
                (Backing::Normal, Some(e))
            }
        }
    } else {
        (Backing::Normal, None)
    };
    if backing < opts.require {
        let _ = sys::munmap_best_effort(ptr.as_ptr(), len_2m);
        return Err(HugeError::TierUnavailable {
            requested: bytes,
            required: opts.require,
            source: thp_err,
        });
    }
    finish(bytes, ptr, len_2m, backing, sys::page_size(), opts)
}

/// Apply the post-mapping options (bind, prefault, lock, dump) and count the
/// mapping. On failure the mapping is released.
fn finish(
    bytes: usize,
    ptr: NonNull<u8>,
    mapped_len: usize,
    backing: Backing,
    page_size: usize,
    opts: &HugeOptions,
) -> Result<Mapping, HugeError> {
    // Prefault pieces never split a huge page between two threads.
    let granule = page_size.max(HUGE_PAGE_2M);
    if let Err(e) = apply_options_paged(ptr, mapped_len, granule, opts) {
        let _ = sys::munmap_best_effort(ptr.as_ptr(), mapped_len);
        return Err(e);
    }
    let _ = bytes;
    COUNTERS.record_map(backing, mapped_len);
    Ok(Mapping {
        ptr,
        mapped_len,
        backing,
        page_size,
    })
}

/// Bind, prefault, lock and mark a fresh range as the options ask.
/// Parallel prefault splits the range on 2 MiB boundaries.
pub(crate) fn apply_options(
    ptr: NonNull<u8>,
    len: usize,
    opts: &HugeOptions,
) -> Result<(), HugeError> {
    apply_options_paged(ptr, len, HUGE_PAGE_2M, opts)
}

/// [`apply_options`] with the huge page size of the range (`granule`, a power
/// of two): parallel prefault pieces start and end on multiples of it.
fn apply_options_paged(
    ptr: NonNull<u8>,
    len: usize,
    granule: usize,
    opts: &HugeOptions,
) -> Result<(), HugeError> {
    if let Some(node) = opts.numa_node {
        sys::mbind(ptr.as_ptr(), len, node).map_err(|source| HugeError::Mbind { node, source })?;
    }
    if opts.populate {
        populate(ptr, len, granule, opts.populate_threads)
            .map_err(|source| HugeError::Populate { bytes: len, source })?;
    }
    if opts.mlock {
        sys::mlock(ptr.as_ptr(), len).map_err(|source| HugeError::Mlock { bytes: len, source })?;
    }
    if opts.dont_dump {
        // Only a hint for core dumps: failure loses nothing.
        let _ = sys::madvise(ptr.as_ptr(), len, Advice::DontDump);
    }
    Ok(())
}

/// Bytes a prefault thread takes at a time (at least one huge page): small
/// enough that a thread the scheduler delays holds back little work, large
/// enough that the `madvise` calls cost nothing next to clearing the pages.
const POPULATE_CHUNK: usize = 8 << 20;

/// An address range handed to `madvise` only, from any thread.
#[derive(Clone, Copy)]
struct Piece {
    addr: *mut u8,
    len: usize,
}

// SAFETY: the address is only passed to `madvise(MADV_POPULATE_WRITE)`, which
// faults the pages in without reading or writing through the pointer; the
// range belongs to a mapping the spawning call owns and keeps alive until
// every thread has been joined.
unsafe impl Send for Piece {}

impl Piece {
    /// `len` bytes from `offset`, which the caller keeps inside this piece.
    fn sub(&self, offset: usize, len: usize) -> Piece {
        debug_assert!(offset.checked_add(len).is_some_and(|e| e <= self.len));
        Piece {
            // Inside the piece; the pointer is only handed to `madvise`.
            addr: self.addr.wrapping_add(offset),
            len,
        }
    }

    fn populate(&self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        sys::madvise(self.addr, self.len, Advice::PopulateWrite)
    }
}

/// `start..start+len` cut at the multiples of `chunk` (a power of two) in
/// address space: chunk `i` covers `base + i * chunk .. base + (i + 1) *
/// chunk`, clipped to the range.
#[derive(Clone, Copy, Debug)]
struct Chunks {
    start: usize,
    len: usize,
    /// `start` rounded down to `chunk`.
    base: usize,
    chunk: usize,
    count: usize,
}

impl Chunks {
    /// `None` when the end of the range, rounded up, overflows (never for a
    /// real mapping).
    fn new(start: usize, len: usize, chunk: usize) -> Option<Chunks> {
        let base = start & !(chunk - 1);
        let top = sys::round_up(start.checked_add(len)?, chunk)?;
        Some(Chunks {
            start,
            len,
            base,
            chunk,
            count: (top - base) / chunk,
        })
    }

    /// Offset from `start` and length of chunk `i` (`i < count`).
    fn get(&self, i: usize) -> (usize, usize) {
        // `base + count * chunk` was computed without overflow in `new`.
        let at = |k: usize| {
            k.checked_mul(self.chunk)
                .and_then(|o| self.base.checked_add(o))
                .map_or(self.len, |a| a.saturating_sub(self.start).min(self.len))
        };
        let (lo, hi) = (at(i), at(i + 1));
        (lo, hi - lo)
    }
}

/// How many threads prefault `chunks` chunks when `asked` were asked for (0:
/// all cores): at most `available_parallelism`, at most one per chunk.
fn populate_thread_count(asked: usize, chunks: usize) -> usize {
    if asked == 1 || chunks <= 1 {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let asked = if asked == 0 { cores } else { asked.min(cores) };
    asked.min(chunks).max(1)
}

/// Prefault `ptr..ptr+len` with `MADV_POPULATE_WRITE` on up to `threads`
/// threads (see [`HugeOptions::populate_threads`]): the calling thread and
/// its helpers take chunks of [`POPULATE_CHUNK`] bytes (at least `granule`,
/// the huge page size) from a shared counter until none is left, so a helper
/// that starts late or is scheduled out holds back at most one chunk. After
/// a failure no new chunk is started; the error of the lowest failed chunk
/// is returned once every thread has been joined.
fn populate(ptr: NonNull<u8>, len: usize, granule: usize, threads: usize) -> io::Result<()> {
    let whole = Piece {
        addr: ptr.as_ptr(),
        len,
    };
    if threads == 1 {
        return whole.populate();
    }
    let chunks = Chunks::new(ptr.as_ptr() as usize, len, granule.max(POPULATE_CHUNK))
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let n = populate_thread_count(threads, chunks.count);
    if n <= 1 {
        return whole.populate();
    }
    // A new thread maps memory while it starts (its malloc arena, its signal
    // stack), and each such `mmap` needs the mmap_lock for writing, which a
    // running MADV_POPULATE_WRITE holds for reading. So the calling thread
    // waits, briefly, until the helpers run before it takes a chunk; a helper
    // the scheduler has not started by then costs at most [`START_WAIT`]
    // here, and later waits for at most one chunk per `mmap` (one call per
    // chunk; one call per half would have made it wait for a whole half).
    const START_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
    let started = AtomicUsize::new(0);
    let started = &started;
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (next, failed) = (&next, &failed);
    let work = move || -> Option<(usize, io::Error)> {
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= chunks.count {
                break;
            }
            let (offset, len) = chunks.get(i);
            if let Err(e) = whole.sub(offset, len).populate() {
                failed.store(true, Ordering::Relaxed);
                return Some((i, e));
            }
        }
        None
    };
    std::thread::scope(|scope| {
        // A helper that cannot be spawned (EAGAIN, a thread limit) is not
        // an error: the others, and this thread, take its chunks.
        let helpers: Vec<_> = (1..n)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .stack_size(64 << 10)
                    .spawn_scoped(scope, move || {
                        started.fetch_add(1, Ordering::Relaxed);
                        work()
                    })
                    .ok()
            })
            .collect();
        let since = std::time::Instant::now();
        while started.load(Ordering::Relaxed) < helpers.len() && since.elapsed() < START_WAIT {
            std::thread::yield_now();
        }
        let mut first = work();
        for helper in helpers {
            let failure = helper.join().unwrap_or_else(|_| {
                Some((usize::MAX, io::Error::other("a prefault thread panicked")))
            });
            if let Some((i, e)) = failure {
                if first.as_ref().is_none_or(|(j, _)| i < *j) {
                    first = Some((i, e));
                }
            }
        }
        first.map_or(Ok(()), |(_, e)| Err(e))
    })
}

/// Unmap a ladder mapping and count it.
pub(crate) fn unmap(ptr: NonNull<u8>, mapped_len: usize) {
    if sys::munmap_best_effort(ptr.as_ptr(), mapped_len).is_ok() {
        COUNTERS.record_unmap(mapped_len);
    }
}

/// Allocate `bytes` of zeroed huge-page memory (C-Kernel-Engine's `ck_huge_alloc`).
///
/// The size is rounded up to 2 MiB; the block is 2 MiB aligned. Tiers:
/// hugetlb, then THP, then plain pages (see the [module docs](self)). Returns
/// `None` for 0 bytes, a size whose rounding overflows or exceeds
/// `isize::MAX`, or when the kernel refuses the mapping. Thread-safe; never
/// allocates on the heap. Release with [`huge_free`] and the same `bytes`.
pub fn huge_alloc(bytes: usize) -> Option<NonNull<u8>> {
    map_huge(bytes, HUGE_PAGE_2M, &HugeOptions::new())
        .ok()
        .map(|m| m.ptr)
}

/// Release a block from [`huge_alloc`]: unmaps `bytes` rounded up to 2 MiB,
/// which is exactly what was mapped whatever tier served it (no global list
/// or lock). `bytes == 0` or an unroundable size does nothing (no block of
/// that size can exist).
///
/// # Safety
/// `ptr` must come from `huge_alloc(bytes)` with the same `bytes`, not be
/// freed already, and no reference into the block may be used afterwards.
pub unsafe fn huge_free(ptr: NonNull<u8>, bytes: usize) {
    if bytes == 0 {
        return;
    }
    if let Some(len) = sys::round_up(bytes, HUGE_PAGE_2M) {
        unmap(ptr, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M2: usize = HUGE_PAGE_2M;

    /// Every chunk of `start..start+len`, checked to be consecutive, to
    /// cover the range and to end on multiples of `chunk`.
    fn check(start: usize, len: usize, chunk: usize) -> Vec<(usize, usize)> {
        let c = Chunks::new(start, len, chunk).unwrap();
        let all: Vec<_> = (0..c.count).map(|i| c.get(i)).collect();
        let mut next = 0;
        for &(off, l) in &all {
            assert_eq!(off, next, "consecutive: {all:?}");
            assert!(l > 0 && l <= chunk, "{all:?}");
            next = off + l;
            if next < len {
                assert_eq!((start + next) % chunk, 0, "aligned boundary: {all:?}");
            }
        }
        assert_eq!(next, len, "cover the range: {all:?}");
        all
    }

    #[test]
    fn chunks_aligned_and_odd() {
        let c = 4 * M2;
        assert_eq!(check(0x4000_0000, 8 * M2, c), [(0, c), (c, c)]);
        // A 10 MiB mapping: one whole chunk and a 2 MiB tail.
        assert_eq!(check(0x4000_0000, 5 * M2, c), [(0, c), (c, M2)]);
        assert_eq!(check(0x4000_0000, M2, c), [(0, M2)]);
        // 3 GiB of 1 GiB pages: one page per chunk.
        let g = HUGE_PAGE_1G;
        assert_eq!(check(4 * g, 3 * g, g), [(0, g), (g, g), (2 * g, g)]);
    }

    #[test]
    fn chunks_unaligned_start_keep_absolute_boundaries() {
        // An arena runtime range that starts 4 KiB past a 2 MiB boundary.
        let s = 0x4000_0000 + 4096;
        let all = check(s, 6 * M2, M2);
        assert_eq!(all.len(), 7);
        assert_eq!(all[0], (0, M2 - 4096));
        assert_eq!(all[6], (6 * M2 - 4096, 4096));
    }

    #[test]
    fn chunks_overflow_is_none() {
        assert!(Chunks::new(usize::MAX - M2, 2 * M2, M2).is_none());
        assert!(Chunks::new(usize::MAX - M2 + 2, M2 - 4, M2).is_none());
    }

    #[test]
    fn thread_count_limits() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(populate_thread_count(1, 128), 1);
        assert_eq!(populate_thread_count(8, 1), 1, "one chunk, one thread");
        assert_eq!(populate_thread_count(0, 128), cores);
        assert_eq!(populate_thread_count(usize::MAX, 128), cores);
        assert_eq!(populate_thread_count(2, 2), cores.min(2));
        assert_eq!(populate_thread_count(64, 3), cores.min(3));
    }

    #[test]
    fn populate_threads_builder() {
        let o = HugeOptions::new();
        assert!(!o.populates());
        assert_eq!(o.populate_thread_limit(), 1);
        let o = o.populate_threads(3);
        assert!(o.populates());
        assert_eq!(o.populate_thread_limit(), 3);
        assert!(!o.populate(false).populates());
    }
}
