//! [`ModelDims`]: the model fields ckalloc's writer puts in a header, and
//! how a Hugging Face `config.json` fills them.

use super::error::WeightsError;
use super::header::HeaderDims;

/// The element alignment C-Kernel-Engine's converters use for `aligned_*` dims (bytes).
pub const CACHE_ALIGN: u64 = 64;

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
