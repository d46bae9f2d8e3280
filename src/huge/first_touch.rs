//! The first-touch policy of [`CkHuge`](super::CkHuge)'s fresh THP blocks:
//! huge pages when the kernel can fault them in fast, base pages when a
//! huge page costs more to fault in than 512 base pages.
//!
//! The policy, its numbers and its switch are documented once, in the
//! `huge` module's "First touch" section.
//!
//! Never allocates, never panics, starts no thread (safe inside `malloc`,
//! before `main` and in a fork child); thread-safe (atomics only).

use super::stats::COUNTERS;
use crate::env;
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Blocks shorter than this are not probed (4 MiB: at least one page after
/// the probed one).
pub(crate) const PROBE_MIN_LEN: usize = 2 * HUGE_PAGE_2M;
/// A probe slower than this (1 ms for 2 MiB) sends the block to base
/// pages: about what 512 faults of 4 KiB cost on the machine measured
/// above, and ten times a THP fault on bare metal.
pub(crate) const SLOW_NS: u64 = 1_000_000;
/// How long after a slow probe fresh blocks go to base pages unprobed.
pub(crate) const SLOW_WINDOW_NS: u64 = 200_000_000;

/// Monotonic ns until which fresh blocks go to base pages; 0: none.
static BASE_PAGES_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Test hook: `true` opens the window in which fresh blocks go to base
/// pages unprobed (as a slow probe does) for an hour; `false` closes it.
#[doc(hidden)]
pub fn hold_first_touch_base_pages(hold: bool) {
    let until = if hold {
        sys::monotonic_ns().saturating_add(3_600_000_000_000)
    } else {
        0
    };
    BASE_PAGES_UNTIL.store(until, Relaxed);
}

/// Whether fresh memory goes to base pages right now (inside the window
/// after a slow probe).
pub(crate) fn base_pages_now() -> bool {
    env::first_touch_probe() && sys::monotonic_ns() < BASE_PAGES_UNTIL.load(Relaxed)
}

/// Apply the policy to a fresh THP block of `len` bytes at `p` (the whole
/// mapping, 2 MiB aligned, untouched): fault its first `fill` bytes (a
/// multiple of 2 MiB, at most `len`; less than `len` when the caller keeps
/// a short tail in base pages) in one 2 MiB page at a time while each page
/// comes in fast, and send the rest of the block to base pages at the first
/// slow one. Advice only: when a call fails the rest of the block keeps its
/// advice and the caller's writes fault it in.
pub(crate) fn settle(p: *mut u8, len: usize, fill: usize) {
    if len < PROBE_MIN_LEN || !env::first_touch_probe() {
        return;
    }
    let start = sys::monotonic_ns();
    if start < BASE_PAGES_UNTIL.load(Relaxed) {
        send_to_base_pages(p, len);
        return;
    }
    let fill = fill.min(len);
    let mut done = 0;
    let mut slow = None;
    while fill - done >= HUGE_PAGE_2M {
        let page = sys::monotonic_ns();
        // `done + 2 MiB <= fill <= len`: the page lies inside the block.
        if sys::madvise(p.wrapping_add(done), HUGE_PAGE_2M, Advice::PopulateWrite).is_err() {
            // No MADV_POPULATE_WRITE (Linux before 5.14), or no memory now:
            // the caller's writes fault the rest in, as THP.
            break;
        }
        done += HUGE_PAGE_2M;
        let took = sys::monotonic_ns().saturating_sub(page);
        if took > SLOW_NS {
            slow = Some(took);
            break;
        }
    }
    if done == 0 {
        return;
    }
    COUNTERS.first_touch_probes.fetch_add(1, Relaxed);
    COUNTERS
        .first_touch_probe_ns
        .fetch_add(sys::monotonic_ns().saturating_sub(start), Relaxed);
    COUNTERS
        .first_touch_populated_bytes
        .fetch_add(done as u64, Relaxed);
    let Some(took) = slow else { return };
    COUNTERS.first_touch_slow_probes.fetch_add(1, Relaxed);
    let now = sys::monotonic_ns();
    BASE_PAGES_UNTIL.store(
        now.saturating_add(took.saturating_add(SLOW_WINDOW_NS)),
        Relaxed,
    );
    if done < len {
        send_to_base_pages(p.wrapping_add(done), len - done);
    }
}

/// Advise `len` bytes at `p` (2 MiB aligned, inside one block)
/// `MADV_NOHUGEPAGE` and count them.
fn send_to_base_pages(p: *mut u8, len: usize) {
    if sys::madvise(p, len, Advice::NoHugePage).is_ok() {
        COUNTERS.first_touch_base_blocks.fetch_add(1, Relaxed);
        COUNTERS
            .first_touch_base_bytes
            .fetch_add(len as u64, Relaxed);
    }
}
