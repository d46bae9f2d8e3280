//! Programs no part of ckalloc knows of, run with and without the library:
//! the same output both ways, and huge blocks in use with it.

use super::{assert_success, compile, root, run, scratch};
use std::process::Command;

#[test]
fn a_cpp_vector_grows_to_1_gib_through_operator_new() {
    let prog = compile("preload_vector.cpp", "c++", &["-std=c++17"]);
    let plain = run(Command::new(&prog), false);
    assert_success(&plain, "vector without the library");
    let with = run(Command::new(&prog), true);
    assert_success(&with, "vector with the library");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&with.stdout)
    );
    assert!(String::from_utf8_lossy(&plain.stdout).starts_with("bytes 1073741824 "));
    let err = String::from_utf8_lossy(&with.stderr);
    assert!(err.contains("ckalloc block: yes"), "{err}");
}

fn git(args: &[&str], dir: &std::path::Path, preload: bool) -> std::process::Output {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PAGER", "cat");
    run(cmd, preload)
}

#[test]
fn git_log_and_gc_give_the_same_results() {
    let src = root();
    if !src.join(".git").exists() {
        println!("skipped: {} is not a git checkout", src.display());
        return;
    }
    let plain = git(&["log", "-p", "--no-color", "-n", "400"], &src, false);
    assert_success(&plain, "git log -p");
    let with = git(&["log", "-p", "--no-color", "-n", "400"], &src, true);
    assert_success(&with, "git log -p (preloaded)");
    assert!(plain.stdout.len() > 1000);
    assert!(
        plain.stdout == with.stdout,
        "git log -p differs under the library"
    );

    // `git gc` on a copy, then the object database checks out and the
    // history reads the same.
    let copy = scratch().join("repo");
    let cloned = Command::new("git")
        .args(["clone", "--quiet", "--no-local"])
        .arg(&src)
        .arg(&copy)
        .output()
        .expect("git clone");
    assert_success(&cloned, "git clone");
    let before = git(&["log", "--format=%H %T"], &copy, false);
    let gc = git(
        &["gc", "--quiet", "--aggressive", "--prune=now"],
        &copy,
        true,
    );
    assert_success(&gc, "git gc (preloaded)");
    let fsck = git(&["fsck", "--full", "--strict"], &copy, true);
    assert_success(&fsck, "git fsck (preloaded)");
    let after = git(&["log", "--format=%H %T"], &copy, false);
    assert_eq!(before.stdout, after.stdout);
}

