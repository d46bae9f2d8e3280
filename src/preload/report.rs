//! The summary `CKALLOC_SHOW_STATS` prints at exit: one block of text on
//! stderr or appended to the `CKALLOC_STATS_FILE` file, labelled with the
//! PID, formatted on the stack and written with one `write(2)` (no
//! allocation, as the allocator's own paths require).

use super::glibc::flush_stdio_if_unlocked;
use super::{binding, stats, Binding};
use crate::env::{stats_file_template, ShowStats, PATH_MAX};
use crate::huge::huge_stats;
use crate::units::{ExactBytes, SliceWriter};
use std::cell::UnsafeCell;
use std::fmt::Write as _;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// The summary's line for a process whose allocator calls do not go
/// first to this library ([`Binding::serves`] is `Some(false)`); nothing
/// while they do or it is not known.
struct NotServing(Binding);

impl std::fmt::Display for NotServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Binding::OpenedAfterLibc => f.write_str(
                "preload: this library serves nothing: it was opened after libc \
                 (dlopen), so it is not the process's allocator\n",
            ),
            Binding::Ahead(a) => {
                write!(
                    f,
                    "preload: the program's `{}` goes first to ",
                    Text(a.function.to_bytes())
                )?;
                if a.program {
                    f.write_str("the program itself (")?;
                }
                if a.cut {
                    f.write_char('\u{2026}')?;
                }
                write!(f, "{}", Text(a.object))?;
                f.write_str(if a.program {
                    "), which defines it"
                } else {
                    ", loaded ahead of this library"
                })?;
                f.write_str(": that object serves it, and this library only what it passes on\n")
            }
            _ => Ok(()),
        }
    }
}

/// Bytes as one line of text: each sequence that is not UTF-8 as U+FFFD,
/// each control character (C0, DEL and C1) as `\xNN`, so a path cannot break the
/// summary's lines or reach a terminal as a control sequence. Never
/// allocates.
struct Text<'a>(&'a [u8]);

impl std::fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() {
                    write!(f, "\\x{:02x}", u32::from(c))?;
                } else {
                    f.write_char(c)?;
                }
            }
            if !chunk.invalid().is_empty() {
                f.write_char(char::REPLACEMENT_CHARACTER)?;
            }
        }
        Ok(())
    }
}

/// Set in a child of `fork`: the line above, inherited, is its parent's
/// to print.
static FORK_CHILD: AtomicBool = AtomicBool::new(false);

/// Called in a child of `fork`.
pub(super) fn after_fork_in_child() {
    FORK_CHILD.store(true, Relaxed);
}

/// Bytes of the summary's buffer (the summary is about 1 KiB).
const SUMMARY_MAX: usize = 4096;

/// Write the summary to `fd`: the preload counters, then
/// [`huge_stats`]'s lines, each prefixed with `ckalloc[PID]: `. A summary
/// longer than 4 KiB is cut. Never allocates; returns the bytes written
/// or the `write(2)` error.
pub fn write_summary(fd: i32) -> std::io::Result<usize> {
    write_report(fd, false)
}

/// [`write_summary`], or (`binding_only`) only its line for a process
/// whose allocator calls do not go first to this library.
fn write_report(fd: i32, binding_only: bool) -> std::io::Result<usize> {
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
    let _ = if binding_only {
        write!(text, "{}", NotServing(binding()))
    } else {
        write!(
            text,
            "preload: {} huge block{} served ({} requested), threshold {}, \
         retention cap {}{}, {} served by glibc because the engine had no \
         memory\n{}glibc: {}\n{}\n",
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
            NotServing(binding()),
            p.glibc_thresholds,
            huge_stats()
        )
    };
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
/// [`COPY_FD_MIN`], or from half the descriptor limit when that is lower),
/// for a program that closes standard error before the summary is printed:
/// GNU coreutils' `close_stdout`, an `atexit` handler, closes it first.
/// -1: none.
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

/// The lowest number for the copy of standard error: [`COPY_FD_MIN`], or
/// half the soft `RLIMIT_NOFILE` when that is lower (a shell's `ulimit -n
/// 256`), at least 3.
fn copy_fd_min() -> i32 {
    // SAFETY: a plain out-struct.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return COPY_FD_MIN;
    }
    let half = i32::try_from(lim.rlim_cur / 2).unwrap_or(i32::MAX);
    half.clamp(3, COPY_FD_MIN)
}

