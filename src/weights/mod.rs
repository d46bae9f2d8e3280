//! The `weights.bump` container of C-Kernel-Engine (`BUMPWGT4` / `BUMPWGT5`):
//! reader, sidecar manifests and writer. Behind the default `weights` feature.
//!
//! # Layout
//!
//! All integers little-endian, all offsets bytes from the start of the file. This
//! follows C-Kernel-Engine's `convert_gguf_to_bump_v6_6.py` (`HEADER_SIZE = 128`,
//! `EXT_METADATA_SIZE = 24`, `DATA_START = 152`) and `include/ckernel_bump_v5.h`.
//!
//! ```text
//!   0  magic "BUMPWGT4" | "BUMPWGT5"          8 bytes
//!   8  version u32 (4 | 5, must match magic)
//!  12  model_type u32
//!  16  num_layers, vocab_size, embed_dim, intermediate_size,
//!      context_len, num_heads, num_kv_heads, head_dim        8 x u32
//!  48  aligned_embed_dim, aligned_head_dim,
//!      aligned_intermediate, aligned_context                 4 x u64
//!  80  num_merges u32, total_vocab_bytes u32
//!  88  SHA-256 of [152, data_end)                            32 bytes
//! 120  zero                                                   8 bytes
//! 128  extended metadata block, zero                         24 bytes
//! 152  dtype table length N u32           <- checksum starts here
//! 156  dtype table: N one-byte codes (see Dtype)
//! 156+N  tensor data (offsets in the manifest; ckalloc aligns each tensor)
//! data_end                                <- checksum ends here
//!      v5 only: metadata JSON (canonical), then the 48-byte footer
//!      "BUMPV5MD", u64 metadata length, SHA-256 of the metadata
//! ```
//!
//! With an arena built on the file, arena offset == file offset: the weights region
//! is `[weights_base, activations_base)` where `weights_base` is the first tensor's
//! offset and `activations_base` can be [`WriteReport::data_end`].
//!
//! # Sidecars
//!
//! * `weights_manifest.map` — `# ck-bumpwgt5-manifest-map v1`, then
//!   `name|dtype|0xFILE_OFFSET|0xSIZE|0xRUNTIME_OFFSET` per tensor ([`Manifest::from_map`]).
//! * `weights_manifest.json` — `{"entries": [{"name", "dtype", "file_offset", "size",
//!   "shape"?}], ...}` ([`Manifest::from_json`]).
//!
//! The manifest is the authority for offsets, sizes and dtypes; the dtype table
//! is a per-tensor hint (see [`Dtype`] for codes, including the extension range
//! for types C-Kernel-Engine's table lacks).
//!
//! # Example
//!
//! ```
//! use ckalloc::weights::{Dtype, Manifest, Version, WeightsFile, WeightsWriter};
//! let dir = tempfile::tempdir().unwrap();
//! let ids: Vec<u8> = (0..8i64).flat_map(|i| i.to_le_bytes()).collect();
//! let mut w = WeightsWriter::new(Version::V4);
//! w.add_tensor_with_shape("position_ids", Dtype::I64, &[1, 8], &ids[..]).unwrap();
//! let report = w.write_dir(dir.path()).unwrap();
//!
//! let file = WeightsFile::open(dir.path().join("weights.bump")).unwrap();
//! file.verify_checksum().unwrap();
//! let manifest = Manifest::load_sidecars(dir.path()).unwrap();
//! file.validate_manifest(&manifest).unwrap();
//! manifest.check_runtime_offsets().unwrap();
//! let e = manifest.get("position_ids").unwrap();
//! assert_eq!(e.dtype, "i64");
//! assert_eq!(file.tensor(e).unwrap(), &ids[..]);
//! assert_eq!(report.data_end, file.data_end());
//! ```
//!
//! # Thread safety
//!
//! [`WeightsFile`] and [`Manifest`] are immutable and `Send + Sync`.
//! [`WeightsWriter`] is a plain builder (`Send` when its borrowed data is).
//!
//! # Sidecar formats
//!
//! | file | format |
//! | --- | --- |
//! | `weights_manifest.map` | first line `# ck-bumpwgt5-manifest-map v1` (`bumpwgt4` for v4), a comment naming the columns, then `name\|dtype\|0xFILE_OFFSET\|0xSIZE\|0xRUNTIME_OFFSET` per tensor, numbers as `0x%016X` |
//! | `weights_manifest.json` | `{"format": "ck-bumpwgt5-manifest-v1", "version", "weights_path", "bump_layout", "alignment", "weights_base", "data_end", "config", "entries": [{"name", "dtype", "file_offset", "size", "shape"?}]}` |
//!
//! Readers accept what C-Kernel-Engine's tools write: comment and blank lines,
//! CRLF, decimal or `0x` numbers, the JSON alias `offset`, numbers as strings,
//! extra keys, and an optional `runtime_offset` (default: `file_offset`).
//!
//! # Writer options
//!
//! | option | default | meaning |
//! | --- | --- | --- |
//! | [`Version`] | none | `V4` or `V5` (v5 appends the metadata and the footer) |
//! | [`WeightsWriter::alignment`] | 64 bytes | a power of two, 1 B to 1 GiB; every tensor offset and `data_end` are multiples of it |
//! | [`WeightsWriter::dims`] | zeros, `model_type` 1 | the header's model fields (offsets 12 to 88) |
//! | [`WeightsWriter::metadata_entry`] | none | extra v5 metadata keys; the writer's own keys win |
//! | [`WeightsWriter::write_dir_with_progress`] | none | `(done_bytes, total_bytes)` of `weights.bump`, at the start, every 4 MiB and at the end |
//!
//! Tensor names are 1 to 1024 bytes with no `|`, line break or NUL and do not
//! start with `#` (so a `.map` line fits C-Kernel-Engine's 4096-byte line
//! buffer). Files are written under temporary names, synced and renamed into
//! place; on error the temporary files are removed.
//!
//! # Differences from C-Kernel-Engine
//!
//! * **Checksum coverage**: `[152, data_end)`, that is the dtype-table length,
//!   the table, the tensor data and ckalloc's zero padding; not the header or
//!   the v5 metadata.
//! * **Padding**: C-Kernel-Engine packs tensors back to back; ckalloc aligns
//!   them (64 bytes by default) and pads `data_end`. Both are valid, since the
//!   manifest gives the offsets.
//! * **Dtype table**: ckalloc writes one code per tensor in file order.
//!   C-Kernel-Engine's GGUF converter lists bias slots and omits vocabulary
//!   tensors, so [`WeightsFile::check_dtype_table`] is meaningful for ckalloc
//!   files only.
//! * **Metadata**: ckalloc omits `created_at`, so identical input gives
//!   identical files; floats in user metadata may print differently from
//!   Python (`1e-5` vs `1e-05`).
//! * **`.map` parsing** is stricter than the C loader: exactly five fields,
//!   and a decimal number with a leading zero is rejected (C's
//!   `strtoull(s, NULL, 0)` reads it as octal).
//! * **Mapped files**: [`WeightsFile::open`] maps the file; another process
//!   truncating it raises `SIGBUS` on access. [`WeightsFile::from_vec`] reads
//!   it into memory instead.

mod dtype;
mod error;
mod file;
mod format;
mod manifest;
mod writer;

pub use dtype::{Dtype, EXTENSION_CODE_BASE};
pub use error::{ManifestKind, WeightsError};
pub use file::WeightsFile;
pub use format::{
    canonical_json, Header, MetadataFooter, ModelDims, Version, CACHE_ALIGN, CHECKSUM_OFFSET,
    DATA_START, DTYPE_TABLE_OFFSET, EXT_METADATA_SIZE, FOOTER_MAGIC, FOOTER_SIZE, HEADER_SIZE,
    MAGIC_V4, MAGIC_V5,
};
pub use manifest::{
    Gap, LayoutReport, Manifest, ManifestEntry, Overlap, MANIFEST_JSON, MANIFEST_MAP,
};
pub use writer::{
    Plan, WeightsWriter, WriteReport, DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_NAME_LEN, WEIGHTS_FILE,
};
