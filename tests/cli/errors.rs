//! The `ckalloc` binary's failures: missing, wrong, corrupt and hostile
//! inputs, bad arguments and a failing stdout. Each ends with exactly one
//! `ckalloc: error:` line on stderr, a non-zero exit status (1, or 2 for a
//! usage error) and no panic or hang.

use crate::support::{
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
    // Alignments the writer cannot use are malformed arguments, refused
    // before the model (which does not exist) is opened.
    for bad in ["0", "3", "48", "2147483648", "1k", "0x40"] {
        let e = fails(&["pack", "x", "-o", "y", "--align", bad], 2, "--align");
        assert!(e.contains("power of two"), "{e}");
        assert!(!e.contains("No such file"), "{e}");
    }
    fails(&["load", "x", "--activations", "1.5g"], 2, "1.5g");
    fails(
        &["load", "x", "--activations", "99999999999t"],
        2,
        "too large (over 2^64 - 1 bytes)",
    );
    // The syntax of the `CKALLOC_*` byte settings: no leading zero.
    fails(&["load", "x", "--activations", "064m"], 2, "a leading zero");
    let o = ckalloc(&["probe", "--bogus", "--json"]);
    assert_eq!(o.code, Some(2));
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(j["error"].as_str().unwrap().contains("--bogus"));
}

