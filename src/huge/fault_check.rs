//! The fault check: whether fresh units may fault in huge pages now
//! ([`FaultCheck::grant`], on the request path), from what the background
//! thread measured ([`FaultCheck::run`]).
//!
//! While the background thread promotes units later, a fresh block goes
//! to a span not advised `MADV_HUGEPAGE` and faults in base pages, so no
//! request waits on compaction or on the host. When huge pages are cheap,
//! that costs the program 512 page faults per 2 MiB for nothing. So while
//! the program allocates blocks (one handed out in the last [`VALID_NS`],
//! or the thread's first pass), at most every [`CHECK_EVERY_NS`], the
//! thread
//!
//! - counts the free memory in blocks of 2 MiB or more (`/proc/buddyinfo`,
//!   proc(5): the free blocks of each order per zone, zone DMA left out).
//!   A THP fault that finds such a block takes it without compacting
//!   memory; with none, huge pages are dear and the check ends there;
//! - faults in one fresh huge page of its own (a write to each base page
//!   of a 2 MiB mapping advised `MADV_HUGEPAGE`, unmapped afterwards: the
//!   page faults a block's first writes take), timed as the first-touch
//!   probe times a page ([`PageClock`]): the wall clock less the thread's
//!   run-queue delay. A busy CPU does not pass for slow memory; a fault
//!   that compacts memory or waits on the host (a VM that reported the
//!   block to its host) does. The thread's page faults meanwhile
//!   (`getrusage(RUSAGE_THREAD)`) say whether the kernel gave a huge page
//!   (one fault) or base pages (512).
//!
//! When the page was huge, the mean cost of such pages ([`mean_cost`]: a
//! page faulted in on the host costs many times a page the guest kept, so
//! one page says little) is at most [`SLOW_NS`] (about what 512 base-page
//! faults cost), and free 2 MiB blocks were counted, fresh units may go to
//! spans advised `MADV_HUGEPAGE` (their faults take huge pages, as without
//! the thread) for [`VALID_NS`], up to half the free bytes counted less
//! what was granted since the last check (blocks not written yet, which
//! the free memory does not show) and at most [`GRANT_PER_CHECK`]; each
//! grant takes its block's whole length from that budget, so a longer
//! block is never granted. Otherwise, and when no check ran for
//! [`VALID_NS`] (an idle program: the first request after an idle spell
//! never trusts memory measured before it), fresh units fault in base
//! pages and are promoted later. A granted block keeps its span's advice
//! for life: its pages fault in when written, a purged unit of an advised
//! span faults in as a huge page again, which the engine allows only with
//! a grant, and a block moved between spans advised differently is copied
//! (`mremap` would carry the advice along).
//!
//! Atomics only; the check allocates nothing (a 4 KiB buffer on the
//! thread's stack, one `mmap` of its own, whose system calls the engine's
//! counters leave out) and opens no file: the thread opens `/proc/buddyinfo`
//! and its `schedstat` once as it starts ([`FaultCheck::open_files`]) and
//! keeps them.

use super::first_touch::{PageClock, SLOW_NS};
use super::stats::{Count, Counters};
use crate::sys::{self, Advice, KeptFile, KeptSlot, Prot, HUGE_PAGE_2M};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How long a check's verdict holds (250 ms: two and a half ticks of the
/// background thread, which checks every tick while blocks are allocated).
pub(crate) const VALID_NS: u64 = 250_000_000;
/// The most bytes one check grants (8 MiB: four huge pages). One fault
/// measures the free block the kernel hands out first; on a VM that
/// reports free memory to its host, the blocks after the few recently
/// freed ones fault on the host, which the next check measures only
/// after the program took them.
pub(crate) const GRANT_PER_CHECK: u64 = 8 << 20;
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
    /// Bytes granted since the last check.
    granted: AtomicU64,
    /// The mean cost of a fresh huge page (ns), weighted to recent checks
    /// ([`mean_cost`]); 0 before the first.
    mean: AtomicU64,
    /// `/proc/buddyinfo` and the thread's `schedstat`, kept open
    /// ([`KeptFile`]) by [`open_files`](Self::open_files).
    buddyinfo: KeptSlot,
    schedstat: KeptSlot,
}

impl FaultCheck {
    pub(crate) const fn new() -> FaultCheck {
        FaultCheck {
            until: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            mean: AtomicU64::new(0),
            buddyinfo: KeptSlot::new(),
            schedstat: KeptSlot::new(),
        }
    }

