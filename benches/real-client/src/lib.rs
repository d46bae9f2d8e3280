//! A real inference program under a chosen global allocator: candle's
//! `BertModel` running all-MiniLM-L6-v2 (6 layers, hidden size 384, 90 MB of
//! f32 weights) on a fixed batch of 16 sequences of 128 token ids.
//!
//! Each `minilm-*` binary is a few lines: its `#[global_allocator]` and a
//! call to [`main`]. The work and the measurements are the same for all of
//! them:
//!
//! - load: `std::fs::read` of `model.safetensors` (the read, reported on
//!   its own), `VarBuilder::from_buffered_safetensors` and
//!   `BertModel::load` (the tensor build);
//! - forward: `--passes` forward passes (default 6) of the same batch
//!   (`--batch` sequences, default 16); the time to serve is the load plus
//!   the first 3 passes, the steady median is the median of the passes
//!   after those, and the first pass is reported separately;
//! - CPU time of the whole process in the kernel and in user space;
//! - minor page faults of the whole process (`getrusage(RUSAGE_SELF)`),
//!   peak resident set (`VmHWM` of `/proc/self/status`), `AnonHugePages` of
//!   `/proc/self/smaps_rollup` at the end (model and last output alive);
//! - a checksum of the last output: FNV-1a over the bit patterns of its
//!   f32 values, so that two allocators agree only if every value is equal.
//!
//! The last line of standard output is machine-readable (`RESULT key=value
//! ...`); the `real-client` driver parses it.

pub mod record;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sequences per batch unless `--batch` says otherwise.
pub const BATCH: usize = 16;
/// Token ids per sequence.
pub const SEQ_LEN: usize = 128;
/// Forward passes unless `--passes` says otherwise.
pub const DEFAULT_PASSES: usize = 6;
/// The first forward passes, which count toward the time to serve.
pub const SERVE_PASSES: usize = 3;

/// The model folder `scripts/fetch-model` fills (holds `model.safetensors`
/// and `config.json`), unless `CKALLOC_MODEL_CACHE` names another cache.
pub fn default_model_dir() -> PathBuf {
    let cache = std::env::var_os("CKALLOC_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models"));
    cache.join("all-minilm-l6-v2")
}

/// Options shared by every `minilm-*` binary.
#[derive(Debug, Clone)]
pub struct Options {
    /// Folder with `model.safetensors` and `config.json`.
    pub model_dir: PathBuf,
    /// Forward passes (at least 1).
    pub passes: usize,
    /// Where `minilm-record` writes the trace (`--out FILE`).
    pub out: Option<PathBuf>,
    /// Sequences per batch (1 to [`BATCH`]).
    pub batch: usize,
}

impl Options {
    /// Parse `--model DIR` and `--passes N` from the command line.
    pub fn from_args() -> Result<Options, String> {
        let mut o = Options {
            model_dir: default_model_dir(),
            passes: DEFAULT_PASSES,
            out: None,
            batch: BATCH,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--model" => {
                    let v = args.next().ok_or("--model needs a folder")?;
                    let p = PathBuf::from(v);
                    // Accept the path of model.safetensors itself, as
                    // `scripts/fetch-model` prints it.
                    o.model_dir = if p.is_file() {
                        p.parent().map(Path::to_path_buf).unwrap_or_default()
                    } else {
                        p
                    };
                }
                "--passes" => {
                    let v = args.next().ok_or("--passes needs a number")?;
                    o.passes = v
                        .parse()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| format!("--passes: not a positive number: {v}"))?;
                }
                "--batch" => {
                    let v = args.next().ok_or("--batch needs a number")?;
                    o.batch = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=BATCH).contains(n))
                        .ok_or_else(|| format!("--batch: not a number from 1 to {BATCH}: {v}"))?;
                }
                "--out" => {
                    o.out = Some(PathBuf::from(args.next().ok_or("--out needs a file")?));
                }
                "-h" | "--help" => {
                    return Err(
                        "usage: minilm-ALLOCATOR [--model DIR] [--passes N] [--batch N] [--out TRACE]"
                            .into(),
                    );
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Load plus the first [`SERVE_PASSES`] forward passes.
    pub serve: Duration,
    pub load: Duration,
    /// The part of `load` spent in `std::fs::read` of the file (the rest
    /// builds the tensors: copies out of the buffer into their own storage).
    pub read: Duration,
    pub forward_first: Duration,
    /// The median of the passes after the first [`SERVE_PASSES`] (of all
    /// passes when there are no more).
    pub forward_median: Duration,
    /// CPU time of the process in the kernel and in user space, whole run.
    pub sys: Duration,
    pub user: Duration,
    pub minor_faults: u64,
    pub hwm_kib: u64,
    pub anon_huge_kib: u64,
    pub checksum: u64,
}

