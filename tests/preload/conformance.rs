//! The C conformance suite and the exit summary.

use super::{assert_success, compile, number, run, run_c};
use std::process::Command;

/// The environment variables that set glibc's mmap or trim threshold, which
/// the library then leaves alone: removed where a test needs its own.
const GLIBC_THRESHOLD_VARIABLES: [&str; 3] = [
    "GLIBC_TUNABLES",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
];

/// Every variable that changes what the library does with glibc's
/// thresholds: removed for `preload_glibc_thresholds.c`, whose runs set
/// the ones they test.
const GLIBC_SETUP_VARIABLES: [&str; 7] = [
    GLIBC_THRESHOLD_VARIABLES[0],
    GLIBC_THRESHOLD_VARIABLES[1],
    GLIBC_THRESHOLD_VARIABLES[2],
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "CKALLOC_PRELOAD_THRESHOLD",
    "CKALLOC_RETAIN_DECAY_MS",
];

fn conformance(threshold: Option<&str>, expect_threshold: u64) {
    let prog = compile("preload_conformance.c", "cc", &["-std=c11", "-pthread"]);
    let mut cmd = Command::new(&prog);
    // The suite restores the mmap threshold the library sets.
    cmd.arg(expect_threshold.to_string());
    for var in GLIBC_THRESHOLD_VARIABLES {
        cmd.env_remove(var);
    }
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
fn the_c_api_keeps_glibc_semantics_at_a_threshold_below_the_watched_requests() {
    // Below 64 KiB: `malloc`'s fast path stops at the threshold, and the
    // requests from it up go to the engine, none watched on glibc's side.
    conformance(Some("16KiB"), 16 << 10);
}

#[test]
fn the_c_api_keeps_glibc_semantics_at_a_threshold_off_the_page_size() {
    conformance(Some("3000000"), 3_000_000);
}

#[test]
fn show_stats_is_read_at_load_and_survives_a_closed_pipe() {
    let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
    // The program clears its environment before it exits: the summary is
    // still printed.
    let mut cmd = Command::new(&prog);
    cmd.arg("clearenv").env("CKALLOC_SHOW_STATS", "1");
    let out = run(cmd, true);
    assert_success(&out, "preload_exit clearenv");
    assert!(String::from_utf8_lossy(&out.stderr).contains("preload: 1 huge block served"));
    // Standard error is a pipe whose reader is gone: the exit status stays 0.
    let mut cmd = Command::new(&prog);
    cmd.env("CKALLOC_SHOW_STATS", "1")
        .env("LD_PRELOAD", super::library())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    drop(child.stderr.take());
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_later_preload_does_not_answer_for_glibc() {
    // A library after ckalloc's in LD_PRELOAD that defines
    // `malloc_usable_size` (as every allocator does): glibc's blocks must
    // still be measured by glibc.
    let fake = super::scratch().join("libfake_usable_size.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&fake)
        .arg(super::root().join("tests/c/fake_usable_size.c"))
        .status()
        .expect("run cc");
    assert!(st.success());
    let prog = compile("preload_conformance.c", "cc", &["-std=c11", "-pthread"]);
    let _pool = super::hugetlb_pool();
    let out = Command::new(&prog)
        .arg((2u64 << 20).to_string())
        .env(
            "LD_PRELOAD",
            format!("{} {}", super::library().display(), fake.display()),
        )
        .output()
        .expect("run");
    assert_success(&out, "preload_conformance with a later malloc_usable_size");
}

#[test]
fn show_stats_prints_one_summary_at_exit_labelled_with_the_pid() {
    let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
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
        err.contains("preload: 1 huge block served (5.00 MiB requested)"),
        "{err}"
    );
    assert!(err.contains("system calls: mmap "), "{err}");
    assert!(err.contains("CKALLOC_SHOW_STATS on"), "{err}");
    // The cap in use, not only the variable's default.
    assert!(
        err.contains("retention cap 128.00 MiB (twice the live peak, at least the default)"),
        "{err}"
    );

    // A threshold of 0 is shown as the value in use, 1 byte, in both lines.
    let mut cmd = Command::new(&prog);
    cmd.env("CKALLOC_SHOW_STATS", "1")
        .env("CKALLOC_PRELOAD_THRESHOLD", "0")
        .env("CKALLOC_HUGETLB", "0");
    let out = run(cmd, true);
    assert_success(&out, "preload_exit at threshold 0");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(", threshold 1 B,"), "{err}");
    assert!(err.contains("CKALLOC_PRELOAD_THRESHOLD 1 B,"), "{err}");

    // `_exit` prints nothing; without the variable nothing is printed.
    let silent = |args: &[&str], show: Option<&str>, what: &str| {
        let mut cmd = Command::new(&prog);
        cmd.args(args).env_remove("CKALLOC_SHOW_STATS");
        if let Some(v) = show {
            cmd.env("CKALLOC_SHOW_STATS", v);
        }
        let out = run(cmd, true);
        assert_success(&out, what);
        assert!(
            out.stderr.is_empty(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    silent(&["quick"], Some("1"), "preload_exit quick");
    // A file opened under descriptor 2 after the library loaded gets
    // nothing; the summary goes to the standard error the program started
    // with, also when the program closed it before the library prints.
    let file = super::scratch().join("reused-stderr");
    let file_arg = file.to_str().expect("UTF-8 scratch path");
    for args in [&["reuse-stderr", file_arg][..], &["close-stderr-at-exit"]] {
        let mut cmd = Command::new(&prog);
        cmd.args(args).env("CKALLOC_SHOW_STATS", "1");
        let out = run(cmd, true);
        assert_success(&out, "preload_exit");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("preload: 1 huge block served"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read(&file).expect("the file exists"), b"");
    // A program that closed the copy too, and reused its number: nothing,
    // anywhere.
    silent(
        &["close-all", file_arg],
        Some("1"),
        "preload_exit close-all",
    );
    assert_eq!(std::fs::read(&file).expect("the file exists"), b"");
    silent(&[], None, "preload_exit without CKALLOC_SHOW_STATS");
    silent(&[], Some("0"), "preload_exit with CKALLOC_SHOW_STATS=0");
}

/// `preload_exit` with `args`, the library preloaded, `env` set (and
/// `CKALLOC_SHOW_STATS`, `CKALLOC_STATS_FILE` unset unless given), its
/// stderr into its stdout: (pid, the combined output).
fn exit_run(args: &[&str], env: &[(&str, &str)]) -> (u32, String) {
    exit_run_preloading(args, super::library().as_os_str(), env)
}

/// [`exit_run`] with `preload` as `LD_PRELOAD`.
fn exit_run_preloading(
    args: &[&str],
    preload: &std::ffi::OsStr,
    env: &[(&str, &str)],
) -> (u32, String) {
    let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$@\" 2>&1")
        .arg("sh")
        .arg(&prog)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env_remove("CKALLOC_SHOW_STATS")
        .env_remove("CKALLOC_STATS_FILE")
        .envs(env.iter().copied());
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    assert_success(&out, &format!("preload_exit {args:?}"));
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_summary_comes_only_from_a_process_that_served_a_huge_block_unless_all_is_asked() {
    let (_, out) = exit_run(&["small-only"], &[("CKALLOC_SHOW_STATS", "1")]);
    assert_eq!(out, "", "no huge block, no summary");
    let (pid, out) = exit_run(&["small-only"], &[("CKALLOC_SHOW_STATS", "all")]);
    assert!(
        out.contains(&format!("ckalloc[{pid}]: preload: 0 huge blocks served")),
        "{out}"
    );
    assert!(out.contains("CKALLOC_SHOW_STATS all"), "{out}");
    let (pid, out) = exit_run(&[], &[("CKALLOC_SHOW_STATS", " ON ")]);
    assert!(
        out.contains(&format!("ckalloc[{pid}]: preload: 1 huge block served")),
        "{out}"
    );
    // A child of `fork` that served no huge block itself: none from it.
    let (pid, out) = exit_run(&["fork-after"], &[("CKALLOC_SHOW_STATS", "1")]);
    assert_eq!(out.matches(": preload: ").count(), 1, "{out}");
    assert!(
        out.contains(&format!("ckalloc[{pid}]: preload: 1 huge block")),
        "{out}"
    );
    // A value that is not a switch word is not taken: the default (off).
    let (_, out) = exit_run(&[], &[("CKALLOC_SHOW_STATS", "nope")]);
    assert_eq!(out, "");
}

/// `LD_PRELOAD` with `first`, then `second`.
fn preload_pair(first: &std::path::Path, second: &std::path::Path) -> std::ffi::OsString {
    let mut s = first.as_os_str().to_owned();
    s.push(" ");
    s.push(second);
    s
}

/// `tests/c/forwarding_malloc.c` built as the shared object `name` in the
/// scratch directory, with the linker flag `flag`.
fn forwarding_library(name: &str, flag: &str) -> std::path::PathBuf {
    let out = super::scratch().join(name);
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", flag, "-o"])
        .arg(&out)
        .arg(super::root().join("tests/c/forwarding_malloc.c"))
        .status()
        .expect("run cc");
    assert!(st.success(), "cc {flag} for {name}");
    out
}

#[test]
fn a_summary_names_the_object_ahead_that_the_programs_malloc_goes_to() {
    let ahead = compile("forwarding_malloc.c", "cc", &["-shared", "-fPIC"]);
    let lib = super::library();
    let both = preload_pair;
    let on = [("CKALLOC_SHOW_STATS", "1")];
    // Loaded ahead of the library, the object takes every call: the
    // library serves nothing and says where the calls go in one line,
    // without `all`; under `all`, in the full summary.
    let (pid, out) = exit_run_preloading(&[], &both(&ahead, lib), &on);
    let says = format!(
        "ckalloc[{pid}]: preload: the program's `malloc` goes first to {}, loaded ahead \
         of this library: that object serves it, and this library only what it passes on\n",
        ahead.display()
    );
    assert_eq!(out, says);
    let (pid, out) = exit_run_preloading(&[], &both(&ahead, lib), &[("CKALLOC_SHOW_STATS", "all")]);
    assert!(
        out.contains(&format!("ckalloc[{pid}]: preload: 0 huge blocks served")),
        "{out}"
    );
    assert!(out.contains("goes first to"), "{out}");
    // A path's control characters are escaped, so it stays one line; a
    // path longer than 256 bytes is cut to its last 256, after an
    // ellipsis.
    let odd = super::scratch().join("odd\nname\u{1b}[31m.so");
    let deep = super::scratch().join("l".repeat(200));
    std::fs::create_dir_all(&deep).expect("mkdir");
    let long = deep.join(format!("{}.so", "l".repeat(100)));
    for link in [&odd, &long] {
        let _ = std::fs::remove_file(link);
        std::os::unix::fs::symlink(&ahead, link).expect("symlink");
    }
    let (_, out) = exit_run_preloading(&[], &both(&odd, lib), &on);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains("odd\\x0aname\\x1b[31m.so, loaded ahead"),
        "{out}"
    );
    let (_, out) = exit_run_preloading(&[], &both(&long, lib), &on);
    let tail = format!(
        "goes first to \u{2026}{}/{}.so, loaded ahead",
        "l".repeat(152),
        "l".repeat(100)
    );
    assert!(out.contains(&tail), "{out}");
    assert!(
        !out.contains(&format!("{}", super::scratch().display())),
        "{out}"
    );
    // Under valgrind's memcheck, whose preloaded object takes every
    // object's `malloc`, this library's too.
    if Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
        let out = Command::new("valgrind")
            .args(["-q", "--leak-check=no"])
            .arg(&prog)
            .env("LD_PRELOAD", lib)
            .env("CKALLOC_SHOW_STATS", "1")
            .env_remove("CKALLOC_STATS_FILE")
            .output()
            .expect("run valgrind");
        assert_success(&out, "preload_exit under valgrind");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("goes first to ") && err.contains("/vgpreload_memcheck-"),
            "{err}"
        );
    } else {
        eprintln!("skipped: no valgrind");
    }
    // A child of `fork` leaves the line to its parent.
    let (_, out) = exit_run_preloading(&["fork-after"], &both(&ahead, lib), &on);
    assert_eq!(out.matches("goes first to").count(), 1, "{out}");
    // Behind the library, the object is not reached: the library serves.
    let (pid, out) = exit_run_preloading(&[], &both(lib, &ahead), &on);
    assert!(
        out.contains(&format!("ckalloc[{pid}]: preload: 1 huge block served")),
        "{out}"
    );
    assert!(!out.contains("goes first"), "{out}");
}

#[test]
fn the_statistics_name_the_object_ahead_that_defines_an_allocator_function() {
    // `preload_glibc_thresholds.c` prints the statistics' "preload" keys
    // from the glibc ones on; run with `LD_PRELOAD=preload`.
    let json_of = |prog: &std::path::Path, preload: &std::ffi::OsStr| {
        let mut cmd = Command::new(prog);
        for var in GLIBC_SETUP_VARIABLES {
            cmd.env_remove(var);
        }
        let out = cmd
            .env_remove("CKALLOC_SHOW_STATS")
            .env("LD_PRELOAD", preload)
            .output()
            .expect("run");
        assert_success(&out, &format!("{} under {preload:?}", prog.display()));
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        out.lines()
            .find_map(|l| l.strip_prefix("json "))
            .unwrap_or_else(|| panic!("no json line in {out}"))
            .to_owned()
    };
    let ahead = |object: &str, program: bool, function: &str| {
        format!(
            "\"serves\":false,\"ahead\":{{\"object\":\"{object}\",\"cut\":false,\
             \"program\":{program},\"function\":\"{function}\""
        )
    };
    let lib = super::library();
    let _lock = super::hugetlb_pool();
    // A program built without PIE that takes `malloc`'s address has it at
    // its own PLT entry: the lookup goes past it to an object ahead of the
    // library that defines `malloc` alone.
    let nopie = compile(
        "preload_glibc_thresholds_nopie.c",
        "cc",
        &["-no-pie", "-fno-pic"],
    );
    let only_malloc = compile("forwarding_malloc_only.c", "cc", &["-shared", "-fPIC"]);
    let json = json_of(&nopie, &preload_pair(&only_malloc, lib));
    let want = ahead(&only_malloc.display().to_string(), false, "malloc");
    assert!(json.contains(&want), "{json}");
    // Defined under a version of its own, `malloc@@FOO`, an object's
    // functions are not what a program's `malloc@GLIBC_2.2.5` binds to:
    // the library still comes first.
    let script = super::scratch().join("foo.map");
    std::fs::write(&script, "FOO { global: *; };").expect("write");
    let versioned = forwarding_library(
        "libforwarding_foo.so",
        &format!("-Wl,--version-script={}", script.display()),
    );
    let preload = preload_pair(&versioned, lib);
    let json = json_of(&nopie, &preload);
    assert!(json.ends_with("\"serves\":true,\"ahead\":null"), "{json}");
    // An object linked at an address it cannot have (at the top of the
    // address space) is loaded below it: its load bias wraps around, and
    // its dynamic section's entries, which glibc made absolute, are still
    // found.
    let top = forwarding_library("libforwarding_top.so", "-Wl,-Ttext-segment=0x7ffffffff000");
    let preload = preload_pair(&top, lib);
    let json = json_of(&nopie, &preload);
    let want = ahead(&top.display().to_string(), false, "malloc");
    assert!(json.contains(&want), "{json}");
    // A program that defines the functions itself comes first.
    let own = compile("preload_own_malloc.c", "cc", &[]);
    let json = json_of(&own, lib.as_os_str());
    assert!(
        json.contains(&ahead(&own.display().to_string(), true, "malloc")),
        "{json}"
    );
    // glibc's malloc debugging library defines `malloc@GLIBC_2.2.5` as a
    // hidden version, which only a lookup by version finds.
    let debug = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0");
    if cfg!(target_arch = "x86_64") && debug.exists() {
        let prog = compile("preload_glibc_thresholds.c", "cc", &[]);
        let json = json_of(&prog, &preload_pair(debug, lib));
        assert!(
            json.contains(&ahead(&debug.display().to_string(), false, "malloc")),
            "{json}"
        );
    } else {
        eprintln!("skipped: no {} (glibc 2.34+ on x86_64)", debug.display());
    }
}

#[test]
fn the_summary_follows_the_programs_buffered_output_and_never_waits_for_its_lock() {
    let (_, out) = exit_run(&["print-lines"], &[("CKALLOC_SHOW_STATS", "1")]);
    assert!(out.starts_with("first line\nlast line\nckalloc["), "{out}");
    // Another thread holds stdout's lock at exit: the summary is printed
    // (after what is already written) and the process still exits.
    let (_, out) = exit_run(&["locked-stdout"], &[("CKALLOC_SHOW_STATS", "1")]);
    assert!(out.contains("preload: 1 huge block served"), "{out}");
}

#[test]
fn summaries_go_to_one_file_per_process_through_a_pid_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_str().expect("UTF-8 path");
    // A relative template is taken from the directory at load, though the
    // program changes directory before it exits; `%%` is one `%`.
    let (pid, out) = {
        let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
        let child = Command::new(&prog)
            .args(["chdir", elsewhere.path().to_str().expect("UTF-8 path")])
            .current_dir(dir.path())
            .env("LD_PRELOAD", super::library())
            .env_remove("CKALLOC_SHOW_STATS")
            .env("CKALLOC_STATS_FILE", "ck-%p-100%%.txt")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let pid = child.id();
        (pid, child.wait_with_output().expect("wait"))
    };
    assert_success(&out, "preload_exit chdir");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join(format!("ck-{pid}-100%.txt")))
        .expect("the summary file");
    assert!(
        text.starts_with(&format!("ckalloc[{pid}]: preload: 1 huge block served")),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);

    // A parent and its child: one file each, nothing on the streams.
    let template = format!("{root}/fork-%p.txt");
    let (pid, out) = exit_run(&["fork"], &[("CKALLOC_STATS_FILE", &template)]);
    assert_eq!(out, "");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fork-"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&format!("fork-{pid}.txt")), "{names:?}");
    for n in &names {
        let text = std::fs::read_to_string(dir.path().join(n)).unwrap();
        let pid = n.trim_start_matches("fork-").trim_end_matches(".txt");
        assert!(
            text.starts_with(&format!("ckalloc[{pid}]: preload: 1 huge block")),
            "{n}: {text}"
        );
        assert_eq!(text.matches("preload: ").count(), 1, "{n}: {text}");
    }

    // A template not taken prints nothing anywhere.
    let bad = format!("{root}/bad-%q.txt");
    let (_, out) = exit_run(&[], &[("CKALLOC_STATS_FILE", &bad)]);
    assert_eq!(out, "");
    assert!(!dir.path().join("bad-%q.txt").exists());
}

