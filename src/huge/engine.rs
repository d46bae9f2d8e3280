//! The huge-page engine: one value ([`ENGINE`]) that owns the tier ladder's
//! state, the spans, retention, the extent map, first touch and the
//! statistics, and the pointer face its fronts call: [`Engine::alloc`],
//! [`Engine::free`], [`Engine::resize`] and [`Engine::usable_size`], each
//! with the front's [`Policy`].
//!
//! Nothing here allocates, takes a lock, panics or prints: the fronts are
//! global allocators.

use super::bits;
use super::error::HugeError;
use super::extents::{Descriptor, ExtentMap};
use super::first_touch::Window;
use super::ladder::{Ladder, Mapping};
use super::options::HugeOptions;
use super::os;
use super::place::{self, Groups, Placement, Want};
use super::policy::{CapRule, OnMiss, Policy, WhenFull, Zeroing, ZERO_BY_MEMSET_MAX};
use super::relocate::{relocate, Moved};
use super::retain::{self, Restore};
use super::span::{self, Reserve, Span, Spans, View};
use super::stats::{Count, Counters, HugeStats};
use crate::fork::{Hooks, Stage};
use crate::sys::{self, HUGE_PAGE_2M};
use crate::tier::{self, Backing};
use std::ptr::{self, NonNull};

/// Whether the bytes a call hands out must read zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    Zeroed,
    Uninit,
}

/// A block the engine handed out: its start (2 MiB aligned, at least the
/// alignment asked for) and its whole length (a multiple of 2 MiB, all of
/// it the caller's to use).
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

/// The engine (see the [module docs](self)).
pub(crate) struct Engine {
    pub(crate) stats: Counters,
    pub(crate) ladder: Ladder,
    pub(crate) spans: Spans,
    pub(crate) extents: ExtentMap,
    pub(crate) window: Window,
}

/// The process's engine, which every front uses.
pub(crate) static ENGINE: Engine = Engine::new(true);

/// Units claimed for a block, committed and counted out of the retained
/// bytes, not yet a block.
struct Claimed<'a> {
    span: &'a Span,
    p: Placement,
}

