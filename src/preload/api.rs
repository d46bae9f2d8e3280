//! The C allocation API with glibc 2.36's semantics, routed by size: the
//! entry points the preload library exports under the C names, callable
//! from Rust (the `preload_ops` fuzz target drives them).

use super::glibc::{self, MALLOC_ALIGNMENT};
use super::heap_regrowth;
use super::COUNTERS;
use crate::env;
use crate::huge::{Fill, Policy, ResizeError, ENGINE};
use crate::sys::{self, HUGE_PAGE_2M};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::Ordering::Relaxed;

/// The policy of the huge-page engine's C front ([`Policy::C_MALLOC`]):
/// fresh blocks fault in as THP when written, a retained block is cleared
/// with `MADV_DONTNEED`, the retention cap follows the high-water mark of
/// live bytes, a full cache purges its oldest runs, and a miss extends
/// retained units (see the
/// [module docs](crate::preload#huge-blocks-first-touch-and-retention)).
const POLICY: Policy = Policy::C_MALLOC;

/// The retention cap of the C front now, in bytes
/// ([`PreloadStats::retain_cap`](super::PreloadStats::retain_cap)).
pub(super) fn retain_cap() -> usize {
    ENGINE.retain_cap(&POLICY)
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e };
}

/// Whether `size` goes to the huge-page engine.
#[inline]
fn is_huge(size: usize) -> bool {
    size >= env::preload_threshold()
}

/// The length of the engine block at `p`, `None` for any other pointer.
/// Touches no memory at `p`.
#[inline]
fn block_len(p: *mut c_void) -> Option<usize> {
    if !(p as usize).is_multiple_of(HUGE_PAGE_2M) || p.is_null() {
        return None;
    }
    ENGINE.usable_size(p.cast())
}

/// Whether any allocator could serve `size` bytes aligned to `align`: not
/// when the rounded size exceeds `isize::MAX` (glibc refuses sizes above
/// `PTRDIFF_MAX` with `ENOMEM` too), so such a request fails at once and
/// never reaches glibc's allocator as a fallback (AddressSanitizer's, in
/// its place, aborts on it).
fn servable(size: usize, align: usize) -> bool {
    size.checked_add(align.max(MALLOC_ALIGNMENT))
        .is_some_and(|n| n <= isize::MAX as usize)
}

/// A huge-page block for `size` bytes (at least the threshold) aligned to
/// `align` (a power of two), or, when the engine has no memory for it,
/// glibc's (counted when glibc serves it); null with `errno = ENOMEM` when
/// neither has.
/// `errno` is left as it was on success.
#[cold]
fn huge_alloc(size: usize, align: usize, zeroed: bool) -> *mut c_void {
    if !servable(size, align) {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    let saved = errno();
    let fill = if zeroed { Fill::Zeroed } else { Fill::Uninit };
    if let Some(b) = ENGINE.alloc(size, align.max(MALLOC_ALIGNMENT), fill, &POLICY) {
        COUNTERS.blocks.fetch_add(1, Relaxed);
        COUNTERS.bytes.fetch_add(size as u64, Relaxed);
        set_errno(saved);
        return b.ptr.as_ptr().cast();
    }
    set_errno(saved);
    let p = if zeroed {
        glibc::calloc(1, size)
    } else {
        glibc::memalign(align.max(MALLOC_ALIGNMENT), size)
    };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    } else {
        COUNTERS.glibc_fallbacks.fetch_add(1, Relaxed);
    }
    p
}

/// `malloc(3)`: at least `size` bytes aligned to 16, or null with `errno =
/// ENOMEM`; `malloc(0)` returns a unique pointer (glibc's).
#[inline]
pub fn malloc(size: usize) -> *mut c_void {
    if !is_huge(size) {
        return small_malloc(size);
    }
    huge_alloc(size, MALLOC_ALIGNMENT, false)
}

/// `malloc` of a request below the threshold: glibc's, with the program
/// break watched around a request of 64 KiB or more, so that glibc's main
/// heap growing again into a top it trimmed raises glibc's trim threshold
/// ([`glibc::follow_heap_regrowth`]); below 64 KiB, one comparison and
/// glibc's `malloc`.
#[inline]
fn small_malloc(size: usize) -> *mut c_void {
    if heap_regrowth::watches(size) {
        return watched_malloc(size);
    }
    glibc::malloc(size)
}

