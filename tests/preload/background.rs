//! The engine's background thread under the preload library, in a C
//! program (`tests/c/preload_background.c`) run with the library and, for
//! reference, under glibc: it starts at the first huge `malloc` (one
//! thread, once, at the program's nice value), `CKALLOC_BACKGROUND_THREAD=0` keeps it off, a
//! fork child gets its own, a written block becomes huge pages with its bytes intact,
//! a freed gigabyte goes back by the clock while the program idles, and
//! the fault check runs while blocks are allocated and places them.

use super::{common, number, run_c};

/// Run a mode of `preload_background` with the library or without, with
/// `env` set; its stdout.
fn background(args: &[&str], preload: bool, env: &[(&str, &str)]) -> String {
    // THP blocks, which the thread promotes: with hugetlb pages reserved
    // (.ci/run reserves some) a block would take those, which
    // `AnonHugePages` does not count.
    let env = [&[("CKALLOC_HUGETLB", "0")], env].concat();
    run_c(
        "preload_background.c",
        args,
        preload,
        &["CKALLOC_BACKGROUND_THREAD", "CKALLOC_RETAIN_DECAY_MS"],
        &env,
    )
}

#[test]
fn the_first_huge_malloc_starts_one_thread_and_the_switch_keeps_it_off() {
    let on = background(&["threads"], true, &[]);
    assert_eq!(number::<f64>(&on, "threads before: "), 1.0, "{on}");
    assert_eq!(number::<f64>(&on, "threads after: "), 2.0, "{on}");
    assert_eq!(number::<f64>(&on, "threads after another: "), 2.0, "{on}");
    // The thread runs at the priority of the thread that started it: the
    // program's nice 5, not the default 0 nor khugepaged's 19.
    assert_eq!(number::<f64>(&on, "program nice: "), 5.0, "{on}");
    assert_eq!(number::<f64>(&on, "background nice: "), 5.0, "{on}");
    let off = background(&["threads"], true, &[("CKALLOC_BACKGROUND_THREAD", "0")]);
    assert_eq!(number::<f64>(&off, "threads after another: "), 1.0, "{off}");
    let glibc = background(&["threads"], false, &[]);
    assert_eq!(
        number::<f64>(&glibc, "threads after another: "),
        1.0,
        "{glibc}"
    );
}

#[test]
fn a_thread_started_by_a_real_time_thread_works_in_the_normal_class() {
    let out = background(&["realtime"], true, &[]);
    if out.contains("realtime: not permitted") {
        eprintln!("SCHED_FIFO not permitted here: skipped");
        return;
    }
    // sched_setscheduler(2): SCHED_FIFO is 1, SCHED_OTHER 0.
    assert_eq!(number::<f64>(&out, "program policy: "), 1.0, "{out}");
    assert_eq!(number::<f64>(&out, "background policy: "), 0.0, "{out}");
}

#[test]
fn a_fork_child_starts_its_own_thread_at_its_first_huge_malloc() {
    let out = background(&["fork"], true, &[]);
    assert_eq!(number::<f64>(&out, "parent threads: "), 2.0, "{out}");
    assert!(out.contains("child threads: 1 then 2"), "{out}");
    // The parent ran at nice 4: so do the child and its thread.
    assert_eq!(number::<f64>(&out, "child background nice: "), 4.0, "{out}");
    assert!(out.contains("ok: child"), "{out}");
}

#[test]
fn a_written_block_becomes_huge_pages_in_the_background_with_its_bytes_intact() {
    let out = background(&["promote", "64"], true, &[]);
    let huge = number::<f64>(&out, "huge kB: ");
    eprintln!("{out}");
    assert!(huge >= 0.95 * 65536.0, "{out}");
    // Off: no promotion, and the block was never advised MADV_HUGEPAGE
    // where an advised fault would compact (THP `defrag` madvise), so the
    // kernel's modes alone decide; the bytes are intact either way.
    let off = background(
        &["promote", "64"],
        true,
        &[("CKALLOC_BACKGROUND_THREAD", "off")],
    );
    eprintln!("thread off: {off}");
}

#[test]
fn a_freed_gigabyte_goes_back_by_the_clock_while_the_program_idles() {
    for calls in ["0", "1"] {
        let ck = number::<f64>(&background(&["idle-release", calls], true, &[]), "rss kB: ");
        let glibc = number::<f64>(
            &background(&["idle-release", calls], false, &[]),
            "rss kB: ",
        );
        eprintln!("resident after free(1 GiB) and 3 s idle (calls {calls}): ckalloc {ck} kB, glibc {glibc} kB");
        assert!(
            ck <= glibc + 64.0 * 1024.0,
            "ckalloc {ck} kB, glibc {glibc} kB"
        );
    }
}

#[test]
fn the_fault_check_runs_while_blocks_are_allocated_and_decides_where_they_fault() {
    // Spans are reserved unadvised, and the check runs, only where THP is
    // on and an advised fault compacts memory synchronously.
    let defrag = common::thp_setting("defrag");
    let compacts = ["[always]", "[defer+madvise]", "[madvise]"]
        .iter()
        .any(|m| defrag.contains(m));
    if !common::thp_available() || !compacts {
        eprintln!("THP off, or defrag {defrag:?} does not compact on an advised fault: skipped");
        return;
    }
    let out = run_c(
        "preload_background.c",
        &["check"],
        true,
        &[
            "CKALLOC_BACKGROUND_THREAD",
            "CKALLOC_THP",
            "CKALLOC_RETAIN_DECAY_MS",
        ],
        &[("CKALLOC_HUGETLB", "0")],
    );
    eprintln!("{out}");
    let n = |label: &str| number::<i64>(&out, label);
    let checks = n("active huge_checks: ");
    let dear = n("active huge_checks_dear: ");
    let huge = n("active huge_page_first_bytes: ");
    let base = n("active base_page_first_bytes: ");
    // 1.2 s of allocations: a check per 100 ms tick.
    assert!(checks >= 5, "{out}");
    assert!((0..=checks).contains(&dear), "{out}");
    // Every block was fresh, went where a verdict sent it, and was counted
    // so: in a mapping advised MADV_HUGEPAGE exactly when counted huge.
    assert_eq!(huge + base, 60 * (4 << 20), "{out}");
    assert_eq!(n("active advised_bytes: "), huge, "{out}");
    if checks - dear >= 2 {
        assert!(
            huge > 0,
            "cheap verdicts placed no block in huge pages: {out}"
        );
    }
    if dear == checks {
        assert_eq!(huge, 0, "{out}");
    }
    // Idle: the checks stop within the verdict's 250 ms.
    assert!(n("idle huge_checks: ") - checks <= 3, "{out}");
    // A granted block grown past what a check grants moves to a span of
    // base pages, without the advice of the span it left.
    if huge > 0 {
        assert_eq!(n("grown advised: "), 0, "{out}");
    }
}
