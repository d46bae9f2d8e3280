//! Retention: freed units kept with their pages (retained) up to a cap;
//! what the demand of the last window cannot take back
//! ([`Demand`](super::demand::Demand)) is purged ([`purge`]: `MADV_DONTNEED`,
//! keeping the address space), oldest first, by [`decay`] steps that the
//! background thread runs by the clock, or, without it, engine calls
//! (every [`TICK_EVERY`] calls of a thread, or a huge-path call once the
//! clock says one is due); only idle spans go back with `munmap`. hugetlb
//! units are never purged: they are unmapped as holes. The rules are in
//! [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#purge-not-unmap).

use super::os;
use super::policy::CapRule;
use super::span::{self, Span, Spans, Units, View};
use super::stats::{Count, Counters};
use crate::bits;
use crate::env;
use crate::sys::Advice;
use crate::tier::Backing;
use std::cell::Cell;

/// Engine calls of one thread between two decay steps.
pub(crate) const TICK_EVERY: u32 = 256;
/// Retained runs one decay step purges at most.
pub(crate) const DECAY_PER_STEP: usize = 4;

thread_local! {
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

/// Counts one engine call; `true` every [`TICK_EVERY`] calls of a thread.
#[inline]
pub(crate) fn tick_due() -> bool {
    CALLS
        .try_with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n % TICK_EVERY == 0
        })
        .unwrap_or(false)
}

/// The cap on retained bytes under `rule` now.
pub(crate) fn cap(c: &Counters, rule: CapRule) -> usize {
    match rule {
        CapRule::Nothing => 0,
        CapRule::Environment => env::retain_bytes(),
        CapRule::TwiceLivePeak if env::retain_bytes_set() => env::retain_bytes(),
        CapRule::TwiceLivePeak => {
            let peak = usize::try_from(c.get(Count::LivePeak)).unwrap_or(usize::MAX);
            env::retain_bytes().max(peak.saturating_mul(2))
        }
    }
}

/// Count `len` more retained bytes if they fit under `cap`; `false` (and
/// nothing counted) when they do not.
pub(crate) fn admit(c: &Counters, len: usize, cap: usize) -> bool {
    if len > cap {
        return false;
    }
    let before = c.add(Count::Retained, len as u64);
    if before.saturating_add(len as u64) > cap as u64 {
        c.sub(Count::Retained, len as u64);
        return false;
    }
    true
}

/// How much of what the program did to a range a purge undoes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restore {
    /// Its access: the purged range is read-write again (`mprotect`) and,
    /// when `MADV_DONTNEED` found it locked, unlocked, so the next block
    /// never faults writing it. Advice the program gave it stays (it
    /// changes page sizes, not what the next block may do).
    Access,
    /// Access and advice: the range is made plain memory of its tier again
    /// (a block moved away, taking the program's changes, or a locked range
    /// whose advice `munlock` does not touch).
    Everything,
}

/// Purge units `u` (claimed by the caller): they read zero and are
/// read-write afterwards; a locked range is unlocked and purged again.
/// `true` when that worked (and the range restored as `restore` says);
/// `false` leaves them as they were.
pub(crate) fn purge(c: &Counters, u: &Units<'_>, restore: Restore) -> bool {
    if u.v.tier == Backing::Hugetlb {
        return false;
    }
    let (span, p, len) = (u.span, u.addr(), u.len());
    let mut plain = restore == Restore::Everything;
    let mut r = os::purge(c, p, len);
    if r.as_ref()
        .is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL))
    {
        // `mlock`ed pages refuse MADV_DONTNEED.
        let _ = os::munlock(c, p, len);
        r = os::purge(c, p, len);
        plain = true;
    }
    // Read-write again: a range the program made read-only or `PROT_NONE`
    // before freeing it would fault in the next block's first write.
    if r.is_err() || os::commit(c, p, len).is_err() {
        return false;
    }
    // Advice only: a failure leaves the range as it was advised. A span
    // reserved unadvised is never advised here: its clean units are the
    // ones whose faults take base pages.
    let advised = u.v.tier == Backing::TransparentHuge && span.advised();
    if advised && (plain || span.base_pages.count(u.start, u.n) > 0) {
        let _ = os::advise(c, p, len, Advice::HugePage);
        span.forget_advice(c, u.start, u.n);
    }
    span.dirty.clear(u.start, u.n);
    span.pages_dropped(u.start, u.n);
    c.add(Count::Purged, len as u64);
    true
}

/// What became of units given back to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Back {
    /// Purged: clean, free for the next block.
    Clean,
    /// hugetlb units unmapped (their pages back in the pool): a hole of
    /// their span, in use by no block for good.
    Hole,
    /// The system call failed: the units are as they were.
    Kept,
}

