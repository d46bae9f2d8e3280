//! Tensor element types and their one-byte codes in the dtype table.
//!
//! Codes `0..=13` are C-Kernel-Engine's `CKDataType` enum (`include/ckernel_dtype.h`,
//! mirrored by `convert_gguf_to_bump_v6_6.py`). Codes `14..=127` are left to
//! C-Kernel-Engine. Types its table lacks (what safetensors checkpoints carry) use
//! the **ckalloc extension range `0x80..=0x8F`**; `0x90..=0xFF` are reserved.
//! Code 14 is deliberately unused: C-Kernel-Engine's C loader reads 13 as `u8`
//! and 14 as `i32`, which clashes with its converter's `Q5_K = 13`, so no
//! extension type sits below `0x80`.
//!
//! The manifest keeps the dtype **name** and is the authority; the table code is
//! a hint for kernels that dispatch on it.

use super::error::WeightsError;

/// First code of the ckalloc extension range.
pub const EXTENSION_CODE_BASE: u8 = 0x80;

/// An element type. `#[non_exhaustive]`: more may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum Dtype {
    /// IEEE 754 binary32 (code 0, `fp32`).
    F32,
    /// bfloat16 (code 1, `bf16`).
    BF16,
    /// IEEE 754 binary16 (code 2, `fp16`).
    F16,
    /// Signed 8-bit integer (code 3, `int8`; safetensors `I8`).
    I8,
    /// Packed signed 4-bit integers, no scales (code 4, `int4`).
    Int4,
    /// GGML Q4_0: 32 weights in 18 bytes (code 5).
    Q4_0,
    /// GGML Q4_1: 32 weights in 20 bytes (code 6).
    Q4_1,
    /// GGML Q4_K: 256 weights in 144 bytes (code 7).
    Q4_K,
    /// GGML Q6_K: 256 weights in 210 bytes (code 8).
    Q6_K,
    /// GGML Q8_0: 32 weights in 34 bytes (code 9).
    Q8_0,
    /// GGML Q8_K: 256 weights in 292 bytes (code 10).
    Q8_K,
    /// GGML Q5_0: 32 weights in 22 bytes (code 11).
    Q5_0,
    /// GGML Q5_1: 32 weights in 24 bytes (code 12).
    Q5_1,
    /// GGML Q5_K: 256 weights in 176 bytes (code 13).
    Q5_K,
    /// Signed 64-bit integer (extension code 0x80).
    I64,
    /// Signed 32-bit integer (extension code 0x81).
    I32,
    /// Signed 16-bit integer (extension code 0x82).
    I16,
    /// Unsigned 8-bit integer (extension code 0x83).
    U8,
    /// Unsigned 16-bit integer (extension code 0x84).
    U16,
    /// Unsigned 32-bit integer (extension code 0x85).
    U32,
    /// Unsigned 64-bit integer (extension code 0x86).
    U64,
    /// IEEE 754 binary64 (extension code 0x87).
    F64,
    /// Boolean, one byte per element (extension code 0x88).
    Bool,
    /// FP8 E4M3 (extension code 0x89).
    F8_E4M3,
    /// FP8 E5M2 (extension code 0x8A).
    F8_E5M2,
    /// FP8 E8M0 scale type (extension code 0x8B).
    F8_E8M0,
    /// FP4 E2M1, packed (extension code 0x8C).
    F4,
    /// FP6 E2M3, packed (extension code 0x8D).
    F6_E2M3,
    /// FP6 E3M2, packed (extension code 0x8E).
    F6_E3M2,
    /// Complex of two binary32 (extension code 0x8F).
    C64,
}

