//! The preload library, `libckalloc_preload.so`, under programs loaded with
//! `LD_PRELOAD`: the C conformance suite (`tests/c/preload_conformance.c`),
//! programs no part of ckalloc knows of (a C++ program growing a
//! `std::vector` to 1 GiB, `git`, `python3` with `numpy`), each checked for
//! the same output as without the library, the `CKALLOC_SHOW_STATS`
//! summary, `ckalloc run`, a C program at the process's limits (VMAs,
//! `vm.max_map_count`, locked memory, `RLIMIT_AS`), and the engine's C front
//! called from Rust.
//!
//! The library is built once per test binary with `cargo build -p
//! ckalloc-preload` into `target/preload` (the outer `cargo test` may hold
//! the lock on `target/`).

#![cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]

mod background;
#[path = "../common/mod.rs"]
mod common;
mod conformance;
mod engine;
mod limits;
mod programs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The library, built on first use.
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let target = root().join("target").join("preload");
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "ckalloc-preload", "--target-dir"])
            .arg(&target)
            .current_dir(root())
            .status()
            .expect("run cargo build -p ckalloc-preload");
        assert!(status.success(), "cargo build -p ckalloc-preload failed");
        let lib = target.join("debug").join("libckalloc_preload.so");
        assert!(lib.is_file(), "{} missing", lib.display());
        lib
    })
}

/// A scratch directory for compiled programs, kept for the process.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
}

/// Held while a program runs with the library preloaded ([`run`] takes it;
/// so do the tests that start such a program another way), so no two run at
/// once: the conformance suite forks while it holds hugetlb blocks, and a
/// fork child that writes an inherited hugetlb page needs a free huge page
/// for its copy, dying of `SIGBUS` when another program (the 1 GiB
/// `std::vector`, say) has drained a reserved pool (docs/reliability.md,
/// "Copy on write").
pub fn hugetlb_pool() -> std::sync::MutexGuard<'static, ()> {
    static POOL: Mutex<()> = Mutex::new(());
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Compile `tests/c/NAME` with `compiler` (`cc` or `c++`) into the scratch
/// directory, once per process (tests running at once share it); returns
/// the program.
pub fn compile(name: &str, compiler: &str, flags: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let out = scratch().join(name.replace('.', "_"));
    if built.iter().any(|b| b == name) {
        return out;
    }
    let st = Command::new(compiler)
        .args(["-Wall", "-Wextra", "-Werror", "-O2", "-g"])
        .args(flags)
        .arg(root().join("tests/c").join(name))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(st.success(), "{compiler} failed for {name}");
    built.push(name.to_string());
    out
}

/// Run `tests/c/NAME` (built with `cc`) with `args`, the library preloaded
/// or not, `CKALLOC_SHOW_STATS` and the variables of `remove` unset and
/// `env` set; asserts it succeeded and returns its stdout.
pub fn run_c(
    name: &str,
    args: &[&str],
    preload: bool,
    remove: &[&str],
    env: &[(&str, &str)],
) -> String {
    let mut cmd = Command::new(compile(name, "cc", &[]));
    cmd.args(args).env_remove("CKALLOC_SHOW_STATS");
    for var in remove {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = run(cmd, preload);
    assert_success(&out, &format!("{name} {args:?} (preload: {preload})"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The number after `label` on a line of `out`.
pub fn number<T: std::str::FromStr>(out: &str, label: &str) -> T {
    out.lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in {out}"))
}

/// Run `cmd` with the library preloaded (`preload`) or without; returns
/// its output. `LD_PRELOAD` from the outer environment is dropped.
pub fn run(mut cmd: Command, preload: bool) -> Output {
    cmd.env_remove("LD_PRELOAD");
    if !preload {
        return cmd.output().expect("run program");
    }
    cmd.env("LD_PRELOAD", library());
    let _pool = hugetlb_pool();
    cmd.output().expect("run program")
}

/// `out` succeeded; its stdout and stderr otherwise.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
