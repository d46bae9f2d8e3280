//! The C ABI (feature `capi`): a drop-in for C-Kernel-Engine's
//! `ckernel_alloc.h`; the header is `include/ckernel_alloc.h`.
//!
//! Differences from the C original, all fixes: a size whose rounding to
//! 2 MiB overflows returns NULL instead of wrapping to a zero-length block;
//! `ck_huge_free` releases the whole block whatever `bytes` says (the
//! huge-page engine's extent map remembers each block's length, as the
//! original's registry does) and ignores pointers it did not hand out; failures set a thread-local
//! [`ck_last_error`] string instead of printing; no Rust panic crosses the
//! boundary (each entry point catches it and reports failure).
//!
//! # Fork safety
//!
//! The registry of live arenas is a spin lock that the crate's
//! `pthread_atfork` handlers (registered when the library is loaded) take
//! before `fork()` and release after it in parent and child; live
//! `ck_huge_alloc` blocks are in the huge-page engine's extent map, which
//! takes no lock, so a child forked
//! while another thread is inside `ck_huge_alloc` or `ck_bump_alloc_init`
//! can call every function of the C ABI. The guarantee, the lock order and
//! its limits (`vfork`, `clone`) are in `docs/reliability.md`, section "Fork
//! safety".

use crate::fork::{Hooks, Stage};
use crate::huge::{Fill, Policy, ENGINE};
use crate::lock::{HeldLock, PoolLock, PoolLockGuard};
use crate::sys::HUGE_PAGE_2M;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: impl std::fmt::Display) {
    let text = msg.to_string().replace('\0', " ");
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Run `f`, turning a panic into `on_panic` and a recorded error.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_last_error("internal error: a panic was caught at the C boundary");
            on_panic
        }
    }
}

/// Takes the arena registry's lock. Nothing under it panics: a `BTreeMap`
/// insert or remove (an allocation failure aborts, it does not unwind).
/// The fork hooks that take it around `fork()` are added when the library
/// is loaded (below). Live `ck_huge_alloc` blocks are in the huge-page
/// engine's extent map, which has no lock.
pub(crate) fn lock<T>(m: &PoolLock<T>) -> PoolLockGuard<'_, T> {
    m.lock()
}

/// The reason for the last failure on the calling thread, `""` if none. The
/// pointer stays valid until the next failure on the same thread.
#[no_mangle]
pub extern "C" fn ck_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// `ck_huge_alloc(bytes)`: see `include/ckernel_alloc.h`. A block of the
/// huge-page engine with [`Policy::CK_HUGE`]: zeroed, 2 MiB aligned, its
/// pages purged when freed.
#[no_mangle]
pub extern "C" fn ck_huge_alloc(bytes: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if bytes == 0 {
            set_last_error("ck_huge_alloc: 0 bytes");
            return std::ptr::null_mut();
        }
        match ENGINE.alloc(bytes, HUGE_PAGE_2M, Fill::Zeroed, &Policy::CK_HUGE) {
            Some(b) => b.ptr.as_ptr().cast(),
            None => {
                set_last_error(format!(
                    "ck_huge_alloc: no memory for {bytes} bytes (rounded up to 2 MiB), \
                     or the size overflows"
                ));
                std::ptr::null_mut()
            }
        }
    })
}

/// `ck_huge_free(ptr, bytes)`: see `include/ckernel_alloc.h`. The block is
/// found from `ptr` alone; a pointer that is no block of `ck_huge_alloc` is
/// ignored and recorded in [`ck_last_error`].
///
/// # Safety
/// `ptr` is NULL or a block from `ck_huge_alloc` that is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ck_huge_free(ptr: *mut c_void, bytes: usize) {
    guard((), || {
        if ptr.is_null() {
            return;
        }
        // SAFETY: a block the engine holds at `ptr` is the caller's.
        if unsafe { ENGINE.free(ptr.cast(), &Policy::CK_HUGE) }.is_none() {
            set_last_error(format!(
                "ck_huge_free: {ptr:p} ({bytes} bytes) was not returned by ck_huge_alloc or is already freed"
            ));
        }
    })
}

// ---- bump arena

use crate::arena::{ArenaMode, BumpArena};
use std::ffi::CStr;
use std::path::Path;

/// `ck_bump_mode_t`.
pub const CK_BUMP_MODE_UNINITIALIZED: u32 = 0;
/// `ck_bump_mode_t`: anonymous memory.
pub const CK_BUMP_MODE_ANON: u32 = 1;
/// `ck_bump_mode_t`: weights mapped read-only from the file.
pub const CK_BUMP_MODE_MIXED_FILE_BACKED: u32 = 2;