    /// Whether fresh units of `len` bytes may fault in huge pages now; when
    /// they may, `len` is taken from the budget. Two loads and a clock read
    /// when they may not.
    pub(crate) fn grant(&self, len: usize) -> bool {
        let until = self.until.load(Relaxed);
        let granted = until != 0
            && sys::monotonic_ns() < until
            && self
                .budget
                .fetch_update(Relaxed, Relaxed, |b| b.checked_sub(len as u64))
                .is_ok();
        if granted {
            self.granted.fetch_add(len as u64, Relaxed);
        }
        granted
    }

    /// Open the files the checks read, in the background thread as it
    /// starts (while the thread that starts it waits: the thread opens no
    /// file later, so its descriptors never race a program's own `close`
    /// and `open`); kept for the life of the thread's process.
    pub(crate) fn open_files(&self) {
        self.buddyinfo.keep(KeptFile::open(c"/proc/buddyinfo"));
        self.schedstat
            .keep(KeptFile::open(c"/proc/thread-self/schedstat"));
    }

    /// Set the verdict: `budget` bytes may fault in huge pages until
    /// monotonic ns `until` (0: none).
    pub(crate) fn set(&self, budget: u64, until: u64) {
        self.budget.store(budget, Relaxed);
        self.until.store(until, Relaxed);
    }

    /// The background thread's check (see the [module docs](self)), unless
    /// one ran in the last [`CHECK_EVERY_NS`]; `Some(true)` when huge pages
    /// are cheap now.
    pub(crate) fn run(&self, c: &Counters) -> Option<bool> {
        let start = sys::monotonic_ns();
        if start.saturating_sub(self.checked.load(Relaxed)) < CHECK_EVERY_NS {
            return None;
        }
        self.checked.store(start, Relaxed);
        // No free 2 MiB block: dear without a fault (which would compact
        // memory or take 512 base pages, each a fault of the program's).
        let free = self
            .buddyinfo
            .get()
            .and_then(free_huge_bytes)
            .filter(|&f| f >= HUGE_PAGE_2M as u64);
        let fault = free.and_then(|_| huge_fault(self.schedstat.get()));
        // Only huge pages' costs make the mean of a huge page's cost.
        let mean = fault.filter(|f| f.huge).map(|f| {
            let m = mean_cost(self.mean.load(Relaxed), f.ns);
            self.mean.store(m, Relaxed);
            c.set(Count::HugeFaultNs, m);
            m
        });
        c.add(Count::HugeChecks, 1);
        // Blocks granted since the last check may not be written yet, so
        // the free memory counted does not show them: they are taken off.
        let unwritten = self.granted.swap(0, Relaxed);
        if let Some(budget) = budget(fault, mean, free, unwritten) {
            self.set(budget, sys::monotonic_ns().saturating_add(VALID_NS));
            return Some(true);
        }
        self.set(0, 0);
        c.add(Count::HugeChecksDear, 1);
        Some(false)
    }
}

