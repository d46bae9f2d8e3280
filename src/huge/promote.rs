//! Promotion: units of the THP tier that faulted in base pages become huge
//! pages later, off the request path, with `MADV_COLLAPSE` (Linux 6.1)
//! from the background thread, one 2 MiB unit per call:
//!
//! - **What**: units of a block live for [`PROMOTE_AFTER_MS`] (weights, a
//!   long-lived buffer) and retained units (the cache), each with at least
//!   half its base pages resident (`mincore`), so a collapse never commits
//!   more than twice what the program touched; never a unit the engine
//!   advised `MADV_NOHUGEPAGE` (short tails, the first-touch window), which
//!   the kernel refuses, nor one collapsed since its pages were last
//!   dropped. A unit the kernel refuses (`EINVAL`: the program advised it
//!   `MADV_NOHUGEPAGE` or locked it, or its pages are read-only, as
//!   copy-on-write pages after `fork()` are) is tried again every
//!   [`RETRY_REFUSED_NS`] or once its pages are dropped. A call that finds
//!   no huge page to be had (`ENOMEM`, or `EBUSY` at the cgroup's limit)
//!   ends the pass, and the next waits [`SHORT_BACKOFF_NS`].
//! - **Never a unit freed meanwhile**: a retained unit is claimed for the
//!   collapse (no block can take it meanwhile); a live unit's generation
//!   (raised when it leaves a block and when its pages are dropped) is
//!   read before and after the call, and a unit freed meanwhile whose
//!   pages were dropped (so the collapse may have filled it with zeros) is
//!   purged again when it can be claimed. A unit is marked collapsed or
//!   refused only if its generation did not move.
//! - **Pace**: after each call the thread sleeps three times as long as
//!   the call ran (its CPU time, `CLOCK_THREAD_CPUTIME_ID`: time it waited
//!   for a CPU behind other work is not a share of a core it took), so it
//!   takes at most a quarter of one core, and each call holds the
//!   mm's locks for the collapse of one 2 MiB page; the sleep is outside
//!   the wait of a `fork()` (no unit is claimed then), and a pass ends at
//!   its deadline (a tick after the decay step), so decay runs between
//!   passes.
//! - **Order**: units in slot and address order from where the last pass
//!   stopped, at most [`EXAMINED_PER_PASS`] examined a pass, so a program
//!   with terabytes of sparse blocks costs the thread a bounded number of
//!   `mincore` calls per tick; retained units only while the demand of the
//!   window keeps all that is retained (what decay is about to purge is
//!   not collapsed first) and no block was allocated for a tick (a claimed
//!   unit is one a request cannot take).
//!
//! No allocation, no lock (the kernel's aside), no panic.

