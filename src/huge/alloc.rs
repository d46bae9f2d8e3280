//! [`huge_alloc`] / [`huge_free`]: C-Kernel-Engine's `ck_huge_alloc` and
//! `ck_huge_free` over the tier ladder.

use super::ladder::{map_huge, unmap};
use super::HugeOptions;
use crate::sys::{self, HUGE_PAGE_2M};
use std::ptr::NonNull;

/// Allocate `bytes` of zeroed huge-page memory (C-Kernel-Engine's `ck_huge_alloc`).
///
/// The size is rounded up to 2 MiB; the block is 2 MiB aligned. Tiers:
/// hugetlb, then THP, then normal pages (see the [module docs](super)). Returns
/// `None` for 0 bytes, a size whose rounding overflows or exceeds
/// `isize::MAX`, or when the kernel refuses the mapping. Thread-safe; never
/// allocates on the heap. Release with [`huge_free`] and the same `bytes`.
pub fn huge_alloc(bytes: usize) -> Option<NonNull<u8>> {
    map_huge(bytes, HUGE_PAGE_2M, &HugeOptions::new())
        .ok()
        .map(|m| m.ptr)
}

/// Release a block from [`huge_alloc`]: unmaps `bytes` rounded up to 2 MiB,
/// which is exactly what was mapped whatever tier served it (no global list
/// or lock). `bytes == 0` or an unroundable size does nothing (no block of
/// that size can exist).
///
/// # Safety
/// `ptr` must come from `huge_alloc(bytes)` with the same `bytes`, not be
/// freed already, and no reference into the block may be used afterwards.
pub unsafe fn huge_free(ptr: NonNull<u8>, bytes: usize) {
    if bytes == 0 {
        return;
    }
    if let Some(len) = sys::round_up(bytes, HUGE_PAGE_2M) {
        unmap(ptr, len);
    }
}
