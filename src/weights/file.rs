//! [`WeightsFile`]: a read-only view of a whole `weights.bump`.

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::bytes::{buffer, open_regular_file, Memory, Pread, Source};
use super::container::{Container, Version, L1_OFFSETS};
use super::dtype::{Dtype, Producer, SlotDtype};
use super::entry::check_shape;
use super::entry::ManifestEntry;
use super::error::WeightsError;
use super::header::{detect, parse_metadata, Detected};
use super::header::{Header, HeaderDims, MetadataFooter};
use super::manifest::Manifest;
use super::report::LayoutReport;

/// Bytes read and hashed at a time in [`WeightsFile::verify_checksum_with`]
/// (also the progress step).
const HASH_CHUNK: usize = 8 << 20;

/// Identifies an open file (device and inode), so an arena can tell that a
/// manifest was checked against the file it maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FileIdentity {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

enum Contents {
    /// An open regular file, read with `pread` ([`WeightsFile::open`]).
    File(File),
    /// A read-only shared mapping ([`WeightsFile::open_mapped`]).
    Mapped(memmap2::Mmap),
    /// Bytes in memory ([`WeightsFile::from_vec`]).
    Owned(Vec<u8>),
}

/// A parsed `weights.bump` of any of the four layouts, read from an open
/// file with `pread` ([`open`](Self::open)), from a read-only memory map
/// ([`open_mapped`](Self::open_mapped)) or from bytes in memory
/// ([`from_vec`](Self::from_vec)). Construction recognises the layout, reads
/// the header and the dtype table and, for `BUMPWGT5`, checks the footer's
/// SHA-256 of the metadata and the metadata's `template_hash`; the tensor
/// checksum is checked by [`verify_checksum`](Self::verify_checksum), the
/// manifest by [`check_manifest`](Self::check_manifest).
///
/// Every accessor is bounds-checked against the length fixed at open time:
/// nothing reads outside the file. `WeightsFile` is `Send + Sync` (it is
/// never written).
///
/// # What "verified" means
///
/// A `weights.bump` and its sidecars record three checks, and ckalloc
/// verifies each one it finds:
///
/// * **The tensor checksum** ([`verify_checksum`](Self::verify_checksum)):
///   the header's SHA-256 covers the dtype table and the tensor data,
///   [`checksum_range`](Self::checksum_range): `[152, data_end)` in layout
///   L1, `[128, data_end)` in L2, `[128, end of file)` in L3 and L4. It does
///   not cover the header fields, the v5 metadata or any sidecar.
/// * **The metadata hashes** (on construction): the v5 footer's SHA-256 of
///   the metadata, and the metadata's `template_hash` (the SHA-256 of its
///   `template` in canonical form, [`canonical_json`](super::canonical_json)).
/// * **The manifest hash** ([`check_manifest`](Self::check_manifest), rule
///   1): the v5 metadata's `manifest_hash` is the SHA-256 of
///   `weights_manifest.json` in canonical form. It is what binds the
///   manifest, and so every tensor's name, dtype, offset and size, to the
///   file; a `.map` is bound through the JSON it must agree with.
///
/// Nothing binds the manifest of a `BUMPWGT4` or `BUMPWGT3` file (they
/// record no manifest hash), of a v5 file whose metadata records none, or a
/// `.map` without its JSON: two tensors of one size swapped in such a
/// manifest pass every check. [`CheckedManifest::binding`](super::CheckedManifest::binding)
/// says which case holds and [`CheckOptions::require_manifest_hash`](super::CheckOptions::require_manifest_hash)
/// refuses all but the first. These are integrity checks against
/// corruption and mismatched files, not signatures: whoever can write the
/// file can recompute every hash.
///
/// # Files that change
///
/// [`open`](Self::open) reads with `pread`: a file that shrinks while it is
/// read gives [`WeightsError::FileChanged`], and bytes rewritten in place
/// fail the checksum. [`open_mapped`](Self::open_mapped) maps the file:
/// another process truncating it makes a later access raise `SIGBUS`
/// (POSIX `mmap`), which nothing in a library can turn into an error.
pub struct WeightsFile {
    storage: Contents,
    header: Header,
    path: Option<PathBuf>,
    table: Vec<u8>,
    metadata: Option<Vec<u8>>,
    metadata_json: Option<serde_json::Value>,
    identity: Option<FileIdentity>,
}