impl Report {
    /// The machine-readable line the driver parses.
    pub fn result_line(&self, allocator: &str) -> String {
        format!(
            "RESULT allocator={allocator} serve_ms={:.3} load_ms={:.3} read_ms={:.3} forward_first_ms={:.3} forward_median_ms={:.3} sys_ms={:.3} user_ms={:.3} minor_faults={} hwm_kib={} anon_huge_kib={} checksum={:016x}",
            ms(self.serve),
            ms(self.load),
            ms(self.read),
            ms(self.forward_first),
            ms(self.forward_median),
            ms(self.sys),
            ms(self.user),
            self.minor_faults,
            self.hwm_kib,
            self.anon_huge_kib,
            self.checksum
        )
    }
}

/// Milliseconds as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Points in the run a recorder may mark (see [`record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before `std::fs::read` of the weights.
    Load,
    /// Before forward pass `n` (0-based).
    Forward(u32),
    /// After the last forward pass, before the measurements.
    End,
}

/// The fixed batch: `n` sequences (at most [`BATCH`]) of `SEQ_LEN` ids in `[0, vocab)`,
/// starting with `[CLS]` (101) and ending with `[SEP]` (102); sequence `b`
/// has its last `4 * b` positions masked as padding.
pub fn batch(
    n: usize,
    vocab: usize,
    device: &Device,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let mut ids = Vec::with_capacity(n * SEQ_LEN);
    let mut mask = Vec::with_capacity(n * SEQ_LEN);
    for b in 0..n {
        let len = SEQ_LEN - 4 * b;
        for t in 0..SEQ_LEN {
            let id = if t == 0 {
                101
            } else if t + 1 == len {
                102
            } else if t >= len {
                0
            } else {
                1000 + (b * 7919 + t * 104_729) % (vocab - 1000)
            };
            ids.push(id as u32);
            mask.push(u32::from(t < len));
        }
    }
    let ids = Tensor::from_vec(ids, (n, SEQ_LEN), device)?;
    let types = ids.zeros_like()?;
    let mask = Tensor::from_vec(mask, (n, SEQ_LEN), device)?;
    Ok((ids, types, mask))
}

/// FNV-1a (64-bit) over the bit patterns of `t`'s values, read as f32.
pub fn checksum(t: &Tensor) -> candle_core::Result<u64> {
    let v: Vec<f32> = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        for b in x.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(h)
}

