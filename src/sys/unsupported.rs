//! The operations that exist only on Linux, for every other Unix: each
//! fails with `ENOTSUP` (after counting the call for fault injection), except
//! `posix_fadvise`, whose advice is optional anyway.

use super::fault::{inject, Op};
use super::files::Fd;
use super::mappings::{Advice, HugetlbSize};
use super::process::PageRun;
use std::io;
use std::ptr::NonNull;

fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOTSUP))
}

/// No hugetlb outside Linux.
pub(crate) fn map_hugetlb(_len: usize, _size: HugetlbSize) -> io::Result<NonNull<u8>> {
    unsupported()
}

/// Only `MADV_DONTNEED` is portable.
pub(super) fn advice_raw(advice: Advice) -> io::Result<libc::c_int> {
    match advice {
        Advice::DontNeed => Ok(libc::MADV_DONTNEED),
        _ => unsupported(),
    }
}

/// `mincore` residency is read only on Linux.
pub(crate) fn resident_pages(_addr: NonNull<u8>, _len: usize) -> io::Result<usize> {
    unsupported()
}

/// `mremap` is Linux-only.
pub(crate) fn mremap_fixed(
    _old: NonNull<u8>,
    _len: usize,
    _dst: NonNull<u8>,
    _source: super::mappings::Source,
) -> io::Result<()> {
    inject(Op::Mremap)?;
    unsupported()
}

/// `mbind` is Linux-only.
pub(crate) fn mbind(_addr: *mut u8, _len: usize, _node: u32) -> io::Result<()> {
    inject(Op::Mbind)?;
    unsupported()
}

/// Read-ahead advice is skipped.
pub(crate) fn fadvise_sequential(_fd: &Fd, _offset: u64, _len: u64) -> io::Result<()> {
    inject(Op::Fadvise)?;
    Ok(())
}

/// `PAGEMAP_SCAN` is Linux-only (callers fall back to `/proc/self/smaps`).
pub(crate) fn pagemap_scan(_start: u64, _end: u64, _f: impl FnMut(PageRun)) -> io::Result<()> {
    unsupported()
}
