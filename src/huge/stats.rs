//! Process-wide counters of the huge-page tiers ([`huge_stats`]): mappings
//! and bytes per tier, fallbacks, unmaps, and the retention cache.
//!
//! Counters are relaxed atomics: each is exact, but a snapshot taken while
//! other threads allocate may mix moments (as any statistics read under
//! load). Reading them never allocates.

use crate::env::{self, Setting, Source};
use crate::tier::Backing;
use crate::units::human_bytes;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

pub(crate) struct Counters {
    maps: [AtomicU64; 3],
    map_bytes: [AtomicU64; 3],
    pub(crate) hugetlb_fallbacks: AtomicU64,
    pub(crate) hugetlb_skipped: AtomicU64,
    pub(crate) thp_fallbacks: AtomicU64,
    pub(crate) remaps: AtomicU64,
    unmaps: AtomicU64,
    unmapped_bytes: AtomicU64,
    pub(crate) retain_hits: AtomicU64,
    pub(crate) retain_misses: AtomicU64,
    pub(crate) retain_carves: AtomicU64,
    pub(crate) retain_grows: AtomicU64,
    pub(crate) decayed_bytes: AtomicU64,
    pub(crate) first_touch_probes: AtomicU64,
    pub(crate) first_touch_slow_probes: AtomicU64,
    pub(crate) first_touch_probe_ns: AtomicU64,
    pub(crate) first_touch_populated_bytes: AtomicU64,
    pub(crate) first_touch_base_blocks: AtomicU64,
    pub(crate) first_touch_base_bytes: AtomicU64,
    /// Bytes mapped right now (live and retained), and its high-water mark.
    mapped_now: AtomicU64,
    mapped_peak: AtomicU64,
    /// The high-water mark of live bytes (mapped minus retained).
    live_peak: AtomicU64,
    /// Bytes in the retention cache right now (`retain` keeps it).
    pub(crate) retained: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const Z: AtomicU64 = AtomicU64::new(0);

pub(crate) static COUNTERS: Counters = Counters {
    maps: [Z; 3],
    map_bytes: [Z; 3],
    hugetlb_fallbacks: Z,
    hugetlb_skipped: Z,
    thp_fallbacks: Z,
    remaps: Z,
    unmaps: Z,
    unmapped_bytes: Z,
    retain_hits: Z,
    retain_misses: Z,
    retain_carves: Z,
    retain_grows: Z,
    decayed_bytes: Z,
    first_touch_probes: Z,
    first_touch_slow_probes: Z,
    first_touch_probe_ns: Z,
    first_touch_populated_bytes: Z,
    first_touch_base_blocks: Z,
    first_touch_base_bytes: Z,
    mapped_now: Z,
    mapped_peak: Z,
    live_peak: Z,
    retained: AtomicUsize::new(0),
};

fn tier(b: Backing) -> usize {
    match b {
        Backing::Hugetlb => 0,
        Backing::TransparentHuge => 1,
        Backing::Normal => 2,
    }
}

impl Counters {
    pub(crate) fn record_map(&self, backing: Backing, bytes: usize) {
        self.maps[tier(backing)].fetch_add(1, Relaxed);
        self.map_bytes[tier(backing)].fetch_add(bytes as u64, Relaxed);
        self.mapped(bytes as u64);
    }

    /// `bytes` more are mapped: raise the high-water mark if it is passed.
    fn mapped(&self, bytes: u64) {
        let now = self
            .mapped_now
            .fetch_add(bytes, Relaxed)
            .wrapping_add(bytes);
        self.mapped_peak.fetch_max(now, Relaxed);
        self.note_live();
    }

    /// Raise the high-water mark of live bytes to what is live now: after a
    /// mapping, a growth, or a block taken from the retention cache.
    pub(crate) fn note_live(&self) {
        let live = self
            .mapped_now
            .load(Relaxed)
            .saturating_sub(self.retained.load(Relaxed) as u64);
        self.live_peak.fetch_max(live, Relaxed);
    }

    /// The high-water mark of live bytes.
    pub(crate) fn live_peak(&self) -> u64 {
        self.live_peak.load(Relaxed)
    }

    pub(crate) fn record_unmap(&self, bytes: usize) {
        self.unmaps.fetch_add(1, Relaxed);
        self.unmapped_bytes.fetch_add(bytes as u64, Relaxed);
        self.mapped_now.fetch_sub(bytes as u64, Relaxed);
    }