/// `(dtype, code, canonical name, safetensors name, aliases)`.
const TABLE: &[(Dtype, u8, &str, &str, &[&str])] = &[
    (Dtype::F32, 0, "fp32", "F32", &["f32", "float32", "float"]),
    (Dtype::BF16, 1, "bf16", "BF16", &["bfloat16"]),
    (Dtype::F16, 2, "fp16", "F16", &["f16", "float16", "half"]),
    (Dtype::I8, 3, "int8", "I8", &["i8"]),
    (Dtype::Int4, 4, "int4", "I4", &["i4"]),
    (Dtype::Q4_0, 5, "q4_0", "Q4_0", &["q40"]),
    (Dtype::Q4_1, 6, "q4_1", "Q4_1", &["q41"]),
    (Dtype::Q4_K, 7, "q4_k", "Q4_K", &["q4k"]),
    (Dtype::Q6_K, 8, "q6_k", "Q6_K", &["q6k"]),
    (Dtype::Q8_0, 9, "q8_0", "Q8_0", &["q80"]),
    (Dtype::Q8_K, 10, "q8_k", "Q8_K", &["q8k"]),
    (Dtype::Q5_0, 11, "q5_0", "Q5_0", &["q50"]),
    (Dtype::Q5_1, 12, "q5_1", "Q5_1", &["q51"]),
    (Dtype::Q5_K, 13, "q5_k", "Q5_K", &["q5k"]),
    (Dtype::I64, 0x80, "i64", "I64", &["int64"]),
    (Dtype::I32, 0x81, "i32", "I32", &["int32"]),
    (Dtype::I16, 0x82, "i16", "I16", &["int16"]),
    (Dtype::U8, 0x83, "u8", "U8", &["uint8"]),
    (Dtype::U16, 0x84, "u16", "U16", &["uint16"]),
    (Dtype::U32, 0x85, "u32", "U32", &["uint32"]),
    (Dtype::U64, 0x86, "u64", "U64", &["uint64"]),
    (
        Dtype::F64,
        0x87,
        "f64",
        "F64",
        &["fp64", "float64", "double"],
    ),
    (Dtype::Bool, 0x88, "bool", "BOOL", &[]),
    (
        Dtype::F8_E4M3,
        0x89,
        "f8_e4m3",
        "F8_E4M3",
        &["float8_e4m3fn", "f8e4m3"],
    ),
    (
        Dtype::F8_E5M2,
        0x8A,
        "f8_e5m2",
        "F8_E5M2",
        &["float8_e5m2", "f8e5m2"],
    ),
    (
        Dtype::F8_E8M0,
        0x8B,
        "f8_e8m0",
        "F8_E8M0",
        &["float8_e8m0fnu", "f8e8m0"],
    ),
    (Dtype::F4, 0x8C, "f4", "F4", &["fp4"]),
    (Dtype::F6_E2M3, 0x8D, "f6_e2m3", "F6_E2M3", &[]),
    (Dtype::F6_E3M2, 0x8E, "f6_e3m2", "F6_E3M2", &[]),
    (Dtype::C64, 0x8F, "c64", "C64", &["complex64"]),
];

impl Dtype {
    /// Every dtype, in code order.
    pub fn all() -> impl Iterator<Item = Dtype> {
        TABLE.iter().map(|e| e.0)
    }

