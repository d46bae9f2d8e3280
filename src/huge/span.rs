//! Spans: the reservations of address space the engine carves blocks from
//! (1 GiB of `PROT_NONE` in 2 MiB units, one hugetlb block, or one block
//! longer than 1 GiB), each a slot of a static table ([`Spans`]) with
//! atomic bitmaps of its units, a stamp per unit and a committed prefix
//! (one VMA). A slot's state word carries a generation that changes when
//! its span is created or retired: a claim made through a stale [`View`]
//! is undone ([`Span::claim`]), so it never hands out an address.
//! [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#spans-and-units)
//! has the design.

mod table;

pub(crate) use table::Spans;

use super::os;
use super::stats::{Count, Counters};
use crate::bits::{self, Bits, BITS};
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use crate::tier::Backing;
use std::cell::Cell;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

/// log2 of the unit of a span up to 1 GiB (2 MiB).
pub(crate) const UNIT_SHIFT: u32 = HUGE_PAGE_2M.trailing_zeros();
/// The length of a span shared by many blocks (512 units of 2 MiB).
pub(crate) const SPAN_LEN: usize = (BITS as usize) << UNIT_SHIFT;
/// Bits of a run's length in a span's noted bounds ([`Span::note_bounds`]).
const RUN_BITS: u32 = 10;
// A run is at most `BITS` units long.
const _: () = assert!(BITS < 1 << RUN_BITS);
/// Bits of the release count in a span's noted bounds: the rest of the
/// word. Bounds noted at one count read as fresh again only after 2^44
/// more releases (20 days at ten million a second) with no search noting
/// new ones.
const COUNT_BITS: u32 = 64 - 2 * RUN_BITS;
/// Slots of the span table.
pub(crate) const MAX_SPANS: usize = 8192;
/// Home groups of threads.
pub(crate) const GROUPS: u32 = 4;

const EMPTY: u64 = 0;
const CREATING: u64 = 1;
const LIVE: u64 = 2;
const DYING: u64 = 3;

/// The state word: generation, tier and phase.
fn state(gen: u64, tier: Backing, phase: u64) -> u64 {
    gen << 8 | tier.code() << 2 | phase
}

fn gen_of(s: u64) -> u64 {
    s >> 8
}

thread_local! {
    static HOME: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// The calling thread's home group: threads are numbered as they first
/// ask, round-robin over [`GROUPS`]; 0 while its thread-locals are gone.
pub(crate) fn home_group() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    HOME.try_with(|h| {
        if h.get() == u32::MAX {
            h.set(NEXT.fetch_add(1, Relaxed) % GROUPS);
        }
        h.get()
    })
    .unwrap_or(0)
}

/// The monotonic clock in units of 2^20 ns (about 1 ms), wrapping.
pub(crate) fn stamp_now() -> u32 {
    stamp_at(sys::monotonic_ns())
}

/// Stamps up to this many (2^20, about 18 minutes) after `now` are taken
/// for stamps another thread wrote after `now` was read; any other
/// difference is an age. A stamp so reads as old for about 52 days (2^32
/// stamps less this), then as new again for at most this long.
const FUTURE_SLACK: u32 = 1 << 20;

/// How many stamps stamp `t` lies before `now`; `None` for a stamp taken
/// after `now` (by another thread since).
pub(crate) fn age(now: u32, t: u32) -> Option<u32> {
    let d = now.wrapping_sub(t);
    (d <= u32::MAX - FUTURE_SLACK).then_some(d)
}

/// Whether stamp `t` is at least `age` stamps before `now` (a stamp after
/// `now`, taken by another thread since, is not).
pub(crate) fn older(now: u32, t: u32, age: u32) -> bool {
    self::age(now, t).is_some_and(|d| d >= age)
}

/// The stamp of monotonic time `ns`.
pub(crate) fn stamp_at(ns: u64) -> u32 {
    (ns >> 20) as u32
}

