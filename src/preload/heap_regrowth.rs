//! glibc's main heap growing again into the top it gave back: the
//! trim-and-refault cycle. glibc's `free` gives the free top of the main
//! heap back to the kernel (`brk`) once it reaches the trim threshold; a
//! program whose requests free more than that at their end and ask for it
//! again at the next pays the page faults of that memory at every request.
//! This module watches the program break around glibc's `malloc`,
//! `calloc` and `memalign` calls of at least [`WATCH_MIN`] bytes: a fall
//! since the last watched call is a trim, and a rise within the decay
//! window (`CKALLOC_RETAIN_DECAY_MS`, 2 s by default) of that call is the
//! same memory faulted in again, which raises the trim threshold above the
//! trimmed top ([`glibc::follow_heap_regrowth`]). A rise after a longer
//! idle spell raises nothing: that memory goes back as the engine's own
//! retained blocks do after the window.
//!
//! Only the main heap is watched (glibc grows the heaps of its other
//! arenas with `mmap`, which leaves the break alone), so a program whose
//! threads churn other arenas raises nothing here. The reads race with
//! other threads' calls: a trim or a regrowth may go unseen, never one
//! invented (the break falls only when glibc, or the program's own `brk`,
//! gives memory back). The program's `malloc_trim` is not a trim here
//! ([`forget_trims`]). Atomics only; never allocates.

use super::glibc;
use crate::sys;
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// The smallest request watched, in bytes: glibc's `free` trims the heap
/// only at a chunk of at least 64 KiB (`FASTBIN_CONSOLIDATION_THRESHOLD`,
/// `malloc/malloc.c`), so a program whose requests trim the heap makes
/// such requests; smaller ones go to glibc with one comparison more.
pub const WATCH_MIN: usize = 64 << 10;

/// The program break after the last watched call (0 before the first).
static LAST_BREAK: AtomicUsize = AtomicUsize::new(0);
/// Bytes the break fell by before a watched call, until a rise or the
/// next fall replaces them; 0 when none is pending.
static TRIMMED: AtomicUsize = AtomicUsize::new(0);
/// Monotonic time of the watched call before that fall, in nanoseconds:
/// the trim came after it.
static TRIMMED_AFTER: AtomicU64 = AtomicU64::new(0);
/// Monotonic time of the last watched call, in nanoseconds.
static LAST_AT: AtomicU64 = AtomicU64::new(0);

/// glibc's `alloc()` for a request of `size` bytes, the program break
/// watched around it when `size` is at least [`WATCH_MIN`] and the library
/// raises the trim threshold ([`glibc::trim_threshold`] is not 0).
#[inline]
pub(super) fn watch(size: usize, alloc: impl FnOnce() -> *mut c_void) -> *mut c_void {
    if size < WATCH_MIN || glibc::trim_threshold() == 0 {
        return alloc();
    }
    watched(alloc)
}

#[inline(never)]
fn watched(alloc: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let now = sys::monotonic_ns();
    // The last break first: a rise another thread makes after this load
    // cannot read as a fall.
    let last = LAST_BREAK.load(Acquire);
    let before = sys::program_break();
    if before == usize::MAX {
        // `sbrk` failed: no break to watch.
        return alloc();
    }
    if before < last {
        TRIMMED.store(last - before, Relaxed);
        TRIMMED_AFTER.store(LAST_AT.load(Relaxed), Relaxed);
    }
    let p = alloc();
    let after = sys::program_break();
    if after > before && after != usize::MAX {
        let trimmed = TRIMMED.swap(0, Relaxed);
        // The trim came after the watched call before it, so at most
        // `now - TRIMMED_AFTER` before this rise.
        let window = crate::env::retain_decay_ms().saturating_mul(1_000_000);
        if trimmed != 0 && now.saturating_sub(TRIMMED_AFTER.load(Relaxed)) <= window {
            glibc::follow_heap_regrowth(trimmed);
        }
    }
    if after != usize::MAX {
        if after != last {
            LAST_BREAK.store(after, Release);
        }
        LAST_AT.store(now, Relaxed);
    }
    p
}

/// After the program's `malloc_trim`: the break it lowered is the
/// program's request, not a trim of glibc's `free`, so the next rise
/// raises nothing.
pub(super) fn forget_trims() {
    let now = sys::program_break();
    if now != usize::MAX {
        LAST_BREAK.store(now, Release);
    }
    TRIMMED.store(0, Relaxed);
}
