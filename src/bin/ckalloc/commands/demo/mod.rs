//! `ckalloc demo`: the end-to-end main job. Pack a transformer's
//! `model.safetensors` into `weights.bump`, load it three ways (anon +
//! materialize, forced mixed, auto), verify every tensor against the
//! safetensors view of the original, and run a matrix-vector product for
//! every 2-D F32 weight read in place from the arena, with the outputs in the
//! arena (`Vec::new_in(&arena)`) and the scratch buffers from a
//! `CachingAllocator<CkHuge>`.

mod compute;

use crate::arena_load::{self, coverage_json, ModeArg};
use crate::args::{parse_size_arg, parse_write_version};
use crate::error::{err, err_reported, CliError};
use crate::format::{ms, path_json, DigestHex};
use crate::model::Model;
use crate::output::emit_json;
use crate::packing::{pack, packed_json};
use crate::resident::Resident;
use crate::synthetic::{write_synth, SynthShape};
use crate::weights_file::{binding_words, open_checked, verify_checksum, CheckArgs};
use crate::{outln, Global};
use ckalloc::caching::{CacheStats, CachingAllocator};
use ckalloc::weights::Version;
use ckalloc::CkHuge;
use compute::{compute_all, matrices, output_bytes};
use indicatif::BinaryBytes;
use serde_json::{json, Value};
use std::path::PathBuf;
use tempfile::TempDir;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// The model to serve. Default: the cached all-MiniLM-L6-v2 from
    /// scripts/fetch-model, else the built-in synthetic model.
    pub model: Option<PathBuf>,
    /// Keep weights.bump and its manifests in DIR (default: a temporary directory, removed afterwards).
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Container version to pack.
    #[arg(long, allow_negative_numbers = true, default_value = "5", value_parser = parse_write_version, value_name = "4|5")]
    pub version: Version,
    /// Runtime region per arena beyond what the outputs need (bytes; k, m, g, KiB, MiB, GiB).
    #[arg(long, allow_negative_numbers = true, default_value = "8MiB", value_parser = parse_size_arg, value_name = "SIZE")]
    pub activations: u64,
}

/// The real model, when scripts/fetch-model has cached it.
fn cached_model() -> Option<PathBuf> {
    let p = ckalloc::env::model_cache_dir().join("all-minilm-l6-v2/model.safetensors");
    p.is_file().then_some(p)
}

/// A temporary directory `ckalloc-TAG-*` under the system's temporary
/// directory, removed with its contents when dropped.
fn temp_dir(tag: &str) -> Result<TempDir, CliError> {
    tempfile::Builder::new()
        .prefix(&format!("ckalloc-{tag}-"))
        .tempdir()
        .map_err(|e| {
            err(format!(
                "cannot create a temporary directory in {}: {e}",
                std::env::temp_dir().display()
            ))
        })
}

/// The scratch cache's statistics as JSON (`cache` in `demo --json`).
fn cache_json(s: &CacheStats) -> Value {
    json!({
        "hits": s.hits,
        "misses": s.misses,
        "bypasses": s.bypasses,
        "evictions": s.evictions,
        "live_bytes": s.live_bytes,
        "cached_bytes": s.cached_bytes,
        "cached_blocks": s.cached_blocks,
        "peak_bytes": s.peak_bytes,
        "inner_failures": s.inner_failures,
    })
}

