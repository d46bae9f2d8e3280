//! [`huge_alloc`] / [`huge_free`]: C-Kernel-Engine's `ck_huge_alloc` and
//! `ck_huge_free` as a front of the huge-page engine
//! ([`Policy::CK_HUGE`]).

use super::engine::{Fill, ENGINE};
use super::policy::Policy;
use crate::sys::HUGE_PAGE_2M;
use std::ptr::NonNull;

/// Allocate `bytes` of zeroed huge-page memory (C-Kernel-Engine's
/// `ck_huge_alloc`).
///
/// The size is rounded up to 2 MiB; the block is 2 MiB aligned, units of
/// the engine's spans ([`Policy::CK_HUGE`]). `None` for 0 bytes, a size
/// whose rounding exceeds `isize::MAX`, or when no memory can be had.
/// Thread-safe; never allocates on the heap. Release with [`huge_free`].
pub fn huge_alloc(bytes: usize) -> Option<NonNull<u8>> {
    if bytes == 0 {
        return None;
    }
    ENGINE
        .alloc(bytes, HUGE_PAGE_2M, Fill::Zeroed, &Policy::CK_HUGE)
        .map(|b| b.ptr)
}

/// Release a block from [`huge_alloc`]: its pages go back to the kernel at
/// once (purged), its address space to the engine. The block is found from
/// `ptr` alone; `bytes` is not needed (C-Kernel-Engine's signature), and a
/// pointer that is no block of the engine is ignored.
///
/// # Safety
/// `ptr` is not used afterwards if it is a block from [`huge_alloc`].
pub unsafe fn huge_free(ptr: NonNull<u8>, bytes: usize) {
    let _ = bytes;
    // SAFETY: the caller's contract.
    unsafe { ENGINE.free(ptr.as_ptr(), &Policy::CK_HUGE) };
}
