//! Wall-clock comparisons of ckalloc against what users would otherwise pick.
//!
//! `cargo bench -p ckalloc-benches --bench compare` runs the quick set (under
//! 3 minutes on 2 cores); `... --bench compare -- --full` runs the heavy rows
//! at full size (1 GiB first touch, 4 GiB random reads, 1 GiB weights).
//! `-- --json FILE` also writes the rows as JSON; `-- --plot FILE` also runs
//! the first-touch sweep and writes it as an SVG (both used by
//! `scripts/perf-report`); a relative FILE is taken from the repository root
//! (cargo runs benches in the package's directory, `benches/compare`).
//! Arguments without `--` select rows by substring (`bump`, `first_touch`,
//! `random_reads`, `cache_loop`, `weights`, `threads`, `pool_lock`, `trace`,
//! `purge`;
//! `sweep` runs only the plot data).
//!
//! Each row measures ckalloc and its peer alternately in the same process,
//! several repetitions, and reports the medians of each side's times and the
//! median of the per-repetition ratios (which is not, in general, the ratio
//! of the two medians); the table's header says so.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod alloc;
mod pages;
mod plot;
mod purge;
mod rows;
mod trace;
mod weights;

/// One result row.
pub struct Row {
    pub name: String,
    pub ours: String,
    pub peer: String,
    /// Median ratio, oriented so that larger is better for ckalloc.
    pub ratio: f64,
    pub target: String,
    pub met: bool,
}

impl Row {
    /// The row as written by `--json FILE` (a non-finite ratio is `null`).
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "ours": self.ours,
            "peer": self.peer,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        })
    }
}

/// `path` taken from the repository root when it is relative: cargo runs a
/// bench in its package's directory (`benches/compare`), not where it was
/// called from.
pub fn repo_path(path: &str) -> PathBuf {
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = package
        .parent()
        .and_then(Path::parent)
        .expect("benches/compare");
    root.join(path)
}

/// Measure `f` once.
pub fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = Instant::now();
    let v = black_box(f());
    (t.elapsed(), v)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn fmt_dur(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.2} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--full");
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    let plot = args
        .iter()
        .position(|a| a == "--plot")
        .and_then(|i| args.get(i + 1).cloned());
    // `cargo bench` passes `--bench`; a filter selects rows by substring.
    let filter: Vec<&String> = args[1..]
        .iter()
        .filter(|a| !a.starts_with("--"))
        .filter(|a| json.as_deref() != Some(a.as_str()) && plot.as_deref() != Some(a.as_str()))
        .collect();
    // The `sweep` pseudo-row (first-touch plot data) runs with `--plot` or by name.
    let want = |name: &str| {
        if name == "sweep" {
            plot.is_some() || filter.iter().any(|f| f.as_str() == "sweep")
        } else {
            filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()))
        }
    };
    if let Some(p) = &plot {
        let _ = plot::PATH.set(repo_path(p).display().to_string());
    }

    println!(
        "ckalloc compare ({} mode): {} cores, THP {}",
        if full { "full" } else { "quick" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        ckalloc::probe()
            .thp_enabled
            .unwrap_or_else(|| "unsupported".into())
    );
    let mut table = Vec::new();
    for (name, row) in rows::all() {
        if !want(name) {
            continue;
        }
        eprintln!("running: {name}");
        for r in row(full) {
            print_row(&r);
            table.push(r);
        }
    }
    println!();
    println!(
        "| row | ckalloc (median) | peer (median) \
         | ratio (median of per-repetition ratios; higher is better) | target | met |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for r in &table {
        println!(
            "| {} | {} | {} | {:.2}x | {} | {} |",
            r.name,
            r.ours,
            r.peer,
            r.ratio,
            r.target,
            if r.met { "yes" } else { "**no**" }
        );
    }
    if let Some(path) = json {
        let rows: Vec<serde_json::Value> = table.iter().map(Row::json).collect();
        let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
        std::fs::write(repo_path(&path), text + "\n").expect("write json");
    }
}

fn print_row(r: &Row) {
    println!(
        "{:<58} ours {:>12}  peer {:>12}  ratio {:>7.2}x  target {:<12} {}",
        r.name,
        r.ours,
        r.peer,
        r.ratio,
        r.target,
        if r.met { "met" } else { "NOT MET" }
    );
}
