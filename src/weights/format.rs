//! Byte layout of the `weights.bump` header and the v5 footer, and canonical JSON.

use sha2::{Digest, Sha256};

use super::container::{Container, HEADER_SIZE, L1_OFFSETS};
use super::source::Source;
use super::WeightsError;

/// Magic of a version-3 file (layout L4 only).
pub const MAGIC_V3: [u8; 8] = *b"BUMPWGT3";
/// Magic of a version-4 file (layouts L1, L2 or L3).
pub const MAGIC_V4: [u8; 8] = *b"BUMPWGT4";
/// Magic of a version-5 file (layouts L1 or L2, with the metadata footer).
pub const MAGIC_V5: [u8; 8] = *b"BUMPWGT5";
/// Magic of the version-5 metadata footer.
pub const FOOTER_MAGIC: [u8; 8] = *b"BUMPV5MD";
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
/// Size of the version-5 metadata footer (bytes).
pub const FOOTER_SIZE: u64 = 48;
/// The element alignment C-Kernel-Engine's converters use for `aligned_*` dims (bytes).
pub const CACHE_ALIGN: u64 = 64;

/// Container version: the digit of the magic, repeated as the u32 at offset 8.
/// `#[non_exhaustive]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Version {
    /// `BUMPWGT3`: layout L4 (read only; ckalloc does not write it).
    V3,
    /// `BUMPWGT4`: header, dtype table, tensor data.
    V4,
    /// `BUMPWGT5`: as V4, then canonical JSON metadata and a 48-byte footer.
    V5,
}

impl Version {
    /// The number in the header (3, 4 or 5).
    pub fn number(self) -> u32 {
        match self {
            Version::V3 => 3,
            Version::V4 => 4,
            Version::V5 => 5,
        }
    }

    /// The version for a header number, or `None`.
    pub fn from_number(n: u32) -> Option<Version> {
        match n {
            3 => Some(Version::V3),
            4 => Some(Version::V4),
            5 => Some(Version::V5),
            _ => None,
        }
    }

    /// The 8-byte magic.
    pub fn magic(self) -> [u8; 8] {
        match self {
            Version::V3 => MAGIC_V3,
            Version::V4 => MAGIC_V4,
            Version::V5 => MAGIC_V5,
        }
    }
}

/// The model fields ckalloc's writer puts in an L1 header (offsets 12..88). All
/// counts are elements, not bytes. `#[non_exhaustive]`: build with
/// `ModelDims::default()` and set fields. The reader returns [`HeaderDims`],
/// whose fields a layout lacks are `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ModelDims {
    /// Offset 12. C-Kernel-Engine writes 1 ("legacy placeholder"); ckalloc's writer too.
    pub model_type: u32,
    /// Offset 16.
    pub num_layers: u32,
    /// Offset 20.
    pub vocab_size: u32,
    /// Offset 24 (hidden size).
    pub embed_dim: u32,
    /// Offset 28.
    pub intermediate_size: u32,
    /// Offset 32 (maximum positions).
    pub context_len: u32,
    /// Offset 36.
    pub num_heads: u32,
    /// Offset 40.
    pub num_kv_heads: u32,
    /// Offset 44.
    pub head_dim: u32,
    /// Offset 48 (u64).
    pub aligned_embed_dim: u64,
    /// Offset 56 (u64).
    pub aligned_head_dim: u64,
    /// Offset 64 (u64).
    pub aligned_intermediate: u64,
    /// Offset 72 (u64).
    pub aligned_context: u64,
    /// Offset 80: number of BPE merges stored with the weights (0 if none).
    pub num_merges: u32,
    /// Offset 84: bytes of vocabulary strings stored with the weights (0 if none).
    pub total_vocab_bytes: u32,
}

/// Round `elems` elements of `elem_bytes` bytes up so the row is a multiple of
/// `align_bytes`, as C-Kernel-Engine's `align_up_elems`. `None` on overflow.
fn align_up_elems(elems: u64, elem_bytes: u64, align_bytes: u64) -> Option<u64> {
    let bytes = elems.checked_mul(elem_bytes)?;
    Some(bytes.checked_next_multiple_of(align_bytes)? / elem_bytes)
}

