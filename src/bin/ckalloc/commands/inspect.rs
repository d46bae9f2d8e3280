//! `ckalloc inspect`: header, checksum, tensor table, gaps and overlaps.

use crate::util::{emit_json, err_reported, sha256, CliError};
use crate::weights_file::{open_file, sidecar_dir, verify_checksum};
use crate::{outln, Global};
use ckalloc::weights::{Manifest, SlotDtype, WeightsFile};
use indicatif::BinaryBytes;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The weights.bump file (its manifests are read from the same directory).
    pub weights: PathBuf,
    /// Do not hash the file (skip the checksum check).
    #[arg(long)]
    pub no_verify: bool,
}

/// The dtype table as "N slots (fp32 x19, q8_0 x13)", codes read for the
/// file's producer (an ambiguous code 6 stays ambiguous).
fn slot_summary(file: &WeightsFile, manifest: Option<&Manifest>) -> String {
    let slots = file.slot_dtypes(manifest);
    let mut counts: Vec<(SlotDtype, usize)> = Vec::new();
    for s in &slots {
        match counts.iter_mut().find(|(d, _)| d == s) {
            Some((_, n)) => *n += 1,
            None => counts.push((*s, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(d, n)| format!("{d} x{n}")).collect();
    format!("{} slots ({})", slots.len(), parts.join(", "))
}

/// Whether ckalloc's [`WeightsWriter`](ckalloc::weights::WeightsWriter)
/// wrote the file (the v5 metadata's `created_by` or the JSON manifest's
/// `generator` starts with `ckalloc`). Its dtype table then holds exactly one
/// code per manifest entry in file order, so
/// [`WeightsFile::check_dtype_table`] applies and a difference is corruption;
/// C-Kernel-Engine's converters fill the table from their own weight lists,
/// where a difference is only the informational `dtype_table_note`.
fn written_by_ckalloc(file: &WeightsFile, manifest: &Manifest) -> bool {
    let ours = |s: &str| s.starts_with("ckalloc");
    let created_by = file
        .metadata_json()
        .and_then(Result::ok)
        .and_then(|v| v.get("created_by")?.as_str().map(ours));
    created_by.unwrap_or(false) || manifest.generator().is_some_and(ours)
}

pub fn run(g: Global, a: InspectArgs) -> Result<(), CliError> {
    let path = &a.weights;
    let file = open_file(path)?;
    let h = file.header();
    let d = file.dims();
    let c = file.container();
    let (hash_start, hash_end) = file.checksum_range();
    // The sidecars are optional for inspect: without them only the header is shown.
    let manifest = file.load_manifest(sidecar_dir(path));
    let checksum = if a.no_verify {
        None
    } else {
        Some(verify_checksum(&file, g.json)?)
    };
    let checksum_state = match &checksum {
        None => "not checked".to_string(),
        Some(None) => "verified".to_string(),
        Some(Some(e)) => format!("MISMATCH: {e}"),
    };
    let table_checked = manifest
        .as_ref()
        .is_ok_and(|m| written_by_ckalloc(&file, m));
    let (manifest_ok, layout, table_note) = match &manifest {
        Ok(m) => {
            let valid = file
                .check_manifest(m)
                .and_then(|()| m.check_runtime_offsets())
                .and_then(|()| {
                    if table_checked {
                        file.check_dtype_table(m)
                    } else {
                        Ok(())
                    }
                })
                .err()
                .map(|e| e.to_string());
            // A checked table's difference is the problem above, not a note.
            let table = (!table_checked).then(|| file.dtype_table_note(m)).flatten();
            (valid, Some(file.layout_report(m)), table)
        }
        Err(_) => (None, None, None),
    };

    if g.json {
        let tensors: Vec<Value> = manifest
            .as_ref()
            .map(|m| {
                m.sorted_by_offset()
                    .into_iter()
                    .map(|e| {
                        json!({
                            "name": e.name, "dtype": e.dtype, "file_offset": e.file_offset,
                            "size": e.size, "runtime_offset": e.runtime_offset, "shape": e.shape,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        emit_json(&json!({
            "path": path,
            "container": {
                "layout": c.label(),
                "id": c.id(),
                "writers": c.writers(),
                "magic": String::from_utf8_lossy(&h.version.magic()),
                "checksum_offset": c.offsets().checksum,
                "checksum_range": [hash_start, hash_end],
                "dtype_table_offset": h.dtype_table_offset(),
            },
            "header": {
                "version": h.version.number(),
                "model_type": d.model_type,
                "dims": d.to_json(),
                "checksum": format!("{:x}", sha256(&h.checksum)),
                "dtype_table_len": h.dtype_table_len,
                "dtype_table": slot_summary(&file, manifest.as_ref().ok()),
                "tensor_data_start": h.tensor_data_start,
                "data_end": h.data_end,
                "file_len": h.file_len,
                "metadata_len": h.footer.map(|f| f.len),
                "reserved_nonzero": h.reserved_nonzero,
            },
            "checksum": {
                "checked": checksum.is_some(),
                "ok": checksum.as_ref().map(|c| c.is_none()),
                "error": checksum.as_ref().and_then(|c| c.clone()),
            },
            "manifest": {
                "loaded": manifest.is_ok(),
                "error": manifest.as_ref().err().map(|e| e.to_string()),
                "valid": manifest.is_ok() && manifest_ok.is_none(),
                "problem": manifest_ok,
                "dtype_table_note": table_note,
                "dtype_table_checked": table_checked,
                "tensors": tensors,
                "total_bytes": manifest.as_ref().ok().map(|m| m.total_bytes()),
            },
            "layout": layout.as_ref().map(|l| json!({
                "region": [l.region.0, l.region.1],
                "covered_bytes": l.covered_bytes,
                "gap_bytes": l.gap_bytes(),
                "gaps": l.gaps.iter().map(|g| json!({"start": g.start, "end": g.end, "after": g.after})).collect::<Vec<_>>(),
                "overlaps": l.overlaps.iter().map(|o| json!({"first": o.first, "second": o.second, "start": o.start, "end": o.end})).collect::<Vec<_>>(),
                "outside": l.outside,
            })),
        }));
    } else {
        outln!("{}", path.display());
        outln!(
            "  layout {c}, BUMPWGT{}, {} bytes, model_type {}",
            h.version.number(),
            h.file_len,
            d.model_type
        );
        outln!("  written by: {}", c.writers());
        // Only the fields this layout has: a field it lacks is not printed.
        let opt =
            |label: &str, v: Option<u64>| v.map(|v| format!(", {label} {v}")).unwrap_or_default();
        outln!(
            "  dims: layers {}, vocab {}, embed {}{}, context {}, heads {}{}, head_dim {}",
            d.num_layers,
            d.vocab_size,
            d.embed_dim,
            opt("intermediate", d.intermediate_size.map(u64::from)),
            d.context_len,
            d.num_heads,
            d.num_kv_heads.map(|k| format!("/{k}")).unwrap_or_default(),
            d.head_dim
        );
        outln!(
            "  aligned: embed {}, head {}{}, context {}{}{}",
            d.aligned_embed_dim,
            d.aligned_head_dim,
            opt("intermediate", d.aligned_intermediate),
            d.aligned_context,
            d.num_merges
                .map(|m| format!("; merges {m}"))
                .unwrap_or_default(),
            opt("vocab bytes", d.total_vocab_bytes.map(u64::from))
        );
        outln!(
            "  dtype table at {:#x}: {}; tensor data [{:#x}, {:#x}){}",
            h.dtype_table_offset(),
            slot_summary(&file, manifest.as_ref().ok()),
            h.tensor_data_start,
            h.data_end,
            h.footer
                .map(|f| format!("; v5 metadata {} bytes at {:#x}", f.len, f.offset))
                .unwrap_or_default()
        );
        if h.reserved_nonzero {
            outln!("  warning: reserved header bytes are not zero");
        }
        outln!(
            "  checksum at offset {} over [{:#x}, {:#x})",
            c.offsets().checksum,
            hash_start,
            hash_end
        );
        outln!("  sha256 {:x} ({checksum_state})", sha256(&h.checksum));
        match &manifest {
            Err(e) => outln!("  manifest: {e}"),
            Ok(m) => {
                outln!(
                    "  manifest: {} tensors, {} ({})",
                    m.len(),
                    BinaryBytes(m.total_bytes()),
                    manifest_ok.as_deref().unwrap_or("valid")
                );
                if let Some(n) = &table_note {
                    outln!("  dtype table: {n}");
                }
                outln!();
                outln!(
                    "  {:<52} {:<6} {:>12} {:>12}  shape",
                    "name",
                    "dtype",
                    "offset",
                    "size"
                );
                for e in m.sorted_by_offset() {
                    let shape = e
                        .shape
                        .as_ref()
                        .map(|s| format!("{s:?}"))
                        .unwrap_or_default();
                    outln!(
                        "  {:<52} {:<6} {:>12} {:>12}  {}",
                        e.name,
                        e.dtype,
                        format!("{:#x}", e.file_offset),
                        e.size,
                        shape
                    );
                }
                if let Some(l) = &layout {
                    outln!();
                    let largest = l.gaps.iter().map(|g| g.end - g.start).max().unwrap_or(0);
                    outln!(
                        "  layout: {} of [{:#x}, {:#x}) covered; {} gaps ({} padding, largest {} B); {} overlaps; {} outside",
                        BinaryBytes(l.covered_bytes),
                        l.region.0,
                        l.region.1,
                        l.gaps.len(),
                        BinaryBytes(l.gap_bytes()),
                        largest,
                        l.overlaps.len(),
                        l.outside.len()
                    );
                    for o in &l.overlaps {
                        outln!(
                            "  overlap: {} and {} share [{:#x}, {:#x})",
                            o.first,
                            o.second,
                            o.start,
                            o.end
                        );
                    }
                    for n in &l.outside {
                        outln!("  outside the tensor data: {n}");
                    }
                }
            }
        }
    }
    if let Some(Some(e)) = checksum {
        return Err(err_reported(format!("{}: {e}", path.display())));
    }
    if let Some(p) = manifest_ok {
        return Err(err_reported(format!("{}: {p}", path.display())));
    }
    Ok(())
}
