//! Under the C ABI (feature `capi`): a refused OS call makes `ck_huge_alloc`
//! return NULL and `ck_bump_alloc_init` / `ck_bump_alloc_materialize_weights`
//! return -1, with a reason in `ck_last_error()`, the struct left zeroed
//! (mode UNINITIALIZED), nothing mapped and the statistics unchanged.

use crate::serial;
use ckalloc::capi::*;
use ckalloc::fault::{self, Op};
use ckalloc::{huge_stats, reset_hugetlb_backoff};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;

const MIB: usize = 1 << 20;

fn last_error() -> String {
    // SAFETY: ck_last_error returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(ck_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn zeroed_struct() -> CkBumpAlloc {
    CkBumpAlloc {
        base: std::ptr::null_mut(),
        total_size: 0,
        weights_base: 0,
        activations_base: 0,
        mapped_len: 0,
        weights_file_size: 0,
        mode: 7,
    }
}

#[test]
fn c_entry_points_report_failures_and_leak_nothing() {
    let _g = serial();
    let start = huge_stats().live_bytes;

    // ck_huge_alloc: every mmap refused -> NULL and a reason (longer than
    // a span: it needs a span of its own).
    reset_hugetlb_backoff();
    fault::fail_from(Op::Mmap, 1, libc::ENOMEM);
    let p = ck_huge_alloc(1536 * MIB);
    fault::reset();
    assert!(p.is_null());
    assert!(last_error().contains("ck_huge_alloc"), "{}", last_error());
    assert_eq!(huge_stats().live_bytes, start);
    let p = ck_huge_alloc(5 * MIB);
    assert!(!p.is_null(), "works again once the fault is gone");
    // SAFETY: from ck_huge_alloc.
    unsafe { ck_huge_free(p, 5 * MIB) };
    assert_eq!(huge_stats().live_bytes, start);

    // ck_bump_alloc_init with a weights file, each OS call failing in turn.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.bump");
    std::fs::write(&path, vec![3u8; 3 * MIB + 17]).unwrap();
    let cpath = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut failures = 0;
    for op in [
        Op::Mmap,
        Op::Munmap,
        Op::Madvise,
        Op::Open,
        Op::Fstat,
        Op::Pread,
    ] {
        for n in 1..=6 {
            let mut s = zeroed_struct();
            let calls = fault::calls(op);
            fault::fail_nth(op, n, libc::EIO);
            // SAFETY: valid struct and path.
            let rc =
                unsafe { ck_bump_alloc_init(&mut s, cpath.as_ptr(), 16 * MIB, 4096, 3 * MIB + 17) };
            let fired = fault::calls(op) - calls >= n;
            fault::reset();
            if rc == 0 {
                assert_ne!(s.mode, CK_BUMP_MODE_UNINITIALIZED);
                // SAFETY: an initialized struct.
                unsafe { ck_bump_alloc_free(&mut s) };
                assert!(s.base.is_null() && s.mode == CK_BUMP_MODE_UNINITIALIZED);
            } else {
                failures += 1;
                assert_eq!(rc, -1);
                assert!(fired, "{op:?} #{n}: failed without a fault");
                assert!(s.base.is_null(), "{op:?} #{n}: base set on failure");
                assert_eq!(s.mode, CK_BUMP_MODE_UNINITIALIZED);
                assert!(
                    last_error().starts_with("ck_bump_alloc_init: "),
                    "{}",
                    last_error()
                );
                // Freeing a failed struct is harmless.
                // SAFETY: a zeroed struct.
                unsafe { ck_bump_alloc_free(&mut s) };
            }
            assert_eq!(huge_stats().live_bytes, start, "{op:?} #{n}: leaked");
        }
    }
    // open and fstat of the weights file at least (mmap failures fall back to mixed mode).
    assert!(failures >= 2, "{failures} failures");

    // Materialization: a failed read is -1; a retry succeeds.
    let mut s = zeroed_struct();
    // SAFETY: valid struct and path.
    let rc = unsafe { ck_bump_alloc_init(&mut s, cpath.as_ptr(), 16 * MIB, 4096, 3 * MIB + 17) };
    assert_eq!(rc, 0, "{}", last_error());
    if s.mode == CK_BUMP_MODE_ANON {
        fault::fail_nth(Op::Pread, 1, libc::EIO);
        // SAFETY: initialized struct, NULL path (the one given to init).
        let rc = unsafe { ck_bump_alloc_materialize_weights(&mut s, std::ptr::null()) };
        fault::reset();
        assert_eq!(rc, -1);
        assert!(last_error().contains("materialize"), "{}", last_error());
        // SAFETY: as above.
        let rc = unsafe { ck_bump_alloc_materialize_weights(&mut s, std::ptr::null()) };
        assert_eq!(rc, 0, "{}", last_error());
        // SAFETY: the weights region is materialized: 4096..3 MiB+17.
        let w = unsafe { std::slice::from_raw_parts(s.base.add(4096), 3 * MIB + 17 - 4096) };
        assert!(w.iter().all(|&b| b == 3));
    }
    // SAFETY: initialized struct.
    unsafe { ck_bump_alloc_free(&mut s) };
    assert_eq!(huge_stats().live_bytes, start);
}
