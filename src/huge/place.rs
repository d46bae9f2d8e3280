//! Where a block goes: a search of snapshots of the spans' bitmaps for
//! free units ([`Want`]), the calling thread's group first; the caller
//! claims what it found and searches again if another thread was first.

use super::span::{Span, Spans, View};
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

/// Which spans a search looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Groups {
    /// The spans of the calling thread's group only.
    Home,
    /// Those first, then every other span.
    Any,
}

/// Search the live spans of `groups` for `len` bytes aligned to `align`:
/// the spans of `home` first, the others (for [`Groups::Any`]) when none
/// of those has a place.
pub(crate) fn find(
    spans: &Spans,
    len: usize,
    align: usize,
    want: Want,
    home: u32,
    groups: Groups,
) -> Option<Placement> {
    let passes: &[bool] = match groups {
        Groups::Home => &[true],
        Groups::Any => &[true, false],
    };
    for &mine in passes {
        let mut best: Option<(Score, Placement)> = None;
        for (span, v) in spans.live() {
            if (v.group == home) != mine || !v.serves(len) {
                continue;
            }
            if want != Want::Retained && v.tier == Backing::Hugetlb {
                continue;
            }
            let n = v.units_for(len);
            if span.surely_no_run(n) {
                continue;
            }
            let count = span.release_count();
            let found = in_span(span, &v, n, align, want);
            if found.is_none() {
                span.note_longest_free(count, &v);
            }
            if let Some((score, p)) = found {
                if best.as_ref().is_none_or(|(b, _)| score < *b) {
                    best = Some((score, p));
                }
                if want == Want::Clean {
                    // First fit: spans in slot order, units by address.
                    break;
                }
            }
        }
        if let Some((_, p)) = best {
            return Some(p);
        }
    }
    None
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
