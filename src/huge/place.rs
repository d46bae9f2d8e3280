//! Where a block goes: a search of snapshots of the spans' bitmaps for
//! free units ([`Want`]), the calling thread's group first; the caller
//! claims what it found and searches again if another thread was first.

use super::span::{Bounds, Span, Spans, View};
use crate::bits;
use crate::sys::HUGE_PAGE_2M;
use crate::tier::Backing;
use std::cmp::Reverse;

/// Which free units a search looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Retained units (a hit): the shortest retained run the block fits,
    /// the most recently freed of equals, then the lowest address.
    Retained,
    /// Clean units (never used, or purged) of a THP or normal-page span:
    /// the lowest address.
    Clean,
    /// Retained units with free units around them: the most retained units
    /// (the fewest to fault in), then the lowest address. No hugetlb span.
    MostRetained,
}

/// Units a search found: `n` units from `start` in the span `view`, of
/// which `dirty` are retained, in a free run of `run` units.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    pub(crate) view: View,
    pub(crate) start: u32,
    pub(crate) n: u32,
    pub(crate) dirty: u32,
    pub(crate) run: u32,
}

/// The first unit index at or after `from` where a block aligned to
/// `align` (a power of two, at least 2 MiB) may start in span `v`.
fn aligned_from(v: &View, align: usize, from: u32) -> Option<u32> {
    let unit = 1usize << v.shift;
    if align <= HUGE_PAGE_2M {
        return Some(from);
    }
    // Offset of the first aligned address from the span's base.
    let off = (align - v.base % align) % align;
    if !off.is_multiple_of(unit) {
        return None;
    }
    let (first, step) = ((off / unit) as u64, (align / unit).max(1) as u64);
    let i = if u64::from(from) <= first {
        first
    } else {
        first + (u64::from(from) - first).div_ceil(step) * step
    };
    u32::try_from(i).ok()
}

/// Which THP spans a search looks at: how faults in their units come in
/// (fresh units, those around retained ones, and retained ones purged to
/// read zero). Spans of other tiers pass every filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Faults {
    /// Spans advised `MADV_HUGEPAGE`: faults take huge pages.
    Huge,
    /// Spans reserved unadvised for promotion: faults take base pages.
    Base,
    /// Any span.
    Any,
}

impl Faults {
    /// Whether a search looks at `span` (`v`).
    fn admits(self, span: &Span, v: &View) -> bool {
        match self {
            _ if v.tier != Backing::TransparentHuge => true,
            Faults::Huge => span.advised(),
            Faults::Base => !span.advised(),
            Faults::Any => true,
        }
    }

    /// The spans whose units may fault in under this verdict when only
    /// some of a block's units fault (around retained ones, or retained
    /// ones purged): any while huge pages may fault, else unadvised ones.
    pub(crate) fn some_units(self) -> Faults {
        match self {
            Faults::Huge | Faults::Any => Faults::Any,
            Faults::Base => Faults::Base,
        }
    }
}

/// Which spans a search looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Groups {
    /// The spans of the calling thread's group only.
    Home,
    /// Those first, then every other span.
    Any,
}

/// Search the live spans of `groups` that `faults` admits for `len` bytes
/// aligned to `align`: the best place in the spans of `home`, else (for
/// [`Groups::Any`]) the best in the others, in one scan of the table.
pub(crate) fn find(
    spans: &Spans,
    len: usize,
    align: usize,
    want: Want,
    home: u32,
    groups: Groups,
    faults: Faults,
) -> Option<Placement> {
    // The best place among the home group's spans and among the others.
    let mut best: [Option<(Score, Placement)>; 2] = [None, None];
    for (span, v) in spans.live() {
        let other = usize::from(v.group != home);
        if (other == 1 && (groups == Groups::Home || best[0].is_some())) || !v.serves(len) {
            continue;
        }
        if (want != Want::Retained && v.tier == Backing::Hugetlb) || !faults.admits(span, &v) {
            continue;
        }
        // First fit: spans in slot order, units by address; a later
        // span of the home group still beats another group's.
        if want == Want::Clean && best[other].is_some() {
            continue;
        }
        let n = v.units_for(len);
        if span.bounds().is_some_and(|b| surely_none(b, n, want)) {
            continue;
        }
        let count = span.release_count();
        let Some((score, p)) = in_span(span, &v, n, align, want) else {
            span.note_bounds(count, &v);
            continue;
        };
        if best[other].as_ref().is_none_or(|(b, _)| score < *b) {
            best[other] = Some((score, p));
        }
        if want == Want::Clean && other == 0 {
            break;
        }
    }
    let [mine, others] = best;
    mine.or(others).map(|(_, p)| p)
}