/// The summary's file when `CKALLOC_STATS_FILE` is set: its template made
/// absolute at load (a `%` of the working directory's name doubled), so
/// that a program that changes directory still writes where the variable
/// said. Written once, by the library's constructor, before `len` is
/// published.
struct Template {
    bytes: UnsafeCell<[u8; PATH_MAX]>,
    /// 0: no template (standard error); [`REFUSED`]: a template that was
    /// not taken (no summary); else its length.
    len: AtomicUsize,
}

/// [`Template::len`] of a template that was not taken.
const REFUSED: usize = usize::MAX;

// SAFETY: `bytes` is written only by `remember_output`, which the
// library's constructor calls once before any reader can see a non-zero
// `len` (Release/Acquire), and only read after that.
unsafe impl Sync for Template {}

static TEMPLATE: Template = Template {
    bytes: UnsafeCell::new([0; PATH_MAX]),
    len: AtomicUsize::new(0),
};

/// The [`ShowStats`] read at load, as its discriminant.
static MODE: AtomicU8 = AtomicU8::new(ShowStats::Off as u8);

/// Note which processes get a summary and where it goes, when the library loads (a program may
/// clear its environment, change directory or reuse file descriptor 2
/// before it exits): the file `CKALLOC_STATS_FILE` names, made absolute,
/// or else which file standard error is, so that [`print_at_exit`] never
/// writes into a file the program opened later under the same number.
/// Call once, from the library's constructor. Never allocates.
pub fn remember_output() {
    let mode = crate::env::show_stats();
    MODE.store(mode as u8, Relaxed);
    if mode == ShowStats::Off {
        return;
    }
    if let Some(template) = crate::env::stats_file() {
        // SAFETY: the only writer, before `len` is published (`Template`).
        let buf = unsafe { &mut *TEMPLATE.bytes.get() };
        let len = absolute_template(template, buf).unwrap_or(REFUSED);
        TEMPLATE.len.store(len, Release);
        return;
    }
    if let Some((dev, ino)) = file_id(libc::STDERR_FILENO) {
        STDERR_FILE[0].store(dev, Relaxed);
        STDERR_FILE[1].store(ino, Relaxed);
        // SAFETY: duplicates an open descriptor; no memory is passed.
        // -1 when it fails: no copy.
        let copy =
            unsafe { libc::fcntl(libc::STDERR_FILENO, libc::F_DUPFD_CLOEXEC, copy_fd_min()) };
        STDERR_COPY.store(copy, Relaxed);
    }
}

/// `template` made absolute into `out`: as it is when it starts with `/`,
/// else after the working directory (each `%` in it doubled) and a `/`.
/// `None` when it does not fit, the working directory cannot be read, or
/// the template is not taken ([`stats_file_template`]).
fn absolute_template(template: &[u8], out: &mut [u8; PATH_MAX]) -> Option<usize> {
    let mut len = 0;
    if template.first() != Some(&b'/') {
        let mut cwd = [0u8; PATH_MAX];
        // SAFETY: `cwd` has room for `PATH_MAX` bytes.
        if unsafe { libc::getcwd(cwd.as_mut_ptr().cast(), PATH_MAX) }.is_null() {
            return None;
        }
        let cwd_len = cwd.iter().position(|&b| b == 0)?;
        for &b in cwd[..cwd_len].iter().chain(b"/") {
            let doubled: &[u8] = if b == b'%' {
                b"%%"
            } else {
                std::slice::from_ref(&b)
            };
            for &c in doubled {
                *out.get_mut(len)? = c;
                len += 1;
            }
        }
    }
    let end = len.checked_add(template.len())?;
    out.get_mut(len..end)?.copy_from_slice(template);
    // Taken only when it expands for the largest process ID.
    stats_file_template(&out[..end], u32::MAX, &mut [0; PATH_MAX]).ok()?;
    Some(end)
}

