//! Reading `model.safetensors` (+ `config.json`), and the synthetic demo model.

use crate::fail;
use crate::util::{err, CliError};
use indicatif::BinaryBytes;
use safetensors::{tensor::TensorView, Dtype as StDtype, SafeTensors};
use serde_json::json;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The largest `config.json` read next to a model (bytes); real ones are a
/// few KiB.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A `model.safetensors` file mapped read-only. A `SIGBUS` in the mapping
/// (the file truncated underneath) is one error line and exit 1
/// ([`sigbus`](crate::sigbus)).
pub struct Model {
    pub path: PathBuf,
    map: memmap2::Mmap,
    _watch: crate::sigbus::Watch,
}

/// One tensor of a safetensors file, borrowed from the mapping.
pub struct Tensor<'a> {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl Model {
    /// Map `path` read-only. The file must be a regular, non-empty file.
    pub fn open(path: &Path) -> Result<Model, CliError> {
        let meta = std::fs::metadata(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        if !meta.is_file() {
            fail!("{}: not a regular file", path.display());
        }
        if meta.len() < 8 {
            fail!(
                "{}: not a safetensors file ({} bytes, shorter than the 8-byte header length)",
                path.display(),
                meta.len()
            );
        }
        let file = File::open(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        // SAFETY: the mapping is read-only and private to this process. If
        // another process truncated the file while it is mapped, reads past
        // the new end would raise SIGBUS; ckalloc only reads model files it was
        // pointed at, as the safetensors tools themselves do.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| err(format!("{}: cannot map: {e}", path.display())))?;
        let watch = crate::sigbus::watch(
            map.as_ptr(),
            map.len(),
            0,
            &format!("{} (the model, mapped)", path.display()),
        );
        Ok(Model {
            path: path.to_path_buf(),
            map,
            _watch: watch,
        })
    }

    /// The parsed header (validated by the `safetensors` crate: offsets cover
    /// the buffer, shapes match sizes, dtypes are known).
    pub fn parse(&self) -> Result<SafeTensors<'_>, CliError> {
        SafeTensors::deserialize(&self.map).map_err(|e| {
            err(format!(
                "{}: not a valid safetensors file: {e}",
                self.path.display()
            ))
        })
    }

    /// Every tensor, in file order (by data offset, then name).
    pub fn tensors(&self) -> Result<Vec<Tensor<'_>>, CliError> {
        let st = self.parse()?;
        let base = self.map.as_ptr() as usize;
        let mut v: Vec<Tensor<'_>> = st
            .iter()
            .map(|(name, view)| Tensor {
                name: name.to_string(),
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data(),
            })
            .collect();
        v.sort_by(|a, b| {
            (a.data.as_ptr() as usize - base, &a.name)
                .cmp(&(b.data.as_ptr() as usize - base, &b.name))
        });
        Ok(v)
    }

    /// `config.json` next to the model, if there is one: (path, text).
    pub fn config_json(&self) -> Result<Option<(PathBuf, String)>, CliError> {
        let p = self
            .path
            .parent()
            .unwrap_or(Path::new("."))
            .join("config.json");
        // O_NONBLOCK so that a FIFO without a writer does not block `open`;
        // then only a regular file of bounded size is read (not a FIFO, a
        // directory or a device such as /dev/zero that never ends).
        use std::io::Read as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => fail!("{}: {e}", p.display()),
        };
        let meta = file
            .metadata()
            .map_err(|e| err(format!("{}: {e}", p.display())))?;
        if !meta.is_file() {
            fail!("{}: not a regular file", p.display());
        }
        if meta.len() > MAX_CONFIG_BYTES {
            fail!(
                "{}: {} bytes, larger than the {} a config.json may have",
                p.display(),
                meta.len(),
                BinaryBytes(MAX_CONFIG_BYTES)
            );
        }
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| err(format!("{}: {e}", p.display())))?;
        Ok(Some((p, text)))
    }
}

// ---- the synthetic model ------------------------------------------------

/// Shape of the synthetic BERT-like model: tensor names follow
/// sentence-transformers' all-MiniLM-L6-v2, so the demo treats both alike.
pub const SYNTH_HIDDEN: usize = 128;
pub const SYNTH_INTERMEDIATE: usize = 512;
pub const SYNTH_LAYERS: usize = 2;
pub const SYNTH_VOCAB: usize = 4096;
pub const SYNTH_CONTEXT: usize = 128;
pub const SYNTH_HEADS: usize = 4;

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
pub fn synth_tensors() -> Vec<(String, StDtype, Vec<usize>, Vec<u8>)> {
    let (h, i, v, c) = (SYNTH_HIDDEN, SYNTH_INTERMEDIATE, SYNTH_VOCAB, SYNTH_CONTEXT);
    let mut specs: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![v, h]),
        ("embeddings.position_embeddings.weight".into(), vec![c, h]),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
        ("embeddings.LayerNorm.weight".into(), vec![h]),
        ("embeddings.LayerNorm.bias".into(), vec![h]),
    ];
    for l in 0..SYNTH_LAYERS {
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

/// The synthetic model's `config.json` (Hugging Face BERT keys).
pub fn synth_config() -> serde_json::Value {
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": SYNTH_HIDDEN,
        "intermediate_size": SYNTH_INTERMEDIATE,
        "num_hidden_layers": SYNTH_LAYERS,
        "num_attention_heads": SYNTH_HEADS,
        "vocab_size": SYNTH_VOCAB,
        "max_position_embeddings": SYNTH_CONTEXT,
        "_comment": "synthetic model generated by `ckalloc synth` (deterministic)",
    })
}

/// Write `model.safetensors` and `config.json` of the synthetic model into
/// `dir` (created if missing). Returns the model's path.
pub fn write_synth(dir: &Path) -> Result<PathBuf, CliError> {
    std::fs::create_dir_all(dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    let tensors = synth_tensors();
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
    let text = serde_json::to_string_pretty(&synth_config()).unwrap_or_default();
    std::fs::write(&cfg, text + "\n").map_err(|e| err(format!("{}: {e}", cfg.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_model_is_deterministic_and_parses() {
        let a = synth_tensors();
        let b = synth_tensors();
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.0 == y.0 && x.3 == y.3));
        assert_eq!(a.iter().filter(|t| t.1 == StDtype::I64).count(), 1);
        let dir = tempfile::tempdir().unwrap();
        let p = write_synth(dir.path()).unwrap();
        let m = Model::open(&p).unwrap();
        let t = m.tensors().unwrap();
        assert_eq!(t.len(), a.len());
        let word = t
            .iter()
            .find(|t| t.name == "embeddings.word_embeddings.weight")
            .unwrap();
        assert_eq!(word.shape, vec![SYNTH_VOCAB, SYNTH_HIDDEN]);
        assert_eq!(word.data, &a[0].3[..]);
        assert!(m.config_json().unwrap().is_some());
    }
}