/// What an allocation asks for: `len` bytes (a multiple of 2 MiB) aligned
/// to `align`, for a thread of group `home`, filled as `fill` says, under
/// `policy`.
struct Ask<'p> {
    len: usize,
    align: usize,
    home: u32,
    fill: Fill,
    policy: &'p Policy,
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
    /// An engine; `hugetlb` false keeps its blocks off the hugetlb tier.
    pub(crate) const fn new(hugetlb: bool) -> Engine {
        Engine {
            stats: Counters::new(),
            ladder: Ladder::new(hugetlb),
            spans: Spans::new(),
            extents: ExtentMap::new(),
            window: Window::new(),
        }
    }

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

    /// A call of a front's small path (requests below its threshold): it
    /// counts toward the decay steps while something is retained, so a
    /// program that makes only small requests still gives retained blocks
    /// back (one load otherwise). The C front does not call it, to keep
    /// glibc's path as it is.
    #[inline]
    pub(crate) fn small_call(&self) {
        if self.stats.get(Count::Retained) != 0 {
            self.tick();
        }
    }

    /// One engine call: every so often, a decay step.
    #[inline]
    fn tick(&self) {
        if retain::tick_due() {
            retain::decay(&self.stats, &self.spans, span::stamp_now(), retain::delay());
        }
    }

    /// A block of at least `size` bytes aligned to `align` (a power of
    /// two), reading zero when `fill` asks; `None` when no memory can be
    /// had. Retained units first (a hit), then, as `policy` says, a
    /// retained run extended or fresh units: a new hugetlb span while the
    /// hugetlb tier serves, else clean units of a span, else a new span.
    /// When that fails every retained unit is given back and it is tried
    /// once more.
    pub(crate) fn alloc(
        &self,
        size: usize,
        align: usize,
        fill: Fill,
        policy: &Policy,
    ) -> Option<Block> {
        let len = block_len(size, align)?;
        self.tick();
        let home = span::home_group();
        let c = self.claim(&Ask {
            len,
            align,
            home,
            fill,
            policy,
        })?;
        Some(self.hand_out(c, size, policy, true))
    }

    /// Claim units for a block (see [`alloc`](Self::alloc)).
    fn claim(&self, ask: &Ask<'_>) -> Option<Claimed<'_>> {
        let (fill, policy) = (ask.fill, ask.policy);
        if self.retains(ask.len, policy) {
            if self.stats.get(Count::Retained) >= ask.len as u64 {
                if let Some(c) = self.take(Want::Retained, Groups::Any, ask) {
                    self.stats.add(Count::Hits, 1);
                    if c.p.run > c.p.n {
                        self.stats.add(Count::Carves, 1);
                    }
                    return Some(c);
                }
            }
            self.stats.add(Count::Misses, 1);
            if policy.on_miss == OnMiss::ExtendRetained && fill == Fill::Uninit {
                if let Some(c) = self.take(Want::MostRetained, Groups::Any, ask) {
                    self.stats.add(Count::Extends, 1);
                    return Some(c);
                }
            }
        }
        self.fresh(ask)
            .or_else(|| {
                // Address space or the VMA limit may be short because of
                // what is retained: give it back and try once more.
                (self.release_retained() > 0)
                    .then(|| self.fresh(ask))
                    .flatten()
            })
            .or_else(|| {
                // Then the free runs of spans still in use, as holes.
                (retain::punch(&self.stats, &self.spans) > 0)
                    .then(|| self.fresh(ask))
                    .flatten()
            })
    }

    /// Fresh units: a hugetlb span, clean units of the thread's group, a new
    /// span for it, or, when none can be reserved, clean units of another
    /// group's span.
    fn fresh(&self, ask: &Ask<'_>) -> Option<Claimed<'_>> {
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
        if let Some(c) = self.take(Want::Clean, Groups::Home, ask) {
            return Some(c);
        }
        let r = Reserve {
            tier: tier::anon_tier(),
            len: ask.len,
            align: ask.align,
            group: ask.home,
            exact: sys::address_space_limited(),
        };
        match self.spans.reserve(&self.stats, &self.extents, r) {
            // Another thread may take the new span's front first.
            Ok(v) => self
                .claim_front(v, ask)
                .or_else(|| self.take(Want::Clean, Groups::Home, ask)),
            // No new span: other threads' spans may have room.
            Err(_) => self.take(Want::Clean, Groups::Any, ask),
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
        (span.claim(&v, 0, n) && self.ready(span, &p, ask.fill, ask.policy))
            .then_some(Claimed { span, p })
    }

    /// Search, claim and prepare units as `want` says, in the spans of
    /// `groups`.
    fn take(&self, want: Want, groups: Groups, ask: &Ask<'_>) -> Option<Claimed<'_>> {
        loop {
            let p = place::find(&self.spans, ask.len, ask.align, want, ask.home, groups)?;
            let span = self.spans.get(p.view.index);
            if span.claim(&p.view, p.start, p.n) {
                return self
                    .ready(span, &p, ask.fill, ask.policy)
                    .then_some(Claimed { span, p });
            }
        }
    }

    /// Commit claimed units, count their retained ones out and clear those
    /// when `fill` asks; on failure they are given back and `false`.
    fn ready(&self, span: &Span, p: &Placement, fill: Fill, policy: &Policy) -> bool {
        let v = &p.view;
        if span.commit(&self.stats, v, p.start + p.n).is_err() {
            span.release(p.start, p.n);
            return false;
        }
        let dirty = retain::taken(&self.stats, span, v, p.start, p.n);
        if dirty > 0 && fill == Fill::Zeroed && !self.zero(span, v, p.start, p.n, policy) {
            // Back as they were: retained.
            self.stats.add(Count::Retained, v.len(dirty) as u64);
            span.release(p.start, p.n);
            return false;
        }
        true
    }

    /// Clear the retained units among `start..start + n` (claimed) as
    /// `policy` says; `false` when that failed.
    fn zero(&self, span: &Span, v: &View, start: u32, n: u32, policy: &Policy) -> bool {
        let by_memset = v.tier == Backing::Hugetlb
            || (policy.zeroing == Zeroing::MemsetResident && v.len(n) <= ZERO_BY_MEMSET_MAX);
        for (s, e) in bits::runs(&span.dirty.snapshot()) {
            let (s, e) = (s.max(start), e.min(start + n));
            if s >= e {
                continue;
            }
            if !by_memset {
                if !retain::purge(&self.stats, span, v, s, e - s, Restore::IfLocked) {
                    return false;
                }
                continue;
            }
            let (p, len) = (v.addr(s), v.len(e - s));
            // A block freed read-only is made writable before it is written.
            if os::commit(&self.stats, p, len).is_err() {
                return false;
            }
            // SAFETY: units the caller claimed, read-write now, that no
            // reference points into.
            unsafe { ptr::write_bytes(p.as_ptr(), 0, len) };
            span.dirty.clear(s, e - s);
        }
        true
    }

    /// Make claimed, ready units a block for `size` bytes: first touch
    /// (for fresh units when `touch`), the descriptor, the counters.
    fn hand_out(&self, c: Claimed<'_>, size: usize, policy: &Policy, touch: bool) -> Block {
        let (span, p) = (c.span, c.p);
        let v = &p.view;
        let ptr = v.addr(p.start);
        let len = v.len(p.n);
        if touch && p.dirty == 0 && v.tier == Backing::TransparentHuge && policy.probes() {
            // A last 2 MiB holding less than 1 MiB of the request is left to
            // the caller's writes.
            let tail = size % HUGE_PAGE_2M;
            let fill = if tail != 0 && tail < HUGE_PAGE_2M / 2 {
                len - HUGE_PAGE_2M
            } else {
                len
            };
            if let Some(off) = self.window.settle(&self.stats, ptr, len, fill) {
                let first = p.start + v.units_for(off);
                span.base_pages.set(first, p.start + p.n - first);
            }
        }
        // The span's leaves were mapped when it was reserved: this cannot
        // fail.
        let _ = self
            .extents
            .insert(ptr, Descriptor::new(len, size, v.index, v.tier));
        self.stats.block(v.tier, len);
        self.stats.live_add(len);
        Block { ptr, len }
    }

    /// The units of the live block `d` at `p`: its span, view and first
    /// unit, and its unit count.
    fn units_of(&self, p: *mut u8, d: Descriptor) -> Option<(&Span, View, u32, u32)> {
        let span = self.spans.get(d.span);
        // The block holds units of the span: it is live and stays so.
        let v = span.view(d.span)?;
        Some((span, v, v.unit_of(p as usize), v.units_for(d.len())))
    }

    /// Units leaving a block: retained if `policy` retains `len` bytes and
    /// the cap has room (making room first for
    /// [`WhenFull::PurgeOldest`]), else purged.
    fn give_back(
        &self,
        span: &Span,
        v: &View,
        start: u32,
        n: u32,
        policy: &Policy,
        restore: Restore,
    ) {
        let len = v.len(n);
        let kept = self.retains(len, policy) && {
            let cap = self.retain_cap(policy);
            retain::admit(&self.stats, len, cap)
                || (policy.when_full == WhenFull::PurgeOldest
                    && retain::make_room(&self.stats, &self.spans, len, cap)
                    && retain::admit(&self.stats, len, cap))
        };
        retain::give(&self.stats, &self.spans, span, v, start, n, kept, restore);
    }

    /// Free the block at `p`; `false` when no block of the engine starts
    /// there (nothing happens then). Units that are purged keep what the
    /// program did to them ([`Restore::IfLocked`]).
    ///
    /// # Safety
    /// A block at `p` is not used afterwards.
    pub(crate) unsafe fn free(&self, p: *mut u8, policy: &Policy) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.free_as(p, policy, Restore::IfLocked) }
    }

    /// [`free`](Self::free) of a block a front moved elsewhere (a
    /// `realloc` across the threshold): what the program did to it went
    /// with its bytes, and purged units are made plain memory again
    /// ([`Restore::Always`]).
    ///
    /// # Safety
    /// As [`free`](Self::free).
    pub(crate) unsafe fn free_moved(&self, p: *mut u8, policy: &Policy) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.free_as(p, policy, Restore::Always) }
    }

    /// # Safety
    /// As [`free`](Self::free).
    unsafe fn free_as(&self, p: *mut u8, policy: &Policy, restore: Restore) -> bool {
        let Some(d) = self.extents.remove(p) else {
            return false;
        };
        self.tick();
        let Some((span, v, start, n)) = self.units_of(p, d) else {
            return true;
        };
        self.stats.sub(Count::Live, v.len(n) as u64);
        self.give_back(span, &v, start, n, policy, restore);
        true
    }

    /// The length of the block at `p`, `None` when no block of the engine
    /// starts there. Touches no memory at `p`.
    #[cfg_attr(not(feature = "preload"), allow(dead_code))]
    #[inline]
    pub(crate) fn usable_size(&self, p: *const u8) -> Option<usize> {
        self.extents.lookup(p).map(Descriptor::len)
    }

    /// Resize the block at `p` to `new_size` bytes, keeping `align` and
    /// the contents up to the smaller size; `fill` asks for the bytes from
    /// the old size to the new one to read zero. In place when the length
    /// stays, shrinks (the cut units leave as when freed: a shrink makes no
    /// mapping and cannot fail) or the units after the block are free;
    /// else the block moves ([`relocate`]). On error the block is as it was.
    ///
    /// # Safety
    /// A block at `p` is the caller's, and no reference into it outlives a
    /// move.
    pub(crate) unsafe fn resize(
        &self,
        p: *mut u8,
        new_size: usize,
        align: usize,
        fill: Fill,
        policy: &Policy,
    ) -> Result<Block, ResizeError> {
        let d = self.extents.lookup(p).ok_or(ResizeError::NotOurs)?;
        let (span, v, start, n) = self.units_of(p, d).ok_or(ResizeError::NotOurs)?;
        let new_len = block_len(new_size, align).ok_or(ResizeError::NoMemory)?;
        self.tick();
        let ptr = v.addr(start);
        let (old_size, old_len) = (d.size(), v.len(n));
        // Units of this span the new length takes; 0 when a growth must
        // move (beyond the span, or into a span of longer units).
        let m = v.units_for(new_len);
        let m = if new_len > old_len && (start + m > v.units || !v.serves(new_len)) {
            0
        } else {
            m
        };
        let zero_to = |to: usize| {
            if fill == Fill::Zeroed && to > old_size {
                self.writable(ptr, old_size, to);
                // SAFETY: `old_size..to` lies inside the caller's block,
                // read-write now.
                unsafe { ptr::write_bytes(ptr.as_ptr().add(old_size), 0, to - old_size) };
            }
        };
        let descriptor = |units: u32| Descriptor::new(v.len(units), new_size, v.index, v.tier);
        if m == n {
            zero_to(new_size.min(old_len));
            self.extents.update(ptr, descriptor(n));
            return Ok(Block { ptr, len: old_len });
        }
        if m != 0 && m < n {
            self.extents.update(ptr, descriptor(m));
            self.stats.sub(Count::Live, v.len(n - m) as u64);
            self.give_back(span, &v, start + m, n - m, policy, Restore::IfLocked);
            return Ok(Block { ptr, len: v.len(m) });
        }
        if m > n && self.grow_in_place(span, &v, start, n, m, fill, policy) {
            zero_to(old_len);
            self.extents.update(ptr, descriptor(m));
            self.stats.live_add(v.len(m - n));
            self.stats.add(Count::GrownInPlace, 1);
            self.advise_growth(span, &v, start + n, m - n, policy);
            return Ok(Block { ptr, len: v.len(m) });
        }
        // Moved: the new place is fresh or retained units; the moved bytes
        // replace what they held.
        let home = span::home_group();
        let ask = Ask {
            len: new_len,
            align,
            home,
            fill,
            policy,
        };
        let c = self.claim(&ask).ok_or(ResizeError::NoMemory)?;
        let dst = c.p.view.addr(c.p.start);
        // The pages move onto a destination that reads zero (what a move
        // that fails midway needs): retained units there are purged first.
        let head = c.p.view.units_for(old_len).min(c.p.n);
        let pages = v.tier != Backing::Hugetlb
            && c.p.view.tier != Backing::Hugetlb
            && self.purge_dirty(c.span, &c.p.view, c.p.start, head);
        let moved = relocate(&self.stats, ptr, dst, old_len, 1 << v.shift, pages);
        let count = match moved {
            Moved::Pages => Count::Moved,
            Moved::Copied => Count::Copied,
        };
        self.stats.add(count, 1);
        if fill == Fill::Zeroed && old_size < old_len {
            self.writable(dst, old_size, old_len);
            // SAFETY: the new block holds `new_len > old_len` bytes, and
            // `old_size..old_len` is read-write now; its units past the old
            // length were cleared when claimed.
            unsafe { ptr::write_bytes(dst.as_ptr().add(old_size), 0, old_len - old_size) };
        }
        self.extents.remove(p);
        self.stats.sub(Count::Live, old_len as u64);
        // The old units are purged and made plain memory, never retained as
        // they are: what the program did to the block went with it.
        retain::give(
            &self.stats,
            &self.spans,
            span,
            &v,
            start,
            n,
            false,
            Restore::Always,
        );
        let (dst_span, dv) = (c.span, c.p.view);
        let kept = dv.units_for(old_len).min(c.p.n);
        let added = (c.p.start + kept, c.p.n - kept);
        let b = self.hand_out(c, new_size, policy, false);
        self.advise_growth(dst_span, &dv, added.0, added.1, policy);
        Ok(b)
    }

    /// Make bytes `from..to` of the block at `p` read-write before the
    /// engine writes them (a program may have made them read-only).
    fn writable(&self, p: NonNull<u8>, from: usize, to: usize) {
        let start = from & !(sys::page_size() - 1);
        if let Some(at) = NonNull::new(p.as_ptr().wrapping_add(start)) {
            let _ = os::commit(&self.stats, at, to - start);
        }
    }

    /// Purge the dirty units among `start..start + n` (claimed); `false`
    /// when a purge failed.
    fn purge_dirty(&self, span: &Span, v: &View, start: u32, n: u32) -> bool {
        bits::runs(&span.dirty.snapshot()).all(|(s, e)| {
            let (s, e) = (s.max(start), e.min(start + n));
            s >= e || retain::purge(&self.stats, span, v, s, e - s, Restore::IfLocked)
        })
    }

    /// Units `start..start + n` just added to a block: inside the first-touch
    /// window after a slow page, a probing policy sends them to base pages
    /// as it does fresh blocks.
    fn advise_growth(&self, span: &Span, v: &View, start: u32, n: u32, policy: &Policy) {
        if n > 0
            && v.tier == Backing::TransparentHuge
            && policy.probes()
            && self
                .window
                .base_pages_if_open(&self.stats, v.addr(start), v.len(n))
        {
            span.base_pages.set(start, n);
        }
    }

    /// Claim the units `start + n .. start + m` after a block for it, and
    /// commit them (clearing retained ones when `fill` asks).
    #[allow(clippy::too_many_arguments)]
    fn grow_in_place(
        &self,
        span: &Span,
        v: &View,
        start: u32,
        n: u32,
        m: u32,
        fill: Fill,
        policy: &Policy,
    ) -> bool {
        if start + m > v.units || !span.claim(v, start + n, m - n) {
            return false;
        }
        let p = Placement {
            view: *v,
            start: start + n,
            n: m - n,
            dirty: 0,
            run: m - n,
        };
        self.ready(span, &p, fill, policy)
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
    ENGINE.stats.snapshot()
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

/// `pthread_atfork` child handler: spans another thread of the parent was
/// creating or retiring become empty slots, and the retained bytes are
/// recounted from the spans' bitmaps (units another thread had claimed at
/// the fork stay out of use in the child).
unsafe fn fork_child() {
    let retained = ENGINE.spans.repair_after_fork();
    ENGINE.stats.set(Count::Retained, retained);
}

fn fork_nothing() {}

/// The fork hooks of stage `Retention` (`crate::fork`), added when the
/// library is loaded: nothing to take before `fork()`, the spans to repair
/// in the child.
static FORK_HOOKS: Hooks = Hooks {
    prepare: fork_nothing,
    parent: fork_nothing,
    child: fork_child,
};

crate::fork::at_load!(ADD_ENGINE_FORK_HOOKS, {
    crate::fork::add(Stage::Retention, &FORK_HOOKS);
});