/// Write the summary at exit, if `CKALLOC_SHOW_STATS` (as read by
/// [`remember_output`]) asks for this process ([`ShowStats`]: by default only one that served a huge-page
/// block, and, as one line, one whose allocator calls go first elsewhere,
/// [`Binding`]): appended to the `CKALLOC_STATS_FILE` file with one `write(2)`
/// (opened `O_APPEND`, created with mode 0644 less the umask; `O_NONBLOCK`,
/// so a FIFO without a reader, or a full one, costs the summary, never a
/// wait), else to the
/// file [`remember_output`] saw as standard error, through descriptor 2
/// while it is still that file, else through the copy made at load while
/// that still is (a program that closed standard error, or closed the copy
/// and reused its number, gets none). Before writing to standard error the
/// program's own buffered `stdout` and `stderr` output is written out, so
/// that the summary comes after it, each stream only when no thread holds
/// its lock ([`flush_stdio_if_unlocked`]). `SIGPIPE` is blocked during the
/// write (and a `SIGPIPE` the write raised discarded), so that a closed
/// pipe neither kills the exiting process nor changes its exit status.
/// Never allocates; never blocks on a lock.
pub fn print_at_exit() {
    let mode = MODE.load(Relaxed);
    if mode != ShowStats::All as u8 && mode != ShowStats::Huge as u8 {
        return;
    }
    // Under `CKALLOC_SHOW_STATS=1` a process that served no huge block
    // prints only the line saying its calls go first elsewhere, and a
    // child of `fork` leaves that line to its parent.
    let binding_only = if mode == ShowStats::All as u8 || super::served_huge_blocks() {
        false
    } else if !FORK_CHILD.load(Relaxed) && binding().serves() == Some(false) {
        true
    } else {
        return;
    };
    match TEMPLATE.len.load(Acquire) {
        0 => {}
        REFUSED => return,
        len => {
            // SAFETY: written before `len` was published, never again.
            let template = unsafe { &(&*TEMPLATE.bytes.get())[..len] };
            let mut path = [0u8; PATH_MAX];
            // SAFETY: getpid cannot fail.
            let pid = unsafe { libc::getpid() }.unsigned_abs();
            if stats_file_template(template, pid, &mut path).is_err() {
                return;
            }
            // SAFETY: `path` holds a NUL-terminated path.
            let fd = unsafe {
                libc::open(
                    path.as_ptr().cast(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_APPEND
                        | libc::O_CLOEXEC
                        | libc::O_NOCTTY
                        | libc::O_NONBLOCK,
                    0o644 as libc::c_uint,
                )
            };
            if fd >= 0 {
                without_sigpipe(|| {
                    let _ = write_report(fd, binding_only);
                });
                // SAFETY: closes the descriptor opened above.
                unsafe { libc::close(fd) };
            }
            return;
        }
    }
    let then = (STDERR_FILE[0].load(Relaxed), STDERR_FILE[1].load(Relaxed));
    if then == (u64::MAX, u64::MAX) {
        return;
    }
    flush_stdio_if_unlocked();
    let copy = STDERR_COPY.load(Relaxed);
    let fd = if file_id(libc::STDERR_FILENO) == Some(then) {
        libc::STDERR_FILENO
    } else if copy >= 0 && file_id(copy) == Some(then) {
        copy
    } else {
        return;
    };
    without_sigpipe(|| {
        let _ = write_report(fd, binding_only);
    });
}

/// Run `f` with `SIGPIPE` blocked in this thread, discarding a `SIGPIPE`
/// that `f` raised (not one pending before); `f` does not run when the
/// mask cannot be changed.
fn without_sigpipe(f: impl FnOnce()) {
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
        f();
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