/// `ck_bump_alloc_t`, field for field. `mode` is read as a plain `u32`: C
/// memory may hold any value there, and turning it into a Rust enum would be
/// undefined behaviour.
#[repr(C)]
#[derive(Debug)]
pub struct CkBumpAlloc {
    /// Start of the arena (offset 0).
    pub base: *mut u8,
    /// Bytes in the arena.
    pub total_size: usize,
    /// Offset of the weights region.
    pub weights_base: usize,
    /// Offset of the runtime region.
    pub activations_base: usize,
    /// Bytes of address space the arena occupies.
    pub mapped_len: usize,
    /// Size of the weights file, 0 without one.
    pub weights_file_size: usize,
    /// A `ck_bump_mode_t` value.
    pub mode: u32,
}

#[cfg(target_pointer_width = "64")]
mod layout_checks {
    use super::CkBumpAlloc;
    static_assertions::assert_eq_size!(CkBumpAlloc, [u8; 56]);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, base), 0);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, total_size), 8);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, weights_base), 16);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, activations_base), 24);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, mapped_len), 32);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, weights_file_size), 40);
    static_assertions::const_assert_eq!(std::mem::offset_of!(CkBumpAlloc, mode), 48);
}

/// Live arenas, by base address. The C struct has no room for a handle, so
/// the base pointer is the key (it is unique while the arena lives).
static ARENAS: PoolLock<BTreeMap<usize, BumpArena>> = PoolLock::new(BTreeMap::new());

/// The fork hooks of the arena registry (stage `CArenas` of `crate::fork`):
/// take its lock before `fork()`, release it in parent and child.
static ARENA_FORK_HOOKS: Hooks = Hooks {
    prepare: lock_arenas,
    parent: unlock_arenas,
    child: unlock_arenas,
};
fn lock_arenas() {
    ARENAS.raw_lock();
}

/// # Safety
/// The calling thread took the lock with [`lock_arenas`] (the forking
/// thread, or the child's only thread).
unsafe fn unlock_arenas() {
    // SAFETY: the caller holds the lock.
    unsafe { ARENAS.force_unlock() }
}

crate::fork::at_load!(ADD_C_ABI_FORK_HOOKS, {
    crate::fork::add(Stage::CArenas, &ARENA_FORK_HOOKS);
});

/// Holds the `ck_bump_alloc_*` arena registry lock (test hook).
pub fn hold_arena_registry() -> HeldLock<'static> {
    ARENAS.hold()
}

const ZEROED: CkBumpAlloc = CkBumpAlloc {
    base: std::ptr::null_mut(),
    total_size: 0,
    weights_base: 0,
    activations_base: 0,
    mapped_len: 0,
    weights_file_size: 0,
    mode: CK_BUMP_MODE_UNINITIALIZED,
};

impl Default for CkBumpAlloc {
    /// The zeroed struct a C caller declares (`ck_bump_alloc_t a = {0};`):
    /// null base, zero sizes, mode `CK_BUMP_MODE_UNINITIALIZED`.
    fn default() -> Self {
        ZEROED
    }
}

/// A C path argument as a `Path` (NULL is `None`).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn c_path<'a>(p: *const c_char) -> Option<&'a Path> {
    use std::os::unix::ffi::OsStrExt;
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Some(Path::new(std::ffi::OsStr::from_bytes(bytes)))
}

