//! The C ABI (feature `capi`): a drop-in for C-Kernel-Engine's
//! `ckernel_alloc.h`; the header is `include/ckernel_alloc.h`.
//!
//! Differences from the C original, all fixes: a size whose rounding to
//! 2 MiB overflows returns NULL instead of wrapping to a zero-length block;
//! `ck_huge_free` releases the whole block whatever `bytes` says (a registry
//! remembers each block's mapped length, as the original's does) and ignores
//! pointers it did not hand out; failures set a thread-local
//! [`ck_last_error`] string instead of printing; no Rust panic crosses the
//! boundary (each entry point catches it and reports failure).

use crate::huge::{map_huge, unmap, HugeOptions};
use crate::sys::HUGE_PAGE_2M;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Live `ck_huge_alloc` blocks: address -> mapped length.
static BLOCKS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// The reason for the last failure on the calling thread, `""` if none. The
/// pointer stays valid until the next failure on the same thread.
#[no_mangle]
pub extern "C" fn ck_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// `ck_huge_alloc(bytes)`: see `include/ckernel_alloc.h`.
#[no_mangle]
pub extern "C" fn ck_huge_alloc(bytes: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        match map_huge(bytes, HUGE_PAGE_2M, &HugeOptions::new()) {
            Ok(m) => {
                lock(&BLOCKS).insert(m.ptr.as_ptr() as usize, m.mapped_len);
                m.ptr.as_ptr().cast()
            }
            Err(e) => {
                set_last_error(format!("ck_huge_alloc: {e}"));
                std::ptr::null_mut()
            }
        }
    })
}

/// `ck_huge_free(ptr, bytes)`: see `include/ckernel_alloc.h`.
///
/// # Safety
/// `ptr` is NULL or a block from `ck_huge_alloc` that is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ck_huge_free(ptr: *mut c_void, bytes: usize) {
    guard((), || {
        let Some(p) = NonNull::new(ptr.cast::<u8>()) else {
            return;
        };
        let Some(len) = lock(&BLOCKS).remove(&(p.as_ptr() as usize)) else {
            set_last_error(format!(
                "ck_huge_free: {ptr:p} ({bytes} bytes) was not returned by ck_huge_alloc or is already freed"
            ));
            return;
        };
        unmap(p, len);
    })
}