/// Load the model and run the forward passes; `mark` is called at each
/// [`Phase`].
pub fn run(opts: &Options, mark: &dyn Fn(Phase)) -> Result<Report, String> {
    let device = Device::Cpu;
    let config_path = opts.model_dir.join("config.json");
    let weights_path = opts.model_dir.join("model.safetensors");
    let config_text = std::fs::read_to_string(&config_path).map_err(|e| {
        format!(
            "{}: {e} (run scripts/fetch-model first)",
            config_path.display()
        )
    })?;
    let config: Config = serde_json::from_str(&config_text)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    let vocab = config.vocab_size;
    if vocab <= 1000 {
        return Err(format!(
            "vocab_size {vocab} is too small for the fixed batch"
        ));
    }
    let (ids, types, mask) = batch(opts.batch, vocab, &device).map_err(|e| e.to_string())?;

    mark(Phase::Load);
    let t = Instant::now();
    let bytes = std::fs::read(&weights_path).map_err(|e| {
        format!(
            "{}: {e} (run scripts/fetch-model first)",
            weights_path.display()
        )
    })?;
    let read = t.elapsed();
    let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &device)
        .map_err(|e| e.to_string())?;
    let model = BertModel::load(vb, &config).map_err(|e| e.to_string())?;
    let load = t.elapsed();

    let mut times = Vec::with_capacity(opts.passes);
    let mut out = None;
    for i in 0..opts.passes {
        mark(Phase::Forward(i as u32));
        // Drop the previous output first, as a serving loop would.
        drop(out.take());
        let t = Instant::now();
        let o = model
            .forward(&ids, &types, Some(&mask))
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        out = Some(o);
    }
    mark(Phase::End);
    let out = out.ok_or("no forward pass ran")?;
    let checksum = checksum(&out).map_err(|e| e.to_string())?;
    let forward_first = times[0];
    let serve = load + times.iter().take(SERVE_PASSES).sum::<Duration>();
    let mut steady = if times.len() > SERVE_PASSES {
        times[SERVE_PASSES..].to_vec()
    } else {
        times
    };
    steady.sort();
    let forward_median = steady[steady.len() / 2];
    let (hwm_kib, anon_huge_kib) = memory_kib();
    let (sys, user) = cpu_times();
    let report = Report {
        serve,
        read,
        sys,
        user,
        load,
        forward_first,
        forward_median,
        minor_faults: minor_faults(),
        hwm_kib,
        anon_huge_kib,
        checksum,
    };
    drop(model);
    Ok(report)
}

/// CPU time of this process so far in the kernel and in user space
/// (`getrusage(RUSAGE_SELF)`).
pub fn cpu_times() -> (Duration, Duration) {
    // SAFETY: `getrusage` fills the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let d = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    (d(ru.ru_stime), d(ru.ru_utime))
}

/// Minor page faults of this process so far (`getrusage(RUSAGE_SELF)`).
pub fn minor_faults() -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_minflt as u64
}

/// `VmHWM` (peak resident set) and `AnonHugePages`, in KiB; 0 when the
/// kernel does not report them.
pub fn memory_kib() -> (u64, u64) {
    fn field(path: &str, key: &str) -> u64 {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(key))
                    .and_then(|l| l[key.len()..].split_whitespace().next())
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    }
    (
        field("/proc/self/status", "VmHWM:"),
        field("/proc/self/smaps_rollup", "AnonHugePages:"),
    )
}

/// The body of every `minilm-*` binary: parse the options, run, print the
/// report. Returns the process exit code.
pub fn main(allocator: &str) -> std::process::ExitCode {
    let opts = match Options::from_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("minilm-{allocator}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(&opts, &|_| {}) {
        Ok(r) => {
            if allocator.starts_with("ckhuge") {
                // What CkHuge did: tiers, retention, first-touch policy.
                println!("{}", ckalloc::huge_stats());
            }
            print_report(allocator, &opts, &r);
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("minilm-{allocator}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Human-readable lines, then the `RESULT` line.
pub fn print_report(allocator: &str, opts: &Options, r: &Report) {
    println!(
        "{}, batch {} x {SEQ_LEN}, {} forward passes, global allocator {allocator}",
        opts.model_dir.display(),
        opts.batch,
        opts.passes
    );
    println!(
        "time to serve     {:10.1} ms (load and the first {SERVE_PASSES} passes)",
        ms(r.serve)
    );
    println!(
        "load              {:10.1} ms (read {:.1} ms, tensor build {:.1} ms)",
        ms(r.load),
        ms(r.read),
        ms(r.load.saturating_sub(r.read))
    );
    println!("forward, first    {:10.1} ms", ms(r.forward_first));
    println!(
        "forward, median   {:10.1} ms (after the first {SERVE_PASSES})",
        ms(r.forward_median)
    );
    println!(
        "CPU, kernel/user  {:10.1} / {:.1} ms",
        ms(r.sys),
        ms(r.user)
    );
    println!("minor page faults {:10}", r.minor_faults);
    println!("peak RSS (VmHWM)  {:10.1} MiB", r.hwm_kib as f64 / 1024.0);
    println!(
        "AnonHugePages     {:10.1} MiB",
        r.anon_huge_kib as f64 / 1024.0
    );
    println!("checksum          {:016x}", r.checksum);
    println!("{}", r.result_line(allocator));
}