impl ModelDims {
    /// Set the four `aligned_*` fields the way C-Kernel-Engine's HF converter does
    /// for fp32 weights: each count rounded up so that the row of 4-byte floats
    /// is a multiple of 64 bytes (16 elements).
    pub fn fill_aligned_fp32(&mut self) {
        let a = |x: u32| align_up_elems(u64::from(x), 4, CACHE_ALIGN).unwrap_or(u64::from(x));
        self.aligned_embed_dim = a(self.embed_dim);
        self.aligned_head_dim = a(self.head_dim);
        self.aligned_intermediate = a(self.intermediate_size);
        self.aligned_context = a(self.context_len);
    }

    /// Derive the header fields from a Hugging Face `config.json`, with the key
    /// fallbacks of C-Kernel-Engine's `convert_hf_to_bump` (first key present wins):
    ///
    /// | field | keys |
    /// |---|---|
    /// | num_layers | `num_hidden_layers`, `num_layers`, `n_layer` |
    /// | embed_dim | `hidden_size`, `embed_dim`, `n_embd`, `d_model` |
    /// | intermediate_size | `intermediate_size`, `n_inner`, `ffn_dim` |
    /// | num_heads | `num_attention_heads`, `num_heads`, `n_head` |
    /// | num_kv_heads | `num_key_value_heads`, `num_kv_heads` (default: num_heads) |
    /// | vocab_size | `vocab_size` |
    /// | context_len | `max_position_embeddings`, `context_window`, `n_positions`, `n_ctx` |
    /// | head_dim | `head_dim` (default: embed_dim / num_heads) |
    ///
    /// Missing keys give 0. `model_type` is 1 (C-Kernel-Engine's placeholder); the
    /// `aligned_*` fields are filled by [`fill_aligned_fp32`](Self::fill_aligned_fp32).
    ///
    /// # Errors
    /// [`WeightsError::Json`] if the text is not a JSON object;
    /// [`WeightsError::ConfigField`] if a present key is not an integer in `0..=u32::MAX`.
    pub fn from_config_json(text: &str) -> Result<ModelDims, WeightsError> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|source| WeightsError::Json {
                what: "config.json",
                source,
            })?;
        let obj = v.as_object().ok_or_else(|| WeightsError::ConfigField {
            field: "<root>".into(),
            message: "expected a JSON object".into(),
        })?;
        let pick = |keys: &[&str]| -> Result<Option<u32>, WeightsError> {
            for k in keys {
                if let Some(x) = obj.get(*k) {
                    if x.is_null() {
                        continue;
                    }
                    let n = x.as_u64().ok_or_else(|| WeightsError::ConfigField {
                        field: (*k).into(),
                        message: format!("expected a non-negative integer, found {x}"),
                    })?;
                    let n = u32::try_from(n).map_err(|_| WeightsError::ConfigField {
                        field: (*k).into(),
                        message: format!("{n} does not fit the header's u32"),
                    })?;
                    return Ok(Some(n));
                }
            }
            Ok(None)
        };
        let mut d = ModelDims {
            model_type: 1,
            num_layers: pick(&["num_hidden_layers", "num_layers", "n_layer"])?.unwrap_or(0),
            embed_dim: pick(&["hidden_size", "embed_dim", "n_embd", "d_model"])?.unwrap_or(0),
            intermediate_size: pick(&["intermediate_size", "n_inner", "ffn_dim"])?.unwrap_or(0),
            num_heads: pick(&["num_attention_heads", "num_heads", "n_head"])?.unwrap_or(0),
            vocab_size: pick(&["vocab_size"])?.unwrap_or(0),
            context_len: pick(&[
                "max_position_embeddings",
                "context_window",
                "n_positions",
                "n_ctx",
            ])?
            .unwrap_or(0),
            ..ModelDims::default()
        };
        d.num_kv_heads = pick(&["num_key_value_heads", "num_kv_heads"])?.unwrap_or(d.num_heads);
        d.head_dim = match pick(&["head_dim"])? {
            Some(h) => h,
            None => d.embed_dim.checked_div(d.num_heads).unwrap_or(0),
        };
        d.fill_aligned_fp32();
        Ok(d)
    }

    /// The fields as a JSON object (used for the v5 metadata `config` and the
    /// JSON manifest). Keys follow C-Kernel-Engine's metadata (`context_length`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "intermediate_size": self.intermediate_size,
            "context_length": self.context_len,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "aligned_embed_dim": self.aligned_embed_dim,
            "aligned_head_dim": self.aligned_head_dim,
            "aligned_intermediate": self.aligned_intermediate,
            "aligned_context": self.aligned_context,
            "num_merges": self.num_merges,
            "total_vocab_bytes": self.total_vocab_bytes,
        })
    }
}