pub fn run(g: Global, a: DemoArgs) -> Result<(), CliError> {
    let json_mode = g.json;
    let text = |line: String| {
        if !json_mode {
            outln!("{line}");
        }
    };

    // 1. The model: given, cached, or synthetic.
    let mut _synth_dir = None;
    let (model_path, synthetic) = match (&a.model, cached_model()) {
        (Some(p), _) => (p.clone(), false),
        (None, Some(p)) => (p, false),
        (None, None) => {
            let d = temp_dir("synth")?;
            let p = write_synth(d.path(), SynthShape::default())?;
            _synth_dir = Some(d);
            (p, true)
        }
    };
    let model = Model::open(&model_path)?;
    let originals = model.tensors()?;
    let original_bytes: u64 = originals.iter().map(|t| t.data.len() as u64).sum();
    if synthetic {
        text(format!(
            "model: no model given and none cached (scripts/fetch-model fetches all-MiniLM-L6-v2): \
             using the built-in synthetic model ({} tensors, {})",
            originals.len(),
            BinaryBytes(original_bytes)
        ));
    } else {
        text(format!(
            "model: {} ({} tensors, {})",
            model_path.display(),
            originals.len(),
            BinaryBytes(original_bytes)
        ));
    }

    // 2. Pack.
    let tmp;
    let out_dir = match &a.output {
        Some(d) => d.clone(),
        None => {
            tmp = temp_dir("demo")?;
            tmp.path().to_path_buf()
        }
    };
    let version = a.version;
    let packed = pack(
        &model,
        &out_dir,
        version,
        ckalloc::weights::DEFAULT_ALIGNMENT,
        json_mode,
    )?;
    let wpath = packed.report.weights_path.clone();
    text(format!(
        "packed: {} ({} bytes, BUMPWGT{}, sha256 {:.16}…)",
        wpath.display(),
        packed.report.file_len,
        version.number(),
        DigestHex(&packed.report.checksum)
    ));
    // The packed file is read back as any other: the manifest through the
    // one check, the checksum with pread.
    let check = CheckArgs {
        strict: true,
        require_manifest_hash: version == Version::V5,
    };
    let (file, checked) = open_checked(&wpath, check)?;
    if let Some(e) = verify_checksum(&wpath, &file, json_mode)? {
        return Err(err(e));
    }
    text(format!(
        "read back: checksum verified, {}",
        binding_words(checked.binding())
    ));
    let manifest = checked.manifest();

    // 3. Load three ways, verify, compute.
    let mats = matrices(manifest);
    let activations = output_bytes(&mats)
        .and_then(|b| b.checked_add(a.activations))
        .ok_or_else(|| {
            err(format!(
                "--activations {}: with the bytes the model's outputs need, the activation size \
                 overflows 64 bits",
                a.activations
            ))
        })?;
    // Threshold 0: every scratch buffer is its own huge-page mapping, so each
    // miss costs an mmap + page faults + zeroing, which the cache saves.
    let cache = CachingAllocator::unbounded(CkHuge::with_threshold(0));
    let reference: Vec<(&str, &[u8])> = originals
        .iter()
        .map(|t| (t.name.as_str(), t.data))
        .collect();
    let mut modes = Vec::new();
    let mut checksums = Vec::new();
    let mut failures = Vec::new();
    for (label, mode) in [
        ("anon + materialize", ModeArg::Anon),
        ("forced mixed", ModeArg::Mixed),
        ("auto", ModeArg::Auto),
    ] {
        let l = arena_load::load(&wpath, &checked, mode, activations, json_mode)?;
        let v = arena_load::verify(&l.arena, reference.iter().copied());
        let cov = l.arena.coverage().ok();
        let work = compute_all(&l.arena, &mats, &cache)?;
        text(String::new());
        text(format!(
            "[{label}] mode {} ({}), backing {}",
            l.arena.mode(),
            l.why,
            l.arena.backing()
        ));
        text(format!(
            "  ready in {:.1} ms (map {:.1} ms{})",
            ms(l.ready()),
            ms(l.build),
            l.weights_detail(false)
        ));
        text(format!("  {}", v.line()));
        if let Some(c) = &cov {
            text(format!("  coverage: weights {}", c.weights));
            text(format!("            runtime {}", c.runtime));
        }
        text(format!(
            "  compute: {} matrix-vector products, {} outputs ({} in the arena), checksum {}",
            work.matrices,
            work.outputs,
            BinaryBytes(work.arena_bytes as u64),
            work.checksum
        ));
        let resident = Resident::read();
        text(format!("  {}", resident.line()));
        if !v.mismatches.is_empty() {
            failures.push(format!(
                "{label}: {} of {} tensors differ (first: {})",
                v.mismatches.len(),
                v.tensors,
                v.mismatches[0]
            ));
        }
        checksums.push(work.checksum);
        modes.push(json!({
            "label": label,
            "arena": l.json(),
            "verified": v.json(),
            "coverage": cov.map(|c| json!({
                "weights": coverage_json(&c.weights),
                "runtime": coverage_json(&c.runtime),
            })),
            "compute": {
                "matrices": work.matrices,
                "outputs": work.outputs,
                "arena_bytes": work.arena_bytes,
                "checksum": work.checksum.to_string(),
            },
            "resident": resident.json(),
        }));
    }
    let equal = checksums.windows(2).all(|w| w[0] == w[1]);
    if !equal {
        failures.push(format!(
            "output checksums differ across modes: {}",
            checksums
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let stats = cache.stats();
    text(String::new());
    text(format!(
        "checksum: {} across the three modes ({})",
        if equal { "equal" } else { "DIFFERENT" },
        checksums[0]
    ));
    text("scratch buffers (CachingAllocator<CkHuge>):".to_string());
    for line in stats.to_string().lines() {
        text(format!("  {line}"));
    }
    if json_mode {
        emit_json(&json!({
            "model": path_json(&model_path),
            "synthetic": synthetic,
            "tensors": originals.len(),
            "tensor_bytes": original_bytes,
            "pack": packed_json(&packed, version, ckalloc::weights::DEFAULT_ALIGNMENT),
            "modes": modes,
            "checksums_equal": equal,
            "checksum": checksums[0].to_string(),
            "cache": cache_json(&stats),
            "ok": failures.is_empty(),
        }));
    }
    if let Some(f) = failures.first() {
        return Err(err_reported(format!("demo failed: {f}")));
    }
    Ok(())
}
