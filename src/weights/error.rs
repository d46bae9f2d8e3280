//! [`WeightsError`]: every way reading or writing a `weights.bump` can fail.

use super::binding::ManifestBinding;
use super::container::{Container, LayoutRejection};
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Which sidecar text a [`WeightsError::ManifestSyntax`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManifestKind {
    /// `weights_manifest.map` (`name|dtype|0xFILE_OFFSET|0xSIZE|0xRUNTIME_OFFSET`).
    Map,
    /// `weights_manifest.json` (`{"entries": [...]}`).
    Json,
    /// Entries built in memory ([`Manifest::from_entries`](super::Manifest::from_entries)).
    Entries,
}

impl fmt::Display for ManifestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ManifestKind::Map => "weights_manifest.map",
            ManifestKind::Json => "weights_manifest.json",
            ManifestKind::Entries => "manifest entries",
        })
    }
}

/// An error from the `weights.bump` reader, the manifest parsers, the
/// manifest check or the writer.
///
/// Every variant names the offending input (path, tensor name, offset, value).
/// Offsets and sizes are in bytes. `Display` is one line with every control
/// or formatting character of names, paths and quoted input escaped
/// ([`Escaped`](crate::Escaped)); the fields hold the raw text.
#[derive(Debug)]
#[non_exhaustive]
pub enum WeightsError {
    /// An I/O operation on `path` failed.
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What was being done (`"open"`, `"fstat"`, `"mmap"`, `"read"`, `"write"`, `"rename"`...).
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// The weights path is not a regular file (a directory, a FIFO, a device...).
    NotARegularFile {
        /// The path given.
        path: PathBuf,
    },
    /// The file is shorter than its layout's header plus the dtype-table count
    /// (156 bytes for L1, 132 for L2-L4; 156 when the layout is not yet known).
    TruncatedHeader {
        /// File length in bytes.
        len: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The first 8 bytes do not start with `BUMPWGT`.
    WrongMagic {
        /// The 8 bytes found at offset 0.
        found: [u8; 8],
    },
    /// The magic is `BUMPWGT?` but the version is not one this reader knows
    /// (or the version field at offset 8 disagrees with the magic).
    UnknownVersion {
        /// The 8 bytes found at offset 0.
        magic: [u8; 8],
        /// The u32 found at offset 8.
        version: u32,
    },
    /// The dtype table (count at the layout's offset) runs past the end of the file.
    DtypeTableOutOfBounds {
        /// The table length read from the file (entries = bytes).
        table_len: u32,
        /// Offset of the first table byte.
        table_offset: u64,
        /// File length in bytes.
        file_len: u64,
    },
    /// A version-5 file's 48-byte metadata footer is missing or inconsistent.
    BadFooter {
        /// What is wrong.
        reason: String,
    },
    /// The SHA-256 in the v5 footer does not match the metadata bytes.
    BadMetadataChecksum {
        /// SHA-256 stored in the footer.
        expected: [u8; 32],
        /// SHA-256 of the metadata bytes.
        actual: [u8; 32],
    },
    /// The bytes of a recognised layout changed: its header's SHA-256 does not
    /// match its checksum range.
    BadChecksum {
        /// The layout the file was read as.
        container: Container,
        /// The bytes hashed, `[start, end)`.
        range: (u64, u64),
        /// SHA-256 stored in the header (at `container.offsets().checksum`).
        expected: [u8; 32],
        /// SHA-256 computed over the file.
        actual: [u8; 32],
    },
    /// The magic is `BUMPWGT3`, `BUMPWGT4` or `BUMPWGT5` but no layout's rules
    /// fit the bytes (distinct from [`BadChecksum`](Self::BadChecksum), a known
    /// layout whose bytes changed).
    NotAKnownLayout {
        /// The 8 bytes found at offset 0.
        magic: [u8; 8],
        /// Every layout tried, with the rule the file breaks.
        tried: Vec<LayoutRejection>,
    },
    /// Loading needs tensor offsets from a sidecar manifest and there is none.
    /// C-Kernel-Engine's loader takes every offset from `weights_manifest.map`;
    /// L4 (`BUMPWGT3`) converters write no manifest at all.
    ManifestRequired {
        /// The layout of the weights file.
        container: Container,
        /// Its magic.
        magic: [u8; 8],
        /// The directory searched for `weights_manifest.map` / `weights_manifest.json`.
        dir: PathBuf,
    },
    /// ckalloc writes L1 files only (`BUMPWGT4`, `BUMPWGT5`).
    UnsupportedWriteVersion {
        /// The version asked for.
        version: u32,
    },
    /// A manifest could not be parsed.
    ManifestSyntax {
        /// Which format.
        kind: ManifestKind,
        /// 1-based line number (0 when unknown).
        line: usize,
        /// What is wrong, quoting the offending text.
        message: String,
    },
    /// Two manifest entries (or two writer tensors) share a name.
    DuplicateTensor {
        /// The repeated name.
        name: String,
    },
    /// A manifest entry's bytes `[file_offset, file_offset + size)` are not inside
    /// the allowed range (the whole file, or the tensor-data region).
    EntryOutsideFile {
        /// Tensor name.
        name: String,
        /// Entry start (bytes).
        file_offset: u64,
        /// Entry size (bytes).
        size: u64,
        /// Start of the allowed range (bytes).
        region_start: u64,
        /// End of the allowed range (bytes, exclusive).
        region_end: u64,
    },
    /// Two manifest entries share bytes.
    OverlappingEntries {
        /// The entry with the lower offset.
        first: String,
        /// The entry that starts before `first` ends.
        second: String,
        /// First byte shared.
        overlap_start: u64,
        /// End of the shared range (exclusive).
        overlap_end: u64,
    },
    /// An entry's runtime offset differs from its file offset. ckalloc's
    /// arena holds every tensor at its file offset (mixed mode maps the
    /// file in place, anon mode copies it verbatim), so a program reading the
    /// tensor at its runtime offset would read other bytes.
    RuntimeOffsetMismatch {
        /// Tensor name.
        name: String,
        /// Offset in the file.
        file_offset: u64,
        /// Offset in the runtime buffer.
        runtime_offset: u64,
    },
    /// A dtype name is not one [`Dtype::from_name`](super::Dtype::from_name) knows.
    UnknownDtype {
        /// The name as given.
        name: String,
    },
    /// The dtype table disagrees with the manifest where it must agree (see
    /// [`WeightsFile::check_manifest`](super::WeightsFile::check_manifest), rule 9).
    DtypeTableMismatch {
        /// What is wrong.
        reason: String,
    },
    /// The header's model fields disagree with what the file records
    /// elsewhere (see
    /// [`WeightsFile::check_manifest`](super::WeightsFile::check_manifest), rule 10).
    HeaderDimsMismatch {
        /// Every field that disagrees, with both values.
        reason: String,
    },
    /// The two sidecars describe different tensors.
    SidecarMismatch {
        /// Tensor name (or `"*"` for a count mismatch).
        name: String,
        /// What differs.
        reason: String,
    },
    /// A sidecar (or another file read with
    /// [`read_text_file`](super::read_text_file)) is larger than allowed
    /// ([`MAX_SIDECAR_BYTES`](super::MAX_SIDECAR_BYTES) for sidecars).
    SidecarTooLarge {
        /// The sidecar.
        path: PathBuf,
        /// Its length (bytes).
        len: u64,
        /// The most read (bytes).
        max: u64,
    },
    /// Neither `weights_manifest.map` nor `weights_manifest.json` exists in `dir`.
    MissingSidecars {
        /// The directory searched.
        dir: PathBuf,
    },
    /// The writer's alignment is not a power of two in `1..=1 GiB`.
    InvalidAlignment {
        /// The value given (bytes).
        alignment: u64,
    },
    /// A tensor name cannot be written to the `.map` sidecar.
    InvalidTensorName {
        /// The name (possibly truncated for display).
        name: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A tensor's byte length does not match its shape and dtype.
    ShapeMismatch {
        /// Tensor name.
        name: String,
        /// The shape given.
        shape: Vec<u64>,
        /// Bytes the shape implies.
        expected_bytes: u64,
        /// Bytes given.
        actual_bytes: u64,
    },
    /// A size or offset computation overflowed `u64` (or `usize` on this target).
    SizeOverflow {
        /// What was being computed.
        what: String,
    },
    /// A `config.json` field is not a non-negative integer that fits the header.
    ConfigField {
        /// The JSON key.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The file read with `pread` is no longer the length it had when it
    /// was opened: it shrank under a read (or changed size during a check).
    FileChanged {
        /// The file.
        path: PathBuf,
        /// Its length when opened (bytes).
        opened_len: u64,
        /// Its length now, when `fstat` could tell (bytes).
        now_len: Option<u64>,
        /// The offset being read (bytes).
        offset: u64,
    },
    /// The v5 metadata is not what C-Kernel-Engine's writers put there: not
    /// a JSON object, or a recorded hash that is not 64 lowercase hex digits.
    BadMetadata {
        /// What is wrong.
        reason: String,
    },
    /// The v5 metadata's `template_hash` is not the SHA-256 of its
    /// `template` in canonical form.
    TemplateHashMismatch {
        /// The hex digest the metadata records.
        recorded: String,
        /// SHA-256 of the canonical `template`.
        computed: [u8; 32],
    },
    /// The v5 metadata's `manifest_hash` is not the SHA-256 of the JSON
    /// sidecar in canonical form: the sidecar is not the one written with
    /// this file (or was edited).
    ManifestHashMismatch {
        /// The JSON sidecar (`weights_manifest.json` when read from text).
        sidecar: PathBuf,
        /// The hex digest the metadata records.
        recorded: String,
        /// SHA-256 of the sidecar in canonical form.
        computed: [u8; 32],
    },
    /// [`CheckOptions::require_manifest_hash`](super::CheckOptions::require_manifest_hash)
    /// (or, for a hash that could not be checked,
    /// [`CheckOptions::strict`](super::CheckOptions::strict)) and the
    /// manifest is not bound to the file by a verified `manifest_hash`.
    ManifestNotBound {
        /// What binds the manifest instead.
        binding: ManifestBinding,
    },
    /// The manifest lists no tensor, but the tensor data region holds more
    /// bytes than the padding the file allows.
    EmptyManifest {
        /// The tensor data region, `[start, end)`.
        region: (u64, u64),
        /// Padding allowed (bytes).
        allowed: u64,
    },
    /// [`CheckOptions::strict`](super::CheckOptions::strict): bytes no entry
    /// covers, more than the padding the file allows.
    WideGap {
        /// The uncovered range, `[start, end)`.
        range: (u64, u64),
        /// The entry before it (`None` at the start of the region).
        after: Option<String>,
        /// Padding allowed (bytes): the alignment the manifest or metadata
        /// records, else C-Kernel-Engine's 64.
        allowed: u64,
    },
    /// Metadata or config JSON is malformed.
    Json {
        /// What was being parsed.
        what: &'static str,
        /// The parser's error.
        source: serde_json::Error,
    },
}

/// A shape as `[d0, d1, ...]`, at most 16 dimensions then `... (N dims)`.
pub(crate) fn shape_text(shape: &[u64]) -> String {
    const SHOWN: usize = 16;
    let dims: Vec<String> = shape.iter().take(SHOWN).map(u64::to_string).collect();
    if shape.len() > SHOWN {
        format!("[{}, ... ({} dims)]", dims.join(", "), shape.len())
    } else {
        format!("[{}]", dims.join(", "))
    }
}

/// A SHA-256 digest as 64 lowercase hex digits (sha2's own `{:x}`).
pub(crate) fn hex32(b: &[u8; 32]) -> String {
    format!("{:x}", sha2::digest::Output::<sha2::Sha256>::from(*b))
}

fn show_magic(m: &[u8; 8]) -> String {
    m.iter()
        .map(|&c| {
            if c.is_ascii_graphic() {
                (c as char).to_string()
            } else {
                format!("\\x{c:02x}")
            }
        })
        .collect()
}

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", crate::Escaped::new(&Raw(self).to_string()))
    }
}

/// The message before escaping.
struct Raw<'a>(&'a WeightsError);

