//! The mount flags of the file system a path or an open file is on
//! (`statvfs(3)`'s `f_flag`) that change what the kernel and `ld.so` do with a file there:
//! `ST_NOEXEC`, where `ld.so` cannot map a library's code, and
//! `ST_NOSUID`, where `execve` ignores set-user-ID and set-group-ID bits
//! and file capabilities.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `f_flag` of the file system `path` is on; `None` when `statvfs` fails
/// (the path is missing or holds a NUL byte).
fn flags(path: &Path) -> Option<libc::c_ulong> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is plain data; zeroed is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a `statvfs`, both
    // living for the call.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (r == 0).then_some(st.f_flag)
}

/// `f_flag` of the file system the open `file` is on (`fstatvfs`: the
/// file itself, whatever its path names by the time it is asked); `None`
/// when `fstatvfs` fails.
fn flags_of(file: &File) -> Option<libc::c_ulong> {
    // SAFETY: `statvfs` is plain data; zeroed is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open file descriptor `file` owns and a pointer to a
    // `statvfs`, both living for the call.
    let r = unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) };
    (r == 0).then_some(st.f_flag)
}

/// Whether the open `file` is on a file system mounted `noexec`.
pub fn noexec(file: &File) -> bool {
    flags_of(file).is_some_and(|f| f & libc::ST_NOEXEC != 0)
}

/// Whether `path` is on a file system mounted `nosuid`.
pub fn nosuid(path: &Path) -> bool {
    flags(path).is_some_and(|f| f & libc::ST_NOSUID != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_exists_has_flags_and_one_that_does_not_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let f = flags(dir.path()).unwrap();
        let open = File::open(dir.path()).unwrap();
        assert_eq!(flags_of(&open), Some(f));
        assert_eq!(noexec(&open), f & libc::ST_NOEXEC != 0);
        assert_eq!(nosuid(dir.path()), f & libc::ST_NOSUID != 0);
        assert_eq!(flags(&dir.path().join("missing")), None);
        assert!(!nosuid(&dir.path().join("missing")));
        assert!(!nosuid(Path::new("/nonexistent\0/x")));
    }
}
