//! The summary `CKALLOC_SHOW_STATS=1` prints at exit: one block of text on
//! stderr, labelled with the PID, formatted on the stack and written with
//! one `write(2)` (no allocation, as the allocator's own paths require).

use super::stats;
use crate::huge::huge_stats;
use crate::units::{ExactBytes, SliceWriter};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

/// Bytes of the summary's buffer (the summary is about 1 KiB).
const SUMMARY_MAX: usize = 4096;

/// Write the summary to `fd`: the preload counters, then
/// [`huge_stats`]'s lines, each prefixed with `ckalloc[PID]: `. A summary
/// longer than 4 KiB is cut. Never allocates; returns the bytes written
/// or the `write(2)` error.
pub fn write_summary(fd: i32) -> std::io::Result<usize> {
    let mut buf = [0u8; SUMMARY_MAX];
    let mut w = SliceWriter {
        buf: &mut buf,
        len: 0,
    };
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    let p = stats();
    let mut text = Prefixed {
        out: &mut w,
        pid,
        line_start: true,
    };
    // A cut summary is still written: errors only mean the buffer is full.
    let _ = write!(
        text,
        "preload: {} huge block{} served ({} requested), threshold {}, \
         retention cap {}{}, {} served by glibc because the engine had no \
         memory\n{}\n",
        p.blocks,
        crate::units::plural(p.blocks),
        crate::human_bytes(p.bytes),
        ExactBytes(p.threshold as u64),
        ExactBytes(p.retain_cap as u64),
        if crate::env::retain_bytes_set() {
            ""
        } else {
            " (twice the live peak, at least the default)"
        },
        p.glibc_fallbacks,
        huge_stats()
    );
    let len = w.len;
    let mut done = 0;
    while done < len {
        // SAFETY: `buf[done..len]` is initialised and readable.
        let n = unsafe { libc::write(fd, buf[done..len].as_ptr().cast(), len - done) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

/// A writer that starts every line with `ckalloc[PID]: `.
struct Prefixed<'a, 'b> {
    out: &'a mut SliceWriter<'b>,
    pid: i32,
    line_start: bool,
}

impl std::fmt::Write for Prefixed<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for piece in s.split_inclusive('\n') {
            if self.line_start {
                write!(self.out, "ckalloc[{}]: ", self.pid)?;
            }
            self.out.write_str(piece)?;
            self.line_start = piece.ends_with('\n');
        }
        Ok(())
    }
}

/// Which file descriptor 2 was when the library loaded (`st_dev`,
/// `st_ino`); `u64::MAX` in both: not recorded or not open.
static STDERR_FILE: [AtomicU64; 2] = [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)];

/// A copy of file descriptor 2 made at load (close-on-exec, numbered from
/// [`COPY_FD_MIN`]), for a program that closes standard error before the
/// summary is printed: GNU coreutils' `close_stdout`, an `atexit` handler,
/// closes it first. -1: none.
static STDERR_COPY: AtomicI32 = AtomicI32::new(-1);

/// The lowest number the copy of standard error takes: above the numbers
/// programs expect their own files to get, below the usual limit of 1024.
const COPY_FD_MIN: i32 = 512;

/// The (`st_dev`, `st_ino`) of `fd`, `None` when it is not open.
fn file_id(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: a plain out-struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Remember which file standard error is (the preload library calls this
/// when it loads), so that [`print_at_exit`] never writes into a file the
/// program opened later under the same number.
pub fn remember_stderr() {
    if let Some((dev, ino)) = file_id(libc::STDERR_FILENO) {
        STDERR_FILE[0].store(dev, Relaxed);
        STDERR_FILE[1].store(ino, Relaxed);
        // SAFETY: duplicates an open descriptor; no memory is passed.
        // -1 when it fails: no copy.
        let copy = unsafe { libc::fcntl(libc::STDERR_FILENO, libc::F_DUPFD_CLOEXEC, COPY_FD_MIN) };
        STDERR_COPY.store(copy, Relaxed);
    }
}

/// Write the summary to the file [`remember_stderr`] saw as standard
/// error: through descriptor 2 while it is still that file, else through
/// the copy made at load while that still is (a program that closed
/// standard error, or closed the copy and reused its number, gets none).
/// `SIGPIPE` is blocked during the write (and a `SIGPIPE` the write raised
/// discarded), so that a closed pipe neither kills the exiting process nor
/// changes its exit status. Never allocates.
pub fn print_at_exit() {
    let then = (STDERR_FILE[0].load(Relaxed), STDERR_FILE[1].load(Relaxed));
    if then == (u64::MAX, u64::MAX) {
        return;
    }
    let copy = STDERR_COPY.load(Relaxed);
    let fd = if file_id(libc::STDERR_FILENO) == Some(then) {
        libc::STDERR_FILENO
    } else if copy >= 0 && file_id(copy) == Some(then) {
        copy
    } else {
        return;
    };
    // SAFETY: signal sets on the stack, initialised by sigemptyset; the
    // calls only change this thread's mask and pending set.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old) != 0 {
            return;
        }
        libc::sigemptyset(&mut pending);
        libc::sigpending(&mut pending);
        let was_pending = libc::sigismember(&pending, libc::SIGPIPE) == 1;
        let _ = write_summary(fd);
        if !was_pending {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}
