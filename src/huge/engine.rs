//! The huge-page engine ([`ENGINE`]): the tier ladder's state, the spans,
//! retention, the extent map, first touch and the statistics, and the
//! pointer face its fronts call with their [`Policy`] ([`Engine::alloc`],
//! [`Engine::free`], [`Engine::resize`], [`Engine::usable_size`]). Nothing
//! here allocates, locks, panics or prints. Its upkeep off the request
//! path (the decay step, the background thread, the fork hooks) is in
//! `upkeep.rs`.

use super::background;
use super::demand::Demand;
use super::error::HugeError;
use super::extents::{Descriptor, ExtentMap};
use super::fault_check::FaultCheck;
use super::first_touch::Window;
use super::ladder::{Ladder, Mapping};
use super::options::HugeOptions;
use super::os;
use super::place::{self, Faults, Groups, Placement, Want};
use super::policy::{CapRule, OnMiss, Policy, WhenFull, Zeroing, ZERO_BY_MEMSET_MAX};
use super::promote::Held;
use super::retain::{self, Restore};
use super::span::{self, Span, Spans, Units, View};
use super::stats::{Count, Counters, HugeStats};
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use crate::tier::Backing;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU64;

/// Whether the bytes a call hands out must read zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    Zeroed,
    Uninit,
}

/// A block: its start (aligned to at least 2 MiB) and its whole length (a
/// multiple of 2 MiB, all of it the caller's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

/// Why [`Engine::resize`] handed nothing out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResizeError {
    /// No block of the engine starts at the pointer.
    NotOurs,
    /// No memory for the new length; the block is as it was.
    NoMemory,
}

/// The engine (see the [module docs](self)); the one value is [`ENGINE`].
pub(crate) struct Engine {
    pub(crate) stats: Counters,
    pub(crate) ladder: Ladder,
    pub(crate) spans: Spans,
    pub(crate) extents: ExtentMap,
    pub(crate) window: Window,
    pub(crate) demand: Demand,
    /// Whether fresh units may fault in huge pages now.
    pub(crate) fault_check: FaultCheck,
    /// The retained unit the background thread holds for a collapse.
    pub(crate) held: Held,
    /// Monotonic ns at which a huge-path call runs the next decay step
    /// when no background thread does.
    pub(super) next_decay: AtomicU64,
}

/// Short tails advised base pages at most at once ([`Engine::keep_tail_out`]).
pub(crate) const MAX_SHORT_TAILS: u64 = 256;

/// The process's engine, which every front uses.
pub(crate) static ENGINE: Engine = Engine {
    stats: Counters::new(),
    ladder: Ladder::new(),
    spans: Spans::new(),
    extents: ExtentMap::new(),
    window: Window::new(),
    demand: Demand::new(),
    fault_check: FaultCheck::new(),
    held: Held::new(),
    next_decay: AtomicU64::new(0),
};

/// Units claimed and made ready for a block.
pub(super) struct Claimed<'a> {
    pub(super) span: &'a Span,
    pub(super) p: Placement,
}

impl<'a> Claimed<'a> {
    /// The claimed units.
    pub(super) fn units(&self) -> Units<'a> {
        self.span.units(self.p.view, self.p.start, self.p.n)
    }
}

/// What an allocation asks for: `len` bytes (a multiple of 2 MiB) aligned
/// to `align`, for the home group `home`, of which the caller asked for
/// `size`.
pub(super) struct Ask<'p> {
    pub(super) size: usize,
    pub(super) len: usize,
    pub(super) align: usize,
    pub(super) home: u32,
    pub(super) fill: Fill,
    pub(super) policy: &'p Policy,
    /// The length of the block this one replaces (a move), live until the
    /// new one is ready; 0 for an allocation.
    pub(super) replaces: usize,
}

impl<'p> Ask<'p> {
    /// An ask of the calling thread.
    pub(super) fn new(
        size: usize,
        len: usize,
        align: usize,
        fill: Fill,
        policy: &'p Policy,
    ) -> Ask<'p> {
        let home = span::home_group();
        Ask {
            size,
            len,
            align,
            home,
            fill,
            policy,
            replaces: 0,
        }
    }
}

/// The length of a block for `size` bytes aligned to `align`: `size`
/// rounded up to 2 MiB; `None` when that, or the address space aligning
/// needs, overflows `isize::MAX`, or `align` is not a power of two.
pub(crate) fn block_len(size: usize, align: usize) -> Option<usize> {
    let len = sys::round_up(size.max(1), HUGE_PAGE_2M)?;
    let room = len.checked_add(align.max(HUGE_PAGE_2M))?;
    (align.is_power_of_two() && room <= isize::MAX as usize).then_some(len)
}

