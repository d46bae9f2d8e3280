//! The driver: runs the `minilm-*` binaries interleaved, `--rounds` rounds
//! in rotating order (round `r` starts with the `r`-th allocator), each run
//! preceded by the same preparation of the chosen memory state (`--state`,
//! see [`State`](memory_state::State)), so that no contender inherits another's warm or cold
//! memory. Prints every
//! run, then the medians per allocator and the ratios of each `CkHuge`
//! configuration to the best peer (`System` or mimalloc, whichever is lower
//! on that column). Exits with status 1 if any run fails or the output
//! checksums differ.
//!
//! ```text
//! real-client [--rounds N] [--quick] [--passes N] [--batch N] [--state thp,4k,none]
//!             [--prep-mib M] [--model DIR] [--only system,mimalloc,...]
//!             [--baseline DIR] [--records FILE]
//! ```
//!
//! `--baseline DIR` adds each `CkHuge` configuration built from another
//! version of ckalloc (the `minilm-ckhuge*` binaries in `DIR`) as a
//! contender `NAME@base`, interleaved with the rest; `--records FILE`
//! appends every run as a line of JSON, which `scripts/ab-stats` turns into
//! paired ratios of each configuration to its baseline.
//!
//! Peers: `System` (glibc), `System` with glibc's own huge-page mode
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, glibc 2.35 and later: THP
//! advice on the heap and on `mmap`ed chunks, no code change) and mimalloc.
//!
//! `--quick` is one round (one run per allocator), for CI.

#[path = "../memory_state.rs"]
mod memory_state;

use memory_state::{
    loadavg, median, page_reporting, parse_states, prepare, prepare_once, quantile, record, State,
    DEFAULT_PREP_MIB, STATE_4K_PER_RUN_MIB,
};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Environment variables set for one contender's runs.
type Envs = &'static [(&'static str, &'static str)];

/// Allocator name, binary and environment; the first three are the peers.
const CONTENDERS: &[(&str, &str, Envs)] = &[
    ("system", "minilm-system", &[]),
    (
        "system-thp",
        "minilm-system",
        &[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")],
    ),
    ("mimalloc", "minilm-mimalloc", &[]),
    ("ckhuge", "minilm-ckhuge", &[]),
    ("ckhuge-16m", "minilm-ckhuge-16m", &[]),
    ("ckhuge-mimalloc", "minilm-ckhuge-mimalloc", &[]),
];
const PEERS: &[&str] = &["system", "system-thp", "mimalloc"];

/// The columns, in `RESULT` keys; all are lower-is-better costs except the
/// last numeric one (AnonHugePages), which is reported without a ratio.
const COLUMNS: &[(&str, &str)] = &[
    ("serve_ms", "time to serve (ms)"),
    ("load_ms", "load (ms)"),
    ("forward_first_ms", "forward, first (ms)"),
    ("forward_median_ms", "forward, steady median (ms)"),
    ("sys_ms", "CPU in kernel (ms)"),
    ("minor_faults", "minor page faults"),
    ("hwm_kib", "peak RSS, VmHWM (MiB)"),
    ("anon_huge_kib", "AnonHugePages (MiB)"),
];

struct Args {
    rounds: usize,
    passes: Option<String>,
    batch: Option<String>,
    states: Vec<State>,
    prep_mib: usize,
    model: Option<String>,
    only: Option<Vec<String>>,
    baseline: Option<PathBuf>,
    records: Option<String>,
}

/// `v` if it is a decimal number from `lo` to `hi`.
fn number(name: &str, v: &str, lo: u64, hi: u64) -> Result<String, String> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(v.to_string()),
        _ => Err(format!("{name}: {v:?} is not a number from {lo} to {hi}")),
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        rounds: 3,
        passes: None,
        batch: None,
        states: vec![State::Thp],
        prep_mib: DEFAULT_PREP_MIB,
        model: None,
        only: None,
        baseline: None,
        records: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--rounds" => {
                a.rounds = val("--rounds")?
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or("--rounds: not a positive number")?
            }
            "--quick" => a.rounds = 1,
            "--passes" => a.passes = Some(number("--passes", &val("--passes")?, 1, 1000)?),
            "--batch" => a.batch = Some(number("--batch", &val("--batch")?, 1, 16)?),
            "--state" => {
                a.states = parse_states(&val("--state")?)?
            }
            "--prep-mib" => {
                a.prep_mib = number("--prep-mib", &val("--prep-mib")?, 0, 1 << 24)?.parse()
                    .map_err(|_| "--prep-mib: not a number")?
            }
            "--model" => a.model = Some(val("--model")?),
            "--baseline" => a.baseline = Some(val("--baseline")?.into()),
            "--records" => a.records = Some(val("--records")?),
            "--only" => {
                a.only = Some(
                    val("--only")?
                        .split(',')
                        .map(str::to_owned)
                        .collect::<Vec<_>>(),
                )
            }
            "-h" | "--help" => {
                return Err("usage: real-client [--rounds N] [--quick] [--passes N] \
                            [--batch N] [--state thp,4k,none] [--prep-mib M (thp state)] [--model DIR] [--only a,b] \
                            [--baseline DIR] [--records FILE]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(only) = &a.only {
        if let Some(bad) = only
            .iter()
            .find(|o| !CONTENDERS.iter().any(|(name, _, _)| name == o))
        {
            let names: Vec<&str> = CONTENDERS.iter().map(|c| c.0).collect();
            return Err(format!(
                "--only: no allocator {bad:?} (there are {})",
                names.join(", ")
            ));
        }
    }
    Ok(a)
}

