//! The first-touch policy [`FirstTouch::Probe`](super::FirstTouch::Probe):
//! huge pages when the kernel faults them in fast, base pages when a huge
//! page costs more than 512 base pages (measured in `benches/README.md`).
//! No allocation, no panic, no thread; atomics only.

use super::os;
use super::stats::{Count, Counters};
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Blocks shorter than this (4 MiB) are not probed.
pub(crate) const PROBE_MIN_LEN: usize = 2 * HUGE_PAGE_2M;
/// A page slower than this (1 ms for 2 MiB: about 512 faults of 4 KiB on
/// the machine measured) sends the rest of its block to base pages.
pub(crate) const SLOW_NS: u64 = 1_000_000;
/// How long after a slow page fresh blocks go to base pages unprobed.
pub(crate) const SLOW_WINDOW_NS: u64 = 200_000_000;

/// The window after a slow page: monotonic ns until which fresh blocks go
/// to base pages; 0: none.
pub(crate) struct Window(AtomicU64);

impl Window {
    pub(crate) const fn new() -> Window {
        Window(AtomicU64::new(0))
    }

    /// Open the window for an hour (`true`), as a slow page does, or close
    /// it (`false`): a test hook.
    pub(crate) fn hold(&self, open: bool) {
        let until = if open {
            sys::monotonic_ns().saturating_add(3_600_000_000_000)
        } else {
            0
        };
        self.0.store(until, Relaxed);
    }

    /// Advise `len` bytes at `p` (fresh units added to a block by a
    /// growth) `MADV_NOHUGEPAGE` while the window is open; `true` when they
    /// were.
    pub(crate) fn base_pages_if_open(&self, c: &Counters, p: NonNull<u8>, len: usize) -> bool {
        sys::monotonic_ns() < self.0.load(Relaxed) && send_to_base_pages(c, p, len)
    }

    /// Apply the policy to a fresh THP block of `len` bytes at `p` (2 MiB
    /// aligned, untouched): fault its first `fill` bytes (a multiple of
    /// 2 MiB, at most `len`) in one 2 MiB page at a time while each page
    /// comes in fast, and send the rest of the block to base pages at the
    /// first slow one. Returns the offset from which the block was advised
    /// `MADV_NOHUGEPAGE`, if it was. Advice only: when a call fails the
    /// block keeps its advice and the caller's writes fault it in.
    pub(crate) fn settle(
        &self,
        c: &Counters,
        p: NonNull<u8>,
        len: usize,
        fill: usize,
    ) -> Option<usize> {
        if len < PROBE_MIN_LEN || !sys::linux_at_least(sys::LINUX_MADV_POPULATE_WRITE) {
            return None;
        }
        let start = sys::monotonic_ns();
        if start < self.0.load(Relaxed) {
            return send_to_base_pages(c, p, len).then_some(0);
        }
        let fill = fill.min(len);
        let mut done = 0;
        let mut slow = None;
        while fill - done >= HUGE_PAGE_2M {
            let page = sys::monotonic_ns();
            // `done + 2 MiB <= fill <= len`: the page lies inside the block.
            let at = p.as_ptr().wrapping_add(done);
            let Some(at) = NonNull::new(at) else { break };
            if os::advise(c, at, HUGE_PAGE_2M, Advice::PopulateWrite).is_err() {
                // No memory now: the caller's writes fault the rest in, as THP.
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
            return None;
        }
        c.add(Count::Probes, 1);
        c.add(Count::ProbeNs, sys::monotonic_ns().saturating_sub(start));
        c.add(Count::Populated, done as u64);
        let took = slow?;
        c.add(Count::SlowProbes, 1);
        let now = sys::monotonic_ns();
        self.0.store(
            now.saturating_add(took.saturating_add(SLOW_WINDOW_NS)),
            Relaxed,
        );
        let rest = NonNull::new(p.as_ptr().wrapping_add(done))?;
        (done < len && send_to_base_pages(c, rest, len - done)).then_some(done)
    }
}

/// Advise `len` bytes at `p` (2 MiB aligned, inside one block)
/// `MADV_NOHUGEPAGE` and count them.
fn send_to_base_pages(c: &Counters, p: NonNull<u8>, len: usize) -> bool {
    let ok = os::advise(c, p, len, Advice::NoHugePage).is_ok();
    if ok {
        c.add(Count::BaseBlocks, 1);
        c.add(Count::BaseBytes, len as u64);
    }
    ok
}
