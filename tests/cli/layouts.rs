//! `ckalloc inspect` and `ckalloc load` on the `weights.bump` files
//! C-Kernel-Engine's converters write (`tests/data/cke/`), one per layout.
//! (The library's reader on the same files: `tests/weights_layouts.rs`.)

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `(folder, layout label, manifest entries)`; 0 entries: no manifest.
const FIXTURES: &[(&str, &str, u64)] = &[
    ("v8-gguf-v5", "L1", 36),
    ("v8-gguf-v4", "L1", 36),
    ("v8-gguf-q4k", "L1", 36),
    ("v8-safetensors", "L1", 34),
    ("root-gguf-l2", "L2", 32),
    ("v7-hf-v5", "L2", 25),
    ("v7-hf-v4", "L2", 25),
    ("v7-hf-q4k", "L2", 25),
    ("v66-gguf-l3", "L3", 35),
    ("v7-hf-wgt3", "L4", 0),
];

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn ckalloc(args: &[&str]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ckalloc"));
    cmd.args(args);
    for v in [
        "CK_BUMP_FORCE_MIXED",
        "CK_BUMP_DISABLE_MIXED",
        "CKALLOC_THP",
    ] {
        cmd.env_remove(v);
    }
    let o = cmd.output().expect("run ckalloc");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn ok(args: &[&str]) -> String {
    let o = ckalloc(args);
    assert_eq!(o.code, 0, "ckalloc {args:?} failed: {}", o.stderr);
    o.stdout
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let s = ok(&a);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("ckalloc {a:?}: not JSON ({e}): {s}"))
}

fn weights(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/cke")
        .join(name)
        .join("weights.bump")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn inspect_names_the_layout_and_verifies_every_fixture() {
    for &(name, label, entries) in FIXTURES {
        let w = weights(name);
        let text = ok(&["inspect", s(&w)]);
        assert!(
            text.contains(&format!("  layout {label} (")),
            "{name}: {text}"
        );
        assert!(text.contains("(verified)"), "{name}: {text}");
        let j = json(&["inspect", s(&w)]);
        assert_eq!(j["container"]["layout"], label, "{name}");
        assert_eq!(j["checksum"]["ok"], true, "{name}");
        let range = j["container"]["checksum_range"].as_array().unwrap();
        let start = if label == "L1" { 152 } else { 128 };
        assert_eq!(range[0], start, "{name}");
        assert_eq!(range[1], j["header"]["data_end"], "{name}");
        assert_eq!(j["manifest"]["loaded"], entries > 0, "{name}");
        if entries > 0 {
            assert_eq!(j["manifest"]["valid"], true, "{name}: {j}");
            // Converters fill the dtype table from their own weight lists:
            // only ckalloc's files are held to one code per entry.
            assert_eq!(j["manifest"]["dtype_table_checked"], false, "{name}");
            assert_eq!(
                j["manifest"]["tensors"].as_array().unwrap().len() as u64,
                entries
            );
        }
        // Fields the layout lacks are absent, not zero.
        let dims = &j["header"]["dims"];
        assert_eq!(dims["num_merges"].is_null(), matches!(label, "L2" | "L4"));
        assert_eq!(dims["num_kv_heads"].is_null(), label == "L4");
    }
}

#[test]
fn load_in_anon_and_mixed_modes_finds_every_entry_equal() {
    for &(name, label, entries) in FIXTURES.iter().filter(|f| f.2 > 0) {
        let w = weights(name);
        for mode in ["anon", "mixed"] {
            let j = json(&["load", s(&w), "--mode", mode, "--activations", "1MiB"]);
            assert_eq!(j["container"]["layout"], label, "{name}");
            assert_eq!(j["arena"]["mode"], mode, "{name}");
            assert_eq!(j["verified"]["tensors"], entries, "{name} {mode}");
            assert_eq!(j["verified"]["mismatches"], 0, "{name} {mode}: {j}");
        }
    }
}

#[test]
fn load_refuses_bumpwgt3_naming_it_and_the_missing_manifest() {
    let w = weights("v7-hf-wgt3");
    let o = ckalloc(&["load", s(&w)]);
    assert_eq!(o.code, 1);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("BUMPWGT3") && o.stderr.contains("weights_manifest.map"),
        "{}",
        o.stderr
    );
    // inspect names the layout, verifies [128, end of file) and says why
    // there is no tensor table.
    let text = ok(&["inspect", s(&w)]);
    assert!(
        text.contains("layout L4 (bare-hf-converter), BUMPWGT3"),
        "{text}"
    );
    assert!(text.contains("over [0x80, 0x616a4)"), "{text}");
    assert!(text.contains("fp32 x32"), "{text}");
}

