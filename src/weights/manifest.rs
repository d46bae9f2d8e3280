//! The sidecar manifests: `weights_manifest.map` and `weights_manifest.json`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use super::{Dtype, ManifestKind, Version, WeightsError};

/// File name of the JSON sidecar.
pub const MANIFEST_JSON: &str = "weights_manifest.json";
/// File name of the line-based sidecar.
pub const MANIFEST_MAP: &str = "weights_manifest.map";

/// One tensor: where its bytes are in the file and where they go at run time.
/// Offsets and sizes are bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManifestEntry {
    /// Tensor name (no `|`, no line breaks).
    pub name: String,
    /// Dtype name as written in the manifest (the authority; see [`Dtype::from_name`]).
    pub dtype: String,
    /// Offset of the first byte in `weights.bump`.
    pub file_offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// Destination offset in the runtime buffer (equals `file_offset` unless a
    /// layout tool relocated it; the JSON sidecar has none and uses `file_offset`).
    pub runtime_offset: u64,
    /// Shape, outermost first, when known (JSON sidecar only).
    pub shape: Option<Vec<u64>>,
}

impl ManifestEntry {
    /// An entry with `runtime_offset == file_offset` and no shape.
    pub fn new(
        name: impl Into<String>,
        dtype: impl Into<String>,
        file_offset: u64,
        size: u64,
    ) -> Self {
        ManifestEntry {
            name: name.into(),
            dtype: dtype.into(),
            file_offset,
            size,
            runtime_offset: file_offset,
            shape: None,
        }
    }

    /// `file_offset + size`, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.file_offset.checked_add(self.size)
    }

    /// The parsed dtype.
    ///
    /// # Errors
    /// [`WeightsError::UnknownDtype`] naming the manifest's spelling.
    pub fn parsed_dtype(&self) -> Result<Dtype, WeightsError> {
        Dtype::from_name(&self.dtype)
    }
}

/// A span of bytes no entry covers, found by [`Manifest::layout_report`].
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

/// Two entries sharing bytes, found by [`Manifest::layout_report`].
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

/// A parsed manifest: entries in the order the sidecar lists them (ckalloc's
/// writer lists them in file-offset order) and an index by name.
///
/// Immutable after construction; `Send + Sync`. Two manifests are equal when
/// their entries are (the JSON `format` and `generator` strings are not compared).
#[derive(Clone, Debug, Default)]
pub struct Manifest {
    entries: Vec<ManifestEntry>,
    index: HashMap<String, usize>,
    format: Option<String>,
    generator: Option<String>,
}

impl PartialEq for Manifest {
    fn eq(&self, other: &Manifest) -> bool {
        self.entries == other.entries
    }
}

impl Eq for Manifest {}

/// Parse an offset/size field: `0x`/`0X` hexadecimal or decimal. A decimal with a
/// leading zero (`0123`) is rejected because C-Kernel-Engine's C loader
/// (`strtoull(s, NULL, 0)`) would read it as octal.
fn parse_number(s: &str) -> Result<u64, String> {
    let t = s.trim_matches(|c: char| c == ' ' || c == '\t');
    let (digits, radix) = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (t, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(format!("\"{s}\" is not a decimal or 0x-hexadecimal number"));
    }
    if radix == 10 && digits.len() > 1 && digits.starts_with('0') {
        return Err(format!(
            "\"{s}\" has a leading zero (C readers would take it as octal)"
        ));
    }
    u64::from_str_radix(digits, radix).map_err(|_| format!("\"{s}\" does not fit in 64 bits"))
}

/// A number in the JSON manifest: an integer or a string in `.map` syntax.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonNum {
    Int(u64),
    Text(String),
}

