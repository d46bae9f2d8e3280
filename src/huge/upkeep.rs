//! The engine's upkeep: the demand its calls note, the decay step, which a
//! huge-path call runs when its clock is due and the background thread
//! runs every tick, the thread's work (decay, the fault check, then
//! promotion) and the verdict fresh units follow, its start, and the fork
//! hooks that pause it. [`ENGINE`]'s request paths call [`Engine::tick`],
//! [`Engine::small_call`] and [`Engine::background`]; the work itself
//! lives in [`retain`], [`demand`] and [`promote`]. Nothing here
//! allocates, locks, panics or prints.

use super::background::{self, BackgroundThread};
use super::demand;
use super::engine::{Ask, Engine, ENGINE};
use super::fault_check;
use super::place::Faults;
use super::promote;
use super::retain;
use super::span::{self, Span, View};
use super::stats::Count;
use crate::fork::{Hooks, Stage};
use crate::sys;
use crate::tier::Backing;
use std::sync::atomic::Ordering::Relaxed;

/// Retained runs a decay step of the background thread purges at most.
const THREAD_DECAY_RUNS: usize = 64;

/// The background thread's work (see [`background`]): a decay step by the
/// clock, the fault check ([`fault_check`]) while blocks are allocated,
/// then a promotion pass of at most one tick from the end of the
/// step; returns the nanoseconds to sleep: none after a pass that was
/// still collapsing at its deadline (its own pacing holds it to its share
/// of a core), [`SHORT_BACKOFF_NS`](promote::SHORT_BACKOFF_NS) after a
/// collapse found no huge page to be had, else a tick (a pass that stopped
/// at its budget of examined units goes on from there at the next).
fn background_work() -> u64 {
    let e = &ENGINE;
    e.stats.add(Count::BackgroundPasses, 1);
    let now = sys::monotonic_ns();
    e.decay_step(now, THREAD_DECAY_RUNS);
    // At the start (a huge-path call started the thread) and while blocks
    // are allocated: may fresh units fault in huge pages?
    let active =
        e.demand.quiet_for(now) < fault_check::VALID_NS || e.stats.get(Count::HugeChecks) == 0;
    if e.promotes_unadvised() && active && crate::tier::thp_enabled() {
        let _ = e.fault_check.run(&e.stats);
    }
    if promoting() {
        let keep = e.demand.keep(now, e.stats.get(Count::Live));
        let pass = promote::Pass {
            deadline: sys::monotonic_ns().saturating_add(background::TICK_NS),
            // Collapsing a retained unit claims it: only while no block
            // was allocated for a tick, so no request finds it taken.
            retained: e.stats.get(Count::Retained) <= keep
                && e.demand.quiet_for(now) >= background::TICK_NS,
        };
        match promote::pass(&e.stats, &e.spans, &e.held, &pass) {
            promote::Stop::Deadline => return 0,
            promote::Stop::Short => return promote::SHORT_BACKOFF_NS,
            _ => {}
        }
    }
    background::TICK_NS
}

/// The background thread's start: the files its fault checks read.
fn background_init() {
    ENGINE.fault_check.open_files();
}

/// Whether units that fault in base pages are promoted later: the
/// background thread runs (or is being started) on a kernel with
/// `MADV_COLLAPSE`.
fn promoting() -> bool {
    background::state().promotes() && sys::linux_at_least(sys::LINUX_MADV_COLLAPSE)
}

impl Engine {
    /// A call of a front's small path: while something is retained and
    /// no background thread runs, a decay step every
    /// [`TICK_EVERY`](retain::TICK_EVERY) calls of a thread (one load
    /// otherwise), so a program that makes only small requests still gives
    /// retained blocks back.
    #[inline]
    pub(crate) fn small_call(&self) {
        if self.stats.get(Count::Retained) != 0
            && background::state() != BackgroundThread::Running
            && retain::tick_due()
        {
            self.decay_step(sys::monotonic_ns(), retain::DECAY_PER_STEP);
        }
    }

