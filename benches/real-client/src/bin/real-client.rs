//! The driver: runs the `minilm-*` binaries interleaved, `--rounds` rounds
//! in rotating order (round `r` starts with the `r`-th allocator), each run
//! preceded by the same preparation (map, touch and unmap `--prep-mib` MiB),
//! so that no contender inherits another's warm or cold memory (see
//! [`DEFAULT_PREP_MIB`] for its size). Prints every
//! run, then the medians per allocator and the ratios of each `CkHuge`
//! configuration to the best peer (`System` or mimalloc, whichever is lower
//! on that column). Exits with status 1 if any run fails or the output
//! checksums differ.
//!
//! ```text
//! real-client [--rounds N] [--quick] [--passes N] [--prep-mib M] [--model DIR]
//!             [--only system,mimalloc,...]
//! ```
//!
//! `--quick` is one round (one run per allocator), for CI.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Allocator name and binary; the first two are the peers.
const CONTENDERS: &[(&str, &str)] = &[
    ("system", "minilm-system"),
    ("mimalloc", "minilm-mimalloc"),
    ("ckhuge", "minilm-ckhuge"),
    ("ckhuge-16m", "minilm-ckhuge-16m"),
    ("ckhuge-mimalloc", "minilm-ckhuge-mimalloc"),
];
const PEERS: &[&str] = &["system", "mimalloc"];

/// The columns, in `RESULT` keys; all are lower-is-better costs except the
/// last numeric one (AnonHugePages), which is reported without a ratio.
const COLUMNS: &[(&str, &str)] = &[
    ("load_ms", "load (ms)"),
    ("forward_first_ms", "forward, first (ms)"),
    ("forward_median_ms", "forward, median (ms)"),
    ("minor_faults", "minor page faults"),
    ("hwm_kib", "peak RSS, VmHWM (MiB)"),
    ("anon_huge_kib", "AnonHugePages (MiB)"),
];

/// Memory touched and unmapped before every run, in MiB.
///
/// The preparation gives every contender guest memory that the host backs
/// (the warm state). In a VM with free page reporting (virtio-balloon;
/// Linux's `mm/page_reporting.c`, order 9 here), free 2 MiB blocks are
/// handed back to the host, and a page taken from a reported block faults
/// on the host as well. Measured on this machine, first touch of 180 MiB
/// right after the preparation:
///
/// | preparation | THP pages | 4 KiB pages |
/// | --- | --- | --- |
/// | 512 MiB advised `MADV_HUGEPAGE` | 29-35 ms | 76-95 ms |
/// | 512 MiB of 4 KiB pages | 31-566 ms | 73-117 ms |
/// | 2048 MiB of 4 KiB pages | 45-532 ms (4 of 5 over 349) | 69-84 ms |
///
/// Touched as 2 MiB pages, the preparation leaves whole host-backed 2 MiB
/// blocks on the free lists, which both page sizes draw from; 4 KiB
/// preparations leave a lottery of reported and unreported blocks, and a
/// large one is reported as soon as it is freed. 512 MiB covers a run's
/// peak (~250 MiB); 1024 MiB advised made later 4 KiB touches slow in 3 of
/// 5 trials (139-298 ms).
const DEFAULT_PREP_MIB: usize = 512;

struct Args {
    rounds: usize,
    passes: Option<String>,
    prep_mib: usize,
    model: Option<String>,
    only: Option<Vec<String>>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        rounds: 3,
        passes: None,
        prep_mib: DEFAULT_PREP_MIB,
        model: None,
        only: None,
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
            "--passes" => a.passes = Some(val("--passes")?),
            "--prep-mib" => {
                a.prep_mib = val("--prep-mib")?
                    .parse()
                    .map_err(|_| "--prep-mib: not a number")?
            }
            "--model" => a.model = Some(val("--model")?),
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
                            [--prep-mib M] [--model DIR] [--only a,b]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// Map `mib` MiB of private anonymous memory advised `MADV_HUGEPAGE`, write
/// one byte per 4 KiB page, unmap it (see [`DEFAULT_PREP_MIB`]).
fn prepare(mib: usize) {
    if mib == 0 {
        return;
    }
    let len = mib << 20;
    // SAFETY: a fresh private anonymous mapping, written inside its length,
    // then unmapped whole.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            eprintln!("real-client: preparation: mmap of {mib} MiB failed");
            return;
        }
        // Advice only: without THP the preparation stays in 4 KiB pages.
        libc::madvise(p, len, libc::MADV_HUGEPAGE);
        let p = p.cast::<u8>();
        let mut i = 0;
        while i < len {
            p.add(i).write_volatile(1);
            i += 4096;
        }
        libc::munmap(p.cast(), len);
    }
}