use super::background;
use super::os;
use super::retain::{self, Restore};
use super::span::{self, Span, Spans, View};
use super::stats::{Count, Counters};
use crate::bits::{self, Snapshot};
use crate::sys::{self, Advice};
use crate::tier::Backing;
use std::sync::atomic::{
    fence, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// How long a block's unit has been live before it is promoted (250 ms):
/// longer than a request's temporaries live, short enough that a
/// long-lived block is huge within a second or two.
pub const PROMOTE_AFTER_MS: u64 = 250;
/// The thread sleeps this many times as long as each collapse ran.
pub const SLEEP_PER_BUSY: u64 = 3;
/// Units one pass examines at most (a `mincore` or a collapse each): 512
/// MiB of blocks; the next pass goes on from there.
pub const EXAMINED_PER_PASS: usize = 256;
/// The longest sleep after one collapse (1 s: a collapse that compacted
/// memory for over 300 ms).
const MAX_SLEEP_NS: u64 = 1_000_000_000;
/// How long the thread waits after a collapse found no huge page to be
/// had (1 s), so memory pressure or a cgroup at its limit does not meet a
/// collapse attempt, and the reclaim it may start, every tick.
pub const SHORT_BACKOFF_NS: u64 = 1_000_000_000;
/// How often units the kernel refused (`EINVAL`) are tried again (10 s,
/// khugepaged's default scan interval): a refusal may not last (a
/// copy-on-write page after `fork()` is read-only until written).
const RETRY_REFUSED_NS: u64 = 10_000_000_000;

/// The promotion's state between passes: the retained unit the
/// background thread holds claimed for a collapse (`(span slot << 32 |
/// unit) + 1`; 0 when none), which the child of a `fork()` releases
/// ([`Held::release_in_child`]), and where the next pass starts (`span slot
/// << 32 | unit`).
pub(crate) struct Held {
    unit: AtomicU64,
    cursor: AtomicU64,
    /// Monotonic ns at which refused units are tried again.
    retry_refused: AtomicU64,
}

impl Held {
    pub(crate) const fn new() -> Held {
        Held {
            unit: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            retry_refused: AtomicU64::new(0),
        }
    }

    fn set(&self, span: u16, u: u32) {
        self.unit
            .store((u64::from(span) << 32 | u64::from(u)) + 1, Relaxed);
    }

    fn clear(&self) {
        self.unit.store(0, Relaxed);
    }

    /// In the child of `fork()`: the unit the parent's thread held (the
    /// thread is not in the child) is free again, still retained.
    pub(crate) fn release_in_child(&self, spans: &Spans) {
        let w = self.unit.swap(0, Relaxed);
        if w != 0 {
            let w = w - 1;
            spans.get((w >> 32) as u16).release(w as u32, 1);
        }
    }
}

fn bit(s: &Snapshot, u: u32) -> bool {
    s[(u / 64) as usize] >> (u % 64) & 1 != 0
}

/// What became of one unit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Not looked at: a live unit younger than [`PROMOTE_AFTER_MS`].
    NotYet,
    /// Nothing done: not a candidate now (taken, sparse, changed).
    Skipped,
    /// A collapse call was made, running on a CPU this many nanoseconds.
    Called(u64),
    /// A collapse call found no huge page to be had (`ENOMEM`) or the
    /// cgroup's limit in the way (`EBUSY`).
    Short,
}

/// What a pass may do.
pub(crate) struct Pass {
    /// Monotonic ns after which the pass makes no more calls.
    pub(crate) deadline: u64,
    /// Whether retained units are collapsed too.
    pub(crate) retained: bool,
}

/// One promotion pass (see the [module docs](self)): the units from the
/// cursor on, in slot and address order, wrapping once, at most
/// [`EXAMINED_PER_PASS`] examined (a `mincore` or a collapse each), until
/// the deadline. Retained units only when `pass.retained`. Returns why it
/// ended.
pub(crate) fn pass(c: &Counters, spans: &Spans, held: &Held, pass: &Pass) -> Stop {
    let age = u32::try_from((PROMOTE_AFTER_MS * 1_000_000) >> 20).unwrap_or(u32::MAX);
    let order = from_cursor(spans, held.cursor.load(Relaxed));
    let now = sys::monotonic_ns();
    if now >= held.retry_refused.load(Relaxed) {
        // What the kernel refused may be collapsible now (a copy-on-write
        // page written since, a range the program advised back).
        held.retry_refused
            .store(now.saturating_add(RETRY_REFUSED_NS), Relaxed);
        for (span, v) in spans.live() {
            span.refused.clear(0, v.units);
        }
    }
    let mut examined = 0;
    let mut called = false;
    for (span, v, first, end) in order {
        if v.tier != Backing::TransparentHuge || v.shift != span::UNIT_SHIFT {
            continue;
        }
        let in_use = span.in_use.snapshot();
        let (holes, dirty) = (span.holes.snapshot(), span.dirty.snapshot());
        let open = bits::and(
            &bits::not(&span.collapsed.snapshot()),
            &bits::not(&span.refused.snapshot()),
        );
        let open = bits::and(&open, &bits::not(&span.base_pages.snapshot()));
        let open = bits::and(&open, &bits::not(&holes));
        let open = bits::within(&open, first, end);
        for u in bits::runs(&open).flat_map(|(s, e)| s..e) {
            if background::pausing() {
                return Stop::Paused;
            }
            if !span.is(&v) {
                break;
            }
            let outcome = match bit(&in_use, u) {
                true => live_unit(c, span, &v, u, age),
                false if pass.retained && bit(&dirty, u) => retained_unit(c, span, &v, u, held),
                false => continue,
            };
            let here = u64::from(v.index) << 32;
            let ran = match outcome {
                Outcome::NotYet => continue,
                Outcome::Skipped => 0,
                Outcome::Called(ns) => ns,
                Outcome::Short => {
                    // Back off; this unit is the first tried next time.
                    held.cursor.store(here | u64::from(u), Relaxed);
                    return Stop::Short;
                }
            };
            examined += 1;
            called |= outcome != Outcome::Skipped;
            // Paced outside the fork wait: no unit is claimed here.
            if ran > 0
                && !background::pause_point(ran.saturating_mul(SLEEP_PER_BUSY).min(MAX_SLEEP_NS))
            {
                held.cursor.store(here | u64::from(u + 1), Relaxed);
                return Stop::Paused;
            }
            let end = if examined >= EXAMINED_PER_PASS {
                Some(Stop::Budget)
            } else if sys::monotonic_ns() >= pass.deadline {
                // Only a pass that was collapsing may run again at once.
                Some(if called { Stop::Deadline } else { Stop::Budget })
            } else {
                None
            };
            if let Some(stop) = end {
                held.cursor.store(here | u64::from(u + 1), Relaxed);
                return stop;
            }
        }
    }
    held.cursor.store(0, Relaxed);
    Stop::Done
}

