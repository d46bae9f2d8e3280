//! [`HugeOptions`]: what a huge-page mapping asks for beyond its size.

use crate::tier::Backing;

/// Options for a huge-page mapping (a small `const` builder).
///
/// ```
/// use ckalloc::{HugeOptions, HugeRegion};
/// let opts = HugeOptions::new().populate(true);
/// let region = HugeRegion::with_options(4 << 20, &opts).unwrap();
/// assert_eq!(region.mapped_len(), 4 << 20);
/// println!("4 MiB on {}", region.backing());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugeOptions {
    pub(super) require: Backing,
    pub(super) hugetlb: bool,
    pub(super) allow_1gib: bool,
    pub(super) populate: bool,
    pub(super) populate_threads: usize,
    pub(super) mlock: bool,
    pub(super) numa_node: Option<u32>,
    pub(super) dont_dump: bool,
}

impl Default for HugeOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl HugeOptions {
    /// Defaults: try hugetlb (2 MiB), then THP, then normal pages; no 1 GiB
    /// pages, no prefault (one thread when enabled), no `mlock`, no NUMA
    /// binding.
    pub const fn new() -> Self {
        HugeOptions {
            require: Backing::Normal,
            hugetlb: true,
            allow_1gib: false,
            populate: false,
            populate_threads: 1,
            mlock: false,
            numa_node: None,
            dont_dump: false,
        }
    }

    /// Fail with [`HugeError::TierUnavailable`](super::HugeError::TierUnavailable) instead of falling below
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
        self.allow_1gib = yes;
        self
    }

    /// Prefault every page with `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+),
    /// after NUMA binding. Unlike `MAP_POPULATE` this reports failure (for
    /// example `ENOMEM` under a cgroup limit) as [`HugeError::Populate`](super::HugeError::Populate).
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
    /// so one thread is bound by what one core can clear, and more threads
    /// clear more pages at once (`benches/README.md`, "Measured numbers").
    /// The gain needs idle cores: with every core busy, two threads take as
    /// long as one.
    ///
    /// - **Count**: `threads == 1` (the default) is one `madvise` on the
    ///   calling thread; `0` means [`std::thread::available_parallelism`].
    ///   At most `available_parallelism` threads and one per chunk are used.
    /// - **Chunks**: the mapping is cut at multiples of 8 MiB in address
    ///   space (1 GiB for 1 GiB pages), so no huge page is faulted by two
    ///   threads; threads take chunks from a shared counter until none is
    ///   left.
    /// - **Threads**: the calling thread and `threads - 1` scoped threads
    ///   (64 KiB stacks), all joined before the constructor returns; a
    ///   thread that cannot be spawned is not an error.
    /// - **Errors**: after a failed chunk no new one starts, and once every
    ///   thread is joined the call fails with
    ///   [`HugeError::Populate`](super::HugeError::Populate) (the lowest
    ///   failed chunk's error) and the mapping is released.
    /// - **Where**: spawning threads allocates, so only explicit
    ///   constructors ([`HugeRegion::with_options`](super::HugeRegion::with_options),
    ///   the arena's [`huge`](crate::ArenaBuilder::huge) options) take it;
    ///   the engine's blocks never prefault this way.
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