#[test]
fn no_verify_prints_only_fields_of_the_recognised_layout() {
    // L2: no merge counts (bytes 80..88 are checksum bytes there).
    let text = ok(&["inspect", s(&weights("root-gguf-l2")), "--no-verify"]);
    assert!(text.contains("layout L2"), "{text}");
    assert!(!text.contains("merges"), "{text}");
    assert!(text.contains("not checked"), "{text}");
    // L4: no intermediate size, kv heads or merges.
    let text = ok(&["inspect", s(&weights("v7-hf-wgt3")), "--no-verify"]);
    assert!(!text.contains("intermediate"), "{text}");
    assert!(!text.contains("merges"), "{text}");
    assert!(text.contains("heads 4, head_dim 16"), "{text}");
    // A header on another layout's body that fits no layout: nothing printed
    // but the error listing each layout tried.
    let dir = tempfile::tempdir().unwrap();
    let l2 = std::fs::read(weights("root-gguf-l2")).unwrap();
    let l1 = std::fs::read(weights("v8-gguf-v4")).unwrap();
    let mut mixed = l2[..128].to_vec();
    mixed.extend_from_slice(&l1[128..]);
    let p = dir.path().join("weights.bump");
    std::fs::write(&p, &mixed).unwrap();
    let o = ckalloc(&["inspect", s(&p), "--no-verify"]);
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout, "");
    assert!(
        o.stderr.contains("not a known weights.bump layout")
            && o.stderr.contains("L1: ")
            && o.stderr.contains("L2: ")
            && o.stderr.contains("L3: "),
        "{}",
        o.stderr
    );
}

#[test]
fn without_sidecars_inspect_reports_header_and_checksum_and_load_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("weights.bump");
    std::fs::copy(weights("v66-gguf-l3"), &p).unwrap();
    let text = ok(&["inspect", s(&p)]);
    assert!(
        text.contains("layout L3") && text.contains("(verified)"),
        "{text}"
    );
    assert!(text.contains("weights_manifest.map"), "{text}");
    let o = ckalloc(&["load", s(&p)]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("BUMPWGT4") && o.stderr.contains("weights_manifest.json"),
        "{}",
        o.stderr
    );
}

#[test]
fn code_6_without_producer_information_is_shown_as_ambiguous() {
    // The HF converter's Q4_K file as BUMPWGT4 (no metadata), without sidecars.
    let b = std::fs::read(weights("v7-hf-q4k")).unwrap();
    let j = json(&["inspect", s(&weights("v7-hf-q4k"))]);
    let end = j["header"]["data_end"].as_u64().unwrap() as usize;
    assert!(j["header"]["dtype_table"]
        .as_str()
        .unwrap()
        .contains("q4_k x13"));
    let mut v4 = b[..end].to_vec();
    v4[7] = b'4';
    v4[8] = 4;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("weights.bump");
    std::fs::write(&p, &v4).unwrap();
    let text = ok(&["inspect", s(&p)]);
    assert!(text.contains("q4_1 or q4_k (ambiguous) x13"), "{text}");
    assert!(text.contains("(verified)"), "{text}");
}

#[test]
fn a_corrupted_fixture_fails_inspect_and_load_with_the_checksum_of_its_layout() {
    let dir = tempfile::tempdir().unwrap();
    let src = weights("v7-hf-v4").parent().unwrap().to_path_buf();
    for f in ["weights.bump", "weights_manifest.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let p = dir.path().join("weights.bump");
    let mut b = std::fs::read(&p).unwrap();
    b[1000] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let o = ckalloc(&["inspect", s(&p)]);
    assert_eq!(o.code, 1);
    assert!(o.stdout.contains("MISMATCH"), "{}", o.stdout);
    assert!(
        o.stderr.contains("L2 layout") && o.stderr.contains("[128, 365760)"),
        "{}",
        o.stderr
    );
    let o = ckalloc(&["load", s(&p)]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("checksum mismatch"), "{}", o.stderr);
}