    fn row(
        self,
    ) -> &'static (
        Dtype,
        u8,
        &'static str,
        &'static str,
        &'static [&'static str],
    ) {
        // TABLE lists the variants in declaration order (checked by the unit test
        // `table_order_matches_variants`), so the discriminant indexes it.
        &TABLE[self as usize]
    }

    /// The one-byte code written to the dtype table.
    pub fn code(self) -> u8 {
        self.row().1
    }

    /// The dtype for a table code, or `None` for a code nobody assigned.
    pub fn from_code(code: u8) -> Option<Dtype> {
        TABLE.iter().find(|e| e.1 == code).map(|e| e.0)
    }

    /// True for codes in C-Kernel-Engine's own table (`0..=13`).
    pub fn is_native(self) -> bool {
        self.code() < EXTENSION_CODE_BASE
    }

    /// The name written to manifests: C-Kernel-Engine's lowercase spelling
    /// (`fp32`, `bf16`, `q4_k`, `i32`, `u8`...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// The safetensors spelling (`F32`, `BF16`, `I64`, `BOOL`, `F8_E4M3`...).
    pub fn safetensors_name(self) -> &'static str {
        self.row().3
    }

    /// Parse a dtype name, ASCII case-insensitively: the canonical name, the
    /// safetensors name, or an alias (`float32`, `int64`, `half`...).
    ///
    /// # Errors
    /// [`WeightsError::UnknownDtype`] naming the input.
    pub fn from_name(name: &str) -> Result<Dtype, WeightsError> {
        TABLE
            .iter()
            .find(|e| {
                e.2.eq_ignore_ascii_case(name)
                    || e.3.eq_ignore_ascii_case(name)
                    || e.4.iter().any(|a| a.eq_ignore_ascii_case(name))
            })
            .map(|e| e.0)
            .ok_or_else(|| WeightsError::UnknownDtype {
                name: name.to_owned(),
            })
    }

    /// Bits per element for element types; `None` for GGML block types.
    pub fn element_bits(self) -> Option<u32> {
        use Dtype::*;
        Some(match self {
            F32 | I32 | U32 => 32,
            BF16 | F16 | I16 | U16 => 16,
            I8 | U8 | Bool | F8_E4M3 | F8_E5M2 | F8_E8M0 => 8,
            Int4 | F4 => 4,
            F6_E2M3 | F6_E3M2 => 6,
            I64 | U64 | F64 | C64 => 64,
            Q4_0 | Q4_1 | Q4_K | Q6_K | Q8_0 | Q8_K | Q5_0 | Q5_1 | Q5_K => return None,
        })
    }

    /// `(weights per block, bytes per block)` for GGML block types; `None` otherwise.
    pub fn block(self) -> Option<(u64, u64)> {
        use Dtype::*;
        Some(match self {
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            _ => return None,
        })
    }

    /// Bytes taken by `elements` elements of a whole-byte element type
    /// (`element_bits() % 8 == 0`); `None` for packed sub-byte and block types,
    /// whose size depends on row layout, or on overflow.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let bits = self.element_bits()?;
        if bits % 8 != 0 {
            return None;
        }
        elements.checked_mul(u64::from(bits / 8))
    }
}

impl Dtype {
    /// The fewest bytes `elements` elements can take: `ceil(elements * bits / 8)`
    /// for element types, `ceil(elements / block weights) * block bytes` for GGML
    /// block types (rows padded to whole blocks only need more). `None` on overflow.
    pub fn min_bytes(self, elements: u64) -> Option<u64> {
        if let Some(bits) = self.element_bits() {
            return elements
                .checked_mul(u64::from(bits))?
                .checked_add(7)
                .map(|b| b / 8);
        }
        let (weights, bytes) = self.block()?;
        elements.div_ceil(weights).checked_mul(bytes)
    }
}

/// One dtype-table code, read with what is known about the file's producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum SlotDtype {
    /// The code has one meaning for this producer.
    Known(Dtype),
    /// Code 6 with nothing saying who wrote the file: Q4_1 in
    /// `include/ckernel_dtype.h`, Q4_K from C-Kernel-Engine's HF converters.
    /// No size is computed from it.
    Q4_1OrQ4_K,
    /// A code no one assigned.
    Unknown(u8),
}

impl SlotDtype {
    /// True when the slot is compatible with `dtype` (an ambiguous slot with
    /// either of its readings; an unknown code or dtype with nothing).
    pub fn may_be(self, dtype: Option<Dtype>) -> bool {
        match (self, dtype) {
            (SlotDtype::Known(a), Some(b)) => a == b,
            (SlotDtype::Q4_1OrQ4_K, Some(b)) => b == Dtype::Q4_1 || b == Dtype::Q4_K,
            _ => false,
        }
    }
}

