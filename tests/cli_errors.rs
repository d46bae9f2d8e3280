//! The `ckalloc` binary's failures (run with `--features cli`): missing,
//! wrong, corrupt and hostile inputs, bad arguments and a failing stdout.
//! Each ends with exactly one `ckalloc: error:` line on stderr, a non-zero
//! exit status (1, or 2 for a usage error) and no panic or hang.
#![cfg(feature = "cli")]

mod cli_support;

use cli_support::{
    assert_one_line_error, ckalloc, fails, json, packed, raw_safetensors, run_with, s, synth,
};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn missing_and_wrong_paths_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let m = s(&missing);
    let out = s(dir.path());
    fails(&["pack", m, "-o", out], 1, "nope.safetensors");
    fails(&["inspect", m], 1, "nope.safetensors");
    fails(&["load", m], 1, "nope.safetensors");
    fails(&["demo", m], 1, "nope.safetensors");
    // A directory where a file is expected.
    fails(&["pack", out, "-o", out], 1, "not a regular file");
    fails(&["inspect", out], 1, "");
    // --json: the error as a JSON document too.
    let o = ckalloc(&["inspect", m, "--json"]);
    assert_eq!(o.code, Some(1));
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(j["error"].as_str().unwrap().contains("nope.safetensors"));
}

#[test]
fn usage_errors_exit_2_on_one_line() {
    fails(&["frobnicate"], 2, "frobnicate");
    fails(&["load"], 2, "<WEIGHTS>");
    fails(&["load", "x", "--mode", "bogus"], 2, "bogus");
    fails(&["pack", "x", "-o", "y", "--version", "6"], 2, "6");
    // Version 3 is read but never written: a usage error, before any work
    // (the model "x" does not exist and is never opened).
    for cmd in ["pack", "demo"] {
        let mut args = vec![cmd, "x"];
        if cmd == "pack" {
            args.extend(["-o", "y"]);
        }
        args.extend(["--version", "3"]);
        let e = fails(&args, 2, "--version");
        assert!(e.contains("BUMPWGT3 is read only"), "{e}");
        assert!(!e.contains("no such file"), "{e}");
    }
    fails(&["load", "x", "--activations", "1.5g"], 2, "1.5g");
    fails(
        &["load", "x", "--activations", "99999999999t"],
        2,
        "64 bits",
    );
    let o = ckalloc(&["probe", "--bogus", "--json"]);
    assert_eq!(o.code, Some(2));
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(j["error"].as_str().unwrap().contains("--bogus"));
}

#[test]
fn corrupt_models_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let unknown = write(
        "unknown.safetensors",
        &raw_safetensors(
            r#"{"w":{"dtype":"Q9_Z","shape":[1],"data_offsets":[0,4]}}"#,
            &[0; 4],
        ),
    );
    let e = fails(
        &["pack", s(&unknown), "-o", s(&out)],
        1,
        "unknown.safetensors",
    );
    assert!(e.contains("Q9_Z"), "{e}");
    fails(&["demo", s(&unknown)], 1, "Q9_Z");
    let short = write(
        "short.safetensors",
        &raw_safetensors(
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
            &[0; 8],
        ),
    );
    fails(
        &["pack", s(&short), "-o", s(&out)],
        1,
        "not a valid safetensors file",
    );
    let garbage = write("garbage.safetensors", b"this is not a model at all");
    fails(
        &["pack", s(&garbage), "-o", s(&out)],
        1,
        "not a valid safetensors file",
    );
    let empty = write("empty.safetensors", b"");
    fails(
        &["pack", s(&empty), "-o", s(&out)],
        1,
        "not a safetensors file",
    );
    assert!(!out.join("weights.bump").exists());
    // A non-power-of-two alignment.
    let dir2 = tempfile::tempdir().unwrap();
    let (model, _) = packed(dir2.path(), "5");
    fails(
        &["pack", s(&model), "-o", s(&out), "--align", "48"],
        1,
        "--align 48",
    );
}