/// The live spans a pass visits from `cursor` (`span index << 32 | unit`),
/// each with the units `first..end` it covers: the cursor's span from the
/// unit, the spans after it, then, wrapping, the spans before it and the
/// cursor's span up to the unit. Every unit comes once.
fn from_cursor(spans: &Spans, cursor: u64) -> impl Iterator<Item = (&Span, View, u32, u32)> {
    let (at, unit) = ((cursor >> 32) as u16, cursor as u32);
    let part = move |v: &View| unit.min(v.units);
    let on = spans
        .live()
        .filter(move |(_, v)| v.index >= at)
        .map(move |(s, v)| (s, v, if v.index == at { part(&v) } else { 0 }, v.units));
    let wrapped = spans
        .live()
        .filter(move |(_, v)| v.index <= at)
        .map(move |(s, v)| (s, v, 0, if v.index == at { part(&v) } else { v.units }));
    on.chain(wrapped)
}

/// Why a pass ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Every unit was tried.
    Done,
    /// [`EXAMINED_PER_PASS`] units were examined: the next pass, a tick
    /// later, goes on from there.
    Budget,
    /// The deadline came while collapsing (at the paced share of a core):
    /// the next pass may start at once.
    Deadline,
    /// A `fork()` is waiting.
    Paused,
    /// No huge page could be had (`ENOMEM`, or `EBUSY` at the cgroup's
    /// limit): the next pass waits [`SHORT_BACKOFF_NS`].
    Short,
}

/// Whether unit `u` holds enough resident pages to collapse.
fn dense(span_view: &View, u: u32) -> bool {
    let len = span_view.len(1);
    let pages = len / sys::page_size();
    sys::resident_pages(span_view.addr(u), len).is_ok_and(|r| r * 2 >= pages)
}

/// Collapse unit `u`, of generation `gen` when the caller found it a
/// candidate (the caller keeps it from changing hands, or checks
/// afterwards); count the outcome. The unit is marked collapsed or refused
/// only while its pages are the ones the call saw: when they were dropped
/// meanwhile (its generation moved), the mark is cleared again.
fn collapse(c: &Counters, span: &Span, v: &View, u: u32, gen: u32) -> Outcome {
    let (t0, cpu0) = (sys::monotonic_ns(), sys::thread_cpu_ns());
    let r = os::advise(c, v.addr(u), v.len(1), Advice::Collapse);
    let (ns, cpu1) = (sys::monotonic_ns().saturating_sub(t0), sys::thread_cpu_ns());
    c.add(Count::CollapseNs, ns);
    // Without a thread CPU clock (reads 0), the wall clock paces.
    let ran = if cpu0 == 0 {
        ns
    } else {
        cpu1.saturating_sub(cpu0)
    };
    let outcome = match r {
        Ok(()) => {
            span.collapsed.set(u, 1);
            c.add(Count::Collapsed, v.len(1) as u64);
            Outcome::Called(ran)
        }
        Err(e) => {
            c.add(Count::CollapseFailures, 1);
            match e.raw_os_error() {
                Some(libc::EINVAL) => {
                    span.refused.set(u, 1);
                    Outcome::Called(ran)
                }
                Some(libc::ENOMEM | libc::EBUSY) => Outcome::Short,
                _ => Outcome::Called(ran),
            }
        }
    };
    // Paired with the fence of `Span::pages_dropped`.
    fence(SeqCst);
    if span.generation(u) != gen {
        span.collapsed.clear(u, 1);
        span.refused.clear(u, 1);
    }
    outcome
}

