//! `ckalloc load`: build the arena on a `weights.bump` and verify it.

use crate::arena_load::{self, coverage_json, ModeArg};
use crate::util::{emit_json, err, err_reported, ms, parse_size, sha256, CliError};
use crate::weights_file::{open, verify_checksum};
use crate::{outln, Global};
use indicatif::BinaryBytes;
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// The weights.bump file (its manifests are read from the same directory).
    pub weights: PathBuf,
    /// Arena mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    pub mode: ModeArg,
    /// Size of the runtime region after the weights (bytes; suffixes k, m, g, KiB, MiB, GiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    pub activations: u64,
}

pub fn run(g: Global, a: LoadArgs) -> Result<(), CliError> {
    let path = &a.weights;
    let (file, manifest) = open(path)?;
    file.check_manifest(&manifest)
        .and_then(|()| manifest.check_runtime_offsets())
        .map_err(|e| err(format!("{}: {e}", path.display())))?;
    let checksum = verify_checksum(&file, g.json)?;
    if let Some(e) = checksum {
        return Err(err(format!("{}: {e}", path.display())));
    }
    let l = arena_load::load(path, &file, &manifest, a.mode, a.activations, g.json)?;
    let arena = &l.arena;
    // Every manifest entry, in the arena, against the (checksum-verified) file.
    let reference: Vec<(&str, &[u8])> = manifest
        .iter()
        .map(|e| {
            file.tensor(e)
                .map(|b| (e.name.as_str(), b))
                .map_err(|x| err(format!("{}: {x}", path.display())))
        })
        .collect::<Result<_, _>>()?;
    let v = arena_load::verify(arena, reference);
    let cov = arena.coverage().ok();
    if g.json {
        emit_json(&json!({
            "path": path,
            "container": {"layout": file.container().label(), "id": file.container().id()},
            "tensors": manifest.len(),
            "tensor_bytes": manifest.total_bytes(),
            "checksum": {"ok": true, "sha256": format!("{:x}", sha256(file.checksum()))},
            "arena": l.json(),
            "verified": v.json(),
            "coverage": cov.map(|c| json!({
                "weights": coverage_json(&c.weights),
                "runtime": coverage_json(&c.runtime),
            })),
            "resident": arena_load::resident_json(),
        }));
    } else {
        outln!(
            "{}: layout {}, {} tensors, {}; checksum verified (sha256 {:x})",
            path.display(),
            file.container(),
            manifest.len(),
            BinaryBytes(manifest.total_bytes()),
            sha256(file.checksum())
        );
        outln!(
            "arena: {} = weights [{:#x}, {:#x}) + {} runtime region",
            BinaryBytes(arena.total_size() as u64),
            arena.weights_base(),
            arena.activations_base(),
            BinaryBytes(a.activations)
        );
        outln!(
            "mode: {} ({}); backing {}",
            arena.mode(),
            l.why,
            arena.backing()
        );
        outln!(
            "ready in {:.1} ms (map {:.1} ms{})",
            ms(l.ready()),
            ms(l.build),
            l.weights_detail(true)
        );
        outln!("{}", v.line());
        match cov {
            Some(c) => {
                outln!("coverage: weights {}", c.weights);
                outln!("          runtime {}", c.runtime);
            }
            None => outln!("coverage: unavailable (/proc/self/pagemap and smaps unreadable)"),
        }
        outln!("{}", arena_load::resident_line());
    }
    if !v.mismatches.is_empty() {
        return Err(err_reported(format!(
            "{}: {} of {} tensors differ in the arena (first: {})",
            path.display(),
            v.mismatches.len(),
            v.tensors,
            v.mismatches[0]
        )));
    }
    Ok(())
}