#[derive(Deserialize)]
struct JsonEntry {
    name: String,
    dtype: String,
    #[serde(alias = "offset")]
    file_offset: JsonNum,
    size: JsonNum,
    #[serde(default)]
    runtime_offset: Option<JsonNum>,
    #[serde(default)]
    shape: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct JsonManifest {
    entries: Vec<JsonEntry>,
    #[serde(default)]
    format: Option<serde_json::Value>,
    #[serde(default)]
    generator: Option<serde_json::Value>,
}

fn json_err(message: String) -> WeightsError {
    WeightsError::ManifestSyntax {
        kind: ManifestKind::Json,
        line: 0,
        message,
    }
}

fn truncate_for_display(s: &str) -> String {
    if s.len() <= 80 {
        return s.to_owned();
    }
    let mut end = 80;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl Manifest {
    /// Build from entries (kept in the given order).
    ///
    /// # Errors
    /// [`WeightsError::DuplicateTensor`] if two entries share a name.
    pub fn from_entries(entries: Vec<ManifestEntry>) -> Result<Manifest, WeightsError> {
        let mut index = HashMap::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            if index.insert(e.name.clone(), i).is_some() {
                return Err(WeightsError::DuplicateTensor {
                    name: e.name.clone(),
                });
            }
        }
        Ok(Manifest {
            entries,
            index,
            format: None,
            generator: None,
        })
    }

    /// Parse `weights_manifest.map`: one `name|dtype|FILE_OFFSET|SIZE|RUNTIME_OFFSET`
    /// per line, numbers as `0x` hex (what writers emit) or decimal; empty lines
    /// and lines starting with `#` (such as the first line
    /// `# ck-bumpwgt5-manifest-map v1`) are skipped; a trailing `\r` is removed.
    ///
    /// Stricter than C-Kernel-Engine's C loader, which ignores extra fields and
    /// collapses empty ones: here a line must have exactly five fields, non-empty
    /// name and dtype, and numbers without an octal-looking leading zero.
    ///
    /// # Errors
    /// [`WeightsError::ManifestSyntax`] with the 1-based line number;
    /// [`WeightsError::DuplicateTensor`].
    pub fn from_map(text: &str) -> Result<Manifest, WeightsError> {
        let mut entries = Vec::new();
        for (i, raw) in text.split('\n').enumerate() {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |message: String| WeightsError::ManifestSyntax {
                kind: ManifestKind::Map,
                line: i + 1,
                message,
            };
            let fields: Vec<&str> = line.split('|').collect();
            if fields.len() != 5 {
                return Err(err(format!(
                    "expected 5 fields name|dtype|file_offset|size|runtime_offset, found {} in \"{}\"",
                    fields.len(),
                    truncate_for_display(line)
                )));
            }
            if fields[0].is_empty() || fields[1].is_empty() {
                return Err(err(format!(
                    "empty name or dtype in \"{}\"",
                    truncate_for_display(line)
                )));
            }
            let file_offset =
                parse_number(fields[2]).map_err(|m| err(format!("file_offset: {m}")))?;
            let size = parse_number(fields[3]).map_err(|m| err(format!("size: {m}")))?;
            let runtime_offset =
                parse_number(fields[4]).map_err(|m| err(format!("runtime_offset: {m}")))?;
            entries.push(ManifestEntry {
                name: fields[0].to_owned(),
                dtype: fields[1].to_owned(),
                file_offset,
                size,
                runtime_offset,
                shape: None,
            });
        }
        Manifest::from_entries(entries)
    }

    /// Parse `weights_manifest.json`: an object whose `entries` array holds objects
    /// with `name`, `dtype`, `file_offset` (alias `offset`), `size`, and optionally
    /// `runtime_offset` (default: `file_offset`) and `shape`. Numbers may be JSON
    /// integers or strings in `.map` syntax. Other keys (C-Kernel-Engine writes
    /// `config`, `template`, `bump_layout`...) are ignored.
    ///
    /// # Errors
    /// [`WeightsError::ManifestSyntax`] (with the parser's line) or
    /// [`WeightsError::DuplicateTensor`].
    pub fn from_json(text: &str) -> Result<Manifest, WeightsError> {
        let raw: JsonManifest =
            serde_json::from_str(text).map_err(|e| WeightsError::ManifestSyntax {
                kind: ManifestKind::Json,
                line: e.line(),
                message: e.to_string(),
            })?;
        let num = |n: JsonNum, what: &str, name: &str| -> Result<u64, WeightsError> {
            match n {
                JsonNum::Int(x) => Ok(x),
                JsonNum::Text(s) => {
                    parse_number(&s).map_err(|m| json_err(format!("entry \"{name}\" {what}: {m}")))
                }
            }
        };
        let mut entries = Vec::with_capacity(raw.entries.len());
        for e in raw.entries {
            if e.name.is_empty() || e.dtype.is_empty() {
                return Err(json_err(format!(
                    "entry \"{}\": empty name or dtype",
                    e.name
                )));
            }
            let file_offset = num(e.file_offset, "file_offset", &e.name)?;
            let size = num(e.size, "size", &e.name)?;
            let runtime_offset = match e.runtime_offset {
                Some(r) => num(r, "runtime_offset", &e.name)?,
                None => file_offset,
            };
            entries.push(ManifestEntry {
                name: e.name,
                dtype: e.dtype,
                file_offset,
                size,
                runtime_offset,
                shape: e.shape,
            });
        }
        let text = |v: Option<serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => Some(s),
            _ => None,
        };
        let mut m = Manifest::from_entries(entries)?;
        m.format = text(raw.format);
        m.generator = text(raw.generator);
        Ok(m)
    }