    /// A mapping grew from `old` to `new` bytes by `mremap`; the added bytes
    /// count as mapped on the books of `backing`, the tier of the grown
    /// mapping (THP or normal pages: hugetlb never grows this way).
    pub(crate) fn record_grow(&self, old: usize, new: usize, backing: Backing) {
        self.remaps.fetch_add(1, Relaxed);
        self.map_bytes[tier(backing)].fetch_add((new - old) as u64, Relaxed);
        self.mapped((new - old) as u64);
    }
}

/// Mappings and bytes of one tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Mappings made on this tier.
    pub mappings: u64,
    /// Bytes mapped on this tier (including growth by `mremap`).
    pub bytes: u64,
}

/// A snapshot of the huge-page counters since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HugeStats {
    /// hugetlb mappings.
    pub hugetlb: TierStats,
    /// THP-advised mappings.
    pub thp: TierStats,
    /// Normal-page mappings.
    pub normal: TierStats,
    /// hugetlb attempts that failed (the ladder fell to THP).
    pub hugetlb_fallbacks: u64,
    /// Allocations that skipped hugetlb because of the back-off after a failure.
    pub hugetlb_skipped: u64,
    /// `madvise(MADV_HUGEPAGE)` failures (the mapping was kept as normal pages).
    pub thp_fallbacks: u64,
    /// Resizes done by `mremap` or a tail `munmap`.
    pub remaps: u64,
    /// `munmap` calls that released memory.
    pub unmaps: u64,
    /// Bytes released by those calls.
    pub unmapped_bytes: u64,
    /// Bytes of freed blocks [`CkHuge`](crate::CkHuge) keeps mapped for
    /// reuse right now (its retention cache); still mapped, but not live.
    pub retained_bytes: u64,
    /// The high-water mark of bytes mapped at once by the huge-page paths
    /// (live and retained blocks), since the process started.
    pub peak_mapped_bytes: u64,
    /// The high-water mark of live bytes (handed out and not yet freed)
    /// of the huge-page paths, since the process started. The preload
    /// library's retention cap follows it
    /// ([Retention](crate::huge#retention-ckhuge)).
    pub peak_live_bytes: u64,
    /// `CkHuge` mapped-path allocations served from the retention cache
    /// (no system call).
    pub retention_hits: u64,
    /// `CkHuge` mapped-path allocations of a retaining value that found no
    /// block of their length and alignment in the cache: they mapped
    /// afresh, or grew a shorter retained block (`retention_grows`).
    pub retention_misses: u64,
    /// Of the hits, those carved from a longer retained block (the rest of
    /// it stays retained).
    pub retention_carves: u64,
    /// Of the misses, those the preload library's C API served by growing
    /// the longest shorter retained block with `mremap` (only the added
    /// bytes fresh) instead of mapping the whole block.
    pub retention_grows: u64,
    /// Bytes of retained blocks given back to the kernel by decay (also
    /// counted in `unmapped_bytes`).
    pub decayed_bytes: u64,
    /// Fresh `CkHuge` THP blocks the first-touch policy faulted in, one
    /// 2 MiB page at a time, timing each page
    /// ([First touch](crate::huge#first-touch-ckhuge)).
    pub first_touch_probes: u64,
    /// Of those, blocks in which a page took longer than 1 ms: the rest of
    /// the block went to base pages.
    pub first_touch_slow_probes: u64,
    /// Time spent faulting blocks in, in nanoseconds.
    pub first_touch_probe_ns: u64,
    /// Bytes the policy faulted in as THP before the caller wrote them.
    pub first_touch_populated_bytes: u64,
    /// Blocks (or their part after the last page faulted in) the policy
    /// advised `MADV_NOHUGEPAGE`, after a slow page or in the window after
    /// one.
    pub first_touch_base_blocks: u64,
    /// Bytes of those blocks.
    pub first_touch_base_bytes: u64,
    /// The `CKALLOC_*` settings in use ([`env::settings`]): the retention
    /// cap, the decay delay, the hugetlb back-off, the hugetlb, THP and
    /// first-touch probe switches, and the preload library's threshold and
    /// statistics switch, each with where it came from. A variable that
    /// does not parse shows as
    /// [`Source::Unparsed`] (taken as unset) and is named on the last
    /// line of this snapshot's `Display`.
    pub settings: [Setting; env::SETTINGS],
}

impl HugeStats {
    /// The settings whose variable is set but does not parse.
    pub fn unparsed_settings(&self) -> impl Iterator<Item = &Setting> {
        self.settings
            .iter()
            .filter(|s| s.source == Source::Unparsed)
    }

