//! `ckalloc pack` interrupted while writing (Linux): `SIGINT`, `SIGTERM` and
//! `SIGHUP` leave no temporary file in the output directory and the previous
//! output as it was. The files are unnamed (`O_TMPFILE`) until complete, so
//! no handler is needed; `SIGKILL` leaves nothing either.

use crate::common::dir_contents;
use crate::support::{ok, s, synth};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A safetensors model of one 64 MiB F32 tensor, stored sparse (zeros):
/// packing it takes a moment (hashing and writing 64 MiB).
fn big_model(dir: &Path) -> String {
    const N: u64 = 64 << 20;
    let header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{N}]}}}}"#,
        N / 4
    );
    let p = dir.join("big.safetensors");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(bytes.len() as u64 + N).unwrap();
    s(&p).to_string()
}

/// Whether process `pid` has a file open in `dir` (an unnamed `O_TMPFILE`
/// file shows as `DIR/#INODE (deleted)` in `/proc/PID/fd`).
fn writing_in(pid: u32, dir: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|target| target.starts_with(dir))
}

/// Pack the synthetic model into `out`, then start packing the big model
/// into the same directory, send `signal` once it writes there, and check
/// the signal ended it with `out` exactly as before.
fn interrupted_pack_leaves_old_output(signal: libc::c_int) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let small = synth(&dir.path().join("small"));
    ok(&["pack", &small, "-o", s(&out)]);
    let before = dir_contents(&out);
    assert_eq!(before.len(), 3, "{:?}", before.keys());
    let big = big_model(dir.path());

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ckalloc"));
    cmd.args(["pack", &big, "-o", s(&out), "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // The signal's default action: a test run under `nohup` (SIGHUP
    // ignored) or as a background job of a shell without job control
    // (SIGINT ignored) passes the ignored disposition on through `exec`.
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(signal, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let start = Instant::now();
    while !writing_in(pid, &out) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "pack finished before it was seen writing"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "pack never wrote"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: `pid` is our child, not yet reaped, so the number is still its.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(signal),
        "pack was not ended by signal {signal}: {status:?}"
    );
    let after = dir_contents(&out);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "stray files"
    );
    assert!(after == before, "the previous output changed");
}

#[test]
fn sigint_while_packing_leaves_no_temporary_file_and_the_old_output() {
    interrupted_pack_leaves_old_output(libc::SIGINT);
}

#[test]
fn sigterm_while_packing_leaves_no_temporary_file_and_the_old_output() {
    interrupted_pack_leaves_old_output(libc::SIGTERM);
}

#[test]
fn sighup_while_packing_leaves_no_temporary_file_and_the_old_output() {
    interrupted_pack_leaves_old_output(libc::SIGHUP);
}

#[test]
fn sigkill_while_packing_leaves_no_temporary_file_and_the_old_output() {
    interrupted_pack_leaves_old_output(libc::SIGKILL);
}

/// A complete pack replaces the previous output in place: the same three
/// names, new contents, nothing else.
#[test]
fn pack_over_previous_output_replaces_it_without_extra_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let small = synth(&dir.path().join("small"));
    ok(&["pack", &small, "-o", s(&out), "--version", "5"]);
    let before = dir_contents(&out);
    ok(&["pack", &small, "-o", s(&out), "--version", "4"]);
    let after = dir_contents(&out);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert_ne!(after["weights.bump"], before["weights.bump"]);
    assert_eq!(&after["weights.bump"][..8], b"BUMPWGT4");
}
