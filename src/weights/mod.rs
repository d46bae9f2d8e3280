//! The `weights.bump` container of C-Kernel-Engine (`BUMPWGT3` / `BUMPWGT4` /
//! `BUMPWGT5`): reader for the four layouts its converters write, sidecar
//! manifests, and a writer (layout L1). Behind the default `weights` feature.
//!
//! # Layouts
//!
//! C-Kernel-Engine's converters write four layouts; the same magic starts more
//! than one of them, so the reader recognises the layout by structure
//! ([`WeightsFile::container`] returns it as a [`Container`]). All integers are
//! little-endian, all offsets bytes from the start of the file; "data end" is
//! the end of the last tensor. Paths are in C-Kernel-Engine's tree (the fork
//! `ArrivedAditya/C-Kernel-Engine` at `d9018583`, which contains upstream main
//! `991d0874`); the offsets below were checked against files those converters
//! wrote (the fixtures under `tests/data/cke/`).
//!
//! | | L1 [`Container::V8Converters`] | L2 [`Container::V4HeaderConverters`] | L3 [`Container::V65GgufConverters`] | L4 [`Container::BareHfConverter`] |
//! |---|---|---|---|---|
//! | magic | `BUMPWGT5` or `BUMPWGT4` | `BUMPWGT4`, or `BUMPWGT5` with the v5 footer (v6.6/v7 HF converters) | `BUMPWGT4` | `BUMPWGT3` |
//! | header (128 B) | u32 version @8, model_type @12, layers @16, vocab @20, embed @24, intermediate @28, context @32, heads @36, kv_heads @40, head_dim @44; u64 aligned embed/head/intermediate/context @48/56/64/72; u32 `num_merges` @80, `total_vocab_bytes` @84; checksum @88..120; zeros 120..128 | as L1 to @80, no merge fields; checksum @80..112; zeros 112..128 | as L1 to @128 | u32 version @8, model_type @12, layers @16, vocab @20, embed @24, context @28, heads @32, head_dim @36; u64 aligned embed/head/context @40/48/56; checksum @64..96; zeros 96..128 |
//! | after the header | 24 zero bytes, then the dtype table (u32 count, one code per slot) @152 | dtype table @128 | dtype table @128 | dtype table @128 |
//! | checksum covers | [152, data end) | [128, data end) | [128, end of file) | [128, end of file) |
//! | trailer | `BUMPWGT5`: metadata JSON + 48-byte `BUMPV5MD` footer | `BUMPWGT5`: the same | none | none |
//! | Q4_K code | 7 | 7 (GGUF converters), **6** (HF converters) | 7 | 6 |
//! | offsets | [`L1_OFFSETS`] | [`L2_OFFSETS`] | [`L3_OFFSETS`] | [`L4_OFFSETS`] |
//! | written by | `version/v8/scripts/convert_gguf_to_bump_v8.py`, `convert_safetensors_to_bump_v8.py`, `version/v7/scripts/convert_gguf_to_bump_v7.py`, `version/v6.6/scripts/convert_gguf_to_bump_v6_6.py`; ckalloc's [`WeightsWriter`] | `scripts/convert_gguf_to_bump.py`, `scripts/convert_gguf_to_bump_v6.py`, `scripts/v4/convert_gguf_to_bump_v4*.py`, `scripts/v6/convert_gguf_to_bump_v6.py`; HF: `scripts/v4/convert_hf_to_bump_v4.py`, `scripts/v6/`, `scripts/v6.5/`, `scripts/v6.6/`, `version/v6.6/scripts/convert_hf_to_bump_v6_6.py`, `version/v7/scripts/convert_hf_to_bump_v7.py` | `scripts/v6.5/convert_gguf_to_bump_v6_5.py`, `scripts/v6.6/convert_gguf_to_bump_v6_6.py` | every unversioned `convert_hf_to_bump.py`, `scripts/gen_random_bump.py` |
//!
//! Header fields a layout lacks are `None` in [`HeaderDims`]. The v5 footer is
//! `BUMPV5MD`, a u64 metadata length and the SHA-256 of the metadata; the
//! metadata (canonical JSON) starts at the data end and is not covered by the
//! header checksum. ckalloc writes L1 only, aligning each tensor (see
//! [`WeightsWriter`]); C-Kernel-Engine's converters pack tensors right after the
//! table (newer exporters pad to 32 or 64 bytes). Alignment is not a reader rule.
//!
//! L1 as ckalloc writes it, for reference:
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
//! # How the reader recognises the layout
//!
//! [`Header::parse`] (and so [`WeightsFile::open`]) reads the magic and the u32
//! at 8, which must repeat the magic's digit. The magic allows L4 (`BUMPWGT3`),
//! L1, L2 or L3 (`BUMPWGT4`), or L1 or L2 (`BUMPWGT5`). For each allowed layout:
//!
//! 1. **Header rules** (the first 128 bytes, plus the u32 at 128):
//!    * L1 and L3 keep the checksum at 88..120, so bytes 112..120 are not all
//!      zero (a SHA-256 ending in 8 zero bytes does not occur);
//!    * L2 keeps it at 80..112, so bytes 112..128 are all zero;
//!    * L3 has its dtype-table count at 128, which is not 0 (in L1, 128..152 is
//!      the zero extension block);
//!    * L4: bytes 96..128 are all zero.
//! 2. **Structure rules**: the file holds the header and table count; the dtype
//!    table (count, then one byte per slot) ends inside the file; L2, L3 and L4
//!    have at least one slot (their converters write one per weight); a
//!    `BUMPWGT5` file ends with a valid `BUMPV5MD` footer whose metadata hash
//!    matches.
//! 3. **Soft rules**, counted when more than one layout fits: every table code
//!    is a known dtype code; the header padding is zero; L1's extension block is
//!    zero. The layout breaking the fewest wins (ties: L1, L2, L3 order). In
//!    files the converters write only one layout ever fits.
//!
//! When no layout fits, the error is [`WeightsError::NotAKnownLayout`], listing
//! each layout tried and the rule it breaks, unless exactly one layout's header
//! rules matched: then that layout's own error (truncated header, dtype table
//! out of bounds, bad footer) is more precise and is returned. The model fields
//! are not used to tell layouts apart: L1, L2 and L3 store them identically up
//! to byte 80, and converters disagree on `aligned_*` (the safetensors converter
//! writes the raw dims). The checksum is not hashed while recognising:
//! [`WeightsFile::verify_checksum`] then hashes the recognised layout's range,
//! and a mismatch there ([`WeightsError::BadChecksum`], naming the layout and
//! the range) means the bytes of a known layout changed. Sidecars play no part
//! in recognition; [`WeightsFile::check_manifest`] then requires every entry to
//! lie inside the recognised layout's tensor data.
//!
//! # Dtype codes
//!
//! The dtype table holds one code per slot of the converter's own weight list,
//! which need not match the manifest one to one (a reserved `pos_emb` slot, bias
//! slots the file does not hold, no tokenizer entries): for their files
//! [`WeightsFile::check_manifest`] explains a difference in one line
//! ([`DtypeTableCheck::Hint`]) instead of treating it as an error, and holds
//! only files ckalloc wrote to one code per entry. The manifest's dtype names
//! win over codes. Code 6
//! is Q4_1 in `include/ckernel_dtype.h` but Q4_K from the HF converters:
//! [`WeightsFile::slot_dtypes`] reads it by [`Producer`] (the v5 metadata's
//! `created_by`, the manifest's `format` / `generator`) and reports
//! [`SlotDtype::Q4_1OrQ4_K`] ("q4_1 or q4_k (ambiguous)") when nothing says,
//! with no size computed from it.
//!
//! # Loading
//!
//! Offsets and sizes come from a sidecar manifest, as C-Kernel-Engine's v8
//! loader takes them from `weights_manifest.map`; the header is not used for
//! them. [`WeightsFile::load_manifest`] parses the sidecars (failing with
//! [`WeightsError::ManifestRequired`] when there are none: always for L4, whose
//! converters write no manifest and which C-Kernel-Engine's loader refuses),
//! and [`WeightsFile::check_manifest`] checks the manifest against the file
//! with every rule of the reader, in one place, returning a
//! [`CheckedManifest`]: the only kind of manifest an arena takes
//! ([`ArenaBuilder::manifest`](crate::ArenaBuilder::manifest)). What the
//! tensor checksum, the metadata hashes and the v5 `manifest_hash` each
//! verify, and what nothing binds, is stated once, in
//! [`WeightsFile`]'s documentation ("What verified means").
//! With an arena built on the file, arena offset == file offset: the weights
//! region is `[weights_base, activations_base)` where `weights_base` is the first
//! tensor's offset and `activations_base` the data end
//! ([`CheckedManifest::weights_region`], [`WriteReport::data_end`]).
//!
//! # Sidecars
//!
//! * `weights_manifest.map` — `# ck-bumpwgt5-manifest-map v1`, then
//!   `name|dtype|0xFILE_OFFSET|0xSIZE|0xRUNTIME_OFFSET` per tensor ([`Manifest::from_map`]).
//! * `weights_manifest.json` — `{"entries": [{"name", "dtype", "file_offset", "size",
//!   "shape"?}], ...}` ([`Manifest::from_json`]).
//!
//! Converters write the JSON manifest when given `--manifest-out`; its `version`
//! may say 5 for a `BUMPWGT4` file and is not compared with the magic. The `.map`
//! comes from C-Kernel-Engine's IR builder (`build_ir_v8.py --manifest-map-output`).
//! The HF converters' `--map-out` JSON and the IR builder's `weights_map.json`
//! name table slots and carry no offsets; they are not manifests.
//!
//! The manifest is the authority for offsets, sizes and dtypes; the dtype table
//! is a per-slot hint (see [`Dtype`] for codes, including the extension range
//! for types C-Kernel-Engine's table lacks). Every reader and constructor of
//! a [`Manifest`] applies the writer's name rule ([`check_name`]), so a
//! manifest always survives being written as a `.map` and read back.
//!
//! # Example
//!
//! ```
//! use ckalloc::weights::{
//!     CheckOptions, Container, Dtype, DtypeTableCheck, ManifestBinding, Version, WeightsFile,
//!     WeightsWriter,
//! };
//! let dir = tempfile::tempdir().unwrap();
//! let ids: Vec<u8> = (0..8i64).flat_map(|i| i.to_le_bytes()).collect();
//! let mut w = WeightsWriter::new(Version::V5);
//! w.add_tensor_with_shape("position_ids", Dtype::I64, &[1, 8], &ids[..]).unwrap();
//! let report = w.write_dir(dir.path()).unwrap();
//!
//! let file = WeightsFile::open(dir.path().join("weights.bump")).unwrap(); // read with pread
//! file.verify_checksum().unwrap();
//! assert_eq!(file.container(), Container::V8Converters);
//! let manifest = file.load_manifest(dir.path()).unwrap(); // parse the sidecars
//! let checked = file
//!     .check_manifest(manifest, CheckOptions::new().require_manifest_hash(true))
//!     .unwrap(); // every rule, and the v5 manifest_hash
//! assert_eq!(checked.binding(), ManifestBinding::ManifestHash);
//! assert_eq!(*checked.dtype_table(), DtypeTableCheck::Checked);
//! assert!(checked.warnings().is_empty());
//! let e = checked.get("position_ids").unwrap();
//! assert_eq!(e.dtype, "i64");
//! assert_eq!(&*file.tensor(e).unwrap(), &ids[..]);
//! assert_eq!(checked.weights_region(), (report.weights_base, report.data_end));
//! ```
//!
//! # Thread safety
//!
//! [`WeightsFile`], [`Manifest`] and [`CheckedManifest`] are immutable and
//! `Send + Sync`; a [`WeightsFile`] read with `pread` may be read from several
//! threads at once.
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
//! buffer): [`check_name`], which every reader applies too. Files are written unnamed (`O_TMPFILE`; named temporary files on
//! filesystems without it), synced and then linked or renamed into place (see
//! [`WeightsWriter::write_dir_with_progress`]); on error nothing is left behind.
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
//!   tensors, so the one-code-per-entry rule of
//!   [`WeightsFile::check_manifest`] applies to ckalloc files only.
//! * **Metadata**: ckalloc omits `created_at`, so identical input gives
//!   identical files. Canonical JSON spells floats as Python does
//!   ([`canonical_json`]), so a `manifest_hash` written by either side
//!   verifies on the other.
//! * **`.map` parsing** is stricter than the C loader: exactly five fields,
//!   and a decimal number with a leading zero is rejected (C's
//!   `strtoull(s, NULL, 0)` reads it as octal).
//! * **Files that change**: [`WeightsFile::open`] reads with `pread`, so a
//!   file truncated underneath gives [`WeightsError::FileChanged`];
//!   [`WeightsFile::open_mapped`] and the arena's mixed mode map it, and a
//!   truncation then raises `SIGBUS` on access, which a library cannot turn
//!   into an error. A program that maps files it does not control installs
//!   its own `SIGBUS` handler (the `ckalloc` CLI reports one as an error line
//!   and exit status 1).
//! * **Names** are held to the writer's rule on read as well ([`check_name`]),
//!   where C-Kernel-Engine's C loader takes whatever precedes the first `|`.

