//! [`WeightsWriter`]: write `weights.bump` and both sidecars.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::canonical::canonical_json;
use super::container::{Version, HEADER_SIZE, L1_OFFSETS};
use super::dims::ModelDims;
use super::dtype::Dtype;
use super::error::WeightsError;
use super::header::FOOTER_MAGIC;
use super::manifest::{check_name, MANIFEST_JSON, MANIFEST_MAP};
use super::manifest::{Manifest, ManifestEntry};

/// Default tensor alignment (bytes): a cache line, like C-Kernel-Engine's `CACHE_ALIGN`.
pub const DEFAULT_ALIGNMENT: u64 = 64;
/// Largest accepted alignment (bytes).
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// Size of L1's zero-filled extension block after the header (bytes), the layout
/// ckalloc writes.
pub const EXT_METADATA_SIZE: u64 = L1_OFFSETS.hash_start - HEADER_SIZE;
/// L1's dtype-table count offset (u32), where its checksum range starts:
/// [`L1_OFFSETS`]`.dtype_count`. Other layouts: [`Container::offsets`](super::Container::offsets).
pub const DATA_START: u64 = L1_OFFSETS.dtype_count;
/// L1's first dtype-table byte: [`L1_OFFSETS`]`.dtype_table()`.
pub const DTYPE_TABLE_OFFSET: u64 = L1_OFFSETS.dtype_table();
/// L1's header SHA-256 offset: [`L1_OFFSETS`]`.checksum`.
pub const CHECKSUM_OFFSET: u64 = L1_OFFSETS.checksum;
/// File name of the container.
pub const WEIGHTS_FILE: &str = "weights.bump";
/// Bytes written between two progress reports.
const WRITE_CHUNK: usize = 4 << 20;

struct PendingTensor<'a> {
    name: String,
    dtype: Dtype,
    shape: Option<Vec<u64>>,
    data: Cow<'a, [u8]>,
}

/// Where everything went, returned by [`WeightsWriter::write_dir`].
/// Offsets are bytes from the start of `weights.bump`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WriteReport {
    /// Path of `weights.bump`.
    pub weights_path: PathBuf,
    /// Path of `weights_manifest.json`.
    pub manifest_json_path: PathBuf,
    /// Path of `weights_manifest.map`.
    pub manifest_map_path: PathBuf,
    /// Offset of the first tensor (the arena's `weights_base`); equals `data_end` with no tensors.
    pub weights_base: u64,
    /// End of tensor data, a multiple of the alignment; a suitable arena
    /// `activations_base` (the file covers it: v4 ends here, v5 continues with metadata).
    pub data_end: u64,
    /// Length of `weights.bump`.
    pub file_len: u64,
    /// The SHA-256 written at offset 88.
    pub checksum: [u8; 32],
    /// The manifest written (entries in file order, `runtime_offset == file_offset`).
    pub manifest: Manifest,
}

/// The planned layout of a writer's tensors, from [`WeightsWriter::plan`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Plan {
    /// Offset of the first tensor.
    pub weights_base: u64,
    /// End of tensor data (a multiple of the alignment).
    pub data_end: u64,
    /// Entries, in file order.
    pub manifest: Manifest,
}