/// A set-user-ID program reads no `CKALLOC_*` variable: a user who starts
/// it cannot have it append a summary to a file of their choice with its
/// owner's rights. The library is linked into `preload_exit` (the dynamic
/// linker ignores an `LD_PRELOAD` path in secure-execution mode), which is
/// made set-user-ID to `nobody`, so that root running it is in that mode.
/// The same program without the bit writes the summary the variables ask
/// for and reports the settings they make.
#[test]
fn a_set_user_id_program_reads_no_ckalloc_variable() {
    use std::os::unix::fs::PermissionsExt as _;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: making a program set-user-ID to nobody needs root");
        return;
    }
    let lib = super::library();
    let lib_dir = lib.parent().expect("the library's directory");
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("linked_exit");
    let st = Command::new("cc")
        .args(["-std=c11", "-pthread", "-O2", "-Wall", "-Werror"])
        .arg(super::root().join("tests/c/preload_exit.c"))
        .arg("-o")
        .arg(&plain)
        .arg("-Wl,--no-as-needed")
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-l:libckalloc_preload.so")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed linking the library");
    let set_uid = dir.path().join("linked_exit_suid");
    std::fs::copy(&plain, &set_uid).expect("copy the program");
    std::os::unix::fs::chown(&set_uid, Some(65534), Some(65534)).expect("chown nobody");
    std::fs::set_permissions(&set_uid, std::fs::Permissions::from_mode(0o4755)).expect("chmod u+s");
    // Writable by `nobody`, so that a summary the library tried to write
    // would land.
    let stats = dir.path().join("stats");
    std::fs::create_dir(&stats).expect("mkdir");
    std::fs::set_permissions(&stats, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let run_linked = |prog: &std::path::Path| {
        let mut cmd = Command::new(prog);
        cmd.arg("at-secure")
            .arg(&stats)
            .env("CKALLOC_SHOW_STATS", "all")
            .env("CKALLOC_STATS_FILE", stats.join("ck-%p.txt"))
            .env("CKALLOC_RETAIN_BYTES", "0")
            .env("CKALLOC_THP", "0")
            .env("CKALLOC_HUGETLB", "0");
        // The library is linked, not preloaded: hold the pool as `run`
        // does for a preloaded program.
        let _pool = super::hugetlb_pool();
        let out = run(cmd, false);
        assert_success(&out, &format!("{} at-secure", prog.display()));
        out
    };

    let out = run_linked(&plain);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "at_secure 0\ndir_writable 1\nsettings_from_env 4\n"
    );
    let written: Vec<_> = std::fs::read_dir(&stats)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let text = std::fs::read_to_string(&written[0]).unwrap();
    assert!(text.contains("preload: 1 huge block served"), "{text}");
    std::fs::remove_file(&written[0]).unwrap();

    let out = run_linked(&set_uid);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.starts_with("at_secure 0\n") {
        eprintln!(
            "skipped: the file system of {} ignores set-user-ID bits",
            dir.path().display()
        );
        return;
    }
    // `nobody` can write where the summary would go, and no setting comes
    // from the environment.
    assert_eq!(stdout, "at_secure 1\ndir_writable 1\nsettings_from_env 0\n");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(&stats).unwrap().count(), 0);
}

