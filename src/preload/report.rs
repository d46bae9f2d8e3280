//! The summary `CKALLOC_SHOW_STATS=1` prints at exit: one block of text on
//! stderr, labelled with the PID, formatted on the stack and written with
//! one `write(2)` (no allocation, as the allocator's own paths require).

use super::stats;
use crate::huge::huge_stats;
use crate::units::SliceWriter;
use std::fmt::Write as _;

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
        "preload: {} huge blocks served ({} requested), threshold {}, \
         {} served by glibc because the block registry was full\n{}\n",
        p.blocks,
        crate::human_bytes(p.bytes),
        crate::human_bytes(p.threshold as u64),
        p.registry_fallbacks,
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
