//! The fault check: whether fresh units may fault in huge pages now
//! ([`FaultCheck::grant`], on the request path), from what the background
//! thread measured ([`FaultCheck::run`]).
//!
//! While the background thread promotes units later, a fresh block goes
//! to a span not advised `MADV_HUGEPAGE` and faults in base pages, so no
//! request waits on compaction or on the host. When huge pages are cheap,
//! that costs the program 512 page faults per 2 MiB for nothing. So every
//! tick in which the program allocated a block, the thread
//!
//! - counts the free memory in blocks of 2 MiB or more (`/proc/buddyinfo`,
//!   proc(5): the free blocks of each order per zone). A THP fault that
//!   finds such a block takes it without compacting memory;
//! - faults in one fresh huge page of its own (a write to each base page
//!   of a 2 MiB mapping advised `MADV_HUGEPAGE`, unmapped afterwards, the
//!   page faults a block's first writes take), timed as the first-touch
//!   probe times a page ([`PageClock`]): the wall clock less the thread's
//!   run-queue delay. A busy CPU does not pass for slow
//!   memory; a fault that compacts memory, falls back to 512 base pages, or
//!   waits on the host (a VM that reported the block to its host) does.
//!
//! When the mean cost of those pages ([`mean_cost`]: a page faulted in
//! on the host costs many times a page the guest kept, so one page says
//! little) is at most [`SLOW_NS`] (about what 512 base-page faults cost)
//! and free 2 MiB blocks were counted, fresh units may go to spans
//! advised `MADV_HUGEPAGE` (their faults take huge pages, as without the
//! thread) for [`VALID_NS`], up to half the free bytes counted: each grant
//! takes its block's length from that budget. Otherwise, and when no check
//! ran for [`VALID_NS`] (an idle program: the first request after an idle
//! spell never trusts memory measured before it), fresh units fault in base
//! pages and are promoted later.
//!
//! Atomics only; the check allocates nothing (a 4 KiB buffer on the
//! thread's stack, one `mmap` of its own).

use super::first_touch::{PageClock, SLOW_NS};
use super::os;
use super::stats::{Count, Counters};
use crate::sys::{self, Advice, Prot, SchedStat, HUGE_PAGE_2M};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How long a check's verdict holds (250 ms: two and a half ticks of the
/// background thread, which checks every tick while blocks are allocated).
pub(crate) const VALID_NS: u64 = 250_000_000;
/// The shortest time between two checks (50 ms: the thread may run its
/// work again at once after a promotion pass that met its deadline).
const CHECK_EVERY_NS: u64 = 50_000_000;

/// The verdict of the last check (see the [module docs](self)).
pub(crate) struct FaultCheck {
    /// Monotonic ns until which fresh units may fault in huge pages; 0: not
    /// now.
    until: AtomicU64,
    /// Bytes of fresh units that may still fault in huge pages.
    budget: AtomicU64,
    /// Monotonic ns of the last check.
    checked: AtomicU64,
    /// The mean cost of a fresh huge page (ns), weighted to recent checks
    /// ([`mean_cost`]); 0 before the first.
    mean: AtomicU64,
}

impl FaultCheck {
    pub(crate) const fn new() -> FaultCheck {
        FaultCheck {
            until: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            mean: AtomicU64::new(0),
        }
    }

    /// Whether fresh units of `len` bytes may fault in huge pages now; when
    /// they may, `len` is taken from the budget. Two loads and a clock read
    /// when they may not.
    pub(crate) fn grant(&self, len: usize) -> bool {
        let until = self.until.load(Relaxed);
        until != 0
            && sys::monotonic_ns() < until
            && self
                .budget
                .fetch_update(Relaxed, Relaxed, |b| b.checked_sub(len as u64))
                .is_ok()
    }

    /// Set the verdict: `budget` bytes may fault in huge pages until
    /// monotonic ns `until` (0: none).
    pub(crate) fn set(&self, budget: u64, until: u64) {
        self.budget.store(budget, Relaxed);
        self.until.store(until, Relaxed);
    }

