//! Building a [`BumpArena`] on a `weights.bump`, shared by `load` and `demo`.

use crate::error::{err, CliError};
use crate::format::{ms, shown};
use crate::output::progress;
use crate::sigbus;
use crate::weights_file::file_error;
use ckalloc::weights::{CheckedManifest, WeightsFile};
use ckalloc::{ArenaMode, BumpArena, FallbackReason, HugeCoverage, ModePolicy};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

/// `--mode`: which arena mode to build.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    /// Anonymous first, mixed file-backed on failure (honours CK_BUMP_FORCE_MIXED / CK_BUMP_DISABLE_MIXED).
    Auto,
    /// Anonymous huge-page memory; the weights are copied in (materialized).
    Anon,
    /// Weights mapped read-only from the file, runtime region anonymous.
    Mixed,
}

impl ModeArg {
    pub fn name(self) -> &'static str {
        match self {
            ModeArg::Auto => "auto",
            ModeArg::Anon => "anon",
            ModeArg::Mixed => "mixed",
        }
    }

    fn policy(self) -> ModePolicy {
        match self {
            ModeArg::Auto => ModePolicy::Auto,
            ModeArg::Anon => ModePolicy::AnonOnly,
            ModeArg::Mixed => ModePolicy::MixedOnly,
        }
    }
}

/// An arena holding a weights file, ready to use.
pub struct Loaded {
    pub arena: BumpArena,
    /// In mixed mode, turns a `SIGBUS` in the mapped weights into an error line.
    _watch: sigbus::Watch,
    pub requested: ModeArg,
    /// Why the arena is in its mode, in words.
    pub why: String,
    /// Time to map the arena (`build`).
    pub build: Duration,
    /// Time to copy the weights in (anon mode), `None` when not needed.
    pub materialize: Option<Duration>,
}

impl Loaded {
    /// Time from start to an arena whose weights can be read.
    pub fn ready(&self) -> Duration {
        self.build + self.materialize.unwrap_or_default()
    }

    /// How the weights became readable, after the map time in the "ready in"
    /// line: the copy (with its rate when `rate` is set), file pages faulting
    /// in (mixed mode), or nothing to copy (anon mode, empty weights region).
    pub fn weights_detail(&self, rate: bool) -> String {
        let a = &self.arena;
        match (self.materialize, a.mode()) {
            (Some(d), _) if rate => format!(
                ", materialize {:.1} ms at {:.2} GiB/s",
                ms(d),
                (a.activations_base() - a.weights_base()) as f64
                    / (1u64 << 30) as f64
                    / d.as_secs_f64().max(1e-9)
            ),
            (Some(d), _) => format!(", materialize {:.1} ms", ms(d)),
            (None, ArenaMode::Anon) => ", empty weights region: nothing to materialize".into(),
            (None, ArenaMode::MixedFileBacked) => {
                ", weights fault in from the file on first read".into()
            }
        }
    }

    pub fn mode_name(&self) -> &'static str {
        match self.arena.mode() {
            ArenaMode::Anon => "anon",
            ArenaMode::MixedFileBacked => "mixed",
        }
    }

    pub fn json(&self) -> Value {
        let a = &self.arena;
        json!({
            "requested": self.requested.name(),
            "mode": self.mode_name(),
            "why": self.why,
            "backing": a.backing().to_string(),
            "total_size": a.total_size(),
            "weights_base": a.weights_base(),
            "activations_base": a.activations_base(),
            "build_ms": ms(self.build),
            "materialize_ms": self.materialize.map(ms),
            "ready_ms": ms(self.ready()),
        })
    }
}

/// The weights region `[weights_base, activations_base)` of a checked
/// manifest: from the first tensor to the end of tensor data (arena offset
/// == file offset).
pub fn layout(checked: &CheckedManifest) -> Result<(usize, usize), CliError> {
    let (start, end) = checked.weights_region();
    let conv = |v: u64| {
        usize::try_from(v).map_err(|_| err(format!("offset {v:#x} does not fit in usize")))
    };
    Ok((conv(start)?, conv(end)?))
}

/// Build the arena in `mode` over `path` with `activations` bytes of runtime
/// region, and materialize the weights (with a progress bar) when needed.
pub fn load(
    path: &Path,
    checked: &CheckedManifest,
    mode: ModeArg,
    activations: u64,
    json: bool,
) -> Result<Loaded, CliError> {
    let (wb, ab) = layout(checked)?;
    let total = u64::try_from(ab)
        .ok()
        .and_then(|ab| ab.checked_add(activations))
        .and_then(|t| usize::try_from(t).ok())
        .ok_or_else(|| {
            err(format!(
                "arena size {ab} + {activations} bytes of activations overflows"
            ))
        })?;
    let t = Instant::now();
    let mut arena = BumpArena::builder(total)
        .weights_file(path)
        .weights_base(wb)
        .activations_base(ab)
        .policy(mode.policy())
        .manifest(checked.clone())
        .build()
        .map_err(|e| err(format!("{} (--mode {}): {e}", shown(path), mode.name())))?;
    let build = t.elapsed();
    let watch = match arena.mode() {
        ArenaMode::MixedFileBacked => sigbus::watch(
            arena.weights().as_ptr(),
            arena.weights().len(),
            wb as u64,
            &format!("{} (mapped in mixed mode)", path.display()),
        ),
        ArenaMode::Anon => sigbus::watch(std::ptr::null(), 0, 0, ""),
    };
    let why = match (mode, arena.mode(), arena.fallback_reason()) {
        (ModeArg::Anon | ModeArg::Mixed, _, _) => format!("requested with --mode {}", mode.name()),
        (ModeArg::Auto, _, Some(FallbackReason::ForcedByEnv)) => {
            "auto skipped anonymous mode: CK_BUMP_FORCE_MIXED is set".to_string()
        }
        (ModeArg::Auto, _, Some(reason)) => format!("auto fell back to mixed: {reason}"),
        (ModeArg::Auto, ArenaMode::Anon, None) => {
            "auto tries anonymous first and it worked".to_string()
        }
        (ModeArg::Auto, ArenaMode::MixedFileBacked, None) => "auto chose mixed".to_string(),
    };
    let materialize = if arena.needs_weight_materialization() {
        let bar = progress("materialize", json);
        let t = Instant::now();
        arena
            .materialize_weights_with(|done, total| bar.update(done, total))
            .map_err(|e| err(format!("{}: materializing weights: {e}", shown(path))))?;
        bar.finish();
        Some(t.elapsed())
    } else {
        None
    };
    Ok(Loaded {
        arena,
        _watch: watch,
        requested: mode,
        why,
        build,
        materialize,
    })
}

