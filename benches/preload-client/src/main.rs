//! The preload client's driver: PyTorch CPU (`serve.py`: transformers'
//! `BertModel` on all-MiniLM-L6-v2, batch 16 x 128, 2 threads, 7 forward
//! passes; with `--workloads serve,trace` also `trace.py`, a seeded serving
//! trace of requests of varying batch and length with idle spells between
//! bursts, `--seed N`) under nine `LD_PRELOAD` configurations users pick
//! today and under ckalloc's preload library, `--rounds` interleaved rounds
//! in each memory state (`--state`; the same states as the real client), then a
//! large-block microbenchmark (`blocks.c`: allocate, touch, free blocks of
//! 2 to 256 MiB and a mix, 1 and 2 threads) under the same configurations,
//! each run preceded by the preparation of its memory state
//! (`--blocks-state`, default `thp,4k`; [`BLOCKS_PREP_MIB`] for `thp`;
//! `--blocks-rounds`, default 5),
//! then the instructions of a small request (`small.c`: `malloc(64)` +
//! `free`, counted by callgrind, [`icount`]) under each configuration.
//! Prints every run, the medians with interquartile ranges, and ckalloc's
//! ratios to the best of the others and to default glibc. Exits 1 when a run
//! fails or the output checksums differ.
//!
//! ```text
//! preload-client --python PY --model DIR --library SO --serve serve.py --trace trace.py
//!                --blocks-src blocks.c --small-src small.c [--workloads serve,trace] [--seed N] [--rounds N] [--quick] [--state thp,4k,none] [--only a,b]
//!                [--no-blocks] [--blocks-state thp,4k] [--blocks-rounds N] [--no-serve] [--no-small]
//!                [--baseline-library SO] [--records FILE]
//! ```
//!
//! The serving trace also runs the configuration `ckalloc-floor` (not the
//! other workloads): ckalloc's library with `CKALLOC_PRELOAD_THRESHOLD` out of reach, so
//! glibc serves every request ([`FLOOR_THRESHOLD`]); it is left out of "the
//! best of the others", and ckalloc's ratio to it is printed.
//!
//! `--baseline-library SO` adds the configuration `ckalloc@base`: another
//! build of the preload library (another version of ckalloc), interleaved
//! with the rest and left out of the "best of the others"; `--records FILE`
//! appends every serve, trace and blocks run as a line of JSON (a trace
//! run's state is `trace-STATE`), which
//! `scripts/ab-stats` turns into paired ratios of ckalloc to its baseline.
//!
//! `benches/preload-client/run` passes the paths.

mod icount;
mod workload;

#[path = "../../real-client/src/memory_state.rs"]
#[allow(dead_code)]
mod memory_state;

use memory_state::{
    loadavg, median, page_reporting, parse_states, prepare, prepare_once, quantile, record, State,
    DEFAULT_PREP_MIB,
};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use workload::{Kind, Workload};

/// MiB of THP touched and freed before each large-block run in the `thp`
/// state: more than the benchmark's peak (two 256 MiB blocks, plus what the
/// allocator keeps), so that every fresh page can come from backed memory.
const BLOCKS_PREP_MIB: usize = 1024;

/// The peer libraries (Debian's packages) and where they are looked for.
const PEER_LIBS: &[(&str, &str)] = &[
    ("jemalloc", "libjemalloc.so.2"),
    ("tcmalloc", "libtcmalloc_minimal.so.4"),
    ("mimalloc", "libmimalloc.so.2"),
];
const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
];

/// A configuration's environment: `LD_PRELOAD` and its variables.
type Env = Vec<(String, String)>;

/// A configuration: its name, the library it preloads (a key of
/// `PEER_LIBS`, `"ckalloc"`, or none) and its environment.
struct Config {
    name: &'static str,
    preload: Option<&'static str>,
    env: &'static [(&'static str, &'static str)],
}