/// Give claimed units back to the kernel: purged, or in a hugetlb span
/// unmapped as a hole (retiring the span when no block uses it).
fn give_to_kernel(c: &Counters, spans: &Spans, u: &Units<'_>, restore: Restore) -> Back {
    if u.v.tier != Backing::Hugetlb {
        return if purge(c, u, restore) {
            Back::Clean
        } else {
            Back::Kept
        };
    }
    if u.span.unmap_hole(c, &u.v, u.start, u.n).is_err() {
        return Back::Kept;
    }
    if unused(u.span, &u.v) {
        let _ = spans.retire(c, &u.v);
    }
    Back::Hole
}

/// Give back free units the caller claimed from a snapshot of the retained
/// ones, and release them; the retained among them (counted now) stop
/// counting. Returns their bytes, `None` when the system call failed.
fn release_claimed(c: &Counters, spans: &Spans, u: &Units<'_>) -> Option<usize> {
    let bytes = u.v.len(u.span.dirty.count(u.start, u.n));
    let back = give_to_kernel(c, spans, u, Restore::Access);
    if back != Back::Hole {
        u.span.release(u.start, u.n);
    }
    (back != Back::Kept).then(|| {
        c.sub(Count::Retained, bytes as u64);
        bytes
    })
}

/// Units leave a block (freed, or cut off by a shrink): stamped now, then
/// retained when `kept` (their bytes [admitted](admit)), else given back to
/// the kernel (retained after all if that fails), then released.
pub(crate) fn give(c: &Counters, spans: &Spans, u: &Units<'_>, kept: bool, restore: Restore) {
    let (span, start, n) = (u.span, u.start, u.n);
    span.stamp(start, n, span::stamp_now());
    span.next_generation(start, n);
    if !kept {
        match give_to_kernel(c, spans, u, restore) {
            Back::Clean => return span.release(start, n),
            Back::Hole => return,
            Back::Kept => {
                c.add(Count::Retained, u.len() as u64);
            }
        }
    }
    span.dirty.set(start, n);
    span.release(start, n);
}

/// Units `u` were just claimed for a block: the retained ones among them
/// stop counting as retained. Returns how many were.
pub(crate) fn taken(c: &Counters, u: &Units<'_>) -> u32 {
    let d = u.span.dirty.count(u.start, u.n);
    c.sub(Count::Retained, u.v.len(d) as u64);
    d
}

/// Purge retained runs, the least recently freed first, until `need`
/// more bytes fit under `cap`; `false` when they cannot.
pub(crate) fn make_room(c: &Counters, spans: &Spans, need: usize, cap: usize) -> bool {
    let target = (cap as u64).saturating_sub(need as u64);
    purge_oldest(c, spans, target, usize::MAX, None);
    c.get(Count::Retained).saturating_add(need as u64) <= cap as u64
}

/// Purge retained runs, the least recently freed first, until at most
/// `target` bytes are retained or `runs` runs are purged, or, with
/// `expiry` = (now, delay), the oldest run was freed less than `delay`
/// stamps before `now`; returns the bytes purged. Stops at a run whose
/// purge failed (tried again later).
fn purge_oldest(
    c: &Counters,
    spans: &Spans,
    target: u64,
    runs: usize,
    expiry: Option<(u32, u32)>,
) -> usize {
    let mut purged = 0;
    for _ in 0..runs {
        if c.get(Count::Retained) <= target {
            break;
        }
        let Some((span, v, s, e)) = oldest_run(spans) else {
            break;
        };
        if expiry.is_some_and(|(now, delay)| !expired(now, span.stamp_of(s), delay)) {
            break;
        }
        if !span.claim(&v, s, e - s) {
            continue;
        }
        match release_claimed(c, spans, &span.units(v, s, e - s)) {
            Some(bytes) => purged += bytes,
            None => {
                span.stamp(s, e - s, span::stamp_now());
                break;
            }
        }
    }
    purged
}