/// The bound of `malloc`'s fast path, in bytes: requests below it are below
/// the threshold and too small for the program break to be watched
/// (64 KiB), so glibc's `malloc` serves them as they are; `None` before the
/// environment the threshold comes from is set up. The preload library
/// caches it in a static of its own, which its `malloc` reads without going
/// through the global offset table.
pub fn fast_path_bound() -> Option<usize> {
    Some(super::settled_threshold()?.min(heap_regrowth::WATCH_MIN))
}

/// glibc's `malloc(size)` with the program break watched; out of line, so
/// that [`small_malloc`]'s other path stays a jump to glibc.
#[inline(never)]
fn watched_malloc(size: usize) -> *mut c_void {
    heap_regrowth::watch(|| glibc::malloc(size))
}

/// `free(3)`: null does nothing; a ckalloc block goes back to the engine
/// (retained or unmapped) and raises glibc's trim threshold as glibc's
/// dynamic threshold would ([`glibc::follow_freed_block`]), any other
/// pointer goes to glibc.
///
/// # Safety
/// `p` is null or a live block of this API or of glibc's allocator.
#[inline]
pub unsafe fn free(p: *mut c_void) {
    if (p as usize).is_multiple_of(HUGE_PAGE_2M) {
        // SAFETY: a block the engine holds at `p` is the caller's, not
        // used afterwards.
        if let Some(size) = unsafe { ENGINE.free(p.cast(), &POLICY) } {
            glibc::follow_freed_block(size);
            return;
        }
    }
    // SAFETY: not a ckalloc block, so glibc's (the caller's contract).
    unsafe { glibc::free(p) }
}

/// `calloc(3)`: `n * size` bytes, all zero; null with `errno = ENOMEM`
/// when the product overflows or no memory is left.
pub fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    if !is_huge(total) {
        return heap_regrowth::watch_if_large(total, || glibc::calloc(n, size));
    }
    huge_alloc(total, MALLOC_ALIGNMENT, true)
}

/// `realloc(3)` as glibc 2.36 has it: `realloc(NULL, n)` is `malloc(n)`;
/// `realloc(p, 0)` frees `p` and returns null; otherwise the contents up
/// to the smaller size are kept, the block moving across the threshold in
/// either direction (a huge block is resized by one call of the engine:
/// in place, or its pages moved with `mremap`). On failure: null,
/// `errno = ENOMEM`, `p` untouched.
///
/// # Safety
/// `p` is null or a live block of this API or of glibc's allocator.
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if size == 0 {
        // SAFETY: the caller's contract.
        unsafe { free(p) };
        return ptr::null_mut();
    }
    if !is_huge(size) {
        if let Some(len) = block_len(p) {
            // SAFETY: an engine block of `len` bytes, the caller's.
            return unsafe { shrink_to_glibc(p, len, size) };
        }
        // SAFETY: a glibc block (the caller's contract).
        return unsafe { glibc::realloc(p, size) };
    }
    if !servable(size, MALLOC_ALIGNMENT) {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    if (p as usize).is_multiple_of(HUGE_PAGE_2M) {
        let saved = errno();
        // Old size 0: the block's request (`Fill::Uninit` zeroes nothing).
        // SAFETY: a block the engine holds at `p` is the caller's.
        match unsafe { ENGINE.resize(p.cast(), 0, size, MALLOC_ALIGNMENT, Fill::Uninit, &POLICY) } {
            Ok(b) => {
                set_errno(saved);
                return b.ptr.as_ptr().cast();
            }
            Err(ResizeError::NoMemory) => {
                // SAFETY: the engine's block, as it was.
                return unsafe { move_to_glibc(p, size) };
            }
            Err(ResizeError::NotOurs) => {}
        }
    }
    let q = huge_alloc(size, MALLOC_ALIGNMENT, false);
    if !q.is_null() {
        // SAFETY: `p` is glibc's with at least `usable_size(p)` readable
        // bytes; `q` holds `size`; distinct blocks.
        unsafe {
            let keep = glibc::usable_size(p).min(size);
            ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), keep);
            glibc::free(p);
        }
    }
    q
}

/// `realloc` of an engine block of `len` bytes to `size`, below the
/// threshold: into glibc's memory.
///
/// # Safety
/// `p` is a live engine block of `len >= size` bytes, the caller's.
#[cold]
unsafe fn shrink_to_glibc(p: *mut c_void, len: usize, size: usize) -> *mut c_void {
    let q = glibc::malloc(size);
    if !q.is_null() {
        // SAFETY: both hold `size <= len` bytes; distinct blocks; `p` is
        // the engine's, not used again.
        unsafe {
            ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), size.min(len));
            ENGINE.free_moved(p.cast(), &POLICY);
        }
    }
    q
}

