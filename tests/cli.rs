//! End-to-end tests of the `ckalloc` binary (run with `--features cli`):
//! every subcommand's output, `--json` documents, one-line errors with a
//! non-zero exit status, and the synth -> pack -> inspect -> load round trip.
#![cfg(feature = "cli")]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn ckalloc(args: &[&str]) -> Out {
    ckalloc_env(args, &[])
}

fn ckalloc_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ckalloc"));
    cmd.args(args);
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

/// A failure: exit status `code`, exactly one line on stderr naming the error.
fn fails(args: &[&str], code: i32, needle: &str) -> String {
    let o = ckalloc(args);
    assert_eq!(
        o.code, code,
        "ckalloc {args:?}: {} / {}",
        o.stdout, o.stderr
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

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// A synthetic model (via `ckalloc synth`) packed into `dir/packed`.
fn packed(dir: &Path, version: &str) -> (PathBuf, PathBuf) {
    let model_dir = dir.join("model");
    ok(&["synth", s(&model_dir)]);
    let model = model_dir.join("model.safetensors");
    let out = dir.join("packed");
    ok(&["pack", s(&model), "-o", s(&out), "--version", version]);
    (model, out.join("weights.bump"))
}

#[test]
fn help_and_version() {
    assert!(ok(&["--help"]).contains("demo"));
    assert!(ok(&["--version"]).contains(env!("CARGO_PKG_VERSION")));
    for cmd in ["probe", "pack", "inspect", "load", "demo", "synth"] {
        assert!(ok(&[cmd, "--help"]).contains("--json"), "{cmd}");
    }
}

#[test]
fn probe_reports_system_and_tiers() {
    let text = ok(&["probe"]);
    assert!(text.contains("THP enabled:"), "{text}");
    assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
    for tier in ["hugetlb", "THP", "plain"] {
        assert!(text.lines().any(|l| l.starts_with(tier)), "{tier}: {text}");
    }
    let j = json(&["probe"]);
    let tiers = j["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 3);
    // Plain pages always work, and their first touch was timed.
    let plain = tiers.iter().find(|t| t["tier"] == "plain").unwrap();
    assert_eq!(plain["works"], true);
    assert!(plain["first_touch_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(plain["resident_bytes"], 64 << 20);
    // A tier that does not work says why.
    for t in tiers {
        assert_eq!(t["works"] == false, t["error"].is_string(), "{t}");
    }
    assert!(j["system"]["base_page_size"].as_u64().unwrap() >= 4096);
    assert!(j["hints"].is_array());
    let quick = json(&["probe", "--no-touch"]);
    assert_eq!(quick["tiers"].as_array().unwrap().len(), 0);
}

#[test]
fn synth_pack_inspect_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for version in ["4", "5"] {
        let d = dir.path().join(version);
        let (model, weights) = packed(&d, version);
        let synth = json(&["synth", s(&d.join("model2"))]);
        let (n, bytes) = (
            synth["tensors"].as_u64().unwrap(),
            synth["tensor_bytes"].as_u64().unwrap(),
        );
        assert_eq!(n, 40);

        let p = json(&[
            "pack",
            s(&model),
            "-o",
            s(&d.join("p2")),
            "--version",
            version,
            "--align",
            "4096",
        ]);
        assert_eq!(p["tensors"], n);
        assert_eq!(p["tensor_bytes"], bytes);
        assert_eq!(p["version"].as_u64().unwrap().to_string(), version);
        assert_eq!(p["weights_base"].as_u64().unwrap() % 4096, 0);
        assert_eq!(p["dims"]["embed_dim"], 128);
        assert_eq!(p["dims"]["num_layers"], 2);

        let text = ok(&["inspect", s(&weights)]);
        assert!(text.contains("(verified)"), "{text}");
        assert!(text.contains("embeddings.word_embeddings.weight"), "{text}");
        assert!(text.contains("0 overlaps"), "{text}");
        let i = json(&["inspect", s(&weights)]);
        assert_eq!(i["checksum"]["ok"], true);
        assert_eq!(
            i["header"]["version"].as_u64().unwrap().to_string(),
            version
        );
        assert_eq!(i["header"]["dims"]["vocab_size"], 4096);
        assert_eq!(i["manifest"]["tensors"].as_array().unwrap().len() as u64, n);
        assert_eq!(i["manifest"]["total_bytes"], bytes);
        assert_eq!(i["layout"]["overlaps"].as_array().unwrap().len(), 0);
        let ids = i["manifest"]["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "embeddings.position_ids")
            .unwrap();
        assert_eq!(ids["dtype"], "i64");
        assert_eq!(ids["size"], 128 * 8);

        for mode in ["anon", "mixed", "auto"] {
            let text = ok(&["load", s(&weights), "--mode", mode, "--activations", "4MiB"]);
            let want = format!("verified: {n} tensors, {bytes} bytes, 0 mismatches");
            assert!(text.contains(&want), "{mode}: {text}");
            let l = json(&["load", s(&weights), "--mode", mode]);
            assert_eq!(l["verified"]["tensors"], n);
            assert_eq!(l["verified"]["bytes"], bytes);
            assert_eq!(l["verified"]["mismatches"], 0);
            let chosen = l["arena"]["mode"].as_str().unwrap();
            match mode {
                "auto" => assert!(chosen == "anon" || chosen == "mixed"),
                m => assert_eq!(chosen, m),
            }
            assert_eq!(
                l["arena"]["materialize_ms"].is_number(),
                chosen == "anon",
                "{l}"
            );
            assert!(l["coverage"]["weights"]["resident_bytes"].as_u64().unwrap() >= bytes);
            assert!(l["resident"]["rss_bytes"].as_u64().unwrap() > 0);
        }
    }
}

#[test]
fn auto_honours_force_mixed() {
    let dir = tempfile::tempdir().unwrap();
    let (_, weights) = packed(dir.path(), "5");
    let o = ckalloc_env(
        &["load", s(&weights), "--json"],
        &[("CK_BUMP_FORCE_MIXED", "1")],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let l: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(l["arena"]["mode"], "mixed");
    assert!(l["arena"]["why"]
        .as_str()
        .unwrap()
        .contains("CK_BUMP_FORCE_MIXED"));
}

#[test]
fn demo_on_a_generated_model() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("m");
    ok(&["synth", s(&model_dir)]);
    let model = model_dir.join("model.safetensors");
    let keep = dir.path().join("out");
    let text = ok(&["demo", s(&model), "-o", s(&keep)]);
    let verified: Vec<&str> = text.lines().filter(|l| l.contains("verified:")).collect();
    assert_eq!(verified.len(), 3, "{text}");
    for l in &verified {
        assert!(l.ends_with(" 0 mismatches"), "{l}");
        assert!(l.contains("verified: 40 tensors"), "{l}");
    }
    assert!(
        text.contains("checksum: equal across the three modes"),
        "{text}"
    );
    assert!(text.contains("caching allocator summary"), "{text}");
    assert!(keep.join("weights.bump").is_file());
    assert!(keep.join("weights_manifest.map").is_file());

    let j = json(&["demo", s(&model)]);
    assert_eq!(j["synthetic"], false);
    assert_eq!(j["ok"], true);
    let modes = j["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 3);
    assert_eq!(modes[0]["arena"]["mode"], "anon");
    assert_eq!(modes[1]["arena"]["mode"], "mixed");
    let sum = modes[0]["compute"]["checksum"].clone();
    for m in modes {
        assert_eq!(m["verified"]["tensors"], 40);
        assert_eq!(m["verified"]["mismatches"], 0);
        assert_eq!(m["compute"]["checksum"], sum);
        // 2 layers x 6 matrices + 3 embeddings + pooler.
        assert_eq!(m["compute"]["matrices"], 16);
        assert!(m["arena"]["ready_ms"].is_number());
    }
    assert_eq!(j["checksums_equal"], true);
    let c = &j["cache"];
    assert!(
        c["hits"].as_u64().unwrap() > c["misses"].as_u64().unwrap(),
        "{c}"
    );
    assert_eq!(c["live_bytes"], 0);
}

#[test]
fn demo_without_a_model_uses_the_synthetic_one() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-cache");
    let o = ckalloc_env(&["demo"], &[("CKALLOC_MODEL_CACHE", s(&none))]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("synthetic model"), "{}", o.stdout);
    assert_eq!(o.stdout.matches(" 0 mismatches").count(), 3, "{}", o.stdout);
    let o = ckalloc_env(&["demo", "--json"], &[("CKALLOC_MODEL_CACHE", s(&none))]);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["synthetic"], true);
}

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
    assert_eq!(o.code, 1);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(j["error"].as_str().unwrap().contains("nope.safetensors"));
}

#[test]
fn usage_errors_exit_2_on_one_line() {
    fails(&["frobnicate"], 2, "frobnicate");
    fails(&["load"], 2, "<WEIGHTS>");
    fails(&["load", "x", "--mode", "bogus"], 2, "bogus");
    fails(&["pack", "x", "-o", "y", "--version", "6"], 2, "6");
    fails(&["load", "x", "--activations", "1.5g"], 2, "1.5g");
    fails(
        &["load", "x", "--activations", "99999999999t"],
        2,
        "64 bits",
    );
    let o = ckalloc(&["probe", "--bogus", "--json"]);
    assert_eq!(o.code, 2);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(j["error"].as_str().unwrap().contains("--bogus"));
}

/// Raw safetensors bytes: 8-byte header length, header JSON, data.
fn raw_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
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
    assert_eq!(o.code, 1);
    assert!(o.stdout.contains("MISMATCH"), "{} / {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    let o = ckalloc(&["inspect", s(&weights), "--json"]);
    assert_eq!(o.code, 1);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["checksum"]["ok"], false);
    fails(&["load", s(&weights)], 1, "checksum");
    assert_eq!(ckalloc(&["inspect", s(&weights), "--no-verify"]).code, 0);

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
    assert_eq!(ckalloc(&["inspect", s(&weights)]).code, 1);

    // No manifest at all: load needs one, inspect shows the header.
    std::fs::remove_file(&map).unwrap();
    fails(&["load", s(&weights)], 1, "manifest");
    let o = ckalloc(&["inspect", s(&weights)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("(verified)"));
}
