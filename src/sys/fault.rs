//! Fault injection into the OS layer, compiled in only with
//! `--cfg ckalloc_fault_injection` (test builds; see `scripts/test`).
//!
//! `fail_nth(Op::Mmap, 3, libc::ENOMEM)` makes the third `mmap` from now
//! fail with `ENOMEM` (once). The state is process-global: tests that use it
//! must not run concurrently.

use std::io;

/// The OS operations of `sys` that fault injection can make fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
#[allow(missing_docs)]
pub enum Op {
    Mmap = 0,
    Munmap,
    Madvise,
    Mremap,
    Mprotect,
    Mbind,
    Mlock,
    /// `munlock`, before a purge of a range the program locked.
    Munlock,
    Open,
    Fstat,
    Pread,
    Fadvise,
    /// `open(O_TMPFILE)` (the weights writer's output files).
    #[cfg_attr(not(feature = "weights"), allow(dead_code))]
    OpenUnnamed,
    /// `linkat` of an unnamed file.
    #[cfg_attr(not(feature = "weights"), allow(dead_code))]
    LinkUnnamed,
    /// `pthread_create` of the engine's background thread.
    Thread,
}

/// Returns `Err` when an injected fault is due for `op` (never without
/// `--cfg ckalloc_fault_injection`).
#[inline(always)]
pub(crate) fn inject(op: Op) -> io::Result<()> {
    #[cfg(ckalloc_fault_injection)]
    if let Err(errno) = armed::check(op) {
        return Err(io::Error::from_raw_os_error(errno));
    }
    let _ = op;
    Ok(())
}

#[cfg(ckalloc_fault_injection)]
pub use armed::{calls, fail_from, fail_nth, pending, reset};

#[cfg(ckalloc_fault_injection)]
mod armed {
    use super::Op;
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

    const OP_COUNT: usize = Op::Thread as usize + 1;

    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: AtomicU64 = AtomicU64::new(0);
    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO32: AtomicI32 = AtomicI32::new(0);
    static COUNTDOWN: [AtomicU64; OP_COUNT] = [ZERO; OP_COUNT];
    static ERRNO: [AtomicI32; OP_COUNT] = [ZERO32; OP_COUNT];
    static CALLS: [AtomicU64; OP_COUNT] = [ZERO; OP_COUNT];
    #[allow(clippy::declare_interior_mutable_const)]
    const NO: AtomicBool = AtomicBool::new(false);
    static STICKY: [AtomicBool; OP_COUNT] = [NO; OP_COUNT];

    /// Make the `n`-th call (1-based, counted from now) of `op` fail with `errno`.
    /// `n == 0` disarms.
    pub fn fail_nth(op: Op, n: u64, errno: i32) {
        STICKY[op as usize].store(false, Ordering::SeqCst);
        ERRNO[op as usize].store(errno, Ordering::SeqCst);
        COUNTDOWN[op as usize].store(n, Ordering::SeqCst);
    }

    /// Make the `n`-th call of `op` from now and every later one fail with
    /// `errno`, until [`reset`].
    pub fn fail_from(op: Op, n: u64, errno: i32) {
        ERRNO[op as usize].store(errno, Ordering::SeqCst);
        COUNTDOWN[op as usize].store(n.max(1), Ordering::SeqCst);
        STICKY[op as usize].store(true, Ordering::SeqCst);
    }

    /// Disarm every operation.
    pub fn reset() {
        for c in &COUNTDOWN {
            c.store(0, Ordering::SeqCst);
        }
        for s in &STICKY {
            s.store(false, Ordering::SeqCst);
        }
    }

    /// How many calls of `op` were made since the process started.
    pub fn calls(op: Op) -> u64 {
        CALLS[op as usize].load(Ordering::SeqCst)
    }

    /// Whether an armed fault has not fired yet for `op`.
    pub fn pending(op: Op) -> bool {
        COUNTDOWN[op as usize].load(Ordering::SeqCst) != 0
    }

    pub(super) fn check(op: Op) -> Result<(), i32> {
        let i = op as usize;
        CALLS[i].fetch_add(1, Ordering::SeqCst);
        let sticky = STICKY[i].load(Ordering::SeqCst);
        let prev = COUNTDOWN[i]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                // A sticky fault stays at 1 once it is due.
                if sticky && c == 1 {
                    Some(1)
                } else {
                    c.checked_sub(1)
                }
            })
            .unwrap_or(0);
        if prev == 1 {
            Err(ERRNO[i].load(Ordering::SeqCst))
        } else {
            Ok(())
        }
    }
}
