//! [`CkHuge`]: a global allocator and `allocator_api2` allocator that serves
//! large requests from huge-page mappings and small ones from `System`.

use super::{map_huge, unmap, HugeOptions};
use crate::stats::COUNTERS;
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use crate::tier::{self, Backing};
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::alloc::{GlobalAlloc, System};
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

/// Huge-page allocator usable as `#[global_allocator]` and as an
/// `allocator_api2` [`Allocator`].
///
/// Requests of at least [`threshold`](Self::threshold) bytes (default 2 MiB)
/// get their own mapping from the tier ladder (hugetlb, THP, plain pages),
/// rounded up to 2 MiB and aligned to at least 2 MiB (larger alignments are
/// honoured by over-reserving). Smaller requests go to
/// [`std::alloc::System`]. The path a block takes depends only on its size,
/// so a block is always freed by the path that served it.
///
/// `realloc` of a mapped block grows in place with `mremap` when the address
/// space after it is free, else moves it with `mremap(MREMAP_FIXED)` into an
/// aligned reservation (a plain `MREMAP_MAYMOVE` could lose the alignment);
/// hugetlb blocks cannot grow with `mremap`, so they are copied.
///
/// The mapping path never allocates, takes no lock, never panics and never
/// prints; configuration is read with `getenv`. Thread-safe.
///
/// ```no_run
/// #[global_allocator]
/// static A: ckalloc::CkHuge = ckalloc::CkHuge::new();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CkHuge {
    threshold: usize,
}

impl Default for CkHuge {
    fn default() -> Self {
        Self::new()
    }
}

const OPTS: HugeOptions = HugeOptions::new();

impl CkHuge {
    /// A `CkHuge` with the default threshold of 2 MiB.
    pub const fn new() -> CkHuge {
        CkHuge {
            threshold: HUGE_PAGE_2M,
        }
    }

    /// A `CkHuge` that maps requests of at least `bytes` bytes (`0` and `1`
    /// map every non-empty request).
    pub const fn with_threshold(bytes: usize) -> CkHuge {
        CkHuge { threshold: bytes }
    }

    /// Requests of at least this many bytes get a huge-page mapping.
    pub const fn threshold(&self) -> usize {
        self.threshold
    }

    #[inline]
    fn is_mapped(&self, size: usize) -> bool {
        size >= self.threshold
    }

    /// The length of the mapping that serves `size` bytes (always
    /// representable: `Layout` sizes are at most `isize::MAX`).
    #[inline]
    fn mapped_len(size: usize) -> Option<usize> {
        sys::round_up(size, HUGE_PAGE_2M)
    }

    #[cold]
    fn map(size: usize, align: usize) -> *mut u8 {
        match map_huge(size, align, &OPTS) {
            Ok(m) => m.ptr.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }

    #[cold]
    unsafe fn unmap_block(ptr: *mut u8, size: usize) {
        if let (Some(p), Some(len)) = (NonNull::new(ptr), Self::mapped_len(size)) {
            unmap(p, len);
        }
    }

    /// Resize a block to `new_size` keeping `align`; `zero` asks for the
    /// bytes from the old size to the new size to read as zero. Returns null
    /// and leaves the old block intact on failure.
    ///
    /// # Safety
    /// `ptr` was allocated by `self` with `Layout(old_size, align)`, and
    /// `new_size` is a valid `Layout` size for `align` (non-zero).
    unsafe fn resize(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        zero: bool,
    ) -> *mut u8 {
        let copy = old_size.min(new_size);
        let zero_tail = |p: *mut u8, from: usize, to: usize| {
            if zero && to > from {
                // SAFETY: `p..p+to` is inside the resized block.
                unsafe { ptr::write_bytes(p.add(from), 0, to - from) };
            }
        };
        match (self.is_mapped(old_size), self.is_mapped(new_size)) {
            (false, false) => {
                // SAFETY: the caller's contract is System's for small blocks.
                let layout = unsafe { Layout::from_size_align_unchecked(old_size, align) };
                // SAFETY: as above; System handles any alignment it gave.
                let p = unsafe { System.realloc(ptr, layout, new_size) };
                if !p.is_null() {
                    zero_tail(p, old_size, new_size);
                }
                p
            }
            (false, true) => {
                let p = Self::map(new_size, align);
                if !p.is_null() {
                    // SAFETY: both blocks hold at least `copy` bytes and do
                    // not overlap (fresh mapping). The tail is fresh zeroes.
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, p, copy);
                        System.dealloc(ptr, Layout::from_size_align_unchecked(old_size, align));
                    }
                }
                p
            }
            (true, false) => {
                // SAFETY: new_size is non-zero and valid for `align`.
                let p = unsafe { System.alloc(Layout::from_size_align_unchecked(new_size, align)) };
                if !p.is_null() {
                    // SAFETY: disjoint blocks, `copy` bytes in both; this
                    // branch only shrinks, so there is no tail to zero.
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, p, copy);
                        Self::unmap_block(ptr, old_size);
                    }
                }
                p
            }
            // SAFETY: forwarded contract.
            (true, true) => unsafe { self.remap(ptr, old_size, align, new_size, zero) },
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
        zero: bool,
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
            if zero && end > old_size {
                // SAFETY: `p..p+end` lies inside the resized mapping.
                unsafe { ptr::write_bytes(p.add(old_size), 0, end - old_size) };
            }
        };
        if new_len == old_len {
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
                    ptr
                }
                Err(_) => ptr::null_mut(),
            };
        }
        // Grow 1: in place, when the address space after the block is free.
        // 2: move onto an aligned reservation with MREMAP_FIXED.
        // hugetlb mappings refuse both (EINVAL), and fall through to 3: map,
        // copy, unmap.
        let grown = sys::mremap(base, old_len, new_len, None).or_else(|_| {
            let dst = sys::reserve_aligned(new_len, align.max(HUGE_PAGE_2M))?;
            sys::mremap(base, old_len, new_len, Some(dst)).inspect_err(|_| {
                let _ = sys::munmap_best_effort(dst.as_ptr(), new_len);
            })
        });
        if let Ok(p) = grown {
            let backing = tier::anon_tier();
            if backing == Backing::TransparentHuge {
                let _ = sys::madvise(p.as_ptr(), new_len, Advice::HugePage);
            }
            COUNTERS.record_grow(old_len, new_len, backing);
            zero_dirty(p.as_ptr());
            return p.as_ptr();
        }
        let p = Self::map(new_size, align);
        if !p.is_null() {
            // SAFETY: disjoint mappings; `old_size` bytes are readable in the
            // old block and writable in the new one (new_size > old_size).
            unsafe {
                ptr::copy_nonoverlapping(ptr, p, old_size);
            }
            unmap(base, old_len);
        }
        p
    }
}