    /// One huge-path call: unless the background thread runs, a decay step
    /// every [`TICK_EVERY`](retain::TICK_EVERY) calls of a thread or when
    /// the clock says one is due (an eighth of the decay window after the
    /// last), so idle time counts at the next call.
    #[inline]
    pub(super) fn tick(&self) {
        if background::state() == BackgroundThread::Running {
            return;
        }
        let now = sys::monotonic_ns();
        let next = self.next_decay.load(Relaxed);
        let due = now >= next
            && self
                .next_decay
                .compare_exchange(
                    next,
                    now.saturating_add(demand::window_ns() / demand::SLOTS_PER_WINDOW),
                    Relaxed,
                    Relaxed,
                )
                .is_ok();
        if retain::tick_due() || due {
            self.decay_step(now, retain::DECAY_PER_STEP);
        }
    }

    /// A decay step at monotonic time `now` purging at most `runs` retained
    /// runs: what the demand of the window cannot take back goes
    /// ([`retain::decay`]).
    #[cold]
    pub(crate) fn decay_step(&self, now: u64, runs: usize) -> usize {
        let live = self.stats.get(Count::Live);
        // The live count now is demand too, also when nothing is allocated.
        self.demand.note(now, live);
        let keep = self.demand.keep(now, live);
        let back = retain::decay(
            &self.stats,
            &self.spans,
            span::stamp_at(now),
            retain::delay(),
            keep,
            runs,
        );
        if back > 0 {
            self.demand.released(now, live);
        }
        back
    }

    /// Live bytes grew by `len` at monotonic time `now`: counted, and
    /// noted as demand.
    pub(super) fn live_grew(&self, now: u64, len: usize) {
        self.stats.live_add(len);
        self.demand.grew(now, self.stats.get(Count::Live));
    }

    /// Retention could not serve `ask` whole and `claimed` bytes were
    /// claimed for it: the live bytes with the block (less the block a move
    /// replaces) are noted as demand with the retained bytes freed within
    /// the window as slack ([`Demand::note_with_slack`]). The retained runs
    /// that did not fit serve the blocks after it: a request's blocks are
    /// freed and allocated again in an order whose footprint exceeds its
    /// peak of live bytes, and keeping only that peak would make every
    /// repetition miss by the difference. A scan of the retained units of
    /// the spans that may hold some (none while nothing is retained), on a
    /// path that faults in fresh units.
    ///
    /// [`Demand::note_with_slack`]: super::demand::Demand::note_with_slack
    #[cold]
    pub(super) fn missed(&self, ask: &Ask<'_>, claimed: usize) {
        if demand::window_ns() == 0 {
            return;
        }
        let now = sys::monotonic_ns();
        let live = self
            .stats
            .get(Count::Live)
            .saturating_sub(ask.replaces as u64)
            .saturating_add(claimed as u64);
        // Nothing retained: no span to scan.
        let slack = if self.stats.get(Count::Retained) == 0 {
            0
        } else {
            retain::retained_within(&self.spans, span::stamp_at(now), retain::delay())
        };
        self.demand.note_with_slack(now, live, slack);
    }

    /// Whether fresh spans are reserved without `MADV_HUGEPAGE`: the
    /// background thread promotes their units later, and THP's `defrag`
    /// mode would make an advised fault compact memory synchronously (or
    /// cannot be read).
    pub(super) fn promotes_unadvised(&self) -> bool {
        promoting()
            && crate::thp::settings_once()
                .defrag
                .is_none_or(|d| d.advised_fault_compacts())
    }

    /// How the fresh units of a block of `len` bytes fault in: in huge
    /// pages when every THP span is advised `MADV_HUGEPAGE` (no thread
    /// promotes later) or the fault check grants it; else in base pages.
    pub(super) fn fresh_faults(&self, len: usize) -> Faults {
        if !self.promotes_unadvised() || self.fault_check.grant(len) {
            Faults::Huge
        } else {
            Faults::Base
        }
    }

