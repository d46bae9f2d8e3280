//! The C ABI, from C: builds `libckalloc.{a,so}` with `scripts/build-capi`,
//! compiles the programs in `tests/c/` with the system `cc` against
//! `include/ckernel_alloc.h`, links each against the static and the shared
//! library, runs them, and runs them (all but the fork storm) under
//! `valgrind --error-exitcode=1` when valgrind is installed.

use ckalloc::weights::{Dtype, Version, WeightsWriter};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Build the libraries once, into their own target directory (the outer
/// `cargo test` may hold the lock on `target/`).
fn build_libs() -> PathBuf {
    let target = root().join("target").join("capi");
    let status = Command::new(root().join("scripts/build-capi"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run scripts/build-capi");
    assert!(status.success(), "scripts/build-capi failed");
    target.join("release")
}

fn compile(src: &str, lib_dir: &Path, out: &Path, shared: bool) {
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("tests/c").join(src))
        .arg("-o")
        .arg(out);
    if shared {
        cmd.arg(format!("-L{}", lib_dir.display()))
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .arg("-lckalloc");
    } else {
        cmd.arg(lib_dir.join("libckalloc.a"));
    }
    cmd.args(["-lpthread", "-ldl", "-lm"]);
    let st = cmd.status().expect("run cc");
    assert!(st.success(), "cc failed for {src} (shared={shared})");
}

fn run(program: &Path, args: &[String], valgrind: bool) {
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        // Definite leaks fail the run; "possibly lost" blocks are the Rust
        // runtime's per-thread records for the materialize worker threads.
        c.args([
            "-q",
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd.args(args).output().expect("run test program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed (valgrind={valgrind}):\n{stdout}\n{stderr}",
        program.display()
    );
    assert!(stdout.contains(": ok"), "no success line: {stdout}");
}

fn have_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn c_programs_pass_against_static_and_shared_library() {
    let lib_dir = build_libs();
    let dir = tempfile::tempdir().unwrap();

    // A weights.bump with unaligned tensor sizes; activations_base is the end
    // of tensor data (not page aligned), which exercises the partial page.
    let t1: Vec<u8> = (0..100_000u32)
        .flat_map(|i| (i * 7).to_le_bytes())
        .collect();
    let t2: Vec<u8> = (0..12_345u32).map(|i| (i % 251) as u8).collect();
    let mut w = WeightsWriter::new(Version::V5);
    w.add_tensor("a.weight", Dtype::F32, &t1[..]).unwrap();
    w.add_tensor("b.bytes", Dtype::U8, &t2[..]).unwrap();
    let report = w.write_dir(dir.path()).unwrap();
    let args = vec![
        report.weights_path.display().to_string(),
        report.weights_base.to_string(),
        report.data_end.to_string(),
    ];

    let valgrind = have_valgrind();
    if !valgrind {
        eprintln!("SKIP valgrind runs: valgrind is not installed");
    }
    for shared in [false, true] {
        for (src, args) in [("test_huge.c", &vec![]), ("test_bump.c", &args)] {
            let exe = dir
                .path()
                .join(format!("{src}.{}", if shared { "so" } else { "a" }));
            compile(src, &lib_dir, &exe, shared);
            run(&exe, args, false);
            if valgrind && !shared {
                run(&exe, args, true);
            }
        }
    }
}

/// A C program with two threads looping `ck_huge_alloc(4 MiB)` /
/// `ck_huge_free` while the main thread forks 500 times; each child calls
/// `ck_huge_alloc` + `ck_huge_free` under a 5 s alarm and must exit cleanly
/// (docs/reliability.md, "Fork safety"). Not run under valgrind (500 forks
/// of an instrumented process take minutes).
#[test]
fn c_program_forking_while_threads_allocate_completes_every_child() {
    let lib_dir = build_libs();
    let dir = tempfile::tempdir().unwrap();
    for shared in [false, true] {
        let exe = dir
            .path()
            .join(format!("test_fork.{}", if shared { "so" } else { "a" }));
        compile("test_fork.c", &lib_dir, &exe, shared);
        run(&exe, &["500".to_owned()], false);
    }
}
