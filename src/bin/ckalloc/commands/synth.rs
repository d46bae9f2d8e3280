//! `ckalloc synth`: write the demo's synthetic model into a directory.

use crate::error::err;
use crate::error::CliError;
use crate::format::path_json;
use crate::model::Model;
use crate::output::emit_json;
use crate::synthetic::{write_synth, SynthShape, SYNTH_MAX_BYTES};
use crate::{outln, Global};
use indicatif::BinaryBytes;
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Directory to write model.safetensors and config.json into (created if missing).
    pub dir: PathBuf,
    /// Encoder layers.
    #[arg(long, allow_negative_numbers = true, default_value_t = SynthShape::default().layers, value_parser = |s: &str| parse_in(s, 1, 512))]
    pub layers: usize,
    /// Hidden size (a multiple of 32; the feed-forward size is 4x, a head is 32 wide).
    #[arg(long, allow_negative_numbers = true, default_value_t = SynthShape::default().hidden, value_parser = parse_hidden)]
    pub hidden: usize,
    /// Vocabulary size (at least 1001: the real-client batch draws ids up to 1000).
    #[arg(long, allow_negative_numbers = true, default_value_t = SynthShape::default().vocab, value_parser = |s: &str| parse_in(s, 1001, 1_000_000))]
    pub vocab: usize,
}

/// A decimal number from `lo` to `hi`.
fn parse_in(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|v| (lo..=hi).contains(v))
        .ok_or_else(|| format!("{s:?}: a number from {lo} to {hi}"))
}

fn parse_hidden(s: &str) -> Result<usize, String> {
    let h = parse_in(s, 32, 16384)?;
    if h % 32 != 0 {
        return Err(format!("{h}: a multiple of 32"));
    }
    Ok(h)
}

pub fn run(g: Global, a: SynthArgs) -> Result<(), CliError> {
    let shape = SynthShape {
        layers: a.layers,
        hidden: a.hidden,
        vocab: a.vocab,
    };
    match shape.tensor_bytes() {
        Some(b) if b <= SYNTH_MAX_BYTES => {}
        b => {
            return Err(err(format!(
                "--layers {} --hidden {} --vocab {}: {} of tensors, more than the {} `synth` \
                 builds in memory",
                a.layers,
                a.hidden,
                a.vocab,
                b.map_or_else(
                    || "more than 2^64 bytes".into(),
                    |b| BinaryBytes(b).to_string()
                ),
                BinaryBytes(SYNTH_MAX_BYTES)
            )))
        }
    }
    let path = write_synth(&a.dir, shape)?;
    let model = Model::open(&path)?;
    let tensors = model.tensors()?;
    let bytes: usize = tensors.iter().map(|t| t.data.len()).sum();
    if g.json {
        emit_json(&json!({
            "model": path_json(&path),
            "config": path_json(&a.dir.join("config.json")),
            "tensors": tensors.len(),
            "tensor_bytes": bytes,
        }));
    } else {
        outln!(
            "wrote {} ({} tensors, {}) and config.json",
            path.display(),
            tensors.len(),
            BinaryBytes(bytes as u64)
        );
    }
    Ok(())
}