/// The v5 footer, as found at the end of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetadataFooter {
    /// Offset of the metadata JSON (bytes) = end of tensor data.
    pub offset: u64,
    /// Length of the metadata JSON (bytes).
    pub len: u64,
    /// SHA-256 of the metadata JSON (verified when the file is parsed).
    pub sha256: [u8; 32],
}

/// The model fields of a parsed header. All counts are elements, not bytes.
/// A field the file's layout does not have is `None` (see the
/// [layout table](super#layouts)); offsets below are L1's, L2's and L3's, then L4's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct HeaderDims {
    /// Offset 12 (L4: 12). C-Kernel-Engine writes 1.
    pub model_type: u32,
    /// Offset 16 (L4: 16).
    pub num_layers: u32,
    /// Offset 20 (L4: 20).
    pub vocab_size: u32,
    /// Offset 24 (L4: 24).
    pub embed_dim: u32,
    /// Offset 28; L4 has none.
    pub intermediate_size: Option<u32>,
    /// Offset 32 (L4: 28).
    pub context_len: u32,
    /// Offset 36 (L4: 32).
    pub num_heads: u32,
    /// Offset 40; L4 has none.
    pub num_kv_heads: Option<u32>,
    /// Offset 44 (L4: 36).
    pub head_dim: u32,
    /// Offset 48, u64 (L4: 40).
    pub aligned_embed_dim: u64,
    /// Offset 56, u64 (L4: 48).
    pub aligned_head_dim: u64,
    /// Offset 64, u64; L4 has none.
    pub aligned_intermediate: Option<u64>,
    /// Offset 72, u64 (L4: 56).
    pub aligned_context: u64,
    /// Offset 80, L1 and L3 only (L2 keeps checksum bytes there).
    pub num_merges: Option<u32>,
    /// Offset 84, L1 and L3 only.
    pub total_vocab_bytes: Option<u32>,
}

impl HeaderDims {
    /// The fields as a JSON object with the keys of [`ModelDims::to_json`];
    /// fields the layout lacks are left out.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                m.insert(k.into(), v.into());
            }
        };
        put("model_type", Some(self.model_type.into()));
        put("num_layers", Some(self.num_layers.into()));
        put("vocab_size", Some(self.vocab_size.into()));
        put("embed_dim", Some(self.embed_dim.into()));
        put("intermediate_size", self.intermediate_size.map(u64::from));
        put("context_length", Some(self.context_len.into()));
        put("num_heads", Some(self.num_heads.into()));
        put("num_kv_heads", self.num_kv_heads.map(u64::from));
        put("head_dim", Some(self.head_dim.into()));
        put("aligned_embed_dim", Some(self.aligned_embed_dim));
        put("aligned_head_dim", Some(self.aligned_head_dim));
        put("aligned_intermediate", self.aligned_intermediate);
        put("aligned_context", Some(self.aligned_context));
        put("num_merges", self.num_merges.map(u64::from));
        put("total_vocab_bytes", self.total_vocab_bytes.map(u64::from));
        serde_json::Value::Object(m)
    }
}

