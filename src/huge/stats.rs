//! The engine's counters and their public snapshot, [`HugeStats`].
//! Counters are relaxed atomics: each is exact, but a snapshot taken while
//! other threads allocate may mix moments. Reading them never allocates.

use super::background::BackgroundThread;
use crate::env::{self, Setting, Source};
use crate::thp::{self, ThpSettings};
use crate::tier::Backing;
use crate::units::{human_bytes, plural};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The engine's counters, each an index into [`Counters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    // System calls, by kind (`os`).
    Mmap,
    Munmap,
    Mremap,
    Madvise,
    Mprotect,
    Munlock,
    // The tier ladder.
    HugetlbFallbacks,
    HugetlbSkipped,
    ThpFallbacks,
    // Spans and their address space.
    Spans,
    SpanBytes,
    SpanBytesPeak,
    SpansReleased,
    Unmapped,
    // Live and retained bytes.
    Live,
    LivePeak,
    Retained,
    // Retention, resizes, purges.
    Hits,
    Misses,
    Carves,
    Extends,
    GrownInPlace,
    Moved,
    Copied,
    Purged,
    Decayed,
    // First touch.
    Probes,
    SlowProbes,
    ProbeNs,
    ProbeWaitNs,
    DescheduledPages,
    Populated,
    BaseBlocks,
    BaseBytes,
    ShortTails,
    ShortTailsOverBudget,
    // Promotion and the background thread.
    BaseFirst,
    HugeFirst,
    HugeChecks,
    HugeChecksDear,
    HugeFaultNs,
    Collapsed,
    CollapseNs,
    CollapseFailures,
    CollapseRaces,
    BackgroundPasses,
    // Blocks and bytes per tier, by `Backing::code`.
    Blocks,
    Bytes = Count::Blocks as isize + 3,
}

const COUNTS: usize = Count::Bytes as usize + 3;

/// The engine's counters (one set per engine): relaxed atomics.
pub(crate) struct Counters([AtomicU64; COUNTS]);

impl Counters {
    pub(crate) const fn new() -> Counters {
        Counters([const { AtomicU64::new(0) }; COUNTS])
    }

    /// Add `n` to `c`; returns the value before.
    #[inline]
    pub(crate) fn add(&self, c: Count, n: u64) -> u64 {
        self.0[c as usize].fetch_add(n, Relaxed)
    }

    #[inline]
    pub(crate) fn sub(&self, c: Count, n: u64) {
        self.0[c as usize].fetch_sub(n, Relaxed);
    }

    #[inline]
    pub(crate) fn get(&self, c: Count) -> u64 {
        self.0[c as usize].load(Relaxed)
    }

    pub(crate) fn set(&self, c: Count, v: u64) {
        self.0[c as usize].store(v, Relaxed);
    }

    fn add_at(&self, c: Count, b: Backing, n: u64) {
        self.0[c as usize + b.code() as usize].fetch_add(n, Relaxed);
    }

    /// Add `n` to `c` and raise the high-water mark `peak` to its new value.
    fn add_peak(&self, c: Count, peak: Count, n: u64) {
        let now = self.add(c, n) + n;
        self.0[peak as usize].fetch_max(now, Relaxed);
    }

    /// A block of `bytes` was handed out on tier `b` (fresh or reused).
    pub(crate) fn block(&self, b: Backing, bytes: usize) {
        self.add_at(Count::Blocks, b, 1);
        self.add_at(Count::Bytes, b, bytes as u64);
    }

    /// Live bytes grew by `bytes`.
    pub(crate) fn live_add(&self, bytes: usize) {
        self.add_peak(Count::Live, Count::LivePeak, bytes as u64);
    }

    /// A span of `bytes` was reserved.
    pub(crate) fn span_reserved(&self, bytes: usize) {
        self.add(Count::Spans, 1);
        self.add_peak(Count::SpanBytes, Count::SpanBytesPeak, bytes as u64);
    }

    /// A span was given back whole (its bytes counted by
    /// [`span_hole`](Self::span_hole)).
    pub(crate) fn span_retired(&self) {
        self.sub(Count::Spans, 1);
        self.add(Count::SpansReleased, 1);
    }

