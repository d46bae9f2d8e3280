//! `ckalloc inspect`: header, checksum, manifest check, tensor table, gaps
//! and overlaps.

use crate::error::{err_reported, CliError};
use crate::format::{path_json, shown, DigestHex};
use crate::output::emit_json;
use crate::weights_file::{error_line, open_file, sidecar_dir, verify_checksum, CheckArgs};
use crate::{outln, Global};
use ckalloc::weights::{
    CheckedManifest, DtypeTableCheck, LayoutReport, Manifest, SlotDtype, WeightsError, WeightsFile,
};
use ckalloc::Escaped;
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
    #[command(flatten)]
    pub check: CheckArgs,
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

/// Who the file says wrote it, and where it says so, before the converter
/// families that write its layout.
fn written_by(file: &WeightsFile, manifest: Option<&Manifest>) -> String {
    let said = match (file.created_by(), manifest.and_then(Manifest::generator)) {
        (None, None) if manifest.is_none() => {
            "not recorded in the file (and no manifest could be read)".to_string()
        }
        (Some(c), _) => format!("\"{}\" (v5 metadata created_by)", Escaped::capped(c, 120)),
        (None, Some(g)) => format!(
            "\"{}\" (weights_manifest.json generator)",
            Escaped::capped(g, 120)
        ),
        (None, None) => "not recorded in the file or its manifest".to_string(),
    };
    format!(
        "{said}; files of this layout come from {}",
        file.container().writers()
    )
}

/// The manifest as the sidecars give it, and the check's verdict.
enum ManifestState {
    /// No sidecar: not an error for `inspect`.
    Absent(WeightsError),
    /// The sidecars could not be read or parsed.
    Unreadable(WeightsError),
    /// Parsed, and the check refused it (the parsed copy is kept for the table).
    Refused(Box<Manifest>, WeightsError),
    /// Parsed and accepted.
    Checked(Box<CheckedManifest>),
}

impl ManifestState {
    fn manifest(&self) -> Option<&Manifest> {
        match self {
            ManifestState::Refused(m, _) => Some(m),
            ManifestState::Checked(c) => Some(c.manifest()),
            _ => None,
        }
    }

    /// The error that makes `inspect` exit 1. No manifest at all is one
    /// only when the options ask for a bound or a warning-free manifest.
    fn problem(&self, check: CheckArgs) -> Option<&WeightsError> {
        match self {
            ManifestState::Absent(e) if check.strict || check.require_manifest_hash => Some(e),
            ManifestState::Absent(_) | ManifestState::Checked(_) => None,
            ManifestState::Unreadable(e) | ManifestState::Refused(_, e) => Some(e),
        }
    }
}

fn layout_json(l: &LayoutReport) -> Value {
    json!({
        "region": [l.region.0, l.region.1],
        "covered_bytes": l.covered_bytes,
        "gap_bytes": l.gap_bytes(),
        "gaps": l.gaps.iter().map(|g| json!({"start": g.start, "end": g.end, "after": g.after})).collect::<Vec<_>>(),
        "overlaps": l.overlaps.iter().map(|o| json!({"first": o.first, "second": o.second, "start": o.start, "end": o.end})).collect::<Vec<_>>(),
        "outside": l.outside,
    })
}

