//! The header of a `weights.bump`: the fields of its layout, the v5 footer
//! and metadata, and the recognition of the layout
//! ([`Header::parse`], `detect`; the rules are in the module documentation).

use sha2::{Digest, Sha256};

use super::bytes::{u32_at, u64_at, Memory, Source};
use super::canonical::canonical_json;
use super::container::{
    Container, LayoutOffsets, LayoutRejection, Version, HEADER_SIZE, L1_OFFSETS,
};
use super::dtype::Dtype;
use super::error::WeightsError;

/// Magic of the version-5 metadata footer.
pub const FOOTER_MAGIC: [u8; 8] = *b"BUMPV5MD";
/// Size of the version-5 metadata footer (bytes).
pub const FOOTER_SIZE: u64 = 48;

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
    /// The fields as a JSON object with the keys of [`ModelDims::to_json`](super::ModelDims::to_json);
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
    /// Rule 10 of [`WeightsFile::check_manifest`](super::WeightsFile::check_manifest):
    /// every `aligned_*` field smaller than the count it pads, and every
    /// field that `config` (the v5 metadata's) records under its
    /// [`to_json`](Self::to_json) key as another unsigned integer, joined
    /// with `"; "`; `None` when nothing disagrees. A `config` value of
    /// another type (C-Kernel-Engine's `"model": "llama"`) is not compared.
    pub(crate) fn disagreement(&self, config: Option<&serde_json::Value>) -> Option<String> {
        let fields = self.to_json();
        let field = |k: &str| fields.get(k).and_then(|v| v.as_u64());
        let mut found = Vec::new();
        for (aligned, count) in [
            ("aligned_embed_dim", "embed_dim"),
            ("aligned_head_dim", "head_dim"),
            ("aligned_intermediate", "intermediate_size"),
            ("aligned_context", "context_length"),
        ] {
            if let (Some(a), Some(c)) = (field(aligned), field(count)) {
                if a < c {
                    found.push(format!("{aligned} {a} is less than {count} {c}"));
                }
            }
        }
        if let (Some(config), serde_json::Value::Object(header)) = (config, &fields) {
            for (key, value) in header {
                let recorded = config.get(key).and_then(|v| v.as_u64());
                if let (Some(recorded), Some(value)) = (recorded, value.as_u64()) {
                    if recorded != value {
                        found.push(format!(
                            "{key} {value} in the header, {recorded} in the v5 metadata's config"
                        ));
                    }
                }
            }
        }
        (!found.is_empty()).then(|| found.join("; "))
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
        detect(&Memory(file)).map(|d| d.header)
    }

    /// The layout's offsets.
    pub fn offsets(&self) -> &'static LayoutOffsets {
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

/// A layout whose structure does not fit: either an error specific to that
/// layout's bytes (truncation, dtype table, footer), or a broken rule.
enum Misfit {
    Specific(WeightsError),
    Rule(String),
}

