//! `ckalloc load`: build the arena on a `weights.bump` and verify it.

use crate::arena_load::{self, coverage_json, ModeArg};
use crate::args::parse_size_arg;
use crate::error::{err_reported, CliError};
use crate::format::{ms, path_json, shown, DigestHex};
use crate::output::emit_json;
use crate::resident::Resident;
use crate::weights_file::{binding_words, open_checked, CheckArgs};
use crate::{outln, Global};
use ckalloc::weights::DtypeTableCheck;
use ckalloc::Escaped;
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
    #[arg(long, allow_negative_numbers = true, default_value = "64MiB", value_parser = parse_size_arg, value_name = "SIZE")]
    pub activations: u64,
    #[command(flatten)]
    pub check: CheckArgs,
}

pub fn run(g: Global, a: LoadArgs) -> Result<(), CliError> {
    let path = &a.weights;
    let (file, checked) = open_checked(path, a.check)?;
    let manifest = checked.manifest();
    let l = arena_load::load(path, &checked, a.mode, a.activations, g.json)?;
    let arena = &l.arena;
    let v = arena_load::verify_loaded(path, &file, &l, &checked)?;
    let cov = arena.coverage().ok();
    let (hash_start, hash_end) = file.checksum_range();
    let table_checked = *checked.dtype_table() == DtypeTableCheck::Checked;
    let warnings: Vec<String> = checked.warnings().iter().map(|w| w.to_string()).collect();
    let checksum_ok = v.ok();
    let closing = format!(
        "checked: {} of the loaded bytes [{hash_start:#x}, {hash_end:#x}) {} the header's ({:.16}…); {}{}",
        "sha256",
        if checksum_ok { "equals" } else { "DIFFERS from" },
        DigestHex(file.checksum()),
        binding_words(checked.binding()),
        if table_checked {
            "; dtype table checked"
        } else {
            ""
        }
    );
    if g.json {
        emit_json(&json!({
            "path": path_json(path),
            "container": {"layout": file.container().label(), "id": file.container().id()},
            "tensors": manifest.len(),
            "tensor_bytes": manifest.total_bytes(),
            "checksum": {
                "ok": checksum_ok,
                "sha256": DigestHex(file.checksum()).to_string(),
                "range": [hash_start, hash_end],
                "over": "loaded bytes",
            },
            "manifest": {
                "binding": checked.binding().to_string(),
                "bound": checked.binding() == ckalloc::weights::ManifestBinding::ManifestHash,
                "dtype_table_checked": table_checked,
                "warnings": warnings,
            },
            "arena": l.json(),
            "verified": v.json(),
            "coverage": cov.map(|c| json!({
                "weights": coverage_json(&c.weights),
                "runtime": coverage_json(&c.runtime),
            })),
            "resident": Resident::read().json(),
            "exit_code": i32::from(!checksum_ok),
        }));
    } else {
        outln!(
            "{}: layout {}, BUMPWGT{}, {} tensors, {}",
            shown(path),
            file.container(),
            file.version().number(),
            manifest.len(),
            BinaryBytes(manifest.total_bytes()),
        );
        for w in &warnings {
            outln!("warning: {w}");
        }
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
        outln!("{}", Resident::read().line());
        outln!("{closing}");
    }
    if !checksum_ok {
        let which = match v.mismatches.first() {
            Some(first) => format!(
                "{} of {} tensors differ from the file (first: {})",
                v.mismatches.len(),
                v.tensors,
                Escaped::capped(first, 80)
            ),
            None => "every tensor equals the file, so the file itself differs from what its checksum covers".into(),
        };
        let what = v
            .checksum_error
            .as_ref()
            .map_or_else(|| "checksum mismatch".to_string(), |e| e.to_string());
        return Err(err_reported(format!(
            "{}: {what} (hashed over the loaded bytes); {which}",
            shown(path)
        )));
    }
    Ok(())
}