    /// Load the sidecars from `dir`. With both present, the `.map` gives order and
    /// runtime offsets, the `.json` gives shapes, and the two must list the same
    /// names with the same dtype (compared as parsed dtypes when both parse, else
    /// as text ignoring ASCII case), file offset and size. With one present, that one.
    ///
    /// # Errors
    /// [`WeightsError::MissingSidecars`] if neither exists; [`WeightsError::Io`];
    /// parse errors; [`WeightsError::SidecarMismatch`].
    pub fn load_sidecars(dir: impl AsRef<Path>) -> Result<Manifest, WeightsError> {
        let dir = dir.as_ref();
        let read = |name: &str| -> Result<Option<String>, WeightsError> {
            use std::io::Read as _;
            let p = dir.join(name);
            // Only regular files: a FIFO would block and a device such as
            // /dev/zero would never end.
            let mut file = match super::file::open_nonblocking(&p) {
                Ok(f) => f,
                Err(WeightsError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            };
            let meta = file
                .metadata()
                .map_err(|e| WeightsError::io(&p, "fstat", e))?;
            if !meta.is_file() {
                return Err(WeightsError::NotARegularFile { path: p });
            }
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map_err(|e| WeightsError::io(&p, "read", e))?;
            Ok(Some(text))
        };
        let map = read(MANIFEST_MAP)?
            .map(|t| Manifest::from_map(&t))
            .transpose()?;
        let json = read(MANIFEST_JSON)?
            .map(|t| Manifest::from_json(&t))
            .transpose()?;
        match (map, json) {
            (None, None) => Err(WeightsError::MissingSidecars {
                dir: dir.to_path_buf(),
            }),
            (Some(m), None) => Ok(m),
            (None, Some(j)) => Ok(j),
            (Some(mut m), Some(j)) => {
                if m.len() != j.len() {
                    return Err(WeightsError::SidecarMismatch {
                        name: "*".into(),
                        reason: format!("map lists {} tensors, json lists {}", m.len(), j.len()),
                    });
                }
                for e in &mut m.entries {
                    let mismatch = |reason: String| WeightsError::SidecarMismatch {
                        name: e.name.clone(),
                        reason,
                    };
                    let Some(je) = j.get(&e.name) else {
                        return Err(mismatch("missing from the json".into()));
                    };
                    let same_dtype = match (e.parsed_dtype(), je.parsed_dtype()) {
                        (Ok(a), Ok(b)) => a == b,
                        _ => e.dtype.eq_ignore_ascii_case(&je.dtype),
                    };
                    if !same_dtype {
                        return Err(mismatch(format!("dtype {} vs {}", e.dtype, je.dtype)));
                    }
                    if e.file_offset != je.file_offset || e.size != je.size {
                        return Err(mismatch(format!(
                            "offset/size {:#x}/{:#x} vs {:#x}/{:#x}",
                            e.file_offset, e.size, je.file_offset, je.size
                        )));
                    }
                    e.shape = je.shape.clone();
                }
                m.format = j.format;
                m.generator = j.generator;
                Ok(m)
            }
        }
    }

    /// The JSON manifest's `format` string (`ck-bumpwgt5-manifest-v1`...), if any.
    pub fn format(&self) -> Option<&str> {
        self.format.as_deref()
    }

    /// The JSON manifest's `generator` string (`ckalloc 0.1.0`...), if any.
    pub fn generator(&self) -> Option<&str> {
        self.generator.as_deref()
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&ManifestEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// Entries in manifest order.
    pub fn iter(&self) -> std::slice::Iter<'_, ManifestEntry> {
        self.entries.iter()
    }

    /// Entries as a slice, in manifest order.
    pub fn entries(&self) -> &[ManifestEntry] {
        &self.entries
    }

    /// Entries sorted by `(file_offset, size)`.
    pub fn sorted_by_offset(&self) -> Vec<&ManifestEntry> {
        let mut v: Vec<&ManifestEntry> = self.entries.iter().collect();
        v.sort_by_key(|e| (e.file_offset, e.size));
        v
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of entry sizes (bytes), saturating.
    pub fn total_bytes(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.size))
    }