impl std::fmt::Debug for WeightsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let storage = match self.storage {
            Contents::File(_) => "pread",
            Contents::Mapped(_) => "mapped",
            Contents::Owned(_) => "memory",
        };
        f.debug_struct("WeightsFile")
            .field("path", &self.path)
            .field("storage", &storage)
            .field("header", &self.header)
            .finish()
    }
}

/// Open `path` read-only as a regular file of a length that fits `usize`;
/// returns the file, its length and its identity.
fn open_regular(path: &Path) -> Result<(File, u64, FileIdentity), WeightsError> {
    let (file, meta) = open_regular_file(path)?;
    if usize::try_from(meta.len()).is_err() {
        return Err(WeightsError::overflow(format!(
            "reading {} ({} bytes)",
            path.display(),
            meta.len()
        )));
    }
    let identity = FileIdentity {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    Ok((file, meta.len(), identity))
}

impl WeightsFile {
    fn build(
        storage: Contents,
        detected: Detected,
        path: Option<PathBuf>,
        identity: Option<FileIdentity>,
    ) -> Result<WeightsFile, WeightsError> {
        let metadata_json = detected
            .metadata
            .as_deref()
            .map(parse_metadata)
            .transpose()?;
        Ok(WeightsFile {
            storage,
            header: detected.header,
            path,
            table: detected.table,
            metadata: detected.metadata,
            metadata_json,
            identity,
        })
    }

    /// Open `path` read-only and parse its header, reading with `pread`
    /// (nothing is mapped; the header, the dtype table and the v5 metadata
    /// are kept in memory, tensor bytes are read when asked for).
    ///
    /// The file is checked through the open descriptor (`fstat` on the fd,
    /// not the path), so swapping the path afterwards changes nothing read.
    /// Its length is fixed here: a later read past a shrunken end is
    /// [`WeightsError::FileChanged`], never `SIGBUS`.
    ///
    /// # Errors
    /// [`WeightsError::Io`] (open/fstat/pread, naming the path),
    /// [`WeightsError::NotARegularFile`], [`WeightsError::FileChanged`], the
    /// errors of [`Header::parse`] and the metadata errors
    /// ([`WeightsError::Json`], [`WeightsError::BadMetadata`],
    /// [`WeightsError::TemplateHashMismatch`]).
    pub fn open(path: impl AsRef<Path>) -> Result<WeightsFile, WeightsError> {
        let path = path.as_ref();
        let (file, len, identity) = open_regular(path)?;
        let detected = detect(&Pread {
            file: &file,
            path,
            len,
        })?;
        WeightsFile::build(
            Contents::File(file),
            detected,
            Some(path.to_path_buf()),
            Some(identity),
        )
    }

    /// As [`open`](Self::open), but map the file read-only: tensors are
    /// lent from the mapping without a copy. If another process truncates
    /// the file while it is mapped, touching a page past the new end raises
    /// `SIGBUS` (POSIX `mmap`); use [`open`](Self::open) when the file may
    /// change.
    ///
    /// # Errors
    /// As [`open`](Self::open), and [`WeightsError::Io`] for `mmap`.
    pub fn open_mapped(path: impl AsRef<Path>) -> Result<WeightsFile, WeightsError> {
        let path = path.as_ref();
        let (file, len, identity) = open_regular(path)?;
        if len == 0 {
            // mmap of length 0 fails with EINVAL (POSIX); an empty file is simply truncated.
            return Err(WeightsError::TruncatedHeader {
                len: 0,
                needed: L1_OFFSETS.dtype_table(),
            });
        }
        // SAFETY: the map is read-only and private to this object; no mutable
        // reference into it is ever made. memmap2 maps exactly the length
        // fstat reported (checked to fit usize). The remaining hazard is
        // another process truncating or rewriting the file while it is
        // mapped (SIGBUS or changing bytes), documented on `open_mapped`.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(&file) }
            .map_err(|e| WeightsError::io(path, "mmap", e))?;
        let detected = detect(&Memory(&map))?;
        WeightsFile::build(
            Contents::Mapped(map),
            detected,
            Some(path.to_path_buf()),
            Some(identity),
        )
    }

    /// Parse bytes already in memory (taking ownership; no copy).
    ///
    /// # Errors
    /// As [`Header::parse`], and the metadata errors of [`open`](Self::open).
    pub fn from_vec(bytes: Vec<u8>) -> Result<WeightsFile, WeightsError> {
        let detected = detect(&Memory(&bytes))?;
        WeightsFile::build(Contents::Owned(bytes), detected, None, None)
    }

    /// Parse a copy of `bytes`.
    ///
    /// # Errors
    /// As [`from_vec`](Self::from_vec).
    pub fn from_bytes(bytes: &[u8]) -> Result<WeightsFile, WeightsError> {
        WeightsFile::from_vec(bytes.to_vec())
    }

    /// The path given to [`open`](Self::open) (`None` for in-memory files).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// True when backed by a memory map ([`open_mapped`](Self::open_mapped)).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Contents::Mapped(_))
    }

    /// The whole file, when it is mapped or in memory; `None` for a file
    /// read with `pread` ([`open`](Self::open)).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.storage {
            Contents::File(_) => None,
            Contents::Mapped(m) => Some(m),
            Contents::Owned(v) => Some(v),
        }
    }

    pub(crate) fn identity(&self) -> Option<FileIdentity> {
        self.identity
    }

    /// The byte source behind the file.
    fn source(&self) -> SourceRef<'_> {
        match &self.storage {
            Contents::File(file) => SourceRef::Pread(Pread {
                file,
                path: self.path.as_deref().unwrap_or(Path::new("weights.bump")),
                len: self.header.file_len,
            }),
            Contents::Mapped(m) => SourceRef::Memory(m),
            Contents::Owned(v) => SourceRef::Memory(v),
        }
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// File length (bytes).
    pub fn len(&self) -> u64 {
        self.header.file_len
    }

    /// Always false: a valid file has at least a 132-byte header.
    pub fn is_empty(&self) -> bool {
        self.header.file_len == 0
    }

    /// Container version (the magic's digit).
    pub fn version(&self) -> Version {
        self.header.version
    }

    /// The layout recognised: which converter family writes files like this one.
    pub fn container(&self) -> Container {
        self.header.container
    }

    /// Model fields of the header; those the layout lacks are `None`.
    pub fn dims(&self) -> &HeaderDims {
        &self.header.dims
    }

    /// SHA-256 stored in the header (at `container().offsets().checksum`).
    pub fn checksum(&self) -> &[u8; 32] {
        &self.header.checksum
    }

    /// The bytes the checksum covers, `[start, end)` (see [`Header::checksum_range`]).
    pub fn checksum_range(&self) -> (u64, u64) {
        self.header.checksum_range()
    }

    /// The dtype table bytes (one code per slot, after the u32 count at
    /// `container().offsets().dtype_count`).
    pub fn dtype_table(&self) -> &[u8] {
        &self.table
    }

    /// The dtype table decoded with `include/ckernel_dtype.h`'s codes (code 6 is
    /// Q4_1 there); `None` for codes no one assigned. Converters disagree on some
    /// codes: [`slot_dtypes`](Self::slot_dtypes) takes the producer into account.
    pub fn dtypes(&self) -> impl Iterator<Item = Option<Dtype>> + '_ {
        self.dtype_table().iter().map(|&c| Dtype::from_code(c))
    }

    /// Who wrote the file, as far as the v5 metadata's `created_by` and the
    /// manifest's `format` / `generator` say (see [`Producer`]).
    pub fn producer(&self, manifest: Option<&Manifest>) -> Producer {
        Producer::from_info(
            self.created_by(),
            manifest.and_then(Manifest::format),
            manifest.and_then(Manifest::generator),
        )
    }

    /// The v5 metadata's `created_by`, if any.
    pub fn created_by(&self) -> Option<&str> {
        self.metadata_json()?.get("created_by")?.as_str()
    }

    /// The dtype table decoded for its producer: code 6 is Q4_K from the HF
    /// converters, Q4_1 from converters and writers that follow
    /// `include/ckernel_dtype.h`, and [`SlotDtype::Q4_1OrQ4_K`] when nothing says
    /// which. Use the manifest's dtype names where there is a manifest: they win.
    pub fn slot_dtypes(&self, manifest: Option<&Manifest>) -> Vec<SlotDtype> {
        let p = self.producer(manifest);
        self.dtype_table()
            .iter()
            .map(|&c| p.slot_dtype(c))
            .collect()
    }

    /// First byte after the dtype table (`dtype table offset + table length`).
    pub fn tensor_data_start(&self) -> u64 {
        self.header.tensor_data_start
    }

    /// End of tensor data, exclusive (bytes): the metadata offset of a v5 file,
    /// else the end of the file.
    pub fn data_end(&self) -> u64 {
        self.header.data_end
    }

    /// The v5 footer, if any.
    pub fn footer(&self) -> Option<&MetadataFooter> {
        self.header.footer.as_ref()
    }

    /// The v5 metadata JSON bytes (checked against the footer's SHA-256), or
    /// `None` for v3 and v4.
    pub fn metadata_bytes(&self) -> Option<&[u8]> {
        self.metadata.as_deref()
    }

    /// The v5 metadata parsed as JSON (an object, its `template_hash`
    /// checked), or `None` for v3 and v4.
    pub fn metadata_json(&self) -> Option<&serde_json::Value> {
        self.metadata_json.as_ref()
    }

    /// Fill `buf` with the file's bytes from `offset`.
    ///
    /// # Errors
    /// [`WeightsError::EntryOutsideFile`] (named `"<range>"`) when the range
    /// is not inside the length fixed at open; [`WeightsError::FileChanged`]
    /// when the file has shrunk since; [`WeightsError::Io`].
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), WeightsError> {
        let len = buf.len() as u64;
        self.check_range("<range>", offset, len, 0, self.header.file_len)?;
        match self.source() {
            SourceRef::Pread(p) => p.read_into(offset, buf),
            // Inside the file: checked above.
            SourceRef::Memory(m) => {
                buf.copy_from_slice(&m[offset as usize..(offset + len) as usize]);
                Ok(())
            }
        }
    }

    /// Bytes `[offset, offset + size)` of the file: lent from memory, or
    /// read into a new buffer for a file opened with [`open`](Self::open).
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    pub fn range(&self, offset: u64, size: u64) -> Result<Cow<'_, [u8]>, WeightsError> {
        self.read_region("<range>", offset, size, 0, self.header.file_len)
    }

    fn check_range(
        &self,
        name: &str,
        offset: u64,
        size: u64,
        lo: u64,
        hi: u64,
    ) -> Result<(), WeightsError> {
        let inside = offset >= lo && offset.checked_add(size).is_some_and(|end| end <= hi);
        if !inside {
            return Err(WeightsError::EntryOutsideFile {
                name: name.to_owned(),
                file_offset: offset,
                size,
                region_start: lo,
                region_end: hi,
            });
        }
        Ok(())
    }

    fn read_region(
        &self,
        name: &str,
        offset: u64,
        size: u64,
        lo: u64,
        hi: u64,
    ) -> Result<Cow<'_, [u8]>, WeightsError> {
        self.check_range(name, offset, size, lo, hi)?;
        match self.source() {
            SourceRef::Pread(p) => Ok(Cow::Owned(p.read(offset, size)?.into_owned())),
            // lo..hi lies within the file, whose length fits usize.
            SourceRef::Memory(m) => {
                Ok(Cow::Borrowed(&m[offset as usize..(offset + size) as usize]))
            }
        }
    }

    /// A tensor's bytes: lent from memory, or read into a new buffer for a
    /// file opened with [`open`](Self::open). The entry must lie inside the
    /// tensor data `[tensor_data_start, data_end)` and, when it has a shape,
    /// hold at least the bytes its shape and dtype need.
    ///
    /// # Errors
    /// [`WeightsError::EntryOutsideFile`] naming the tensor,
    /// [`WeightsError::ShapeMismatch`], and the read errors of
    /// [`read_at`](Self::read_at).
    pub fn tensor(&self, entry: &ManifestEntry) -> Result<Cow<'_, [u8]>, WeightsError> {
        check_shape(entry)?;
        self.read_region(
            &entry.name,
            entry.file_offset,
            entry.size,
            self.header.tensor_data_start,
            self.header.data_end,
        )
    }

    /// SHA-256 of the layout's checksum range ([`checksum_range`](Self::checksum_range)).
    ///
    /// # Errors
    /// The read errors of [`read_at`](Self::read_at).
    pub fn compute_checksum(&self) -> Result<[u8; 32], WeightsError> {
        self.compute_checksum_with(|_, _| {})
    }

    fn compute_checksum_with(
        &self,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<[u8; 32], WeightsError> {
        let (start, end) = self.checksum_range();
        let total = end - start;
        let mut h = Sha256::new();
        progress(0, total);
        match self.source() {
            SourceRef::Memory(m) => {
                // start <= tensor_data_start <= data_end <= file length, checked on parse.
                let mut done = 0u64;
                for chunk in m[start as usize..end as usize].chunks(HASH_CHUNK) {
                    h.update(chunk);
                    done += chunk.len() as u64;
                    progress(done, total);
                }
            }
            SourceRef::Pread(p) => {
                let mut buf = buffer(total.min(HASH_CHUNK as u64), p.path)?;
                let mut offset = start;
                while offset < end {
                    let n = (end - offset).min(HASH_CHUNK as u64) as usize;
                    p.read_into(offset, &mut buf[..n])?;
                    h.update(&buf[..n]);
                    offset += n as u64;
                    progress(offset - start, total);
                }
                p.check_len()?;
            }
        }
        Ok(h.finalize().into())
    }

    /// Hash the layout's checksum range and compare with the header.
    ///
    /// # Errors
    /// [`WeightsError::BadChecksum`] naming the layout and the range, with
    /// both digests; the read errors of [`read_at`](Self::read_at) (for a
    /// file read with `pread`, also [`WeightsError::FileChanged`] when its
    /// length changed during the pass).
    pub fn verify_checksum(&self) -> Result<(), WeightsError> {
        self.verify_checksum_with(|_, _| {})
    }

    /// As [`verify_checksum`](Self::verify_checksum), calling
    /// `progress(done_bytes, total_bytes)` before, during (every 8 MiB) and
    /// after hashing, on the calling thread.
    ///
    /// # Errors
    /// As [`verify_checksum`](Self::verify_checksum).
    pub fn verify_checksum_with(&self, progress: impl FnMut(u64, u64)) -> Result<(), WeightsError> {
        let actual = self.compute_checksum_with(progress)?;
        if actual != self.header.checksum {
            return Err(WeightsError::BadChecksum {
                container: self.header.container,
                range: self.checksum_range(),
                expected: self.header.checksum,
                actual,
            });
        }
        Ok(())
    }

    /// Gaps, overlaps and stray entries of `manifest` over the tensor data
    /// `[tensor_data_start, data_end)`: a report to print, never a check
    /// ([`check_manifest`](Self::check_manifest) is the check).
    pub fn layout_report(&self, manifest: &Manifest) -> LayoutReport {
        manifest.layout_report(self.header.tensor_data_start, self.header.data_end)
    }

    /// Load the sidecar manifest from `dir` for this file
    /// ([`Manifest::load_sidecars`]): offsets come from `weights_manifest.map` or
    /// from `entries[].file_offset` of `weights_manifest.json`, the way
    /// C-Kernel-Engine's loader takes them. The JSON `version` is not compared
    /// with the magic (converters write 5 for `BUMPWGT4` files). Parsing
    /// only: [`check_manifest`](Self::check_manifest) checks it against the file.
    ///
    /// # Errors
    /// [`WeightsError::ManifestRequired`] naming the layout and magic when `dir`
    /// has neither sidecar (always the case for L4, `BUMPWGT3`); otherwise the
    /// errors of [`Manifest::load_sidecars`].
    pub fn load_manifest(&self, dir: impl AsRef<Path>) -> Result<Manifest, WeightsError> {
        match Manifest::load_sidecars(dir) {
            Err(WeightsError::MissingSidecars { dir }) => Err(WeightsError::ManifestRequired {
                container: self.header.container,
                magic: self.header.version.magic(),
                dir,
            }),
            r => r,
        }
    }
}

/// Where [`WeightsFile`] reads from.
enum SourceRef<'a> {
    Pread(Pread<'a>),
    Memory(&'a [u8]),
}
