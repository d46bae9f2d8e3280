//! The span table ([`Spans`]): a static array of [`MAX_SPANS`] slots,
//! searched by the engine without a lock. A span is created in an empty
//! slot (the state word's phase goes empty, creating, live) and retired
//! back to empty; each change bumps the generation, so a [`View`] taken
//! before it no longer claims anything. Reservation of the address space
//! on the tier ladder, retirement, and the repair of the table in the
//! child of `fork()` live here; the slots' bitmaps and units are the
//! parent module's.

use super::{
    gen_of, stamp_now, state, Span, View, BITS, CREATING, DYING, EMPTY, LIVE, MAX_SPANS, SPAN_LEN,
    UNIT_SHIFT,
};
use crate::bits;
use crate::huge::extents::ExtentMap;
use crate::huge::os;
use crate::huge::stats::{Count, Counters};
use crate::sys::{self, Advice, HugetlbSize, Prot, HUGE_PAGE_2M};
use crate::tier::{self, Backing};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};

/// The span table.
pub(crate) struct Spans {
    slots: [Span; MAX_SPANS],
    /// Slots ever used: the bound of every scan.
    high: AtomicUsize,
}

impl Spans {
    pub(crate) const fn new() -> Spans {
        Spans {
            slots: [const { Span::new() }; MAX_SPANS],
            high: AtomicUsize::new(0),
        }
    }

    /// The span in slot `index`.
    pub(crate) fn get(&self, index: u16) -> &Span {
        &self.slots[usize::from(index) % MAX_SPANS]
    }

