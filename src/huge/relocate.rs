//! Moving a block whose growth cannot happen in place: its pages move with
//! `mremap(MREMAP_FIXED | MREMAP_DONTUNMAP)` (`sys::LINUX_MREMAP_DONTUNMAP`),
//! leaving the old place mapped and empty; a range of several VMAs moves in
//! halves before `sys::LINUX_MREMAP_MULTI_VMA`, and after it a move that
//! fails midway is completed by [`complete`]. Copied where the kernel
//! cannot move (hugetlb, older kernels).
//! [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#growth-and-moves).

use super::os;
use super::stats::Counters;
use crate::sys;
use std::ptr::NonNull;

/// How a block's bytes reached their new place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Every page moved with `mremap`.
    Pages,
    /// Some or all of it was copied.
    Copied,
}

/// Move the `len` bytes at `src` onto `dst` (the caller's, committed, not
/// overlapping `src`, reading zero: see [`complete`]), in pieces of whole
/// `unit`s; `pages` is
/// false when the kernel cannot move them (hugetlb at either end), which
/// copies all. Afterwards `dst` holds the bytes; `src` holds nothing the
/// caller may count on (moved pages read zero, copied ones their old bytes).
pub(crate) fn relocate(
    c: &Counters,
    src: NonNull<u8>,
    dst: NonNull<u8>,
    len: usize,
    unit: usize,
    pages: bool,
) -> Moved {
    if !pages || !sys::linux_at_least(sys::LINUX_MREMAP_DONTUNMAP) {
        copy(c, src, dst, len);
        return Moved::Copied;
    }
    if move_range(c, src, dst, len, unit) {
        Moved::Pages
    } else {
        Moved::Copied
    }
}

/// Move one range; `true` when every page moved.
fn move_range(c: &Counters, src: NonNull<u8>, dst: NonNull<u8>, len: usize, unit: usize) -> bool {
    let multi = sys::linux_at_least(sys::LINUX_MREMAP_MULTI_VMA);
    match os::move_pages(c, src, len, dst) {
        Ok(()) => true,
        // Several VMAs, nothing moved: halves.
        Err(e) if e.raw_os_error() == Some(libc::EFAULT) && len > unit && !multi => {
            let half = (len / unit / 2) * unit;
            let at = |p: NonNull<u8>| NonNull::new(p.as_ptr().wrapping_add(half));
            let (Some(src2), Some(dst2)) = (at(src), at(dst)) else {
                copy(c, src, dst, len);
                return false;
            };
            let first = move_range(c, src, dst, half, unit);
            let second = move_range(c, src2, dst2, len - half, unit);
            first && second
        }
        Err(_) if multi => {
            complete(c, src, dst, len);
            false
        }
        Err(_) => {
            copy(c, src, dst, len);
            false
        }
    }
}

/// After a move that failed midway (Linux 6.17 and later): copy every page
/// of the source that still reads non-zero, which did not move; the others
/// either moved (`dst` has them) or are zero, as `dst` is there.
fn complete(c: &Counters, src: NonNull<u8>, dst: NonNull<u8>, len: usize) {
    let _ = os::commit(c, dst, len);
    let page = sys::page_size();
    for off in (0..len).step_by(page) {
        // SAFETY: `off + page <= len` (both lengths are whole pages): a page
        // of each range, the caller's, disjoint; `src` is readable (a live
        // block's, as for glibc's copy), `dst` read-write.
        unsafe {
            let (s, d) = (src.as_ptr().add(off), dst.as_ptr().add(off));
            let words = std::slice::from_raw_parts(s.cast::<u64>(), page / 8);
            if words.iter().any(|&w| w != 0) {
                std::ptr::copy_nonoverlapping(s, d, page);
            }
        }
    }
}

/// Copy `len` bytes from `src` to `dst`, made read-write first (retained
/// units the program freed read-only are writable again).
fn copy(c: &Counters, src: NonNull<u8>, dst: NonNull<u8>, len: usize) {
    let _ = os::commit(c, dst, len);
    // SAFETY: both ranges are the caller's, `len` bytes each, disjoint;
    // `src` is a live block's (readable, as in glibc's copy), `dst` was
    // just made read-write.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), len) };
}