impl fmt::Display for Raw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use WeightsError::*;
        match self.0 {
            Io { path, op, source } => write!(f, "{op} {}: {source}", path.display()),
            NotARegularFile { path } => write!(f, "{}: not a regular file", path.display()),
            TruncatedHeader { len, needed } => write!(
                f,
                "truncated weights header: file is {len} bytes, need at least {needed}"
            ),
            WrongMagic { found } => write!(
                f,
                "not a weights.bump file: magic is \"{}\", expected \"BUMPWGT3\", \"BUMPWGT4\" or \"BUMPWGT5\"",
                show_magic(found)
            ),
            UnknownVersion { magic, version } => write!(
                f,
                "unsupported weights.bump version: magic \"{}\" with version field {version} (supported: BUMPWGT3/3, BUMPWGT4/4, BUMPWGT5/5)",
                show_magic(magic)
            ),
            DtypeTableOutOfBounds { table_len, table_offset, file_len } => write!(
                f,
                "dtype table of {table_len} entries at offset {table_offset} runs past the end of the {file_len}-byte file"
            ),
            BadFooter { reason } => write!(f, "bad BUMPWGT5 metadata footer: {reason}"),
            BadMetadataChecksum { expected, actual } => write!(
                f,
                "BUMPWGT5 metadata checksum mismatch: footer says {}, metadata hashes to {}",
                hex32(expected),
                hex32(actual)
            ),
            BadChecksum { container, range, expected, actual } => write!(
                f,
                "weights checksum mismatch ({} layout, checksum at {}): header says {}, bytes [{}, {}) hash to {}",
                container.label(),
                container.offsets().checksum,
                hex32(expected),
                range.0,
                range.1,
                hex32(actual)
            ),
            NotAKnownLayout { magic, tried } => {
                write!(f, "not a known weights.bump layout (magic \"{}\"): ", show_magic(magic))?;
                for (i, t) in tried.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{t}")?;
                }
                Ok(())
            }
            ManifestRequired { container, magic, dir } => write!(
                f,
                "{}: no weights_manifest.map or weights_manifest.json beside the {} file ({} layout); loading takes every tensor offset from one{}",
                dir.display(),
                show_magic(magic),
                container.label(),
                if *container == Container::BareHfConverter {
                    " (the converters of this layout write none, and C-Kernel-Engine's loader refuses BUMPWGT3)"
                } else {
                    ""
                }
            ),
            UnsupportedWriteVersion { version } => write!(
                f,
                "cannot write version {version}: ckalloc writes BUMPWGT4 and BUMPWGT5 (layout L1)"
            ),
            ManifestSyntax { kind, line, message } => {
                if *line > 0 {
                    write!(f, "{kind} line {line}: {message}")
                } else {
                    write!(f, "{kind}: {message}")
                }
            }
            DuplicateTensor { name } => write!(f, "duplicate tensor name \"{name}\""),
            EntryOutsideFile { name, file_offset, size, region_start, region_end } => write!(
                f,
                "tensor \"{name}\" at offset {file_offset} with size {size} bytes lies outside [{region_start}, {region_end})"
            ),
            OverlappingEntries { first, second, overlap_start, overlap_end } => write!(
                f,
                "tensors \"{first}\" and \"{second}\" overlap in bytes [{overlap_start}, {overlap_end})"
            ),
            RuntimeOffsetMismatch { name, file_offset, runtime_offset } => write!(
                f,
                "tensor \"{name}\": runtime offset {runtime_offset:#x} differs from file offset {file_offset:#x} (ckalloc's arena holds every tensor at its file offset)"
            ),
            UnknownDtype { name } => write!(f, "unknown dtype \"{name}\""),
            DtypeTableMismatch { reason } => write!(f, "dtype table disagrees with manifest: {reason}"),
            HeaderDimsMismatch { reason } => write!(f, "header model fields disagree: {reason}"),
            SidecarMismatch { name, reason } => write!(
                f,
                "weights_manifest.map and weights_manifest.json disagree on \"{name}\": {reason}"
            ),
            SidecarTooLarge { path, len, max } => write!(
                f,
                "{}: {len} bytes, more than the {max} bytes allowed",
                path.display()
            ),
            MissingSidecars { dir } => write!(
                f,
                "{}: neither weights_manifest.map nor weights_manifest.json found",
                dir.display()
            ),
            InvalidAlignment { alignment } => write!(
                f,
                "invalid alignment {alignment}: must be a power of two between 1 and 1 GiB"
            ),
            InvalidTensorName { name, reason } => write!(f, "invalid tensor name \"{name}\": {reason}"),
            ShapeMismatch { name, shape, expected_bytes, actual_bytes } => write!(
                f,
                "tensor \"{name}\": shape {} needs {expected_bytes} bytes, got {actual_bytes}",
                shape_text(shape)
            ),
            SizeOverflow { what } => write!(f, "size overflow computing {what}"),
            ConfigField { field, message } => write!(f, "config.json field \"{field}\": {message}"),
            Json { what, source } => write!(
                f,
                "invalid {what} JSON: {}",
                crate::Escaped::capped(&source.to_string(), 200)
            ),
            FileChanged { path, opened_len, now_len, offset } => write!(
                f,
                "{}: the file changed while being read: {opened_len} bytes when opened, {} now (reading at offset {offset})",
                path.display(),
                now_len.map_or("unknown".to_string(), |n| format!("{n} bytes"))
            ),
            BadMetadata { reason } => write!(f, "bad BUMPWGT5 metadata: {reason}"),
            TemplateHashMismatch { recorded, computed } => write!(
                f,
                "BUMPWGT5 metadata template_hash mismatch: recorded {recorded}, the template hashes to {}",
                hex32(computed)
            ),
            ManifestHashMismatch { sidecar, recorded, computed } => write!(
                f,
                "{}: manifest_hash mismatch: the BUMPWGT5 metadata records {recorded}, the sidecar hashes to {} (it is not the manifest written with this file, or it holds JSON that ckalloc reads differently from Python: see canonical_json)",
                sidecar.display(),
                hex32(computed)
            ),
            ManifestNotBound { binding } => write!(
                f,
                "the manifest is not bound to the file by a verified manifest_hash: {binding}"
            ),
            EmptyManifest { region, allowed } => write!(
                f,
                "the manifest lists no tensor, but the tensor data [{}, {}) holds {} bytes (at most {allowed} bytes of padding allowed)",
                region.0,
                region.1,
                region.1 - region.0
            ),
            WideGap { range, after, allowed } => write!(
                f,
                "{} bytes [{}, {}) {} are covered by no tensor (more than the {allowed}-byte alignment)",
                range.1 - range.0,
                range.0,
                range.1,
                match after {
                    Some(a) => format!("after \"{a}\""),
                    None => "at the start of the tensor data".to_string(),
                }
            ),
        }
    }
}

impl std::error::Error for WeightsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WeightsError::Io { source, .. } => Some(source),
            WeightsError::Json { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl WeightsError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        WeightsError::Io {
            path: path.into(),
            op,
            source,
        }
    }

    pub(crate) fn overflow(what: impl Into<String>) -> Self {
        WeightsError::SizeOverflow { what: what.into() }
    }
}
