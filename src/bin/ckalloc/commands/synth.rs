//! `ckalloc synth`: write the demo's synthetic model into a directory.

use crate::error::CliError;
use crate::format::path_json;
use crate::model::Model;
use crate::output::emit_json;
use crate::synthetic::write_synth;
use crate::{outln, Global};
use indicatif::BinaryBytes;
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Directory to write model.safetensors and config.json into (created if missing).
    pub dir: PathBuf,
}

pub fn run(g: Global, a: SynthArgs) -> Result<(), CliError> {
    let path = write_synth(&a.dir)?;
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
