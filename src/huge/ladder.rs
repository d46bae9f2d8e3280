//! The tier ladder: [`Ladder::map`] walks hugetlb, THP and normal pages
//! for a mapping of its own ([`HugeRegion`](super::HugeRegion), the arena);
//! its state is the hugetlb back-off, which the engine's spans follow too
//! ([`Ladder::hugetlb_now`]). No allocation, lock, panic or print, except a
//! parallel prefault ([`HugeOptions::populate_threads`]).

use super::error::HugeError;
use super::options::HugeOptions;
use super::os;
use super::stats::{Count, Counters};
use crate::env;
use crate::prefault::populate;
use crate::sys::{self, Advice, HugetlbSize, Prot, HUGE_PAGE_1G, HUGE_PAGE_2M};
use crate::tier::{self, Backing};
use std::io;
use std::ops::ControlFlow::{self, Break, Continue};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// One mapping produced by the ladder.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub ptr: NonNull<u8>,
    pub mapped_len: usize,
    pub backing: Backing,
    /// Page size of the backing: 2 MiB or 1 GiB for hugetlb, else the base page.
    pub page_size: usize,
}

/// What a rung does: `Break` ends the walk with a mapping or an error,
/// `Continue` falls to the next rung with the error of the last attempt.
type Rung = ControlFlow<Result<Mapping, HugeError>, Option<io::Error>>;

/// The ladder's state: after a failed hugetlb `mmap`, the tier is skipped
/// for a back-off period ([`env::hugetlb_backoff_ms`], default 1000 ms)
/// instead of paying a failed system call on every allocation, as
/// mimalloc does.
pub(crate) struct Ladder {
    /// Monotonic time (ns) until which hugetlb is skipped; 0: not backing off.
    retry_at_ns: AtomicU64,
}

impl Ladder {
    pub(crate) const fn new() -> Ladder {
        Ladder {
            retry_at_ns: AtomicU64::new(0),
        }
    }

    fn backing_off(&self) -> bool {
        let until = self.retry_at_ns.load(Ordering::Relaxed);
        until != 0 && sys::monotonic_ns() < until
    }

    fn start_backoff(&self) {
        let backoff_ns = env::hugetlb_backoff_ms().saturating_mul(1_000_000);
        let until = sys::monotonic_ns().saturating_add(backoff_ns);
        self.retry_at_ns.store(until.max(1), Ordering::Relaxed);
    }

    /// Forget a previous hugetlb failure.
    pub(crate) fn reset(&self) {
        self.retry_at_ns.store(0, Ordering::Relaxed);
    }

    /// Whether a fresh block tries the hugetlb tier now (`CKALLOC_HUGETLB`
    /// on, no back-off); counts a skip.
    pub(crate) fn hugetlb_now(&self, c: &Counters) -> bool {
        if !env::hugetlb_allowed() {
            return false;
        }
        if self.backing_off() {
            c.add(Count::HugetlbSkipped, 1);
            return false;
        }
        true
    }

    /// A hugetlb `mmap` failed: count it and back off.
    pub(crate) fn hugetlb_failed(&self, c: &Counters) {
        c.add(Count::HugetlbFallbacks, 1);
        self.start_backoff();
    }
}

/// A checked request: `bytes` (non-zero) rounded up to 2 MiB (`len_2m`),
/// aligned to `align` (a power of two, at least 2 MiB; aligning needs up to
/// `align` bytes of slack in the address space).
struct Request {
    bytes: usize,
    align: usize,
    len_2m: usize,
}

impl Request {
    fn new(bytes: usize, align: usize) -> Result<Request, HugeError> {
        if bytes == 0 {
            return Err(HugeError::ZeroSize);
        }
        if !align.is_power_of_two() {
            return Err(HugeError::BadAlignment { align });
        }
        let align = align.max(HUGE_PAGE_2M);
        let len_2m = sys::round_up(bytes, HUGE_PAGE_2M)
            .filter(|l| {
                l.checked_add(align)
                    .is_some_and(|n| n <= isize::MAX as usize)
            })
            .ok_or(HugeError::TooLarge { requested: bytes })?;
        Ok(Request {
            bytes,
            align,
            len_2m,
        })
    }
}

impl Ladder {
    /// Map `bytes` (rounded up to 2 MiB, or 1 GiB for 1 GiB hugetlb pages)
    /// aligned to at least `align` bytes, walking the tier ladder: hugetlb,
    /// then THP, then normal pages (see the [module docs](super)). Never
    /// allocates.
    pub(crate) fn map(
        &self,
        c: &Counters,
        bytes: usize,
        align: usize,
        opts: &HugeOptions,
    ) -> Result<Mapping, HugeError> {
        let req = Request::new(bytes, align)?;
        let hugetlb_err = match self.hugetlb_rung(c, &req, opts) {
            Break(done) => return done,
            Continue(err) => err,
        };
        if opts.require == Backing::Hugetlb {
            return Err(HugeError::TierUnavailable {
                requested: bytes,
                required: Backing::Hugetlb,
                source: hugetlb_err,
            });
        }
        thp_or_normal_rung(c, &req, opts)
    }

