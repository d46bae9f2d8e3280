//! [`WeightsFile`]: a read-only view of a whole `weights.bump`.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::format::{DATA_START, DTYPE_TABLE_OFFSET};
use super::{
    Dtype, Header, Manifest, ManifestEntry, MetadataFooter, ModelDims, Version, WeightsError,
};

/// Bytes hashed between two progress reports in [`WeightsFile::verify_checksum_with`].
const HASH_CHUNK: usize = 8 << 20;

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A parsed `weights.bump`: either a read-only memory map of a file or bytes in
/// memory. The header (and, for v5, the footer and metadata hash) are checked on
/// construction; the tensor checksum is checked by [`verify_checksum`](Self::verify_checksum).
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

    /// Always false: a valid file has at least a 156-byte header.
    pub fn is_empty(&self) -> bool {
        self.header.file_len == 0
    }

    /// Container version.
    pub fn version(&self) -> Version {
        self.header.version
    }

    /// Model fields of the header.
    pub fn dims(&self) -> &ModelDims {
        &self.header.dims
    }

    /// SHA-256 stored in the header (offset 88).
    pub fn checksum(&self) -> &[u8; 32] {
        &self.header.checksum
    }

    /// The dtype table bytes (one code per tensor, starting at offset 156).
    pub fn dtype_table(&self) -> &[u8] {
        &self.as_bytes()[DTYPE_TABLE_OFFSET as usize..self.header.tensor_data_start as usize]
    }

    /// The dtype table decoded; `None` for codes no one assigned.
    pub fn dtypes(&self) -> impl Iterator<Item = Option<Dtype>> + '_ {
        self.dtype_table().iter().map(|&c| Dtype::from_code(c))
    }

    /// First byte after the dtype table (`156 + table length`).
    pub fn tensor_data_start(&self) -> u64 {
        self.header.tensor_data_start
    }

    /// End of tensor data, exclusive (bytes). The checksum covers `[152, data_end)`.
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

    /// SHA-256 of bytes `[152, data_end)`.
    pub fn compute_checksum(&self) -> [u8; 32] {
        self.compute_checksum_with(|_, _| {})
    }

    fn compute_checksum_with(&self, mut progress: impl FnMut(u64, u64)) -> [u8; 32] {
        let covered = &self.as_bytes()[DATA_START as usize..self.header.data_end as usize];
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

    /// Hash bytes `[152, data_end)` and compare with the header.
    ///
    /// # Errors
    /// [`WeightsError::BadChecksum`] with both digests.
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