// Each file uses only files before it in this order (and `crate::sys`,
// `crate::Escaped`): binding, container, error, bytes, canonical, dtype,
// header, dims, entry, manifest, report, sidecars, writer, placement, write,
// file, check.
mod binding;
mod bytes;
mod canonical;
mod check;
mod container;
mod dims;
mod dtype;
mod entry;
mod error;
mod file;
mod header;
mod manifest;
mod placement;
mod report;
mod sidecars;
mod write;
mod writer;

pub use binding::ManifestBinding;
pub use canonical::canonical_json;
pub use check::{CheckOptions, CheckedManifest, DtypeTableCheck, ManifestWarning};
pub use container::{
    Container, LayoutOffsets, LayoutRejection, Version, HEADER_SIZE, L1_OFFSETS, L2_OFFSETS,
    L3_OFFSETS, L4_OFFSETS, MAGIC_V3, MAGIC_V4, MAGIC_V5,
};
pub use dims::{ModelDims, CACHE_ALIGN};
pub use dtype::{Dtype, Producer, SlotDtype, EXTENSION_CODE_BASE};
pub use entry::{check_name, ManifestEntry, MAX_NAME_LEN};
pub use error::{ManifestKind, WeightsError};
pub use file::WeightsFile;
pub use header::{Header, HeaderDims, MetadataFooter, FOOTER_MAGIC, FOOTER_SIZE};
pub use manifest::Manifest;
pub use report::{Gap, LayoutReport, Overlap};
pub use sidecars::{read_text_file, MANIFEST_JSON, MANIFEST_MAP, MAX_SIDECAR_BYTES};
pub use writer::{
    Plan, WeightsWriter, WriteReport, CHECKSUM_OFFSET, DATA_START, DEFAULT_ALIGNMENT,
    DTYPE_TABLE_OFFSET, EXT_METADATA_SIZE, MAX_ALIGNMENT, WEIGHTS_FILE,
};
