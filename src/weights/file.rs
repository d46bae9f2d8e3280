//! [`WeightsFile`]: a read-only view of a whole `weights.bump`.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::format::DTYPE_TABLE_OFFSET;
use super::{
    Container, Dtype, Header, HeaderDims, Manifest, ManifestEntry, MetadataFooter, Producer,
    SlotDtype, Version, WeightsError,
};

/// Bytes hashed between two progress reports in [`WeightsFile::verify_checksum_with`].
const HASH_CHUNK: usize = 8 << 20;

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A parsed `weights.bump` of any of the four layouts: either a read-only memory
/// map of a file or bytes in memory. The layout is recognised and the header
/// (and, for v5, the footer and metadata hash) checked on construction; the
/// tensor checksum is checked by [`verify_checksum`](Self::verify_checksum).
///
/// Every accessor is bounds-checked against the length fixed at open time: nothing
/// reads outside the file. `WeightsFile` is `Send + Sync` (it is never written).
///
/// **Mapped files:** if another process truncates the file while it is mapped,
/// touching a page past the new end raises `SIGBUS` (POSIX `mmap`); nothing here can
/// prevent that. Load into memory ([`from_vec`](Self::from_vec)) or use the arena's
/// anon mode when the file may change.
pub struct WeightsFile {
    storage: Storage,
    header: Header,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for WeightsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightsFile")
            .field("path", &self.path)
            .field("mapped", &matches!(self.storage, Storage::Mapped(_)))
            .field("header", &self.header)
            .finish()
    }
}