/// One run's `RESULT` fields.
struct Run {
    values: Vec<f64>,
    checksum: String,
}

fn run_one(bin: &Path, envs: Envs, args: &Args) -> Result<Run, String> {
    let mut cmd = Command::new(bin);
    cmd.envs(envs.iter().copied());
    if let Some(m) = &args.model {
        cmd.args(["--model", m]);
    }
    if let Some(p) = &args.passes {
        cmd.args(["--passes", p]);
    }
    if let Some(b) = &args.batch {
        cmd.args(["--batch", b]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("RESULT "))
        .ok_or_else(|| format!("{}: no RESULT line", bin.display()))?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .ok_or_else(|| format!("{}: RESULT line lacks {key}", bin.display()))
    };
    let mut values = Vec::new();
    for (key, _) in COLUMNS {
        let v = field(key)?;
        values.push(
            v.parse::<f64>()
                .map_err(|_| format!("{}: {key}={v} is not a number", bin.display()))?,
        );
    }
    Ok(Run {
        values,
        checksum: field("checksum")?.to_owned(),
    })
}

/// Columns whose interquartile range the medians table shows.
const WITH_IQR: &[&str] = &["serve_ms", "load_ms", "forward_median_ms"];

/// A column's value for display (KiB columns in MiB).
fn show(col: usize, v: f64) -> String {
    match COLUMNS[col].0 {
        "minor_faults" => format!("{v:.0}"),
        k if k.ends_with("_kib") => format!("{:.1}", v / 1024.0),
        _ => format!("{v:.1}"),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("real-client: {e}");
            return ExitCode::from(2);
        }
    };
    let dir: PathBuf = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let mut contenders: Vec<(String, PathBuf, Envs)> = CONTENDERS
        .iter()
        .filter(|(name, _, _)| {
            args.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|x| x == name))
        })
        .map(|&(name, bin, envs)| (name.to_owned(), dir.join(bin), envs))
        .collect();
    if let Some(base) = &args.baseline {
        let based: Vec<(String, PathBuf, Envs)> = contenders
            .iter()
            .filter(|(name, _, _)| !PEERS.contains(&name.as_str()))
            .map(|(name, bin, envs)| {
                let file = bin.file_name().unwrap_or_default();
                (format!("{name}@base"), base.join(file), *envs)
            })
            .collect();
        contenders.extend(based);
    }
    if contenders.is_empty() {
        eprintln!("real-client: --only selects no allocator");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for &state in &args.states {
        failed |= run_state(state, &args, &contenders);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Every round of one memory state, then its medians, ratios and checksum
/// check; `true` when a run failed or checksums differ.
fn run_state(state: State, args: &Args, contenders: &[(String, PathBuf, Envs)]) -> bool {
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    println!();
    println!(
        "real-client: {} rounds x {} allocators, memory state {} (preparation {} MiB), THP {}, \
         free page reporting {}, load average {}",
        args.rounds,
        contenders.len(),
        state.name(),
        match state {
            State::Thp => args.prep_mib,
            State::Base4k => STATE_4K_PER_RUN_MIB,
            State::None => 0,
        },
        thp.trim(),
        page_reporting(),
        loadavg()
    );
    println!(
        "{:<5} {:<15} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9}  checksum",
        "round",
        "allocator",
        "serve ms",
        "load ms",
        "fwd1 ms",
        "fwd med ms",
        "sys ms",
        "faults",
        "RSS MiB",
        "THP MiB"
    );
    let mut runs: Vec<Vec<Run>> = contenders.iter().map(|_| Vec::new()).collect();
    let started = Instant::now();
    if let Err(e) = prepare_once(state) {
        eprintln!("real-client: state {}: {e}", state.name());
        return true;
    }
    let mut failed = false;
    for round in 0..args.rounds {
        for k in 0..contenders.len() {
            let i = (round + k) % contenders.len();
            let (name, bin, envs) = &contenders[i];
            if let Err(e) = prepare(state, args.prep_mib) {
                // A run in the wrong memory state would be measured as if
                // it were in this one: skip it and fail the driver.
                eprintln!("real-client: round {}, {name}: {e}", round + 1);
                failed = true;
                continue;
            }
            match run_one(bin, envs, args) {
                Ok(r) => {
                    let v = &r.values;
                    let keyed: Vec<(&str, f64)> =
                        COLUMNS.iter().map(|c| c.0).zip(v.iter().copied()).collect();
                    record(
                        args.records.as_deref(),
                        state.name(),
                        name,
                        round + 1,
                        &keyed,
                    );
                    println!(
                        "{:<5} {:<15} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9}  {}",
                        round + 1,
                        name,
                        show(0, v[0]),
                        show(1, v[1]),
                        show(2, v[2]),
                        show(3, v[3]),
                        show(4, v[4]),
                        show(5, v[5]),
                        show(6, v[6]),
                        show(7, v[7]),
                        r.checksum
                    );
                    runs[i].push(r);
                }
                Err(e) => {
                    eprintln!("real-client: {e}");
                    failed = true;
                }
            }
        }
    }

    // Medians.
    let med: Vec<Option<Vec<f64>>> = runs
        .iter()
        .map(|rs| {
            (!rs.is_empty()).then(|| {
                (0..COLUMNS.len())
                    .map(|c| median(rs.iter().map(|r| r.values[c]).collect()))
                    .collect()
            })
        })
        .collect();
    println!();
    println!(
        "Memory state {}: medians of {} round(s) ({:.0} s in all, load average at the end {}):",
        state.name(),
        args.rounds,
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    println!();
    let header: Vec<&str> = COLUMNS.iter().map(|c| c.1).collect();
    println!("| global allocator | {} | checksum |", header.join(" | "));
    println!("|{}", " --- |".repeat(COLUMNS.len() + 2));
    for (i, (name, _, _)) in contenders.iter().enumerate() {
        let Some(m) = &med[i] else { continue };
        let cells: Vec<String> = m
            .iter()
            .enumerate()
            .map(|(c, &v)| {
                if WITH_IQR.contains(&COLUMNS[c].0) && runs[i].len() > 1 {
                    let col = || runs[i].iter().map(|r| r.values[c]).collect::<Vec<_>>();
                    format!(
                        "{} (IQR {}-{})",
                        show(c, v),
                        show(c, quantile(col(), 0.25)),
                        show(c, quantile(col(), 0.75))
                    )
                } else {
                    show(c, v)
                }
            })
            .collect();
        println!(
            "| {} | {} | {} |",
            label(name),
            cells.join(" | "),
            runs[i].first().map_or("-", |r| r.checksum.as_str())
        );
    }

    // Ratios of each CkHuge configuration to the best peer, per column.
    let peer_idx: Vec<usize> = contenders
        .iter()
        .enumerate()
        .filter(|(i, (n, _, _))| PEERS.contains(&n.as_str()) && med[*i].is_some())
        .map(|(i, _)| i)
        .collect();
    if !peer_idx.is_empty() {
        println!();
        println!("Ratios to the best peer (lower is better for CkHuge; the peer is named):");
        println!();
        let cost_cols = COLUMNS.len() - 1;
        let header: Vec<&str> = COLUMNS[..cost_cols].iter().map(|c| c.1).collect();
        println!("| configuration | {} |", header.join(" | "));
        println!("|{}", " --- |".repeat(cost_cols + 1));
        for (i, (name, _, _)) in contenders.iter().enumerate() {
            if PEERS.contains(&name.as_str()) {
                continue;
            }
            let Some(m) = &med[i] else { continue };
            let cells: Vec<String> = (0..cost_cols)
                .map(|c| {
                    let (best, who) = peer_idx
                        .iter()
                        .map(|&p| (med[p].as_ref().map_or(f64::INFINITY, |v| v[c]), p))
                        .min_by(|a, b| a.0.total_cmp(&b.0))
                        .unwrap_or((f64::NAN, 0));
                    format!("{:.2}x ({})", m[c] / best, contenders[who].0)
                })
                .collect();
            println!("| {} | {} |", label(name), cells.join(" | "));
        }
    }

    // Checksums must agree across every run.
    let mut sums: Vec<(&str, &str)> = Vec::new();
    for (i, rs) in runs.iter().enumerate() {
        for r in rs {
            sums.push((contenders[i].0.as_str(), r.checksum.as_str()));
        }
    }
    if let Some(&(_, first)) = sums.first() {
        let differ: Vec<_> = sums.iter().filter(|(_, s)| *s != first).collect();
        if !differ.is_empty() {
            eprintln!("real-client: output checksums differ: {sums:?}");
            failed = true;
        } else {
            println!();
            println!("checksums: all {} runs agree ({first})", sums.len());
        }
    }
    failed
}

/// How an allocator is written in the tables.
fn label(name: &str) -> &str {
    match name {
        "system" => "`System` (glibc)",
        "system-thp" => "`System`, `glibc.malloc.hugetlb=1`",
        "mimalloc" => "`mimalloc::MiMalloc`",
        "ckhuge" => "`CkHuge::new()`",
        "ckhuge-16m" => "`CkHuge::with_threshold(16 MiB)`",
        "ckhuge-mimalloc" => "`CkHuge::with_small_allocator(MiMalloc)`",
        other => other,
    }
}
