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
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The bound of `malloc`'s fast path ([`api::fast_path_bound`]: the smaller
/// of the threshold and 64 KiB), below which a request goes straight to
/// glibc. Kept here so that the fast path reads it with one load of this
/// library's own data (a static of another crate is reached through the
/// global offset table); 0 until the threshold is read from a set-up
/// environment, which sends every request to the slow path until then.
static FAST_BELOW: AtomicUsize = AtomicUsize::new(0);

/// `malloc` from the fast path's bound up (requests glibc serves with the
/// program break watched, and those at or above the threshold), or of any
/// size before the threshold is known.
#[inline(never)]
extern "C" fn malloc_slow(size: usize) -> *mut c_void {
    if FAST_BELOW.load(Relaxed) == 0 {
        if let Some(bound) = api::fast_path_bound() {
            FAST_BELOW.store(bound, Relaxed);
        }
    }
    api::malloc(size)
}

/// `free` of a 2 MiB-aligned pointer (or null): a ckalloc block or glibc's.
///
/// # Safety
/// As `free`.
#[inline(never)]
unsafe extern "C" fn free_aligned(p: *mut c_void) {
    // SAFETY: the C contract of `free`.
    unsafe { api::free(p) }
}

#[global_allocator]
static GLIBC: api::GlibcMalloc = api::GlibcMalloc;

/// `malloc(3)`. The fast path (below the threshold and 64 KiB) is one
/// load, one compare and a jump to glibc; requests from 64 KiB up to the
/// threshold go to glibc with the program break watched, and those at or
/// above it to the huge-page engine ([`ckalloc::preload::malloc`]).
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    if size < FAST_BELOW.load(Relaxed) {
        return api::glibc::malloc(size);
    }
    malloc_slow(size)
}

/// `free(3)`.
///
/// # Safety
/// `p` is null or a live block of this allocator (or glibc's).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if !(p as usize).is_multiple_of(api::BLOCK_ALIGN) {
        // SAFETY: not 2 MiB aligned, so not a ckalloc block: glibc's (the
        // C contract of `free`).
        return unsafe { api::glibc::free(p) };
    }
    // SAFETY: the C contract of `free`.
    unsafe { free_aligned(p) }
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

/// `mallopt(3)`.
#[no_mangle]
pub extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    api::mallopt(param, value)
}

/// `malloc_trim(3)`.
#[no_mangle]
pub extern "C" fn malloc_trim(pad: usize) -> c_int {
    api::malloc_trim(pad)
}

/// The library's statistics as one JSON object ([`api::write_stats_json`]
/// lists the keys), written as `snprintf` writes: at most `len - 1` bytes
/// of it into `buf` and a NUL after them; returns the object's length
/// without the NUL whether or not it fit. `buf` may be null when `len`
/// is 0 (to learn the length). Thread-safe; never allocates. The Python
/// package's `ckalloc.stats()` calls it.
///
/// # Safety
/// `buf` is valid for writes of `len` bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn ckalloc_stats_json(buf: *mut c_char, len: usize) -> usize {
    if buf.is_null() || len == 0 {
        return api::write_stats_json(&mut []);
    }
    // SAFETY: the caller's contract: `len` writable bytes at `buf`.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    api::write_stats_json(out)
}

/// Notes where the process's allocator calls go first
/// ([`api::note_binding`]), sets glibc's mmap and trim thresholds for the
/// requests it serves ([`api::configure_glibc_thresholds`]) when this
/// library is loaded before libc (with `LD_PRELOAD`, not `dlopen`; also
/// behind another allocator, which may pass calls on to it), reads
/// `CKALLOC_SHOW_STATS` and notes where the summary goes
/// (`CKALLOC_STATS_FILE`, or which file standard error is; neither in a
/// set-user-ID program, `ckalloc::env`), when the
/// library loads (a program may clear its environment, change directory or
/// reuse file descriptor 2 before it exits), and asks for the engine's background
/// thread, which the first huge-path call after this starts at that call's
/// thread's priority (unless
/// `CKALLOC_BACKGROUND_THREAD` is off).
extern "C" fn at_load() {
    api::note_binding();
    if api::binding().loaded_before_libc() {
        api::configure_glibc_thresholds();
    }
    ckalloc::huge::enable_background_thread();
    api::remember_output();
}

/// Prints the `CKALLOC_SHOW_STATS` summary when the process exits (run by
/// `exit` through `.fini_array`; `_exit` runs nothing).
extern "C" fn at_exit() {
    api::print_at_exit();
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

#[used]
#[link_section = ".fini_array"]
static AT_EXIT: extern "C" fn() = at_exit;