    /// `bytes` of a span were unmapped (the whole span, or a hole in it).
    pub(crate) fn span_hole(&self, bytes: usize) {
        self.sub(Count::SpanBytes, bytes as u64);
        self.add(Count::Unmapped, bytes as u64);
    }

    /// The snapshot [`huge_stats`](super::huge_stats) returns.
    pub(crate) fn snapshot(&self) -> HugeStats {
        let g = |c: Count| self.get(c);
        let t = |b: Backing| TierStats {
            blocks: self.0[Count::Blocks as usize + b.code() as usize].load(Relaxed),
            bytes: self.0[Count::Bytes as usize + b.code() as usize].load(Relaxed),
        };
        HugeStats {
            hugetlb: t(Backing::Hugetlb),
            thp: t(Backing::TransparentHuge),
            normal: t(Backing::Normal),
            hugetlb_fallbacks: g(Count::HugetlbFallbacks),
            hugetlb_skipped: g(Count::HugetlbSkipped),
            thp_fallbacks: g(Count::ThpFallbacks),
            syscalls: Syscalls {
                mmap: g(Count::Mmap),
                munmap: g(Count::Munmap),
                mremap: g(Count::Mremap),
                madvise: g(Count::Madvise),
                mprotect: g(Count::Mprotect),
                munlock: g(Count::Munlock),
            },
            spans: g(Count::Spans),
            span_bytes: g(Count::SpanBytes),
            peak_span_bytes: g(Count::SpanBytesPeak),
            spans_released: g(Count::SpansReleased),
            unmapped_bytes: g(Count::Unmapped),
            live_bytes: g(Count::Live),
            peak_live_bytes: g(Count::LivePeak),
            retained_bytes: g(Count::Retained),
            retention_hits: g(Count::Hits),
            retention_misses: g(Count::Misses),
            retention_carves: g(Count::Carves),
            retention_extends: g(Count::Extends),
            grown_in_place: g(Count::GrownInPlace),
            moved: g(Count::Moved),
            copied: g(Count::Copied),
            purged_bytes: g(Count::Purged),
            decayed_bytes: g(Count::Decayed),
            first_touch_probes: g(Count::Probes),
            first_touch_slow_probes: g(Count::SlowProbes),
            first_touch_probe_ns: g(Count::ProbeNs),
            first_touch_cpu_wait_ns: g(Count::ProbeWaitNs),
            first_touch_descheduled_pages: g(Count::DescheduledPages),
            first_touch_populated_bytes: g(Count::Populated),
            first_touch_base_blocks: g(Count::BaseBlocks),
            first_touch_base_bytes: g(Count::BaseBytes),
            short_tails: g(Count::ShortTails),
            short_tails_over_budget: g(Count::ShortTailsOverBudget),
            background_thread: BackgroundThread::Off,
            background_passes: g(Count::BackgroundPasses),
            base_page_first_bytes: g(Count::BaseFirst),
            huge_page_first_bytes: g(Count::HugeFirst),
            huge_checks: g(Count::HugeChecks),
            huge_checks_dear: g(Count::HugeChecksDear),
            huge_fault_mean_ns: g(Count::HugeFaultNs),
            collapsed_bytes: g(Count::Collapsed),
            collapse_ns: g(Count::CollapseNs),
            collapse_failures: g(Count::CollapseFailures),
            collapse_races: g(Count::CollapseRaces),
            collapsed_live_bytes: 0,
            settings: env::settings(),
            thp_settings: thp::settings_once(),
        }
    }
}

/// Blocks of one tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks handed out on this tier: the engine's blocks, fresh or
    /// reused, and [`HugeRegion`](crate::HugeRegion) mappings.
    pub blocks: u64,
    /// Their bytes (each block's whole length, a multiple of 2 MiB).
    pub bytes: u64,
}

/// The engine's system calls since the process started, by kind (each
/// call counted, failed ones included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Syscalls {
    /// `mmap`: span reservations, hugetlb spans, extent-map leaves,
    /// `HugeRegion` mappings.
    pub mmap: u64,
    /// `munmap`: idle spans given back, trimming an aligned reservation.
    pub munmap: u64,
    /// `mremap`: a block moved to grow.
    pub mremap: u64,
    /// `madvise`: purges (`MADV_DONTNEED`), THP advice, first touch.
    pub madvise: u64,
    /// `mprotect`: units committed, purged units made read-write again.
    pub mprotect: u64,
    /// `munlock`: a purge of units the program had locked.
    pub munlock: u64,
}

