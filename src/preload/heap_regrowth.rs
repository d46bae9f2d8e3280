//! glibc's main heap growing again into the top it gave back: the
//! trim-and-refault cycle. glibc's `free` gives the free top of the main
//! heap back to the kernel (`brk`) once it reaches the trim threshold; a
//! program whose requests free more than that at their end and ask for it
//! again at the next pays the page faults of that memory at every request.
//! This module watches the program break around glibc's `malloc`,
//! `calloc` and `memalign` calls (and so `posix_memalign` and
//! `aligned_alloc`) of at least [`WATCH_MIN`] bytes: a fall since the last
//! watched call is a trim, and what the break rises by afterwards, within
//! the decay window (`CKALLOC_RETAIN_DECAY_MS`, 2 s by default) of the
//! watched call before that trim (read on the coarse clock, to the kernel
//! tick: 1-10 ms; `0` turns the raise off), is the same memory faulted in
//! again. Any growth of the break within the window counts, whatever the
//! program asks it for. The trim threshold is raised to twice the smaller
//! of the two ([`glibc::follow_heap_regrowth`]), so a one-off large free
//! followed by a little growth raises little or nothing.
//!
//! What it does not see: growth by `realloc`, `valloc` and `pvalloc`, and
//! by requests under [`WATCH_MIN`] (glibc's `free` also trims when such
//! a block coalesces into a free chunk of 64 KiB or more at a top of at
//! least the trim threshold); a trim and its regrowth farther
//! apart than the window, such as a request that computes for longer than
//! the window without a watched call between its last request before the
//! trim and the next after it; and the heaps of glibc's other arenas
//! (mappings that leave the break alone), so a program whose threads churn
//! their own arenas raises nothing here. A program that moves the break
//! itself (`brk`, `sbrk`) can make its own fall read as a trim. The
//! program's `malloc_trim` is no trim here ([`program_trim_starts`],
//! [`program_trim_ends`]), also when it runs on another thread during a
//! watched call; in a `fork()` child, a `malloc_trim` the parent's other
//! thread was running counts as ended. Racing watched calls may miss a trim
//! or a regrowth. Once
//! the trim threshold has reached its cap, nothing is watched. Atomics
//! only; never allocates.

use super::glibc;
use crate::sys;
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// The smallest request watched, in bytes. Watching costs two reads of
/// the break and one of the coarse clock; below 64 KiB (glibc's
/// `FASTBIN_CONSOLIDATION_THRESHOLD`, the least a freed chunk must
/// coalesce to for `free` to trim) requests go to glibc unwatched: the
/// preload library's `malloc` sends them there with one comparison, against
/// the smaller of this and the threshold.
pub const WATCH_MIN: usize = 64 << 10;

/// The program break after the last watched call (0 before the first).
static LAST_BREAK: AtomicUsize = AtomicUsize::new(0);
/// Bytes the break fell by before a watched call, until that much has
/// grown back, the window has passed or the next fall replaces them; 0
/// when no fall is pending.
static TRIMMED: AtomicUsize = AtomicUsize::new(0);
/// Bytes the break rose by since that fall.
static REGROWN: AtomicUsize = AtomicUsize::new(0);
/// Coarse monotonic time of the watched call before that fall, in
/// nanoseconds: the trim came after it.
static TRIMMED_AFTER: AtomicU64 = AtomicU64::new(0);
/// Coarse monotonic time of the last watched call, in nanoseconds.
static LAST_AT: AtomicU64 = AtomicU64::new(0);
/// The program's `malloc_trim` calls, counted at their start and at their
/// end: odd while one runs. A watched call during one records nothing.
static PROGRAM_TRIMS: AtomicUsize = AtomicUsize::new(0);

/// Whether a request of `size` bytes below the threshold is watched
/// ([`watch`]).
#[inline]
pub(super) fn watches(size: usize) -> bool {
    size >= WATCH_MIN
}

