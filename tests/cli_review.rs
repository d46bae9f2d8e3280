//! Hostile-input findings of the second CLI review (run with `--features cli`):
//! each test failed before its fix in `src/bin/ckalloc/**`.
#![cfg(feature = "cli")]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Run ckalloc with stdout to `stdout` (`None`: captured), killing it after
/// `limit` (a hang is reported as `code == None`).
fn run_with(args: &[&str], stdout: Option<Stdio>, limit: Duration) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ckalloc"));
    cmd.args(args)
        .env_remove("CK_BUMP_FORCE_MIXED")
        .env_remove("CK_BUMP_DISABLE_MIXED")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
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

fn run(args: &[&str]) -> Out {
    run_with(args, None, Duration::from_secs(60))
}

/// Exit status 1, one `ckalloc: error:` line containing `needle`, and with
/// `--json` a parseable document on stdout.
fn assert_one_line_error(o: &Out, args: &[&str], needle: &str) {
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
        let v: serde_json::Value = serde_json::from_str(&o.stdout)
            .unwrap_or_else(|e| panic!("ckalloc {args:?}: not JSON ({e}): {}", o.stdout));
        assert_eq!(v["exit_code"], 1, "{v}");
    }
}

fn synth(dir: &Path) -> String {
    let d = dir.to_str().unwrap();
    let o = run(&["synth", d]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    dir.join("model.safetensors").to_str().unwrap().to_string()
}

/// A safetensors file with the given JSON header and data bytes.
fn safetensors(path: &Path, header: &serde_json::Value, data: &[u8]) {
    let h = header.to_string();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(h.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// `config.json` next to the model that is a FIFO (no writer) or a device
/// made `pack` and `demo` block forever (or read without end).
#[test]
fn config_json_that_is_not_a_regular_file_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path());
    let cfg = dir.path().join("config.json");
    std::fs::remove_file(&cfg).unwrap();
    let c = std::ffi::CString::new(cfg.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other preconditions.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = dir.path().join("out");
    for args in [
        vec!["pack", &model, "-o", out.to_str().unwrap(), "--json"],
        vec!["demo", &model],
    ] {
        let o = run_with(&args, None, Duration::from_secs(30));
        assert!(
            o.code.is_some(),
            "ckalloc {args:?} hangs on a FIFO config.json"
        );
        assert_one_line_error(&o, &args, "config.json");
    }
    // A character device that never ends: refused, not read.
    std::fs::remove_file(&cfg).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &cfg).unwrap();
    let args = ["pack", &model, "-o", out.to_str().unwrap()];
    let o = run_with(&args, None, Duration::from_secs(30));
    assert!(o.code.is_some(), "ckalloc {args:?} reads /dev/zero forever");
    assert_one_line_error(&o, &args, "config.json");
}

/// A 2-D F32 tensor with zero columns and 2^28 rows (an 80-byte file) made
/// the demo allocate and fill 1.5 GiB (larger row counts: out of memory).
#[test]
fn demo_skips_empty_matrices_instead_of_allocating_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("zerocols.safetensors");
    safetensors(
        &model,
        &serde_json::json!({
            "w": {"dtype": "F32", "shape": [1u64 << 28, 0], "data_offsets": [0, 0]},
            "v": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        }),
        &[0u8; 16],
    );
    let args = ["demo", model.to_str().unwrap(), "--json"];
    let o = run_with(&args, None, Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    for m in v["modes"].as_array().unwrap() {
        assert_eq!(m["compute"]["matrices"], 1, "{m}");
        assert_eq!(m["compute"]["outputs"], 2, "{m}");
    }
}

/// A failed write to stdout other than a closed pipe (disk full) must fail
/// the command: it exited 0 with the report lost.
#[test]
fn stdout_write_failure_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out_dir = dir.path().join("again");
    let args = ["synth", out_dir.to_str().unwrap()];
    let o = run_with(&args, Some(Stdio::from(full)), Duration::from_secs(30));
    assert_one_line_error(&o, &args, "stdout");
}

/// `--align 1073741824` (documented as allowed) padded a 3.6 MiB model into
/// a 40 GiB file; a plan whose padding dwarfs the tensors is refused up front.
#[test]
fn absurd_alignment_padding_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path());
    let out = dir.path().join("out");
    let args = [
        "pack",
        &model,
        "-o",
        out.to_str().unwrap(),
        "--align",
        "1073741824",
        "--json",
    ];
    let o = run_with(&args, None, Duration::from_secs(30));
    assert!(
        o.code.is_some(),
        "pack --align 1GiB is still writing after 30 s"
    );
    assert_one_line_error(&o, &args, "--align 1073741824");
    let left: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "files left behind: {left:?}");
    // A large but sane alignment still works (2 MiB: huge-page aligned tensors).
    let args = [
        "pack",
        &model,
        "-o",
        out.to_str().unwrap(),
        "--align",
        "2097152",
    ];
    let o = run(&args);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

/// `-o` naming an existing regular file said "File exists (os error 17)".
#[test]
fn output_that_is_a_file_says_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path());
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let args = ["pack", &model, "-o", file.to_str().unwrap(), "--json"];
    let o = run(&args);
    assert_one_line_error(&o, &args, "not a directory");
}