/// A unit in use: a block's, when it has been for `age` stamps.
fn live_unit(c: &Counters, span: &Span, v: &View, u: u32, age: u32) -> Outcome {
    // The generation before the stamp: a unit freed and handed out again
    // after this read fails the checks below.
    let gen = span.generation(u);
    if !span::older(span::stamp_now(), span.stamp_of(u), age) {
        return Outcome::NotYet;
    }
    if !dense(v, u) || span.in_use.count(u, 1) == 0 || span.generation(u) != gen {
        return Outcome::Skipped;
    }
    let outcome = collapse(c, span, v, u, gen);
    if span.generation(u) != gen {
        // Freed or purged meanwhile: a collapse after its pages were
        // dropped may have faulted in a huge page of zeros. A clean free
        // unit is purged again (a retained one keeps what the collapse gave
        // it; a unit claimed meanwhile is its claimer's).
        c.add(Count::CollapseRaces, 1);
        span.pages_dropped(u, 1);
        if span.claim(v, u, 1) {
            if span.dirty.count(u, 1) == 0 {
                let _ = retain::purge(c, &span.units(*v, u, 1), Restore::Access);
            }
            span.release(u, 1);
        }
    }
    outcome
}

/// A retained unit: claimed for the collapse, then free again.
fn retained_unit(c: &Counters, span: &Span, v: &View, u: u32, held: &Held) -> Outcome {
    if !span.claim(v, u, 1) {
        return Outcome::Skipped;
    }
    held.set(v.index, u);
    let gen = span.generation(u);
    let outcome = if span.dirty.count(u, 1) != 0 && dense(v, u) {
        collapse(c, span, v, u, gen)
    } else {
        Outcome::Skipped
    };
    held.clear();
    span.release(u, 1);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::huge::extents::ExtentMap;
    use crate::sys::HUGE_PAGE_2M;

    #[test]
    #[cfg_attr(miri, ignore = "mmap of the spans")]
    fn a_pass_that_collapsed_nothing_by_its_deadline_waits_a_tick_and_refusals_are_retried() {
        static SPANS: Spans = Spans::new();
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        let v = SPANS
            .reserve(&c, &MAP, HUGE_PAGE_2M, HUGE_PAGE_2M, 0, false)
            .unwrap();
        let span = SPANS.get(v.index);
        // A pass from unit 3 of the span covers 3.., then wraps to ..3
        // (a span of fewer units, under an address-space limit: all once).
        let ranges: Vec<(u16, u32, u32)> = from_cursor(&SPANS, u64::from(v.index) << 32 | 3)
            .map(|(_, w, a, e)| (w.index, a, e))
            .collect();
        let at = v.units.min(3);
        assert_eq!(ranges, [(v.index, at, v.units), (v.index, 0, at)]);
        if v.tier == Backing::TransparentHuge {
            // Two units of a block in use for about a second: old enough,
            // but untouched (not half resident), so examined, not collapsed.
            assert!(span.claim(&v, 0, 2));
            span.stamp(0, 2, span::stamp_now().wrapping_sub(1 << 10));
            span.refused.set(5, 1);
            let held = Held::new();
            held.retry_refused.store(u64::MAX, Relaxed);
            let late = Pass {
                deadline: 0,
                retained: false,
            };
            assert_eq!(pass(&c, &SPANS, &held, &late), Stop::Budget);
            assert_eq!(span.refused.count(5, 1), 1, "not yet time to retry");
            held.retry_refused.store(0, Relaxed);
            assert_eq!(pass(&c, &SPANS, &held, &late), Stop::Budget);
            assert_eq!(span.refused.count(5, 1), 0, "tried again");
            assert_eq!(c.get(Count::Collapsed) + c.get(Count::CollapseFailures), 0);
            span.release(0, 2);
        } else {
            eprintln!("SKIP: no THP tier on this machine");
        }
        assert!(SPANS.retire(&c, &v).is_some());
    }
}