/// One slot of the span table. What a search reads of every span (state,
/// geometry, [`bounds`](Self::bounds)) comes first, in one cache line.
#[repr(C, align(64))]
pub(crate) struct Span {
    /// Generation, tier and phase ([`state`]).
    state: AtomicU64,
    /// Releases of units so far: a [`free_hint`](Self::free_hint) taken at
    /// another count is stale.
    releases: AtomicU64,
    /// Upper bounds of the span's longest free run and longest retained
    /// (free and dirty) run, as `releases << 20 | free << 10 | retained`
    /// (the count's low [`COUNT_BITS`] bits, each run in [`RUN_BITS`]),
    /// taken by a search that found no place in it; claims, purges and
    /// reuse only shorten runs, so they hold until the next release.
    free_hint: AtomicU64,
    base: AtomicUsize,
    units: AtomicU32,
    shift: AtomicU32,
    group: AtomicU32,
    /// Units committed read-write from the start.
    committed: AtomicU32,
    /// Set when `munmap` of the idle span was refused for good (`EPERM`: a
    /// sealed range): not tried again.
    pinned: AtomicBool,
    /// Whether the span's address space is advised `MADV_HUGEPAGE` (a THP
    /// span reserved for promotion is not).
    advised: AtomicBool,
    pub(crate) in_use: Bits,
    pub(crate) dirty: Bits,
    pub(crate) base_pages: Bits,
    /// Of those, short tails (`Engine::keep_tail_out`).
    pub(crate) tails: Bits,
    /// Units unmapped for good (hugetlb, `retain::punch`): in use by no block.
    pub(crate) holes: Bits,
    /// Units the engine collapsed into a huge page (`MADV_COLLAPSE`) whose
    /// pages have not been dropped since.
    pub(crate) collapsed: Bits,
    /// Units whose collapse the kernel refused for good (`EINVAL`) since
    /// their pages were last dropped.
    pub(crate) refused: Bits,
    /// When each unit last changed hands: freed (or cut off a block), or
    /// handed out in a block.
    stamps: [AtomicU32; BITS as usize],
    /// Each unit's generation: raised every time the unit leaves a block
    /// and every time its pages are dropped, so a reader that saw a unit in
    /// a block can tell afterwards whether it was freed, purged or reused
    /// meanwhile.
    gens: [AtomicU32; BITS as usize],
}

/// Upper bounds of a span's runs, in units ([`Span::bounds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// The longest free run.
    pub(crate) free: u32,
    /// The longest run of retained units (free and dirty).
    pub(crate) retained: u32,
}

/// What a thread read of a live span: its geometry, valid while the span
/// keeps the generation in `state`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    pub(crate) index: u16,
    state: u64,
    pub(crate) tier: Backing,
    pub(crate) base: usize,
    pub(crate) units: u32,
    pub(crate) shift: u32,
    pub(crate) group: u32,
}

impl View {
    /// The address of unit `u`.
    pub(crate) fn addr(&self, u: u32) -> NonNull<u8> {
        // A live span's base is a mapping's address: never 0.
        NonNull::new((self.base + ((u as usize) << self.shift)) as *mut u8)
            .unwrap_or(NonNull::dangling())
    }

    /// The bytes of `n` units.
    pub(crate) fn len(&self, n: u32) -> usize {
        (n as usize) << self.shift
    }

    /// The unit at address `p` (inside the span).
    pub(crate) fn unit_of(&self, p: usize) -> u32 {
        ((p - self.base) >> self.shift) as u32
    }

    /// Units a block of `len` bytes takes here.
    pub(crate) fn units_for(&self, len: usize) -> u32 {
        len.div_ceil(1 << self.shift).min(u32::MAX as usize) as u32
    }

    /// Whether this span serves blocks of `len` bytes: spans of 2 MiB
    /// units those up to 1 GiB, larger units only longer ones.
    pub(crate) fn serves(&self, len: usize) -> bool {
        (self.shift == UNIT_SHIFT) == (len <= SPAN_LEN) && self.units_for(len) <= self.units
    }
}