#[test]
fn corrupt_weights_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (_, weights) = packed(dir.path(), "5");
    let good = std::fs::read(&weights).unwrap();
    let packed_dir = weights.parent().unwrap();

    // A flipped byte in the tensor data: inspect shows the report then fails;
    // load refuses before building the arena.
    let i = json(&["inspect", s(&weights)]);
    let word = i["manifest"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "embeddings.word_embeddings.weight")
        .unwrap()["file_offset"]
        .as_u64()
        .unwrap();
    let mut flipped = good.clone();
    flipped[word as usize + 1000] ^= 0x40;
    std::fs::write(&weights, &flipped).unwrap();
    let o = ckalloc(&["inspect", s(&weights)]);
    assert_eq!(o.code, Some(1));
    assert!(o.stdout.contains("MISMATCH"), "{} / {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    let o = ckalloc(&["inspect", s(&weights), "--json"]);
    assert_eq!(o.code, Some(1));
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["checksum"]["ok"], false);
    fails(&["load", s(&weights)], 1, "checksum");
    assert_eq!(
        ckalloc(&["inspect", s(&weights), "--no-verify"]).code,
        Some(0)
    );

    // Wrong magic, truncated header.
    let mut magic = good.clone();
    magic[..8].copy_from_slice(b"NOTBUMP!");
    std::fs::write(&weights, &magic).unwrap();
    fails(&["inspect", s(&weights)], 1, "weights.bump");
    fails(&["load", s(&weights)], 1, "weights.bump");
    std::fs::write(&weights, &good[..100]).unwrap();
    fails(&["inspect", s(&weights)], 1, "weights.bump");
    fails(&["load", s(&weights)], 1, "weights.bump");

    // An unknown dtype in the manifest (the authority for dtypes).
    std::fs::write(&weights, &good).unwrap();
    let map = packed_dir.join("weights_manifest.map");
    let text = std::fs::read_to_string(&map).unwrap();
    std::fs::write(&map, text.replacen("|i64|", "|q9_z|", 1)).unwrap();
    std::fs::remove_file(packed_dir.join("weights_manifest.json")).unwrap();
    fails(&["load", s(&weights)], 1, "q9_z");
    assert_eq!(ckalloc(&["inspect", s(&weights)]).code, Some(1));

    // No manifest at all: load needs one, inspect shows the header.
    std::fs::remove_file(&map).unwrap();
    fails(&["load", s(&weights)], 1, "manifest");
    let o = ckalloc(&["inspect", s(&weights)]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("(verified)"));
}

/// `config.json` next to the model is read only when it is a regular file:
/// a FIFO without a writer or a device such as `/dev/zero` is an error, not
/// a blocked `open` or an endless read.
#[test]
fn config_json_that_is_not_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path());
    let cfg = dir.path().join("config.json");
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    // (a FIFO?, what a hang would mean, the command)
    let cases = [
        (
            true,
            "hangs on a FIFO",
            vec!["pack", &model, "-o", out, "--json"],
        ),
        (true, "hangs on a FIFO", vec!["demo", &model]),
        (
            false,
            "reads /dev/zero forever",
            vec!["pack", &model, "-o", out],
        ),
    ];
    for (fifo, hang, args) in cases {
        std::fs::remove_file(&cfg).unwrap();
        if fifo {
            let c = std::ffi::CString::new(cfg.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path; mkfifo has no other preconditions.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        } else {
            // A character device that never ends.
            std::os::unix::fs::symlink("/dev/zero", &cfg).unwrap();
        }
        let o = run_with(&args, &[], None, Duration::from_secs(30));
        assert!(o.code.is_some(), "ckalloc {args:?} {hang} config.json");
        assert_one_line_error(&o, &args, "config.json");
    }
}

/// A failed write to stdout other than a closed pipe (disk full) fails the
/// command with exit status 1: a lost report is never a success.
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
    let o = run_with(&args, &[], Some(Stdio::from(full)), Duration::from_secs(30));
    assert_one_line_error(&o, &args, "stdout");
}

/// `--align 1073741824` is a valid alignment, but on the 3.6 MiB synthetic
/// model it would write a 40 GiB file of zero padding: a plan whose padding
/// exceeds both the tensors and 256 MiB is refused before anything is written.
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
    let o = run_with(&args, &[], None, Duration::from_secs(30));
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
    let o = ckalloc(&args);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

/// `-o` naming an existing regular file is an error that says so (not the
/// OS's "File exists").
#[test]
fn output_that_is_a_file_says_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path());
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let args = ["pack", &model, "-o", file.to_str().unwrap(), "--json"];
    let o = ckalloc(&args);
    assert_one_line_error(&o, &args, "not a directory");
}

/// ckalloc writes one dtype-table code per manifest entry, in file order, so
/// in a file it wrote a code that disagrees with the manifest is corruption:
/// `inspect` reports the library's dtype-table error and exits 1 (the
/// checksum, which also covers the table, is skipped to isolate the check).
#[test]
fn inspect_refuses_a_ckalloc_dtype_table_that_disagrees_with_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (_, weights) = packed(dir.path(), "5");
    let i = json(&["inspect", s(&weights), "--no-verify"]);
    assert_eq!(i["manifest"]["dtype_table_checked"], true, "{i}");
    assert_eq!(i["manifest"]["valid"], true, "{i}");
    let mut bytes = std::fs::read(&weights).unwrap();
    // The first code of the table (u32 count at 152, codes from 156).
    bytes[156] ^= 0x01;
    std::fs::write(&weights, &bytes).unwrap();
    fails(
        &["inspect", s(&weights), "--no-verify"],
        1,
        "dtype table disagrees with manifest",
    );
    let args = ["inspect", s(&weights), "--no-verify", "--json"];
    let o = ckalloc(&args);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.contains("dtype table"), "{}", o.stderr);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["manifest"]["valid"], false, "{j}");
    assert!(
        j["manifest"]["problem"]
            .as_str()
            .unwrap()
            .contains("entry 0"),
        "{j}"
    );
}