    /// The background thread's check at monotonic time `now` (see the
    /// [module docs](self)), unless one ran in the last [`CHECK_EVERY_NS`];
    /// `Some(true)` when huge pages are cheap now.
    pub(crate) fn run(&self, c: &Counters, now: u64) -> Option<bool> {
        if now.saturating_sub(self.checked.load(Relaxed)) < CHECK_EVERY_NS {
            return None;
        }
        self.checked.store(now, Relaxed);
        let mean = huge_fault_ns(c).map(|ns| {
            let m = mean_cost(self.mean.load(Relaxed), ns);
            self.mean.store(m, Relaxed);
            c.set(Count::HugeFaultNs, m);
            m
        });
        let free = free_huge_bytes();
        c.add(Count::HugeChecks, 1);
        match (mean, free) {
            (Some(ns), Some(free)) if ns <= SLOW_NS && free >= HUGE_PAGE_2M as u64 => {
                self.set(free / 2, now.saturating_add(VALID_NS));
                Some(true)
            }
            _ => {
                self.set(0, 0);
                c.add(Count::HugeChecksDear, 1);
                Some(false)
            }
        }
    }
}

/// The mean cost after a check that measured `sample` ns, from the mean
/// `mean` before it (0: none): each check weighs a quarter. Huge-page
/// faults on a VM cost either little or, for a block the guest reported to
/// its host, many times as much; the mean, not one sample, says what the
/// next blocks' faults will cost.
fn mean_cost(mean: u64, sample: u64) -> u64 {
    if mean == 0 {
        return sample.max(1);
    }
    (mean / 4)
        .saturating_mul(3)
        .saturating_add(sample / 4)
        .max(1)
}

/// What faulting in one fresh huge page costs now, in nanoseconds less the
/// run-queue delay: a write to each base page of a 2 MiB mapping of its
/// own advised `MADV_HUGEPAGE`, as a block's first writes fault it in (one
/// fault that takes a huge page, or 512 that take base pages after the
/// kernel found none); `None` when it cannot be measured (no memory, no
/// THP advice).
fn huge_fault_ns(c: &Counters) -> Option<u64> {
    let p = os::map_aligned(c, HUGE_PAGE_2M, HUGE_PAGE_2M, Prot::ReadWrite).ok()?;
    let cost = os::advise(c, p, HUGE_PAGE_2M, Advice::HugePage)
        .ok()
        .map(|()| {
            let stat = SchedStat::open();
            let before = PageClock::now(stat.as_ref());
            for off in (0..HUGE_PAGE_2M).step_by(sys::page_size()) {
                // SAFETY: `off < 2 MiB`: a byte of the read-write mapping
                // just made, which nothing else refers to.
                unsafe { p.as_ptr().add(off).write_volatile(1) };
            }
            before.cost_until(PageClock::now(stat.as_ref())).0
        });
    let _ = os::unmap(c, p, HUGE_PAGE_2M);
    cost
}

/// Free memory in blocks of 2 MiB or more, in bytes, from
/// `/proc/buddyinfo`; `None` when it cannot be read.
fn free_huge_bytes() -> Option<u64> {
    let mut buf = [0u8; 4096];
    let text = sys::read_small_file(c"/proc/buddyinfo", &mut buf)?;
    Some(free_in_blocks(text, sys::page_size(), HUGE_PAGE_2M))
}