/// Units `start..start + n` of a span, as the view `v` saw it.
#[derive(Clone, Copy)]
pub(crate) struct Units<'a> {
    pub(crate) span: &'a Span,
    pub(crate) v: View,
    pub(crate) start: u32,
    pub(crate) n: u32,
}

impl<'a> Units<'a> {
    /// Units `start..start + n` of the same span.
    pub(crate) fn at(&self, start: u32, n: u32) -> Units<'a> {
        self.span.units(self.v, start, n)
    }

    /// The address of the first unit.
    pub(crate) fn addr(&self) -> NonNull<u8> {
        self.v.addr(self.start)
    }

    /// Their bytes.
    pub(crate) fn len(&self) -> usize {
        self.v.len(self.n)
    }
}

impl Span {
    const fn new() -> Span {
        Span {
            state: AtomicU64::new(EMPTY),
            releases: AtomicU64::new(0),
            free_hint: AtomicU64::new(0),
            base: AtomicUsize::new(0),
            units: AtomicU32::new(0),
            shift: AtomicU32::new(0),
            group: AtomicU32::new(0),
            committed: AtomicU32::new(0),
            pinned: AtomicBool::new(false),
            advised: AtomicBool::new(false),
            in_use: Bits::new(),
            dirty: Bits::new(),
            base_pages: Bits::new(),
            tails: Bits::new(),
            holes: Bits::new(),
            collapsed: Bits::new(),
            refused: Bits::new(),
            stamps: [const { AtomicU32::new(0) }; BITS as usize],
            gens: [const { AtomicU32::new(0) }; BITS as usize],
        }
    }

    /// The view of the span, `None` unless it is live.
    pub(crate) fn view(&self, index: u16) -> Option<View> {
        let s = self.state.load(Acquire);
        (s & 3 == LIVE).then(|| View {
            index,
            state: s,
            tier: Backing::from_code((s >> 2) & 3).unwrap_or(Backing::Normal),
            base: self.base.load(Relaxed),
            units: self.units.load(Relaxed),
            shift: self.shift.load(Relaxed),
            group: self.group.load(Relaxed),
        })
    }