/// An unknown option of `run` before the program is a usage error with
/// clap's tips, never taken for the program; `--` and the program's own
/// options after its name pass through. The library is never found here
/// (`CKALLOC_PRELOAD_LIB` names no file), so a command line that parses
/// ends with exit status 1, one that does not with 2.
#[test]
fn run_refuses_an_unknown_option_before_the_program() {
    let no_lib = [("CKALLOC_PRELOAD_LIB", "/nonexistent/libckalloc_preload.so")];
    let run = |args: &[&str]| crate::support::ckalloc_env(args, &no_lib);
    for typo in [&["run", "--jsn", "true"][..], &["run", "-x", "--", "true"]] {
        let o = run(typo);
        assert_eq!(o.code, Some(2), "{typo:?}: {}", o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
        assert!(
            o.stderr.starts_with(&format!(
                "ckalloc: error: unexpected argument '{}' found",
                typo[1]
            )),
            "{}",
            o.stderr
        );
        assert!(
            o.stderr.contains(&format!(
                "tip: to pass '{0}' as a value, use '-- {0}'",
                typo[1]
            )),
            "{}",
            o.stderr
        );
        assert!(o.stdout.is_empty(), "{}", o.stdout);
    }
    let o = run(&["run", "--jsn", "true"]);
    assert!(
        o.stderr
            .contains("tip: a similar argument exists: '--json'"),
        "{}",
        o.stderr
    );
    // The same tips for every command.
    let o = run(&["probe", "--jsn"]);
    assert_eq!(o.code, Some(2));
    assert!(
        o.stderr
            .contains("tip: a similar argument exists: '--json'"),
        "{}",
        o.stderr
    );
    // Parsed: the library is looked for.
    for parses in [
        &["run", "--", "true"][..],
        &["run", "--", "--jsn"],
        &["run", "true", "--flag"],
        &["run", "sh", "-c", "true", "--", "-x"],
    ] {
        let o = run(parses);
        assert_eq!(o.code, Some(1), "{parses:?}: {}", o.stderr);
        assert!(o.stderr.contains("CKALLOC_PRELOAD_LIB"), "{}", o.stderr);
    }
    // `--json` before the program is ckalloc's (and refused for `run`);
    // after it, the program's, and a usage error stays text.
    let o = run(&["run", "--json", "--", "true"]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(
        o.stderr.contains("--json does not apply to run"),
        "{}",
        o.stderr
    );
    let o = run(&["run", "--jsn", "prog", "--json"]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
    let o = run(&["--json", "run", "--jsn", "prog"]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(j["error"].as_str().unwrap().contains("'--jsn'"), "{j}");
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

// ---- manifests that do not describe their file ---------------------------

/// The sidecars of a packed synthetic model, rewritten by the tests below.
struct Sidecars {
    _dir: tempfile::TempDir,
    weights: std::path::PathBuf,
}

impl Sidecars {
    fn new(version: &str) -> Sidecars {
        let dir = tempfile::tempdir().unwrap();
        let (_, weights) = packed(dir.path(), version);
        Sidecars { _dir: dir, weights }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.weights.with_file_name(name)
    }

    fn w(&self) -> &str {
        s(&self.weights)
    }

    /// Edit `weights_manifest.json` (written back pretty-printed).
    fn json(&self, edit: impl FnOnce(&mut Value)) {
        let p = self.path("weights_manifest.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }

    /// Edit every entry line of `weights_manifest.map` as its five fields.
    fn map(&self, mut edit: impl FnMut(&mut Vec<String>)) {
        let p = self.path("weights_manifest.map");
        let text = std::fs::read_to_string(&p).unwrap();
        let mut out = String::new();
        for line in text.lines() {
            if line.starts_with('#') {
                out.push_str(line);
            } else {
                let mut f: Vec<String> = line.split('|').map(str::to_string).collect();
                edit(&mut f);
                out.push_str(&f.join("|"));
            }
            out.push('\n');
        }
        std::fs::write(&p, out).unwrap();
    }

    /// Swap the offsets of the first two 512-byte tensors in both sidecars
    /// (file and runtime offsets in the `.map`): a consistent manifest that
    /// hands each tensor the other's bytes.
    fn swap_two_tensors(&self) {
        let mut names = Vec::new();
        self.json(|v| {
            let entries = v["entries"].as_array_mut().unwrap();
            let idx: Vec<usize> = (0..entries.len())
                .filter(|&i| entries[i]["size"] == 512)
                .take(2)
                .collect();
            let (a, b) = (idx[0], idx[1]);
            let oa = entries[a]["file_offset"].clone();
            entries[a]["file_offset"] = entries[b]["file_offset"].clone();
            entries[b]["file_offset"] = oa;
            names = vec![
                (
                    entries[a]["name"].as_str().unwrap().to_string(),
                    entries[a]["file_offset"].as_u64().unwrap(),
                ),
                (
                    entries[b]["name"].as_str().unwrap().to_string(),
                    entries[b]["file_offset"].as_u64().unwrap(),
                ),
            ];
        });
        self.map(|f| {
            if let Some((_, off)) = names.iter().find(|(n, _)| *n == f[0]) {
                f[2] = format!("0x{off:016X}");
                f[4] = format!("0x{off:016X}");
            }
        });
    }
}

/// Two tensors of one size and dtype swapped in both sidecars of a
/// `BUMPWGT5` file: the metadata's `manifest_hash` no longer matches the
/// JSON, so `inspect` and `load` refuse the file and name both digests.
#[test]
fn swapped_tensors_fail_the_manifest_hash_in_inspect_and_load() {
    let c = Sidecars::new("5");
    let i = json(&["inspect", c.w()]);
    assert_eq!(i["manifest"]["bound"], true, "{i}");
    c.swap_two_tensors();
    let e = fails(&["inspect", c.w()], 1, "manifest_hash mismatch");
    assert!(e.contains("weights_manifest.json"), "{e}");
    let o = ckalloc(&["inspect", c.w(), "--json"]);
    assert_eq!(o.code, Some(1));
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["manifest"]["valid"], false, "{j}");
    assert_eq!(j["exit_code"], 1, "{j}");
    for mode in ["anon", "mixed"] {
        fails(
            &["load", c.w(), "--mode", mode],
            1,
            "manifest_hash mismatch",
        );
    }
}

/// With only the `.map` beside a `BUMPWGT5` file the recorded
/// `manifest_hash` cannot be checked: `inspect` and `load` say so (never a
/// bare "verified" or "bound"), and `--require-manifest-hash` and
/// `--strict` refuse the file.
#[test]
fn a_map_without_its_json_is_reported_unchecked_and_refused_on_request() {
    let c = Sidecars::new("5");
    c.swap_two_tensors();
    std::fs::remove_file(c.path("weights_manifest.json")).unwrap();
    let out = crate::support::ok(&["inspect", c.w()]);
    assert!(out.contains("manifest binding: NOT checked"), "{out}");
    assert!(!out.contains("bound by"), "{out}");
    let out = crate::support::ok(&["load", c.w()]);
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("checked: "), "{out}");
    assert!(last.contains("NOT checked"), "{last}");
    let j = json(&["load", c.w()]);
    assert_eq!(j["manifest"]["bound"], false, "{j}");
    for cmd in ["inspect", "load"] {
        fails(&[cmd, c.w(), "--require-manifest-hash"], 1, "not bound");
        fails(&[cmd, c.w(), "--strict"], 1, "not bound");
    }
}

/// A `BUMPWGT4` file records no manifest hash, so the other rules carry the
/// weight, and `load` refuses exactly what `inspect` refuses.
#[test]
fn load_refuses_what_inspect_refuses() {
    // No entry left, in both sidecars: 3.64 MiB of weights would be silently
    // left out.
    let c = Sidecars::new("4");
    c.map(|_| {});
    let p = c.path("weights_manifest.map");
    let kept: String = std::fs::read_to_string(&p)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&p, kept).unwrap();
    c.json(|v| v["entries"] = serde_json::json!([]));
    for cmd in ["inspect", "load"] {
        fails(&[cmd, c.w()], 1, "lists no tensor");
    }

    // One fp32 tensor relabelled fp16 in both sidecars: ckalloc's dtype
    // table (one code per entry) disagrees.
    let relabel = |c: &Sidecars| {
        let mut name = String::new();
        c.json(|v| {
            let e = v["entries"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|e| e["dtype"] == "fp32")
                .unwrap();
            e["dtype"] = "fp16".into();
            name = e["name"].as_str().unwrap().to_string();
        });
        c.map(|f| {
            if f[0] == name {
                f[1] = "fp16".into();
            }
        });
    };
    let c = Sidecars::new("4");
    relabel(&c);
    for cmd in ["inspect", "load"] {
        fails(&[cmd, c.w()], 1, "dtype table disagrees with manifest");
    }

    // The same with the JSON's generator edited: nothing protects that
    // field in a BUMPWGT4 file, so the disagreement is reported as a warning
    // by both commands, never silently dropped, and --strict refuses it.
    let c = Sidecars::new("4");
    relabel(&c);
    c.json(|v| v["generator"] = "someone else".into());
    let out = crate::support::ok(&["inspect", c.w()]);
    assert!(out.contains("warning: the dtype table disagrees"), "{out}");
    let out = crate::support::ok(&["load", c.w()]);
    assert!(out.contains("warning: the dtype table disagrees"), "{out}");
    for cmd in ["inspect", "load"] {
        fails(&[cmd, c.w(), "--strict"], 1, "dtype table disagrees");
    }

    // A tensor dropped from both sidecars leaves a gap wider than the
    // file's 64-byte alignment: reported, and refused by --strict.
    let c = Sidecars::new("4");
    let mut dropped = String::new();
    c.json(|v| {
        v["generator"] = "someone else".into();
        let entries = v["entries"].as_array_mut().unwrap();
        dropped = entries[3]["name"].as_str().unwrap().to_string();
        entries.remove(3);
    });
    let p = c.path("weights_manifest.map");
    let kept: String = std::fs::read_to_string(&p)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with(&format!("{dropped}|")))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&p, kept).unwrap();
    let out = crate::support::ok(&["inspect", c.w()]);
    assert!(out.contains("are covered by no tensor"), "{out}");
    let i = json(&["inspect", c.w()]);
    assert_eq!(
        i["manifest"]["warnings"].as_array().unwrap().len(),
        1,
        "{i}"
    );
    for cmd in ["inspect", "load"] {
        fails(&[cmd, c.w(), "--strict"], 1, "covered by no tensor");
    }
}

/// Sidecars that cannot be read as a manifest make `inspect` exit 1 after
/// its report (with `--json`, a document whose manifest is not valid), and
/// `load` exit 1.
#[test]
fn malformed_sidecars_exit_1_in_inspect_and_load() {
    type Edit = fn(&Sidecars);
    let cases: [(&str, Edit, &str); 6] = [
        (
            "entries not an array",
            |c| std::fs::write(c.path("weights_manifest.json"), r#"{"entries":5}"#).unwrap(),
            "expected a sequence",
        ),
        (
            "duplicate names",
            |c| {
                c.json(|v| {
                    let e = v["entries"][1].clone();
                    v["entries"][2]["name"] = e["name"].clone();
                })
            },
            "duplicate tensor name",
        ),
        (
            "sidecars disagree on a runtime offset",
            |c| {
                let mut first = true;
                c.map(|f| {
                    if std::mem::take(&mut first) {
                        f[4] = "0x0000000000000001".into();
                    }
                })
            },
            "disagree",
        ),
        (
            "map not UTF-8",
            |c| {
                std::fs::write(
                    c.path("weights_manifest.map"),
                    b"\xff\xfe|fp32|0x0|0x0|0x0\n",
                )
                .unwrap()
            },
            "weights_manifest.map",
        ),
        (
            "a FIFO as the JSON",
            |c| {
                let p = c.path("weights_manifest.json");
                std::fs::remove_file(&p).unwrap();
                let cp = std::ffi::CString::new(s(&p)).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(cp.as_ptr(), 0o600) }, 0);
            },
            "not a regular file",
        ),
        (
            "a directory as the map",
            |c| {
                let p = c.path("weights_manifest.map");
                std::fs::remove_file(&p).unwrap();
                std::fs::create_dir(&p).unwrap();
            },
            "not a regular file",
        ),
    ];
    for (what, edit, needle) in cases {
        let c = Sidecars::new("5");
        edit(&c);
        let e = fails(&["inspect", c.w()], 1, needle);
        let args = ["inspect", c.w(), "--json"];
        let o = ckalloc(&args);
        assert_eq!(o.code, Some(1), "{what}: {}", o.stderr);
        let j: Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(j["manifest"]["valid"], false, "{what}: {j}");
        fails(&["load", c.w()], 1, needle);
        assert!(!e.contains("panicked"), "{what}: {e}");
    }
}

/// A name the writer forbids is refused by the readers (it could forge a
/// line of the report), and a name the writer allows is printed with its
/// control characters escaped.
#[test]
fn names_are_escaped_and_forged_report_lines_refused() {
    let c = Sidecars::new("4");
    c.json(|v| v["entries"][0]["name"] = "x\n  sha256 0000 (verified)".into());
    for cmd in ["inspect", "load"] {
        let e = fails(&[cmd, c.w()], 1, "invalid tensor name");
        // Escaped: the line break shows as `\n` and starts no new line.
        assert!(e.contains("\"x\\n"), "{e}");
    }

    // A safetensors tensor whose name holds a terminal escape sequence.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("esc.safetensors");
    std::fs::write(
        &model,
        raw_safetensors(
            "{\"red\\u001b[31mtext\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
            &[0; 4],
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    crate::support::ok(&["pack", s(&model), "-o", s(&out)]);
    let w = out.join("weights.bump");
    for args in [vec!["inspect", s(&w)], vec!["load", s(&w)]] {
        let text = crate::support::ok(&args);
        assert!(!text.contains('\u{1b}'), "{args:?}: {text:?}");
        if args[0] == "inspect" {
            assert!(text.contains("red\\u{1b}[31mtext"), "{text}");
        }
    }
}

/// `--json` documents stay valid JSON whatever a path or a name holds:
/// non-ASCII spaces, bidirectional overrides (written as JSON escapes) and
/// bytes that are not UTF-8 (shown as U+FFFD); the text report escapes
/// the same characters.
#[test]
fn json_reports_stay_valid_for_any_path_and_name() {
    use std::os::unix::ffi::OsStrExt as _;
    let c = Sidecars::new("5");
    let packed_dir = c.weights.parent().unwrap().to_path_buf();
    let base = packed_dir.parent().unwrap().to_path_buf();
    let names: [&std::ffi::OsStr; 3] = [
        std::ffi::OsStr::new("モデル\u{3000}v1"),
        std::ffi::OsStr::new("bidi\u{202e}evil"),
        std::ffi::OsStr::from_bytes(b"not-utf8-\xff"),
    ];
    for name in names {
        let dir = base.join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in [
            "weights.bump",
            "weights_manifest.json",
            "weights_manifest.map",
        ] {
            std::fs::copy(packed_dir.join(f), dir.join(f)).unwrap();
        }
        let w = dir.join("weights.bump");
        for cmd in ["inspect", "load"] {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_ckalloc"))
                .args([std::ffi::OsStr::new(cmd), w.as_os_str(), "--json".as_ref()])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{name:?} {cmd}: {o:?}");
            let text = String::from_utf8(o.stdout).unwrap();
            let j: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name:?} {cmd}: not JSON ({e}): {text}"));
            assert_eq!(j["exit_code"], 0, "{j}");
            assert!(!text.contains('\u{202e}'), "{text}");
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_ckalloc"))
                .args([std::ffi::OsStr::new(cmd), w.as_os_str()])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{name:?} {cmd}: {o:?}");
            assert!(!String::from_utf8_lossy(&o.stdout).contains('\u{202e}'));
        }
    }
}

/// A closed stdout pipe (`ckalloc ... | head`) stops the report, never the
/// verdict: a failing command still exits 1 with its error line, a passing
/// one 0.
#[test]
fn a_closed_stdout_pipe_keeps_the_exit_status() {
    use std::os::fd::FromRawFd as _;
    let closed_pipe = || {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just returned by pipe(2) and are
        // owned here alone; the read end is closed at once.
        unsafe {
            drop(std::fs::File::from_raw_fd(fds[0]));
            Stdio::from(std::fs::File::from_raw_fd(fds[1]))
        }
    };
    let c = Sidecars::new("5");
    for cmd in ["inspect", "load"] {
        let args = [cmd, c.w()];
        let o = run_with(&args, &[], Some(closed_pipe()), Duration::from_secs(60));
        assert_eq!(o.code, Some(0), "{cmd}: {}", o.stderr);
        assert!(o.stderr.is_empty(), "{cmd}: {}", o.stderr);
    }
    c.swap_two_tensors();
    for cmd in ["inspect", "load"] {
        let args = [cmd, c.w()];
        let o = run_with(&args, &[], Some(closed_pipe()), Duration::from_secs(60));
        assert_one_line_error(&o, &args, "manifest_hash mismatch");
    }
}

/// A closed stderr pipe loses the error line, never the exit status: no
/// abort (`eprintln!` would panic, and the panic hook's own write again).
#[test]
fn a_closed_stderr_pipe_keeps_the_exit_status() {
    use std::os::fd::FromRawFd as _;
    for (args, code) in [
        (&["inspect", "/nonexistent/weights.bump"][..], 1),
        (&["probe", "--bogus"][..], 2),
        // No library to preload: the error comes before the program.
        (&["run", "--", "true"][..], 1),
    ] {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just returned by pipe(2) and are
        // owned here alone; the read end is closed at once.
        let write_end = unsafe {
            drop(std::fs::File::from_raw_fd(fds[0]));
            std::fs::File::from_raw_fd(fds[1])
        };
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_ckalloc"))
            .args(args)
            .env("CKALLOC_THP", "offf")
            .env("CKALLOC_PRELOAD_LIB", "/nonexistent/libckalloc_preload.so")
            .stdout(Stdio::null())
            .stderr(write_end)
            .status()
            .unwrap();
        assert_eq!(o.code(), Some(code), "{args:?}: {o:?}");
    }
}

/// Help that cannot be written (a full disk) is an error, exit status 1.
#[test]
fn help_to_a_full_disk_fails() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ckalloc"))
        .arg("--help")
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("writing to stdout"));
}

