//! The C conformance suite and the exit summary.

use super::{assert_success, compile, run};
use std::process::Command;

fn conformance(threshold: Option<&str>, expect_threshold: u64) {
    let prog = compile("preload_conformance.c", "cc", &["-std=c11", "-pthread"]);
    let mut cmd = Command::new(&prog);
    cmd.arg(expect_threshold.to_string());
    if let Some(t) = threshold {
        cmd.env("CKALLOC_PRELOAD_THRESHOLD", t);
    }
    let out = run(cmd, true);
    assert_success(&out, "preload_conformance");
    assert!(String::from_utf8_lossy(&out.stdout).contains("preload conformance: ok"));
}

#[test]
fn the_c_api_keeps_glibc_semantics_at_the_default_threshold() {
    conformance(None, 2 << 20);
}

#[test]
fn the_c_api_keeps_glibc_semantics_at_a_lower_threshold() {
    conformance(Some("1MiB"), 1 << 20);
}

#[test]
fn the_c_api_keeps_glibc_semantics_at_a_threshold_off_the_page_size() {
    conformance(Some("3000000"), 3_000_000);
}

#[test]
fn show_stats_prints_one_summary_at_exit_labelled_with_the_pid() {
    let prog = compile("preload_exit.c", "cc", &["-std=c11"]);
    let mut cmd = Command::new(&prog);
    cmd.env("CKALLOC_SHOW_STATS", "1");
    let child = {
        cmd.env_remove("LD_PRELOAD")
            .env("LD_PRELOAD", super::library())
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        cmd.spawn().expect("spawn")
    };
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    assert_success(&out, "preload_exit");
    let err = String::from_utf8_lossy(&out.stderr);
    let label = format!("ckalloc[{pid}]: ");
    assert!(
        err.lines().all(|l| l.starts_with(&label)),
        "every line labelled {label}:\n{err}"
    );
    assert!(
        err.contains("preload: 1 huge blocks served (5.00 MiB requested)"),
        "{err}"
    );
    assert!(err.contains("peak mapped: "), "{err}");
    assert!(err.contains("CKALLOC_SHOW_STATS on"), "{err}");

    // `_exit` prints nothing; without the variable nothing is printed.
    let mut quick = Command::new(&prog);
    quick.arg("quick").env("CKALLOC_SHOW_STATS", "1");
    let out = run(quick, true);
    assert_success(&out, "preload_exit quick");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut plain = Command::new(&prog);
    plain.env_remove("CKALLOC_SHOW_STATS");
    let out = run(plain, true);
    assert_success(&out, "preload_exit plain");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