/// The run of retained units freed at the oldest stamp.
fn oldest_run(spans: &Spans) -> Option<(&Span, View, u32, u32)> {
    let now = span::stamp_now();
    let mut best: Option<(u32, RetainedUnit<'_>)> = None;
    for r in retained_units(spans) {
        // A stamp written since `now` was read is the newest.
        let age = span::age(now, r.span.stamp_of(r.unit)).unwrap_or(0);
        if best.as_ref().is_none_or(|b| age > b.0) {
            best = Some((age, r));
        }
    }
    let (_, r) = best?;
    let (span, v, u, (s, e)) = (r.span, r.view, r.unit, r.run);
    let t = span.stamp_of(u);
    let first = (s..u)
        .rev()
        .take_while(|&i| span.stamp_of(i) == t)
        .last()
        .unwrap_or(u);
    let end = u + (u..e).take_while(|&i| span.stamp_of(i) == t).count() as u32;
    Some((span, v, first, end))
}

/// Retained bytes freed within the last `delay` stamps before stamp `now`:
/// the runs decay leaves in place this window. A scan of the spans'
/// retained units ([`retained_units`]), as [`oldest_run`]'s.
#[cold]
pub(crate) fn retained_within(spans: &Spans, now: u32, delay: u32) -> u64 {
    retained_units(spans)
        .filter(|r| !expired(now, r.span.stamp_of(r.unit), delay))
        .fold(0u64, |bytes, r| bytes.saturating_add(r.view.len(1) as u64))
}

/// One retained unit: its span, the span's view, the unit, and the run of
/// retained units `[start, end)` holding it.
struct RetainedUnit<'a> {
    span: &'a Span,
    view: View,
    unit: u32,
    run: (u32, u32),
}

/// Every retained unit of every live span, span by span and run by run in
/// address order. A span whose noted bounds hold no retained run is passed
/// over with one read of its header, as in [`release_all`]: a program with
/// thousands of spans in use pays for the spans that retain, not for all.
fn retained_units(spans: &Spans) -> impl Iterator<Item = RetainedUnit<'_>> {
    let retains = |span: &Span| span.bounds().is_none_or(|b| b.retained > 0);
    spans
        .live()
        .filter(move |(span, _)| retains(span))
        .flat_map(|(span, view)| {
            bits::runs(&retained(span, &view)).flat_map(move |run| {
                (run.0..run.1).map(move |unit| RetainedUnit {
                    span,
                    view,
                    unit,
                    run,
                })
            })
        })
}

/// The free units of `span` that hold pages.
fn retained(span: &Span, v: &View) -> bits::Snapshot {
    let free = bits::not_below(&span.in_use.snapshot(), v.units);
    bits::and(&free, &span.dirty.snapshot())
}

/// Whether stamp `t` is at least `delay` stamps before `now`.
fn expired(now: u32, t: u32, delay: u32) -> bool {
    span::older(now, t, delay)
}

/// The decay window in stamps (`CKALLOC_RETAIN_DECAY_MS`).
pub(crate) fn delay() -> u32 {
    let ns = env::retain_decay_ms().saturating_mul(1_000_000);
    u32::try_from(ns >> 20).unwrap_or(u32::MAX)
}

/// One decay step at stamp `now`, with a window of `delay` stamps, when the
/// window's demand can take back `keep` retained bytes, doing at most
/// `budget` system calls' worth of work: spans no block has used for the
/// window go back (with their retained units when more than `keep` is
/// retained), then retained runs freed a window ago or earlier are purged,
/// oldest first, while more than `keep` is retained. A run freed within
/// the window stays (the window's demand may take it back). Returns the
/// bytes given back.
#[cold]
pub(crate) fn decay(
    c: &Counters,
    spans: &Spans,
    now: u32,
    delay: u32,
    keep: u64,
    budget: usize,
) -> usize {
    let mut budget = budget;
    let mut back = 0;
    for (span, v) in spans.live() {
        if budget == 0 {
            break;
        }
        // Cheapest test first: most spans of a busy program are in use.
        if unused(span, &v)
            && (span.dirty.count(0, v.units) == 0 || c.get(Count::Retained) > keep)
            && (0..v.units).all(|u| expired(now, span.stamp_of(u), delay))
        {
            if let Some(dirty) = spans.retire(c, &v) {
                back += dirty;
                budget -= 1;
            }
        }
    }
    back += purge_oldest(c, spans, keep, budget, Some((now, delay)));
    c.add(Count::Decayed, back as u64);
    back
}

/// Whether no unit of the span is in use by a block.
fn unused(span: &Span, v: &View) -> bool {
    span.busy(v) == 0
}

/// The last resort when address space is short: unmap every free run of
/// the spans in use as holes, so a new span can take the address space.
/// Returns the bytes unmapped.
#[cold]
pub(crate) fn punch(c: &Counters, spans: &Spans) -> usize {
    let mut unmapped = 0;
    for (span, v) in spans.live() {
        if span.bounds().is_some_and(|b| b.free == 0) {
            continue;
        }
        let free = bits::not_below(&span.in_use.snapshot(), v.units);
        for (s, e) in bits::runs(&free) {
            if !span.claim(&v, s, e - s) {
                continue;
            }
            match span.unmap_hole(c, &v, s, e - s) {
                Ok(dirty) => {
                    c.sub(Count::Retained, dirty as u64);
                    unmapped += v.len(e - s);
                }
                Err(_) => span.release(s, e - s),
            }
        }
    }
    unmapped
}