impl From<ModelDims> for HeaderDims {
    /// The fields of an L1 header written with `d`.
    fn from(d: ModelDims) -> HeaderDims {
        HeaderDims {
            model_type: d.model_type,
            num_layers: d.num_layers,
            vocab_size: d.vocab_size,
            embed_dim: d.embed_dim,
            intermediate_size: Some(d.intermediate_size),
            context_len: d.context_len,
            num_heads: d.num_heads,
            num_kv_heads: Some(d.num_kv_heads),
            head_dim: d.head_dim,
            aligned_embed_dim: d.aligned_embed_dim,
            aligned_head_dim: d.aligned_head_dim,
            aligned_intermediate: Some(d.aligned_intermediate),
            aligned_context: d.aligned_context,
            num_merges: Some(d.num_merges),
            total_vocab_bytes: Some(d.total_vocab_bytes),
        }
    }
}

/// A parsed header: the layout, the fixed fields and the derived region
/// boundaries. All offsets are bytes from the start of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Header {
    /// The layout recognised (see [`Container`]); every field below is read at
    /// that layout's offsets.
    pub container: Container,
    /// 3, 4 or 5 (the magic and the version field agree).
    pub version: Version,
    /// The model fields; those the layout lacks are `None`.
    pub dims: HeaderDims,
    /// The stored SHA-256 (at `container.offsets().checksum`) of bytes
    /// [`checksum_range`](Self::checksum_range).
    pub checksum: [u8; 32],
    /// Number of dtype-table entries (the u32 at `container.offsets().dtype_count`).
    pub dtype_table_len: u32,
    /// First byte after the dtype table (`dtype_table() + dtype_table_len`).
    pub tensor_data_start: u64,
    /// End of tensor data (exclusive): the metadata offset of a `BUMPWGT5` file,
    /// else the file length.
    pub data_end: u64,
    /// File length.
    pub file_len: u64,
    /// The v5 footer (`None` for `BUMPWGT3`/`BUMPWGT4`).
    pub footer: Option<MetadataFooter>,
    /// True when the layout's zero bytes are not all zero: the header padding
    /// (L1 and L3: 120..128) or L1's extension block 128..152. Accepted, but
    /// worth reporting.
    pub reserved_nonzero: bool,
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    /// Recognise the layout of a whole file's bytes and parse its header (the v5
    /// footer is at the end, so `file` must be the complete file). Reads nothing
    /// outside `file` and hashes only the v5 metadata. The rules are listed in the
    /// [module documentation](super#how-the-reader-recognises-the-layout).
    ///
    /// Checks, in order: magic (`WrongMagic`), version (`UnknownVersion`), length
    /// (`TruncatedHeader`), then each layout the magic allows. When no layout
    /// fits, the error is the one layout's own (`TruncatedHeader`,
    /// `DtypeTableOutOfBounds`, `BadFooter`, `BadMetadataChecksum`) if exactly one
    /// layout's header rules matched, else `NotAKnownLayout` listing every layout
    /// tried and why. It does not hash the tensor data: call
    /// [`WeightsFile::verify_checksum`](super::WeightsFile::verify_checksum).
    ///
    /// # Errors
    /// The variants named above.
    pub fn parse(file: &[u8]) -> Result<Header, WeightsError> {
        super::container::detect(&super::source::Memory(file)).map(|d| d.header)
    }

    /// The layout's offsets.
    pub fn offsets(&self) -> &'static super::LayoutOffsets {
        self.container.offsets()
    }

    /// Offset of the first dtype-table code.
    pub fn dtype_table_offset(&self) -> u64 {
        self.container.offsets().dtype_table()
    }

    /// The bytes the stored checksum covers, `[start, end)`: `[152, data_end)`
    /// for L1, `[128, data_end)` for L2, L3 and L4 (L3 and L4 end at the end of
    /// the file).
    pub fn checksum_range(&self) -> (u64, u64) {
        (self.container.offsets().hash_start, self.data_end)
    }

    /// The first [`DATA_START`] bytes of a file with these fields: magic, version,
    /// dims, checksum, then zeros up to offset 152.
    pub(crate) fn encode_fixed(version: Version, dims: &ModelDims, checksum: &[u8; 32]) -> Vec<u8> {
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
}