/// A snapshot of the huge-page engine's counters since the process
/// started ([`huge_stats`](super::huge_stats)). Bytes are bytes; a block's
/// bytes are its whole length (a multiple of 2 MiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HugeStats {
    /// hugetlb blocks.
    pub hugetlb: TierStats,
    /// THP blocks (advised `MADV_HUGEPAGE`).
    pub thp: TierStats,
    /// Normal-page blocks.
    pub normal: TierStats,
    /// hugetlb attempts that failed (the ladder fell to THP).
    pub hugetlb_fallbacks: u64,
    /// Allocations that skipped hugetlb because of the back-off after a failure.
    pub hugetlb_skipped: u64,
    /// `madvise(MADV_HUGEPAGE)` failures (a span or mapping kept as normal pages).
    pub thp_fallbacks: u64,
    /// The engine's system calls by kind.
    pub syscalls: Syscalls,
    /// Spans (reserved address space the engine carves blocks from) now.
    pub spans: u64,
    /// Bytes of address space those spans hold now.
    pub span_bytes: u64,
    /// The high-water mark of `span_bytes`.
    pub peak_span_bytes: u64,
    /// Spans given back whole (`munmap`).
    pub spans_released: u64,
    /// Address space given back (`munmap`): idle spans, hugetlb units,
    /// free units under an address-space limit.
    pub unmapped_bytes: u64,
    /// Bytes of live blocks (handed out, not yet freed).
    pub live_bytes: u64,
    /// The high-water mark of `live_bytes`, which
    /// [`CapRule::TwiceLivePeak`](crate::huge::CapRule) follows.
    pub peak_live_bytes: u64,
    /// Bytes of freed blocks kept with their pages for reuse now.
    pub retained_bytes: u64,
    /// Allocations of a retaining front served from retained units (no
    /// system call, no page fault).
    pub retention_hits: u64,
    /// Allocations of a retaining front no retained run served.
    pub retention_misses: u64,
    /// Of the hits, those taken from the front of a longer retained run.
    pub retention_carves: u64,
    /// Of the misses, those served by retained units with free units
    /// around them ([`OnMiss::ExtendRetained`](crate::huge::OnMiss)).
    pub retention_extends: u64,
    /// Resizes that grew a block in place, over the free units after it.
    pub grown_in_place: u64,
    /// Resizes that moved a block's pages with `mremap` (no copy).
    pub moved: u64,
    /// Resizes that copied a block (hugetlb, a kernel before 5.7, pages a
    /// failed move left behind).
    pub copied: u64,
    /// Bytes purged (`MADV_DONTNEED`), their address space kept.
    pub purged_bytes: u64,
    /// Bytes given back by decay (retained longer than the delay): purged, or
    /// unmapped with a span no block used for the window (so they may exceed
    /// `purged_bytes`).
    pub decayed_bytes: u64,
    /// Fresh THP blocks the first-touch probe faulted in, one 2 MiB page at
    /// a time ([`FirstTouch::Probe`](crate::huge::FirstTouch)).
    pub first_touch_probes: u64,
    /// Of those, blocks in which a page cost more than 1 ms: its wall-clock
    /// time less the time the thread waited for a CPU meanwhile (its
    /// run-queue delay, `/proc/thread-self/schedstat`).
    pub first_touch_slow_probes: u64,
    /// Wall-clock time spent faulting blocks in, in nanoseconds.
    pub first_touch_probe_ns: u64,
    /// Of that time, nanoseconds the probing threads waited for a CPU (not
    /// counted against a page).
    pub first_touch_cpu_wait_ns: u64,
    /// Pages that took more than 1 ms by the wall clock but not once the
    /// wait for a CPU is taken out: a wall-clock test would have sent the
    /// rest of their blocks to base pages at each of them.
    pub first_touch_descheduled_pages: u64,
    /// Bytes the probe faulted in before the caller wrote them.
    pub first_touch_populated_bytes: u64,
    /// Blocks (or their rest) the probe advised `MADV_NOHUGEPAGE`, after a
    /// slow page or in the window after one.
    pub first_touch_base_blocks: u64,
    /// Bytes of those blocks.
    pub first_touch_base_bytes: u64,
    /// Units advised base pages now because each is the last 2 MiB of a
    /// block holding less than 1 MiB of its request (a short tail); at
    /// most 256.
    pub short_tails: u64,
    /// Blocks whose short tail was left on huge pages because 256 were out.
    pub short_tails_over_budget: u64,
    /// The background thread's state.
    pub background_thread: BackgroundThread,
    /// Passes the background thread made (decay and promotion), one per
    /// 100 ms while it runs.
    pub background_passes: u64,
    /// Bytes of fresh THP-tier blocks handed out in spans not advised
    /// `MADV_HUGEPAGE` (the background thread promotes them): they fault in
    /// base pages (huge ones only where THP is `always` and a free huge
    /// page is at hand), so no request waits on compaction.
    pub base_page_first_bytes: u64,
    /// Bytes of fresh THP-tier blocks handed out, while the background
    /// thread promotes, in spans advised `MADV_HUGEPAGE`: they fault in huge
    /// pages. The fault check granted them, or no span could be had for
    /// base pages (address space or the span table short).
    pub huge_page_first_bytes: u64,
    /// Checks the background thread made of what a fresh huge page costs
    /// (the free 2 MiB blocks in `/proc/buddyinfo`, then one 2 MiB fault
    /// timed less its run-queue delay): at most one per 50 ms, each tick
    /// while blocks are handed out and for 250 ms after the last.
    pub huge_checks: u64,
    /// Of those, checks that found huge pages dear (their mean cost,
    /// [`huge_fault_mean_ns`](Self::huge_fault_mean_ns), above 1 ms; a
    /// fault that took base pages; no free 2 MiB block counted; or nothing
    /// could be measured): fresh blocks took base
    /// pages until the next check.
    pub huge_checks_dear: u64,
    /// The mean cost of faulting in a fresh huge page that the checks
    /// found, in nanoseconds less the run-queue delay, weighted to recent
    /// checks (each weighs a quarter; a check that found no free 2 MiB
    /// block faults nothing and leaves it); 0 before the first. Compared with
    /// 1 ms, about what 512 base-page faults cost.
    pub huge_fault_mean_ns: u64,
    /// Bytes the background thread collapsed into huge pages
    /// (`MADV_COLLAPSE`, which also succeeds on a unit the kernel already
    /// maps with a huge page), since the process started.
    pub collapsed_bytes: u64,
    /// Nanoseconds (wall clock) its `MADV_COLLAPSE` calls took.
    pub collapse_ns: u64,
    /// `MADV_COLLAPSE` calls that failed (`EAGAIN`: tried again at the
    /// next pass; `ENOMEM`, `EBUSY`: after a 1 s back-off; `EINVAL`: after
    /// 10 s or once the unit's pages are dropped).
    pub collapse_failures: u64,
    /// Collapses of a unit freed or purged while the call ran (made right
    /// again).
    pub collapse_races: u64,
    /// Live bytes in units the background thread collapsed (or found
    /// huge), now: with `live_bytes`, the coverage the promotion reached
    /// (units the thread has not reached are not counted, whatever the
    /// kernel gave them; `huge_page_coverage` measures a range).
    pub collapsed_live_bytes: u64,
    /// The `CKALLOC_*` settings in use ([`env::settings`]), each with where
    /// it came from; a variable that does not parse shows as
    /// [`Source::Unparsed`] (taken as unset) and is named on the last line
    /// of `Display`.
    pub settings: [Setting; env::SETTINGS],
    /// The kernel's THP mode, `defrag` mode and khugepaged's settings, as
    /// the process's first `huge_stats()` call read them from sysfs
    /// ([`thp_settings`](crate::thp_settings) reads them now).
    pub thp_settings: ThpSettings,
}