#[test]
fn the_copy_of_stderr_fits_under_a_low_descriptor_limit() {
    let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 200 && exec \"$0\" close-stderr-at-exit")
        .arg(&prog)
        .env("LD_PRELOAD", super::library())
        .env("CKALLOC_SHOW_STATS", "1")
        .output()
        .expect("run");
    assert_success(&out, "preload_exit under ulimit -n 200");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("preload: 1 huge block served"), "{err}");
}

#[test]
fn glibc_takes_the_requests_below_the_threshold_from_its_heap_unless_the_environment_says_otherwise(
) {
    /// What `preload_glibc_thresholds.c` printed.
    #[derive(Debug)]
    struct Heap {
        mapped: u64,
        after_free: u64,
        after_big_free: u64,
        after_huge_free: u64,
        json: String,
    }
    let run_in = |program: &str, args: &[&str], preload: bool, env: &[(&str, &str)]| {
        let out = run_c(program, args, preload, &GLIBC_SETUP_VARIABLES, env);
        let json = out
            .lines()
            .find_map(|l| l.strip_prefix("json "))
            .map(str::to_owned);
        Heap {
            mapped: number::<u64>(&out, "mapped "),
            after_free: number::<u64>(&out, "heap_after_free "),
            after_big_free: number::<u64>(&out, "heap_after_big_free "),
            after_huge_free: number::<u64>(&out, "heap_after_huge_free "),
            json: json.unwrap_or_else(|| panic!("no json line in {out}")),
        }
    };
    let run_it = |args: &[&str], preload: bool, env: &[(&str, &str)]| {
        run_in("preload_glibc_thresholds.c", args, preload, env)
    };
    // Opened with dlopen (after libc), the library serves nothing.
    let untouched = "\"glibc_thresholds\":\"untouched\",\"glibc_mmap_threshold\":null,\
                     \"glibc_trim_threshold\":null,\"serves\":false,\"ahead\":null";
    // glibc's defaults map a 1 MiB request and trim the freed top; after
    // a freed 12 MiB mapping their trim threshold is 24 MiB.
    let h = run_it(&[], false, &[]);
    assert_eq!(h.mapped, 1, "glibc alone");
    assert!(h.after_free < 3 << 20, "glibc alone keeps {h:?}");
    assert!(h.after_big_free >= 8 << 20, "glibc alone keeps {h:?}");
    // A freed 40 MiB mapping raises nothing: the 24 MiB threshold gives
    // the freed 30 MiB back.
    assert!(h.after_huge_free < 24 << 20, "glibc alone keeps {h:?}");
    assert_eq!(h.json, "none");
    // The library's thresholds: from the heap, and the heap keeps 3 MiB;
    // the freed 12 MiB block raises the trim threshold to 24 MiB, so the
    // heap keeps the freed 8 MiB.
    let h = run_it(&[], true, &[]);
    assert_eq!(h.mapped, 0, "preloaded");
    assert!(h.after_free >= 3 << 20, "preloaded keeps {h:?}");
    assert!(h.after_big_free >= 8 << 20, "preloaded keeps {h:?}");
    assert!(h.after_huge_free < 24 << 20, "preloaded keeps {h:?}");
    assert_eq!(
        h.json,
        "\"glibc_thresholds\":\"set\",\"glibc_mmap_threshold\":2097152,\
         \"glibc_trim_threshold\":25165824,\"serves\":true,\"ahead\":null"
    );
    // The program's own `mallopt` after load stands: no raise, the freed
    // top goes back, and the statistics say so.
    for preload in [false, true] {
        let h = run_it(&["mallopt"], preload, &[]);
        assert!(
            h.after_big_free < 3 << 20,
            "mallopt, preloaded {preload}: {h:?}"
        );
    }
    let h = run_it(&["mallopt"], true, &[]);
    assert_eq!(h.mapped, 0, "mallopt, preloaded");
    let program = "\"glibc_thresholds\":\"program\",\"glibc_mmap_threshold\":null,\
                   \"glibc_trim_threshold\":null,\"serves\":true,\"ahead\":null";
    assert_eq!(h.json, program);
    // Made before any constructor ran (the program's `.preinit_array`),
    // it keeps the library from setting glibc's thresholds at all.
    let h = run_it(&[], true, &[("PRELOAD_TEST_MALLOPT_EARLY", "1")]);
    assert_eq!(h.mapped, 1, "early mallopt, preloaded: {h:?}");
    assert!(
        h.after_big_free < 3 << 20,
        "early mallopt, preloaded: {h:?}"
    );
    assert_eq!(h.json, program);
    // `malloc_usable_size` and `malloc_trim` from there find glibc's
    // without running the library's constructor before its time.
    let h = run_it(&[], true, &[("PRELOAD_TEST_CALLS_EARLY", "1")]);
    assert_eq!(h.mapped, 0, "early calls, preloaded: {h:?}");
    assert!(
        h.json.starts_with("\"glibc_thresholds\":\"set\""),
        "early calls, preloaded: {h:?}"
    );
    // A top pad or a mapping count from the environment ends glibc's
    // dynamic threshold: the library sets the thresholds, raises nothing.
    for env in [
        ("MALLOC_TOP_PAD_", "131072"),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_max=100"),
    ] {
        let h = run_it(&[], true, &[env]);
        assert_eq!(h.mapped, 0, "{env:?}: {h:?}");
        assert!(h.after_big_free < 3 << 20, "{env:?}: {h:?}");
        assert_eq!(
            h.json,
            "\"glibc_thresholds\":\"set\",\"glibc_mmap_threshold\":2097152,\
             \"glibc_trim_threshold\":4194304,\"serves\":true,\"ahead\":null",
            "{env:?}"
        );
    }
    // A threshold the environment sets is glibc's to keep; a tunable glibc
    // does not read (another name that contains it) is not.
    for (env, state, mapped_then) in [
        (
            ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072"),
            "environment",
            1,
        ),
        (
            (
                "GLIBC_TUNABLES",
                "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=131072",
            ),
            "environment",
            1,
        ),
        (("MALLOC_MMAP_THRESHOLD_", "131072"), "environment", 1),
        (
            ("GLIBC_TUNABLES", "xglibc.malloc.mmap_threshold=131072"),
            "set",
            0,
        ),
    ] {
        let h = run_it(&[], true, &[env]);
        assert_eq!(h.mapped, mapped_then, "preloaded with {env:?}");
        let says = format!("\"glibc_thresholds\":\"{state}\"");
        assert!(h.json.starts_with(&says), "{env:?}: {h:?}");
    }
    // GLIBC_TUNABLES twice (a raw execve), the second with a 4 MiB mmap
    // threshold: glibc alone reads it (the 1 MiB block is not mapped), and
    // the library leaves glibc as it is (its trim threshold stays glibc's
    // default, so the freed top goes back, also after a freed huge block).
    let h = run_it(&["twice"], false, &[]);
    assert_eq!(h.mapped, 0, "glibc alone, GLIBC_TUNABLES twice");
    let h = run_it(&["twice"], true, &[]);
    assert_eq!(h.mapped, 0, "preloaded, GLIBC_TUNABLES twice");
    assert!(
        h.after_free < 3 << 20,
        "preloaded, GLIBC_TUNABLES twice: {h:?}"
    );
    assert!(
        h.after_big_free < 3 << 20,
        "preloaded, GLIBC_TUNABLES twice: {h:?}"
    );
    assert!(
        h.json.starts_with("\"glibc_thresholds\":\"environment\""),
        "{h:?}"
    );
    let h = run_it(&[], true, &[("MALLOC_TRIM_THRESHOLD_", "131072")]);
    assert!(
        h.after_big_free < 3 << 20,
        "preloaded, trim from the environment: {h:?}"
    );
    // Built without PIE, a program that takes malloc's address has the
    // process's malloc at its own PLT entry; the library still sets glibc up.
    super::compile(
        "preload_glibc_thresholds_nopie.c",
        "cc",
        &["-no-pie", "-fno-pic"],
    );
    let h = run_in("preload_glibc_thresholds_nopie.c", &[], true, &[]);
    assert_eq!(h.mapped, 0, "without PIE");
    assert!(
        h.json.starts_with("\"glibc_thresholds\":\"set\"")
            && h.json.ends_with(",\"serves\":true,\"ahead\":null"),
        "without PIE: {h:?}"
    );
    // Opened with dlopen, the library is not the process's malloc and
    // leaves glibc's defaults.
    let lib = super::library().to_str().expect("UTF-8 path");
    let h = run_it(&["dlopen", lib], false, &[]);
    assert_eq!(h.mapped, 1, "opened with dlopen");
    assert!(h.after_free < 3 << 20, "opened with dlopen: {h:?}");
    assert_eq!(h.json, untouched);
}