impl Engine {
    /// The cap on retained bytes `policy` has now.
    pub(crate) fn retain_cap(&self, policy: &Policy) -> usize {
        retain::cap(&self.stats, policy.cap)
    }

    /// Whether `policy` retains a block of `len` bytes.
    fn retains(&self, len: usize, policy: &Policy) -> bool {
        policy.cap != CapRule::Nothing
            && len <= policy.retain_max
            && crate::env::retain_bytes() != 0
    }

    /// A block of at least `size` bytes aligned to `align` (a power of
    /// two), reading zero when `fill` asks; `None` when no memory can be
    /// had (see docs/engine.md for the order of places tried).
    pub(crate) fn alloc(
        &self,
        size: usize,
        align: usize,
        fill: Fill,
        policy: &Policy,
    ) -> Option<Block> {
        let len = block_len(size, align)?;
        // First, so the spans this call reserves are the thread's to promote.
        self.background();
        self.tick();
        let c = self.claim(&Ask::new(size, len, align, fill, policy))?;
        Some(self.hand_out(c, size, policy, true))
    }

    /// Claim units for a block (see [`alloc`](Self::alloc)).
    pub(super) fn claim(&self, ask: &Ask<'_>) -> Option<Claimed<'_>> {
        let (fill, policy) = (ask.fill, ask.policy);
        let retains = self.retains(ask.len, policy);
        // A block cleared by a purge of its retained units faults them in
        // again as fresh ones: its verdict comes first.
        let purges = fill == Fill::Zeroed
            && (policy.zeroing == Zeroing::Purge || ask.len > ZERO_BY_MEMSET_MAX);
        let mut faults = purges.then(|| self.fresh_faults(ask.len));
        if retains {
            if self.stats.get(Count::Retained) >= ask.len as u64 {
                let some = faults.map_or(Faults::Any, Faults::some_units);
                if let Some(c) = self.take(Want::Retained, Groups::Any, some, ask) {
                    self.stats.add(Count::Hits, 1);
                    if c.p.run > c.p.n {
                        self.stats.add(Count::Carves, 1);
                    }
                    return Some(c);
                }
            }
            self.stats.add(Count::Misses, 1);
        }
        let faults = *faults.get_or_insert_with(|| self.fresh_faults(ask.len));
        let extends = retains && policy.on_miss == OnMiss::ExtendRetained && fill == Fill::Uninit;
        let extended = extends
            .then(|| self.take(Want::MostRetained, Groups::Any, faults.some_units(), ask))
            .flatten()
            .inspect(|_| {
                self.stats.add(Count::Extends, 1);
            });
        let c = extended.or_else(|| self.fresh_or_reclaimed(ask, faults));
        if let Some(c) = c.as_ref().filter(|_| retains) {
            self.missed(ask, c.units().len());
        }
        c
    }

    /// Fresh units (see [`fresh`](Self::fresh)), after giving back what is
    /// retained, and then the free runs of spans in use, when none can be
    /// had.
    fn fresh_or_reclaimed(&self, ask: &Ask<'_>, faults: Faults) -> Option<Claimed<'_>> {
        self.fresh(ask, faults)
            .or_else(|| {
                // Address space or the VMA limit may be short because of
                // what is retained: give it back and try once more.
                (self.stats.get(Count::Retained) != 0 && self.release_retained() > 0)
                    .then(|| self.fresh(ask, faults))
                    .flatten()
            })
            .or_else(|| {
                // Then the free runs of spans still in use, as holes.
                (retain::punch(&self.stats, &self.spans) > 0)
                    .then(|| self.fresh(ask, faults))
                    .flatten()
            })
    }

    /// Fresh units: a hugetlb span, clean units of the home group in spans
    /// whose faults come in as `faults` says, a new such span, or clean
    /// units of another group (of any span when no new span can be had:
    /// address space or the span table short, where a block in huge pages
    /// beats none).
    fn fresh(&self, ask: &Ask<'_>, faults: Faults) -> Option<Claimed<'_>> {
        if ask.align <= HUGE_PAGE_2M && self.ladder.hugetlb_now(&self.stats) {
            let hugetlb = self
                .spans
                .reserve_hugetlb(&self.stats, &self.extents, ask.len, ask.home);
            match hugetlb {
                Ok(v) => {
                    if let Some(c) = self.claim_front(v, ask) {
                        return Some(c);
                    }
                }
                Err(_) => self.ladder.hugetlb_failed(&self.stats),
            }
        }
        if let Some(c) = self.take(Want::Clean, Groups::Home, faults, ask) {
            return Some(c);
        }
        let advise = faults == Faults::Huge;
        let reserved = self.spans.reserve(
            &self.stats,
            &self.extents,
            ask.len,
            ask.align,
            ask.home,
            advise,
        );
        if let Ok(v) = &reserved {
            // The thread failed to start while this span was reserved for it.
            if !advise && !self.promotes_unadvised() {
                self.spans.get(v.index).advise_huge(&self.stats, v);
            }
        }
        match reserved {
            // Another thread may take the new span's front first.
            Ok(v) => self
                .claim_front(v, ask)
                .or_else(|| self.take(Want::Clean, Groups::Home, faults, ask)),
            // No new span: other threads' spans may have room.
            Err(_) => self
                .take(Want::Clean, Groups::Any, faults, ask)
                .or_else(|| self.take(Want::Clean, Groups::Any, Faults::Any, ask)),
        }
    }

    /// The front of a span just reserved.
    fn claim_front(&self, v: View, ask: &Ask<'_>) -> Option<Claimed<'_>> {
        let span = self.spans.get(v.index);
        let n = v.units_for(ask.len);
        let p = Placement {
            view: v,
            start: 0,
            n,
            dirty: 0,
            run: v.units,
        };
        let c = Claimed { span, p };
        (span.claim(&v, 0, n) && self.ready(&c.units(), ask.fill, ask.size, ask.policy))
            .then_some(c)
    }

    /// Search, claim and make ready units as `want` says.
    fn take(
        &self,
        want: Want,
        groups: Groups,
        faults: Faults,
        ask: &Ask<'_>,
    ) -> Option<Claimed<'_>> {
        loop {
            let p = place::find(
                &self.spans,
                ask.len,
                ask.align,
                want,
                ask.home,
                groups,
                faults,
            )?;
            let span = self.spans.get(p.view.index);
            let c = Claimed { span, p };
            if span.claim(&p.view, p.start, p.n) {
                return self
                    .ready(&c.units(), ask.fill, ask.size, ask.policy)
                    .then_some(c);
            }
        }
    }

    /// Commit claimed units `u`, count their retained ones out and clear
    /// those when `fill` asks (of a block whose caller asked for `size`
    /// bytes from `u`'s start); on failure they are given back and `false`.
    pub(super) fn ready(&self, u: &Units<'_>, fill: Fill, size: usize, policy: &Policy) -> bool {
        if u.span.commit(&self.stats, &u.v, u.start + u.n).is_err() {
            u.span.release(u.start, u.n);
            return false;
        }
        let dirty = retain::taken(&self.stats, u);
        if dirty > 0 && fill == Fill::Zeroed && !self.zero(u, size, policy) {
            // Back as they were: retained.
            self.stats.add(Count::Retained, u.v.len(dirty) as u64);
            u.span.release(u.start, u.n);
            return false;
        }
        true
    }

    /// Clear the retained units among `u` (claimed) as `policy` says, for a
    /// caller that asked for `size` bytes; `false` when that failed.
    fn zero(&self, u: &Units<'_>, size: usize, policy: &Policy) -> bool {
        let memset_request = policy.zeroing == Zeroing::MemsetResident;
        let by_memset =
            u.v.tier == Backing::Hugetlb || (memset_request && u.len() <= ZERO_BY_MEMSET_MAX);
        // `MemsetResident` clears the request's bytes, all its caller owns;
        // a `memset` for other policies clears the whole block.
        let owned = if memset_request {
            size.min(u.len())
        } else {
            u.len()
        };
        let end = u.addr().as_ptr() as usize + owned;
        for (s, e) in u.span.dirty_runs(u.start, u.n) {
            let run = u.at(s, e - s);
            if !by_memset {
                if !retain::purge(&self.stats, &run, Restore::Access) {
                    return false;
                }
                continue;
            }
            let p = run.addr();
            let len = run.len().min(end.saturating_sub(p.as_ptr() as usize));
            // A block freed read-only is made writable before it is written.
            if len > 0 && os::commit(&self.stats, p, len).is_err() {
                return false;
            }
            // SAFETY: units the caller claimed, read-write now, that no
            // reference points into.
            unsafe { ptr::write_bytes(p.as_ptr(), 0, len) };
            // Units cleared whole read zero; a partly cleared one stays
            // dirty (in use, so not retained).
            u.span.dirty.clear(s, (len >> u.v.shift) as u32);
        }
        true
    }

    /// Make claimed, ready units a block for `size` bytes: first touch
    /// (for fresh units when `touch`), the descriptor, the counters.
    pub(super) fn hand_out(
        &self,
        c: Claimed<'_>,
        size: usize,
        policy: &Policy,
        touch: bool,
    ) -> Block {
        let (span, p) = (c.span, c.p);
        let v = &p.view;
        let ptr = v.addr(p.start);
        let len = v.len(p.n);
        let d = Descriptor::new(len, size, v.index, v.tier);
        let thp = v.tier == Backing::TransparentHuge;
        let now = sys::monotonic_ns();
        span.stamp(p.start, p.n, span::stamp_at(now));
        // A THP span reserved for promotion: no probe, no tail advice (its
        // faults take base pages; a short tail is too sparse to collapse).
        let unadvised = thp && !span.advised();
        // While the thread promotes, a block in an advised span was granted
        // huge pages by the fault check: faulted in when written, no probe.
        let promoting = self.promotes_unadvised();
        if unadvised && p.dirty == 0 {
            self.stats.add(Count::BaseFirst, len as u64);
        } else if thp && p.dirty == 0 && promoting {
            self.stats.add(Count::HugeFirst, len as u64);
        }
        if touch && p.dirty == 0 && thp && !unadvised && policy.probes() && !promoting {
            // A short tail is left to the caller's writes.
            let fill = len - if d.short_tail() { HUGE_PAGE_2M } else { 0 };
            if let Some(off) = self.window.settle(&self.stats, ptr, len, fill) {
                let first = p.start + v.units_for(off);
                span.base_pages.set(first, p.start + p.n - first);
            }
        }
        if d.short_tail() && !unadvised {
            self.keep_tail_out(span, v, p.start + p.n - 1);
        }
        // The span's leaves were mapped when it was reserved: this cannot
        // fail.
        let _ = self.extents.insert(ptr, d);
        self.stats.block(v.tier, len);
        self.live_grew(now, len);
        Block { ptr, len }
    }

    /// Advise the short tail unit `u` base pages (`MADV_NOHUGEPAGE`) so the
    /// request's last bytes fault in no huge page, unless it holds pages,
    /// is so advised, or [`MAX_SHORT_TAILS`] tails are out (each splits the
    /// span's VMA).
    pub(super) fn keep_tail_out(&self, span: &Span, v: &View, u: u32) {
        let thp = v.tier == Backing::TransparentHuge && v.shift == span::UNIT_SHIFT;
        if !thp || span.dirty.count(u, 1) + span.base_pages.count(u, 1) != 0 {
            return;
        }
        if self.stats.add(Count::ShortTails, 1) >= MAX_SHORT_TAILS {
            self.stats.sub(Count::ShortTails, 1);
            self.stats.add(Count::ShortTailsOverBudget, 1);
        } else if os::advise(&self.stats, v.addr(u), v.len(1), Advice::NoHugePage).is_ok() {
            span.base_pages.set(u, 1);
            span.tails.set(u, 1);
        } else {
            self.stats.sub(Count::ShortTails, 1);
        }
    }

    /// The units of the live block `d` at `p`: its span, view and first
    /// unit, and its unit count.
    pub(super) fn units_of(&self, p: *mut u8, d: Descriptor) -> Option<Units<'_>> {
        let span = self.spans.get(d.span);
        // The block holds units of the span: it is live and stays so.
        let v = span.view(d.span)?;
        Some(span.units(v, v.unit_of(p as usize), v.units_for(d.len())))
    }

    /// Units leaving a block: retained if `policy` retains them and the cap
    /// has room (made for [`WhenFull::PurgeOldest`]), else purged.
    pub(super) fn give_back(&self, u: &Units<'_>, policy: &Policy, restore: Restore) {
        let len = u.len();
        let kept = self.retains(len, policy) && {
            let cap = self.retain_cap(policy);
            retain::admit(&self.stats, len, cap)
                || (policy.when_full == WhenFull::PurgeOldest
                    && retain::make_room(&self.stats, &self.spans, len, cap)
                    && retain::admit(&self.stats, len, cap))
        };
        retain::give(&self.stats, &self.spans, u, kept, restore);
    }

    /// Free the block at `p` and return the size it was requested with, in
    /// bytes; `None` when no block of the engine starts there (nothing
    /// happens then). Units
    /// that are purged are read-write again and keep the program's advice
    /// ([`Restore::Access`]); retained units keep what the program did to
    /// them.
    ///
    /// # Safety
    /// A block at `p` is not used afterwards.
    pub(crate) unsafe fn free(&self, p: *mut u8, policy: &Policy) -> Option<usize> {
        // SAFETY: the caller's contract.
        unsafe { self.free_as(p, policy, Restore::Access) }
    }

    /// [`free`](Self::free) of a block a front moved elsewhere (a
    /// `realloc` across the threshold): what the program did to it went
    /// with its bytes, and purged units are made plain memory again
    /// ([`Restore::Everything`]).
    ///
    /// # Safety
    /// As [`free`](Self::free).
    pub(crate) unsafe fn free_moved(&self, p: *mut u8, policy: &Policy) -> Option<usize> {
        // SAFETY: the caller's contract.
        unsafe { self.free_as(p, policy, Restore::Everything) }
    }

    /// # Safety
    /// As [`free`](Self::free).
    unsafe fn free_as(&self, p: *mut u8, policy: &Policy, restore: Restore) -> Option<usize> {
        let d = self.extents.remove(p)?;
        self.tick();
        if let Some(u) = self.units_of(p, d) {
            self.stats.sub(Count::Live, u.len() as u64);
            self.give_back(&u, policy, restore);
        }
        Some(d.size())
    }

    /// The length of the block at `p`, `None` when no block of the engine
    /// starts there. Touches no memory at `p`.
    #[cfg_attr(not(feature = "preload"), allow(dead_code))]
    #[inline]
    pub(crate) fn usable_size(&self, p: *const u8) -> Option<usize> {
        self.extents.lookup(p).map(Descriptor::len)
    }

    /// Purge every retained unit and give back every idle span (the whole
    /// of [`release_retained`]).
    pub(crate) fn release_retained(&self) -> usize {
        retain::release_all(&self.stats, &self.spans)
    }
}

/// Map `bytes` of huge-page memory for a [`HugeRegion`](super::HugeRegion)
/// or an arena, aligned to `align`, on the tier ladder with `opts` (a
/// mapping of its own, not a span's units).
pub(crate) fn map_huge(
    bytes: usize,
    align: usize,
    opts: &HugeOptions,
) -> Result<Mapping, HugeError> {
    ENGINE.ladder.map(&ENGINE.stats, bytes, align, opts)
}

/// Unmap a mapping of [`map_huge`].
pub(crate) fn unmap(ptr: NonNull<u8>, len: usize) {
    let _ = os::unmap(&ENGINE.stats, ptr, len);
}

/// Forget a previous hugetlb failure so the next allocation tries the
/// hugetlb tier again at once (for example after reserving pages).
pub fn reset_hugetlb_backoff() {
    ENGINE.ladder.reset();
}

/// Read the huge-page engine's counters. Never allocates; thread-safe.
pub fn huge_stats() -> HugeStats {
    let mut s = ENGINE.stats.snapshot();
    s.background_thread = background::state();
    s.collapsed_live_bytes = ENGINE
        .spans
        .live()
        .map(|(span, v)| {
            let live = crate::bits::and(&span.in_use.snapshot(), &span.collapsed.snapshot());
            v.len(crate::bits::count(&live, 0, v.units)) as u64
        })
        .sum();
    s
}

/// Give every retained huge-page block back to the kernel: its pages are
/// purged (`MADV_DONTNEED`), and every span no block uses any more is
/// unmapped. Returns the bytes that released. Blocks other threads free
/// meanwhile may be retained again. Never allocates; thread-safe.
pub fn release_retained() -> usize {
    ENGINE.release_retained()
}

/// Test hook: `true` opens the window in which fresh blocks go to base
/// pages unprobed (as a slow page does) for an hour; `false` closes it.
#[doc(hidden)]
pub fn hold_first_touch_base_pages(hold: bool) {
    ENGINE.window.hold(hold);
}

/// Test hook: counts a terabyte more (`true`) or less (`false`) as
/// retained, as a thread caught between admitting a freed block under the
/// cap and retaining it would; the child of a `fork()` recounts.
#[doc(hidden)]
pub fn hold_retained_bytes(hold: bool) {
    let tib = 1u64 << 40;
    if hold {
        ENGINE.stats.add(Count::Retained, tib);
    } else {
        ENGINE.stats.sub(Count::Retained, tib);
    }
}