impl std::fmt::Display for SlotDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotDtype::Known(d) => f.write_str(d.name()),
            SlotDtype::Q4_1OrQ4_K => f.write_str("q4_1 or q4_k (ambiguous)"),
            SlotDtype::Unknown(c) => write!(f, "unknown code {c}"),
        }
    }
}

/// Who wrote a file, as far as it matters for reading dtype-table codes.
/// Found by [`Producer::from_info`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Producer {
    /// C-Kernel-Engine's HF converters (`convert_hf_to_bump*.py`): they write
    /// code 6 for Q4_K.
    HfConverter,
    /// A writer whose codes follow `include/ckernel_dtype.h` (the GGUF and v8
    /// safetensors converters, ckalloc): code 6 is Q4_1, Q4_K is 7.
    CkernelDtypeCodes,
    /// Nothing says.
    Unknown,
}

impl Producer {
    /// Classify from the v5 metadata's `created_by` and the JSON manifest's
    /// `format` and `generator` (each `None` when absent):
    ///
    /// * `created_by` naming an `hf_to_bump` script: [`HfConverter`](Self::HfConverter);
    /// * `created_by` naming a `gguf_to_bump` or `safetensors_to_bump` script, or
    ///   `created_by` / `generator` starting with `ckalloc`:
    ///   [`CkernelDtypeCodes`](Self::CkernelDtypeCodes);
    /// * otherwise a manifest `format` of `ck-bumpwgt4-manifest-v1` /
    ///   `ck-bumpwgt5-manifest-v1` (written by the v7 HF converter; ckalloc's
    ///   manifests also name their `generator`): [`HfConverter`](Self::HfConverter);
    /// * otherwise [`Unknown`](Self::Unknown).
    pub fn from_info(
        created_by: Option<&str>,
        manifest_format: Option<&str>,
        manifest_generator: Option<&str>,
    ) -> Producer {
        if let Some(c) = created_by {
            if c.contains("hf_to_bump") {
                return Producer::HfConverter;
            }
            if c.contains("gguf_to_bump")
                || c.contains("safetensors_to_bump")
                || c.starts_with("ckalloc")
            {
                return Producer::CkernelDtypeCodes;
            }
        }
        if manifest_generator.is_some_and(|g| g.starts_with("ckalloc")) {
            return Producer::CkernelDtypeCodes;
        }
        if manifest_format.is_some_and(|f| f.starts_with("ck-bumpwgt")) {
            return Producer::HfConverter;
        }
        Producer::Unknown
    }

    /// What table code `code` means for this producer.
    pub fn slot_dtype(self, code: u8) -> SlotDtype {
        match (code, self) {
            (6, Producer::HfConverter) => SlotDtype::Known(Dtype::Q4_K),
            (6, Producer::Unknown) => SlotDtype::Q4_1OrQ4_K,
            _ => Dtype::from_code(code).map_or(SlotDtype::Unknown(code), SlotDtype::Known),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Dtype {
    type Err = WeightsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::from_name(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_order_matches_variants() {
        assert_eq!(TABLE.len(), Dtype::C64 as usize + 1);
        for (i, e) in TABLE.iter().enumerate() {
            assert_eq!(e.0 as usize, i);
        }
    }

    #[test]
    fn every_variant_has_one_row_and_codes_are_unique() {
        let mut codes = std::collections::HashSet::new();
        for d in Dtype::all() {
            assert_eq!(TABLE.iter().filter(|e| e.0 == d).count(), 1, "{d:?}");
            assert!(codes.insert(d.code()), "duplicate code for {d:?}");
            assert_eq!(Dtype::from_code(d.code()), Some(d));
            assert_eq!(Dtype::from_name(d.name()).unwrap(), d);
            assert_eq!(Dtype::from_name(d.safetensors_name()).unwrap(), d);
        }
        assert!(
            Dtype::from_code(14).is_none(),
            "14 is C-K-E's C loader i32: keep unused"
        );
    }
}
