//! The Python workloads the driver runs under each configuration: the
//! steady batch (`serve.py`) and the serving trace (`trace.py`), each with
//! its columns and how its JSON line becomes a row of values.

use crate::memory_state::{median, quantile};
use serde_json::Value;
use std::path::PathBuf;

/// How a column's values compare across configurations.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A time: medians with interquartile ranges, ratios to the peers.
    Time,
    /// A count or a size: medians, ratios to the peers.
    Amount,
    /// Reported, never compared.
    Info,
}

/// A column of a workload's rows: its key in `--records`, its title, its kind.
pub struct Column {
    pub key: &'static str,
    pub title: &'static str,
    pub kind: Kind,
}

const fn col(key: &'static str, title: &'static str, kind: Kind) -> Column {
    Column { key, title, kind }
}

/// A workload: the script, its arguments after the model's directory, its
/// columns, and the extraction of a run's values from its JSON line.
pub struct Workload {
    pub name: &'static str,
    pub script: PathBuf,
    pub args: Vec<String>,
    pub columns: &'static [Column],
    pub values: fn(&Value) -> Result<Vec<f64>, String>,
}

const SERVE_COLUMNS: &[Column] = &[
    col("load_ms", "model load (ms)", Kind::Time),
    col("forward_first_ms", "forward, first (ms)", Kind::Time),
    col(
        "forward_median_ms",
        "forward, median of passes 2-7 (ms)",
        Kind::Time,
    ),
    col("forward_faults", "forward-pass minor faults", Kind::Amount),
    col(
        "forward_faults_after_first",
        "minor faults of passes 2-7",
        Kind::Amount,
    ),
    col("peak_rss_mib", "peak RSS (MiB)", Kind::Amount),
    col("anon_huge_mib", "AnonHugePages (MiB)", Kind::Info),
];

const TRACE_COLUMNS: &[Column] = &[
    col("first_ms", "first request (ms)", Kind::Time),
    col("busy_ms", "busy time (ms)", Kind::Time),
    col("after_idle_ms", "after idle spells, sum (ms)", Kind::Time),
    col("p50_ms", "p50 (ms)", Kind::Time),
    col("p99_ms", "p99 (ms)", Kind::Time),
    col("max_ms", "max (ms)", Kind::Time),
    col("forward_faults", "request minor faults", Kind::Amount),
    col("rss_end_mib", "RSS at the end (MiB)", Kind::Amount),
    col("anon_huge_mib", "AnonHugePages (MiB)", Kind::Info),
];

fn num(v: &Value, k: &str) -> Result<f64, String> {
    v[k].as_f64().ok_or(format!("no {k}"))
}

fn list(v: &Value, k: &str) -> Result<Vec<f64>, String> {
    Ok(v[k]
        .as_array()
        .ok_or(format!("no {k}"))?
        .iter()
        .filter_map(Value::as_f64)
        .collect())
}

impl Workload {
    /// `serve.py`: batch 16 x 128, 7 forward passes.
    pub fn serve(script: PathBuf) -> Workload {
        Workload {
            name: "serve",
            script,
            args: ["16", "128", "7"].map(String::from).to_vec(),
            columns: SERVE_COLUMNS,
            values: |v| {
                let passes = list(v, "forward_ms")?;
                Ok(vec![
                    num(v, "load_ms")?,
                    passes.first().copied().unwrap_or(f64::NAN),
                    median(passes.iter().skip(1).copied().collect()),
                    num(v, "forward_faults")?,
                    num(v, "forward_faults_after_first")?,
                    num(v, "peak_rss_kib")? / 1024.0,
                    num(v, "anon_huge_kib")? / 1024.0,
                ])
            },
        }
    }

    /// `trace.py` with `seed`: the serving trace.
    pub fn trace(script: PathBuf, seed: u64) -> Workload {
        Workload {
            name: "trace",
            script,
            args: vec![seed.to_string()],
            columns: TRACE_COLUMNS,
            values: |v| {
                let lat = list(v, "latency_ms")?;
                let after_idle: f64 = v["after_idle"]
                    .as_array()
                    .ok_or("no after_idle")?
                    .iter()
                    .filter_map(|i| lat.get(usize::try_from(i.as_u64()?).ok()?))
                    .sum();
                Ok(vec![
                    lat.first().copied().unwrap_or(f64::NAN),
                    lat.iter().sum(),
                    after_idle,
                    median(lat.clone()),
                    quantile(lat.clone(), 0.99),
                    lat.iter().copied().fold(f64::NAN, f64::max),
                    num(v, "forward_faults")?,
                    num(v, "rss_end_kib")? / 1024.0,
                    num(v, "anon_huge_kib")? / 1024.0,
                ])
            },
        }
    }
}
