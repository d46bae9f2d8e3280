//! Packing a `model.safetensors` into `weights.bump` + both manifests,
//! shared by `pack` and `demo`, and the JSON report of the result.

use crate::error::{err, CliError};
use crate::format::{path_json, DigestHex};
use crate::model::{Model, Tensor};
use crate::output::progress;
use ckalloc::weights::{Dtype, ModelDims, Version, WeightsWriter, WriteReport};
use indicatif::BinaryBytes;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Zero padding (bytes) always allowed in a packed file; beyond it, padding
/// may not exceed the tensors' own bytes.
const MAX_PADDING_FLOOR: u64 = 256 << 20;

/// The result of packing, for the text and JSON reports (and the demo).
pub struct Packed {
    pub report: WriteReport,
    pub tensors: usize,
    pub tensor_bytes: u64,
    pub dims: Option<ModelDims>,
    pub config: Option<PathBuf>,
}

/// The weights.bump dtype of a safetensors tensor.
fn dtype_of(t: &Tensor<'_>) -> Result<Dtype, CliError> {
    Dtype::from_name(&t.dtype.to_string()).map_err(|e| {
        err(format!(
            "tensor '{}': dtype {} cannot be stored in weights.bump: {e}",
            ckalloc::Escaped::capped(&t.name, 80),
            t.dtype
        ))
    })
}

/// Pack `model` into `out_dir` (created if missing) with a progress bar.
pub fn pack(
    model: &Model,
    out_dir: &Path,
    version: Version,
    align: u64,
    json_mode: bool,
) -> Result<Packed, CliError> {
    let tensors = model.tensors()?;
    let mut w = WeightsWriter::new(version);
    w.alignment(align)
        .map_err(|e| err(format!("--align {align}: {e}")))?;
    let (dims, config) = match model.config_json()? {
        Some((p, text)) => {
            let mut d = ModelDims::from_config_json(&text)
                .map_err(|e| err(format!("{}: {e}", p.display())))?;
            d.fill_aligned_fp32();
            w.dims(d);
            if version == Version::V5 {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    w.metadata_entry("source_config", v);
                }
            }
            (Some(d), Some(p))
        }
        None => (None, None),
    };
    if version == Version::V5 {
        w.metadata_entry(
            "source",
            json!(model
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())),
        );
    }
    let mut tensor_bytes = 0u64;
    for t in &tensors {
        let dtype = dtype_of(t)?;
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        w.add_tensor_with_shape(t.name.as_str(), dtype, &shape, t.data)
            .map_err(|e| {
                err(format!(
                    "{}: tensor '{}': {e}",
                    model.path.display(),
                    ckalloc::Escaped::capped(&t.name, 80)
                ))
            })?;
        tensor_bytes = tensor_bytes
            .checked_add(t.data.len() as u64)
            .ok_or_else(|| err("total tensor size overflows u64"))?;
    }
    // Padding is written (and hashed) as zeros: refuse an alignment that would
    // turn a small model into a huge file (--align 1GiB on 40 tensors: 40 GiB).
    let plan = w.plan().map_err(|e| err(format!("--align {align}: {e}")))?;
    let padding = plan.data_end.saturating_sub(tensor_bytes);
    if padding > tensor_bytes.max(MAX_PADDING_FLOOR) {
        return Err(err(format!(
            "--align {align}: {} tensors of {} would take a {} file ({} of zero padding); use a smaller alignment",
            tensors.len(),
            BinaryBytes(tensor_bytes),
            BinaryBytes(plan.data_end),
            BinaryBytes(padding)
        )));
    }
    create_output_dir(out_dir)?;
    let bar = progress("packing", json_mode);
    let report = w
        .write_dir_with_progress(out_dir, |done, total| bar.update(done, total))
        .map_err(|e| err(e.to_string()))?;
    bar.finish();
    Ok(Packed {
        report,
        tensors: tensors.len(),
        tensor_bytes,
        dims,
        config,
    })
}

/// The pack report as JSON (`pack --json`, and `pack` in `demo --json`).
pub fn packed_json(p: &Packed, version: Version, align: u64) -> Value {
    let r = &p.report;
    json!({
        "weights": path_json(&r.weights_path),
        "manifest_json": path_json(&r.manifest_json_path),
        "manifest_map": path_json(&r.manifest_map_path),
        "version": version.number(),
        "alignment": align,
        "tensors": p.tensors,
        "tensor_bytes": p.tensor_bytes,
        "weights_base": r.weights_base,
        "data_end": r.data_end,
        "file_len": r.file_len,
        "sha256": DigestHex(&r.checksum).to_string(),
        "config": p.config.as_deref().map(path_json),
        "dims": p.dims.as_ref().map(ModelDims::to_json),
    })
}

/// Create the output directory `dir` and its parents if missing; an error
/// naming it when it exists as something else or cannot be created.
pub fn create_output_dir(dir: &Path) -> Result<(), CliError> {
    if dir.exists() && !dir.is_dir() {
        return Err(err(format!(
            "{}: exists and is not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| err(format!("{}: cannot create: {e}", dir.display())))
}
