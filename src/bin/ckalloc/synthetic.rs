//! The synthetic demo model: a small deterministic BERT-like
//! `model.safetensors` and its `config.json`, written by `ckalloc synth`
//! and used by the demo when no real model is at hand.

use crate::error::{err, CliError};
use crate::packing::create_output_dir;
use safetensors::{tensor::TensorView, Dtype as StDtype};
use serde_json::json;
use std::path::{Path, PathBuf};

/// Shape of the synthetic BERT-like model: tensor names follow
/// sentence-transformers' all-MiniLM-L6-v2, so the demo treats both alike.
/// The default is the demo's small model (2 layers, hidden size 128,
/// vocabulary 4096: 2.9 MiB of tensors); `ckalloc synth --layers 20
/// --hidden 1024 --vocab 30522` writes 1.13 GB of tensors. The feed-forward
/// size is 4 x hidden and a head 32 wide, as in BERT's proportions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthShape {
    pub layers: usize,
    pub hidden: usize,
    pub vocab: usize,
}

impl Default for SynthShape {
    fn default() -> Self {
        SynthShape {
            layers: 2,
            hidden: 128,
            vocab: 4096,
        }
    }
}

impl SynthShape {
    fn intermediate(&self) -> usize {
        4 * self.hidden
    }

    fn heads(&self) -> usize {
        (self.hidden / 32).max(1)
    }

    /// Bytes of all the model's tensors (f32 weights and the i64 position
    /// ids), `None` on overflow.
    pub fn tensor_bytes(&self) -> Option<u64> {
        let (h, i, v, c) = (
            self.hidden as u64,
            self.intermediate() as u64,
            self.vocab as u64,
            SYNTH_CONTEXT as u64,
        );
        // Embeddings: words, positions, 2 token types, LayerNorm gain and bias.
        let embeddings = v.checked_mul(h)? + c * h + 2 * h + 2 * h;
        // Per layer: 4 h x h projections, h x i and i x h, their biases,
        // and two LayerNorms.
        let layer = (4 * h * h + 4 * h)
            .checked_add(2 * h.checked_mul(i)?)?
            .checked_add(i + h + 4 * h)?;
        let pooler = h * h + h;
        let params = layer
            .checked_mul(self.layers as u64)?
            .checked_add(embeddings)?
            .checked_add(pooler)?;
        params.checked_mul(4)?.checked_add(8 * c)
    }
}

/// The most tensor bytes `ckalloc synth` writes: it builds every tensor in
/// memory before writing the file.
pub const SYNTH_MAX_BYTES: u64 = 8 << 30;

/// Positions (the context length) of every synthetic model.
pub const SYNTH_CONTEXT: usize = 128;