/// Read and check the v5 footer at the end of `file` and the metadata it
/// points to (whose SHA-256 it records). Returns the footer and the
/// metadata bytes.
pub(crate) fn parse_footer(
    file: &dyn Source,
    tensor_data_start: u64,
) -> Result<(MetadataFooter, Vec<u8>), WeightsError> {
    let file_len = file.len();
    let bad = |reason: String| WeightsError::BadFooter { reason };
    let room = file_len - tensor_data_start; // tensor_data_start <= file_len checked by caller
    if room < FOOTER_SIZE {
        return Err(bad(format!(
            "file is {file_len} bytes: no room for the {FOOTER_SIZE}-byte footer after the dtype table ending at {tensor_data_start}"
        )));
    }
    let fstart = file_len - FOOTER_SIZE;
    let footer = file.read(fstart, FOOTER_SIZE)?;
    if footer[..8] != FOOTER_MAGIC {
        return Err(bad(format!(
            "magic at offset {fstart} is \"{}\", expected \"BUMPV5MD\"",
            crate::Escaped::new(&String::from_utf8_lossy(&footer[..8]))
        )));
    }
    let len = u64_at(&footer, 8);
    let mut sha256 = [0u8; 32];
    sha256.copy_from_slice(&footer[16..48]);
    if len > room - FOOTER_SIZE {
        return Err(bad(format!(
            "metadata length {len} exceeds the {} bytes between the dtype table and the footer",
            room - FOOTER_SIZE
        )));
    }
    let offset = fstart - len;
    let meta = file.read(offset, len)?.into_owned();
    let actual: [u8; 32] = Sha256::digest(&meta).into();
    if actual != sha256 {
        return Err(WeightsError::BadMetadataChecksum {
            expected: sha256,
            actual,
        });
    }
    Ok((
        MetadataFooter {
            offset,
            len,
            sha256,
        },
        meta,
    ))
}

/// Canonical JSON bytes, as C-Kernel-Engine's
/// `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`
/// (`_canonical_json_bytes` in its converters): object keys sorted by code
/// point at every level, no whitespace, every character outside
/// `0x20..=0x7E` escaped as `\uXXXX` (lowercase hex, surrogate pairs above
/// U+FFFF), integers as decimal, and floats spelled as Python's `repr`
/// spells them: the shortest digits that read back to the same `f64`, fixed
/// notation with at least one decimal (`10000.0`, `0.0001`) for decimal
/// exponents from -4 to 15, scientific with a signed two-digit exponent
/// otherwise (`1e-05`, `1e+16`). The v5 `manifest_hash` and `template_hash`
/// are SHA-256 digests of these bytes.
///
/// Where serde_json reads JSON differently from Python, the bytes differ and
/// a `manifest_hash` computed by Python does not verify (no converter
/// writes these): an integer beyond the 64-bit range and the integer `-0`
/// are read as floats (Python keeps integers exact and reads `-0` as `0`);
/// `NaN`, `Infinity`, lone UTF-16 surrogates and nesting deeper than 128
/// levels are refused (Python's `json` accepts them).
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    use serde::Serialize as _;
    let sorted = sort_keys(value);
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, AsciiFormatter);
    // Serializing a Value into a Vec cannot fail.
    let _ = sorted.serialize(&mut ser);
    out
}

