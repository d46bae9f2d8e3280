//! Whether this process may read, write or execute a path, as the kernel
//! answers `access(2)` (for the real user and group IDs, which the program
//! `ckalloc run` starts keeps): asked of the summary file and its directory
//! in the settings check, and of the programs, `#!` interpreters and
//! dynamic loaders in `ckalloc run`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether `access(path, mode)` succeeds: `mode` is `libc::R_OK`,
/// `libc::W_OK`, `libc::X_OK` or a union of them. `false` when it fails for
/// any reason (the file is missing, a directory of the path cannot be
/// searched, the permission is missing, the file system is read-only for
/// `W_OK`) and for a path holding a NUL byte, which no file has.
pub fn permitted(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated path that outlives the call;
    // `access` reads it and nothing else.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_mode_is_asked_of_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(permitted(&file, libc::R_OK | libc::W_OK));
        // Not even root may execute a file without an execute bit.
        assert!(!permitted(&file, libc::X_OK));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(permitted(&file, libc::X_OK));
        assert!(permitted(dir.path(), libc::W_OK | libc::X_OK));
        assert!(!permitted(&dir.path().join("missing"), libc::R_OK));
        assert!(!permitted(&dir.path().join("missing"), libc::W_OK));
        assert!(!permitted(Path::new("/nonexistent\0/x"), libc::F_OK));
    }
}
