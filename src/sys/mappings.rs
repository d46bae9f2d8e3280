//! Memory mappings: `mmap`, `munmap`, `madvise`, `mremap`, `mbind`, `mlock`.

use super::fault::{inject, Op};
use super::{cvt, page_size, round_up};
use std::io;
use std::ptr::NonNull;

/// Which hugetlb page size a `MAP_HUGETLB` mapping asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HugetlbSize {
    Size2M,
    Size1G,
}

/// Protection of a new mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prot {
    None,
    #[cfg(target_os = "linux")]
    Read,
    ReadWrite,
}

impl Prot {
    fn bits(self) -> libc::c_int {
        match self {
            Prot::None => libc::PROT_NONE,
            #[cfg(target_os = "linux")]
            Prot::Read => libc::PROT_READ,
            Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

pub(super) fn mmap_raw(
    addr: *mut u8,
    len: usize,
    prot: Prot,
    flags: libc::c_int,
    fd: libc::c_int,
    offset: u64,
) -> io::Result<NonNull<u8>> {
    inject(Op::Mmap)?;
    // POSIX: a zero-length mmap fails with EINVAL; callers never ask for one,
    // but say so here rather than let the kernel decide.
    if len == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: without MAP_FIXED the kernel picks an unused range, so no
    // existing memory is affected. With MAP_FIXED (`map_file_fixed_readonly`
    // only) `addr..+len` lies inside a reservation that the caller owns,
    // which the new mapping replaces (or, failing, may leave unmapped: see
    // there).
    let p = unsafe { libc::mmap(addr.cast(), len, prot.bits(), flags, fd, offset) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // mmap never returns null on success unless asked for address 0 with
    // MAP_FIXED, which this crate never does.
    NonNull::new(p.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Anonymous private hugetlb memory of `len` bytes (a multiple of the page
/// size `size`). Fails with `ENOMEM` when no pages of that size are free;
/// `MAP_NORESERVE` is deliberately not used, since it would turn that failure
/// into a SIGBUS at first touch.
#[cfg(target_os = "linux")]
pub(crate) fn map_hugetlb(len: usize, size: HugetlbSize) -> io::Result<NonNull<u8>> {
    let size_flag = match size {
        HugetlbSize::Size2M => libc::MAP_HUGE_2MB,
        HugetlbSize::Size1G => libc::MAP_HUGE_1GB,
    };
    mmap_raw(
        std::ptr::null_mut(),
        len,
        Prot::ReadWrite,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | size_flag,
        -1,
        0,
    )
}

/// Reserve `len` bytes of address space aligned to `align` (a power of two, at
/// least the base page size) with no access and no commit charge
/// (`PROT_NONE`). The caller later opens parts of it with
/// [`commit_read_write`] or maps over them with the `*_fixed` functions.
/// Over-reserves by `align` and trims both ends.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn reserve_aligned(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    map_aligned(len, align, Prot::None).map(|m| m.ptr)
}

/// An aligned mapping from [`map_aligned`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aligned {
    pub(crate) ptr: NonNull<u8>,
    /// The `munmap` calls that trimmed the over-reservation (0 to 2), for
    /// callers that count their system calls.
    pub(crate) trims: u32,
}

/// Anonymous private memory of `len` bytes with protection `prot`, its
/// start aligned to `align` (a power of two): over-reserve by `align`, then
/// unmap the unaligned head and the tail.
pub(crate) fn map_aligned(len: usize, align: usize, prot: Prot) -> io::Result<Aligned> {
    let page = page_size();
    let align = align.max(page);
    let len = round_up(len, page).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let over = len
        .checked_add(align - page)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // No MAP_NORESERVE: a PROT_NONE private mapping is not charged against
    // the commit limit anyway (Linux charges writable private mappings only:
    // `accountable_mapping`), and without the flag the parts
    // that `commit_read_write` opens are charged as fresh mappings are.
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let raw = mmap_raw(std::ptr::null_mut(), over, prot, flags, -1, 0)?;
    let start = raw.as_ptr() as usize;
    // The over-reservation ends inside the address space, so this cannot
    // overflow; still, never panic on an allocation path.
    let Some(aligned) = round_up(start, align) else {
        let _ = munmap_best_effort(raw.as_ptr(), over);
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    };
    let head = aligned - start;
    let tail = over - head - len;
    let trims = u32::from(head > 0) + u32::from(tail > 0);
    // Trimming cannot be undone halfway: if an unmap fails, release the whole
    // over-reservation and report the error, so the caller holds nothing.
    let trim = (|| {
        if head > 0 {
            munmap(raw.as_ptr(), head)?;
        }
        if tail > 0 {
            // SAFETY: aligned + len is inside the over-reserved mapping.
            munmap(unsafe { (aligned as *mut u8).add(len) }, tail)?;
        }
        Ok(())
    })();
    if let Err(e) = trim {
        let _ = munmap_best_effort(raw.as_ptr(), over);
        return Err(e);
    }
    // SAFETY: aligned >= start > 0.
    let ptr = unsafe { NonNull::new_unchecked(aligned as *mut u8) };
    Ok(Aligned { ptr, trims })
}

/// Make `addr..addr+len` private anonymous read-write memory in place
/// (`mprotect`): a part of a reservation from [`reserve_aligned`] that the
/// caller owns (the arena's mixed mode, a huge-page span's committed
/// units), or a range of the caller's whose protection a program may have
/// changed (a purged span unit). The range is charged against the commit
/// limit as a fresh mapping of that length would be (`mprotect_fixup` in
/// `mm/mprotect.c`), so an overcommit refusal is `ENOMEM` here; a range
/// already read-write is left as it is. Nothing is unmapped, so no failure
/// can leave a hole in the reservation: on error the range is still the
/// caller's (part of it possibly read-write), and releasing the
/// reservation releases it.
pub(crate) fn commit_read_write(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    inject(Op::Mprotect)?;
    // SAFETY: the caller owns the range, and no reference points into it
    // that a change of protection could invalidate: opening it to reads and
    // writes changes no byte any code can see.
    cvt(unsafe { libc::mprotect(addr.as_ptr().cast(), len, Prot::ReadWrite.bits()) })
}

/// Replace `addr..addr+len` (inside a reservation the caller owns, both
/// 2 MiB aligned) with anonymous private 2 MiB hugetlb memory (the arena's
/// mixed-mode runtime region when hugetlb is required). Fails with `ENOMEM`
/// when not enough pages are free.
///
/// The pages are mapped where the kernel finds room and then moved onto
/// the reservation (`mremap` with `MREMAP_FIXED`), never mapped with
/// `MAP_FIXED` in place: a `MAP_FIXED` hugetlb `mmap` that fails for want of
/// pages has already unmapped the range (seen on Linux 6.18), and another
/// thread's new mapping could land in that hole, to be unmapped with the
/// reservation by its owner. `mremap` checks the map count before it
/// unmaps the destination (`mremap_to` in `mm/mremap.c`, since Linux 5.1),
/// and hugetlb mappings move since Linux 5.16
/// ([`LINUX_HUGETLB_MREMAP`](super::LINUX_HUGETLB_MREMAP)). Before 5.16 the
/// move would fail with `EINVAL` after the destination is unmapped, which
/// would leave that hole: there this fails with `EINVAL` before mapping.
#[cfg(target_os = "linux")]
pub(crate) fn map_hugetlb_fixed(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    if !super::linux_at_least(super::LINUX_HUGETLB_MREMAP) {
        // The move would fail after unmapping the destination: refuse first.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let pages = map_hugetlb(len, HugetlbSize::Size2M)?;
    mremap_fixed(pages, len, addr, Source::Unmapped).inspect_err(|_| {
        let _ = munmap_best_effort(pages.as_ptr(), len);
    })
}

/// Map `len` bytes of `fd` from `offset` read-only where the kernel finds
/// room and unmap them again: whether [`map_file_fixed_readonly`] of the
/// same range can succeed, asked before a reservation exists. A file whose
/// `mmap` hook refuses the mapping (`ENODEV` from a sysfs attribute, say)
/// fails here, where the refusal unmaps nothing; refused under `MAP_FIXED`
/// it would leave a hole in the reservation (`vms_abort_munmap_vmas` in
/// `mm/vma.c`; earlier releases unmapped first as well). Linux-only, as
/// mixed mode.
#[cfg(target_os = "linux")]
pub(crate) fn probe_file_readonly(len: usize, fd: libc::c_int, offset: u64) -> io::Result<()> {
    let p = mmap_raw(
        std::ptr::null_mut(),
        len,
        Prot::Read,
        libc::MAP_PRIVATE,
        fd,
        offset,
    )?;
    let _ = munmap_best_effort(p.as_ptr(), len);
    Ok(())
}

/// Replace `addr..addr+len` (inside a reservation the caller owns) with a
/// private read-only view of `fd` starting at `offset` (page aligned). Pages
/// of the view past the end of the file raise SIGBUS when touched: callers map
/// only whole pages that the file covers, and first ask
/// [`probe_file_readonly`] whether the file maps at all, since a `MAP_FIXED`
/// mapping the file's `mmap` hook refuses leaves the range unmapped. What
/// can still fail here after the range is unmapped is a kernel allocation.
/// Mapped in place, not moved onto the range as hugetlb pages are, so that
/// the weights never take their size in address space twice (`RLIMIT_AS`).
/// Linux-only, as mixed mode.
#[cfg(target_os = "linux")]
pub(crate) fn map_file_fixed_readonly(
    addr: NonNull<u8>,
    len: usize,
    fd: libc::c_int,
    offset: u64,
) -> io::Result<()> {
    mmap_raw(
        addr.as_ptr(),
        len,
        Prot::Read,
        libc::MAP_PRIVATE | libc::MAP_FIXED,
        fd,
        offset,
    )
    .map(|_| ())
}

/// Unmap `addr..addr+len`.
pub(crate) fn munmap(addr: *mut u8, len: usize) -> io::Result<()> {
    inject(Op::Munmap)?;
    // SAFETY: the caller owns the range; munmap of unmapped pages is harmless
    // to other memory. hugetlb ranges need lengths in whole huge pages, which
    // callers guarantee (else EINVAL and the mapping stays).
    cvt(unsafe { libc::munmap(addr.cast(), len) })
}

/// Unmap without fault injection: for cleanup paths (Drop, error unwinding)
/// where an injected failure would only simulate a leak that cannot happen.
pub(crate) fn munmap_best_effort(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: as for `munmap`.
    cvt(unsafe { libc::munmap(addr.cast(), len) })
}

/// `madvise` advice used by the crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Advice {
    /// `MADV_HUGEPAGE`: back this range with THP when possible.
    HugePage,
    /// `MADV_NOHUGEPAGE`: never back this range with THP (also with THP
    /// `always`); khugepaged leaves it alone.
    NoHugePage,
    /// `MADV_POPULATE_WRITE` (Linux 5.14): prefault writable pages, reporting failure.
    PopulateWrite,
    /// `MADV_DONTNEED`: drop the pages; anonymous memory reads back as zero.
    DontNeed,
    /// `MADV_DONTDUMP`: leave the range out of core dumps.
    DontDump,
    /// `MADV_COLLAPSE` ([`LINUX_MADV_COLLAPSE`](super::LINUX_MADV_COLLAPSE)):
    /// copy the range's pages into huge pages now, synchronously (direct
    /// reclaim and compaction included), whatever the THP sysfs modes say;
    /// `EINVAL` for a range advised `MADV_NOHUGEPAGE`, `EAGAIN` when a page
    /// was busy, `ENOMEM` when no huge page could be had.
    Collapse,
}

/// `MADV_COLLAPSE` of `linux/mman.h` (Linux 6.1), which libc defines for
/// glibc targets only.
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

/// The `MADV_*` value of `advice`.
#[cfg(target_os = "linux")]
pub(super) fn advice_raw(advice: Advice) -> io::Result<libc::c_int> {
    Ok(match advice {
        Advice::HugePage => libc::MADV_HUGEPAGE,
        Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
        Advice::PopulateWrite => libc::MADV_POPULATE_WRITE,
        Advice::DontNeed => libc::MADV_DONTNEED,
        Advice::DontDump => libc::MADV_DONTDUMP,
        Advice::Collapse => MADV_COLLAPSE,
    })
}

/// How many of the base pages of `addr..addr + len` are resident
/// (`mincore(2)`), for a range of at most 2 MiB of 4 KiB pages: the vector
/// lives on the stack.
#[cfg(target_os = "linux")]
pub(crate) fn resident_pages(addr: NonNull<u8>, len: usize) -> io::Result<usize> {
    const MAX_PAGES: usize = super::HUGE_PAGE_2M / 4096;
    let pages = len.div_ceil(super::page_size());
    if pages > MAX_PAGES {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut vec = [0u8; MAX_PAGES];
    // SAFETY: `vec` holds a byte for each of the range's pages; mincore
    // only reads the page tables of the caller's range.
    cvt(unsafe { libc::mincore(addr.as_ptr().cast(), len, vec.as_mut_ptr()) })?;
    Ok(vec[..pages].iter().filter(|&&b| b & 1 != 0).count())
}

/// `madvise(addr, len, advice)`.
pub(crate) fn madvise(addr: *mut u8, len: usize, advice: Advice) -> io::Result<()> {
    inject(Op::Madvise)?;
    let raw = super::advice_raw(advice)?;
    loop {
        // SAFETY: advice about a range the caller owns; DONTNEED zeroes it,
        // which callers request only for memory no live reference points into.
        match cvt(unsafe { libc::madvise(addr.cast(), len, raw) }) {
            // POPULATE_WRITE may be interrupted by a signal.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            r => return r,
        }
    }
}

/// `MREMAP_DONTUNMAP` of `linux/mman.h` (Linux 5.7), which libc 0.2.143
/// lacks.
#[cfg(target_os = "linux")]
const MREMAP_DONTUNMAP: libc::c_int = 4;

/// What [`mremap_fixed`] leaves at the source range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Nothing: the source range is unmapped, as `mremap` does by default.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Unmapped,
    /// The source mapping, with no pages (`MREMAP_DONTUNMAP`,
    /// [`LINUX_MREMAP_DONTUNMAP`](super::LINUX_MREMAP_DONTUNMAP)): private
    /// anonymous memory there reads zero and faults in afresh. The kernel
    /// refuses it (`EINVAL`) for hugetlb mappings and before Linux 5.7.
    KeptEmpty,
}

/// Move the `len` bytes of the mapping at `old` (one VMA, or a part of
/// one: `EFAULT` when the range crosses a VMA boundary) onto `dst` with
/// `MREMAP_MAYMOVE | MREMAP_FIXED`, which replaces whatever the caller had
/// mapped at `dst..dst+len` (a range of its own). The pages move without a
/// copy, with their VMA's flags. On error nothing moved.
#[cfg(target_os = "linux")]
pub(crate) fn mremap_fixed(
    old: NonNull<u8>,
    len: usize,
    dst: NonNull<u8>,
    source: Source,
) -> io::Result<()> {
    inject(Op::Mremap)?;
    let keep = match source {
        Source::Unmapped => 0,
        Source::KeptEmpty => MREMAP_DONTUNMAP,
    };
    // SAFETY: the caller owns the old range and the destination; no
    // reference into the old range outlives this, and the destination's
    // old contents are the caller's to discard.
    let p = unsafe {
        libc::mremap(
            old.as_ptr().cast(),
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | keep,
            dst.as_ptr().cast::<libc::c_void>(),
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drop the pages of `addr..addr+len`, a private anonymous range of the
/// caller's: it reads zero afterwards, and its pages fault in afresh. On
/// Linux `MADV_DONTNEED` (madvise(2)), which refuses (`EINVAL`) a range
/// with `mlock`ed pages and (`EPERM`) a sealed one; elsewhere a fresh
/// anonymous mapping over the range (`MAP_FIXED`, which those systems apply
/// under the map's lock), since their `MADV_DONTNEED` need not zero.
pub(crate) fn purge(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    return madvise(addr.as_ptr(), len, Advice::DontNeed);
    #[cfg(not(target_os = "linux"))]
    return mmap_raw(
        addr.as_ptr(),
        len,
        Prot::ReadWrite,
        libc::MAP_PRIVATE | libc::MAP_ANON | libc::MAP_FIXED,
        -1,
        0,
    )
    .map(|_| ());
}

/// Bind `addr..addr+len` to NUMA node `node` (`MPOL_BIND`, `MPOL_MF_MOVE`).
/// libc has no wrapper for `mbind`, so this is the raw system call.
#[cfg(target_os = "linux")]
pub(crate) fn mbind(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    inject(Op::Mbind)?;
    // libc 0.2 lacks MPOL_MF_MOVE (linux/mempolicy.h: move pages owned only
    // by this process).
    const MPOL_MF_MOVE: libc::c_ulong = 1 << 1;
    const BITS: usize = 1024;
    if node as usize >= BITS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut mask = [0 as libc::c_ulong; BITS / (8 * std::mem::size_of::<libc::c_ulong>())];
    let word_bits = 8 * std::mem::size_of::<libc::c_ulong>();
    mask[node as usize / word_bits] |= 1 << (node as usize % word_bits);
    // SAFETY: `mask` outlives the call and holds BITS bits; the range is owned
    // by the caller.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            libc::c_long::from(libc::MPOL_BIND),
            mask.as_ptr(),
            BITS as libc::c_ulong + 1,
            MPOL_MF_MOVE,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Lock `addr..addr+len` into RAM (`mlock`); counts against `RLIMIT_MEMLOCK`.
pub(crate) fn mlock(addr: *mut u8, len: usize) -> io::Result<()> {
    inject(Op::Mlock)?;
    // SAFETY: mlock only changes residency of a range the caller owns.
    cvt(unsafe { libc::mlock(addr.cast(), len) })
}

/// Unlock `addr..addr+len` (`munlock`): its pages may be swapped and
/// purged again.
pub(crate) fn munlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    inject(Op::Munlock)?;
    // SAFETY: munlock only changes residency of a range the caller owns.
    cvt(unsafe { libc::munlock(addr.as_ptr().cast(), len) })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Whether every page of `addr..addr+len` is mapped: `msync(MS_ASYNC)`
    /// fails with `ENOMEM` when part of the range is not (msync(2)).
    fn is_mapped(addr: *mut u8, len: usize) -> bool {
        // SAFETY: MS_ASYNC touches no page; an unmapped range is reported.
        unsafe { libc::msync(addr.cast(), len, libc::MS_ASYNC) == 0 }
    }

    /// More 2 MiB hugetlb pages than the pool and its surplus can give.
    fn beyond_pool() -> usize {
        let read = |f: &str| -> usize {
            std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{f}"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        (read("nr_hugepages") + read("nr_overcommit_hugepages") + 1) * crate::sys::HUGE_PAGE_2M
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap")]
    fn a_hugetlb_region_that_finds_no_pages_leaves_the_reservation_whole() {
        let len = beyond_pool();
        let res = reserve_aligned(len, crate::sys::HUGE_PAGE_2M).unwrap();
        let e = map_hugetlb_fixed(res, len).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
        // A hole here would let another thread's mapping in, which the
        // reservation's owner would then unmap.
        assert!(is_mapped(res.as_ptr(), len), "the reservation has a hole");
        munmap(res.as_ptr(), len).unwrap();
    }
}
