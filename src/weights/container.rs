//! The four `weights.bump` layouts C-Kernel-Engine's converters write, their
//! per-layout offsets, and the structural rules that tell them apart.
//!
//! See the [module documentation](super#layouts) for the table and the rules.

use super::format::{parse_footer, u32_at, u64_at, HeaderDims, MetadataFooter, Version};
use super::source::Source;
use super::{Dtype, Header, WeightsError};

/// Size of the fixed header every layout starts with (bytes).
pub const HEADER_SIZE: u64 = 128;

/// Where one layout keeps its fields. All offsets are bytes from the start of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LayoutOffsets {
    /// Offset of the 32-byte SHA-256 in the header.
    pub checksum: u64,
    /// First byte of the zero padding that runs to the end of the 128-byte header.
    pub header_padding: u64,
    /// Offset of the dtype-table count (u32); the one-byte codes follow it.
    pub dtype_count: u64,
    /// First byte the checksum covers. The range ends at the end of the tensor
    /// data: the metadata offset of a `BUMPWGT5` file, else the end of the file.
    pub hash_start: u64,
}

impl LayoutOffsets {
    /// Offset of the first dtype-table code (`dtype_count + 4`).
    pub const fn dtype_table(&self) -> u64 {
        self.dtype_count + 4
    }
}

/// L1's offsets: checksum @88, zeros 120..128, a 24-byte zero block 128..152,
/// dtype table count @152, checksum over `[152, data end)`.
pub const L1_OFFSETS: LayoutOffsets = LayoutOffsets {
    checksum: 88,
    header_padding: 120,
    dtype_count: 152,
    hash_start: 152,
};
/// L2's offsets: checksum @80, zeros 112..128, dtype table count @128,
/// checksum over `[128, data end)`.
pub const L2_OFFSETS: LayoutOffsets = LayoutOffsets {
    checksum: 80,
    header_padding: 112,
    dtype_count: 128,
    hash_start: 128,
};
/// L3's offsets: checksum @88, zeros 120..128, dtype table count @128,
/// checksum over `[128, end of file)`.
pub const L3_OFFSETS: LayoutOffsets = LayoutOffsets {
    checksum: 88,
    header_padding: 120,
    dtype_count: 128,
    hash_start: 128,
};
/// L4's (`BUMPWGT3`) offsets: checksum @64, zeros 96..128, dtype table count @128,
/// checksum over `[128, end of file)`.
pub const L4_OFFSETS: LayoutOffsets = LayoutOffsets {
    checksum: 64,
    header_padding: 96,
    dtype_count: 128,
    hash_start: 128,
};

/// Which layout a `weights.bump` has, named after the converter family that
/// writes it (paths in C-Kernel-Engine's tree). Returned by
/// [`WeightsFile::container`](super::WeightsFile::container).
///
/// `#[non_exhaustive]`: more layouts may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Container {
    /// L1, `BUMPWGT4`/`BUMPWGT5`: the v8 converters
    /// (`version/v8/scripts/convert_gguf_to_bump_v8.py`,
    /// `convert_safetensors_to_bump_v8.py`) and the `version/v7` and
    /// `version/v6.6` GGUF converters. ckalloc's writer writes this layout.
    V8Converters,
    /// L2, `BUMPWGT4`/`BUMPWGT5`: the "v4.0" header of the root
    /// `scripts/convert_gguf_to_bump.py`, the `scripts/v4` and `scripts/v6` GGUF
    /// converters and the versioned HF converters (`convert_hf_to_bump_v4.py` up
    /// to `version/v7/scripts/convert_hf_to_bump_v7.py`).
    V4HeaderConverters,
    /// L3, `BUMPWGT4`: the "v4.1" header of `scripts/v6.5/convert_gguf_to_bump_v6_5.py`
    /// and `scripts/v6.6/convert_gguf_to_bump_v6_6.py`.
    V65GgufConverters,
    /// L4, `BUMPWGT3`: every bare `convert_hf_to_bump.py` and
    /// `scripts/gen_random_bump.py`. These write no manifest.
    BareHfConverter,
}

impl Container {
    /// Every layout, in the order the reader tries them.
    pub const ALL: [Container; 4] = [
        Container::V8Converters,
        Container::V4HeaderConverters,
        Container::V65GgufConverters,
        Container::BareHfConverter,
    ];

    /// The short label used in the documentation: `"L1"` to `"L4"`.
    pub fn label(self) -> &'static str {
        match self {
            Container::V8Converters => "L1",
            Container::V4HeaderConverters => "L2",
            Container::V65GgufConverters => "L3",
            Container::BareHfConverter => "L4",
        }
    }

    /// A stable lowercase identifier (the `container.id` of `ckalloc inspect --json`).
    pub fn id(self) -> &'static str {
        match self {
            Container::V8Converters => "v8-converters",
            Container::V4HeaderConverters => "v4-header-converters",
            Container::V65GgufConverters => "v6.5-gguf-converters",
            Container::BareHfConverter => "bare-hf-converter",
        }
    }

    /// The converters that write this layout, in words.
    pub fn writers(self) -> &'static str {
        match self {
            Container::V8Converters => {
                "convert_gguf_to_bump_v8.py, convert_safetensors_to_bump_v8.py, the version/v7 and version/v6.6 GGUF converters, ckalloc"
            }
            Container::V4HeaderConverters => {
                "scripts/convert_gguf_to_bump.py, the scripts/v4 and scripts/v6 GGUF converters, convert_hf_to_bump_v4.py .. convert_hf_to_bump_v7.py"
            }
            Container::V65GgufConverters => {
                "scripts/v6.5/convert_gguf_to_bump_v6_5.py, scripts/v6.6/convert_gguf_to_bump_v6_6.py"
            }
            Container::BareHfConverter => "convert_hf_to_bump.py (unversioned), gen_random_bump.py",
        }
    }

    /// The layout's offsets.
    pub fn offsets(self) -> &'static LayoutOffsets {
        match self {
            Container::V8Converters => &L1_OFFSETS,
            Container::V4HeaderConverters => &L2_OFFSETS,
            Container::V65GgufConverters => &L3_OFFSETS,
            Container::BareHfConverter => &L4_OFFSETS,
        }
    }

    /// The versions (magics) this layout occurs with.
    pub fn versions(self) -> &'static [Version] {
        match self {
            Container::V8Converters | Container::V4HeaderConverters => &[Version::V4, Version::V5],
            Container::V65GgufConverters => &[Version::V4],
            Container::BareHfConverter => &[Version::V3],
        }
    }

    /// The smallest file this layout can describe: header, any fixed block and
    /// the dtype-table count (bytes).
    pub fn min_len(self) -> u64 {
        self.offsets().dtype_table()
    }
}

impl std::fmt::Display for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.label(), self.id())
    }
}

/// Why one layout does not fit a file, in
/// [`WeightsError::NotAKnownLayout`](super::WeightsError::NotAKnownLayout).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayoutRejection {
    /// The layout tried.
    pub container: Container,
    /// The rule the file breaks, with the bytes involved.
    pub reason: String,
}

impl std::fmt::Display for LayoutRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.container.label(), self.reason)
    }
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
