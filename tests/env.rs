//! The environment variables of `ckalloc::env`, each test in a child process
//! of this binary started with the variables set (the `CKALLOC_*` switches
//! are read once per process, and setting variables in a running test
//! process would race with other threads' `getenv`).

use std::process::Command;

/// Every variable `ckalloc::env` reads by a fixed name.
const VARS: [&str; 10] = [
    "CKALLOC_THP",
    "CKALLOC_BACKGROUND_THREAD",
    "CKALLOC_HUGETLB",
    "CKALLOC_HUGETLB_BACKOFF_MS",
    "CKALLOC_FIRST_TOUCH_PROBE",
    "CKALLOC_RETAIN_BYTES",
    "CKALLOC_RETAIN_DECAY_MS",
    "CK_BUMP_FORCE_MIXED",
    "CK_BUMP_DISABLE_MIXED",
    "CKALLOC_MODEL_CACHE",
];

/// Run the ignored test `child` of this binary with exactly `vars` of
/// [`VARS`] set and assert that it passed.
fn run_child(child: &str, vars: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([child, "--exact", "--ignored", "--test-threads=1"])
        .env("CKALLOC_ENV_TEST_CHILD", "1");
    for v in VARS {
        cmd.env_remove(v);
    }
    let out = cmd.envs(vars.iter().copied()).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{child} with {vars:?}:\n{text}");
    assert!(text.contains("1 passed"), "{child} did not run:\n{text}");
}