/// `ck_bump_alloc_init`: see `include/ckernel_alloc.h`.
///
/// # Safety
/// `alloc` is NULL or points to writable memory for a `ck_bump_alloc_t`;
/// `weights_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ck_bump_alloc_init(
    alloc: *mut CkBumpAlloc,
    weights_path: *const c_char,
    total_size: usize,
    weights_base: usize,
    activations_base: usize,
) -> c_int {
    guard(-1, || {
        if alloc.is_null() {
            set_last_error("ck_bump_alloc_init: alloc is NULL");
            return -1;
        }
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { alloc.write(ZEROED) };
        // SAFETY: the caller's contract on weights_path.
        let path = unsafe { c_path(weights_path) };
        // Not an allocation path: retry registering the fork handlers if
        // that failed when the library was loaded.
        crate::fork::ensure_registered();
        let arena = match BumpArena::new(path, total_size, weights_base, activations_base) {
            Ok(a) => a,
            Err(e) => {
                set_last_error(format!("ck_bump_alloc_init: {e}"));
                return -1;
            }
        };
        let filled = CkBumpAlloc {
            base: arena.as_ptr().cast_mut(),
            total_size: arena.total_size(),
            weights_base: arena.weights_base(),
            activations_base: arena.activations_base(),
            mapped_len: arena.mapped_len(),
            weights_file_size: arena
                .weights_file_size()
                .map_or(0, |s| usize::try_from(s).unwrap_or(usize::MAX)),
            mode: match arena.mode() {
                ArenaMode::Anon => CK_BUMP_MODE_ANON,
                ArenaMode::MixedFileBacked => CK_BUMP_MODE_MIXED_FILE_BACKED,
            },
        };
        lock(&ARENAS).insert(filled.base as usize, arena);
        // SAFETY: as above.
        unsafe { alloc.write(filled) };
        0
    })
}

/// `ck_bump_alloc_free`: see `include/ckernel_alloc.h`.
///
/// # Safety
/// `alloc` is NULL or points to a `ck_bump_alloc_t` (initialized, freed or
/// zeroed); no pointer into the arena is used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ck_bump_alloc_free(alloc: *mut CkBumpAlloc) {
    guard((), || {
        if alloc.is_null() {
            return;
        }
        // SAFETY: readable by the caller's contract; only the pointer field
        // is read, as an address.
        let base = unsafe { (*alloc).base } as usize;
        let arena = lock(&ARENAS).remove(&base);
        drop(arena); // unmaps, outside the lock
                     // SAFETY: writable by the caller's contract.
        unsafe { alloc.write(ZEROED) };
    })
}

/// `ck_bump_alloc_needs_weight_materialization`: 1 unless the arena is in
/// mixed mode (also 1 for NULL or an uninitialized struct), as in C-Kernel-Engine.
///
/// # Safety
/// `alloc` is NULL or points to a `ck_bump_alloc_t`.
#[no_mangle]
pub unsafe extern "C" fn ck_bump_alloc_needs_weight_materialization(
    alloc: *const CkBumpAlloc,
) -> c_int {
    if alloc.is_null() {
        return 1;
    }
    // SAFETY: readable by the caller's contract; `mode` is a plain u32.
    let mode = unsafe { (*alloc).mode };
    c_int::from(mode != CK_BUMP_MODE_MIXED_FILE_BACKED)
}

/// `ck_bump_alloc_materialize_weights`: copy the weights into an anonymous
/// arena; a no-op returning 0 in mixed mode.
///
/// # Safety
/// `alloc` is NULL or points to a `ck_bump_alloc_t`; `weights_path` is NULL
/// or a NUL-terminated string. No other thread uses the arena meanwhile.
#[no_mangle]
pub unsafe extern "C" fn ck_bump_alloc_materialize_weights(
    alloc: *mut CkBumpAlloc,
    weights_path: *const c_char,
) -> c_int {
    guard(-1, || {
        if alloc.is_null() {
            set_last_error("ck_bump_alloc_materialize_weights: alloc is NULL");
            return -1;
        }
        // SAFETY: readable by the caller's contract.
        let base = unsafe { (*alloc).base } as usize;
        // Take the arena out of the registry so the copy runs without the lock.
        let Some(mut arena) = lock(&ARENAS).remove(&base) else {
            set_last_error("ck_bump_alloc_materialize_weights: the arena is not initialized");
            return -1;
        };
        // SAFETY: the caller's contract on weights_path.
        let path = unsafe { c_path(weights_path) };
        let result = match (arena.mode(), path) {
            (ArenaMode::MixedFileBacked, _) => Ok(()),
            (ArenaMode::Anon, Some(p)) => arena.materialize_weights_from(p),
            (ArenaMode::Anon, None) => arena.materialize_weights(),
        };
        if result.is_ok() {
            // The size of the file the weights were copied from.
            let size = arena
                .weights_file_size()
                .map_or(0, |s| usize::try_from(s).unwrap_or(usize::MAX));
            // SAFETY: writable by the caller's contract; no other thread uses
            // the arena meanwhile.
            unsafe { (*alloc).weights_file_size = size };
        }
        lock(&ARENAS).insert(base, arena);
        match result {
            Ok(()) => 0,
            Err(e) => {
                set_last_error(format!("ck_bump_alloc_materialize_weights: {e}"));
                -1
            }
        }
    })
}