/// Purge every retained run and give back every span no block uses;
/// returns the bytes that released (purged, or given back with a span).
pub(crate) fn release_all(c: &Counters, spans: &Spans) -> usize {
    let mut released = 0;
    for (span, v) in spans.live() {
        // A span with no retained run and a block has nothing to give. With
        // no hole, a free run shorter than the span proves a block; with
        // holes the free units may be several runs and no block.
        let nothing = span.bounds().is_some_and(|b| {
            b.retained == 0 && b.free < v.units && span.holes.count(0, v.units) == 0
        });
        if nothing {
            continue;
        }
        if unused(span, &v) {
            if let Some(dirty) = spans.retire(c, &v) {
                released += dirty;
                continue;
            }
        }
        for (s, e) in bits::runs(&retained(span, &v)) {
            if span.claim(&v, s, e - s) {
                released += release_claimed(c, spans, &span.units(v, s, e - s)).unwrap_or(0);
            }
        }
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::huge::extents::ExtentMap;
    use crate::sys::HUGE_PAGE_2M;

    /// The `VmFlags` line of the mapping holding `addr`.
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((a, b)) = range.filter(|_| !line.starts_with("VmFlags")) {
                let hex = |t| usize::from_str_radix(t, 16).ok();
                if let (Some(a), Some(b)) = (hex(a), hex(b)) {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside && line.starts_with("VmFlags:") {
                return Some(line.to_string());
            }
        }
        None
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap")]
    fn the_window_s_retained_bytes_skip_only_spans_whose_bounds_hold_none() {
        static SPANS: Spans = Spans::new();
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        let v = SPANS
            .reserve(&c, &MAP, 2 * HUGE_PAGE_2M, HUGE_PAGE_2M, 0, false)
            .unwrap();
        let span = SPANS.get(v.index);
        assert!(span.claim(&v, 0, 2));
        span.commit(&c, &v, 2).unwrap();
        span.dirty.set(0, 2);
        let now = span::stamp_now();
        // A window of 1000 stamps (about a second), whatever
        // `CKALLOC_RETAIN_DECAY_MS` says.
        let window = 1000;
        span.stamp(0, 2, now);
        // Both units in a block: a search notes no retained run.
        span.note_bounds(span.release_count(), &v);
        assert_eq!(span.bounds().map(|b| b.retained), Some(0));
        assert_eq!(retained_within(&SPANS, now, window), 0);
        // A unit made free behind the bounds' back (only a test does so:
        // a release frees a unit) is not seen: the span is passed over on
        // its bounds alone.
        span.in_use.clear(1, 1);
        assert_eq!(span.bounds().map(|b| b.retained), Some(0));
        assert_eq!(retained_within(&SPANS, now, window), 0);
        assert!(span.claim(&v, 1, 1));
        // Unit 1 freed with its pages: the release ends the bounds, and
        // the unit counts until it is older than the window.
        span.release(1, 1);
        assert_eq!(span.bounds(), None);
        assert_eq!(retained_within(&SPANS, now, window), v.len(1) as u64);
        assert_eq!(retained_within(&SPANS, now.wrapping_add(window), window), 0);
        // Bounds noted again see the retained unit: it still counts.
        span.note_bounds(span.release_count(), &v);
        assert_eq!(span.bounds().map(|b| b.retained), Some(1));
        assert_eq!(retained_within(&SPANS, now, window), v.len(1) as u64);
        span.release(0, 1);
        assert!(SPANS.retire(&c, &v).is_some());
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap and procfs")]
    fn a_purge_advises_huge_pages_only_in_a_span_reserved_advised() {
        static SPANS: Spans = Spans::new();
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        for advise in [false, true] {
            let v = SPANS
                .reserve(&c, &MAP, HUGE_PAGE_2M, HUGE_PAGE_2M, 0, advise)
                .unwrap();
            if v.tier != Backing::TransparentHuge {
                eprintln!("no THP span here: skipped");
                return;
            }
            let span = SPANS.get(v.index);
            assert!(span.claim(&v, 0, 1));
            span.commit(&c, &v, 1).unwrap();
            let u = span.units(v, 0, 1);
            // A block moved away (`Restore::Everything`) that the program
            // had advised base pages.
            os::advise(&c, u.addr(), u.len(), Advice::NoHugePage).unwrap();
            span.dirty.set(0, 1);
            assert!(purge(&c, &u, Restore::Everything));
            let flags = vm_flags(u.addr().as_ptr() as usize).expect("the unit is mapped");
            assert_eq!(flags.contains(" hg"), advise, "{flags}");
            assert_eq!(span.dirty.count(0, 1), 0, "purged units are clean");
            span.release(0, 1);
            assert!(SPANS.retire(&c, &v).is_some());
        }
    }
}