/// Whether this process is a child started by [`run_child`].
fn in_child() -> bool {
    std::env::var_os("CKALLOC_ENV_TEST_CHILD").is_some()
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn switch_values_other_than_on_and_off_words_are_not_taken_and_reported() {
    run_child(
        "child_odd_switches",
        &[
            ("CKALLOC_THP", "offf"),
            ("CKALLOC_HUGETLB", " YES "),
            ("CKALLOC_FIRST_TOUCH_PROBE", "disable"),
            ("CKALLOC_RETAIN_DECAY_MS", "1s"),
            ("CKALLOC_SHOW_STATS", "maybe"),
            ("CKALLOC_BACKGROUND_THREAD", "nope"),
            ("CKALLOC_PRELOAD_THRESHOLD", "18446744073709551615"),
        ],
    );
}

#[test]
#[ignore = "run by switch_values_other_than_on_and_off_words_are_not_taken_and_reported"]
fn child_odd_switches() {
    use ckalloc::env::{settings, Source};
    assert!(in_child());
    // An odd value is not taken: the default applies, whatever it is.
    assert!(ckalloc::env::thp_allowed());
    assert!(ckalloc::env::first_touch_probe());
    assert_eq!(ckalloc::env::show_stats(), ckalloc::env::ShowStats::Off);
    assert_eq!(ckalloc::env::background_thread(), None);
    // A size is taken as given, the largest too.
    assert_eq!(ckalloc::env::preload_threshold() as u64, u64::MAX);
    let s = settings();
    let by_name = |n: &str| *s.iter().find(|x| x.name == n).unwrap();
    assert_eq!(by_name("CKALLOC_THP").source, Source::Unparsed);
    assert_eq!(
        by_name("CKALLOC_FIRST_TOUCH_PROBE").source,
        Source::Unparsed
    );
    assert_eq!(by_name("CKALLOC_HUGETLB").source, Source::Environment);
    assert_eq!(by_name("CKALLOC_HUGETLB").value, 1);
    assert_eq!(by_name("CKALLOC_RETAIN_DECAY_MS").source, Source::Unparsed);
    assert_eq!(by_name("CKALLOC_RETAIN_DECAY_MS").value, 2000);
    assert_eq!(by_name("CKALLOC_RETAIN_BYTES").source, Source::Default);
    let shown = ckalloc::huge_stats().to_string();
    for name in [
        "CKALLOC_THP",
        "CKALLOC_FIRST_TOUCH_PROBE",
        "CKALLOC_RETAIN_DECAY_MS",
    ] {
        assert!(shown.contains(&format!("{name} does not parse")), "{shown}");
    }
    assert!(!shown.contains("CKALLOC_HUGETLB does not parse"), "{shown}");
    assert_eq!(by_name("CKALLOC_SHOW_STATS").source, Source::Unparsed);
    assert_eq!(by_name("CKALLOC_SHOW_STATS").value, 0);
    assert!(
        shown.contains("CKALLOC_SHOW_STATS does not parse: taken as unset (default off)"),
        "{shown}"
    );
    assert!(
        shown.contains("CKALLOC_PRELOAD_THRESHOLD 16.00 EiB (18446744073709551615 B)"),
        "{shown}"
    );
    assert!(
        shown.contains("CKALLOC_RETAIN_DECAY_MS does not parse: taken as unset (default 2000 ms)"),
        "{shown}"
    );
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn ckalloc_thp_off_disables_thp() {
    run_child(
        "child_thp_and_hugetlb_off",
        &[("CKALLOC_THP", "off"), ("CKALLOC_HUGETLB", "OFF")],
    );
}

#[test]
#[ignore = "run by ckalloc_thp_off_disables_thp"]
fn child_thp_and_hugetlb_off() {
    assert!(in_child());
    let r = ckalloc::HugeRegion::new(4 << 20).unwrap();
    assert_eq!(
        r.backing(),
        ckalloc::Backing::Normal,
        "CKALLOC_THP=off must disable THP advice"
    );
    assert_eq!(
        ckalloc::huge_stats().hugetlb_fallbacks,
        0,
        "CKALLOC_HUGETLB=OFF must skip the hugetlb tier"
    );
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn ckalloc_switches_are_trimmed() {
    run_child(
        "child_switches_with_spaces",
        &[("CKALLOC_THP", " 0"), ("CKALLOC_HUGETLB", " off\n")],
    );
}

#[test]
#[ignore = "run by ckalloc_switches_are_trimmed"]
fn child_switches_with_spaces() {
    assert!(in_child());
    assert!(!ckalloc::env::thp_allowed(), "CKALLOC_THP=\" 0\" is off");
    assert!(
        !ckalloc::env::hugetlb_allowed(),
        "CKALLOC_HUGETLB=\" off\\n\" is off"
    );
    let r = ckalloc::HugeRegion::new(4 << 20).unwrap();
    assert_eq!(r.backing(), ckalloc::Backing::Normal);
    assert_eq!(ckalloc::huge_stats().hugetlb_fallbacks, 0);
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn switches_default_to_on_and_backoff_to_one_second() {
    run_child("child_defaults", &[]);
}

#[test]
#[ignore = "run by switches_default_to_on_and_backoff_to_one_second"]
fn child_defaults() {
    assert!(in_child());
    assert!(ckalloc::env::thp_allowed());
    assert!(ckalloc::env::hugetlb_allowed());
    assert_eq!(ckalloc::env::hugetlb_backoff_ms(), 1000);
    assert!(!ckalloc::env::force_mixed());
    assert!(!ckalloc::env::disable_mixed());
    assert!(ckalloc::env::model_cache_dir().ends_with(".cache/models"));
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn backoff_ms_and_model_cache_are_read() {
    run_child(
        "child_backoff_and_cache",
        &[
            ("CKALLOC_HUGETLB_BACKOFF_MS", " 250 "),
            ("CKALLOC_MODEL_CACHE", "/nonexistent/models"),
        ],
    );
}

#[test]
#[ignore = "run by backoff_ms_and_model_cache_are_read"]
fn child_backoff_and_cache() {
    assert!(in_child());
    assert_eq!(ckalloc::env::hugetlb_backoff_ms(), 250);
    assert_eq!(
        ckalloc::env::model_cache_dir(),
        std::path::Path::new("/nonexistent/models")
    );
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn force_mixed_without_file_names_the_variable() {
    run_child(
        "child_force_mixed_without_file",
        &[("CK_BUMP_FORCE_MIXED", "1")],
    );
}

#[test]
#[ignore = "run by force_mixed_without_file_names_the_variable"]
fn child_force_mixed_without_file() {
    assert!(in_child());
    assert!(ckalloc::env::force_mixed());
    let err = ckalloc::BumpArena::builder(1 << 20)
        .build()
        .expect_err("mixed mode needs a file");
    let msg = err.to_string();
    assert!(
        msg.contains("CK_BUMP_FORCE_MIXED"),
        "the error must name the variable that skipped anonymous mode: {msg}"
    );
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn ck_bump_flags_follow_c_kernel_engine() {
    // "off" counts as set for CK_BUMP_*; "no" does not.
    run_child(
        "child_ck_bump_off_is_set",
        &[
            ("CK_BUMP_FORCE_MIXED", "off"),
            ("CK_BUMP_DISABLE_MIXED", "No"),
        ],
    );
}

#[test]
#[ignore = "run by ck_bump_flags_follow_c_kernel_engine"]
fn child_ck_bump_off_is_set() {
    assert!(in_child());
    assert!(ckalloc::env::force_mixed());
    assert!(!ckalloc::env::disable_mixed());
}
