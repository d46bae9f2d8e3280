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
    /// `threads` threads working on disjoint pieces of the mapping at once.
    ///
    /// The kernel zeroes each page at first touch; for huge pages that
    /// clearing is most of the mapping's cost and runs on the faulting CPU,
    /// so one thread is bound by what one core can clear. On an idle 2-core
    /// VM (README, "Performance") two threads prefault 256 MiB of THP memory in
    /// 24 ms instead of 46 ms, 1 GiB in 94 ms instead of 157 ms, and 2 GiB of
    /// 1 GiB hugetlb pages in 204 ms instead of 363 ms. The gain needs idle
    /// cores: with the other core busy, two threads took as long as one.
    ///
    /// - **Count**: `threads == 1` (the default) prefaults on the calling
    ///   thread with one `madvise(MADV_POPULATE_WRITE)`, as `populate(true)`
    ///   does; `threads == 0` means [`std::thread::available_parallelism`].
    ///   The count actually used is at most `available_parallelism` and at
    ///   most one per huge page (2 MiB, or 1 GiB for 1 GiB hugetlb pages) of
    ///   the mapping: a 2 MiB mapping is always prefaulted by one thread.
    /// - **Pieces**: the mapping is split into that many ranges of whole huge
    ///   pages (boundaries on 2 MiB, or 1 GiB, addresses), so no huge page is
    ///   faulted by two threads; each range gets one
    ///   `madvise(MADV_POPULATE_WRITE)`.
    /// - **Threads**: the calling thread prefaults the first piece; the others
    ///   run on `threads - 1` scoped threads (`std::thread::scope`, 64 KiB
    ///   stacks) that are all joined before the constructor returns, so no
    ///   thread outlives the call and the mapping is not visible to anyone
    ///   before every piece is done. A thread that cannot be spawned is not an
    ///   error: its piece is prefaulted on the calling thread.
    /// - **Errors**: if any piece fails, the whole call fails with
    ///   [`HugeError::Populate`] naming the full mapping length, and the
    ///   mapping is released (no partially prefaulted region is returned).
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

/// One piece of a parallel prefault: an address range handed to another
/// thread for `madvise` only.
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
    fn populate(&self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        sys::madvise(self.addr, self.len, Advice::PopulateWrite)
    }
}

/// How many threads prefault `len` bytes when `asked` were asked for (0: all
/// cores): at most `available_parallelism`, at most one per `granule`.
fn populate_thread_count(asked: usize, len: usize, granule: usize) -> usize {
    if asked == 1 || len <= granule {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let asked = if asked == 0 { cores } else { asked.min(cores) };
    asked.min(len.div_ceil(granule)).max(1)
}

/// Split `start..start+len` into `n` consecutive pieces (offset from `start`,
/// length) whose inner boundaries are multiples of `granule` (a power of
/// two) in address space, as even as whole granules allow. Pieces may be
/// empty at the end. `None` when a step overflows (never for a real mapping).
fn split_pieces(start: usize, len: usize, granule: usize, n: usize) -> Option<Vec<(usize, usize)>> {
    let per = sys::round_up(len.div_ceil(n.max(1)), granule)?;
    let end = start.checked_add(len)?;
    let mut pieces = Vec::with_capacity(n);
    let mut from = 0;
    for k in 1..=n {
        let to = if k == n {
            len
        } else {
            let at = sys::round_up(start.checked_add(k.checked_mul(per)?)?, granule)?;
            at.min(end) - start
        };
        pieces.push((from, to - from));
        from = to;
    }
    Some(pieces)
}

/// Prefault `ptr..ptr+len` with `MADV_POPULATE_WRITE`, on up to `threads`
/// threads (see [`HugeOptions::populate_threads`]). Piece boundaries are
/// multiples of `granule` (a power of two) in address space. The first error
/// in address order is returned after every thread has been joined.
fn populate(ptr: NonNull<u8>, len: usize, granule: usize, threads: usize) -> io::Result<()> {
    let n = populate_thread_count(threads, len, granule);
    let whole = Piece {
        addr: ptr.as_ptr(),
        len,
    };
    if n <= 1 {
        return whole.populate();
    }
    let split = split_pieces(ptr.as_ptr() as usize, len, granule, n)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let pieces = split.into_iter().map(|(offset, len)| Piece {
        // `offset + len <= len of the mapping`: inside it; the pointer is
        // only handed to `madvise`.
        addr: ptr.as_ptr().wrapping_add(offset),
        len,
    });
    let mut pieces = pieces;
    let Some(first) = pieces.next() else {
        return Ok(());
    };
    // A start gate. A new thread maps memory while it starts (its malloc
    // arena, its signal stack); `mmap` takes the process's mmap_lock for
    // writing, so it would wait until a running MADV_POPULATE_WRITE (which
    // holds the lock for reading) had finished, and the pieces would run one
    // after the other. So every helper first reports that it runs, and no
    // piece starts before all helpers have.
    let started = AtomicUsize::new(0);
    let go = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Per other piece: its thread, or the piece itself when no thread
        // could be spawned (EAGAIN, a thread limit): it then runs here.
        let mut others = Vec::with_capacity(n - 1);
        for piece in pieces {
            let (started, go) = (&started, &go);
            let spawned = std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn_scoped(scope, move || {
                    started.fetch_add(1, Ordering::Release);
                    while !go.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    piece.populate()
                });
            others.push(spawned.map_err(|_| piece));
        }
        let helpers = others.iter().filter(|o| o.is_ok()).count();
        while started.load(Ordering::Acquire) < helpers {
            std::thread::yield_now();
        }
        go.store(true, Ordering::Release);
        let mut outcome = first.populate();
        for other in others {
            let r = match other {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("a prefault thread panicked"))),
                Err(piece) => piece.populate(),
            };
            if outcome.is_ok() {
                outcome = r;
            }
        }
        outcome
    })
}

