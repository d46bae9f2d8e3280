//! Security properties of the weights file handling (Linux):
//!
//! * The file is opened once and checked once through its descriptor
//!   (`fstat` on the fd, not the path): replacing the path afterwards changes
//!   neither what mixed mode mapped nor what anon mode materializes. (The
//!   `open` and `fstat` calls are counted in `tests/faults/security.rs`.)
//! * The documented `SIGBUS`: in mixed mode the weights pages come from the
//!   file, so when another process truncates it while it is mapped, the next
//!   touch of a dropped page raises `SIGBUS` (shown in a child process). Anon
//!   mode, the documented remedy, holds its own copy and is unaffected.
//!
//! * A FIFO or a device given as the weights file or a sidecar fails at
//!   once as "not a regular file" instead of blocking or reading forever.
//!
//! The read-only protections (`r--p`), the `SIGSEGV` on a write and the
//! unchanged bytes and mtime are in `tests/arena.rs`.
#![cfg(target_os = "linux")]

mod common;
use ckalloc::{ArenaMode, ModePolicy};
use common::{pattern, serial, weights_arena as arena};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const PAGE: usize = 4096;

/// Replace `path` with a file of the same size and other bytes (a new
/// inode, as an atomic `rename` deployment would).
fn swap_path(path: &Path, len: usize) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, pattern(len, 99)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
#[cfg_attr(miri, ignore = "needs file mappings")]
fn replacing_the_path_after_build_changes_nothing() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights.bump");
    let ab = 6 * PAGE + 100;
    let orig = pattern(ab, 1);

    // Mixed mode: the mapping is of the inode that was checked.
    std::fs::write(&path, &orig).unwrap();
    let a = arena(ModePolicy::MixedOnly, &path, ab);
    assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
    swap_path(&path, ab);
    assert_eq!(a.weights(), &orig[..]);
    drop(a);

    // Anon mode: materialization reads through the descriptor opened at
    // build time, not the path, so it copies the checked file.
    std::fs::write(&path, &orig).unwrap();
    let mut a = arena(ModePolicy::AnonOnly, &path, ab);
    swap_path(&path, ab);
    a.materialize_weights().unwrap();
    assert_eq!(a.weights(), &orig[..]);
    assert_ne!(std::fs::read(&path).unwrap(), orig, "the path did change");
}

/// Run `child` (an ignored test of this binary) with stdin/stdout piped:
/// wait for it to print "mapped", truncate the file, tell it to go on.
fn truncate_under_child(child: &str, path: &Path) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        child,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("SECURITY_CHILD_FILE", path)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    // Under AddressSanitizer let the signal kill the child as it would
    // without the sanitizer.
    let asan = std::env::var("ASAN_OPTIONS").unwrap_or_default();
    cmd.env("ASAN_OPTIONS", format!("{asan}:handle_sigbus=0"));
    let mut ch = cmd.spawn().unwrap();
    let mut out = BufReader::new(ch.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if line.contains("mapped (") {
            // Another process (this one) truncates the mapped file.
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(0)
                .unwrap();
            let mut stdin = ch.stdin.take().unwrap();
            stdin.write_all(b"go\n").unwrap();
            drop(stdin);
        }
    }
    let status = ch.wait().unwrap();
    (status, seen)
}

#[test]
#[cfg_attr(miri, ignore = "spawns a child process")]
fn truncating_a_mapped_weights_file_raises_sigbus_in_mixed_mode_only() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights.bump");
    let ab = 16 * PAGE + 7;

    std::fs::write(&path, pattern(ab, 3)).unwrap();
    let (status, out) = truncate_under_child("child_touch_after_truncate", &path);
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "mixed mode: {status:?}\n{out}"
    );
    assert!(out.contains("mapped") && !out.contains("survived"), "{out}");

    // The remedy: anon mode holds a private copy.
    std::fs::write(&path, pattern(ab, 3)).unwrap();
    let (status, out) = truncate_under_child("child_anon_after_truncate", &path);
    assert!(status.success(), "anon mode: {status:?}\n{out}");
    assert!(out.contains("survived"), "{out}");
}

fn child_wait_for_go() {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "go");
}

