//! Each subcommand of the `ckalloc` binary: its text and `--json` output,
//! the synth -> pack -> inspect -> load round trip, and the demo. Failures
//! are in `errors.rs`.

use crate::support::{ckalloc_env, json, ok, packed, raw_safetensors, run_with, s};
use serde_json::Value;
use std::time::Duration;

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
    assert!(text.lines().any(|l| l.starts_with("THP: ")), "{text}");
    assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
    for tier in ["hugetlb", "THP", "normal"] {
        assert!(text.lines().any(|l| l.starts_with(tier)), "{tier}: {text}");
    }
    let j = json(&["probe"]);
    let tiers = j["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 3);
    // Normal pages always work, and their first touch was timed.
    let normal = tiers.iter().find(|t| t["tier"] == "normal").unwrap();
    assert_eq!(normal["works"], true);
    assert!(normal["first_touch_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(normal["resident_bytes"], 64 << 20);
    // A tier that does not work says why.
    for t in tiers {
        assert_eq!(t["works"] == false, t["error"].is_string(), "{t}");
    }
    assert!(j["system"]["base_page_size"].as_u64().unwrap() >= 4096);
    // khugepaged's settings are an object wherever THP's defrag mode reads.
    if j["system"]["thp_defrag"].is_string() {
        assert!(j["system"]["khugepaged"]["pages_to_scan"].is_u64(), "{j}");
        assert!(
            j["system"]["thp_advised_fault_compacts"].is_boolean(),
            "{j}"
        );
    }
    assert!(j["hints"].is_array());
    let quick = json(&["probe", "--no-touch"]);
    assert_eq!(quick["tiers"].as_array().unwrap().len(), 0);
    // Hints say why a size does not parse, flag a threshold below one
    // huge page, and name a typo, as `ckalloc run` warns.
    for (name, value, hint) in [
        (
            "CKALLOC_PRELOAD_THRESHOLD",
            "00m",
            "CKALLOC_PRELOAD_THRESHOLD=\"00m\": a leading zero",
        ),
        (
            "CKALLOC_PRELOAD_THRESHOLD",
            "0",
            "CKALLOC_PRELOAD_THRESHOLD is 0, taken as 1 byte, below 2 MiB",
        ),
        (
            "CKALLOC_RETAIN_BYTE",
            "1",
            "did you mean CKALLOC_RETAIN_BYTES?",
        ),
        ("CKALLOC_thp", "0", "did you mean CKALLOC_THP?"),
        (
            "CKALLOC_PRELAOD_LIB",
            "x",
            "did you mean CKALLOC_PRELOAD_LIB?",
        ),
    ] {
        let o = ckalloc_env(&["probe", "--no-touch", "--json"], &[(name, value)]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        let hints = j["hints"].as_array().unwrap();
        assert!(
            hints.iter().any(|h| h.as_str().unwrap().contains(hint)),
            "{value}: {hints:?}"
        );
    }
}

/// A millisecond setting that does not parse is named with why, as the
/// library's parser refuses it, among `probe`'s hints (the lines `ckalloc
/// run` warns with).
#[test]
fn probe_says_why_a_millisecond_setting_does_not_parse() {
    for (name, value, why) in [
        ("CKALLOC_RETAIN_DECAY_MS", "", "empty;"),
        (
            "CKALLOC_RETAIN_DECAY_MS",
            "-5",
            "a sign before the digits (no sign is taken);",
        ),
        (
            "CKALLOC_HUGETLB_BACKOFF_MS",
            "250ms",
            "not a digit after the digits (no unit, fraction or exponent is taken);",
        ),
        (
            "CKALLOC_HUGETLB_BACKOFF_MS",
            "1.5",
            "not a digit after the digits (no unit, fraction or exponent is taken);",
        ),
        (
            "CKALLOC_RETAIN_DECAY_MS",
            "soon",
            "no decimal digits at the start;",
        ),
        (
            "CKALLOC_RETAIN_DECAY_MS",
            "99999999999999999999",
            "too large (over 2^64 - 1 milliseconds);",
        ),
    ] {
        let o = ckalloc_env(&["probe", "--no-touch", "--json"], &[(name, value)]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        let j: Value = serde_json::from_str(&o.stdout).unwrap();
        let hints = j["hints"].as_array().unwrap();
        let line = format!("{name}={value:?}: {why} {name} does not parse: taken as unset");
        assert!(
            hints.iter().any(|h| h.as_str().unwrap().contains(&line)),
            "{line}: {hints:?}"
        );
    }
    // Leading zeros and white space around the digits are taken.
    for value in ["0250", " 250\n"] {
        let o = ckalloc_env(
            &["probe", "--no-touch", "--json"],
            &[("CKALLOC_RETAIN_DECAY_MS", value)],
        );
        let j: Value = serde_json::from_str(&o.stdout).unwrap();
        let hints = j["hints"].as_array().unwrap();
        assert!(
            !hints
                .iter()
                .any(|h| h.as_str().unwrap().contains("CKALLOC_RETAIN_DECAY_MS")),
            "{value:?}: {hints:?}"
        );
    }
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
    assert_eq!(o.code, Some(0), "{}", o.stderr);
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
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("synthetic model"), "{}", o.stdout);
    assert_eq!(o.stdout.matches(" 0 mismatches").count(), 3, "{}", o.stdout);
    let o = ckalloc_env(&["demo", "--json"], &[("CKALLOC_MODEL_CACHE", s(&none))]);
    let j: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["synthetic"], true);
}

/// A 2-D F32 tensor with zero columns and 2^28 rows has no bytes; the demo
/// skips it rather than allocating 2^28 outputs (1 GiB).
#[test]
fn demo_skips_matrices_without_elements() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("zerocols.safetensors");
    let header = serde_json::json!({
        "w": {"dtype": "F32", "shape": [1u64 << 28, 0], "data_offsets": [0, 0]},
        "v": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    });
    std::fs::write(&model, raw_safetensors(&header.to_string(), &[0u8; 16])).unwrap();
    let args = ["demo", model.to_str().unwrap(), "--json"];
    let o = run_with(&args, &[], None, Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    for m in v["modes"].as_array().unwrap() {
        assert_eq!(m["compute"]["matrices"], 1, "{m}");
        assert_eq!(m["compute"]["outputs"], 2, "{m}");
    }
}