impl HugeStats {
    /// The settings whose variable is set but does not parse.
    pub fn unparsed_settings(&self) -> impl Iterator<Item = &Setting> {
        self.settings
            .iter()
            .filter(|s| s.source == Source::Unparsed)
    }
}

impl fmt::Display for HugeStats {
    /// Several lines, no trailing newline. Never allocates (the preload
    /// library prints it at exit, inside the allocator).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<10} {:>10} {:>14}", "tier", "blocks", "bytes")?;
        let tiers = [
            ("hugetlb", self.hugetlb),
            ("THP", self.thp),
            ("normal", self.normal),
        ];
        for (name, t) in tiers {
            let bytes = human_bytes(t.bytes);
            writeln!(f, "{name:<10} {:>10} {bytes:>14}", t.blocks)?;
        }
        writeln!(
            f,
            "fallbacks: hugetlb {} (skipped by back-off {}), THP advice {}",
            self.hugetlb_fallbacks, self.hugetlb_skipped, self.thp_fallbacks
        )?;
        writeln!(
            f,
            "live: {} (peak {}), retained: {}, spans: {} ({}, peak {}; {} given back)",
            human_bytes(self.live_bytes),
            human_bytes(self.peak_live_bytes),
            human_bytes(self.retained_bytes),
            self.spans,
            human_bytes(self.span_bytes),
            human_bytes(self.peak_span_bytes),
            self.spans_released
        )?;
        writeln!(
            f,
            "retention: hits {} of which carved {}, misses {} of which extended a retained run {}; \
             grown in place {}, moved {}, copied {}; purged {}; given back by decay {} (purged, or unmapped with an idle span)",
            self.retention_hits,
            self.retention_carves,
            self.retention_misses,
            self.retention_extends,
            self.grown_in_place,
            self.moved,
            self.copied,
            human_bytes(self.purged_bytes),
            human_bytes(self.decayed_bytes)
        )?;
        let s = &self.syscalls;
        writeln!(
            f,
            "system calls: mmap {}, munmap {}, mremap {}, madvise {}, mprotect {}, munlock {}",
            s.mmap, s.munmap, s.mremap, s.madvise, s.mprotect, s.munlock
        )?;
        write!(
            f,
            "first touch: {} block{} faulted in ({} in {:.1} ms, {:.1} ms of it waiting for a CPU; \
             {} met a slow page, {} page{} slow only by the wall clock), {} block{} ({}) sent to base pages",
            self.first_touch_probes,
            plural(self.first_touch_probes),
            human_bytes(self.first_touch_populated_bytes),
            self.first_touch_probe_ns as f64 / 1e6,
            self.first_touch_cpu_wait_ns as f64 / 1e6,
            self.first_touch_slow_probes,
            self.first_touch_descheduled_pages,
            plural(self.first_touch_descheduled_pages),
            self.first_touch_base_blocks,
            plural(self.first_touch_base_blocks),
            human_bytes(self.first_touch_base_bytes)
        )?;
        write!(
            f,
            "\nshort tails on base pages: {} (left on huge pages: {})",
            self.short_tails, self.short_tails_over_budget
        )?;
        let covered = if self.live_bytes == 0 {
            0.0
        } else {
            100.0 * self.collapsed_live_bytes as f64 / self.live_bytes as f64
        };
        write!(
            f,
            "\npromotion: background thread {} ({} passes, {} huge-page checks, {} dear, mean fault {:.2} ms); \
             fresh blocks: {} faulted in base pages first, {} in huge pages; {} collapsed in {:.1} ms ({} failed, {} raced a free or purge); live collapsed now {} ({:.0}%)",
            self.background_thread.name(),
            self.background_passes,
            self.huge_checks,
            self.huge_checks_dear,
            self.huge_fault_mean_ns as f64 / 1e6,
            human_bytes(self.base_page_first_bytes),
            human_bytes(self.huge_page_first_bytes),
            human_bytes(self.collapsed_bytes),
            self.collapse_ns as f64 / 1e6,
            self.collapse_failures,
            self.collapse_races,
            human_bytes(self.collapsed_live_bytes),
            covered
        )?;
        write!(f, "\nTHP: {}", self.thp_settings)?;
        write!(f, "\nsettings: {}", self.settings[0])?;
        for s in &self.settings[1..] {
            write!(f, ", {s}")?;
        }
        Ok(())
    }
}
