//! The layout of a manifest over the tensor data, for a report: gaps,
//! overlaps, stray entries ([`LayoutReport`]).

use super::manifest::Manifest;

/// A span of bytes no entry covers, found by [`WeightsFile::layout_report`](super::WeightsFile::layout_report).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gap {
    /// First uncovered byte.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// The entry just before the gap (`None` at the start of the region).
    pub after: Option<String>,
}

/// Two entries sharing bytes, found by [`WeightsFile::layout_report`](super::WeightsFile::layout_report).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overlap {
    /// Entry with the lower offset.
    pub first: String,
    /// Entry starting inside `first`.
    pub second: String,
    /// First shared byte.
    pub start: u64,
    /// End of the shared range (exclusive).
    pub end: u64,
}

/// What `ckalloc inspect` prints about the layout: gaps, overlaps, stray entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayoutReport {
    /// The region examined, `[start, end)` bytes.
    pub region: (u64, u64),
    /// Uncovered spans inside the region, in offset order (alignment padding shows here).
    pub gaps: Vec<Gap>,
    /// Overlapping pairs, in offset order.
    pub overlaps: Vec<Overlap>,
    /// Names of entries not wholly inside the region (or whose end overflows).
    pub outside: Vec<String>,
    /// Bytes of the region covered by at least one entry.
    pub covered_bytes: u64,
}

impl LayoutReport {
    /// True when there are no overlaps and no entries outside the region.
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.outside.is_empty()
    }

    /// Total bytes in gaps.
    pub fn gap_bytes(&self) -> u64 {
        self.gaps.iter().map(|g| g.end - g.start).sum()
    }
}

impl Manifest {
    /// Overlapping pairs (each later entry against the furthest-reaching earlier
    /// one), in offset order. Entries whose end overflows are ignored here.
    pub(crate) fn overlaps(&self) -> Vec<Overlap> {
        let mut out = Vec::new();
        let mut reach: Option<(u64, &str)> = None; // furthest end so far and its owner
        for e in self.sorted_by_offset() {
            let Some(end) = e.end() else { continue };
            if e.size == 0 {
                continue;
            }
            if let Some((r, owner)) = reach {
                if e.file_offset < r {
                    out.push(Overlap {
                        first: owner.to_owned(),
                        second: e.name.clone(),
                        start: e.file_offset,
                        end: end.min(r),
                    });
                }
            }
            let further = match reach {
                Some((r, _)) => end > r,
                None => true,
            };
            if further {
                reach = Some((end, &e.name));
            }
        }
        out
    }

    /// Gaps, overlaps and stray entries relative to the region `[start, end)`
    /// (for a [`WeightsFile`](super::WeightsFile): `[tensor_data_start,
    /// data_end)`, see [`WeightsFile::layout_report`](super::WeightsFile::layout_report)).
    pub(crate) fn layout_report(&self, start: u64, end: u64) -> LayoutReport {
        let mut rep = LayoutReport {
            region: (start, end),
            ..LayoutReport::default()
        };
        let mut cursor = start;
        let mut last: Option<String> = None;
        for e in self.sorted_by_offset() {
            let e_end = match e.end() {
                Some(x) if e.file_offset >= start && x <= end => x,
                _ => {
                    rep.outside.push(e.name.clone());
                    continue;
                }
            };
            if e.file_offset > cursor {
                rep.gaps.push(Gap {
                    start: cursor,
                    end: e.file_offset,
                    after: last.clone(),
                });
            }
            if e_end > cursor {
                rep.covered_bytes += e_end - cursor.max(e.file_offset);
                cursor = e_end;
            }
            last = Some(e.name.clone());
        }
        if cursor < end {
            rep.gaps.push(Gap {
                start: cursor,
                end,
                after: last,
            });
        }
        rep.overlaps = self
            .overlaps()
            .into_iter()
            .filter(|o| !rep.outside.contains(&o.first) && !rep.outside.contains(&o.second))
            .collect();
        rep
    }
}
