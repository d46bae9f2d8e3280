//! Regression tests from the review (findings in fixable areas: sys, huge, weights).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

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

// Finding 1: a FIFO given as the weights file blocked `build()` forever in
// open(2) (no writer) instead of failing with NotRegularFile.
#[test]
#[cfg_attr(miri, ignore)]
fn review_arena_fifo_weights_file_fails_fast() {
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

// Finding 1 (weights reader): WeightsFile::open on a FIFO hung the same way.
#[test]
#[cfg(feature = "weights")]
#[cfg_attr(miri, ignore)]
fn review_weights_file_open_fifo_fails_fast() {
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

// Finding 2: Manifest::load_sidecars read a sidecar that is a FIFO (hang) or a
// symlink to /dev/zero (reads until memory runs out) instead of rejecting it.
#[test]
#[cfg(feature = "weights")]
#[cfg_attr(miri, ignore)]
fn review_sidecar_fifo_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    fifo_in(dir.path(), "weights_manifest.map");
    let d = dir.path().to_path_buf();
    let r = within_5s(move || {
        ckalloc::weights::Manifest::load_sidecars(&d)
            .err()
            .map(|e| e.to_string())
    });
    let msg = r
        .expect("load_sidecars hung on a FIFO sidecar")
        .expect("must fail");
    assert!(msg.contains("not a regular file"), "{msg}");
}

#[test]
#[cfg(feature = "weights")]
#[cfg_attr(miri, ignore)]
fn review_sidecar_dev_zero_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("weights_manifest.json")).unwrap();
    let d = dir.path().to_path_buf();
    let r = within_5s(move || {
        ckalloc::weights::Manifest::load_sidecars(&d)
            .err()
            .map(|e| e.to_string())
    });
    let msg = r
        .expect("load_sidecars kept reading /dev/zero")
        .expect("must fail");
    assert!(msg.contains("not a regular file"), "{msg}");
}
