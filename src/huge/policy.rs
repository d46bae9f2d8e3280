//! [`Policy`]: every rule in which the fronts of the huge-page engine
//! differ, as one `const` value per front; the normative table, a row per
//! field and a column per front, is
//! [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-rules).

/// How a front's blocks are faulted in, cleared, retained and placed; each
/// field is a row of
/// [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Policy {
    /// How a fresh THP block is faulted in.
    pub first_touch: FirstTouch,
    /// How a reused block that must read zero is cleared.
    pub zeroing: Zeroing,
    /// The most bytes of freed blocks retained with their pages.
    pub cap: CapRule,
    /// What a freed block that does not fit under the cap does.
    pub when_full: WhenFull,
    /// What an allocation no retained run serves takes.
    pub on_miss: OnMiss,
    /// The longest block (bytes) this front retains; longer ones are purged
    /// when freed ([`CkHuge::retain_max_bytes`](super::CkHuge::retain_max_bytes)).
    pub retain_max: usize,
}

/// How a fresh THP block is faulted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstTouch {
    /// A block of 4 MiB or more is faulted in at allocation one 2 MiB page
    /// at a time while each costs at most 1 ms: its wall-clock time less
    /// the thread's run-queue delay meanwhile (`/proc/thread-self/schedstat`;
    /// the wall clock alone where it cannot be read), so a busy CPU does not
    /// pass for slow memory. At the first costlier page the rest, and the
    /// fresh blocks of the next 200 ms, go to base pages
    /// (`MADV_NOHUGEPAGE`). `CKALLOC_FIRST_TOUCH_PROBE=off` turns it off.
    Probe,
    /// Nothing at allocation: the block faults in as THP when written, as
    /// glibc's and jemalloc's mappings do.
    OnWrite,
}

/// How a reused block (retained units) that must read zero is cleared.
/// Fresh and purged units read zero already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zeroing {
    /// `memset` of the request's bytes (made read-write first) when the
    /// block is at most [`ZERO_BY_MEMSET_MAX`]: its pages are resident, and
    /// clearing them costs less than faulting them in again; longer blocks
    /// are purged. For a front whose caller owns exactly its request
    /// (`GlobalAlloc`), not the block's whole length.
    MemsetResident,
    /// Purged (`MADV_DONTNEED`) whatever its length, so that pages the
    /// program never writes stay uncommitted.
    Purge,
}

/// The cap on retained bytes, process-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapRule {
    /// `CKALLOC_RETAIN_BYTES` ([`env::retain_bytes`](crate::env::retain_bytes)).
    Environment,
    /// `CKALLOC_RETAIN_BYTES` when it is set; else the larger of its
    /// default and twice the high-water mark of live bytes
    /// ([`HugeStats::peak_live_bytes`](super::HugeStats::peak_live_bytes)).
    TwiceLivePeak,
    /// Nothing is retained: a freed block is purged.
    Nothing,
}

/// What a freed block that does not fit under the cap does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// The freed block is purged; older retained blocks stay.
    PurgeFreed,
    /// Older retained runs are purged, oldest first, to make room.
    PurgeOldest,
}

/// What an allocation that finds no retained run of its length takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnMiss {
    /// Fresh (or purged) units, which read zero.
    FreshExtent,
    /// For a request that needs no zeroing: the placement with the most
    /// retained units and free units around them, so that only the added
    /// units fault in; else fresh units.
    ExtendRetained,
}

/// Retained blocks up to this length are cleared with `memset` by
/// [`Zeroing::MemsetResident`] (16 MiB).
pub const ZERO_BY_MEMSET_MAX: usize = 16 << 20;

impl Policy {
    /// [`CkHuge`](super::CkHuge) through `GlobalAlloc`.
    pub const RUST_GLOBAL: Policy = Policy {
        first_touch: FirstTouch::Probe,
        zeroing: Zeroing::MemsetResident,
        cap: CapRule::Environment,
        when_full: WhenFull::PurgeFreed,
        on_miss: OnMiss::FreshExtent,
        retain_max: usize::MAX,
    };

    /// [`CkHuge`](super::CkHuge) through `allocator_api2`'s `Allocator`:
    /// nothing retained (`CachingAllocator<CkHuge>` is the cache there).
    pub const RUST_ALLOCATOR: Policy = Policy {
        cap: CapRule::Nothing,
        // The caller owns the whole block (the slice's length).
        zeroing: Zeroing::Purge,
        ..Policy::RUST_GLOBAL
    };

    /// The preload library's C API (`malloc`, `calloc`, `realloc`, ...).
    pub const C_MALLOC: Policy = Policy {
        first_touch: FirstTouch::OnWrite,
        zeroing: Zeroing::Purge,
        cap: CapRule::TwiceLivePeak,
        when_full: WhenFull::PurgeOldest,
        on_miss: OnMiss::ExtendRetained,
        retain_max: usize::MAX,
    };

    /// [`huge_alloc`](super::huge_alloc) and C-Kernel-Engine's
    /// `ck_huge_alloc`: zeroed blocks, purged when freed.
    pub const CK_HUGE: Policy = Policy {
        first_touch: FirstTouch::OnWrite,
        zeroing: Zeroing::Purge,
        cap: CapRule::Nothing,
        when_full: WhenFull::PurgeFreed,
        on_miss: OnMiss::FreshExtent,
        retain_max: usize::MAX,
    };

    /// Whether this policy probes fresh THP blocks now (see `Probe`).
    pub(crate) fn probes(&self) -> bool {
        self.first_touch == FirstTouch::Probe && crate::env::first_touch_probe()
    }
}