    /// Units `start..start + n` of this span as `v` saw it.
    pub(crate) fn units(&self, v: View, start: u32, n: u32) -> Units<'_> {
        Units {
            span: self,
            v,
            start,
            n,
        }
    }

    /// Set units `start..start + n` in use if all are free and the span
    /// is still the one `v` saw; `true` when they are now the caller's.
    pub(crate) fn claim(&self, v: &View, start: u32, n: u32) -> bool {
        if n == 0 || start.checked_add(n).is_none_or(|e| e > v.units) {
            return false;
        }
        if !self.in_use.try_set(start, n) {
            // A partial claim was undone: bits were set for a moment.
            self.releases.fetch_add(1, Release);
            return false;
        }
        if self.state.load(SeqCst) != v.state {
            self.release(start, n);
            return false;
        }
        true
    }

    /// Whether the span is still the one `v` saw.
    pub(crate) fn is(&self, v: &View) -> bool {
        self.state.load(Acquire) == v.state
    }

    /// Whether the span's address space is advised `MADV_HUGEPAGE`.
    pub(crate) fn advised(&self) -> bool {
        self.advised.load(Relaxed)
    }

    /// Units in use by blocks (or claimed), holes not counted.
    pub(crate) fn busy(&self, v: &View) -> u32 {
        let used = bits::and(&self.in_use.snapshot(), &bits::not(&self.holes.snapshot()));
        bits::count(&used, 0, v.units)
    }

    /// Claim every unit that is no hole, if all are free and the span is
    /// still the one `v` saw.
    fn claim_all(&self, v: &View) -> bool {
        let free = bits::not_below(&self.in_use.snapshot(), v.units);
        let holes = bits::count(&self.holes.snapshot(), 0, v.units);
        if bits::count(&free, 0, v.units) + holes != v.units {
            return false;
        }
        let mut done = 0;
        let mut taken = bits::runs(&free).all(|(a, b)| {
            let ok = self.claim(v, a, b - a);
            if ok {
                done = b;
            }
            ok
        });
        // With no free run (every unit a hole) no claim checked the span.
        taken &= self.state.load(SeqCst) == v.state;
        if !taken {
            for (a, b) in bits::runs(&free).take_while(|&(_, b)| b <= done) {
                self.release(a, b - a);
            }
        }
        taken
    }

    /// Free units `start..start + n` (the caller's), for other threads.
    pub(crate) fn release(&self, start: u32, n: u32) {
        self.in_use.clear(start, n);
        self.releases.fetch_add(1, Release);
    }

    /// The count of releases now; read before the snapshot a
    /// [`note_bounds`](Self::note_bounds) takes.
    pub(crate) fn release_count(&self) -> u64 {
        self.releases.load(Acquire)
    }

    /// Count `n` releases that released nothing: a test's way to a count
    /// far from the one bounds were noted at.
    #[cfg(test)]
    pub(crate) fn skip_releases(&self, n: u64) {
        self.releases.fetch_add(n, Release);
    }

    /// Bounds of the span's runs that still hold: `None` when a unit was
    /// released since a search last noted them.
    #[inline]
    pub(crate) fn bounds(&self) -> Option<Bounds> {
        let h = self.free_hint.load(Relaxed);
        let run = |x: u64| (x & ((1 << RUN_BITS) - 1)) as u32;
        (h >> (2 * RUN_BITS) == self.releases.load(Acquire) & (u64::MAX >> (64 - COUNT_BITS)))
            .then_some(Bounds {
                free: run(h >> RUN_BITS),
                retained: run(h),
            })
    }

    /// Remember the longest free run and the longest retained run of `v`'s
    /// span now (snapshots taken after `count` releases) as bounds until
    /// the next release.
    pub(crate) fn note_bounds(&self, count: u64, v: &View) {
        let free = bits::not_below(&self.in_use.snapshot(), v.units);
        let retained = bits::and(&free, &self.dirty.snapshot());
        let longest = |b: &bits::Snapshot| bits::runs(b).map(|(a, e)| e - a).max().unwrap_or(0);
        // Runs are at most `BITS` (512) units long: each fits `RUN_BITS`.
        let (f, r) = (u64::from(longest(&free)), u64::from(longest(&retained)));
        // A span retired and made anew meanwhile has other units.
        if self.is(v) {
            self.free_hint
                .store(count << (2 * RUN_BITS) | f << RUN_BITS | r, Relaxed);
        }
    }

    /// Commit the units before `end` (make them read-write), if they are
    /// not yet: the committed prefix grows, one VMA.
    pub(crate) fn commit(&self, c: &Counters, v: &View, end: u32) -> io::Result<()> {
        let done = self.committed.load(Acquire);
        if end <= done {
            return Ok(());
        }
        // Two threads may commit overlapping ranges: read-write twice is
        // read-write. A hole's address space is no longer the span's: it is
        // skipped (the committed part is then more than one VMA).
        let keep = bits::not_below(&self.holes.snapshot(), end);
        for (a, b) in bits::runs(&keep).filter(|&(_, b)| b > done) {
            let a = a.max(done);
            os::commit(c, v.addr(a), v.len(b - a))?;
        }
        self.committed.fetch_max(end, Release);
        Ok(())
    }

    /// Unmap units `start..start + n` (the caller's) for good: they become
    /// a hole, whose address space is no longer the span's. Returns the
    /// bytes of retained units among them, which the caller stops counting.
    pub(crate) fn unmap_hole(
        &self,
        c: &Counters,
        v: &View,
        start: u32,
        n: u32,
    ) -> io::Result<usize> {
        let dirty = v.len(self.dirty.count(start, n));
        os::unmap(c, v.addr(start), v.len(n))?;
        self.holes.set(start, n);
        self.dirty.clear(start, n);
        self.pages_dropped(start, n);
        self.forget_advice(c, start, n);
        c.span_hole(v.len(n));
        Ok(dirty)
    }

    /// Units `start..start + n` are advised for their span's tier again:
    /// no base-page bits, no short tails.
    pub(crate) fn forget_advice(&self, c: &Counters, start: u32, n: u32) {
        self.base_pages.clear(start, n);
        c.sub(Count::ShortTails, u64::from(self.tails.count(start, n)));
        self.tails.clear(start, n);
    }

    /// Advise the address space (around its holes) of a span reserved
    /// unadvised `MADV_HUGEPAGE`, once; advice only, so a failure changes
    /// nothing.
    pub(crate) fn advise_huge(&self, c: &Counters, v: &View) {
        if self.advised.swap(true, Relaxed) {
            return;
        }
        let mapped = bits::not_below(&self.holes.snapshot(), v.units);
        for (a, b) in bits::runs(&mapped) {
            let _ = os::advise(c, v.addr(a), v.len(b - a), Advice::HugePage);
        }
    }

    /// The runs of retained (dirty) units among `start..start + n`.
    pub(crate) fn dirty_runs(&self, start: u32, n: u32) -> impl Iterator<Item = (u32, u32)> {
        let end = start + n;
        bits::runs(&self.dirty.snapshot())
            .map(move |(s, e)| (s.max(start), e.min(end)))
            .filter(|(s, e)| s < e)
    }

    /// Stamp units `start..start + n` as changing hands at `now`.
    pub(crate) fn stamp(&self, start: u32, n: u32, now: u32) {
        for s in &self.stamps[start as usize..(start + n) as usize] {
            s.store(now, Relaxed);
        }
    }

    /// The pages of units `start..start + n` were dropped: a new
    /// generation each, then whatever was collapsed or refused there is no
    /// more. In that order, with a fence paired with the one in
    /// `promote::collapse`: a collapse that marked a unit before this clear
    /// is cleared here, and one that marks it after sees the new generation
    /// and clears its mark itself.
    pub(crate) fn pages_dropped(&self, start: u32, n: u32) {
        self.next_generation(start, n);
        fence(SeqCst);
        self.collapsed.clear(start, n);
        self.refused.clear(start, n);
    }

    /// Units `start..start + n` leave a block (or their pages are
    /// dropped): a new generation each.
    pub(crate) fn next_generation(&self, start: u32, n: u32) {
        for g in &self.gens[start as usize..(start + n) as usize] {
            g.fetch_add(1, Release);
        }
    }

    /// The generation of unit `u`.
    pub(crate) fn generation(&self, u: u32) -> u32 {
        self.gens[u as usize].load(Acquire)
    }

    /// The stamp of unit `u`.
    pub(crate) fn stamp_of(&self, u: u32) -> u32 {
        self.stamps[u as usize].load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_old_for_weeks_and_one_written_since_now_reads_new() {
        let now = 7u32;
        assert!(older(now, 4, 3) && !older(now, 5, 3));
        assert_eq!(age(now, 7), Some(0));
        // Written by another thread after `now` was read.
        assert_eq!(age(now, now.wrapping_add(10)), None);
        assert!(!older(now, now.wrapping_add(10), 0));
        // About 30 days before `now` (2^31 stamps is about 26 days).
        let month = now.wrapping_sub(2_500_000_000);
        assert_eq!(age(now, month), Some(2_500_000_000));
        assert!(older(now, month, 2000));
    }

    #[test]
    fn dropping_pages_moves_the_generation_and_clears_the_marks() {
        static S: Span = Span::new();
        let g = S.generation(3);
        S.collapsed.set(3, 1);
        S.refused.set(4, 1);
        S.pages_dropped(3, 2);
        assert_ne!(S.generation(3), g, "a collapse in flight sees the drop");
        assert_eq!(S.collapsed.count(3, 1) + S.refused.count(4, 1), 0);
        assert_eq!(S.generation(5), 0, "other units keep theirs");
    }
}
