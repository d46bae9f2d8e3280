//! `ckalloc pack`: `model.safetensors` -> `weights.bump` + both manifests.

use crate::args::{parse_alignment, parse_write_version};
use crate::error::CliError;
use crate::format::DigestHex;
use crate::model::Model;
use crate::output::emit_json;
use crate::packing::{pack, packed_json};
use crate::{outln, Global};
use ckalloc::weights::Version;
use indicatif::BinaryBytes;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct PackArgs {
    /// The safetensors file to pack (its config.json, when next to it, gives the header's model dimensions).
    pub model: PathBuf,
    /// Output directory for weights.bump, weights_manifest.json and weights_manifest.map (created if missing).
    #[arg(short, long, value_name = "DIR")]
    pub output: PathBuf,
    /// Container version: 4 (BUMPWGT4) or 5 (BUMPWGT5, with JSON metadata and footer).
    #[arg(long, allow_negative_numbers = true, default_value = "5", value_parser = parse_write_version, value_name = "4|5")]
    pub version: Version,
    /// Alignment of every tensor's file offset, bytes (a power of two up to 1 GiB).
    #[arg(long, allow_negative_numbers = true, default_value_t = ckalloc::weights::DEFAULT_ALIGNMENT, value_parser = parse_alignment, value_name = "BYTES")]
    pub align: u64,
}

pub fn run(g: Global, a: PackArgs) -> Result<(), CliError> {
    let version = a.version;
    let model = Model::open(&a.model)?;
    let p = pack(&model, &a.output, version, a.align, g.json)?;
    if g.json {
        emit_json(&packed_json(&p, version, a.align));
        return Ok(());
    }
    let r = &p.report;
    outln!(
        "packed {} tensor{} ({}) from {}",
        p.tensors,
        if p.tensors == 1 { "" } else { "s" },
        BinaryBytes(p.tensor_bytes),
        a.model.display()
    );
    outln!(
        "  {}: BUMPWGT{}, {} bytes, alignment {}, weights from the first tensor to data end [{:#x}, {:#x})",
        r.weights_path.display(),
        version.number(),
        r.file_len,
        a.align,
        r.weights_base,
        r.data_end
    );
    outln!("  sha256 {}", DigestHex(&r.checksum));
    outln!("  {}", r.manifest_json_path.display());
    outln!("  {}", r.manifest_map_path.display());
    match (&p.config, &p.dims) {
        (Some(c), Some(d)) => outln!(
            "  dims from {}: layers {}, embed {}, intermediate {}, heads {}/{}, head_dim {}, vocab {}, context {}",
            c.display(),
            d.num_layers,
            d.embed_dim,
            d.intermediate_size,
            d.num_heads,
            d.num_kv_heads,
            d.head_dim,
            d.vocab_size,
            d.context_len
        ),
        _ => outln!("  no config.json next to the model: header dimensions left at 0"),
    }
    Ok(())
}