/// Builds a `weights.bump` from named tensors, then writes it with
/// `weights_manifest.json` and `weights_manifest.map` into a directory.
///
/// Layout: the 152-byte header block, the dtype table (u32 count at 152, one code
/// per tensor), then each tensor's bytes at the next multiple of the alignment
/// (zero padding between), zero padding up to a multiple of the alignment
/// (`data_end`), and for v5 the canonical JSON metadata and the 48-byte footer.
/// The header's SHA-256 covers `[152, data_end)`, padding included.
///
/// Tensor bytes are written as given (no conversion). Data may be borrowed
/// ([`add_tensor`](Self::add_tensor) with a `&'a [u8]`, for example a slice of a
/// memory-mapped safetensors file) so the writer holds no second copy.
///
/// ```
/// use ckalloc::weights::{Dtype, Version, WeightsFile, WeightsWriter};
/// let dir = tempfile::tempdir().unwrap();
/// let bias = vec![0u8; 16];
/// let mut w = WeightsWriter::new(Version::V5);
/// w.add_tensor("embed", Dtype::F32, &[1u8; 32][..]).unwrap();
/// w.add_tensor_with_shape("bias", Dtype::F32, &[4], &bias[..]).unwrap();
/// let report = w.write_dir(dir.path()).unwrap();
/// let f = WeightsFile::open(&report.weights_path).unwrap();
/// f.verify_checksum().unwrap();
/// let e = report.manifest.get("bias").unwrap();
/// assert_eq!(f.tensor(e).unwrap(), &bias[..]);
/// assert_eq!(report.weights_base % 64, 0);
/// ```
pub struct WeightsWriter<'a> {
    version: Version,
    alignment: u64,
    dims: ModelDims,
    extra_metadata: serde_json::Map<String, serde_json::Value>,
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
}

fn align_up(x: u64, a: u64) -> Result<u64, WeightsError> {
    x.checked_next_multiple_of(a)
        .ok_or_else(|| WeightsError::overflow(format!("aligning offset {x} to {a}")))
}

impl<'a> WeightsWriter<'a> {
    /// A writer for `version`, alignment 64 bytes, header `model_type` 1 and zero dims.
    pub fn new(version: Version) -> Self {
        WeightsWriter {
            version,
            alignment: DEFAULT_ALIGNMENT,
            dims: ModelDims {
                model_type: 1,
                ..ModelDims::default()
            },
            extra_metadata: serde_json::Map::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Set the alignment of every tensor's file offset (bytes): a power of two in
    /// `1..=1 GiB`. Since arena offset == file offset and the arena base is
    /// page-aligned, this is also the tensors' memory alignment (up to a page).
    ///
    /// # Errors
    /// [`WeightsError::InvalidAlignment`].
    pub fn alignment(&mut self, alignment: u64) -> Result<&mut Self, WeightsError> {
        if !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
            return Err(WeightsError::InvalidAlignment { alignment });
        }
        self.alignment = alignment;
        Ok(self)
    }

    /// Set the header's model fields (see [`ModelDims::from_config_json`]).
    pub fn dims(&mut self, dims: ModelDims) -> &mut Self {
        self.dims = dims;
        self
    }

    /// Add a key to the v5 metadata object (ignored for v4). The writer's own keys
    /// (`schema_version`, `format`, `created_by`, `config`, `alignment`,
    /// `manifest_hash`) take precedence over keys with the same name.
    pub fn metadata_entry(
        &mut self,
        key: impl Into<String>,
        value: serde_json::Value,
    ) -> &mut Self {
        self.extra_metadata.insert(key.into(), value);
        self
    }

    /// Add a tensor; its bytes are written as given. Pass `&[u8]` to borrow (no
    /// copy until written) or `Vec<u8>` to hand over ownership.
    ///
    /// # Errors
    /// [`WeightsError::InvalidTensorName`], [`WeightsError::DuplicateTensor`].
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: Dtype,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), WeightsError> {
        self.push(name.into(), dtype, None, data.into())
    }

