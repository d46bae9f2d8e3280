//! The engine's system calls: `sys` calls counted by kind
//! ([`Syscalls`](super::Syscalls)).

use super::stats::{Count, Counters};
use crate::sys::{self, Advice, HugetlbSize, Prot, Source};
use std::io;
use std::ptr::NonNull;

/// Anonymous memory of `len` bytes aligned to `align` with protection
/// `prot` (`PROT_NONE` reserves address space only).
pub(crate) fn map_aligned(
    c: &Counters,
    len: usize,
    align: usize,
    prot: Prot,
) -> io::Result<NonNull<u8>> {
    c.add(Count::Mmap, 1);
    let m = sys::map_aligned(len, align, prot)?;
    c.add(Count::Munmap, u64::from(m.trims));
    Ok(m.ptr)
}

/// Private anonymous hugetlb memory of `len` bytes.
pub(crate) fn map_hugetlb(c: &Counters, len: usize, size: HugetlbSize) -> io::Result<NonNull<u8>> {
    c.add(Count::Mmap, 1);
    sys::map_hugetlb(len, size)
}

/// `munmap`.
pub(crate) fn unmap(c: &Counters, p: NonNull<u8>, len: usize) -> io::Result<()> {
    c.add(Count::Munmap, 1);
    sys::munmap(p.as_ptr(), len)
}

/// `madvise` with `advice`.
pub(crate) fn advise(c: &Counters, p: NonNull<u8>, len: usize, advice: Advice) -> io::Result<()> {
    c.add(Count::Madvise, 1);
    sys::madvise(p.as_ptr(), len, advice)
}

/// `mprotect` to read-write: commit reserved units, or make purged ones
/// writable again.
pub(crate) fn commit(c: &Counters, p: NonNull<u8>, len: usize) -> io::Result<()> {
    c.add(Count::Mprotect, 1);
    sys::commit_read_write(p, len)
}

/// Drop the pages of a range ([`sys::purge`]): it reads zero afterwards.
pub(crate) fn purge(c: &Counters, p: NonNull<u8>, len: usize) -> io::Result<()> {
    let kind = if cfg!(target_os = "linux") {
        Count::Madvise
    } else {
        Count::Mmap
    };
    c.add(kind, 1);
    sys::purge(p, len)
}

/// `munlock`.
pub(crate) fn munlock(c: &Counters, p: NonNull<u8>, len: usize) -> io::Result<()> {
    c.add(Count::Munlock, 1);
    sys::munlock(p, len)
}

/// Move `len` bytes of pages from `src` onto `dst` with `mremap`, leaving
/// the source mapped and empty ([`Source::KeptEmpty`]).
pub(crate) fn move_pages(
    c: &Counters,
    src: NonNull<u8>,
    len: usize,
    dst: NonNull<u8>,
) -> io::Result<()> {
    c.add(Count::Mremap, 1);
    sys::mremap_fixed(src, len, dst, Source::KeptEmpty)
}
