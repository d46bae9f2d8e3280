//! The four `weights.bump` layouts C-Kernel-Engine's converters write and
//! their per-layout offsets, and the container versions (magics). The rules
//! that tell the layouts apart are in `header`.
//!
//! See the [module documentation](super#layouts) for the table and the rules.

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

/// Magic of a version-3 file (layout L4 only).
pub const MAGIC_V3: [u8; 8] = *b"BUMPWGT3";
/// Magic of a version-4 file (layouts L1, L2 or L3).
pub const MAGIC_V4: [u8; 8] = *b"BUMPWGT4";
/// Magic of a version-5 file (layouts L1 or L2, with the metadata footer).
pub const MAGIC_V5: [u8; 8] = *b"BUMPWGT5";

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