/// The nine configurations users pick today (defaults, then each one's
/// huge-page switch, then jemalloc as Intel's PyTorch guide configures it),
/// then ckalloc.
const CONFIGS: &[Config] = &[
    Config {
        name: "glibc",
        preload: None,
        env: &[],
    },
    Config {
        name: "jemalloc",
        preload: Some("jemalloc"),
        env: &[],
    },
    Config {
        name: "tcmalloc",
        preload: Some("tcmalloc"),
        env: &[],
    },
    Config {
        name: "mimalloc",
        preload: Some("mimalloc"),
        env: &[],
    },
    Config {
        name: "glibc-hugetlb",
        preload: None,
        env: &[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")],
    },
    Config {
        name: "jemalloc-thp",
        preload: Some("jemalloc"),
        env: &[(
            "MALLOC_CONF",
            "thp:always,metadata_thp:auto,oversize_threshold:1,background_thread:true",
        )],
    },
    Config {
        name: "mimalloc-large",
        preload: Some("mimalloc"),
        env: &[("MIMALLOC_LARGE_OS_PAGES", "1")],
    },
    Config {
        name: "torch-thp",
        preload: None,
        env: &[("THP_MEM_ALLOC_ENABLE", "1")],
    },
    Config {
        name: "jemalloc-intel",
        preload: Some("jemalloc"),
        env: &[(
            "MALLOC_CONF",
            "oversize_threshold:1,background_thread:true,metadata_thp:auto,\
             dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000",
        )],
    },
    Config {
        name: "ckalloc",
        preload: Some("ckalloc"),
        env: &[],
    },
    Config {
        name: "ckalloc-floor",
        preload: Some("ckalloc"),
        env: &[("CKALLOC_PRELOAD_THRESHOLD", FLOOR_THRESHOLD)],
    },
    Config {
        name: "ckalloc@base",
        preload: Some("ckalloc@base"),
        env: &[],
    },
];

/// `ckalloc-floor`'s `CKALLOC_PRELOAD_THRESHOLD`: 1 TiB, out of reach of
/// every request, so that glibc serves them all while the library is loaded.
/// Its times are the floor that the requests ckalloc leaves to glibc set:
/// the trace's ratio row "to ckalloc-floor" compares ckalloc with it.
const FLOOR_THRESHOLD: &str = "1099511627776";

/// Whether a configuration is ckalloc's (this build's or the baseline's),
/// not one of the others.
fn is_ckalloc(c: &Config) -> bool {
    c.name.starts_with("ckalloc")
}

struct Args {
    python: PathBuf,
    model: PathBuf,
    library: PathBuf,
    serve: PathBuf,
    trace: PathBuf,
    /// The workloads to run in each state (`--workloads`, default `serve`).
    workloads: Vec<String>,
    /// The serving trace's seed (`--seed`, default 1).
    seed: u64,
    blocks_src: PathBuf,
    small_src: PathBuf,
    rounds: usize,
    /// Rounds of the large-block rows (`--blocks-rounds`, 5 unless given).
    blocks_rounds: usize,
    states: Vec<State>,
    only: Option<Vec<String>>,
    blocks: bool,
    blocks_states: Vec<State>,
    /// Whether to run the PyTorch client (`--no-serve`: the blocks only).
    run_serve: bool,
    /// Whether to count a small request's instructions (`--no-small`).
    small: bool,
    /// The baseline build of the preload library (`ckalloc@base`).
    baseline: Option<PathBuf>,
    records: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        python: "python3".into(),
        model: PathBuf::new(),
        library: PathBuf::new(),
        serve: PathBuf::new(),
        trace: PathBuf::new(),
        workloads: vec!["serve".into()],
        seed: 1,
        blocks_src: PathBuf::new(),
        small_src: PathBuf::new(),
        rounds: 7,
        blocks_rounds: 5,
        states: vec![State::Thp, State::Base4k, State::None],
        only: None,
        blocks: true,
        blocks_states: vec![State::Thp, State::Base4k],
        run_serve: true,
        small: true,
        baseline: None,
        records: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--python" => a.python = val("--python")?.into(),
            "--model" => a.model = val("--model")?.into(),
            "--library" => a.library = val("--library")?.into(),
            "--serve" => a.serve = val("--serve")?.into(),
            "--trace" => a.trace = val("--trace")?.into(),
            "--workloads" => {
                a.workloads = val("--workloads")?.split(',').map(str::to_owned).collect();
                if let Some(w) = a
                    .workloads
                    .iter()
                    .find(|w| !["serve", "trace"].contains(&w.as_str()))
                {
                    return Err(format!("--workloads: {w:?} is not serve or trace"));
                }
            }
            "--seed" => {
                a.seed = val("--seed")?
                    .parse()
                    .ok()
                    .filter(|&s: &u64| s < 1 << 63)
                    .ok_or("--seed: a whole number from 0 to 2^63-1")?
            }
            "--baseline-library" => a.baseline = Some(val("--baseline-library")?.into()),
            "--records" => a.records = Some(val("--records")?),
            "--blocks-src" => a.blocks_src = val("--blocks-src")?.into(),
            "--small-src" => a.small_src = val("--small-src")?.into(),
            "--rounds" => {
                a.rounds = val("--rounds")?
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or("--rounds: a number from 1 to 100")?
            }
            "--blocks-rounds" => {
                a.blocks_rounds = val("--blocks-rounds")?
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or("--blocks-rounds: a number from 1 to 100")?
            }
            "--quick" => {
                a.rounds = 1;
                a.states = vec![State::Thp];
                a.blocks = false;
                a.small = false;
            }
            "--no-blocks" => a.blocks = false,
            "--no-small" => a.small = false,
            "--no-serve" => a.run_serve = false,
            "--blocks-state" => a.blocks_states = parse_states(&val("--blocks-state")?)?,
            "--state" => a.states = parse_states(&val("--state")?)?,
            "--only" => {
                let only: Vec<String> = val("--only")?.split(',').map(str::to_owned).collect();
                if let Some(bad) = only.iter().find(|o| !CONFIGS.iter().any(|c| c.name == *o)) {
                    let names: Vec<&str> = CONFIGS.iter().map(|c| c.name).collect();
                    return Err(format!(
                        "--only: no configuration {bad:?} ({})",
                        names.join(", ")
                    ));
                }
                a.only = Some(only);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.model.is_file() {
        a.model = a.model.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    for (name, p) in [
        ("--model", &a.model),
        ("--library", &a.library),
        ("--serve", &a.serve),
        ("--trace", &a.trace),
    ] {
        let needed = match name {
            "--serve" => a.run_serve && a.workloads.iter().any(|w| w == "serve"),
            "--trace" => a.run_serve && a.workloads.iter().any(|w| w == "trace"),
            _ => true,
        };
        if needed && !p.exists() {
            return Err(format!("{name} {}: not found", p.display()));
        }
    }
    Ok(a)
}

/// The path of a peer library, or where to get it.
fn peer_lib(key: &str) -> Result<PathBuf, String> {
    let file = PEER_LIBS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, f)| *f)
        .ok_or(format!("no library for {key}"))?;
    LIB_DIRS
        .iter()
        .map(|d| Path::new(d).join(file))
        .find(|p| p.is_file())
        .ok_or(format!(
            "{file} not found: apt-get install libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0"
        ))
}

/// A configuration's environment, `LD_PRELOAD` included.
fn environment(c: &Config, a: &Args) -> Result<Vec<(String, String)>, String> {
    let mut env: Vec<(String, String)> = c
        .env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match c.preload {
        None => {}
        Some("ckalloc") => env.push(("LD_PRELOAD".into(), a.library.display().to_string())),
        Some("ckalloc@base") => {
            let lib = a.baseline.as_ref().ok_or("no --baseline-library")?;
            env.push(("LD_PRELOAD".into(), lib.display().to_string()))
        }
        Some(key) => env.push(("LD_PRELOAD".into(), peer_lib(key)?.display().to_string())),
    }
    Ok(env)
}

fn command(program: &Path, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_PRELOAD")
        .env_remove("MALLOC_CONF")
        .env_remove("GLIBC_TUNABLES")
        .env_remove("MIMALLOC_LARGE_OS_PAGES")
        .env_remove("THP_MEM_ALLOC_ENABLE")
        .env_remove("CKALLOC_PRELOAD_THRESHOLD")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

struct Run {
    values: Vec<f64>,
    checksum: String,
}

/// One run of `w` under the environment `env`.
fn run_workload(a: &Args, w: &Workload, env: &[(String, String)]) -> Result<Run, String> {
    let out = command(&a.python, env)
        .arg(&w.script)
        .arg(&a.model)
        .args(&w.args)
        .env("OMP_NUM_THREADS", "2")
        .output()
        .map_err(|e| format!("{}: {e}", a.python.display()))?;
    let script = w.script.file_name().unwrap_or_default().to_string_lossy();
    if !out.status.success() {
        return Err(format!(
            "{script} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or(format!("{script}: no JSON line"))?;
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{script}: {e}"))?;
    Ok(Run {
        values: (w.values)(&v).map_err(|e| format!("{script}: {e}"))?,
        checksum: v["checksum"].as_str().unwrap_or("").to_owned(),
    })
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("preload-client: {e}");
            return ExitCode::from(2);
        }
    };
    let configs: Vec<&Config> = CONFIGS
        .iter()
        .filter(|c| c.name != "ckalloc@base" || a.baseline.is_some())
        .filter(|c| {
            a.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|x| x == c.name))
        })
        .collect();
    let mut envs = Vec::new();
    for c in &configs {
        match environment(c, &a) {
            Ok(e) => envs.push(e),
            Err(e) => {
                eprintln!("preload-client: {}: {e}", c.name);
                return ExitCode::FAILURE;
            }
        }
    }
    // `ckalloc-floor` runs in the serving trace only.
    let (plain, plain_envs): (Vec<&Config>, Vec<Env>) = configs
        .iter()
        .zip(&envs)
        .filter(|(c, _)| c.name != "ckalloc-floor")
        .map(|(c, e)| (*c, e.clone()))
        .unzip();
    let mut failed = false;
    if a.run_serve {
        let workloads: Vec<Workload> = a
            .workloads
            .iter()
            .map(|w| match w.as_str() {
                "trace" => Workload::trace(a.trace.clone(), a.seed),
                _ => Workload::serve(a.serve.clone()),
            })
            .collect();
        for w in &workloads {
            let (cs, es) = match w.name {
                "trace" => (&configs, &envs),
                _ => (&plain, &plain_envs),
            };
            for &state in &a.states {
                failed |= run_state(w, state, &a, cs, es);
            }
        }
    }
    if a.blocks {
        for &state in &a.blocks_states {
            failed |= run_blocks(state, &a, &plain, &plain_envs);
        }
    }
    if a.small {
        failed |= run_small(&a, &plain, &plain_envs);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn run_state(
    w: &Workload,
    state: State,
    a: &Args,
    configs: &[&Config],
    envs: &[Vec<(String, String)>],
) -> bool {
    let columns = w.columns;
    let label = match w.name {
        "serve" => state.name().to_string(),
        other => format!("{other}-{}", state.name()),
    };
    println!();
    println!(
        "preload-client: PyTorch all-MiniLM-L6-v2, {} ({}), {} rounds x {} configurations, memory state {}, \
         free page reporting {}, load average {}",
        w.name,
        w.script.display(),
        a.rounds,
        configs.len(),
        state.name(),
        page_reporting(),
        loadavg()
    );
    if let Err(e) = prepare_once(state) {
        eprintln!("preload-client: {e}");
        return true;
    }
    let mut runs: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    let mut failed = false;
    for round in 0..a.rounds {
        for k in 0..configs.len() {
            let i = (round + k) % configs.len();
            if let Err(e) = prepare(state, DEFAULT_PREP_MIB) {
                eprintln!("preload-client: {e}");
                failed = true;
                continue;
            }
            match run_workload(a, w, &envs[i]) {
                Ok(r) => {
                    let keyed: Vec<(&str, f64)> = columns
                        .iter()
                        .map(|c| c.key)
                        .zip(r.values.iter().copied())
                        .collect();
                    let name = configs[i].name;
                    record(a.records.as_deref(), &label, name, round + 1, &keyed);
                    let cells: Vec<String> = r.values.iter().map(|v| format!("{v:.1}")).collect();
                    println!(
                        "{:<3} {:<15} {}  {}",
                        round + 1,
                        configs[i].name,
                        cells.join(" "),
                        r.checksum
                    );
                    runs[i].push(r);
                }
                Err(e) => {
                    eprintln!(
                        "preload-client: round {}, {}: {e}",
                        round + 1,
                        configs[i].name
                    );
                    failed = true;
                }
            }
        }
    }
    let col = |i: usize, c: usize| runs[i].iter().map(|r| r.values[c]).collect::<Vec<_>>();
    println!();
    // scripts/perf-report reads the steady batch's tables by this heading.
    let heading = if w.name == "serve" {
        "Memory state"
    } else {
        "Serving trace, memory state"
    };
    println!(
        "{heading} {}: medians of {} rounds:",
        state.name(),
        a.rounds
    );
    println!();
    let titles: Vec<&str> = columns.iter().map(|c| c.title).collect();
    println!("| configuration | {} | checksum |", titles.join(" | "));
    println!("|{}", " --- |".repeat(columns.len() + 2));
    for (i, c) in configs.iter().enumerate() {
        if runs[i].is_empty() {
            continue;
        }
        let cells: Vec<String> = (0..columns.len())
            .map(|k| {
                let m = median(col(i, k));
                if columns[k].kind == Kind::Time {
                    format!(
                        "{m:.1} (IQR {:.1}-{:.1})",
                        quantile(col(i, k), 0.25),
                        quantile(col(i, k), 0.75)
                    )
                } else {
                    format!("{m:.0}")
                }
            })
            .collect();
        println!(
            "| {} | {} | {} |",
            c.name,
            cells.join(" | "),
            runs[i][0].checksum
        );
    }
    // ckalloc's ratios to the best of the others and to default glibc.
    if let Some(ck) = configs.iter().position(|c| c.name == "ckalloc") {
        if !runs[ck].is_empty() {
            let compared: Vec<usize> = (0..columns.len())
                .filter(|&k| columns[k].kind != Kind::Info)
                .collect();
            let names: Vec<&str> = compared.iter().map(|&k| titles[k]).collect();
            println!();
            println!("| ckalloc's ratio | {} |", names.join(" | "));
            println!("|{}", " --- |".repeat(compared.len() + 1));
            let mut best = Vec::new();
            let mut glibc = Vec::new();
            let mut floor = Vec::new();
            let floor_at = configs.iter().position(|c| c.name == "ckalloc-floor");
            for &k in &compared {
                let mine = median(col(ck, k));
                let peers: Vec<(f64, &str)> = configs
                    .iter()
                    .enumerate()
                    .filter(|(i, c)| !is_ckalloc(c) && !runs[*i].is_empty())
                    .map(|(i, c)| (median(col(i, k)), c.name))
                    .collect();
                if let Some((v, n)) = peers.iter().copied().min_by(|x, y| x.0.total_cmp(&y.0)) {
                    best.push(format!("{} ({n})", ratio(mine, v)));
                }
                if let Some((v, _)) = peers.iter().find(|(_, n)| *n == "glibc") {
                    glibc.push(ratio(mine, *v));
                }
                if let Some(f) = floor_at.filter(|&f| !runs[f].is_empty()) {
                    floor.push(ratio(mine, median(col(f, k))));
                }
            }
            println!("| to the best of the others | {} |", best.join(" | "));
            if !glibc.is_empty() {
                println!("| to default glibc | {} |", glibc.join(" | "));
            }
            if !floor.is_empty() {
                println!("| to ckalloc-floor | {} |", floor.join(" | "));
            }
        }
    }
    let sums: Vec<&str> = runs.iter().flatten().map(|r| r.checksum.as_str()).collect();
    if sums.windows(2).any(|w| w[0] != w[1]) {
        println!("checksums DIFFER: {sums:?}");
        failed = true;
    } else {
        println!(
            "checksums: all {} runs agree ({})",
            sums.len(),
            sums.first().unwrap_or(&"")
        );
    }
    failed
}

/// ckalloc's median `mine` over a peer's `theirs` as "1.23x"; over a peer's
/// 0 (a count some allocators keep at zero), both values ("1328 against 0",
/// "0.5 against 0": a median of an even count of runs may be a half).
fn ratio(mine: f64, theirs: f64) -> String {
    if theirs == 0.0 {
        format!("{mine} against 0")
    } else {
        format!("{:.2}x", mine / theirs)
    }
}

/// `src` compiled with `cc -O2 -pthread` into a temporary file named after
/// `name`; `None`, said on stderr, when the compiler fails.
fn compile(src: &Path, name: &str) -> Option<PathBuf> {
    let bin = std::env::temp_dir().join(format!("ckalloc-{name}-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(src)
        .status();
    if cc.is_ok_and(|s| s.success()) {
        Some(bin)
    } else {
        eprintln!("preload-client: cc {} failed", src.display());
        None
    }
}

/// The large-block microbenchmark under every configuration, 1 and 2
/// threads, interleaved rounds, each run in memory prepared for `state`;
/// `true` on a failure.
fn run_blocks(state: State, a: &Args, configs: &[&Config], envs: &[Vec<(String, String)>]) -> bool {
    let Some(bin) = compile(&a.blocks_src, "blocks") else {
        return true;
    };
    if let Err(e) = prepare_once(state) {
        eprintln!("preload-client: {e}");
        return true;
    }
    let mut failed = false;
    for threads in [1, 2] {
        // rows[config][row] = ns per op, one per round
        let mut rows: Vec<Vec<(String, Vec<f64>)>> = configs.iter().map(|_| Vec::new()).collect();
        for round in 0..a.blocks_rounds {
            for k in 0..configs.len() {
                let i = (round + k) % configs.len();
                if let Err(e) = prepare(state, BLOCKS_PREP_MIB) {
                    eprintln!("preload-client: {e}");
                    failed = true;
                    continue;
                }
                let out = command(&bin, &envs[i]).arg(threads.to_string()).output();
                let Some(out) = out.ok().filter(|o| o.status.success()) else {
                    eprintln!("preload-client: blocks under {} failed", configs[i].name);
                    failed = true;
                    continue;
                };
                let mut keyed = Vec::new();
                let text = String::from_utf8_lossy(&out.stdout);
                for line in text.lines() {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    if let ["ROW", name, _, ns] = f[..] {
                        let ns: f64 = ns.parse().unwrap_or(f64::NAN);
                        keyed.push((name, ns));
                        match rows[i].iter_mut().find(|(n, _)| n == name) {
                            Some((_, v)) => v.push(ns),
                            None => rows[i].push((name.to_string(), vec![ns])),
                        }
                    }
                }
                let label = format!("blocks-{threads}t-{}", state.name());
                record(
                    a.records.as_deref(),
                    &label,
                    configs[i].name,
                    round + 1,
                    &keyed,
                );
            }
        }
        println!();
        let noun = if threads == 1 { "thread" } else { "threads" };
        println!(
            "Large blocks, {threads} {noun}, memory state {}: median ns per allocate + touch + free ({} rounds)",
            state.name(),
            a.blocks_rounds
        );
        println!();
        let names: Vec<&str> = configs.iter().map(|c| c.name).collect();
        println!(
            "| block | {} | best other's time / ckalloc's (higher is better) |",
            names.join(" | ")
        );
        println!("|{}", " --- |".repeat(configs.len() + 2));
        let row_names: Vec<String> =
            rows.iter()
                .flatten()
                .map(|(n, _)| n.clone())
                .fold(Vec::new(), |mut v, n| {
                    if !v.contains(&n) {
                        v.push(n);
                    }
                    v
                });
        for r in &row_names {
            let med: Vec<Option<f64>> = rows
                .iter()
                .map(|cfg| {
                    cfg.iter()
                        .find(|(n, _)| n == r)
                        .map(|(_, v)| median(v.clone()))
                })
                .collect();
            let cells: Vec<String> = med
                .iter()
                .map(|m| m.map_or("-".into(), |v| format!("{v:.0}")))
                .collect();
            let ck = configs
                .iter()
                .position(|c| c.name == "ckalloc")
                .and_then(|i| med[i]);
            let best = configs
                .iter()
                .zip(&med)
                .filter(|(c, _)| !is_ckalloc(c))
                .filter_map(|(c, m)| m.map(|v| (v, c.name)))
                .min_by(|x, y| x.0.total_cmp(&y.0));
            let ratio = match (ck, best) {
                (Some(ck), Some((b, n))) => format!("{:.2}x ({n})", b / ck),
                _ => "-".into(),
            };
            println!("| {r} | {} | {ratio} |", cells.join(" | "));
        }
    }
    let _ = std::fs::remove_file(&bin);
    failed
}

/// The instructions of one `malloc(64)` + `free` under each configuration
/// ([`icount`]), and each one's difference to default glibc's. Skipped,
/// with the reason, when valgrind is not installed.
fn run_small(a: &Args, configs: &[&Config], envs: &[Vec<(String, String)>]) -> bool {
    println!();
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("Small requests: skipped, valgrind is not installed (apt-get install valgrind)");
        return false;
    }
    let Some(bin) = compile(&a.small_src, "small") else {
        return true;
    };
    let mut failed = false;
    let counts: Vec<Option<f64>> = configs
        .iter()
        .zip(envs)
        .map(|(c, env)| {
            let run = |n: u64| {
                let mut cmd = command(Path::new("valgrind"), env);
                cmd.args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
                    .arg(&bin)
                    .arg(n.to_string());
                cmd
            };
            icount::per_pair(run)
                .map_err(|e| {
                    eprintln!("preload-client: small requests under {}: {e}", c.name);
                    failed = true;
                })
                .ok()
        })
        .collect();
    let _ = std::fs::remove_file(&bin);
    let glibc = configs
        .iter()
        .position(|c| c.name == "glibc")
        .and_then(|i| counts[i]);
    println!(
        "Small requests: instructions per malloc(64) + free (callgrind; runs of {} and {} pairs, \
         the difference over {}):",
        icount::PAIRS,
        2 * icount::PAIRS,
        icount::PAIRS
    );
    println!();
    println!("| configuration | instructions per pair | more than default glibc's |");
    println!("| --- | --- | --- |");
    for (c, n) in configs.iter().zip(&counts) {
        let cell = n.map_or("-".into(), |v| format!("{v:.1}"));
        let more = match (n, glibc) {
            (Some(v), Some(g)) => format!("{:+.1}", v - g),
            _ => "-".into(),
        };
        println!("| {} | {cell} | {more} |", c.name);
    }
    failed
}