    /// Check every entry lies inside a file of `file_len` bytes and no two entries
    /// share a byte (zero-size entries never overlap).
    ///
    /// # Errors
    /// [`WeightsError::EntryOutsideFile`] (region `[0, file_len)`), then
    /// [`WeightsError::OverlappingEntries`] for the lowest-offset pair.
    pub fn validate_against(&self, file_len: u64) -> Result<(), WeightsError> {
        self.validate_region(0, file_len)
    }

    /// As [`validate_against`](Self::validate_against) but every entry must lie in
    /// `[start, end)`, typically `[tensor_data_start, data_end)` of a
    /// [`WeightsFile`](super::WeightsFile) (see
    /// [`WeightsFile::validate_manifest`](super::WeightsFile::validate_manifest)).
    ///
    /// # Errors
    /// As [`validate_against`](Self::validate_against).
    pub fn validate_region(&self, start: u64, end: u64) -> Result<(), WeightsError> {
        for e in &self.entries {
            let inside = e.file_offset >= start && e.end().is_some_and(|x| x <= end);
            if !inside {
                return Err(WeightsError::EntryOutsideFile {
                    name: e.name.clone(),
                    file_offset: e.file_offset,
                    size: e.size,
                    region_start: start,
                    region_end: end,
                });
            }
        }
        if let Some(o) = self.overlaps().into_iter().next() {
            return Err(WeightsError::OverlappingEntries {
                first: o.first,
                second: o.second,
                overlap_start: o.start,
                overlap_end: o.end,
            });
        }
        Ok(())
    }

    /// Check `runtime_offset == file_offset` for every entry, as mixed file-backed
    /// mode requires (the arena maps the file at arena offset = file offset).
    ///
    /// # Errors
    /// [`WeightsError::RuntimeOffsetMismatch`] for the first entry in manifest order.
    pub fn check_runtime_offsets(&self) -> Result<(), WeightsError> {
        match self
            .entries
            .iter()
            .find(|e| e.runtime_offset != e.file_offset)
        {
            Some(e) => Err(WeightsError::RuntimeOffsetMismatch {
                name: e.name.clone(),
                file_offset: e.file_offset,
                runtime_offset: e.runtime_offset,
            }),
            None => Ok(()),
        }
    }

