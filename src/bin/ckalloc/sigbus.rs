//! A `SIGBUS` in a file mapping the tool made is one error line and exit
//! status 1, not "Bus error".
//!
//! The tool maps two kinds of file: the safetensors model (`pack`, `demo`)
//! and a `weights.bump` in mixed mode (`load --mode mixed`, the demo's mixed
//! and auto arenas). When another process truncates such a file, reading a
//! page past its new end raises `SIGBUS` (POSIX `mmap`). [`watch`] registers
//! a mapping; the handler, installed on the first registration, compares
//! the fault address (`si_addr`) with the registered ranges. Inside one, it
//! writes the registered message with the file offset to stderr and ends
//! the process with `_exit(1)`; under `--json` it also prints
//! `{"error": ..., "exit_code": 1}` on stdout, as every other error does.
//! Any other `SIGBUS` (hugetlb pages running
//! out, a fault in memory the tool did not map from a file) gets its
//! default action back and the fault repeats with it. The library installs
//! no handler: a library user of mixed mode decides for their process.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Once;

/// At most this many mappings are watched at a time.
const SLOTS: usize = 4;
/// Message bytes kept per mapping (longer messages are cut).
const MSG_MAX: usize = 768;

struct Slot {
    /// Claimed by a [`Watch`].
    used: AtomicBool,
    /// The mapping `[start, end)`; `end == 0`: nothing registered.
    start: AtomicUsize,
    end: AtomicUsize,
    /// File offset of `start`.
    file_offset: AtomicUsize,
    /// The message up to the byte offset, and the same as the inside of a
    /// JSON string.
    msg: [AtomicU8; MSG_MAX],
    len: AtomicUsize,
    json: [AtomicU8; MSG_MAX],
    json_len: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            used: AtomicBool::new(false),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            file_offset: AtomicUsize::new(0),
            msg: [const { AtomicU8::new(0) }; MSG_MAX],
            len: AtomicUsize::new(0),
            json: [const { AtomicU8::new(0) }; MSG_MAX],
            json_len: AtomicUsize::new(0),
        }
    }
}

static WATCHED: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static INSTALL: Once = Once::new();
/// `--json`: the handler also prints the error document on stdout.
static JSON: AtomicBool = AtomicBool::new(false);

/// Whether the command prints JSON (`--json`).
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// Store `text` (at most [`MSG_MAX`] bytes: the caller keeps it so) in
/// `cells`; returns its length.
fn store(cells: &[AtomicU8; MSG_MAX], text: &str) -> usize {
    let bytes = &text.as_bytes()[..text.len().min(MSG_MAX)];
    for (cell, &b) in cells.iter().zip(bytes) {
        cell.store(b, Ordering::Relaxed);
    }
    bytes.len()
}

/// Copy `len` bytes out of `cells` (in the handler: no allocation).
fn load(cells: &[AtomicU8; MSG_MAX], len: usize, out: &mut [u8; MSG_MAX]) -> usize {
    let len = len.min(MSG_MAX);
    for (b, cell) in out.iter_mut().zip(&cells[..len]) {
        *b = cell.load(Ordering::Relaxed);
    }
    len
}

/// `write(2)` of all of `bytes` to `fd`, ignoring failures (nothing can be
/// done about them in a signal handler).
fn write_fd(fd: libc::c_int, bytes: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for its length.
    let _ = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

/// Unregisters its mapping when dropped.
pub struct Watch {
    slot: Option<&'static Slot>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            s.end.store(0, Ordering::Release);
            s.used.store(false, Ordering::Release);
        }
    }
}

/// Watch `[ptr, ptr + len)`, a mapping of a file starting at `file_offset`.
/// A `SIGBUS` inside it prints `ckalloc: error: {what}: ...` and exits 1.
/// With every slot taken, or `len == 0`, nothing is watched.
pub fn watch(ptr: *const u8, len: usize, file_offset: u64, what: &str) -> Watch {
    INSTALL.call_once(install);
    if len == 0 {
        return Watch { slot: None };
    }
    let Some(slot) = WATCHED.iter().find(|s| {
        s.used
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return Watch { slot: None };
    };
    // The message, and the same text as the inside of a JSON string (quotes
    // and backslashes escaped; control characters already are), with `what`
    // cut until both fit a slot whole.
    let texts = |cap: usize| {
        let msg = format!(
            "{}: the file shrank while it was mapped: reading its byte ",
            ckalloc::Escaped::capped(what, cap)
        );
        let quoted = serde_json::to_string(&msg).unwrap_or_default();
        let inner = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or("")
            .to_string();
        (msg.len() <= MSG_MAX && inner.len() <= MSG_MAX).then_some((msg, inner))
    };
    let (msg, inner) = [300, 120, 40, 0]
        .into_iter()
        .find_map(texts)
        .unwrap_or_default();
    slot.len.store(store(&slot.msg, &msg), Ordering::Relaxed);
    slot.json_len
        .store(store(&slot.json, &inner), Ordering::Relaxed);
    slot.file_offset.store(
        usize::try_from(file_offset).unwrap_or(usize::MAX),
        Ordering::Relaxed,
    );
    slot.start.store(ptr as usize, Ordering::Relaxed);
    slot.end
        .store((ptr as usize).saturating_add(len), Ordering::Release);
    Watch { slot: Some(slot) }
}

fn install() {
    // SAFETY: a zeroed sigaction is a valid value to fill in; the handler
    // has the SA_SIGINFO signature and only does async-signal-safe work
    // (atomic loads, write(2), _exit(2), sigaction(2)).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        // Without the handler a SIGBUS keeps its default action: nothing lost.
        let _ = libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// Decimal digits of `n` into the end of `buf`; returns where they start.
fn decimal(mut n: usize, buf: &mut [u8; 24]) -> usize {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return i;
        }
    }
}

extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for SA_SIGINFO handlers;
    // si_addr is the faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &WATCHED {
        let end = s.end.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Relaxed);
        if end == 0 || addr < start || addr >= end {
            continue;
        }
        let mut digits = [0u8; 24];
        let offset = s
            .file_offset
            .load(Ordering::Relaxed)
            .saturating_add(addr - start);
        let from = decimal(offset, &mut digits);
        let tail = b" raised SIGBUS (another process truncated it)";
        let mut buf = [0u8; MSG_MAX];
        if JSON.load(Ordering::Relaxed) {
            let n = load(&s.json, s.json_len.load(Ordering::Relaxed), &mut buf);
            write_fd(1, b"{\"error\": \"");
            write_fd(1, &buf[..n]);
            write_fd(1, &digits[from..]);
            write_fd(1, tail);
            write_fd(1, b"\", \"exit_code\": 1}\n");
        }
        let n = load(&s.msg, s.len.load(Ordering::Relaxed), &mut buf);
        write_fd(2, b"ckalloc: error: ");
        write_fd(2, &buf[..n]);
        write_fd(2, &digits[from..]);
        write_fd(2, tail);
        write_fd(2, b"\n");
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(1) };
    }
    // Not a watched mapping: restore the default action and raise the
    // signal again. It stays pending (blocked while this handler runs) and
    // takes its default action when the handler returns, whether it came
    // from a fault or from kill(2).
    // SAFETY: signal(2) and raise(3) are async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        libc::raise(libc::SIGBUS);
    }
}