/// `realloc` of an engine block the engine cannot resize for want of
/// memory: into glibc's memory, so that a request glibc would serve is
/// served; null with `errno = ENOMEM` and the block untouched when glibc
/// has none either.
///
/// # Safety
/// `p` is a live engine block, the caller's.
#[cold]
unsafe fn move_to_glibc(p: *mut c_void, size: usize) -> *mut c_void {
    let len = block_len(p).unwrap_or(0);
    let q = glibc::malloc(size);
    if q.is_null() {
        set_errno(libc::ENOMEM);
        return q;
    }
    COUNTERS.glibc_fallbacks.fetch_add(1, Relaxed);
    // SAFETY: both hold at least `min(len, size)` bytes; distinct blocks;
    // `p` is the engine's, not used again.
    unsafe {
        ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), len.min(size));
        ENGINE.free_moved(p.cast(), &POLICY);
    }
    q
}

/// `reallocarray(3)`: `realloc(p, n * size)`, or null with `errno =
/// ENOMEM` and `p` untouched when the product overflows.
///
/// # Safety
/// As [`realloc`].
pub unsafe fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: the caller's contract.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `memalign(3)` as glibc 2.36 has it: an alignment up to 16 is
/// `malloc`'s; one that is not a power of two is rounded up to the next;
/// one above `SIZE_MAX / 2 + 1` fails with `EINVAL`. Huge blocks honour
/// alignments past 2 MiB (up to any power of two the address space allows).
pub fn memalign(align: usize, size: usize) -> *mut c_void {
    if align <= MALLOC_ALIGNMENT {
        return malloc(size);
    }
    let Some(align) = align.checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    if !is_huge(size) {
        return heap_regrowth::watch_if_large(size, || glibc::memalign(align, size));
    }
    huge_alloc(size, align, false)
}

/// `aligned_alloc(3)` as glibc 2.36 has it: `memalign` (glibc 2.38 and
/// later refuse an alignment that is not a power of two with `EINVAL`;
/// 2.36 rounds it up, and so does this).
pub fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    memalign(align, size)
}

/// `posix_memalign(3)`: `EINVAL` (and `*out` untouched) unless `align` is
/// a power of two and a multiple of `sizeof(void *)`; `ENOMEM` when no
/// memory is left; else 0 with the block in `*out`.
///
/// # Safety
/// `out` is valid for a pointer write.
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let p = memalign(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's contract.
    unsafe { out.write(p) };
    0
}

/// `valloc(3)`: `memalign(page size, size)`.
pub fn valloc(size: usize) -> *mut c_void {
    if !is_huge(size) {
        return glibc::valloc(size);
    }
    huge_alloc(size, sys::page_size(), false)
}

/// `pvalloc(3)`: `size` rounded up to a whole page, page aligned; null with
/// `errno = ENOMEM` when the rounding overflows.
pub fn pvalloc(size: usize) -> *mut c_void {
    let page = sys::page_size();
    let Some(rounded) = sys::round_up(size.max(1), page) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    if !is_huge(rounded) {
        return glibc::pvalloc(size);
    }
    huge_alloc(rounded, page, false)
}

/// `malloc_usable_size(3)`: the bytes usable at `p` (at least the size
/// asked for; all of them may be written): a ckalloc block's whole mapped
/// length, glibc's answer for any other pointer, 0 for null.
///
/// # Safety
/// `p` is null or a live block of this API or of glibc's allocator.
pub unsafe fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if let Some(len) = block_len(p) {
        return len;
    }
    // SAFETY: a glibc block (the caller's contract).
    unsafe { glibc::usable_size(p) }
}

/// `mallopt(3)`: glibc's, which the requests below the threshold go to
/// ([`glibc::program_mallopt`]: a setting of glibc's thresholds ends the
/// library's raising of the trim threshold).
pub fn mallopt(param: c_int, value: c_int) -> c_int {
    glibc::program_mallopt(param, value)
}

/// `malloc_trim(3)`: gives every retained huge-page block back to the
/// kernel ([`release_retained`](crate::release_retained)), then runs
/// glibc's `malloc_trim(pad)`; 1 when either released memory, else 0.
pub fn malloc_trim(pad: usize) -> c_int {
    let released = crate::release_retained();
    heap_regrowth::program_trim_starts();
    let trimmed = glibc::trim(pad);
    heap_regrowth::program_trim_ends();
    c_int::from(released > 0 || trimmed != 0)
}