    /// Check every entry's dtype name parses.
    ///
    /// # Errors
    /// [`WeightsError::UnknownDtype`] for the first unknown name.
    pub fn check_dtypes(&self) -> Result<(), WeightsError> {
        self.entries
            .iter()
            .try_for_each(|e| e.parsed_dtype().map(|_| ()))
    }

    /// Check that every entry with a shape stores at least the bytes its shape
    /// and dtype need ([`Dtype::min_bytes`]). Entries without a shape, or whose
    /// dtype is unknown, are not checked here (see [`check_dtypes`](Self::check_dtypes)).
    ///
    /// # Errors
    /// [`WeightsError::ShapeMismatch`] for the first entry (in manifest order)
    /// stored in fewer bytes; [`WeightsError::SizeOverflow`].
    pub fn check_shapes(&self) -> Result<(), WeightsError> {
        for e in &self.entries {
            let (Some(shape), Ok(dtype)) = (&e.shape, e.parsed_dtype()) else {
                continue;
            };
            let needed = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| dtype.min_bytes(n))
                .ok_or_else(|| {
                    WeightsError::overflow(format!("byte size of \"{}\" shape {shape:?}", e.name))
                })?;
            if needed > e.size {
                return Err(WeightsError::ShapeMismatch {
                    name: e.name.clone(),
                    shape: shape.clone(),
                    expected_bytes: needed,
                    actual_bytes: e.size,
                });
            }
        }
        Ok(())
    }

    /// Overlapping pairs (each later entry against the furthest-reaching earlier
    /// one), in offset order. Entries whose end overflows are ignored here.
    fn overlaps(&self) -> Vec<Overlap> {
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
    /// (for a [`WeightsFile`](super::WeightsFile): `[tensor_data_start, data_end)`).
    /// Never fails; use it to print a report, and the `validate_*` methods to reject.
    pub fn layout_report(&self, start: u64, end: u64) -> LayoutReport {
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

    /// The `.map` text: `# ck-bumpwgt{4,5}-manifest-map v1`, a comment naming the
    /// columns, then one line per entry in manifest order with numbers as
    /// `0x%016X`, like C-Kernel-Engine's `build_ir` scripts.
    pub fn to_map_string(&self, version: Version) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# ck-bumpwgt{}-manifest-map v1", version.number());
        s.push_str("# name|dtype|file_offset|size|runtime_offset\n");
        for e in &self.entries {
            let _ = writeln!(
                s,
                "{}|{}|0x{:016X}|0x{:016X}|0x{:016X}",
                e.name, e.dtype, e.file_offset, e.size, e.runtime_offset
            );
        }
        s
    }

    /// The `entries` array of the JSON sidecar.
    pub fn entries_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.entries
                .iter()
                .map(|e| {
                    let mut o = serde_json::Map::new();
                    o.insert("name".into(), e.name.clone().into());
                    o.insert("dtype".into(), e.dtype.clone().into());
                    o.insert("file_offset".into(), e.file_offset.into());
                    o.insert("size".into(), e.size.into());
                    if e.runtime_offset != e.file_offset {
                        o.insert("runtime_offset".into(), e.runtime_offset.into());
                    }
                    if let Some(shape) = &e.shape {
                        o.insert("shape".into(), shape.clone().into());
                    }
                    serde_json::Value::Object(o)
                })
                .collect(),
        )
    }
}

impl<'a> IntoIterator for &'a Manifest {
    type Item = &'a ManifestEntry;
    type IntoIter = std::slice::Iter<'a, ManifestEntry>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0x00000000000000FF"), Ok(255));
        assert_eq!(parse_number("0Xff"), Ok(255));
        assert_eq!(parse_number("0"), Ok(0));
        assert_eq!(parse_number("152"), Ok(152));
        assert!(parse_number("0152").is_err());
        assert!(parse_number("0x").is_err());
        assert!(parse_number("-1").is_err());
        assert!(parse_number("+1").is_err());
        assert!(parse_number("0x1_0").is_err());
        assert!(parse_number("0x10000000000000000").is_err());
    }
}