/// `numpy` work on arrays from 1 MiB to 512 MiB: matrix products,
/// `concatenate`, `sort`; prints checksums.
const NUMPY_SCRIPT: &str = r#"
import hashlib, sys
import numpy as np
rng = np.random.default_rng(7)
h = hashlib.sha256()
for mib in (1, 8, 64, 512):
    n = mib * (1 << 20) // 8
    a = rng.standard_normal(n)
    s = np.sort(a)
    h.update(s[:: max(1, n // 4096)].tobytes())
    c = np.concatenate([a, s, a[:1000]])
    h.update(np.float64(c.sum()).tobytes())
    side = int((n // 4) ** 0.5)
    m = a[: side * side].reshape(side, side)
    p = m @ m.T
    h.update(np.round(p[:: max(1, side // 64), :: max(1, side // 64)], 6).tobytes())
print(h.hexdigest())
"#;

#[test]
fn python_numpy_gives_the_same_results() {
    let python = std::env::var("CKALLOC_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_numpy = Command::new(&python)
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_numpy {
        assert!(
            std::env::var_os("CKALLOC_REQUIRE_NUMPY").is_none(),
            "CKALLOC_REQUIRE_NUMPY is set but {python} cannot import numpy"
        );
        println!("skipped: {python} cannot import numpy (set CKALLOC_TEST_PYTHON)");
        return;
    }
    let script = |preload: bool| {
        let mut cmd = Command::new(&python);
        cmd.args(["-c", NUMPY_SCRIPT])
            .env("OMP_NUM_THREADS", "2")
            .env("CKALLOC_SHOW_STATS", "1");
        run(cmd, preload)
    };
    let plain = script(false);
    assert_success(&plain, "numpy without the library");
    let with = script(true);
    assert_success(&with, "numpy with the library");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&with.stdout)
    );
    let err = String::from_utf8_lossy(&with.stderr);
    let served = err
        .lines()
        .find_map(|l| l.split("preload: ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(served > 0, "no huge blocks served to numpy:\n{err}");
}

/// `p` relative to the current directory (`p` is absolute).
#[cfg(feature = "cli")]
fn pathdiff(p: &std::path::Path) -> std::path::PathBuf {
    let cwd = std::env::current_dir().expect("cwd");
    let up: std::path::PathBuf = cwd.components().skip(1).map(|_| "..").collect();
    up.join(p.strip_prefix("/").expect("absolute"))
}

#[cfg(feature = "cli")]
#[test]
fn ckalloc_run_preloads_the_library_and_returns_the_program_status() {
    let ckalloc = env!("CARGO_BIN_EXE_ckalloc");
    let lib = super::library();
    let run_sh = |script: &str, lib_var: &std::path::Path| {
        Command::new(ckalloc)
            .args(["run", "--", "sh", "-c", script])
            .env("CKALLOC_PRELOAD_LIB", lib_var)
            .env("LD_PRELOAD", "")
            .output()
            .expect("run ckalloc")
    };
    let out = run_sh("echo \"$LD_PRELOAD\"; exit 7", lib);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        lib.display().to_string()
    );
    // A program killed by a signal: the status says so, as without `run`.
    let out = run_sh("kill -TERM $$", lib);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(15), "{out:?}");
    // SIGPIPE at its default action (the Rust runtime of `ckalloc` ignores
    // it, and a shell cannot undo an ignore it inherits).
    let out = run_sh("kill -PIPE $$; exit 3", lib);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{out:?}");
    // No library: exit 1, one error line, the program not run.
    let out = run_sh("echo ran", std::path::Path::new("/nonexistent/lib.so"));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CKALLOC_PRELOAD_LIB"), "{err}");
    // `ckalloc run -- [WRAPPER...] sh` with no LD_PRELOAD before: the
    // LD_PRELOAD the shell got.
    let preload_seen = |wrapper: &[&str], lib_var: &std::path::Path| {
        let out = Command::new(ckalloc)
            .args(["run", "--"])
            .args(wrapper)
            .args(["sh", "-c", "echo \"$LD_PRELOAD\""])
            .env("CKALLOC_PRELOAD_LIB", lib_var)
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run ckalloc");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let canonical = std::fs::canonicalize(lib).unwrap().display().to_string();
    // The library as a relative path goes in as an absolute one.
    assert_eq!(preload_seen(&[], &pathdiff(lib)), canonical);
    // Not a shared library, or another allocator already preloaded: exit
    // 1, the program not run.
    let out = run_sh("echo ran", std::path::Path::new("/etc/hostname"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ELF"));
    // An executable, and a shared library that is not this one (ld.so would
    // skip the first with a warning and preload the second silently).
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let libc_so = std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    // A FIFO is never opened (it would block); a library that only imports
    // the symbol is not this one; a `$` in the path is expanded by ld.so.
    let libdir = tempfile::tempdir().unwrap();
    let fifo = libdir.path().join("fifo.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let importer = libdir.path().join("libimports.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-x", "c", "-", "-o"])
        .arg(&importer)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(
                b"extern const char *ckalloc_stats_json(void);\n\
                  const char *f(void) { return ckalloc_stats_json(); }\n",
            )?;
            child.wait()
        })
        .is_ok_and(|s| s.success());
    assert!(built, "cc -shared");
    let dollar = libdir.path().join("x$LIB");
    std::fs::create_dir(&dollar).unwrap();
    std::fs::copy(lib, dollar.join("libckalloc_preload.so")).unwrap();
    let dollar = dollar.join("libckalloc_preload.so");
    for (file, says) in [
        (fifo.as_path(), "not a regular file"),
        (
            importer.as_path(),
            "it defines no symbol ckalloc_stats_json",
        ),
        (dollar.as_path(), "or a $, which ld.so expands"),
        (sh.as_path(), "not a shared library"),
        (
            libc_so,
            "not libckalloc_preload.so (it defines no symbol ckalloc_stats_json)",
        ),
    ] {
        if !file.exists() {
            continue;
        }
        let out = run_sh("echo ran", file);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(out.stdout.is_empty());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{out:?}"
        );
    }
    let out = Command::new(ckalloc)
        .args(["run", "--", "sh", "-c", "echo ran"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .env("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds an allocator"));
    // Also when the library comes first and another allocator after it.
    let out = Command::new(ckalloc)
        .args(["run", "--", "sh", "-c", "echo ran"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .env(
            "LD_PRELOAD",
            format!(
                "{} /usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                lib.display()
            ),
        )
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("libjemalloc.so.2"));
    // `--json` does not apply: a usage error, the program not run.
    let out = Command::new(ckalloc)
        .args(["--json", "run", "--", "sh", "-c", "echo ran"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
    // Without `--`: the first argument that is not an option of `run` is
    // the program, and every argument after it (`--json` and `--`
    // included) is the program's; an unknown option before it is a usage
    // error, not a program to look for.
    let out = Command::new(ckalloc)
        .args(["run", "sh", "-c", "echo \"$*\"", "sh", "--json", "--", "-x"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "--json -- -x\n");
    let out = Command::new(ckalloc)
        .args(["run", "--jsn", "sh", "-c", "echo ran"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--jsn' found"),
        "{out:?}"
    );
    // The same library preloaded already (`run` inside `run`): kept as it
    // is, once.
    assert_eq!(preload_seen(&[ckalloc, "run", "--"], lib), canonical);
    // A directory is named as one.
    let out = run_sh("echo ran", super::scratch());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
    // A program that does not exist: 127.
    let out = Command::new(ckalloc)
        .args(["run", "--", "/nonexistent/program"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    // Files that cannot run: 126 and a message naming why; a file with the
    // ELF magic is never handed to the shell as commands, a file of
    // commands without `#!` is (as `execvp` does).
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let file = |name: &str, text: &[u8]| {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let commands = format!("touch {}\n", marker.display());
    let cases = [
        (
            file("fake-elf", format!("\x7fELF\n{commands}").as_bytes()),
            126,
            "exec format error",
        ),
        (
            file("no-interp", b"#!/nonexistent/interp\ntrue\n"),
            127,
            "its interpreter /nonexistent/interp (the #! line) does not exist",
        ),
        (
            file("crlf", b"#!/bin/sh\r\ntrue\r\n"),
            127,
            "its interpreter /bin/sh\\r (the #! line) does not exist: the line ends in a \
             carriage return",
        ),
        (
            file(
                "foreign-interp",
                format!("#!{}\n{commands}", dir.path().join("fake-elf").display()).as_bytes(),
            ),
            126,
            "exec format error: its interpreter",
        ),
        (
            file(
                "dir-interp",
                format!("#!{}\n", dir.path().display()).as_bytes(),
            ),
            126,
            "(the #! line) is a directory",
        ),
        (
            std::path::PathBuf::from("/bin/sh/x"),
            126,
            "not a directory",
        ),
        (
            file("nul-in-interp", b"#!/nonexistent/x\0junk\n"),
            127,
            "its interpreter /nonexistent/x (the #! line) does not exist",
        ),
        (
            file("long-line", format!("#!/{}\n", "y".repeat(300)).as_bytes()),
            126,
            "its #! line is longer than the 255 bytes Linux reads",
        ),
        (
            file("binary", b"MZ\x90\0\x03\0\0\0\ntouch ran\n"),
            126,
            "exec format error (a binary file",
        ),
        (
            file("interp-through-file", b"#!/etc/hostname/x\n"),
            126,
            "its interpreter /etc/hostname/x (the #! line) cannot be reached",
        ),
        (
            file(
                "nested",
                format!("#!{}\n", dir.path().join("no-interp").display()).as_bytes(),
            ),
            127,
            "cannot run: its interpreter /nonexistent/interp (the #! line) does not exist",
        ),
        (dir.path().to_path_buf(), 126, "is a directory"),
        (
            std::path::PathBuf::new(),
            127,
            "cannot run \"\": an empty program name",
        ),
    ];
    for (program, code, says) in cases {
        let out = Command::new(ckalloc)
            .args(["run", "--"])
            .arg(&program)
            .env("CKALLOC_PRELOAD_LIB", lib)
            .output()
            .expect("run ckalloc");
        assert_eq!(out.status.code(), Some(code), "{program:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{out:?}"
        );
        assert!(!marker.exists(), "{program:?} ran as shell commands");
    }
    let out = Command::new(ckalloc)
        .args(["run", "--"])
        .arg(file("commands", commands.as_bytes()))
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(marker.exists(), "a file of commands runs under /bin/sh");
    // A bare `#!` names no interpreter: the shell runs it, as under `env`.
    let out = Command::new(ckalloc)
        .args(["run", "--"])
        .arg(file("bare-shebang", b"#!\necho bare\n"))
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "bare\n");
    // A script this process may not execute is refused for itself, not for
    // its missing interpreter.
    let no_x = file("no-exec-bit", b"#!/nonexistent/interp\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&no_x, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(ckalloc)
        .args(["run", "--"])
        .arg(&no_x)
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("permission denied"));
    let out = Command::new(ckalloc)
        .args(["run", "--", "no-such-program-anywhere"])
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found in PATH"));
    // No program: a usage error.
    let out = Command::new(ckalloc)
        .arg("run")
        .env("CKALLOC_PRELOAD_LIB", lib)
        .output()
        .expect("run ckalloc");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[cfg(feature = "cli")]
#[test]
fn ckalloc_run_warns_of_settings_not_taken_and_programs_out_of_reach_and_runs_them() {
    let ckalloc = env!("CARGO_BIN_EXE_ckalloc");
    let run = |program: &std::path::Path, env: &[(&str, &str)]| {
        let mut cmd = Command::new(ckalloc);
        cmd.arg("run")
            .arg("--")
            .arg(program)
            .env("CKALLOC_PRELOAD_LIB", super::library())
            .env_remove("LD_PRELOAD");
        for (k, _) in std::env::vars()
            .filter(|(k, _)| k.starts_with("CKALLOC_") && k != "CKALLOC_PRELOAD_LIB")
        {
            cmd.env_remove(k);
        }
        let out = cmd.envs(env.iter().copied()).output().expect("run ckalloc");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("t.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let build = |out: &str, flags: &[&str]| {
        let p = dir.path().join(out);
        let st = Command::new("cc")
            .args(flags)
            .arg(&src)
            .arg("-o")
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success());
        p
    };
    let dynamic = build("dynamic", &[]);
    assert_eq!(run(&dynamic, &[]), "", "a dynamic program: no warning");
    let err = run(
        &dynamic,
        &[
            ("CKALLOC_THP", "nope"),
            ("CKALLOC_PRELOAD_THRESHOLD", "1e99"),
            ("CKALLOC_STATS_FILE", "/tmp/x-%d"),
            ("CKALLOC_RETAIN_BYTE", "1"),
            ("CKALLOC_FETCH_TRIES", "3"),
            ("CKALLOC_BACKGROUND_THREAD", "nope"),
        ],
    );
    // A variable of the repository's scripts is no typo: 5 lines, not 6.
    assert_eq!(err.lines().count(), 5, "{err}");
    assert!(
        err.contains("taken as unset (on under the preload library, off for CkHuge)"),
        "{err}"
    );
    assert!(
        err.lines().all(|l| l.starts_with("ckalloc run: warning: ")),
        "{err}"
    );
    assert!(
        err.contains(
            "CKALLOC_THP=\"nope\": CKALLOC_THP does not parse: taken as unset (default on)"
        ),
        "{err}"
    );
    assert!(
        err.contains("CKALLOC_PRELOAD_THRESHOLD=\"1e99\": not a unit after the digits;"),
        "{err}"
    );
    // Why a size does not parse, and a threshold that parses but maps
    // 2 MiB for every small request.
    let says = |value: &str, text: &str| {
        let err = run(&dynamic, &[("CKALLOC_PRELOAD_THRESHOLD", value)]);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(text), "{value}: {err}");
    };
    says("00m", "a leading zero");
    says("99999999999999999999", "too large (over 2^64 - 1 bytes)");
    // Why a number of milliseconds does not parse.
    for (value, text) in [
        ("-1", "a sign before the digits"),
        ("250ms", "not a digit after the digits"),
        ("", "empty;"),
    ] {
        let err = run(&dynamic, &[("CKALLOC_RETAIN_DECAY_MS", value)]);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("CKALLOC_RETAIN_DECAY_MS={value:?}: {text}")),
            "{value}: {err}"
        );
    }
    says(
        "0",
        "CKALLOC_PRELOAD_THRESHOLD is 0, taken as 1 byte, below 2 MiB",
    );
    says("64k", "CKALLOC_PRELOAD_THRESHOLD is 64.00 KiB, below 2 MiB");
    assert_eq!(
        run(&dynamic, &[("CKALLOC_PRELOAD_THRESHOLD", "2m")]),
        "",
        "the default written out"
    );
    assert!(
        err.contains("CKALLOC_STATS_FILE=\"/tmp/x-%d\": not taken"),
        "{err}"
    );
    assert!(
        err.contains(
            "\"CKALLOC_RETAIN_BYTE\" is not a ckalloc setting and has no effect; did you mean CKALLOC_RETAIN_BYTES?"
        ),
        "{err}"
    );
    // A script whose interpreter is dynamic: no warning; a static program
    // and a set-group-ID one: one line each, and they still run.
    let script = dir.path().join("script");
    std::fs::write(&script, "#!/usr/bin/env sh\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(run(&script, &[]), "");
    if Command::new("cc")
        .args(["-static", "-x", "c", "-", "-o"])
        .arg(dir.path().join("probe"))
        .stdin(std::fs::File::open(&src).unwrap())
        .status()
        .is_ok_and(|s| s.success())
    {
        let err = run(&dir.path().join("probe"), &[]);
        assert!(err.contains("is statically linked (no PT_INTERP)"), "{err}");
    } else {
        eprintln!("skipped the static case: cc -static failed (no static libc)");
    }
    // Set-group-ID to the caller's own group: no secure-execution mode, no
    // warning; to another group: a warning.
    let sgid = build("sgid", &[]);
    std::fs::set_permissions(&sgid, std::fs::Permissions::from_mode(0o2755)).unwrap();
    assert_eq!(run(&sgid, &[]), "", "set-group-ID to the caller's group");
    if std::os::unix::fs::chown(&sgid, None, Some(65534)).is_ok() {
        std::fs::set_permissions(&sgid, std::fs::Permissions::from_mode(0o2755)).unwrap();
        let err = run(&sgid, &[]);
        assert!(
            err.contains("is set-user-ID or set-group-ID to another user or group"),
            "{err}"
        );
    } else {
        eprintln!("skipped the set-group-ID case: cannot give a file to group 65534 (not root)");
    }
}

/// A set-user-ID program that the user running `ckalloc run` may execute
/// but not read (mode 4711, owned by root) is warned of from its mode bits;
/// one without the bit, or run under `no_new_privs` (where the kernel
/// ignores it), is not. Runs as root, which runs `ckalloc` as user 65534
/// with `setpriv`.
#[cfg(feature = "cli")]
#[test]
fn ckalloc_run_warns_of_a_set_user_id_program_it_cannot_read() {
    use std::os::unix::fs::PermissionsExt;
    let ckalloc = env!("CARGO_BIN_EXE_ckalloc");
    let lib = super::library();
    let as_nobody = || {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        cmd
    };
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let reachable = root
        && as_nobody()
            .args(["sh", "-c", "test -r \"$1\" && test -x \"$2\"", "sh"])
            .arg(lib)
            .arg(ckalloc)
            .status()
            .is_ok_and(|s| s.success());
    if !reachable {
        println!(
            "skipped: needs root, setpriv, and the library and ckalloc readable by user 65534"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path().join("t.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let prog = dir.path().join("setuid");
    let built = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&prog)
        .status()
        .unwrap();
    assert!(built.success());
    let run = |mode: u32, options: &[&str]| {
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut cmd = as_nobody();
        cmd.args(options)
            .args([ckalloc, "run", "--"])
            .arg(&prog)
            .env("CKALLOC_PRELOAD_LIB", lib)
            .env_remove("LD_PRELOAD");
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CKALLOC_")) {
            cmd.env_remove(k);
        }
        let out = cmd
            .env("CKALLOC_PRELOAD_LIB", lib)
            .output()
            .expect("run ckalloc");
        assert_eq!(out.status.code(), Some(0), "{mode:o}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(0o4711, &[]);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "is set-user-ID or set-group-ID to another user or group: ld.so runs it in \
             secure-execution mode"
        ),
        "{err}"
    );
    assert!(run(0o2711, &[]).contains("is set-user-ID or set-group-ID"));
    assert_eq!(run(0o0711, &[]), "", "not set-user-ID");
    assert_eq!(run(0o4711, &["--no-new-privs"]), "", "no_new_privs");
}