// SAFETY: `alloc` returns blocks of at least `layout.size()` bytes aligned to
// `layout.align()` (System's, or a mapping aligned to max(align, 2 MiB)), or
// null; `dealloc` routes by size exactly as `alloc` did; `realloc` keeps the
// contents up to the smaller size and leaves the block intact on failure.
unsafe impl GlobalAlloc for CkHuge {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.is_mapped(layout.size()) {
            // SAFETY: the caller's contract (non-zero size) is System's.
            return unsafe { System.alloc(layout) };
        }
        Self::map(layout.size(), layout.align())
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !self.is_mapped(layout.size()) {
            // SAFETY: as in `alloc`.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // Fresh anonymous mappings are zero-filled by the kernel.
        Self::map(layout.size(), layout.align())
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !self.is_mapped(layout.size()) {
            // SAFETY: small blocks came from System with this layout.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: mapped blocks are `mapped_len(size)` long at `ptr`.
        unsafe { Self::unmap_block(ptr, layout.size()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's realloc contract is `resize`'s.
        unsafe { self.resize(ptr, layout.size(), layout.align(), new_size, false) }
    }
}

fn dangling(layout: Layout) -> NonNull<[u8]> {
    // Alignments are non-zero powers of two, so this is a valid, aligned,
    // non-null address that is never dereferenced for zero-size blocks.
    let p = ptr::without_provenance_mut::<u8>(layout.align());
    // SAFETY: `p` is non-null (align >= 1).
    NonNull::slice_from_raw_parts(unsafe { NonNull::new_unchecked(p) }, 0)
}

impl CkHuge {
    /// The slice a block of `size` bytes may use: the whole mapping for
    /// mapped blocks (any size in between is valid when freeing, since it
    /// rounds to the same mapping and stays on the mapping path).
    #[inline]
    fn usable(&self, ptr: *mut u8, size: usize) -> Result<NonNull<[u8]>, AllocError> {
        let p = NonNull::new(ptr).ok_or(AllocError)?;
        let len = if self.is_mapped(size) {
            Self::mapped_len(size).ok_or(AllocError)?
        } else {
            size
        };
        Ok(NonNull::slice_from_raw_parts(p, len))
    }

    /// Grow/shrink for the `Allocator` trait, moving when the alignment changes.
    ///
    /// # Safety
    /// `Allocator::grow`/`shrink`'s contract.
    unsafe fn reallocate(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
        zero: bool,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 {
            return if zero {
                self.allocate_zeroed(new)
            } else {
                self.allocate(new)
            };
        }
        if new.size() == 0 {
            // SAFETY: the caller's contract.
            unsafe { self.deallocate(ptr, old) };
            return Ok(dangling(new));
        }
        if old.align() == new.align() {
            // SAFETY: forwarded contract; sizes are valid for the alignment.
            let p = unsafe { self.resize(ptr.as_ptr(), old.size(), old.align(), new.size(), zero) };
            return self.usable(p, new.size());
        }
        let fresh = if zero {
            self.allocate_zeroed(new)?
        } else {
            self.allocate(new)?
        };
        // SAFETY: disjoint blocks; both hold at least min(old, new) bytes.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr.as_ptr(),
                fresh.as_ptr().cast::<u8>(),
                old.size().min(new.size()),
            );
            self.deallocate(ptr, old);
        }
        Ok(fresh)
    }
}

// SAFETY: blocks stay valid until deallocated, since `CkHuge` holds no state
// (copies of it are interchangeable); zero-size requests get a dangling,
// aligned pointer and are never passed on.
unsafe impl Allocator for CkHuge {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: non-zero size.
        let p = unsafe { GlobalAlloc::alloc(self, layout) };
        self.usable(p, layout.size())
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: non-zero size.
        let p = unsafe { GlobalAlloc::alloc_zeroed(self, layout) };
        self.usable(p, layout.size())
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: allocated by self with a size that routes the same way.
            unsafe { GlobalAlloc::dealloc(self, ptr.as_ptr(), layout) }
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, false) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, true) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, false) }
    }
}