/// Without sidecars `inspect` shows the header and the checksum and exits
/// 0, unless the options ask for a bound or a warning-free manifest;
/// `load` always needs one.
#[test]
fn without_sidecars_inspect_refuses_only_when_asked() {
    let c = Sidecars::new("5");
    for f in ["weights_manifest.json", "weights_manifest.map"] {
        std::fs::remove_file(c.path(f)).unwrap();
    }
    let out = crate::support::ok(&["inspect", c.w()]);
    assert!(out.contains("manifest: none"), "{out}");
    for opt in ["--require-manifest-hash", "--strict"] {
        fails(&["inspect", c.w(), opt], 1, "weights_manifest");
    }
    fails(&["load", c.w()], 1, "weights_manifest");
}

#[test]
fn a_usage_error_escapes_a_line_break_or_escape_sequence_in_the_argument() {
    for (arg, shown) in [
        ("--x\nUsage: fake", "'--x\\nUsage: fake'"),
        (
            "--x\n  tip: fake\nmore",
            "'--x\\n  tip: fake\\nmore' found; tip:",
        ),
        ("--x\u{1b}[31m", "'--x\\u{1b}[31m'"),
    ] {
        let line = fails(&["run", arg, "true"], 2, shown);
        assert!(line.ends_with("(see `ckalloc --help`)\n"), "{line:?}");
        let o = ckalloc(&["--json", "run", arg, "true"]);
        let j: Value = serde_json::from_str(&o.stdout).unwrap();
        assert!(j["error"].as_str().unwrap().contains(shown), "{j}");
    }
}