#[test]
fn glibcs_heap_growing_again_into_a_trimmed_top_raises_the_trim_threshold() {
    // Rounds of six 1 MiB blocks written and freed from the heap's top
    // down: the freed 6 MiB is over the trim threshold, so glibc gives it
    // back at the end of every round and faults it in again at the next.
    let cycle = |mode: &str, preload: bool, env: &[(&str, &str)]| {
        let out = run_c(
            "preload_glibc_thresholds.c",
            &[mode],
            preload,
            &GLIBC_SETUP_VARIABLES,
            env,
        );
        let json = out
            .lines()
            .find_map(|l| l.strip_prefix("json "))
            .unwrap_or_else(|| panic!("no json line in {out}"))
            .to_owned();
        (number::<u64>(&out, "cycle_faults "), json)
    };
    let trim = |bytes: u64| {
        format!(
            "\"glibc_thresholds\":\"set\",\"glibc_mmap_threshold\":2097152,\
             \"glibc_trim_threshold\":{bytes},\"serves\":true,\"ahead\":null"
        )
    };
    // glibc alone: about 1,500 faults a round in the last four of ten.
    let (faults, _) = cycle("cycle", false, &[]);
    assert!(faults >= 4 * 512, "glibc alone: {faults} faults");
    // Preloaded: the heap growing into the top trimmed at the end of the
    // first round raises the trim threshold to twice that top (8 MiB at
    // least), and the later rounds fault nothing in again. The library
    // that kept 4 MiB took about 1,000 faults a round here.
    for mode in ["cycle", "cycle_aligned"] {
        let (faults, json) = cycle(mode, true, &[]);
        assert!(faults < 256, "{mode}, preloaded: {faults} faults");
        let raised: u64 = json
            .split_once("\"glibc_trim_threshold\":")
            .and_then(|(_, v)| v.split(',').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{json}"));
        assert!(
            (8 << 20..=64 << 20).contains(&raised) && raised.is_multiple_of(1 << 20),
            "{mode}: {json}"
        );
    }
    // Growing again after an idle spell longer than the decay window is
    // not the same demand coming back: 300 ms between rounds raise
    // nothing under a 100 ms window, and raise the threshold under the
    // default 2 s.
    let (faults, json) = cycle("cycle_idle", true, &[("CKALLOC_RETAIN_DECAY_MS", "100")]);
    assert!(faults >= 4 * 512, "idle past the window: {faults} faults");
    assert_eq!(json, trim(4 << 20), "idle past the window");
    let (faults, json) = cycle("cycle_idle", true, &[]);
    assert!(faults < 256, "idle within the window: {faults} faults");
    assert_ne!(json, trim(4 << 20), "idle within the window");
    // The program's own malloc_trim is its request: the heap growing
    // again after it raises nothing.
    let (faults, json) = cycle("cycle_trim", true, &[]);
    assert!(faults >= 4 * 512, "malloc_trim: {faults} faults");
    assert_eq!(json, trim(4 << 20), "malloc_trim");
    // A one-off free of 20 MiB and 64 KiB of growth after it raise
    // nothing (twice 64 KiB is under 4 MiB); the program's `malloc_trim`
    // on another thread, during the watched calls, raises nothing either.
    for mode in ["oneoff", "trim_thread"] {
        let (_, json) = cycle(mode, true, &[]);
        assert_eq!(json, trim(4 << 20), "{mode}");
    }
    // A window of 0 turns the raise off.
    let (_, json) = cycle("cycle", true, &[("CKALLOC_RETAIN_DECAY_MS", "0")]);
    assert_eq!(json, trim(4 << 20), "a 0 ms window");
    // A fork during another thread's `malloc_trim` leaves the child
    // raising.
    let (faults, json) = cycle("fork_cycle", true, &[]);
    assert!(faults < 256, "fork_cycle: {faults} faults");
    assert_ne!(json, trim(4 << 20), "fork_cycle");
    // The parent's trim is not the child's: new memory the child writes
    // after a fork that follows a trim raises nothing.
    let (_, json) = cycle("fork_fresh", true, &[]);
    assert_eq!(json, trim(4 << 20), "fork_fresh");
    // A top pad from the environment ends glibc's dynamic threshold, and
    // the library's raising with it.
    let (_, json) = cycle("cycle", true, &[("MALLOC_TOP_PAD_", "131072")]);
    assert_eq!(json, trim(4 << 20), "MALLOC_TOP_PAD_");
}

#[test]
fn the_summary_says_what_glibc_was_set_to() {
    let prog = compile("preload_exit.c", "cc", &["-std=c11", "-pthread"]);
    let summary = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(&prog);
        // `all`: at a 1 GiB threshold the program serves no huge block.
        cmd.env("CKALLOC_SHOW_STATS", "all")
            .env_remove("CKALLOC_PRELOAD_THRESHOLD");
        for var in GLIBC_THRESHOLD_VARIABLES {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        let out = run(cmd, true);
        assert_success(&out, "preload_exit");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // glibc's range bounds the mmap threshold: 128 KiB to 32 MiB.
    let set = |mmap, trim| {
        format!(
            "glibc: mmap threshold {mmap}, trim threshold {trim} \
             (set at load, the trim threshold raised by freed huge blocks)\n"
        )
    };
    for (env, says) in [
        // The program frees a 5 MiB huge block: a trim threshold under
        // 10 MiB rises to 10 MiB.
        (None, set("2.00 MiB", "10.00 MiB")),
        (Some(("CKALLOC_PRELOAD_THRESHOLD", "4M")), set("4.00 MiB", "10.00 MiB")),
        (Some(("CKALLOC_PRELOAD_THRESHOLD", "4K")), set("128.00 KiB", "10.00 MiB")),
        (
            Some(("CKALLOC_PRELOAD_THRESHOLD", "1G")),
            "glibc: mmap threshold 32.00 MiB, trim threshold 64.00 MiB (set at load)\n".into(),
        ),
        (
            Some(("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")),
            "glibc: thresholds as the environment sets them (GLIBC_TUNABLES or MALLOC_*_THRESHOLD_)\n".into(),
        ),
    ] {
        let err = summary(env.as_slice());
        assert!(err.contains(&says), "{env:?}: {err}");
    }
}
