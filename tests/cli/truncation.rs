//! A `weights.bump` truncated while `ckalloc` reads it: one error line and
//! exit status 1, never a death by signal.
//!
//! The truncation comes from an `LD_PRELOAD` shim, `tests/c/truncate_shim.c`,
//! compiled here with the system `cc`: it interposes `pread`/`pread64` and
//! `mmap`/`mmap64` and truncates the file at an exact point of the run
//! (after the first large `pread` of it, or right after it is mapped), so
//! nothing depends on timing. The tests skip (printing why) without `cc`.
//!
//! - `inspect` hashes the file with `pread`: the read after the truncation
//!   is short, `WeightsError::FileChanged`.
//! - `load --mode anon` copies the file with parallel `pread`s: a short read
//!   or the size check after the copy fails.
//!
//!   Both truncate after the first large read of the file whichever way it
//!   is read (`TRUNC_AFTER=any`: a `pread` of at least 1 MiB or a mapping),
//!   so a reader that maps the file (`WeightsFile::open` must not) dies of
//!   `SIGBUS` here and fails the test.
//! - `load --mode mixed` maps the file: reading a page past the new end
//!   raises `SIGBUS`, which the tool's handler turns into its error line.
//!   A `SIGBUS` outside the watched mapping keeps its default action.

use crate::support::{assert_one_line_error, ok, run_with, s, Out, TIME_LIMIT};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Bytes of tensor data in the test model: 64 MiB, so `inspect` hashes it
/// in several 8 MiB chunks and `load --mode anon` copies it in 16 MiB
/// blocks on several threads (the library's parallel threshold).
const TENSOR_BYTES: u64 = 64 << 20;
/// The length the shim truncates the file to: the header, the dtype table
/// and the first tensor bytes stay, the rest is gone.
const TRUNC_TO: u64 = 1 << 20;
const TRUNC_TO_STR: &str = "1048576";
/// `TRUNC_AFTER=pread` waits for a read of at least this many bytes: the
/// header and table reads at open are smaller, the hash chunks (8 MiB) and
/// the copy's blocks (16 MiB) bigger.
const MIN_LEN_STR: &str = "1048576";

/// The shim, compiled once per test binary into Cargo's temporary directory
/// for integration tests; `None` when there is no `cc`.
fn shim() -> Option<&'static Path> {
    static SHIM: OnceLock<Option<PathBuf>> = OnceLock::new();
    SHIM.get_or_init(build_shim).as_deref()
}

fn build_shim() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli_truncation");
    std::fs::create_dir_all(&dir).unwrap();
    // Compile under a name of this process, then rename: another run of
    // this binary may be loading the library at the final name.
    let tmp = dir.join(format!("libtrunc.so.{}", std::process::id()));
    let out = Command::new("cc")
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC",
        ])
        .arg("-o")
        .arg(&tmp)
        .arg(root.join("tests/c/truncate_shim.c"))
        .arg("-ldl")
        .output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("run cc: {e}"),
        Ok(o) => assert!(
            o.status.success(),
            "cc failed for tests/c/truncate_shim.c: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
    let lib = dir.join("libtrunc.so");
    std::fs::rename(&tmp, &lib).unwrap();
    Some(lib)
}

/// The shim, or `None` after printing why `test` is skipped.
fn shim_or_skip(test: &str) -> Option<&'static str> {
    match shim() {
        Some(p) => Some(s(p)),
        None => {
            eprintln!("SKIP {test}: no C compiler (`cc`) to build the LD_PRELOAD shim");
            None
        }
    }
}

/// A safetensors model of one 64 MiB F32 tensor (sparse zeros), packed as
/// BUMPWGT`version` into `dir/v{version}`; returns the `weights.bump`.
/// `--align 65536` puts the first tensor and the end of tensor data on a
/// page boundary (4 KiB to 64 KiB pages), so mixed mode maps every weights
/// byte from the file and reads no partial last page with `pread` after
/// mapping: a truncation right after the mapping is seen as `SIGBUS`.
fn packed_big(dir: &Path, version: &str) -> PathBuf {
    let model = dir.join("big.safetensors");
    if !model.exists() {
        let header = format!(
            r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{TENSOR_BYTES}]}}}}"#,
            TENSOR_BYTES / 4
        );
        let head = crate::support::raw_safetensors(&header, &[]);
        std::fs::write(&model, &head).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&model)
            .unwrap();
        f.set_len(head.len() as u64 + TENSOR_BYTES).unwrap();
    }
    let out = dir.join(format!("v{version}"));
    ok(&[
        "pack",
        s(&model),
        "-o",
        s(&out),
        "--version",
        version,
        "--align",
        "65536",
    ]);
    out.join("weights.bump")
}