/// A deterministic pseudo-random stream (SplitMix64), seeded per tensor name.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        // FNV-1a of the name: a fixed seed per tensor.
        Rng(name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        }))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-scale, scale)`.
    fn f32(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// The synthetic model's tensors: (name, dtype, shape, little-endian bytes).
pub fn synth_tensors(shape: SynthShape) -> Vec<(String, StDtype, Vec<usize>, Vec<u8>)> {
    let (h, i, v, c) = (
        shape.hidden,
        shape.intermediate(),
        shape.vocab,
        SYNTH_CONTEXT,
    );
    let mut specs: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![v, h]),
        ("embeddings.position_embeddings.weight".into(), vec![c, h]),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
        ("embeddings.LayerNorm.weight".into(), vec![h]),
        ("embeddings.LayerNorm.bias".into(), vec![h]),
    ];
    for l in 0..shape.layers {
        let p = format!("encoder.layer.{l}");
        for (n, shape) in [
            ("attention.self.query", vec![h, h]),
            ("attention.self.key", vec![h, h]),
            ("attention.self.value", vec![h, h]),
            ("attention.output.dense", vec![h, h]),
            ("intermediate.dense", vec![i, h]),
            ("output.dense", vec![h, i]),
        ] {
            let rows = shape[0];
            specs.push((format!("{p}.{n}.weight"), shape));
            specs.push((format!("{p}.{n}.bias"), vec![rows]));
        }
        for n in ["attention.output.LayerNorm", "output.LayerNorm"] {
            specs.push((format!("{p}.{n}.weight"), vec![h]));
            specs.push((format!("{p}.{n}.bias"), vec![h]));
        }
    }
    specs.push(("pooler.dense.weight".into(), vec![h, h]));
    specs.push(("pooler.dense.bias".into(), vec![h]));

    let mut out: Vec<_> = specs
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let mut rng = Rng::new(&name);
            let layer_norm_gain = name.ends_with("LayerNorm.weight");
            let bytes = (0..n)
                .flat_map(|_| {
                    let x = rng.f32(0.05);
                    if layer_norm_gain { 1.0 + x } else { x }.to_le_bytes()
                })
                .collect();
            (name, StDtype::F32, shape, bytes)
        })
        .collect();
    // As in BERT checkpoints: one I64 buffer, the position ids 0..context.
    let ids = (0..c as i64).flat_map(i64::to_le_bytes).collect();
    out.push((
        "embeddings.position_ids".into(),
        StDtype::I64,
        vec![1, c],
        ids,
    ));
    out
}

/// The synthetic model's `config.json`: every key of Hugging Face's BERT
/// config that candle's `BertModel` reads, so candle loads the model.
pub fn synth_config(shape: SynthShape) -> serde_json::Value {
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate(),
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads(),
        "vocab_size": shape.vocab,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "use_cache": true,
        "max_position_embeddings": SYNTH_CONTEXT,
        "_comment": "synthetic model generated by `ckalloc synth` (deterministic)",
    })
}

/// Write `model.safetensors` and `config.json` of the synthetic model into
/// `dir` (created if missing). Returns the model's path.
pub fn write_synth(dir: &Path, shape: SynthShape) -> Result<PathBuf, CliError> {
    create_output_dir(dir)?;
    let tensors = synth_tensors(shape);
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.as_str(), v))
                .map_err(|e| err(format!("synthetic tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| err(format!("{}: {e}", path.display())))?;
    let cfg = dir.join("config.json");
    let text = serde_json::to_string_pretty(&synth_config(shape)).unwrap_or_default();
    std::fs::write(&cfg, text + "\n").map_err(|e| err(format!("{}: {e}", cfg.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;

    #[test]
    fn synthetic_model_is_deterministic_and_parses() {
        let a = synth_tensors(SynthShape::default());
        let b = synth_tensors(SynthShape::default());
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.0 == y.0 && x.3 == y.3));
        assert_eq!(a.iter().filter(|t| t.1 == StDtype::I64).count(), 1);
        let dir = tempfile::tempdir().unwrap();
        let p = write_synth(dir.path(), SynthShape::default()).unwrap();
        let m = Model::open(&p).unwrap();
        let t = m.tensors().unwrap();
        assert_eq!(t.len(), a.len());
        let word = t
            .iter()
            .find(|t| t.name == "embeddings.word_embeddings.weight")
            .unwrap();
        assert_eq!(word.shape, vec![4096, 128]);
        assert_eq!(word.data, &a[0].3[..]);
        assert!(m.config_json().unwrap().is_some());
    }

    #[test]
    fn the_shape_options_set_the_tensors_and_the_config() {
        let shape = SynthShape {
            layers: 3,
            hidden: 64,
            vocab: 1500,
        };
        let t = synth_tensors(shape);
        let layer_weights = t
            .iter()
            .filter(|t| t.0.ends_with("intermediate.dense.weight"))
            .count();
        assert_eq!(layer_weights, 3);
        assert_eq!(t[0].2, vec![1500, 64]);
        let bytes: usize = t.iter().map(|x| x.3.len()).sum();
        assert_eq!(shape.tensor_bytes(), Some(bytes as u64));
        assert_eq!(
            SynthShape::default().tensor_bytes(),
            Some(
                synth_tensors(SynthShape::default())
                    .iter()
                    .map(|x| x.3.len() as u64)
                    .sum()
            )
        );
        let c = synth_config(shape);
        assert_eq!(c["intermediate_size"], 256);
        assert_eq!(c["num_attention_heads"], 2);
        assert_eq!(c["num_hidden_layers"], 3);
    }
}