fn child_run(policy: ModePolicy) {
    let Ok(p) = std::env::var("SECURITY_CHILD_FILE") else {
        return;
    };
    let ab = 16 * PAGE + 7;
    let mut a = arena(policy, Path::new(&p), ab);
    a.materialize_weights().unwrap();
    let expect = pattern(ab, 3);
    assert_eq!(a.weights(), &expect[..], "before");
    println!("mapped ({:?})", a.mode());
    std::io::stdout().flush().unwrap();
    child_wait_for_go();
    // Mixed mode: the file pages were dropped by the truncation; reading
    // one raises SIGBUS here.
    let w = a.weights();
    let sum: u64 = (0..w.len())
        .step_by(PAGE)
        // SAFETY: in bounds; volatile so the read happens.
        .map(|i| u64::from(unsafe { std::ptr::read_volatile(&w[i]) }))
        .sum();
    assert_eq!(w, &expect[..], "after");
    println!("survived (sum {sum})");
}

#[test]
#[ignore = "run by truncating_a_mapped_weights_file_raises_sigbus_in_mixed_mode_only"]
fn child_touch_after_truncate() {
    child_run(ModePolicy::MixedOnly);
}

#[test]
#[ignore = "run by truncating_a_mapped_weights_file_raises_sigbus_in_mixed_mode_only"]
fn child_anon_after_truncate() {
    child_run(ModePolicy::AnonOnly);
}

// ---- files that are not regular files

/// Run `f` on a helper thread; `None` if it does not finish in 5 s (a hang).
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5)).ok()
}

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn fifo_in(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    mkfifo(&p);
    p
}

/// A FIFO given as the weights file fails with `NotRegularFile` instead of
/// blocking in open(2) until a writer appears.
#[test]
#[cfg_attr(miri, ignore)]
fn fifo_weights_file_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo_in(dir.path(), "weights.bump");
    let r = within_5s(move || {
        ckalloc::BumpArena::builder(1 << 20)
            .weights_file(&fifo)
            .activations_base(4096)
            .build()
            .err()
            .map(|e| e.to_string())
    });
    let msg = r
        .expect("build() hung on a FIFO")
        .expect("a FIFO must be rejected");
    assert!(msg.contains("not a regular file"), "{msg}");
}

/// `WeightsFile::open` rejects a FIFO the same way.
#[cfg(feature = "weights")]
#[test]
#[cfg_attr(miri, ignore)]
fn weights_reader_rejects_fifo_fast() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo_in(dir.path(), "weights.bump");
    let r = within_5s(move || {
        ckalloc::weights::WeightsFile::open(&fifo)
            .err()
            .map(|e| e.to_string())
    });
    let msg = r
        .expect("WeightsFile::open hung on a FIFO")
        .expect("must fail");
    assert!(msg.contains("not a regular file"), "{msg}");
}

/// Run `Manifest::load_sidecars` on `dir` (holding one special sidecar) and
/// require a prompt "not a regular file" error; `hang` says what a hang means.
#[cfg(feature = "weights")]
fn assert_sidecars_refused_fast(dir: &Path, hang: &str) {
    let d = dir.to_path_buf();
    let r = within_5s(move || {
        ckalloc::weights::Manifest::load_sidecars(&d)
            .err()
            .map(|e| e.to_string())
    });
    let msg = r.unwrap_or_else(|| panic!("{hang}")).expect("must fail");
    assert!(msg.contains("not a regular file"), "{msg}");
}

/// `Manifest::load_sidecars` rejects a sidecar that is a FIFO (which would
/// block) ...
#[cfg(feature = "weights")]
#[test]
#[cfg_attr(miri, ignore)]
fn sidecar_fifo_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    fifo_in(dir.path(), "weights_manifest.map");
    assert_sidecars_refused_fast(dir.path(), "load_sidecars hung on a FIFO sidecar");
}

/// ... or a symlink to `/dev/zero` (which would be read until memory runs
/// out).
#[cfg(feature = "weights")]
#[test]
#[cfg_attr(miri, ignore)]
fn sidecar_dev_zero_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("weights_manifest.json")).unwrap();
    assert_sidecars_refused_fast(dir.path(), "load_sidecars kept reading /dev/zero");
}