/// The bytes fresh units may fault in huge pages after a check whose fault
/// was `fault`, with the mean cost `mean` after it and `free` bytes free in
/// 2 MiB blocks, `unwritten` of which were granted since the last check;
/// `None` when huge pages are dear: no fault (no free block), a fault that
/// took base pages, or a mean above [`SLOW_NS`].
fn budget(
    fault: Option<Fault>,
    mean: Option<u64>,
    free: Option<u64>,
    unwritten: u64,
) -> Option<u64> {
    match (fault, mean, free) {
        (Some(f), Some(ns), Some(free)) if f.huge && ns <= SLOW_NS => {
            Some((free / 2).saturating_sub(unwritten).min(GRANT_PER_CHECK))
        }
        _ => None,
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

/// One fresh huge page faulted in by the check.
#[derive(Clone, Copy)]
struct Fault {
    /// Its cost: nanoseconds less the run-queue delay.
    ns: u64,
    /// Whether the kernel gave a huge page: a page fault or a few (or the
    /// faults cannot be counted), not 512.
    huge: bool,
}

/// Fault in one fresh huge page as a block's first writes do: a write to
/// each base page of a 2 MiB mapping of its own advised `MADV_HUGEPAGE`
/// (one fault that takes a huge page, or 512 that take base pages when the
/// kernel found none), unmapped afterwards; `None` when it cannot be
/// measured (no memory, no THP advice). Its system calls are not the
/// engine's ([`Syscalls`](super::Syscalls) does not count them).
fn huge_fault(schedstat: Option<KeptFile>) -> Option<Fault> {
    let p = sys::map_aligned(HUGE_PAGE_2M, HUGE_PAGE_2M, Prot::ReadWrite)
        .ok()?
        .ptr;
    let fault = sys::madvise(p.as_ptr(), HUGE_PAGE_2M, Advice::HugePage)
        .ok()
        .map(|()| {
            let delay = || schedstat.and_then(|f| f.run_delay_ns());
            let faults = sys::thread_minor_faults();
            let before = PageClock::after(delay());
            for off in (0..HUGE_PAGE_2M).step_by(sys::page_size()) {
                // SAFETY: `off < 2 MiB`: a byte of the read-write mapping
                // just made, which nothing else refers to.
                unsafe { p.as_ptr().add(off).write_volatile(1) };
            }
            let ns = before.cost_until(PageClock::after(delay())).0;
            let taken = sys::thread_minor_faults()
                .zip(faults)
                .map(|(after, before)| after.saturating_sub(before));
            // A stray fault or two (a stack page the reads touched first)
            // is not the 512 of a range that took base pages.
            Fault {
                ns,
                huge: taken.is_none_or(|n| n < 64),
            }
        });
    let _ = sys::munmap(p.as_ptr(), HUGE_PAGE_2M);
    fault
}

/// Free memory in blocks of 2 MiB or more, in bytes, from
/// `/proc/buddyinfo` kept open as `file`; `None` when it cannot be read.
fn free_huge_bytes(file: KeptFile) -> Option<u64> {
    let mut buf = [0u8; 4096];
    let text = file.read(&mut buf)?;
    Some(free_in_blocks(text, sys::page_size(), HUGE_PAGE_2M))
}

/// The bytes of the free blocks of at least `block` bytes in `buddyinfo`
/// text (a line per zone: `Node 0, zone   Normal` and then the count of
/// free blocks of each order, from order 0, of `page << order` bytes
/// each), zone DMA left out. Saturates rather than overflow; a line that does not parse adds
/// nothing.
fn free_in_blocks(text: &[u8], page: usize, block: usize) -> u64 {
    let mut total: u64 = 0;
    for line in text.split(|&b| b == b'\n') {
        let mut fields = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        // Zone DMA's blocks serve no THP fault (the lowest 16 MiB, kept
        // for devices that need them).
        if fields.nth(2) != Some(b"zone".as_slice())
            || fields.next().is_none_or(|zone| zone == b"DMA")
        {
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
        // Orders 9 and 10 with 4 KiB pages: 2 and 4 MiB blocks; zone DMA
        // left out.
        let want = (2 + 600) * 2 * mib + (100 + 3100) * 4 * mib;
        assert_eq!(free_in_blocks(BUDDYINFO, 4096, HUGE_PAGE_2M), want);
        // Blocks of 4 MiB and more only.
        assert_eq!(
            free_in_blocks(BUDDYINFO, 4096, 4 << 20),
            (100 + 3100) * 4 * mib
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
        assert_eq!(f.granted.load(Relaxed), 3 * HUGE_PAGE_2M as u64);
    }

    #[test]
    fn huge_pages_are_cheap_with_a_huge_fault_a_low_mean_and_free_blocks() {
        let fast = Some(Fault {
            ns: 200_000,
            huge: true,
        });
        let gib = Some(1u64 << 30);
        assert_eq!(budget(fast, Some(200_000), gib, 0), Some(GRANT_PER_CHECK));
        // Half the free bytes, less blocks granted since the last check,
        // when that is less.
        let mib = |n: u64| n << 20;
        assert_eq!(budget(fast, Some(200_000), Some(mib(10)), 0), Some(mib(5)));
        assert_eq!(
            budget(fast, Some(200_000), Some(mib(10)), mib(2)),
            Some(mib(3))
        );
        assert_eq!(budget(fast, Some(200_000), gib, 1 << 40), Some(0));
        // A mean above 1 ms, a fault that took base pages, no fault, no
        // free memory counted: dear.
        assert_eq!(budget(fast, Some(SLOW_NS + 1), gib, 0), None);
        let base = Some(Fault {
            ns: 200_000,
            huge: false,
        });
        assert_eq!(budget(base, Some(200_000), gib, 0), None);
        assert_eq!(budget(None, None, gib, 0), None);
        assert_eq!(budget(fast, Some(200_000), None, 0), None);
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
        f.open_files();
        let cheap = f.run(&c).expect("the first check runs");
        assert_eq!(c.get(Count::HugeChecks), 1);
        assert_eq!(c.get(Count::HugeChecksDear), u64::from(!cheap));
        // A cheap verdict holds for 250 ms (a check descheduled longer may
        // have expired already); a dear one grants nothing.
        if !cheap {
            assert!(!f.grant(1));
        }
        // Not again within 50 ms, unless the check itself took that long.
        let again = f.run(&c);
        assert!(again.is_none() || c.get(Count::HugeChecks) == 2);
        // No system call of the check is the engine's.
        assert_eq!(c.get(Count::Mmap) + c.get(Count::Madvise), 0);
    }
}