    /// Whether `len` bytes of units of `span` (`v`) may fault in now: in a
    /// span advised `MADV_HUGEPAGE` while the thread promotes, only with
    /// the fault check's grant.
    pub(super) fn may_fault_in(&self, span: &Span, v: &View, len: usize) -> bool {
        v.tier != Backing::TransparentHuge
            || !span.advised()
            || self.fresh_faults(len) == Faults::Huge
    }

    /// Start the background thread if it is wanted; when it fails to start,
    /// the spans reserved for it are advised `MADV_HUGEPAGE` after all.
    #[inline]
    pub(super) fn background(&self) {
        if background::maybe_start(background_init, background_work) {
            for (span, v) in self.spans.live() {
                if v.tier == Backing::TransparentHuge {
                    span.advise_huge(&self.stats, &v);
                }
            }
        }
    }
}

/// Ask for the huge-page engine's background thread (decay by the clock
/// and promotion to huge pages, [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-background-thread)),
/// which [`CkHuge`](super::CkHuge) does not start on its own: it starts at
/// the next huge-path call, at the priority of the thread making that call
/// (a real-time policy it leaves for `SCHED_OTHER`). Call it before the
/// first allocation so that every span is reserved for promotion.
/// `CKALLOC_BACKGROUND_THREAD` set to an off value keeps it from starting.
/// Returns the state after the call. Never allocates; thread-safe.
pub fn enable_background_thread() -> BackgroundThread {
    background::want()
}

/// `pthread_atfork` prepare handler: the background thread is done with
/// what it claimed and starts nothing more.
///
/// # Safety
/// Called only by `crate::fork`'s prepare handler, before `fork()`.
unsafe fn fork_prepare() {
    background::pause_for_fork();
}

/// `pthread_atfork` parent handler: the background thread goes on.
///
/// # Safety
/// Called only by `crate::fork`'s parent handler, after `fork()`.
unsafe fn fork_parent() {
    background::resume_after_fork();
}

/// `pthread_atfork` child handler: no background thread runs (the next
/// huge-path call starts one), the parent's fault-check verdict is
/// dropped, the unit the parent's thread held is free again, spans another thread of the parent was creating or retiring
/// become empty slots, and the retained bytes are recounted from the
/// spans' bitmaps (units another thread had claimed at the fork stay out
/// of use in the child) and then given back, with the spans no block
/// uses. The child's retained pages are copy-on-write copies of the
/// parent's: `MADV_DONTNEED` in the child frees nothing the parent holds,
/// a write in the child would have copied them (4 KiB at a time, a huge
/// page's mapping split), and a child that made no huge-path call would
/// otherwise keep them, its own once the parent gives its copies back.
///
/// # Safety
/// Called only by `crate::fork`'s child handler, in the child's only
/// thread.
unsafe fn fork_child() {
    background::after_fork_in_child();
    // The parent's verdict is not the child's: base pages until its own
    // thread checks.
    ENGINE.fault_check.set(0, 0);
    ENGINE.held.release_in_child(&ENGINE.spans);
    let (retained, tails) = ENGINE.spans.repair_after_fork();
    ENGINE.stats.set(Count::Retained, retained);
    ENGINE.stats.set(Count::ShortTails, tails);
    ENGINE.release_retained();
}

/// The fork hooks of stage `Retention` (`crate::fork`), added when the
/// library is loaded: the background thread paused before `fork()` (done
/// with the units it claimed), the spans to repair in the child.
static FORK_HOOKS: Hooks = Hooks {
    prepare: fork_prepare,
    parent: fork_parent,
    child: fork_child,
};

crate::fork::at_load!(ADD_ENGINE_FORK_HOOKS, {
    crate::fork::add(Stage::Retention, &FORK_HOOKS);
});