/// A fresh copy of the packed directory of `wb` (the file and its
/// manifests) in `dir/name`, for one run that truncates it; returns the
/// copy's `weights.bump` and its length.
fn fresh(wb: &Path, dir: &Path, name: &str) -> (PathBuf, u64) {
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(wb.parent().unwrap()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    let copy = to.join("weights.bump");
    let len = std::fs::metadata(&copy).unwrap().len();
    (copy, len)
}

/// Run ckalloc with the shim preloaded and `env` added.
fn under_shim(shim: &str, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut e = vec![("LD_PRELOAD", shim)];
    e.extend_from_slice(env);
    run_with(args, &e, None, TIME_LIMIT)
}

/// The shim settings that truncate `path` to [`TRUNC_TO`] bytes after
/// `after` (`pread`: the first read of at least 1 MiB; `mmap`: the first
/// mapping; `any`: whichever of the two comes first).
fn truncating<'a>(path: &'a str, after: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("TRUNC_PATH", path),
        ("TRUNC_TO", TRUNC_TO_STR),
        ("TRUNC_AFTER", after),
        ("TRUNC_MIN_LEN", MIN_LEN_STR),
    ]
}

/// The file is [`TRUNC_TO`] bytes now (the shim did truncate it), and the
/// run ended by `exit` with status 1, not by a signal.
fn assert_truncated_and_exited(o: &Out, args: &[&str], path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    assert_eq!(
        len, TRUNC_TO,
        "ckalloc {args:?}: the shim did not truncate the file (is it preloaded?): {} / {}",
        o.stdout, o.stderr
    );
    assert_ne!(
        o.code,
        Some(-1),
        "ckalloc {args:?} died by a signal: {}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
}

#[test]
fn inspect_of_a_file_truncated_between_hash_chunks_is_an_error_line() {
    let Some(shim) =
        shim_or_skip("inspect_of_a_file_truncated_between_hash_chunks_is_an_error_line")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for version in ["4", "5"] {
        let packed = packed_big(dir.path(), version);
        for json in [false, true] {
            let (wb, _) = fresh(&packed, dir.path(), &format!("run-v{version}-{json}"));
            let mut args = vec!["inspect", s(&wb)];
            if json {
                args.push("--json");
            }
            let o = under_shim(shim, &args, &truncating(s(&wb), "any"));
            assert_truncated_and_exited(&o, &args, &wb);
            assert_one_line_error(&o, &args, "the file changed while being read");
            assert!(
                o.stderr.contains(&format!("{}: ", wb.display()))
                    && o.stderr.contains(&format!("{TRUNC_TO} bytes now")),
                "v{version}: {:?}",
                o.stderr
            );
            // The error line names the file once.
            assert_eq!(
                o.stderr.matches(&wb.display().to_string()).count(),
                1,
                "v{version}: {:?}",
                o.stderr
            );
        }
    }
}

#[test]
fn anon_load_of_a_file_truncated_during_the_copy_is_an_error_line() {
    let Some(shim) = shim_or_skip("anon_load_of_a_file_truncated_during_the_copy_is_an_error_line")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for version in ["4", "5"] {
        let packed = packed_big(dir.path(), version);
        for json in [false, true] {
            let (wb, len) = fresh(&packed, dir.path(), &format!("run-v{version}-{json}"));
            let mut args = vec!["load", "--mode", "anon", s(&wb)];
            if json {
                args.push("--json");
            }
            let o = under_shim(shim, &args, &truncating(s(&wb), "any"));
            assert_truncated_and_exited(&o, &args, &wb);
            assert_one_line_error(&o, &args, "materializing weights: ");
            // Which of the copy's threads notices first is up to the
            // scheduler: a read that comes back short, or, when every read
            // was done before the truncation, the size check after the copy.
            let short_read = o.stderr.contains(" of the weights file at offset ")
                && o.stderr.contains(
                    " failed: file ended before the expected length (truncated or changed while reading)",
                );
            let size_changed = o.stderr.contains(&format!(
                "weights file changed size: {len} bytes when checked, {TRUNC_TO} bytes now"
            ));
            assert!(short_read || size_changed, "v{version}: {:?}", o.stderr);
        }
    }
}

/// The byte offset in the handler's line "... reading its byte N raised SIGBUS ...".
fn sigbus_byte(stderr: &str) -> u64 {
    let rest = stderr
        .split("reading its byte ")
        .nth(1)
        .unwrap_or_else(|| panic!("no byte offset: {stderr:?}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn mixed_load_of_a_file_truncated_after_mapping_is_an_error_line_not_sigbus() {
    let Some(shim) =
        shim_or_skip("mixed_load_of_a_file_truncated_after_mapping_is_an_error_line_not_sigbus")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for version in ["4", "5"] {
        let wb = packed_big(dir.path(), version);
        let args = ["load", "--mode", "mixed", s(&wb)];
        let o = under_shim(shim, &args, &truncating(s(&wb), "mmap"));
        assert_truncated_and_exited(&o, &args, &wb);
        assert_one_line_error(&o, &args, " raised SIGBUS (another process truncated it)");
        assert!(
            o.stderr.starts_with(&format!(
                "ckalloc: error: {} (mapped in mixed mode): the file shrank while it was mapped: reading its byte ",
                wb.display()
            )),
            "v{version}: {:?}",
            o.stderr
        );
        // The first byte past the new end, give or take the page a wide
        // load started in (pages are at most 64 KiB).
        let byte = sigbus_byte(&o.stderr);
        assert!(
            (TRUNC_TO..TRUNC_TO + (64 << 10)).contains(&byte),
            "v{version}: byte {byte}: {:?}",
            o.stderr
        );
        // With --json the handler also prints the error document on stdout.
        let wb = packed_big(dir.path(), version);
        let args = ["load", "--mode", "mixed", s(&wb), "--json"];
        let o = under_shim(shim, &args, &truncating(s(&wb), "mmap"));
        assert_one_line_error(&o, &args, " raised SIGBUS (another process truncated it)");
        let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        assert!(
            j["error"].as_str().unwrap().contains("raised SIGBUS"),
            "v{version}: {j}"
        );
    }
}

#[test]
fn the_shim_without_settings_changes_nothing() {
    let Some(shim) = shim_or_skip("the_shim_without_settings_changes_nothing") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A file the armed shim is aimed at instead: it must leave the weights
    // file alone (it picks its file by device and inode).
    let decoy = dir.path().join("decoy");
    std::fs::write(&decoy, vec![7u8; 2 << 20]).unwrap();
    for version in ["4", "5"] {
        let wb = packed_big(dir.path(), version);
        let len = std::fs::metadata(&wb).unwrap().len();
        let inspect = vec!["inspect", s(&wb)];
        let anon = vec!["load", "--mode", "anon", s(&wb)];
        let mixed = vec!["load", "--mode", "mixed", s(&wb)];
        let mut runs = vec![
            (inspect.clone(), vec![]),
            (anon.clone(), vec![]),
            (mixed.clone(), vec![]),
        ];
        if version == "5" {
            runs.extend([
                (
                    mixed.clone(),
                    vec![("TRUNC_AFTER", "none"), ("TRUNC_PATH", s(&wb))],
                ),
                (inspect, truncating(s(&decoy), "any")),
                (anon, truncating(s(&decoy), "any")),
                (mixed, truncating(s(&decoy), "any")),
            ]);
        }
        for (args, env) in runs {
            let o = under_shim(shim, &args, &env);
            assert_eq!(
                o.code,
                Some(0),
                "v{version} ckalloc {args:?} with {env:?}: {} / {}",
                o.stdout,
                o.stderr
            );
            assert!(o.stdout.contains("verified"), "{}", o.stdout);
            assert_eq!(std::fs::metadata(&wb).unwrap().len(), len);
            assert_eq!(std::fs::metadata(&decoy).unwrap().len(), 2 << 20);
        }
    }
}

#[test]
fn a_sigbus_outside_the_watched_mapping_keeps_its_default_action() {
    let Some(shim) = shim_or_skip("a_sigbus_outside_the_watched_mapping_keeps_its_default_action")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wb = packed_big(dir.path(), "5");
    let len = std::fs::metadata(&wb).unwrap().len();
    // `TRUNC_AFTER=fault`: once the weights are mapped (and so watched), the
    // next `pread` of the file (hashing the bytes before the weights) first
    // reads a page of the shim's own mapping past the end of its memfd. The
    // handler finds the address in no watched mapping, restores the default
    // action and raises the signal again: the process dies of SIGBUS. The
    // shim refuses (exit 99) to fault while no handler is installed, and
    // ends a handler that returns into the fault forever with SIGALRM.
    let out = Command::new(env!("CARGO_BIN_EXE_ckalloc"))
        .args(["load", "--mode", "mixed", s(&wb)])
        .env_remove("CK_BUMP_FORCE_MIXED")
        .env_remove("CK_BUMP_DISABLE_MIXED")
        .env_remove("CKALLOC_THP")
        .env("LD_PRELOAD", shim)
        .env("TRUNC_PATH", s(&wb))
        .env("TRUNC_AFTER", "fault")
        .stdin(Stdio::null())
        .output()
        .expect("run ckalloc");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{:?}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("ckalloc: error"), "{stderr}");
    assert!(!stderr.contains("truncate_shim:"), "{stderr}");
    assert_eq!(std::fs::metadata(&wb).unwrap().len(), len);
}
