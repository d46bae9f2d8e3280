//! What `ckalloc load` says about the arena it built: the mode's reason, how
//! the weights became readable, and errors that name the path once.

use crate::support::{ckalloc_env, fails, ok, packed, raw_safetensors, s};
use serde_json::Value;

/// An anon arena over a file with no tensors has an empty weights region:
/// nothing is copied and nothing faults in from the file, and the report
/// says so instead of using the mixed-mode wording.
#[test]
fn anon_mode_with_an_empty_weights_region_says_nothing_to_materialize() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("empty.safetensors");
    std::fs::write(&model, raw_safetensors("{}", &[])).unwrap();
    let out = dir.path().join("packed");
    ok(&["pack", s(&model), "-o", s(&out)]);
    let weights = out.join("weights.bump");
    let args = [
        "load",
        s(&weights),
        "--mode",
        "anon",
        "--activations",
        "1MiB",
    ];
    let text = ok(&args);
    assert!(text.contains("mode: anonymous"), "{text}");
    assert!(
        text.contains("empty weights region: nothing to materialize"),
        "{text}"
    );
    assert!(!text.contains("fault in from the file"), "{text}");
    // Mixed mode keeps its own wording.
    let text = ok(&[
        "load",
        s(&weights),
        "--mode",
        "mixed",
        "--activations",
        "1MiB",
    ]);
    assert!(text.contains("weights fault in from the file"), "{text}");
}

/// `CK_BUMP_FORCE_MIXED` under `--mode auto`: the reason names the variable
/// as the choice it is, not as a fallback after a failure.
#[test]
fn forced_mixed_reason_is_not_called_a_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let (_, weights) = packed(dir.path(), "5");
    let env = [("CK_BUMP_FORCE_MIXED", "1")];
    let o = ckalloc_env(&["load", s(&weights)], &env);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let mode_line = o.stdout.lines().find(|l| l.starts_with("mode:")).unwrap();
    assert!(
        mode_line.contains("CK_BUMP_FORCE_MIXED is set"),
        "{mode_line}"
    );
    assert!(!mode_line.contains("fell back"), "{mode_line}");
    let o = ckalloc_env(&["load", s(&weights), "--json"], &env);
    let l: Value = serde_json::from_str(&o.stdout).unwrap();
    let why = l["arena"]["why"].as_str().unwrap();
    assert_eq!(
        why, "auto skipped anonymous mode: CK_BUMP_FORCE_MIXED is set",
        "{l}"
    );
}

/// An error about the weights path names it once.
#[test]
fn load_of_a_device_names_the_path_once() {
    let e = fails(&["load", "/dev/null"], 1, "/dev/null: not a regular file");
    assert_eq!(e.matches("/dev/null").count(), 1, "{e}");
    let e = fails(
        &["inspect", "/dev/null"],
        1,
        "/dev/null: not a regular file",
    );
    assert_eq!(e.matches("/dev/null").count(), 1, "{e}");
    // A format error (no path in the library's message) still names it.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.bump");
    std::fs::write(&junk, b"not a weights file at all").unwrap();
    let e = fails(&["load", s(&junk)], 1, "junk.bump");
    assert_eq!(e.matches("junk.bump").count(), 1, "{e}");
}