/// Among the shortest digit strings that read back to `x` (positive), the
/// one nearest to `x`, ties to an even last digit, as Python's `repr` (David
/// Gay's `dtoa` mode 0) picks it. `digits` (exponent `exp`: the value is
/// `d.ddd x 10^exp`) is Rust's shortest, which can be the other neighbour of
/// an exact tie (Rust prints `570724280910275.3` where the double is
/// `...275.25` and Python prints `...275.2`); the neighbours one unit away in
/// the last digit are compared with the exact value.
fn nearest_shortest(x: f64, digits: String, exp: i32) -> String {
    let Some(last) = digits.bytes().last().map(|b| b - b'0') else {
        return digits;
    };
    let head = &digits[..digits.len() - 1];
    let reads_back = |d: &str| {
        let (first, rest) = d.split_at(1);
        format!("{first}.{rest}0e{exp}").parse::<f64>().ok() == Some(x)
    };
    // The exact decimal value of x: at most 767 significant digits.
    let exact = format!("{x:.800e}");
    let (em, ee) = exact.split_once('e').unwrap_or((&exact, "0"));
    let ee: i32 = ee.parse().unwrap_or(exp);
    let exact_digits: String = em.chars().filter(|c| *c != '.').collect();
    // Compare the exact value with `m` (digits at exponent `exp`).
    let cmp_exact = |m: &str| {
        if ee != exp {
            return ee.cmp(&exp);
        }
        let width = exact_digits.len().max(m.len());
        let a = format!("{exact_digits:0<width$}");
        let b = format!("{m:0<width$}");
        a.cmp(&b)
    };
    let mut best = digits.clone();
    for neighbour in [last.checked_sub(1), (last < 9).then_some(last + 1)]
        .into_iter()
        .flatten()
        .filter(|&d| d != 0 || !head.is_empty())
    {
        let cand = format!("{head}{neighbour}");
        if !reads_back(&cand) {
            continue;
        }
        let (lo, hi) = if neighbour < last {
            (cand.clone(), digits.clone())
        } else {
            (digits.clone(), cand.clone())
        };
        let mid = format!("{lo}5");
        best = match cmp_exact(&mid) {
            std::cmp::Ordering::Less => lo,
            std::cmp::Ordering::Greater => hi,
            std::cmp::Ordering::Equal => {
                if (lo.as_bytes()[lo.len() - 1] - b'0').is_multiple_of(2) {
                    lo
                } else {
                    hi
                }
            }
        };
        break;
    }
    best
}

/// `x` spelled as Python's `repr(float)` (finite values only; JSON has no
/// others): see [`canonical_json`].
pub(crate) fn python_float(x: f64) -> String {
    // `{:e}` gives the shortest round-trip digits: "1.2345e-5", "-0e0".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let digits = nearest_shortest(x.abs(), digits, exp);
    let n = digits.len() as i32;
    // Python's decimal point position: the value is 0.DIGITS x 10^decpt.
    let decpt = exp + 1;
    if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= n {
            format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.unsigned_abs())
    }
}

fn sort_keys(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), sort_keys(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

/// Compact formatter that escapes non-ASCII and DEL like Python's
/// `ensure_ascii` and spells floats like Python's `repr`.
struct AsciiFormatter;

impl serde_json::ser::Formatter for AsciiFormatter {
    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        value: f32,
    ) -> std::io::Result<()> {
        self.write_f64(w, f64::from(value))
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if (' '..='~').contains(&c) {
                continue;
            }
            w.write_all(&fragment.as_bytes()[start..i])?;
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                write!(w, "\\u{:04x}", u)?;
            }
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::python_float;

    #[test]
    fn floats_are_spelled_as_python_repr_spells_them() {
        // Each pair: Rust value, Python 3's repr() of the same double.
        let cases: [(f64, &str); 21] = [
            (1e-05, "1e-05"),
            (10000.0, "10000.0"),
            (1.0, "1.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1e22, "1e+22"),
            (9007199254740993.0, "9007199254740992.0"),
            (2.5e-5, "2.5e-05"),
            (-1e-12, "-1e-12"),
            (1.25e15, "1250000000000000.0"),
            // Exact ties between two shortest spellings: Python rounds half to even.
            (f64::from_bits(0x4300_3890_d03a_0e1a), "570724280910275.2"),
            (0.3, "0.3"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float(x), want, "{x:e}");
        }
    }
}