    /// The live spans with their views, in slot order.
    pub(crate) fn live(&self) -> impl Iterator<Item = (&Span, View)> {
        let high = self.high.load(Acquire).min(MAX_SPANS);
        self.slots[..high]
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.view(i as u16).map(|v| (s, v)))
    }

    /// Reserve a span for a block of `len` bytes aligned to `align` for
    /// threads of `group`: 1 GiB (just `len` under an address-space limit)
    /// of `PROT_NONE`, of the THP tier when THP is on, and then advised
    /// `MADV_HUGEPAGE` when `advise` says (normal pages when that fails). Its units are free; the extent map covers it. A
    /// span longer than 1 GiB (one block's) has the block's units committed
    /// first: a length the kernel refuses to commit (overcommit accounting)
    /// fails here, before leaves of the extent map are mapped for it.
    pub(crate) fn reserve(
        &self,
        c: &Counters,
        map: &ExtentMap,
        len: usize,
        align: usize,
        group: u32,
        advise: bool,
    ) -> io::Result<View> {
        if !self.slot_free() {
            // A full table: no reservation to make and give back.
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        let exact = sys::address_space_limited();
        let (shift, units) = geometry(if exact { len } else { len.max(SPAN_LEN) })?;
        let bytes = (units as usize) << shift;
        let p = os::map_aligned(c, bytes, align.max(HUGE_PAGE_2M), Prot::None)?;
        let mut tier = tier::anon_tier();
        if tier == Backing::TransparentHuge
            && advise
            && os::advise(c, p, bytes, Advice::HugePage).is_err()
        {
            c.add(Count::ThpFallbacks, 1);
            tier = Backing::Normal;
        }
        let advised = tier == Backing::TransparentHuge && advise;
        let mut committed = 0;
        if bytes > SPAN_LEN {
            // `len <= bytes`, so the units fit in `u32` as `units` does.
            committed = len.div_ceil(1 << shift) as u32;
            if let Err(e) = os::commit(c, p, (committed as usize) << shift) {
                let _ = os::unmap(c, p, bytes);
                return Err(e);
            }
        }
        self.publish(c, map, p, tier, shift, units, committed, group, advised)
    }

    /// A span of hugetlb pages holding one block of `len` bytes (a
    /// multiple of 2 MiB), all its units committed.
    pub(crate) fn reserve_hugetlb(
        &self,
        c: &Counters,
        map: &ExtentMap,
        len: usize,
        group: u32,
    ) -> io::Result<View> {
        let (shift, units) = geometry(len)?;
        let bytes = (units as usize) << shift;
        let p = os::map_hugetlb(c, bytes, HugetlbSize::Size2M)?;
        self.publish(
            c,
            map,
            p,
            Backing::Hugetlb,
            shift,
            units,
            units,
            group,
            true,
        )
    }

    /// Put the fresh mapping `p` in a free slot (or unmap it when the table
    /// is full or the extent map cannot cover it).
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        c: &Counters,
        map: &ExtentMap,
        p: NonNull<u8>,
        tier: Backing,
        shift: u32,
        units: u32,
        committed: u32,
        group: u32,
        advised: bool,
    ) -> io::Result<View> {
        let bytes = (units as usize) << shift;
        let slot = if map.prepare(c, p.as_ptr() as usize, bytes) {
            self.take_slot()
        } else {
            None
        };
        let Some((i, gen)) = slot else {
            let _ = os::unmap(c, p, bytes);
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        };
        let s = &self.slots[i];
        s.base.store(p.as_ptr() as usize, Relaxed);
        s.units.store(units, Relaxed);
        s.shift.store(shift, Relaxed);
        s.group.store(group, Relaxed);
        s.committed.store(committed, Relaxed);
        s.pinned.store(false, Relaxed);
        s.advised.store(advised, Relaxed);
        s.dirty.store([0; bits::WORDS]);
        s.base_pages.store([0; bits::WORDS]);
        s.tails.store([0; bits::WORDS]);
        s.holes.store([0; bits::WORDS]);
        s.collapsed.store([0; bits::WORDS]);
        s.refused.store([0; bits::WORDS]);
        // Bits past the last unit stay set: never free.
        s.in_use
            .store(bits::not_below(&[0; bits::WORDS], units).map(|w| !w));
        // After the new bitmap: a bound taken from the old one is stale.
        s.releases.fetch_add(1, Release);
        s.stamp(0, units, stamp_now());
        c.span_reserved(bytes);
        s.state.store(state(gen, tier, LIVE), Release);
        s.view(i as u16)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
    }

    /// Whether a slot is empty now (another thread may take it first).
    fn slot_free(&self) -> bool {
        let high = self.high.load(Acquire);
        high < MAX_SPANS
            || self.slots[..high.min(MAX_SPANS)]
                .iter()
                .any(|s| s.state.load(Relaxed) & 3 == EMPTY)
    }

    /// An empty slot, marked creating with a new generation.
    fn take_slot(&self) -> Option<(usize, u64)> {
        loop {
            let high = self.high.load(Acquire);
            for (i, s) in self.slots[..high.min(MAX_SPANS)].iter().enumerate() {
                let cur = s.state.load(Relaxed);
                if cur & 3 == EMPTY {
                    let gen = gen_of(cur) + 1;
                    let next = state(gen, Backing::Normal, CREATING);
                    if s.state.compare_exchange(cur, next, SeqCst, Relaxed).is_ok() {
                        return Some((i, gen));
                    }
                }
            }
            if high >= MAX_SPANS {
                return None;
            }
            // A new slot at the end; another thread may take it first.
            let _ = self.high.compare_exchange(high, high + 1, AcqRel, Relaxed);
        }
    }

    /// Give the span `v` back to the kernel (`munmap`) if no block uses it:
    /// its units are claimed first, so nothing is handed out from it
    /// meanwhile, and unmapped run by run around its holes (whose address
    /// space may be another mapping's by now). Its retained units stop
    /// counting. Returns their bytes; `None` when a block uses the span or
    /// `munmap` failed (the span then stays, what was unmapped as holes;
    /// pinned, never tried again, when the kernel refused it for good).
    pub(crate) fn retire(&self, c: &Counters, v: &View) -> Option<usize> {
        let s = self.get(v.index);
        if s.pinned.load(Relaxed) || !s.claim_all(v) {
            return None;
        }
        let gen = gen_of(v.state) + 1;
        s.state.store(state(gen, v.tier, DYING), SeqCst);
        let mut dirty = 0;
        let mapped = bits::not_below(&s.holes.snapshot(), v.units);
        for (a, b) in bits::runs(&mapped) {
            match s.unmap_hole(c, v, a, b - a) {
                Ok(d) => dirty += d,
                Err(e) => {
                    s.pinned
                        .store(e.raw_os_error() == Some(libc::EPERM), Relaxed);
                    c.sub(Count::Retained, dirty as u64);
                    s.state.store(state(gen, v.tier, LIVE), SeqCst);
                    let left = bits::not_below(&s.holes.snapshot(), v.units);
                    for (a, b) in bits::runs(&left) {
                        s.release(a, b - a);
                    }
                    return None;
                }
            }
        }
        c.sub(Count::Retained, dirty as u64);
        c.span_retired();
        s.state.store(state(gen, v.tier, EMPTY), Release);
        Some(dirty)
    }

    /// In the child of `fork()`: a slot another thread of the parent was
    /// creating or retiring has no owner left; it becomes empty (its
    /// mapping, if any, stays out of use); the live spans' bounds
    /// ([`Span::bounds`]) are dropped. Returns the bytes of dirty free
    /// units of the live spans and their short tails, which the caller makes
    /// the retained and short-tail counts.
    pub(crate) fn repair_after_fork(&self) -> (u64, u64) {
        let (mut retained, mut tails) = (0, 0);
        for (i, s) in self.slots[..self.high.load(Relaxed).min(MAX_SPANS)]
            .iter()
            .enumerate()
        {
            let cur = s.state.load(Relaxed);
            match cur & 3 {
                CREATING | DYING => {
                    s.state
                        .store(state(gen_of(cur) + 1, Backing::Normal, EMPTY), Relaxed);
                }
                LIVE => {
                    // A parent thread may have cleared units in use and not
                    // yet counted the release: no noted bound holds.
                    s.releases.fetch_add(1, Relaxed);
                    if let Some(v) = s.view(i as u16) {
                        let free = bits::not_below(&s.in_use.snapshot(), v.units);
                        let d = bits::and(&free, &s.dirty.snapshot());
                        retained += v.len(bits::count(&d, 0, v.units)) as u64;
                        tails += u64::from(s.tails.count(0, v.units));
                    }
                }
                _ => {}
            }
        }
        (retained, tails)
    }
}

/// The unit size (as a shift) and unit count of a span of at least `len`
/// bytes: 2 MiB units up to 1 GiB, else the smallest power of two that
/// keeps the count within [`BITS`].
fn geometry(len: usize) -> io::Result<(u32, u32)> {
    let too_large = || io::Error::from_raw_os_error(libc::ENOMEM);
    let mut shift = UNIT_SHIFT;
    while len.div_ceil(1 << shift) > BITS as usize {
        shift += 1;
        if shift >= usize::BITS - 1 {
            return Err(too_large());
        }
    }
    let units = len.div_ceil(1 << shift).max(1) as u32;
    match (units as usize).checked_mul(1 << shift) {
        Some(b) if b <= isize::MAX as usize => Ok((shift, units)),
        _ => Err(too_large()),
    }
}
