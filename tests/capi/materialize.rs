//! `ck_bump_alloc_materialize_weights(alloc, path)` on an arena built
//! without a weights file: after success the struct's `weights_file_size` is
//! the `st_size` of the file the weights were copied from.

use ckalloc::capi::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

const MIB: usize = 1 << 20;

#[test]
fn materialize_from_path_records_the_file_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.bin");
    // Not a multiple of the page size: the region ends inside the file's
    // last page, and the recorded size must be the file's, not the region's.
    let file_size = 3 * 4096 + 123;
    let bytes: Vec<u8> = (0..file_size).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&path, &bytes).unwrap();
    let cpath = CString::new(path.as_os_str().as_bytes()).unwrap();

    let mut a = CkBumpAlloc::default();
    let ab = 3 * 4096 + 100;
    // SAFETY: `a` is a valid struct; NULL path means no weights file.
    let rc = unsafe { ck_bump_alloc_init(&mut a, std::ptr::null(), 8 * MIB, 0, ab) };
    assert_eq!(rc, 0);
    assert_eq!(a.weights_file_size, 0, "no file yet");
    assert_eq!(a.mode, CK_BUMP_MODE_ANON);

    // SAFETY: `a` was initialised above; the path is NUL-terminated.
    let rc = unsafe { ck_bump_alloc_materialize_weights(&mut a, cpath.as_ptr()) };
    assert_eq!(rc, 0);
    assert_eq!(a.weights_file_size, file_size);
    // SAFETY: the weights region `[0, ab)` is mapped and now filled.
    let w = unsafe { std::slice::from_raw_parts(a.base, ab) };
    assert_eq!(w, &bytes[..ab]);

    // A second file of another size: the struct follows the last copy.
    let path2 = dir.path().join("w2.bin");
    std::fs::write(&path2, vec![9u8; 4 * 4096]).unwrap();
    let cpath2 = CString::new(path2.as_os_str().as_bytes()).unwrap();
    // SAFETY: as above.
    let rc = unsafe { ck_bump_alloc_materialize_weights(&mut a, cpath2.as_ptr()) };
    assert_eq!(rc, 0);
    assert_eq!(a.weights_file_size, 4 * 4096);

    // SAFETY: initialised by ck_bump_alloc_init.
    unsafe { ck_bump_alloc_free(&mut a) };
}