/// glibc's `alloc()` for a request of `size` bytes below the threshold,
/// through [`watch`] when [`watches`] says so.
#[inline]
pub(super) fn watch_if_large(size: usize, alloc: impl FnOnce() -> *mut c_void) -> *mut c_void {
    if watches(size) {
        watch(alloc)
    } else {
        alloc()
    }
}

/// glibc's `alloc()`, the program break watched around it while the
/// library may still raise the trim threshold
/// ([`glibc::trim_threshold_may_rise`]).
#[inline]
pub(super) fn watch(alloc: impl FnOnce() -> *mut c_void) -> *mut c_void {
    if !glibc::trim_threshold_may_rise() {
        return alloc();
    }
    let trims = PROGRAM_TRIMS.load(Acquire);
    if trims % 2 == 1 {
        return alloc();
    }
    let now = sys::coarse_monotonic_ns();
    // The last break before the break itself: a rise another thread makes
    // after this load cannot read as a fall.
    let last = LAST_BREAK.load(Acquire);
    let before = sys::program_break();
    if before == usize::MAX {
        // `sbrk` failed: no break to watch.
        return alloc();
    }
    let p = alloc();
    let after = sys::program_break();
    if after == usize::MAX || PROGRAM_TRIMS.load(Acquire) != trims {
        // The program's `malloc_trim` ran meanwhile: its fall is its own.
        return p;
    }
    if before < last {
        TRIMMED.store(last - before, Relaxed);
        REGROWN.store(0, Relaxed);
        TRIMMED_AFTER.store(LAST_AT.load(Relaxed), Relaxed);
    }
    if after > before {
        regrew(after - before, now);
    }
    if after != last {
        // Not over a newer break another thread or `program_trim_ends`
        // stored since the load above.
        let _ = LAST_BREAK.compare_exchange(last, after, AcqRel, Relaxed);
    }
    if LAST_AT.load(Relaxed) != now {
        LAST_AT.store(now, Relaxed);
    }
    p
}

/// The break rose by `grown` bytes at coarse time `now`: if a fall is
/// pending and the window since the call before it has not passed, raise
/// the trim threshold for what has grown back of it.
fn regrew(grown: usize, now: u64) {
    let trimmed = TRIMMED.load(Relaxed);
    if trimmed == 0 {
        return;
    }
    // A window of 0 turns the raise off (on the coarse clock a trim and
    // its regrowth in one tick would read as 0 ns apart).
    let window = crate::env::retain_decay_ms().saturating_mul(1_000_000);
    if window == 0 || now.saturating_sub(TRIMMED_AFTER.load(Relaxed)) > window {
        TRIMMED.store(0, Relaxed);
        return;
    }
    let regrown = REGROWN
        .fetch_add(grown, Relaxed)
        .saturating_add(grown)
        .min(trimmed);
    glibc::follow_heap_regrowth(regrown);
    if regrown == trimmed {
        TRIMMED.store(0, Relaxed);
    }
}

/// Before the program's `malloc_trim`: watched calls from now until
/// [`program_trim_ends`] record no fall.
pub(super) fn program_trim_starts() {
    PROGRAM_TRIMS.fetch_add(1, AcqRel);
}

/// In the child of `fork()`: a `malloc_trim` another thread of the parent
/// was running never ends here, so the count goes back to even; the
/// pending fall, if any, is dropped, and the break the child starts with
/// is the one its first watched call compares with, so a trim of the
/// parent's is never taken for one of the child's.
pub(super) fn after_fork_in_child() {
    PROGRAM_TRIMS.store(0, Relaxed);
    TRIMMED.store(0, Relaxed);
    let now = sys::program_break();
    LAST_BREAK.store(if now == usize::MAX { 0 } else { now }, Relaxed);
}

/// After the program's `malloc_trim`: the break it lowered is the
/// program's request, not a trim of glibc's `free`, so the next rise
/// raises nothing.
pub(super) fn program_trim_ends() {
    let now = sys::program_break();
    if now != usize::MAX {
        LAST_BREAK.store(now, Release);
    }
    TRIMMED.store(0, Relaxed);
    PROGRAM_TRIMS.fetch_add(1, AcqRel);
}