    /// Rung 1: hugetlb pages, 1 GiB pages first when allowed, then 2 MiB
    /// pages. hugetlb mappings are aligned to their page size, so larger
    /// alignments skip the size. Skipped when `CKALLOC_HUGETLB` is off or
    /// during the back-off after a failure, unless the options require
    /// hugetlb.
    fn hugetlb_rung(&self, c: &Counters, req: &Request, opts: &HugeOptions) -> Rung {
        let required = opts.require == Backing::Hugetlb;
        if !opts.hugetlb || !(required || self.hugetlb_now(c)) {
            return Continue(None);
        }
        let mut err = None;
        let len_1g = sys::round_up(req.bytes, HUGE_PAGE_1G)
            .filter(|&l| opts.allow_1gib && l <= isize::MAX as usize);
        let sizes = [
            (len_1g, HugetlbSize::Size1G, HUGE_PAGE_1G),
            (Some(req.len_2m), HugetlbSize::Size2M, HUGE_PAGE_2M),
        ];
        for (len, size, page) in sizes {
            let Some(len) = len.filter(|_| req.align <= page) else {
                continue;
            };
            match os::map_hugetlb(c, len, size) {
                Ok(p) => return Break(finish(c, p, len, Backing::Hugetlb, page, opts)),
                // Only a 2 MiB failure backs off: 1 GiB pages are rarer.
                Err(e) if page == HUGE_PAGE_2M => {
                    self.hugetlb_failed(c);
                    err = Some(e);
                }
                Err(e) => {
                    c.add(Count::HugetlbFallbacks, 1);
                    err = Some(e);
                }
            }
        }
        Continue(err)
    }
}

/// Rungs 2 and 3: one 2 MiB-aligned anonymous mapping, advised
/// `MADV_HUGEPAGE` when THP is enabled (rung 2), else left as normal pages
/// (rung 3). Only the advice differs, so a failed mapping here is final.
fn thp_or_normal_rung(
    c: &Counters,
    req: &Request,
    opts: &HugeOptions,
) -> Result<Mapping, HugeError> {
    let len = req.len_2m;
    let ptr =
        os::map_aligned(c, len, req.align, Prot::ReadWrite).map_err(|source| HugeError::Map {
            requested: req.bytes,
            mapped_len: len,
            source,
        })?;
    let (backing, thp_err) = advise_thp(c, ptr, len);
    if backing < opts.require {
        let _ = os::unmap(c, ptr, len);
        return Err(HugeError::TierUnavailable {
            requested: req.bytes,
            required: opts.require,
            source: thp_err,
        });
    }
    finish(c, ptr, len, backing, sys::page_size(), opts)
}

/// `MADV_HUGEPAGE` on a fresh anonymous mapping when THP is enabled: the
/// tier it then has, and the error when the advice failed (the mapping
/// stays, as normal pages).
fn advise_thp(c: &Counters, ptr: NonNull<u8>, len: usize) -> (Backing, Option<io::Error>) {
    if !tier::thp_enabled() {
        return (Backing::Normal, None);
    }
    match os::advise(c, ptr, len, Advice::HugePage) {
        Ok(()) => (Backing::TransparentHuge, None),
        Err(e) => {
            c.add(Count::ThpFallbacks, 1);
            (Backing::Normal, Some(e))
        }
    }
}

/// Apply the post-mapping options (bind, prefault, lock, dump) and count the
/// mapping. On failure the mapping is released.
fn finish(
    c: &Counters,
    ptr: NonNull<u8>,
    mapped_len: usize,
    backing: Backing,
    page_size: usize,
    opts: &HugeOptions,
) -> Result<Mapping, HugeError> {
    // Prefault pieces never split a huge page between two threads.
    let granule = page_size.max(HUGE_PAGE_2M);
    if let Err(e) = apply_options(ptr, mapped_len, granule, opts) {
        let _ = os::unmap(c, ptr, mapped_len);
        return Err(e);
    }
    c.block(backing, mapped_len);
    Ok(Mapping {
        ptr,
        mapped_len,
        backing,
        page_size,
    })
}

/// Bind, prefault, lock and mark a fresh range as the options ask; the
/// pieces of a parallel prefault start and end on multiples of `granule`
/// (a power of two, the range's huge page size).
pub(crate) fn apply_options(
    ptr: NonNull<u8>,
    len: usize,
    granule: usize,
    opts: &HugeOptions,
) -> Result<(), HugeError> {
    if let Some(node) = opts.numa_node {
        sys::mbind(ptr.as_ptr(), len, node).map_err(|source| HugeError::Mbind { node, source })?;
    }
    if opts.populate {
        populate(ptr, len, granule, opts.populate_threads)
            .map_err(|source| HugeError::Populate { bytes: len, source })?;
    }
    if opts.mlock {
        sys::mlock(ptr.as_ptr(), len).map_err(|source| HugeError::Mlock { bytes: len, source })?;
    }
    if opts.dont_dump {
        // Only a hint for core dumps: failure loses nothing.
        let _ = sys::madvise(ptr.as_ptr(), len, Advice::DontDump);
    }
    Ok(())
}