/// Whether a span whose runs are within `b` surely has no place for `n`
/// units of `want`.
fn surely_none(b: Bounds, n: u32, want: Want) -> bool {
    match want {
        Want::Retained => b.retained < n,
        Want::Clean => b.free < n,
        // Some retained units inside a free run of `n`.
        Want::MostRetained => b.free < n || b.retained == 0,
    }
}

/// Lower is better: (run length or 0, newness, more retained units, address).
type Score = (u32, Reverse<u32>, Reverse<u32>, usize);

/// The best placement of `n` units in one span.
fn in_span(span: &Span, v: &View, n: u32, align: usize, want: Want) -> Option<(Score, Placement)> {
    let free = bits::not_below(&span.in_use.snapshot(), v.units);
    let dirty = span.dirty.snapshot();
    let at = |start: u32| v.base + v.len(start);
    let place = |start: u32, dirty: u32, run: u32| Placement {
        view: *v,
        start,
        n,
        dirty,
        run,
    };
    let mut best: Option<(Score, Placement)> = None;
    let mut offer = |score: Score, p: Placement| {
        if best.as_ref().is_none_or(|(b, _)| score < *b) {
            best = Some((score, p));
        }
    };
    match want {
        Want::Retained => {
            for (s, e) in bits::runs(&bits::and(&free, &dirty)) {
                let Some(i) = aligned_from(v, align, s).filter(|&i| i + n <= e) else {
                    continue;
                };
                let score = (e - s, Reverse(span.stamp_of(i)), Reverse(n), at(i));
                offer(score, place(i, n, e - s));
            }
        }
        Want::Clean => {
            let clean = bits::and(&free, &bits::not(&dirty));
            for (s, e) in bits::runs(&clean) {
                if let Some(i) = aligned_from(v, align, s).filter(|&i| i + n <= e) {
                    return Some(((0, Reverse(0), Reverse(0), at(i)), place(i, 0, e - s)));
                }
            }
        }
        Want::MostRetained => {
            let retained = bits::and(&free, &dirty);
            for (fs, fe) in bits::runs(&free) {
                for (ds, de) in bits::runs(&bits::within(&retained, fs, fe)) {
                    // Windows that hold the whole retained run and stay
                    // inside the free run start from `lo` to `hi`.
                    let lo = fs.max(de.saturating_sub(n));
                    let hi = ds.min(fe.saturating_sub(n));
                    let Some(i) = aligned_from(v, align, lo).filter(|&i| i <= hi && i + n <= fe)
                    else {
                        continue;
                    };
                    let d = bits::count(&retained, i, n);
                    if d > 0 && d < n {
                        offer((0, Reverse(0), Reverse(d), at(i)), place(i, d, fe - fs));
                    }
                }
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::huge::extents::ExtentMap;
    use crate::huge::stats::Counters;

    const MIB2: usize = HUGE_PAGE_2M;

    #[test]
    #[cfg_attr(miri, ignore = "mmap of the spans")]
    fn bounds_skip_full_spans_until_a_release_and_home_beats_an_earlier_span() {
        static SPANS: Spans = Spans::new();
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        // Slot 0 for group 1, slot 1 for group 0 (home below).
        let other = SPANS.reserve(&c, &MAP, MIB2, MIB2, 1, false).unwrap();
        let mine = SPANS.reserve(&c, &MAP, MIB2, MIB2, 0, false).unwrap();
        let (a, b) = (SPANS.get(other.index), SPANS.get(mine.index));
        // Home's span, later in slot order, is chosen first.
        let p = find(&SPANS, MIB2, MIB2, Want::Clean, 0, Groups::Any, Faults::Any).unwrap();
        assert_eq!((p.view.index, p.start), (mine.index, 0));
        // Fill the home span but its last unit.
        assert!(b.claim(&mine, 0, mine.units - 1));
        let two = 2 * MIB2;
        let p = find(&SPANS, two, MIB2, Want::Clean, 0, Groups::Any, Faults::Any).unwrap();
        assert_eq!(
            p.view.index, other.index,
            "another group's span when home has none"
        );
        assert_eq!(
            find(&SPANS, two, MIB2, Want::Clean, 0, Groups::Home, Faults::Any).map(|p| p.start),
            None
        );
        let full = b.bounds().expect("the search noted its bounds");
        assert_eq!(
            full,
            Bounds {
                free: 1,
                retained: 0
            }
        );
        // No retained unit anywhere: both spans are noted as such.
        assert!(find(
            &SPANS,
            MIB2,
            MIB2,
            Want::Retained,
            0,
            Groups::Any,
            Faults::Any
        )
        .is_none());
        assert_eq!(a.bounds().map(|b| b.retained), Some(0));
        // A release makes the bounds stale, and the run is found again.
        b.release(0, 2);
        assert_eq!(b.bounds(), None);
        let p = find(&SPANS, two, MIB2, Want::Clean, 0, Groups::Home, Faults::Any).unwrap();
        assert_eq!((p.view.index, p.start, p.n), (mine.index, 0, 2));
        // Retained units (dirty and free) are found by a retained search.
        assert!(b.claim(&mine, 0, 2));
        b.dirty.set(0, 2);
        b.release(0, 2);
        let p = find(
            &SPANS,
            two,
            MIB2,
            Want::Retained,
            0,
            Groups::Any,
            Faults::Any,
        )
        .unwrap();
        assert_eq!((p.view.index, p.start, p.dirty), (mine.index, 0, 2));
        assert!(find(
            &SPANS,
            3 * MIB2,
            MIB2,
            Want::Retained,
            0,
            Groups::Any,
            Faults::Any
        )
        .is_none());
        assert_eq!(
            b.bounds(),
            Some(Bounds {
                free: 2,
                retained: 2
            })
        );
        // Bounds noted 2^32 releases ago are stale: the count goes on.
        b.skip_releases(1 << 32);
        assert_eq!(b.bounds(), None);
        for (s, v) in [(a, other), (b, mine)] {
            s.release(0, v.units);
            s.dirty.clear(0, v.units);
            assert!(SPANS.retire(&c, &v).is_some());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap of the spans")]
    fn fresh_units_come_from_spans_advised_as_asked_and_retained_ones_from_any() {
        static SPANS: Spans = Spans::new();
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        let base = SPANS.reserve(&c, &MAP, MIB2, MIB2, 0, false).unwrap();
        let huge = SPANS.reserve(&c, &MAP, MIB2, MIB2, 0, true).unwrap();
        if base.tier != Backing::TransparentHuge || huge.tier != Backing::TransparentHuge {
            eprintln!("no THP spans here: skipped");
            return;
        }
        let clean = |faults| {
            find(&SPANS, MIB2, MIB2, Want::Clean, 0, Groups::Any, faults).map(|p| p.view.index)
        };
        assert_eq!(clean(Faults::Huge), Some(huge.index));
        assert_eq!(clean(Faults::Base), Some(base.index));
        assert_eq!(clean(Faults::Any), Some(base.index), "the first span");
        // Retained units of the advised span: found by a search of any
        // span, not by one for base-page faults (a purge for zeros would
        // fault them in again as huge pages).
        let (b, h) = (SPANS.get(base.index), SPANS.get(huge.index));
        assert!(h.claim(&huge, 0, 1));
        h.dirty.set(0, 1);
        h.release(0, 1);
        let retained = |faults| {
            find(&SPANS, MIB2, MIB2, Want::Retained, 0, Groups::Any, faults)
                .map(|p| (p.view.index, p.start))
        };
        assert_eq!(retained(Faults::Any), Some((huge.index, 0)));
        assert_eq!(retained(Faults::Base), None);
        assert_eq!(Faults::Huge.some_units(), Faults::Any);
        assert_eq!(Faults::Base.some_units(), Faults::Base);
        // No clean unit left in the base-page span: none for base pages.
        assert!(b.claim(&base, 0, base.units));
        assert_eq!(clean(Faults::Base), None);
        assert_eq!(clean(Faults::Huge), Some(huge.index));
        b.release(0, base.units);
        h.dirty.clear(0, 1);
        for v in [base, huge] {
            assert!(SPANS.retire(&c, &v).is_some());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap of the spans")]
    fn release_all_gives_back_a_span_whose_free_units_holes_split() {
        static SPANS: Spans = Spans::new();
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        let v = SPANS.reserve(&c, &MAP, MIB2, MIB2, 0, false).unwrap();
        let span = SPANS.get(v.index);
        // Blocks at 0..2 and 3..5, every other unit a hole, then the
        // blocks freed: no block left, free runs of 2 units.
        assert!(span.claim(&v, 0, 5));
        assert!(span.claim(&v, 5, v.units - 5));
        span.unmap_hole(&c, &v, 2, 1).unwrap();
        span.unmap_hole(&c, &v, 5, v.units - 5).unwrap();
        span.release(0, 2);
        span.release(3, 2);
        assert!(find(
            &SPANS,
            3 * MIB2,
            MIB2,
            Want::Clean,
            0,
            Groups::Any,
            Faults::Any
        )
        .is_none());
        assert_eq!(
            span.bounds(),
            Some(Bounds {
                free: 2,
                retained: 0
            })
        );
        crate::huge::retain::release_all(&c, &SPANS);
        assert!(span.view(v.index).is_none(), "the span went back");
    }
}
