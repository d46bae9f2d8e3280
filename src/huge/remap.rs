//! Resizing a [`CkHuge`] block: between the small allocator and the
//! mapping path, and between mappings (`mremap` in place, onto a fresh aligned
//! mapping, or a copy), keeping the alignment and the short-tail advice.

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

    /// Grow the mapping `base` of `old_len` bytes to `new_len` (both
    /// multiples of 2 MiB) for a block of `new_size` bytes aligned to
    /// `align`, without copying a byte.
    ///
    /// `mremap` resizes one VMA only (`EFAULT` across two), and a block is
    /// often several: a `GlobalAlloc` block whose last 2 MiB page was advised
    /// `MADV_NOHUGEPAGE` (a short tail), a block moved by an earlier growth
    /// (its pages and the added ones), a retained block merged from
    /// neighbours that were mapped apart, a range the program gave other
    /// flags (`mprotect`, `madvise`, `mlock`). The growth, in order:
    ///
    /// 1. In place (a block of one VMA): the block grows into the address
    ///    space after it, when that is free. hugetlb mappings refuse to grow
    ///    (`EINVAL`), and the growth stops there. A block of several VMAs
    ///    fails with `EFAULT` and goes to step 3: growing its last VMA alone
    ///    would give the added bytes whatever flags the program set on that
    ///    VMA (read-only, `MADV_DONTFORK`, `mlock`).
    /// 2. Moved and grown (a block of one VMA without room after it): onto
    ///    an aligned reservation of `new_len` bytes with `MREMAP_FIXED`,
    ///    which replaces it atomically; the block stays one VMA.
    /// 3. Moved VMA by VMA (a block of several): the reservation becomes
    ///    fresh anonymous memory and each VMA of the block moves onto it at
    ///    its own offset and length, the rest being the added bytes; from a
    ///    VMA that cannot move on, the block is copied
    ///    ([`move_by_vma`](Self::move_by_vma)). Needs Linux 6.11
    ///    (`PROCMAP_QUERY`); earlier kernels fail here, and the caller
    ///    copies.
    ///
    /// First the block is advised for its tier as a whole (THP, or base
    /// pages inside the first-touch policy's window): the VMAs the crate
    /// split by its own advice (a short tail, the policy's base pages)
    /// merge back into one, unless the program gave them other flags, so a
    /// block grown again and again stays one or two VMAs and grows in
    /// place. A program's `MADV_NOHUGEPAGE` on the block is replaced too
    /// (glibc's `mremap` keeps it). Moved VMAs keep their other flags, and
    /// a block of one VMA passes its flags, the tier advice among them, to
    /// the added bytes (as glibc's `mremap` of a mapped chunk does); the
    /// fresh added bytes of a block moved VMA by VMA are advised for their
    /// tier, and the block's last 2 MiB page for its short tail. The
    /// growth is counted (`record_grow`). On error the block is as it was,
    /// but for that advice.
    fn grow_mapping(
        &self,
        base: NonNull<u8>,
        old_len: usize,
        new_len: usize,
        align: usize,
        new_size: usize,
        via: Via,
    ) -> std::io::Result<NonNull<u8>> {
        let backing = tier::anon_tier();
        let advice = if backing != Backing::TransparentHuge {
            None
        } else if !self.c_api && first_touch::base_pages_now() {
            // The block is advised by the first-touch policy's state now:
            // base pages inside the window after a slow probe, THP
            // otherwise (always THP for the C API, which has no policy).
            Some(Advice::NoHugePage)
        } else {
            Some(Advice::HugePage)
        };
        if let Some(advice) = advice {
            let _ = sys::madvise(base.as_ptr(), old_len, advice);
        }
        // A block of one VMA passes its flags, the advice among them, to the
        // added bytes; a block moved VMA by VMA gets fresh anonymous memory
        // for them, which needs the advice.
        let (p, several) = match sys::mremap(base, old_len, new_len, None) {
            Ok(_) => (base, false),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Err(e),
            Err(e) => {
                let several = e.raw_os_error() == Some(libc::EFAULT);
                let align = align.max(HUGE_PAGE_2M);
                let p = Self::move_grown(base, old_len, new_len, align, several)?;
                (p, several)
            }
        };
        if let Some(advice) = advice {
            if several {
                // Inside `p`'s `new_len` bytes.
                let added = p.as_ptr().wrapping_add(old_len);
                let _ = sys::madvise(added, new_len - old_len, advice);
            }
            if via == Via::GlobalAlloc && Self::short_tail(new_size) {
                Self::advise_tail(p.as_ptr(), new_size, new_len);
            }
        }
        COUNTERS.record_grow(old_len, new_len, backing);
        Ok(p)
    }

    /// Steps 2 and 3 of [`grow_mapping`](Self::grow_mapping): move the
    /// block at `base` onto a reservation of `new_len` bytes aligned to
    /// `align`, whole (step 2) unless it is `several` VMAs (step 3). On
    /// error the block is where it was and the reservation is gone.
    fn move_grown(
        base: NonNull<u8>,
        old_len: usize,
        new_len: usize,
        align: usize,
        several: bool,
    ) -> std::io::Result<NonNull<u8>> {
        let dst = sys::reserve_aligned(new_len, align)?;
        let err = if several {
            // Moved one by one, which needs `PROCMAP_QUERY`; the query of
            // the block's first VMA tells before the reservation is replaced.
            // From there `move_by_vma` cleans up after itself.
            let ready = sys::VmaQuery::open().and_then(|maps| {
                maps.vma_at(base.as_ptr())?;
                sys::commit_read_write(dst, new_len)?;
                Ok(maps)
            });
            match ready {
                Ok(maps) => return Self::move_by_vma(&maps, base, old_len, dst, new_len, align),
                Err(e) => e,
            }
        } else {
            match sys::mremap(base, old_len, new_len, Some(dst)) {
                Ok(p) => return Ok(p),
                Err(e) => e,
            }
        };
        // A kernel that unmaps the destination before it checks the source
        // (older Linux releases do; 6.18 checks first) may leave the
        // reservation gone, and another thread's new mapping may sit inside
        // it by now: only a range still wholly mapped is ours to unmap.
        if sys::is_mapped(dst.as_ptr(), new_len) {
            let _ = sys::munmap_best_effort(dst.as_ptr(), new_len);
        }
        Err(err)
    }

    /// Move the `len` bytes at `base`, several VMAs, onto the start of
    /// `dst` (`dst_len` bytes of fresh read-write memory of the caller's),
    /// one VMA at a time: each found with `PROCMAP_QUERY` (`maps`) and
    /// moved whole at its own length, which `mremap` does atomically.
    /// The kernel's own move of several VMAs at once (Linux 6.17) is not
    /// used: it stops at the first VMA it may not move (one registered with
    /// userfaultfd, a sealed one) and leaves the earlier ones moved, with no
    /// way to tell where.
    ///
    /// The first VMA that does not move (not private read-write memory: a
    /// range the program made read-only, say; sealed with mseal(2); any
    /// failure) and all that follow it are copied into `dst` instead, and
    /// then unmapped VMA by VMA (a sealed one stays: nothing can unmap it).
    /// The moved ones left nothing behind to unmap, so no range is unmapped
    /// that another thread may have mapped meanwhile. Returns `dst`, or, if
    /// the failed move took the destination with it (a kernel that unmaps
    /// it first), a fresh mapping of `dst_len` bytes aligned to `align`
    /// with every byte; when no fresh mapping can be made either, the moved
    /// VMAs go back and the block is as it was.
    fn move_by_vma(
        maps: &sys::VmaQuery,
        base: NonNull<u8>,
        len: usize,
        dst: NonNull<u8>,
        dst_len: usize,
        align: usize,
    ) -> std::io::Result<NonNull<u8>> {
        let at = |p: NonNull<u8>, off: usize| p.as_ptr().wrapping_add(off);
        let mut moved = 0;
        // The length of the VMA whose move failed: its destination may be
        // gone.
        let mut failed = 0;
        while moved < len {
            let Some((n, vma)) = maps.len_at(at(base, moved), len - moved) else {
                break;
            };
            let (true, Some(from), Some(to)) = (
                vma.private_read_write,
                NonNull::new(at(base, moved)),
                NonNull::new(at(dst, moved)),
            ) else {
                break;
            };
            if sys::mremap(from, n, n, Some(to)).is_err() {
                failed = n;
                break;
            }
            moved += n;
        }
        if moved == len {
            return Ok(dst);
        }
        let rest = len - moved;
        let target = if sys::is_mapped(at(dst, moved), dst_len - moved) {
            dst
        } else {
            let fresh = sys::map_anon_aligned(dst_len, align);
            match fresh {
                Ok(fresh) => {
                    // SAFETY: the moved bytes are mapped at `dst`; `fresh` is
                    // a new mapping of `dst_len >= len` bytes.
                    unsafe { ptr::copy_nonoverlapping(dst.as_ptr(), fresh.as_ptr(), moved) };
                    let _ = sys::munmap_best_effort(dst.as_ptr(), moved);
                }
                // The holes the moved VMAs left are where they go back.
                Err(_) => Self::move_back(maps, base, dst, moved),
            }
            // What is left of the destination after the range the failed
            // move took.
            let after = moved + failed;
            if after < dst_len {
                let _ = sys::munmap_best_effort(at(dst, after), dst_len - after);
            }
            fresh?
        };
        // SAFETY: `base + moved ..+ rest` is the block's unmoved part, still
        // mapped and readable (a `malloc` block; a range the program made
        // unreadable faults here as in glibc's copy); `target + moved` has
        // `dst_len - moved >= rest` bytes of fresh memory, another mapping.
        unsafe { ptr::copy_nonoverlapping(at(base, moved), at(target, moved), rest) };
        let mut off = moved;
        while off < len {
            let n = maps
                .len_at(at(base, off), len - off)
                .map_or(len - off, |(n, _)| n);
            let _ = sys::munmap_best_effort(at(base, off), n);
            off += n;
        }
        Ok(target)
    }

    /// Move the first `moved` bytes at `dst`, VMA by VMA, back to `base`,
    /// where they came from: the last resort of
    /// [`move_by_vma`](Self::move_by_vma).
    #[cold]
    fn move_back(maps: &sys::VmaQuery, base: NonNull<u8>, dst: NonNull<u8>, moved: usize) {
        let mut off = 0;
        while off < moved {
            let from = dst.as_ptr().wrapping_add(off);
            let n = maps
                .len_at(from, moved - off)
                .map_or(moved - off, |(n, _)| n);
            if let (Some(f), Some(t)) = (
                NonNull::new(from),
                NonNull::new(base.as_ptr().wrapping_add(off)),
            ) {
                let _ = sys::mremap(f, n, n, Some(t));
            }
            off += n;
        }
    }

    /// A block of `len` bytes (a multiple of 2 MiB) for `size` bytes
    /// aligned to `align`, made from the longest retained block shorter
    /// than `len` that meets `align`, grown with `mremap`
    /// ([`grow_mapping`](Self::grow_mapping)): its pages move already faulted
    /// in and only the added bytes are fresh, as in an allocator whose
    /// freed neighbours coalesce (jemalloc's extents). For the C API's
    /// misses that need no zeroing (the moved pages hold old bytes). `None`
    /// when nothing is retained or the growth fails (a hugetlb block; a
    /// block of several VMAs before Linux 6.17); the block then goes back to
    /// the cache.
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
            // old block and writable in the new one (new_size > old_size).
            unsafe { ptr::copy_nonoverlapping(ptr, p, old_size) };
            // Unmapped, never retained: a block that could not move may
            // hold a range the program gave other flags (read-only, sealed),
            // which must not serve another request.
            unmap(base, old_len);
        }
        p
    }
}