/// One run's `RESULT` fields.
struct Run {
    values: Vec<f64>,
    checksum: String,
}

fn run_one(bin: &Path, args: &Args) -> Result<Run, String> {
    let mut cmd = Command::new(bin);
    if let Some(m) = &args.model {
        cmd.args(["--model", m]);
    }
    if let Some(p) = &args.passes {
        cmd.args(["--passes", p]);
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

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
    let contenders: Vec<(&str, PathBuf)> = CONTENDERS
        .iter()
        .filter(|(name, _)| {
            args.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|x| x == name))
        })
        .map(|&(name, bin)| (name, dir.join(bin)))
        .collect();
    if contenders.is_empty() {
        eprintln!("real-client: --only selects no allocator");
        return ExitCode::from(2);
    }
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    println!(
        "real-client: {} rounds x {} allocators, preparation {} MiB, THP {}, \
         free page reporting {}, load average {}",
        args.rounds,
        contenders.len(),
        args.prep_mib,
        thp.trim(),
        page_reporting(),
        loadavg()
    );
    println!(
        "{:<5} {:<10} {:>9} {:>11} {:>12} {:>9} {:>9} {:>9}  checksum",
        "round", "allocator", "load ms", "fwd1 ms", "fwd med ms", "faults", "RSS MiB", "THP MiB"
    );
    let mut runs: Vec<Vec<Run>> = contenders.iter().map(|_| Vec::new()).collect();
    let started = Instant::now();
    let mut failed = false;
    for round in 0..args.rounds {
        for k in 0..contenders.len() {
            let i = (round + k) % contenders.len();
            let (name, bin) = &contenders[i];
            prepare(args.prep_mib);
            match run_one(bin, &args) {
                Ok(r) => {
                    let v = &r.values;
                    println!(
                        "{:<5} {:<10} {:>9} {:>11} {:>12} {:>9} {:>9} {:>9}  {}",
                        round + 1,
                        name,
                        show(0, v[0]),
                        show(1, v[1]),
                        show(2, v[2]),
                        show(3, v[3]),
                        show(4, v[4]),
                        show(5, v[5]),
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
        "Medians of {} round(s) ({:.0} s in all, load average at the end {}):",
        args.rounds,
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    println!();
    let header: Vec<&str> = COLUMNS.iter().map(|c| c.1).collect();
    println!("| global allocator | {} | checksum |", header.join(" | "));
    println!("|{}", " --- |".repeat(COLUMNS.len() + 2));
    for (i, (name, _)) in contenders.iter().enumerate() {
        let Some(m) = &med[i] else { continue };
        let cells: Vec<String> = m.iter().enumerate().map(|(c, &v)| show(c, v)).collect();
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
        .filter(|(i, (n, _))| PEERS.contains(n) && med[*i].is_some())
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
        for (i, (name, _)) in contenders.iter().enumerate() {
            if PEERS.contains(name) {
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
            sums.push((contenders[i].0, r.checksum.as_str()));
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
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// How an allocator is written in the tables.
fn label(name: &str) -> &str {
    match name {
        "system" => "`System` (glibc)",
        "mimalloc" => "`mimalloc::MiMalloc`",
        "ckhuge" => "`CkHuge::new()`",
        "ckhuge-16m" => "`CkHuge::with_threshold(16 MiB)`",
        "ckhuge-mimalloc" => "`CkHuge::with_small_allocator(MiMalloc)`",
        other => other,
    }
}

/// Free page reporting's minimum order, or "off" when the kernel has none.
fn page_reporting() -> String {
    std::fs::read_to_string("/sys/module/page_reporting/parameters/page_reporting_order")
        .map_or_else(|_| "off".into(), |o| format!("order {}", o.trim()))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