pub fn run(g: Global, a: InspectArgs) -> Result<(), CliError> {
    let path = &a.weights;
    let file = open_file(path)?;
    let h = file.header();
    let d = file.dims();
    let c = file.container();
    let (hash_start, hash_end) = file.checksum_range();
    let state = match file.load_manifest(sidecar_dir(path)) {
        Err(e @ WeightsError::ManifestRequired { .. }) => ManifestState::Absent(e),
        Err(e) => ManifestState::Unreadable(e),
        Ok(m) => match file.check_manifest(m.clone(), a.check.options()) {
            Ok(checked) => ManifestState::Checked(Box::new(checked)),
            Err(e) => ManifestState::Refused(Box::new(m), e),
        },
    };
    // `None`: not checked; `Some(None)`: verified; `Some(Some((label,
    // why)))`: a mismatch, or a file that could not be read to the end (the
    // line names the file).
    let checksum: Option<Option<(&str, String)>> = if a.no_verify {
        None
    } else {
        Some(match verify_checksum(path, &file, g.json) {
            Ok(r) => r.map(|m| ("MISMATCH", m)),
            Err(e) => Some(("NOT verified", e.to_string())),
        })
    };
    let checksum_state = match &checksum {
        None => "not checked".to_string(),
        Some(None) => "verified".to_string(),
        Some(Some((label, e))) => format!("{label}: {e}"),
    };
    let manifest = state.manifest();
    let layout = manifest.map(|m| file.layout_report(m));
    let checked = match &state {
        ManifestState::Checked(c) => Some(&**c),
        _ => None,
    };
    let table_note = checked.and_then(|c| match c.dtype_table() {
        DtypeTableCheck::Hint { note } => note.clone(),
        _ => None,
    });
    let table_checked = checked.is_some_and(|c| *c.dtype_table() == DtypeTableCheck::Checked);
    let warnings: Vec<String> = checked
        .map(|c| c.warnings().iter().map(|w| w.to_string()).collect())
        .unwrap_or_default();
    let first_tensor = manifest.and_then(|m| m.iter().map(|e| e.file_offset).min());

    if g.json {
        let tensors: Vec<Value> = manifest
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
        let problem = state.problem(a.check).map(|e| e.to_string());
        let failed = problem.is_some() || matches!(checksum, Some(Some(_)));
        emit_json(&json!({
            "path": path_json(path),
            "container": {
                "layout": c.label(),
                "id": c.id(),
                "writers": c.writers(),
                "magic": String::from_utf8_lossy(&h.version.magic()),
                "checksum_offset": c.offsets().checksum,
                "checksum_range": [hash_start, hash_end],
                "dtype_table_offset": h.dtype_table_offset(),
            },
            "created_by": file.created_by(),
            "header": {
                "version": h.version.number(),
                "model_type": d.model_type,
                "dims": d.to_json(),
                "checksum": DigestHex(&h.checksum).to_string(),
                "dtype_table_len": h.dtype_table_len,
                "dtype_table": slot_summary(&file, manifest),
                "tensor_data_start": h.tensor_data_start,
                "data_end": h.data_end,
                "file_len": h.file_len,
                "metadata_len": h.footer.map(|f| f.len),
                "reserved_nonzero": h.reserved_nonzero,
            },
            "checksum": {
                "checked": checksum.is_some(),
                "ok": checksum.as_ref().map(|c| c.is_none()),
                "error": checksum.as_ref().and_then(|c| c.as_ref().map(|(_, m)| m.clone())),
            },
            "manifest": {
                "loaded": manifest.is_some(),
                "error": match &state {
                    ManifestState::Absent(e) | ManifestState::Unreadable(e) => Some(e.to_string()),
                    _ => None,
                },
                "valid": checked.is_some(),
                "problem": problem,
                "binding": checked.map(|c| c.binding().to_string()),
                "bound": checked.map(|c| c.binding() == ckalloc::weights::ManifestBinding::ManifestHash),
                "warnings": warnings,
                "dtype_table_note": table_note,
                "dtype_table_checked": table_checked,
                "first_tensor": first_tensor,
                "tensors": tensors,
                "total_bytes": manifest.map(|m| m.total_bytes()),
            },
            "layout": layout.as_ref().map(layout_json),
            "exit_code": i32::from(failed),
        }));
    } else {
        outln!("{}", shown(path));
        outln!(
            "  layout {c}, BUMPWGT{}, {} bytes, model_type {}",
            h.version.number(),
            h.file_len,
            d.model_type
        );
        outln!("  written by: {}", written_by(&file, manifest));
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
            "  dtype table at {:#x}: {}",
            h.dtype_table_offset(),
            slot_summary(&file, manifest)
        );
        outln!(
            "  tensor data region [{:#x}, {:#x}) (from the end of the dtype table){}",
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
        outln!("  sha256 {} ({checksum_state})", DigestHex(&h.checksum));
        match &state {
            ManifestState::Absent(e) => outln!("  manifest: none ({e})"),
            ManifestState::Unreadable(e) => outln!("  manifest: INVALID: {e}"),
            ManifestState::Refused(m, e) => outln!(
                "  manifest: {} tensors, {}: INVALID: {e}",
                m.len(),
                BinaryBytes(m.total_bytes())
            ),
            ManifestState::Checked(ch) => {
                let m = ch.manifest();
                outln!(
                    "  manifest: {} tensors, {}, first tensor at {:#x} (valid)",
                    m.len(),
                    BinaryBytes(m.total_bytes()),
                    ch.weights_region().0
                );
                outln!("  manifest binding: {}", ch.binding());
                if table_checked {
                    outln!(
                        "  dtype table: checked (ckalloc writes one code per entry, in file order)"
                    );
                }
                if let Some(n) = &table_note {
                    outln!("  dtype table: {n}");
                }
                for w in &warnings {
                    outln!("  warning: {w}");
                }
            }
        }
        if let Some(m) = manifest {
            outln!();
            outln!(
                "  {:<52} {:<6} {:>12} {:>12}  shape",
                "name",
                "dtype",
                "offset",
                "size"
            );
            for e in m.sorted_by_offset() {
                let shape = e.shape_text().unwrap_or_default();
                outln!(
                    "  {:<52} {:<6} {:>12} {:>12}  {}",
                    Escaped::new(&e.name).to_string(),
                    Escaped::capped(&e.dtype, 40).to_string(),
                    format!("{:#x}", e.file_offset),
                    e.size,
                    shape
                );
            }
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
                    Escaped::new(&o.first),
                    Escaped::new(&o.second),
                    o.start,
                    o.end
                );
            }
            for n in &l.outside {
                outln!("  outside the tensor data: {}", Escaped::new(n));
            }
        }
    }
    if let Some(Some((_, e))) = checksum {
        return Err(err_reported(e));
    }
    if let Some(e) = state.problem(a.check) {
        return Err(err_reported(error_line(path, e)));
    }
    Ok(())
}
