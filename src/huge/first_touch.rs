//! The first-touch policy [`FirstTouch::Probe`](super::FirstTouch::Probe):
//! huge pages when the kernel faults them in fast, base pages when a huge
//! page costs more than 512 base pages (measured in `benches/README.md`).
//! A page's cost is the time it took less the time the thread waited for a
//! CPU meanwhile ([`PageClock`]), so a busy machine does not pass for slow
//! memory. No allocation, no panic, no thread; atomics only.

use super::os;
use super::stats::{Count, Counters};
use crate::sys::{self, Advice, SchedStat, HUGE_PAGE_2M};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Blocks shorter than this (4 MiB) are not probed.
pub(crate) const PROBE_MIN_LEN: usize = 2 * HUGE_PAGE_2M;
/// A page that cost more than this (1 ms for 2 MiB: about 512 faults of
/// 4 KiB on the machine measured) sends the rest of its block to base pages.
pub(crate) const SLOW_NS: u64 = 1_000_000;

/// How long after a slow page fresh blocks go to base pages unprobed.
pub(crate) const SLOW_WINDOW_NS: u64 = 200_000_000;

/// A moment of the probing thread: its run-queue delay
/// (`/proc/thread-self/schedstat`) and then the monotonic clock, both in
/// nanoseconds, read in the same order every time.
#[derive(Clone, Copy)]
pub(crate) struct PageClock {
    wall: u64,
    run_delay: Option<u64>,
}

impl PageClock {
    pub(crate) fn now(stat: Option<&SchedStat>) -> PageClock {
        PageClock::after(stat.and_then(SchedStat::run_delay_ns))
    }

    /// The moment after reading the run-queue delay `run_delay`.
    pub(crate) fn after(run_delay: Option<u64>) -> PageClock {
        PageClock {
            run_delay,
            wall: sys::monotonic_ns(),
        }
    }

    /// What the interval since `self` cost the thread, and how much of its
    /// wall-clock time the thread spent waiting for a CPU (taken out of the
    /// cost): (cost, waited). Time the thread ran or was blocked (a page
    /// fault compacting memory, or faulting on the host, in which the vCPU
    /// stalls or, with KVM's asynchronous page faults, the thread blocks)
    /// stays in the cost; time other runnable threads held the CPU does
    /// not. Without a run-queue delay to read, the wall clock alone.
    pub(crate) fn cost_until(self, later: PageClock) -> (u64, u64) {
        let took = later.wall.saturating_sub(self.wall);
        let waited = match (self.run_delay, later.run_delay) {
            (Some(a), Some(b)) => b.saturating_sub(a).min(took),
            _ => 0,
        };
        (took - waited, waited)
    }
}

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
        let mut waited = 0;
        let stat = SchedStat::open();
        let mut before = PageClock::now(stat.as_ref());
        while fill - done >= HUGE_PAGE_2M {
            // `done + 2 MiB <= fill <= len`: the page lies inside the block.
            let at = p.as_ptr().wrapping_add(done);
            let Some(at) = NonNull::new(at) else { break };
            if os::advise(c, at, HUGE_PAGE_2M, Advice::PopulateWrite).is_err() {
                // No memory now: the caller's writes fault the rest in, as THP.
                break;
            }
            done += HUGE_PAGE_2M;
            let after = PageClock::now(stat.as_ref());
            let (cost, wait) = before.cost_until(after);
            waited += wait;
            if cost <= SLOW_NS && cost + wait > SLOW_NS {
                c.add(Count::DescheduledPages, 1);
            }
            before = after;
            if cost > SLOW_NS {
                slow = Some(cost);
                break;
            }
        }
        if done == 0 {
            return None;
        }
        c.add(Count::Probes, 1);
        c.add(Count::ProbeNs, sys::monotonic_ns().saturating_sub(start));
        c.add(Count::ProbeWaitNs, waited);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(wall: u64, run_delay: Option<u64>) -> PageClock {
        PageClock { wall, run_delay }
    }

    #[test]
    fn a_page_s_cost_leaves_out_the_wait_for_a_cpu() {
        // 5 ms of wall clock of which 4.5 ms runnable but not running.
        let (cost, waited) = at(1_000, Some(100)).cost_until(at(5_001_000, Some(4_500_100)));
        assert_eq!((cost, waited), (500_000, 4_500_000));
        assert!(cost <= SLOW_NS);
        // Without a run-queue delay to read, the wall clock alone.
        assert_eq!(
            at(0, None).cost_until(at(2_000_000, Some(7))),
            (2_000_000, 0)
        );
        // A delay read larger than the interval (clocks read apart) waits
        // no longer than the interval.
        assert_eq!(at(0, Some(0)).cost_until(at(10, Some(50))), (0, 10));
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads procfs")]
    fn this_thread_has_a_run_queue_delay_to_read() {
        if std::fs::metadata("/proc/thread-self/schedstat").is_err() {
            eprintln!("no /proc/thread-self/schedstat: skipped");
            return;
        }
        let stat = SchedStat::open().expect("schedstat opens");
        let a = stat.run_delay_ns().expect("schedstat parses");
        let b = stat.run_delay_ns().expect("schedstat parses");
        assert!(b >= a);
    }
}