impl Misfit {
    fn reason(&self) -> String {
        match self {
            Misfit::Specific(e) => e.to_string(),
            Misfit::Rule(r) => r.clone(),
        }
    }
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// The header-only rules that identify a layout (see the module docs).
fn identify(c: Container, file: &[u8]) -> Result<(), String> {
    match c {
        Container::V8Converters | Container::V65GgufConverters => {
            if all_zero(&file[112..120]) {
                return Err(
                    "bytes 112..120 (the end of the checksum field at 88..120) are all zero".into(),
                );
            }
            if c == Container::V65GgufConverters {
                match file.get(128..132) {
                    None => return Err("the file ends before the dtype-table count at 128".into()),
                    Some(_) if u32_at(file, 128) == 0 => {
                        return Err(
                            "the u32 at 128 is 0: no dtype table starts there (an L1 file's zero block does)"
                                .into(),
                        )
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        }
        Container::V4HeaderConverters => {
            if !all_zero(&file[112..128]) {
                return Err(
                    "bytes 112..128 are not all zero (L2's checksum ends at 112, zeros follow)"
                        .into(),
                );
            }
            Ok(())
        }
        Container::BareHfConverter => {
            if !all_zero(&file[96..128]) {
                return Err(
                    "bytes 96..128 are not all zero (L4's checksum ends at 96, zeros follow)"
                        .into(),
                );
            }
            Ok(())
        }
    }
}

fn read_dims(c: Container, file: &[u8]) -> HeaderDims {
    match c {
        Container::BareHfConverter => HeaderDims {
            model_type: u32_at(file, 12),
            num_layers: u32_at(file, 16),
            vocab_size: u32_at(file, 20),
            embed_dim: u32_at(file, 24),
            intermediate_size: None,
            context_len: u32_at(file, 28),
            num_heads: u32_at(file, 32),
            num_kv_heads: None,
            head_dim: u32_at(file, 36),
            aligned_embed_dim: u64_at(file, 40),
            aligned_head_dim: u64_at(file, 48),
            aligned_intermediate: None,
            aligned_context: u64_at(file, 56),
            num_merges: None,
            total_vocab_bytes: None,
        },
        _ => {
            let merges = c != Container::V4HeaderConverters;
            HeaderDims {
                model_type: u32_at(file, 12),
                num_layers: u32_at(file, 16),
                vocab_size: u32_at(file, 20),
                embed_dim: u32_at(file, 24),
                intermediate_size: Some(u32_at(file, 28)),
                context_len: u32_at(file, 32),
                num_heads: u32_at(file, 36),
                num_kv_heads: Some(u32_at(file, 40)),
                head_dim: u32_at(file, 44),
                aligned_embed_dim: u64_at(file, 48),
                aligned_head_dim: u64_at(file, 56),
                aligned_intermediate: Some(u64_at(file, 64)),
                aligned_context: u64_at(file, 72),
                num_merges: merges.then(|| u32_at(file, 80)),
                total_vocab_bytes: merges.then(|| u32_at(file, 84)),
            }
        }
    }
}

/// A layout whose structure fits, with the number of soft rules it breaks.
struct Fit {
    detected: Detected,
    soft: usize,
}

/// What [`detect`] reads: the header, and the bytes a reader keeps in
/// memory (the dtype table and the v5 metadata, already checked against the
/// footer's SHA-256).
pub(crate) struct Detected {
    pub(crate) header: Header,
    pub(crate) table: Vec<u8>,
    pub(crate) metadata: Option<Vec<u8>>,
}

/// The structural rules of one identified layout; `head` is the first
/// `min(file length, L1's minimum length)` bytes of `file`.
fn structure(
    c: Container,
    version: Version,
    file: &dyn Source,
    head: &[u8],
) -> Result<Fit, Misfit> {
    let file_len = file.len();
    let o = c.offsets();
    if file_len < c.min_len() {
        return Err(Misfit::Specific(WeightsError::TruncatedHeader {
            len: file_len,
            needed: c.min_len(),
        }));
    }
    let dtype_table_len = u32_at(head, o.dtype_count as usize);
    if dtype_table_len == 0 && c != Container::V8Converters {
        return Err(Misfit::Rule(format!(
            "the dtype-table count at {} is 0 ({} converters write one slot per weight)",
            o.dtype_count,
            c.label()
        )));
    }
    let tensor_data_start = o.dtype_table() + u64::from(dtype_table_len);
    if tensor_data_start > file_len {
        return Err(Misfit::Specific(WeightsError::DtypeTableOutOfBounds {
            table_len: dtype_table_len,
            table_offset: o.dtype_table(),
            file_len,
        }));
    }
    let (footer, metadata): (Option<MetadataFooter>, Option<Vec<u8>>) = match version {
        Version::V5 => {
            let (f, m) = parse_footer(file, tensor_data_start).map_err(Misfit::Specific)?;
            (Some(f), Some(m))
        }
        _ => (None, None),
    };
    let data_end = footer.map_or(file_len, |f| f.offset);
    let mut checksum = [0u8; 32];
    checksum.copy_from_slice(&head[o.checksum as usize..o.checksum as usize + 32]);
    let table = file
        .read(o.dtype_table(), u64::from(dtype_table_len))
        .map_err(Misfit::Specific)?
        .into_owned();
    // Soft rules: a fitting layout that breaks fewer of them wins.
    let unknown_codes = table.iter().any(|&code| Dtype::from_code(code).is_none());
    let padding_nonzero = !all_zero(&head[o.header_padding as usize..HEADER_SIZE as usize]);
    let block_nonzero = c == Container::V8Converters
        && !all_zero(&head[HEADER_SIZE as usize..o.hash_start as usize]);
    let soft =
        usize::from(unknown_codes) + usize::from(padding_nonzero) + usize::from(block_nonzero);
    Ok(Fit {
        detected: Detected {
            header: Header {
                container: c,
                version,
                dims: read_dims(c, head),
                checksum,
                dtype_table_len,
                tensor_data_start,
                data_end,
                file_len,
                footer,
                reserved_nonzero: padding_nonzero || block_nonzero,
            },
            table,
            metadata,
        },
        soft,
    })
}

/// Recognise the layout of a whole file and parse its header. See the
/// [module documentation](super#how-the-reader-recognises-the-layout).
pub(crate) fn detect(file: &dyn Source) -> Result<Detected, WeightsError> {
    let file_len = file.len();
    let head = file.read(0, file_len.min(L1_OFFSETS.dtype_table()))?;
    let head: &[u8] = &head;
    let truncated = |needed| WeightsError::TruncatedHeader {
        len: file_len,
        needed,
    };
    if head.len() < 8 {
        return Err(truncated(L1_OFFSETS.dtype_table()));
    }
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&head[..8]);
    if &magic[..7] != b"BUMPWGT" {
        return Err(WeightsError::WrongMagic { found: magic });
    }
    let candidates: Vec<Container> = Container::ALL
        .into_iter()
        .filter(|c| c.versions().iter().any(|v| v.magic() == magic))
        .collect();
    let needed = candidates
        .iter()
        .map(|c| c.min_len())
        .max()
        .unwrap_or(L1_OFFSETS.dtype_table());
    if head.len() < 12 {
        return Err(truncated(needed));
    }
    let version_field = u32_at(head, 8);
    let version = match Version::from_number(version_field) {
        Some(v) if v.magic() == magic && !candidates.is_empty() => v,
        _ => {
            return Err(WeightsError::UnknownVersion {
                magic,
                version: version_field,
            })
        }
    };
    if file_len < HEADER_SIZE {
        return Err(truncated(needed));
    }
    let mut fits: Vec<Fit> = Vec::new();
    // Layouts whose header rules matched but whose structure does not fit.
    let mut identified: Vec<Misfit> = Vec::new();
    // In `Container::ALL` order, as `candidates`.
    let mut tried: Vec<LayoutRejection> = Vec::new();
    for &c in &candidates {
        match identify(c, head) {
            Err(reason) => tried.push(LayoutRejection {
                container: c,
                reason,
            }),
            Ok(()) => match structure(c, version, file, head) {
                Ok(fit) => fits.push(fit),
                // The file could not be read: no layout can be judged.
                Err(Misfit::Specific(
                    e @ (WeightsError::Io { .. } | WeightsError::FileChanged { .. }),
                )) => return Err(e),
                Err(m) => {
                    tried.push(LayoutRejection {
                        container: c,
                        reason: m.reason(),
                    });
                    identified.push(m);
                }
            },
        }
    }
    // Fewest soft-rule breaks wins; ties go to the earlier layout in `Container::ALL`.
    if let Some(best) = fits.into_iter().min_by_key(|f| f.soft) {
        return Ok(best.detected);
    }
    // Exactly one layout's header matched: its own error is the most precise.
    if identified.len() == 1 {
        if let Some(Misfit::Specific(e)) = identified.pop() {
            return Err(e);
        }
    }
    Err(WeightsError::NotAKnownLayout { magic, tried })
}

/// The v5 metadata as JSON, with its recorded hashes checked: it is an
/// object; `manifest_hash` and `template_hash`, when present, are 64
/// lowercase hex digits; `template_hash` is the SHA-256 of the canonical
/// `template`.
pub(crate) fn parse_metadata(bytes: &[u8]) -> Result<serde_json::Value, WeightsError> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|source| WeightsError::Json {
            what: "BUMPWGT5 metadata",
            source,
        })?;
    let bad = |reason: String| WeightsError::BadMetadata { reason };
    let obj = v
        .as_object()
        .ok_or_else(|| bad("it is not a JSON object".into()))?;
    let digest = |key: &str| -> Result<Option<&str>, WeightsError> {
        match obj.get(key) {
            None => Ok(None),
            Some(serde_json::Value::String(s))
                if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                Ok(Some(s))
            }
            Some(other) => Err(bad(format!(
                "{key} is {}, not 64 lowercase hex digits",
                crate::Escaped::capped(&other.to_string(), 80)
            ))),
        }
    };
    digest("manifest_hash")?;
    if let Some(recorded) = digest("template_hash")? {
        let template = obj
            .get("template")
            .ok_or_else(|| bad("it records a template_hash but no template".into()))?;
        let computed: [u8; 32] = Sha256::digest(canonical_json(template)).into();
        if super::error::hex32(&computed) != recorded {
            return Err(WeightsError::TemplateHashMismatch {
                recorded: recorded.to_string(),
                computed,
            });
        }
    }
    Ok(v)
}