/// The bytes of the free blocks of at least `block` bytes in `buddyinfo`
/// text (a line per zone: `Node 0, zone   Normal` and then the count of
/// free blocks of each order, from order 0, of `page << order` bytes
/// each). Saturates rather than overflow; a line that does not parse adds
/// nothing.
fn free_in_blocks(text: &[u8], page: usize, block: usize) -> u64 {
    let mut total: u64 = 0;
    for line in text.split(|&b| b == b'\n') {
        let mut fields = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        if fields.nth(2) != Some(b"zone".as_slice()) || fields.next().is_none() {
            continue;
        }
        for (order, count) in fields.enumerate() {
            let Some(count) = crate::units::decimal(count) else {
                break;
            };
            let size = u32::try_from(order)
                .ok()
                .and_then(|o| 1usize.checked_shl(o))
                .and_then(|m| page.checked_mul(m));
            let Some(size) = size else {
                break;
            };
            if size >= block {
                total = total.saturating_add(count.saturating_mul(size as u64));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDDYINFO: &[u8] = b"Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n\
Node 0, zone    DMA32      5      4      3      2      1      1      1      1      1      2    100 \n\
Node 0, zone   Normal    100    200      7      1      0      0      0      0      0    600   3100 \n";

    #[test]
    fn buddyinfo_gives_the_free_bytes_in_blocks_of_2_mib_and_more() {
        let mib = 1u64 << 20;
        // Orders 9 and 10 with 4 KiB pages: 2 and 4 MiB blocks.
        let want = (1 + 2 + 600) * 2 * mib + (3 + 100 + 3100) * 4 * mib;
        assert_eq!(free_in_blocks(BUDDYINFO, 4096, HUGE_PAGE_2M), want);
        // Blocks of 4 MiB and more only.
        assert_eq!(
            free_in_blocks(BUDDYINFO, 4096, 4 << 20),
            (3 + 100 + 3100) * 4 * mib
        );
        // Lines that are not zones, or numbers that do not parse, add
        // nothing after them.
        assert_eq!(free_in_blocks(b"", 4096, HUGE_PAGE_2M), 0);
        assert_eq!(
            free_in_blocks(
                b"Node 0, zone Normal 0 0 0 0 0 0 0 0 0 x 5\n",
                4096,
                HUGE_PAGE_2M
            ),
            0
        );
        assert_eq!(
            free_in_blocks(b"garbage 1 2 3\nNode 0, zone\n", 4096, HUGE_PAGE_2M),
            0
        );
        // A count that would overflow saturates.
        let huge = b"Node 0, zone Normal 0 0 0 0 0 0 0 0 0 18446744073709551615\n";
        assert_eq!(free_in_blocks(huge, 4096, HUGE_PAGE_2M), u64::MAX);
        // An order whose block size overflows ends the line.
        let long = b"Node 0, zone Normal 0 0 0 0 0 0 0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n";
        assert!(free_in_blocks(long, 4096, HUGE_PAGE_2M) > 0);
    }

    #[test]
    fn a_grant_takes_from_the_budget_until_the_verdict_expires() {
        let f = FaultCheck::new();
        assert!(!f.grant(HUGE_PAGE_2M), "no check yet: base pages");
        let far = sys::monotonic_ns() + 60_000_000_000;
        f.set(3 * HUGE_PAGE_2M as u64, far);
        assert!(f.grant(2 * HUGE_PAGE_2M));
        assert!(!f.grant(2 * HUGE_PAGE_2M), "1 block of budget left");
        assert!(f.grant(HUGE_PAGE_2M));
        assert!(!f.grant(HUGE_PAGE_2M), "budget spent");
        f.set(u64::MAX, sys::monotonic_ns().saturating_sub(1));
        assert!(!f.grant(HUGE_PAGE_2M), "the verdict expired");
        f.set(u64::MAX, 0);
        assert!(!f.grant(HUGE_PAGE_2M), "a dear verdict");
    }

    #[test]
    fn the_mean_cost_weighs_each_check_a_quarter() {
        assert_eq!(
            mean_cost(0, 200_000),
            200_000,
            "the first check is the mean"
        );
        assert_eq!(mean_cost(0, 0), 1, "0 stays the mark of no check");
        assert_eq!(mean_cost(200_000, 5_000_000), 1_400_000);
        // One slow page among cheap ones: dear for a few checks, then cheap.
        let mut m = 200_000;
        m = mean_cost(m, 4_600_000);
        assert!(m > SLOW_NS);
        m = mean_cost(m, 200_000);
        assert!(m > SLOW_NS);
        m = mean_cost(m, 200_000);
        assert!(m <= SLOW_NS);
        assert_eq!(
            mean_cost(u64::MAX, u64::MAX),
            u64::MAX / 4 * 3 + u64::MAX / 4
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap and procfs")]
    fn a_check_gives_a_verdict_and_counts_itself() {
        let c = Counters::new();
        let f = FaultCheck::new();
        let now = sys::monotonic_ns();
        let cheap = f.run(&c, now).expect("the first check runs");
        assert_eq!(c.get(Count::HugeChecks), 1);
        assert_eq!(c.get(Count::HugeChecksDear), u64::from(!cheap));
        assert_eq!(f.grant(HUGE_PAGE_2M), cheap);
        // Not again within 50 ms.
        assert_eq!(f.run(&c, now + 1), None);
        assert_eq!(c.get(Count::HugeChecks), 1);
    }
}
