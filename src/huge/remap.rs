//! Resizing a [`CkHuge`] block: between the small allocator and the
//! mapping path, and between mappings (`mremap` in place, onto an aligned
//! reservation, or a copy), keeping the alignment and the short-tail advice.

use super::first_touch;
use super::global::{CkHuge, Fill, Via};
use super::retain::{self, MergedAge};
use super::stats::COUNTERS;
use super::unmap;
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use crate::tier::{self, Backing};
use allocator_api2::alloc::Layout;
use std::alloc::GlobalAlloc;
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

impl<S: GlobalAlloc> CkHuge<S> {
    /// Resize a block to `new_size` keeping `align`; `Fill::Zeroed` asks for
    /// the bytes from the old size to the new size to read as zero. Returns null
    /// and leaves the old block intact on failure.
    ///
    /// # Safety
    /// `ptr` was allocated by `self` with `Layout(old_size, align)`, and
    /// `new_size` is a valid `Layout` size for `align` (non-zero).
    pub(super) unsafe fn resize(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        fill: Fill,
        via: Via,
    ) -> *mut u8 {
        let copy = old_size.min(new_size);
        let zero_tail = |p: *mut u8, from: usize, to: usize| {
            if fill == Fill::Zeroed && to > from {
                // SAFETY: `p..p+to` is inside the resized block.
                unsafe { ptr::write_bytes(p.add(from), 0, to - from) };
            }
        };
        match (self.is_mapped(old_size), self.is_mapped(new_size)) {
            (false, false) => {
                // SAFETY: the caller's contract is `S`'s for small blocks.
                let layout = unsafe { Layout::from_size_align_unchecked(old_size, align) };
                // SAFETY: as above; `S` handles any alignment it gave.
                let p = unsafe { self.small.realloc(ptr, layout, new_size) };
                if !p.is_null() {
                    zero_tail(p, old_size, new_size);
                }
                p
            }
            (false, true) => {
                let p = self.map_block(new_size, align, fill, via);
                if !p.is_null() {
                    // SAFETY: both blocks hold at least `copy` bytes and do
                    // not overlap (another mapping). The tail reads as zero
                    // when `zero` asked for it (fresh or cleared block).
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, p, copy);
                        self.small
                            .dealloc(ptr, Layout::from_size_align_unchecked(old_size, align));
                    }
                }
                p
            }
            (true, false) => {
                // SAFETY: new_size is non-zero and valid for `align`.
                let p = unsafe {
                    self.small
                        .alloc(Layout::from_size_align_unchecked(new_size, align))
                };
                if !p.is_null() {
                    // SAFETY: disjoint blocks, `copy` bytes in both; this
                    // branch only shrinks, so there is no tail to zero.
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, p, copy);
                        self.release_block(ptr, old_size, via);
                    }
                }
                p
            }
            // SAFETY: forwarded contract.
            (true, true) => unsafe { self.remap(ptr, old_size, align, new_size, fill, via) },
        }
    }

    /// Grow a `GlobalAlloc` THP block of `old_len` bytes at `base` to
    /// `new_len` bytes with `mremap`, without copying. `mremap` resizes one
    /// VMA only (`EFAULT` across two), and such a block is two or more VMAs
    /// once its last 2 MiB page was advised `MADV_NOHUGEPAGE` (a short tail,
    /// or an earlier one grown past: advice does not merge VMAs whose pages
    /// were faulted in apart). So the last page is grown on its own, in place
    /// when the address space after the block is free; else a block of one
    /// VMA moves whole onto an aligned reservation (`MREMAP_FIXED`), and a
    /// block of several VMAs fails here and is copied by the caller. On error
    /// the block is as it was.
    fn grow_split(
        base: NonNull<u8>,
        old_len: usize,
        new_len: usize,
        align: usize,
    ) -> std::io::Result<NonNull<u8>> {
        let head = old_len - HUGE_PAGE_2M;
        // `head` is inside the block, so the pointer is never null.
        let Some(last) = NonNull::new(base.as_ptr().wrapping_add(head)) else {
            return Err(std::io::ErrorKind::InvalidInput.into());
        };
        if sys::mremap(last, HUGE_PAGE_2M, new_len - head, None).is_ok() {
            return Ok(base);
        }
        let dst = sys::reserve_aligned(new_len, align)?;
        sys::mremap(base, old_len, new_len, Some(dst)).inspect_err(|_| {
            let _ = sys::munmap_best_effort(dst.as_ptr(), new_len);
        })
    }

    /// Grow the mapping `base` of `old_len` bytes to `new_len` (both
    /// multiples of 2 MiB) for a block of `new_size` bytes aligned to
    /// `align`: 1. in place, when the address space after it is free; 2.
    /// moved onto an aligned reservation with `MREMAP_FIXED`. hugetlb
    /// mappings refuse both (`EINVAL`). A `GlobalAlloc` block on THP may be
    /// two VMAs (see `grow_split`). The grown block is advised for its tier
    /// and counted (`record_grow`). On error the mapping is as it was.
    fn grow_mapping(
        &self,
        base: NonNull<u8>,
        old_len: usize,
        new_len: usize,
        align: usize,
        new_size: usize,
        via: Via,
    ) -> std::io::Result<NonNull<u8>> {
        let align = align.max(HUGE_PAGE_2M);
        let p = if via == Via::GlobalAlloc && tier::anon_tier() == Backing::TransparentHuge {
            Self::grow_split(base, old_len, new_len, align)
        } else {
            sys::mremap(base, old_len, new_len, None).or_else(|_| {
                let dst = sys::reserve_aligned(new_len, align)?;
                sys::mremap(base, old_len, new_len, Some(dst)).inspect_err(|_| {
                    let _ = sys::munmap_best_effort(dst.as_ptr(), new_len);
                })
            })
        }?;
        let backing = tier::anon_tier();
        if backing == Backing::TransparentHuge {
            // The grown block is advised whole by the first-touch policy's
            // state now: base pages inside the window after a slow probe,
            // THP otherwise (always THP for the C API, which has no policy).
            let advice = if !self.c_api && first_touch::base_pages_now() {
                Advice::NoHugePage
            } else {
                Advice::HugePage
            };
            let _ = sys::madvise(p.as_ptr(), new_len, advice);
            if via == Via::GlobalAlloc && Self::short_tail(new_size) {
                Self::advise_tail(p.as_ptr(), new_size, new_len);
            }
        }
        COUNTERS.record_grow(old_len, new_len, backing);
        Ok(p)
    }

    /// A block of `len` bytes (a multiple of 2 MiB) for `size` bytes
    /// aligned to `align`, made from the longest retained block shorter
    /// than `len` that meets `align`, grown with `mremap`
    /// ([`grow_mapping`](Self::grow_mapping)): its pages move already faulted
    /// in and only the added bytes are fresh, as in an allocator whose
    /// freed neighbours coalesce (jemalloc's extents). For the C API's
    /// misses that need no zeroing (the moved pages hold old bytes). `None`
    /// when nothing is retained or the growth fails (a block of several
    /// VMAs, a hugetlb block); the block then goes back to the cache.
    #[cold]
    pub(super) fn grow_retained(
        &self,
        size: usize,
        len: usize,
        align: usize,
        via: Via,
    ) -> Option<NonNull<u8>> {
        let taken = retain::take_longest(len, align)?;
        match self.grow_mapping(taken.ptr, taken.len, len, align, size, via) {
            Ok(p) => {
                COUNTERS.retain_grows.fetch_add(1, Ordering::Relaxed);
                Some(p)
            }
            Err(_) => {
                // Back into the cache with its own decay stamp, so a block
                // that cannot grow still decays; unmapped if the cache
                // filled meanwhile.
                let age = MergedAge::Kept(taken.stamp);
                if !retain::put(taken.ptr, taken.len, self.retain_cap(), age) {
                    unmap(taken.ptr, taken.len);
                }
                None
            }
        }
    }

    /// Mapped-to-mapped resize.
    ///
    /// # Safety
    /// As [`resize`](Self::resize), with both sizes on the mapping path.
    #[cold]
    unsafe fn remap(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        fill: Fill,
        via: Via,
    ) -> *mut u8 {
        let (Some(old_len), Some(new_len), Some(base)) = (
            Self::mapped_len(old_size),
            Self::mapped_len(new_size),
            NonNull::new(ptr),
        ) else {
            return ptr::null_mut();
        };
        // Bytes between the old size and the old mapping's end may hold data
        // from before an earlier shrink; pages past the old mapping are fresh.
        let zero_dirty = |p: *mut u8| {
            let end = new_size.min(old_len);
            if fill == Fill::Zeroed && end > old_size {
                // SAFETY: `p..p+end` lies inside the resized mapping.
                unsafe { ptr::write_bytes(p.add(old_size), 0, end - old_size) };
            }
        };
        if new_len == old_len {
            if via == Via::GlobalAlloc
                && Self::short_tail(old_size) != Self::short_tail(new_size)
                && tier::anon_tier() == Backing::TransparentHuge
            {
                Self::advise_tail(ptr, new_size, new_len);
            }
            zero_dirty(ptr);
            return ptr;
        }
        if new_len < old_len {
            // Shrink: give back whole 2 MiB pages at the tail (valid for
            // hugetlb too). If that fails the block keeps its old length,
            // so report failure and leave it as it was.
            // SAFETY: the tail lies inside our mapping.
            let tail = unsafe { ptr.add(new_len) };
            return match sys::munmap(tail, old_len - new_len) {
                Ok(()) => {
                    COUNTERS.record_unmap(old_len - new_len);
                    COUNTERS.remaps.fetch_add(1, Ordering::Relaxed);
                    if via == Via::GlobalAlloc
                        && Self::short_tail(new_size)
                        && tier::anon_tier() == Backing::TransparentHuge
                    {
                        Self::advise_tail(ptr, new_size, new_len);
                    }
                    ptr
                }
                Err(_) => ptr::null_mut(),
            };
        }
        if let Ok(p) = self.grow_mapping(base, old_len, new_len, align, new_size, via) {
            zero_dirty(p.as_ptr());
            return p.as_ptr();
        }
        let p = self.map_block(new_size, align, fill, via);
        if !p.is_null() {
            // SAFETY: disjoint mappings; `old_size` bytes are readable in the
            // old block and writable in the new one (new_size > old_size);
            // the old block is no longer used.
            unsafe {
                ptr::copy_nonoverlapping(ptr, p, old_size);
                self.release_block(ptr, old_size, via);
            }
        }
        p
    }
}