impl WeightsFile {
    /// Open and map `path` read-only, and parse its header.
    ///
    /// The file is checked through the open descriptor (`fstat` on the fd, not the
    /// path), so swapping the path afterwards cannot change what is mapped. The map
    /// covers exactly the length `fstat` reported.
    ///
    /// # Errors
    /// [`WeightsError::Io`] (open/fstat/mmap, naming the path),
    /// [`WeightsError::NotARegularFile`], and the errors of [`Header::parse`].
    pub fn open(path: impl AsRef<Path>) -> Result<WeightsFile, WeightsError> {
        let path = path.as_ref();
        let file = open_nonblocking(path)?;
        let meta = file
            .metadata()
            .map_err(|e| WeightsError::io(path, "fstat", e))?;
        if !meta.is_file() {
            return Err(WeightsError::NotARegularFile {
                path: path.to_path_buf(),
            });
        }
        if meta.len() == 0 {
            // mmap of length 0 fails with EINVAL (POSIX); an empty file is simply truncated.
            return Err(WeightsError::TruncatedHeader {
                len: 0,
                needed: DTYPE_TABLE_OFFSET,
            });
        }
        if usize::try_from(meta.len()).is_err() {
            return Err(WeightsError::overflow(format!(
                "mapping {} ({} bytes)",
                path.display(),
                meta.len()
            )));
        }
        // SAFETY: the map is read-only and private to this object; we never create a
        // mutable reference into it. memmap2 maps exactly the file's current length.
        // The remaining hazard is another process truncating or rewriting the file
        // while it is mapped (SIGBUS or changing bytes), documented on `WeightsFile`.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .len(meta.len() as usize)
                .map(&file)
        }
        .map_err(|e| WeightsError::io(path, "mmap", e))?;
        let header = Header::parse(&map)?;
        Ok(WeightsFile {
            storage: Storage::Mapped(map),
            header,
            path: Some(path.to_path_buf()),
        })
    }

    /// Parse bytes already in memory (taking ownership; no copy).
    ///
    /// # Errors
    /// As [`Header::parse`].
    pub fn from_vec(bytes: Vec<u8>) -> Result<WeightsFile, WeightsError> {
        let header = Header::parse(&bytes)?;
        Ok(WeightsFile {
            storage: Storage::Owned(bytes),
            header,
            path: None,
        })
    }

    /// Parse a copy of `bytes`.
    ///
    /// # Errors
    /// As [`Header::parse`].
    pub fn from_bytes(bytes: &[u8]) -> Result<WeightsFile, WeightsError> {
        WeightsFile::from_vec(bytes.to_vec())
    }

    /// The path given to [`open`](Self::open) (`None` for in-memory files).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// True when backed by a memory map.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
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
        &self.as_bytes()
            [self.header.dtype_table_offset() as usize..self.header.tensor_data_start as usize]
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
        let created_by = self
            .metadata_json()
            .and_then(Result::ok)
            .and_then(|v| v.get("created_by")?.as_str().map(str::to_owned));
        Producer::from_info(
            created_by.as_deref(),
            manifest.and_then(Manifest::format),
            manifest.and_then(Manifest::generator),
        )
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

    /// The v5 metadata JSON bytes (hash already verified), or `None` for v4.
    pub fn metadata_bytes(&self) -> Option<&[u8]> {
        let f = self.header.footer.as_ref()?;
        self.as_bytes()
            .get(f.offset as usize..(f.offset + f.len) as usize)
    }

    /// The v5 metadata parsed as JSON, or `None` for v4.
    ///
    /// # Errors
    /// [`WeightsError::Json`] if the metadata is not valid JSON.
    pub fn metadata_json(&self) -> Option<Result<serde_json::Value, WeightsError>> {
        self.metadata_bytes().map(|b| {
            serde_json::from_slice(b).map_err(|source| WeightsError::Json {
                what: "BUMPWGT5 metadata",
                source,
            })
        })
    }

    /// SHA-256 of the layout's checksum range ([`checksum_range`](Self::checksum_range)).
    pub fn compute_checksum(&self) -> [u8; 32] {
        self.compute_checksum_with(|_, _| {})
    }

    fn compute_checksum_with(&self, mut progress: impl FnMut(u64, u64)) -> [u8; 32] {
        let (start, end) = self.checksum_range();
        // start <= tensor_data_start <= data_end <= file length, checked on parse.
        let covered = &self.as_bytes()[start as usize..end as usize];
        let total = covered.len() as u64;
        let mut h = Sha256::new();
        let mut done = 0u64;
        progress(0, total);
        for chunk in covered.chunks(HASH_CHUNK) {
            h.update(chunk);
            done += chunk.len() as u64;
            progress(done, total);
        }
        h.finalize().into()
    }

    /// Hash the layout's checksum range and compare with the header.
    ///
    /// # Errors
    /// [`WeightsError::BadChecksum`] naming the layout and the range, with both digests.
    pub fn verify_checksum(&self) -> Result<(), WeightsError> {
        self.verify_checksum_with(|_, _| {})
    }

    /// As [`verify_checksum`](Self::verify_checksum), calling
    /// `progress(done_bytes, total_bytes)` before, during (every 8 MiB) and after hashing.
    ///
    /// # Errors
    /// [`WeightsError::BadChecksum`].
    pub fn verify_checksum_with(&self, progress: impl FnMut(u64, u64)) -> Result<(), WeightsError> {
        let actual = self.compute_checksum_with(progress);
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

    /// Bytes `[offset, offset + size)` of the file.
    ///
    /// # Errors
    /// [`WeightsError::EntryOutsideFile`] (named `"<range>"`) when the range is not inside the file.
    pub fn range(&self, offset: u64, size: u64) -> Result<&[u8], WeightsError> {
        self.slice("<range>", offset, size, 0, self.header.file_len)
    }

    fn slice(
        &self,
        name: &str,
        offset: u64,
        size: u64,
        lo: u64,
        hi: u64,
    ) -> Result<&[u8], WeightsError> {
        let outside = || WeightsError::EntryOutsideFile {
            name: name.to_owned(),
            file_offset: offset,
            size,
            region_start: lo,
            region_end: hi,
        };
        let end = offset.checked_add(size).ok_or_else(outside)?;
        if offset < lo || end > hi {
            return Err(outside());
        }
        // lo..hi lies within the file, whose length fits usize (checked at open).
        self.as_bytes()
            .get(offset as usize..end as usize)
            .ok_or_else(outside)
    }

    /// A tensor's bytes. The entry must lie inside the tensor-data region
    /// `[tensor_data_start, data_end)`.
    ///
    /// # Errors
    /// [`WeightsError::EntryOutsideFile`] naming the tensor.
    pub fn tensor(&self, entry: &ManifestEntry) -> Result<&[u8], WeightsError> {
        self.slice(
            &entry.name,
            entry.file_offset,
            entry.size,
            self.header.tensor_data_start,
            self.header.data_end,
        )
    }

    /// Check `manifest` against this file: every entry inside
    /// `[tensor_data_start, data_end)`, no overlaps.
    ///
    /// # Errors
    /// [`WeightsError::EntryOutsideFile`] or [`WeightsError::OverlappingEntries`].
    pub fn validate_manifest(&self, manifest: &Manifest) -> Result<(), WeightsError> {
        manifest.validate_region(self.header.tensor_data_start, self.header.data_end)
    }

    /// Gaps/overlaps of `manifest` over `[tensor_data_start, data_end)`.
    pub fn layout_report(&self, manifest: &Manifest) -> super::LayoutReport {
        manifest.layout_report(self.header.tensor_data_start, self.header.data_end)
    }

    /// Check the dtype table against `manifest` as ckalloc's writer lays it out:
    /// one code per entry, entries in file-offset order, each code equal to the
    /// code of the entry's parsed dtype. Files from other converters may use the
    /// table differently (C-Kernel-Engine's GGUF converter lists bias slots and
    /// omits vocabulary tensors), so treat a mismatch there as a warning.
    ///
    /// # Errors
    /// [`WeightsError::DtypeTableMismatch`] or [`WeightsError::UnknownDtype`].
    pub fn check_dtype_table(&self, manifest: &Manifest) -> Result<(), WeightsError> {
        let table = self.dtype_table();
        if table.len() != manifest.len() {
            return Err(WeightsError::DtypeTableMismatch {
                reason: format!(
                    "table has {} entries, manifest {}",
                    table.len(),
                    manifest.len()
                ),
            });
        }
        for (i, (e, &code)) in manifest
            .sorted_by_offset()
            .into_iter()
            .zip(table)
            .enumerate()
        {
            let d = e.parsed_dtype()?;
            if d.code() != code {
                return Err(WeightsError::DtypeTableMismatch {
                    reason: format!(
                        "entry {i} (\"{}\", {}) has code {code:#04x} in the table, expected {:#04x}",
                        e.name,
                        e.dtype,
                        d.code()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Load the sidecar manifest from `dir` for this file
    /// ([`Manifest::load_sidecars`]): offsets come from `weights_manifest.map` or
    /// from `entries[].file_offset` of `weights_manifest.json`, the way
    /// C-Kernel-Engine's loader takes them. The JSON `version` is not compared
    /// with the magic (converters write 5 for `BUMPWGT4` files).
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

    /// Check `manifest` against this file with every file-validity rule of the
    /// reader, in this order:
    ///
    /// 1. every entry has a name ([`WeightsError::InvalidTensorName`]); names are
    ///    unique by construction of [`Manifest`];
    /// 2. every dtype name is known ([`WeightsError::UnknownDtype`]);
    /// 3. every entry lies inside the tensor data `[tensor_data_start, data_end)`
    ///    ([`WeightsError::EntryOutsideFile`]);
    /// 4. no two entries share a byte; zero-size entries share nothing, so one
    ///    may sit at the offset of the next tensor ([`WeightsError::OverlappingEntries`]);
    /// 5. an entry with a shape stores at least the bytes its shape and dtype need
    ///    ([`WeightsError::ShapeMismatch`]); more is allowed (converters pad rows).
    ///
    /// Where the writer put each tensor (alignment, padding, order) is not a rule.
    ///
    /// # Errors
    /// The variants named above, for the first entry (in manifest order) that breaks a rule.
    pub fn check_manifest(&self, manifest: &Manifest) -> Result<(), WeightsError> {
        if let Some(e) = manifest.iter().find(|e| e.name.is_empty()) {
            return Err(WeightsError::InvalidTensorName {
                name: e.name.clone(),
                reason: "empty",
            });
        }
        manifest.check_dtypes()?;
        self.validate_manifest(manifest)?;
        manifest.check_shapes()
    }

    /// One informational line comparing the dtype table with `manifest`, or
    /// `None` when the table has one slot per entry (in file order) with the
    /// code of the entry's dtype.
    ///
    /// C-Kernel-Engine's converters fill the table from their own weight list:
    /// GGUF converters keep a reserved `pos_emb` slot and list no tokenizer
    /// entries; the HF converters list bias slots the file does not hold; the
    /// safetensors converter codes i32/u8 tokenizer entries as 0. None of this
    /// is an error, since offsets and dtypes come from the manifest.
    pub fn dtype_table_note(&self, manifest: &Manifest) -> Option<String> {
        let slots = self.dtype_table().len();
        let entries = manifest.len();
        if slots != entries {
            return Some(format!(
                "table has {slots} slots, manifest {entries} entries: the converter fills the table \
                 from its own weight list, so offsets and dtypes come from the manifest"
            ));
        }
        let producer = self.producer(Some(manifest));
        let mut differ = manifest
            .sorted_by_offset()
            .into_iter()
            .zip(self.dtype_table())
            .enumerate()
            .filter(|(_, (e, &code))| !producer.slot_dtype(code).may_be(e.parsed_dtype().ok()));
        let (i, (first, &code)) = differ.next()?;
        let n = 1 + differ.count();
        Some(format!(
            "table has {slots} slots, manifest {entries} entries: {n} slot code(s) differ from the \
             manifest dtypes (first: slot {i}, \"{}\" {} coded {code}); the manifest's dtype names win",
            first.name, first.dtype
        ))
    }
}

/// Open `path` read-only with `O_NONBLOCK`, so that a FIFO without a writer
/// does not block `open` forever (the caller rejects it through `fstat`);
/// the flag has no effect on regular files.
pub(crate) fn open_nonblocking(path: &Path) -> Result<File, WeightsError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| WeightsError::io(path, "open", e))
}
