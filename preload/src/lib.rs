//! `libckalloc_preload.so`: the C allocation API served by ckalloc, for
//! programs loaded with `LD_PRELOAD` (or linked ahead of libc). Each
//! exported function wraps the function of the same name in
//! [`ckalloc::preload`], which documents the routing, the semantics
//! (glibc 2.36) and the limits.
//!
//! The library's own Rust code allocates from glibc
//! ([`ckalloc::preload::GlibcMalloc`]): `System` would call the exported
//! `malloc`, this library.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use ckalloc::preload as api;
use std::ffi::{c_int, c_void};

#[global_allocator]
static GLIBC: api::GlibcMalloc = api::GlibcMalloc;

/// `malloc(3)`.
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    api::malloc(size)
}

/// `free(3)`.
///
/// # Safety
/// `p` is null or a live block of this allocator (or glibc's).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: the C contract of `free`.
    unsafe { api::free(p) }
}

/// `calloc(3)`.
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    api::calloc(n, size)
}

/// `realloc(3)`.
///
/// # Safety
/// `p` is null or a live block of this allocator (or glibc's).
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the C contract of `realloc`.
    unsafe { api::realloc(p, size) }
}

/// `reallocarray(3)`.
///
/// # Safety
/// As `realloc`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    // SAFETY: the C contract of `reallocarray`.
    unsafe { api::reallocarray(p, n, size) }
}

/// `posix_memalign(3)`.
///
/// # Safety
/// `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    // SAFETY: the C contract of `posix_memalign`.
    unsafe { api::posix_memalign(out, align, size) }
}

/// `aligned_alloc(3)` (glibc 2.36's: `memalign`).
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    api::aligned_alloc(align, size)
}

/// `memalign(3)`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    api::memalign(align, size)
}

/// `valloc(3)`.
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    api::valloc(size)
}

/// `pvalloc(3)`.
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    api::pvalloc(size)
}

/// `malloc_usable_size(3)`.
///
/// # Safety
/// `p` is null or a live block of this allocator (or glibc's).
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: the C contract of `malloc_usable_size`.
    unsafe { api::malloc_usable_size(p) }
}

/// `malloc_trim(3)`.
#[no_mangle]
pub extern "C" fn malloc_trim(pad: usize) -> c_int {
    api::malloc_trim(pad)
}

/// Prints the `CKALLOC_SHOW_STATS` summary when the process exits (run by
/// `exit` through `.fini_array`; `_exit` runs nothing).
extern "C" fn at_exit() {
    if ckalloc::env::show_stats() {
        let _ = api::write_summary(libc::STDERR_FILENO);
    }
}

#[used]
#[link_section = ".fini_array"]
static AT_EXIT: extern "C" fn() = at_exit;