    /// Add a tensor with a shape (outermost first), recorded in the JSON sidecar.
    /// For whole-byte element types the byte length must equal
    /// `product(shape) * element size`; packed and block types are not checked.
    ///
    /// # Errors
    /// As [`add_tensor`](Self::add_tensor), plus [`WeightsError::ShapeMismatch`]
    /// and [`WeightsError::SizeOverflow`].
    pub fn add_tensor_with_shape(
        &mut self,
        name: impl Into<String>,
        dtype: Dtype,
        shape: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), WeightsError> {
        let name = name.into();
        let data = data.into();
        let elements = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                WeightsError::overflow(format!(
                    "element count of \"{name}\" shape {}",
                    super::error::shape_text(shape)
                ))
            })?;
        if dtype.element_bits().is_some_and(|b| b % 8 == 0) {
            let expected = dtype.bytes_for(elements).ok_or_else(|| {
                WeightsError::overflow(format!(
                    "byte size of \"{name}\" shape {}",
                    super::error::shape_text(shape)
                ))
            })?;
            if expected != data.len() as u64 {
                return Err(WeightsError::ShapeMismatch {
                    name,
                    shape: shape.to_vec(),
                    expected_bytes: expected,
                    actual_bytes: data.len() as u64,
                });
            }
        }
        self.push(name, dtype, Some(shape.to_vec()), data)
    }

    fn push(
        &mut self,
        name: String,
        dtype: Dtype,
        shape: Option<Vec<u64>>,
        data: Cow<'a, [u8]>,
    ) -> Result<(), WeightsError> {
        check_name(&name)?;
        if self.tensors.len() >= u32::MAX as usize {
            return Err(WeightsError::overflow(
                "dtype table length (more than u32::MAX tensors)",
            ));
        }
        if !self.names.insert(name.clone()) {
            return Err(WeightsError::DuplicateTensor { name });
        }
        self.tensors.push(PendingTensor {
            name,
            dtype,
            shape,
            data,
        });
        Ok(())
    }

    /// Number of tensors added.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Compute offsets without writing (for sizing an arena before packing).
    ///
    /// # Errors
    /// [`WeightsError::SizeOverflow`].
    pub fn plan(&self) -> Result<Plan, WeightsError> {
        let mut cursor = DTYPE_TABLE_OFFSET + self.tensors.len() as u64;
        let mut entries = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let offset = align_up(cursor, self.alignment)?;
            cursor = offset
                .checked_add(t.data.len() as u64)
                .ok_or_else(|| WeightsError::overflow(format!("end of tensor \"{}\"", t.name)))?;
            let mut e =
                ManifestEntry::new(t.name.clone(), t.dtype.name(), offset, t.data.len() as u64)?;
            e.shape = t.shape.clone();
            entries.push(e);
        }
        let data_end = align_up(cursor, self.alignment)?;
        let weights_base = entries.first().map_or(data_end, |e| e.file_offset);
        Ok(Plan {
            weights_base,
            data_end,
            manifest: Manifest::from_entries(entries)?,
        })
    }

    fn manifest_json(&self, plan: &Plan) -> serde_json::Value {
        serde_json::json!({
            "format": format!("ck-bumpwgt{}-manifest-v1", self.version.number()),
            "version": self.version.number(),
            "weights_path": WEIGHTS_FILE,
            "generator": concat!("ckalloc ", env!("CARGO_PKG_VERSION")),
            "bump_layout": {
                "header_size": HEADER_SIZE,
                "ext_metadata_size": EXT_METADATA_SIZE,
                "data_start": DATA_START,
            },
            "alignment": self.alignment,
            "weights_base": plan.weights_base,
            "data_end": plan.data_end,
            "config": self.dims.to_json(),
            "entries": plan.manifest.entries_json(),
        })
    }

    fn metadata(&self, manifest_json: &serde_json::Value) -> Vec<u8> {
        let mut m = self.extra_metadata.clone();
        let hash: [u8; 32] = Sha256::digest(canonical_json(manifest_json)).into();
        m.insert("schema_version".into(), 1.into());
        m.insert("format".into(), "BUMPWGT5".into());
        m.insert(
            "created_by".into(),
            concat!("ckalloc ", env!("CARGO_PKG_VERSION")).into(),
        );
        m.insert("config".into(), self.dims.to_json());
        m.insert("alignment".into(), self.alignment.into());
        m.insert("manifest_hash".into(), super::error::hex32(&hash).into());
        canonical_json(&serde_json::Value::Object(m))
    }

    /// Write `weights.bump`, `weights_manifest.json` and `weights_manifest.map` into
    /// `dir` (which must exist). See [`write_dir_with_progress`](Self::write_dir_with_progress).
    ///
    /// # Errors
    /// As [`write_dir_with_progress`](Self::write_dir_with_progress).
    pub fn write_dir(&self, dir: impl AsRef<Path>) -> Result<WriteReport, WeightsError> {
        self.write_dir_with_progress(dir, |_, _| {})
    }

    /// Write the three files into `dir`, calling `progress(done_bytes, total_bytes)`
    /// (bytes of `weights.bump`) at the start, every 4 MiB and at the end.
    ///
    /// Each file is written as an unnamed file (`O_TMPFILE`, Linux 3.11+ on ext4,
    /// XFS, Btrfs, tmpfs and most local filesystems) and linked into place once all
    /// three are complete and synced, so a process interrupted or killed while
    /// writing (even by `SIGKILL`) leaves no file behind. An existing file is
    /// replaced atomically (`rename(2)` from a fresh name): readers see the old
    /// file or the complete new one. `SIGINT`, `SIGTERM`, `SIGHUP` and `SIGQUIT`
    /// are blocked in the calling thread while the three names are placed, so an
    /// interruption never leaves a half-placed set (it takes effect right after)
    /// when no other thread can receive them: the kernel delivers a signal sent
    /// to the process to any thread that does not block it (`signal(7)`), so a
    /// program with other threads blocks these signals in them too, or handles
    /// them.
    ///
    /// On a filesystem without `O_TMPFILE` (NFS, FUSE, older kernels) each file
    /// is written under a temporary name `.NAME.tmp-PID` in `dir` and renamed
    /// into place; those names are removed on error, but a process killed while
    /// writing leaves them.
    ///
    /// On error existing files in `dir` are left as they were (names are placed
    /// last, after checking that none of them is a directory; a failure between
    /// two renames, such as a name turned into a directory meanwhile, can leave a
    /// new `weights.bump` with old sidecars, reported as the error). Not safe to run twice concurrently on the
    /// same `dir`.
    ///
    /// # Errors
    /// [`WeightsError::Io`] naming the file, [`WeightsError::SizeOverflow`],
    /// [`WeightsError::UnsupportedWriteVersion`] for [`Version::V3`].
    pub fn write_dir_with_progress(
        &self,
        dir: impl AsRef<Path>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<WriteReport, WeightsError> {
        let dir = dir.as_ref();
        if !matches!(self.version, Version::V4 | Version::V5) {
            return Err(WeightsError::UnsupportedWriteVersion {
                version: self.version.number(),
            });
        }
        let plan = self.plan()?;
        let manifest_json = self.manifest_json(&plan);
        let metadata = match self.version {
            Version::V5 => Some(self.metadata(&manifest_json)),
            _ => None,
        };
        let meta_len = metadata
            .as_ref()
            .map_or(0, |m| m.len() as u64 + super::header::FOOTER_SIZE);
        let file_len = plan
            .data_end
            .checked_add(meta_len)
            .ok_or_else(|| WeightsError::overflow("file length"))?;

        let final_paths = [
            dir.join(WEIGHTS_FILE),
            dir.join(MANIFEST_JSON),
            dir.join(MANIFEST_MAP),
        ];
        let mut bump = PendingFile::create(dir, WEIGHTS_FILE)?;
        let checksum = self.write_bump(
            &mut bump.file,
            &final_paths[0],
            &plan,
            metadata.as_deref(),
            file_len,
            &mut progress,
        )?;
        let mut json =
            serde_json::to_vec_pretty(&manifest_json).map_err(|source| WeightsError::Json {
                what: "manifest",
                source,
            })?;
        json.push(b'\n');
        let json_file = write_small(dir, MANIFEST_JSON, &json)?;
        let map_file = write_small(
            dir,
            MANIFEST_MAP,
            plan.manifest.to_map_string(self.version).as_bytes(),
        )?;
        // A directory at one of the names would fail its `rename(2)` with
        // `EISDIR` after the names before it were placed: refuse before
        // placing any.
        for dest in &final_paths {
            if std::fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
                return Err(WeightsError::io(
                    dest,
                    "rename",
                    std::io::ErrorKind::IsADirectory.into(),
                ));
            }
        }
        {
            // The three names appear together: Ctrl-C or `kill` arriving
            // meanwhile takes effect after the last one (SIGKILL cannot wait).
            let _signals = crate::sys::block_termination_signals();
            for (f, dest) in [bump, json_file, map_file].into_iter().zip(&final_paths) {
                f.commit(dest)?;
            }
        }
        let [weights_path, manifest_json_path, manifest_map_path] = final_paths;
        Ok(WriteReport {
            weights_path,
            manifest_json_path,
            manifest_map_path,
            weights_base: plan.weights_base,
            data_end: plan.data_end,
            file_len,
            checksum,
            manifest: plan.manifest,
        })
    }

    fn write_bump(
        &self,
        file: &mut File,
        path: &Path,
        plan: &Plan,
        metadata: Option<&[u8]>,
        file_len: u64,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<[u8; 32], WeightsError> {
        let io = |op| move |e| WeightsError::io(path, op, e);
        let mut out = HashingWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            pos: 0,
            total: file_len,
        };
        progress(0, file_len);
        // Header placeholder and the zero extended-metadata block: not hashed.
        out.write_plain(&[0u8; DATA_START as usize])
            .map_err(io("write"))?;
        out.write_hashed(&(self.tensors.len() as u32).to_le_bytes())
            .map_err(io("write"))?;
        let table: Vec<u8> = self.tensors.iter().map(|t| t.dtype.code()).collect();
        out.write_hashed(&table).map_err(io("write"))?;
        for (t, e) in self.tensors.iter().zip(plan.manifest.iter()) {
            out.pad_to(e.file_offset).map_err(io("write"))?;
            for chunk in t.data.chunks(WRITE_CHUNK) {
                out.write_hashed(chunk).map_err(io("write"))?;
                progress(out.pos, file_len);
            }
        }
        out.pad_to(plan.data_end).map_err(io("write"))?;
        let checksum: [u8; 32] = out.hasher.clone().finalize().into();
        if let Some(meta) = metadata {
            out.write_plain(meta).map_err(io("write"))?;
            out.write_plain(&FOOTER_MAGIC).map_err(io("write"))?;
            out.write_plain(&(meta.len() as u64).to_le_bytes())
                .map_err(io("write"))?;
            let meta_hash: [u8; 32] = Sha256::digest(meta).into();
            out.write_plain(&meta_hash).map_err(io("write"))?;
        }
        debug_assert_eq!(out.pos, file_len);
        let file = out
            .inner
            .into_inner()
            .map_err(|e| WeightsError::io(path, "write", e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
        file.write_all(&encode_fixed_header(self.version, &self.dims, &checksum))
            .map_err(io("write"))?;
        file.sync_all().map_err(io("fsync"))?;
        progress(file_len, file_len);
        Ok(checksum)
    }
}

/// Write `bytes` as the pending file `name` in `dir`, synced.
/// The first [`DATA_START`] bytes of a file with these fields: magic, version,
/// dims, checksum, then zeros up to offset 152.
fn encode_fixed_header(version: Version, dims: &ModelDims, checksum: &[u8; 32]) -> Vec<u8> {
    let mut h = Vec::with_capacity(DATA_START as usize);
    h.extend_from_slice(&version.magic());
    for v in [
        version.number(),
        dims.model_type,
        dims.num_layers,
        dims.vocab_size,
        dims.embed_dim,
        dims.intermediate_size,
        dims.context_len,
        dims.num_heads,
        dims.num_kv_heads,
        dims.head_dim,
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        dims.aligned_embed_dim,
        dims.aligned_head_dim,
        dims.aligned_intermediate,
        dims.aligned_context,
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&dims.num_merges.to_le_bytes());
    h.extend_from_slice(&dims.total_vocab_bytes.to_le_bytes());
    debug_assert_eq!(h.len() as u64, CHECKSUM_OFFSET);
    h.extend_from_slice(checksum);
    h.resize(DATA_START as usize, 0);
    h
}

fn write_small(dir: &Path, name: &'static str, bytes: &[u8]) -> Result<PendingFile, WeightsError> {
    let path = dir.join(name);
    let mut f = PendingFile::create(dir, name)?;
    f.file
        .write_all(bytes)
        .map_err(|e| WeightsError::io(&path, "write", e))?;
    f.file
        .sync_all()
        .map_err(|e| WeightsError::io(&path, "fsync", e))?;
    Ok(f)
}

/// An output file being written. Where the filesystem supports it the file
/// is unnamed (`O_TMPFILE`, see `open(2)`) until [`commit`](Self::commit)
/// links it in: a process killed or interrupted while writing leaves no file
/// behind. Elsewhere it is a named temporary file `.NAME.tmp-PID` in the same
/// directory, removed on drop unless committed.
struct PendingFile {
    file: File,
    dir: PathBuf,
    name: &'static str,
    /// The temporary name of a named (fallback) file.
    temp: Option<PathBuf>,
}

impl PendingFile {
    fn create(dir: &Path, name: &'static str) -> Result<PendingFile, WeightsError> {
        let temp_name = |kind: &str| dir.join(format!(".{name}.{kind}-{}", std::process::id()));
        let (file, temp) = match crate::sys::open_unnamed_in(dir) {
            Ok(f) => (f, None),
            Err(e) if crate::sys::unnamed_unsupported(&e) => {
                let p = temp_name("tmp");
                let f = File::create(&p).map_err(|e| WeightsError::io(&p, "create", e))?;
                (f, Some(p))
            }
            Err(e) => return Err(WeightsError::io(dir, "create an unnamed file in", e)),
        };
        Ok(PendingFile {
            file,
            dir: dir.to_path_buf(),
            name,
            temp,
        })
    }

    /// Give the complete file the name `dest`, replacing an existing `dest`
    /// atomically (`rename(2)`): a reader sees the old file or the new one.
    fn commit(mut self, dest: &Path) -> Result<(), WeightsError> {
        let rename = |from: &Path| {
            std::fs::rename(from, dest).map_err(|e| {
                let _ = std::fs::remove_file(from);
                WeightsError::io(dest, "rename", e)
            })
        };
        if let Some(temp) = self.temp.take() {
            return rename(&temp);
        }
        // `linkat` never replaces: link straight to `dest` when it is free,
        // else to a fresh name that `rename` then moves over `dest`.
        match crate::sys::link_unnamed(&self.file, dest) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(WeightsError::io(dest, "link", e)),
        }
        let link = self
            .dir
            .join(format!(".{}.new-{}", self.name, std::process::id()));
        let _ = std::fs::remove_file(&link);
        crate::sys::link_unnamed(&self.file, &link)
            .map_err(|e| WeightsError::io(&link, "link", e))?;
        rename(&link)
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if let Some(p) = &self.temp {
            let _ = std::fs::remove_file(p);
        }
    }
}

struct HashingWriter<'f> {
    inner: BufWriter<&'f mut File>,
    hasher: Sha256,
    pos: u64,
    total: u64,
}

impl HashingWriter<'_> {
    fn write_plain(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(b)?;
        self.pos += b.len() as u64;
        debug_assert!(self.pos <= self.total);
        Ok(())
    }

    fn write_hashed(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hasher.update(b);
        self.write_plain(b)
    }

    fn pad_to(&mut self, offset: u64) -> std::io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.pos < offset {
            let n = (offset - self.pos).min(ZEROS.len() as u64) as usize;
            self.write_hashed(&ZEROS[..n])?;
        }
        Ok(())
    }
}