    /// Bytes mapped on all tiers minus bytes unmapped and bytes retained:
    /// what this crate's huge-page paths hand out right now.
    pub fn live_bytes(&self) -> u64 {
        (self.hugetlb.bytes + self.thp.bytes + self.normal.bytes)
            .saturating_sub(self.unmapped_bytes)
            .saturating_sub(self.retained_bytes)
    }
}

/// Read the huge-page counters. Never allocates.
pub fn huge_stats() -> HugeStats {
    let c = &COUNTERS;
    let t = |i: usize| TierStats {
        mappings: c.maps[i].load(Relaxed),
        bytes: c.map_bytes[i].load(Relaxed),
    };
    HugeStats {
        hugetlb: t(0),
        thp: t(1),
        normal: t(2),
        hugetlb_fallbacks: c.hugetlb_fallbacks.load(Relaxed),
        hugetlb_skipped: c.hugetlb_skipped.load(Relaxed),
        thp_fallbacks: c.thp_fallbacks.load(Relaxed),
        remaps: c.remaps.load(Relaxed),
        unmaps: c.unmaps.load(Relaxed),
        unmapped_bytes: c.unmapped_bytes.load(Relaxed),
        retained_bytes: c.retained.load(Relaxed) as u64,
        peak_mapped_bytes: c.mapped_peak.load(Relaxed),
        peak_live_bytes: c.live_peak.load(Relaxed),
        retention_hits: c.retain_hits.load(Relaxed),
        retention_misses: c.retain_misses.load(Relaxed),
        retention_carves: c.retain_carves.load(Relaxed),
        retention_grows: c.retain_grows.load(Relaxed),
        decayed_bytes: c.decayed_bytes.load(Relaxed),
        first_touch_probes: c.first_touch_probes.load(Relaxed),
        first_touch_slow_probes: c.first_touch_slow_probes.load(Relaxed),
        first_touch_probe_ns: c.first_touch_probe_ns.load(Relaxed),
        first_touch_populated_bytes: c.first_touch_populated_bytes.load(Relaxed),
        first_touch_base_blocks: c.first_touch_base_blocks.load(Relaxed),
        first_touch_base_bytes: c.first_touch_base_bytes.load(Relaxed),
        settings: env::settings(),
    }
}

impl fmt::Display for HugeStats {
    /// Several lines, no trailing newline. Never allocates (the preload
    /// library prints it at exit, inside the allocator).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<10} {:>10} {:>14}",
            "tier", "mappings", "bytes mapped"
        )?;
        for (name, t) in [
            ("hugetlb", self.hugetlb),
            ("THP", self.thp),
            ("normal", self.normal),
        ] {
            writeln!(
                f,
                "{:<10} {:>10} {:>14}",
                name,
                t.mappings,
                human_bytes(t.bytes)
            )?;
        }
        writeln!(
            f,
            "fallbacks: hugetlb {} (skipped by back-off {}), THP advice {}",
            self.hugetlb_fallbacks, self.hugetlb_skipped, self.thp_fallbacks
        )?;
        write!(
            f,
            "unmaps: {} ({}), remaps: {}, live: {} (peak {}), peak mapped: {}",
            self.unmaps,
            human_bytes(self.unmapped_bytes),
            self.remaps,
            human_bytes(self.live_bytes()),
            human_bytes(self.peak_live_bytes),
            human_bytes(self.peak_mapped_bytes)
        )?;
        write!(
            f,
            "\nretained: {} (hits {} of which carved {}, misses {} of which grew a retained block {}, given back by decay {})",
            human_bytes(self.retained_bytes),
            self.retention_hits,
            self.retention_carves,
            self.retention_misses,
            self.retention_grows,
            human_bytes(self.decayed_bytes)
        )?;
        write!(
            f,
            "\nfirst touch: {} block{} faulted in ({} in {:.1} ms; {} met a slow page), {} block{} ({}) sent to base pages",
            self.first_touch_probes,
            crate::units::plural(self.first_touch_probes),
            human_bytes(self.first_touch_populated_bytes),
            self.first_touch_probe_ns as f64 / 1e6,
            self.first_touch_slow_probes,
            self.first_touch_base_blocks,
            crate::units::plural(self.first_touch_base_blocks),
            human_bytes(self.first_touch_base_bytes)
        )?;
        write!(f, "\nsettings: {}", self.settings[0])?;
        for s in &self.settings[1..] {
            write!(f, ", {s}")?;
        }
        Ok(())
    }
}
