//! [`WeightsWriter`]: write `weights.bump` and both sidecars.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::canonical::canonical_json;
use super::container::{Version, HEADER_SIZE, L1_OFFSETS};
use super::dims::ModelDims;
use super::dtype::Dtype;
use super::entry::check_name;
use super::entry::ManifestEntry;
use super::error::WeightsError;
use super::manifest::Manifest;

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
pub(super) const WRITE_CHUNK: usize = 4 << 20;

pub(super) struct PendingTensor<'a> {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Option<Vec<u64>>,
    pub(super) data: Cow<'a, [u8]>,
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
    pub(super) version: Version,
    pub(super) alignment: u64,
    pub(super) dims: ModelDims,
    pub(super) extra_metadata: serde_json::Map<String, serde_json::Value>,
    pub(super) tensors: Vec<PendingTensor<'a>>,
    pub(super) names: HashSet<String>,
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

    pub(super) fn manifest_json(&self, plan: &Plan) -> serde_json::Value {
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

    pub(super) fn metadata(&self, manifest_json: &serde_json::Value) -> Vec<u8> {
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
}