/// Unmap a ladder mapping and count it.
pub(crate) fn unmap(ptr: NonNull<u8>, mapped_len: usize) {
    if sys::munmap_best_effort(ptr.as_ptr(), mapped_len).is_ok() {
        COUNTERS.record_unmap(mapped_len);
    }
}

/// Allocate `bytes` of zeroed huge-page memory (the seed's `ck_huge_alloc`).
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

    fn check(start: usize, len: usize, granule: usize, n: usize) -> Vec<(usize, usize)> {
        let p = split_pieces(start, len, granule, n).unwrap();
        assert_eq!(p.len(), n);
        let mut next = 0;
        for (i, &(off, l)) in p.iter().enumerate() {
            assert_eq!(off, next, "pieces are consecutive: {p:?}");
            next = off + l;
            if i + 1 < n && next < len {
                assert_eq!((start + next) % granule, 0, "inner boundary aligned: {p:?}");
            }
        }
        assert_eq!(next, len, "pieces cover the range: {p:?}");
        p
    }

    #[test]
    fn split_even_and_uneven() {
        assert_eq!(
            check(0x4000_0000, 8 * M2, M2, 2),
            [(0, 4 * M2), (4 * M2, 4 * M2)]
        );
        // 5 extents on 2 threads: 3 + 2, never half an extent.
        assert_eq!(
            check(0x4000_0000, 5 * M2, M2, 2),
            [(0, 3 * M2), (3 * M2, 2 * M2)]
        );
        // More threads than extents: trailing pieces are empty.
        assert_eq!(
            check(0x4000_0000, 2 * M2, M2, 3),
            [(0, M2), (M2, M2), (2 * M2, 0)]
        );
        // 3 GiB of 1 GiB pages on 2 threads: 2 + 1 pages.
        let g = HUGE_PAGE_1G;
        assert_eq!(check(4 * g, 3 * g, g, 2), [(0, 2 * g), (2 * g, g)]);
    }

    #[test]
    fn split_unaligned_start_keeps_absolute_boundaries() {
        // An arena runtime range that starts 4 KiB past a 2 MiB boundary.
        let p = check(0x4000_0000 + 4096, 6 * M2, M2, 2);
        assert_eq!(p[0].0 + p[0].1, 3 * M2 + M2 - 4096);
        let p = check(0x4000_0000 + 4096, 3 * M2 + 8192, M2, 4);
        assert!(p.iter().all(|&(_, l)| l <= 2 * M2), "{p:?}");
    }

    #[test]
    fn split_overflow_is_none() {
        assert!(split_pieces(usize::MAX - M2, 2 * M2, M2, 2).is_none());
        // The end fits, the first inner boundary does not.
        assert!(split_pieces(usize::MAX - M2 + 2, M2 - 2, M2, 2).is_none());
    }

    #[test]
    fn thread_count_limits() {
        assert_eq!(populate_thread_count(1, 1 << 30, M2), 1);
        assert_eq!(
            populate_thread_count(8, M2, M2),
            1,
            "one extent, one thread"
        );
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(populate_thread_count(0, 1 << 30, M2), cores.min(512));
        assert_eq!(
            populate_thread_count(usize::MAX, 1 << 30, M2),
            cores.min(512)
        );
        assert_eq!(populate_thread_count(2, 4 * M2, M2), cores.min(2));
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