/// The result of comparing every tensor in the arena with a reference.
#[derive(Default)]
pub struct Verified {
    pub tensors: u64,
    pub bytes: u64,
    /// Names of tensors that differ (or are missing), in manifest order.
    pub mismatches: Vec<String>,
    /// The checksum range hashed over the loaded bytes and whether its
    /// SHA-256 equals the header's (`verify_loaded`); `None` when compared
    /// with a reference (`verify`).
    pub checksum: Option<((u64, u64), bool)>,
    /// On a checksum mismatch, the library's error naming the layout, the
    /// range and both digests.
    pub checksum_error: Option<ckalloc::weights::WeightsError>,
}

impl Verified {
    /// True when nothing differs (tensors, and the checksum when hashed).
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty() && self.checksum.is_none_or(|(_, ok)| ok)
    }
}

impl Verified {
    pub fn line(&self) -> String {
        if self.ok() {
            return format!(
                "verified: {} tensors, {} bytes, {} mismatches",
                self.tensors,
                self.bytes,
                self.mismatches.len()
            );
        }
        format!(
            "NOT verified: {} of {} tensors differ ({} bytes compared){}",
            self.mismatches.len(),
            self.tensors,
            self.bytes,
            if self.checksum.is_some_and(|(_, ok)| !ok) {
                "; the loaded bytes fail the checksum"
            } else {
                ""
            }
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "tensors": self.tensors,
            "bytes": self.bytes,
            "mismatches": self.mismatches.len(),
            "mismatched": self.mismatches,
            "checksum_range": self.checksum.map(|((a, b), _)| [a, b]),
            "checksum_ok": self.checksum.map(|(_, ok)| ok),
        })
    }
}

/// Compare each `(name, bytes)` of `reference` with the tensor of that name
/// in the arena (`BumpArena::tensor`, through the manifest it was built
/// with), byte for byte. A tensor missing from the arena counts as a mismatch.
pub fn verify<'r>(
    arena: &BumpArena,
    reference: impl IntoIterator<Item = (&'r str, &'r [u8])>,
) -> Verified {
    let mut v = Verified::default();
    for (name, want) in reference {
        v.tensors += 1;
        v.bytes += want.len() as u64;
        if arena.tensor(name) != Some(want) {
            v.mismatches.push(name.to_string());
        }
    }
    v
}

/// Check the bytes the arena holds against the file's checksum: the SHA-256
/// of the checksum range, taking `[hash start, weights_base)` (the dtype
/// table) from the file and `[weights_base, data_end)` from the arena's
/// weights region, must equal the header's. Every tensor lies in that
/// range, so a match verifies each one as loaded; on a mismatch each tensor
/// in the arena is compared with the file (read with `pread`) to name those
/// that differ. In mixed mode the arena's weights are the file's pages
/// (their partial first and last pages copies read with `pread`).
pub fn verify_loaded(
    path: &Path,
    file: &WeightsFile,
    loaded: &Loaded,
    checked: &CheckedManifest,
) -> Result<Verified, CliError> {
    let arena = &loaded.arena;
    let (start, end) = file.checksum_range();
    let wb = arena.weights_base() as u64;
    let mut h = Sha256::new();
    let head = file
        .range(start, wb.saturating_sub(start))
        .map_err(|e| file_error(path, e))?;
    h.update(&head);
    h.update(arena.weights());
    let digest: [u8; 32] = h.finalize().into();
    let m = checked.manifest();
    let ok = digest == *file.checksum();
    let mut v = Verified {
        tensors: m.len() as u64,
        bytes: m.total_bytes(),
        mismatches: Vec::new(),
        checksum: Some(((start, end), ok)),
        checksum_error: (!ok).then(|| ckalloc::weights::WeightsError::BadChecksum {
            container: file.container(),
            range: (start, end),
            expected: *file.checksum(),
            actual: digest,
        }),
    };
    if !ok {
        for e in m.sorted_by_offset() {
            let want = file.tensor(e).map_err(|x| file_error(path, x))?;
            if arena.tensor(&e.name) != Some(&want[..]) {
                v.mismatches.push(e.name.clone());
            }
        }
    }
    Ok(v)
}

/// A huge-page coverage report (of the weights or the runtime region) as JSON.
pub fn coverage_json(c: &HugeCoverage) -> Value {
    json!({
        "resident_bytes": c.mapped_bytes,
        "huge_bytes": c.huge_bytes,
        "exact": c.exact,
    })
}
