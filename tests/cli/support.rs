//! Running the `ckalloc` binary (`CARGO_BIN_EXE_ckalloc`) from the CLI
//! integration tests, and the inputs they share.
// Each module uses a subset of these helpers.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one command may run before it counts as hung.
pub const TIME_LIMIT: Duration = Duration::from_secs(300);

/// A finished (or killed) run of `ckalloc`.
pub struct Out {
    /// Exit status; `None` when the command was killed at its time limit,
    /// `Some(-1)` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Run ckalloc with `env` added, stdout to `stdout` (`None`: captured) and
/// stdin empty, killing it after `limit`.
pub fn run_with(
    args: &[&str],
    env: &[(&str, &str)],
    stdout: Option<Stdio>,
    limit: Duration,
) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ckalloc"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    // Keep the tests independent of the caller's environment.
    for v in [
        "CK_BUMP_FORCE_MIXED",
        "CK_BUMP_DISABLE_MIXED",
        "CKALLOC_THP",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    match stdout {
        Some(s) => cmd.stdout(s),
        None => cmd.stdout(std::fs::File::create(&out_path).unwrap()),
    };
    let mut child = cmd.spawn().expect("run ckalloc");
    let start = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s.code().unwrap_or(-1));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

pub fn ckalloc(args: &[&str]) -> Out {
    ckalloc_env(args, &[])
}

pub fn ckalloc_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    run_with(args, env, None, TIME_LIMIT)
}

/// Stdout of a command that must succeed.
pub fn ok(args: &[&str]) -> String {
    let o = ckalloc(args);
    assert_eq!(o.code, Some(0), "ckalloc {args:?} failed: {}", o.stderr);
    o.stdout
}

/// The `--json` document of a command that must succeed.
pub fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let s = ok(&a);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("ckalloc {a:?}: not JSON ({e}): {s}"))
}

/// A failure: exit status `code`, exactly one line on stderr naming the error.
pub fn fails(args: &[&str], code: i32, needle: &str) -> String {
    let o = ckalloc(args);
    assert_eq!(
        o.code,
        Some(code),
        "ckalloc {args:?}: {} / {}",
        o.stdout,
        o.stderr
    );
    assert_eq!(
        o.stderr.lines().count(),
        1,
        "ckalloc {args:?}: stderr is not one line: {:?}",
        o.stderr
    );
    assert!(
        o.stderr.starts_with("ckalloc: error: "),
        "ckalloc {args:?}: {:?}",
        o.stderr
    );
    assert!(
        o.stderr.contains(needle),
        "ckalloc {args:?}: {:?} lacks {needle:?}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    o.stderr
}

/// Exit status 1, one `ckalloc: error:` line containing `needle`, and with
/// `--json` a parseable document on stdout.
pub fn assert_one_line_error(o: &Out, args: &[&str], needle: &str) {
    assert_eq!(
        o.code,
        Some(1),
        "ckalloc {args:?}: {} / {}",
        o.stdout,
        o.stderr
    );
    assert_eq!(
        o.stderr.lines().count(),
        1,
        "ckalloc {args:?}: {:?}",
        o.stderr
    );
    assert!(o.stderr.starts_with("ckalloc: error: "), "{:?}", o.stderr);
    assert!(o.stderr.contains(needle), "{:?} lacks {needle:?}", o.stderr);
    if args.contains(&"--json") {
        let v: Value = serde_json::from_str(&o.stdout)
            .unwrap_or_else(|e| panic!("ckalloc {args:?}: not JSON ({e}): {}", o.stdout));
        assert_eq!(v["exit_code"], 1, "{v}");
    }
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// `ckalloc synth DIR`; returns the path of the model.
pub fn synth(dir: &Path) -> String {
    ok(&["synth", s(dir)]);
    s(&dir.join("model.safetensors")).to_string()
}

/// A synthetic model (via `ckalloc synth`) packed into `dir/packed`.
pub fn packed(dir: &Path, version: &str) -> (PathBuf, PathBuf) {
    let model_dir = dir.join("model");
    ok(&["synth", s(&model_dir)]);
    let model = model_dir.join("model.safetensors");
    let out = dir.join("packed");
    ok(&["pack", s(&model), "-o", s(&out), "--version", version]);
    (model, out.join("weights.bump"))
}

/// Raw safetensors bytes: 8-byte header length, header JSON, data.
pub fn raw_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}
