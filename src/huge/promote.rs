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
//!   dropped. A unit the kernel refuses for good (`EINVAL`: the program
//!   advised it `MADV_NOHUGEPAGE`, or locked it) is not tried again until
//!   its pages are dropped.
//! - **Never a unit freed meanwhile**: a retained unit is claimed for the
//!   collapse (no block can take it meanwhile); a live unit's generation
//!   is read before and after the call, and a unit freed meanwhile whose
//!   pages were dropped (so the collapse may have filled it with zeros) is
//!   purged again when it can be claimed.
//! - **Pace**: after each call the thread sleeps three times as long as
//!   the call ran (its CPU time, `CLOCK_THREAD_CPUTIME_ID`: time it waited
//!   for a CPU behind other work is not a share of a core it took), so it
//!   takes at most a quarter of one core, and each call holds the
//!   mm's locks for the collapse of one 2 MiB page; a pass ends at its
//!   deadline (the thread's tick), so decay runs between passes.
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
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
/// memory for over 100 ms).
const MAX_SLEEP_NS: u64 = 1_000_000_000;

/// The promotion's state between passes: the retained unit the
/// background thread holds claimed for a collapse (`(span slot << 32 |
/// unit) + 1`; 0 when none), which the child of a `fork()` releases
/// ([`Held::release_in_child`]), and where the next pass starts (`span slot
/// << 32 | unit`).
pub(crate) struct Held {
    unit: AtomicU64,
    cursor: AtomicU64,
}

impl Held {
    pub(crate) const fn new() -> Held {
        Held {
            unit: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
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
    /// Nothing done: not a candidate now (taken, sparse, changed).
    Skipped,
    /// A collapse call was made, running on a CPU this many nanoseconds.
    Called(u64),
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
    let cursor = held.cursor.load(Relaxed);
    let (from_span, from_unit) = ((cursor >> 32) as u16, cursor as u32);
    let order = spans
        .live()
        .filter(|(_, v)| v.index >= from_span)
        .chain(spans.live().filter(|(_, v)| v.index <= from_span));
    let mut examined = 0;
    for (k, (span, v)) in order.enumerate() {
        if v.tier != Backing::TransparentHuge || v.shift != span::UNIT_SHIFT {
            continue;
        }
        let first = if k == 0 && v.index == from_span {
            from_unit
        } else {
            0
        };
        let in_use = span.in_use.snapshot();
        let (holes, dirty) = (span.holes.snapshot(), span.dirty.snapshot());
        let open = bits::and(
            &bits::not(&span.collapsed.snapshot()),
            &bits::not(&span.refused.snapshot()),
        );
        let open = bits::and(&open, &bits::not(&span.base_pages.snapshot()));
        let open = bits::and(&open, &bits::not(&holes));
        let open = bits::within(&open, first, v.units);
        for u in bits::runs(&open).flat_map(|(s, e)| s..e) {
            if background::pausing() {
                return Stop::Paused;
            }
            if !span.is(&v) {
                break;
            }
            let outcome = match bit(&in_use, u) {
                true if span::older(span::stamp_now(), span.stamp_of(u), age) => {
                    live_unit(c, span, &v, u)
                }
                false if pass.retained && bit(&dirty, u) => retained_unit(c, span, &v, u, held),
                _ => continue,
            };
            examined += 1;
            if let Outcome::Called(ns) = outcome {
                sys::sleep_ns(ns.saturating_mul(SLEEP_PER_BUSY).min(MAX_SLEEP_NS));
            }
            let end = if examined >= EXAMINED_PER_PASS {
                Some(Stop::Budget)
            } else if sys::monotonic_ns() >= pass.deadline {
                Some(Stop::Deadline)
            } else {
                None
            };
            if let Some(stop) = end {
                held.cursor
                    .store(u64::from(v.index) << 32 | u64::from(u + 1), Relaxed);
                return stop;
            }
        }
    }
    held.cursor.store(0, Relaxed);
    Stop::Done
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
}

/// Whether unit `u` holds enough resident pages to collapse.
fn dense(span_view: &View, u: u32) -> bool {
    let len = span_view.len(1);
    let pages = len / sys::page_size();
    sys::resident_pages(span_view.addr(u), len).is_ok_and(|r| r * 2 >= pages)
}

/// Collapse unit `u` (the caller keeps it from changing hands, or checks
/// afterwards); count the outcome.
fn collapse(c: &Counters, span: &Span, v: &View, u: u32) -> Outcome {
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
    match r {
        Ok(()) => {
            span.collapsed.set(u, 1);
            c.add(Count::Collapsed, v.len(1) as u64);
        }
        Err(e) => {
            c.add(Count::CollapseFailures, 1);
            if e.raw_os_error() == Some(libc::EINVAL) {
                span.refused.set(u, 1);
            }
        }
    }
    Outcome::Called(ran)
}

/// A unit of a live block.
fn live_unit(c: &Counters, span: &Span, v: &View, u: u32) -> Outcome {
    let gen = span.generation(u);
    if !dense(v, u) || span.in_use.count(u, 1) == 0 || span.generation(u) != gen {
        return Outcome::Skipped;
    }
    let outcome = collapse(c, span, v, u);
    if span.generation(u) != gen {
        // Freed meanwhile: a collapse after its pages were dropped may have
        // faulted in a huge page of zeros. A clean free unit is purged
        // again (a retained one keeps what the collapse gave it).
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
    let outcome = if span.dirty.count(u, 1) != 0 && dense(v, u) {
        collapse(c, span, v, u)
    } else {
        Outcome::Skipped
    };
    held.clear();
    span.release(u, 1);
    outcome
}
