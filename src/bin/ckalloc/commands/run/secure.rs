//! Whether Linux runs a program in secure-execution mode for this process
//! (`AT_SECURE`; `ld.so(8)`, `getauxval(3)`), judged from the file's stat
//! data and extended attributes, never its content, as `execve` judges it
//! (`bprm_fill_uid` in `fs/exec.c`, `cap_bprm_creds_from_file` in
//! `security/commoncap.c`):
//!
//! - a set-user-ID file runs with its owner as the effective user ID, a
//!   set-group-ID file that is group-executable with its group as the
//!   effective group ID (`S_ISGID` without `S_IXGRP` marks mandatory
//!   locking and changes no ID); the mode is secure when either differs
//!   from the caller's real ID;
//! - file capabilities (`security.capability`) are secure for a caller
//!   whose real user ID is not root's;
//! - on a file system mounted `nosuid`, and for a process with
//!   `no_new_privs` set (`prctl(PR_SET_NO_NEW_PRIVS)`, inherited across
//!   `execve`), the kernel ignores both.
//!
//! Linux ignores the set-ID bits of a `#!` script (its interpreter runs
//! as the caller), so the answer is for the ELF file that runs, or for a
//! file that cannot be read to tell which it is.

use std::fmt;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::mount;

/// Why a program runs in secure-execution mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secure {
    /// Set-user-ID to another user or set-group-ID to another group.
    SetId,
    /// File capabilities, for a caller other than root.
    Capabilities,
}

impl fmt::Display for Secure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Secure::SetId => "is set-user-ID or set-group-ID to another user or group",
            Secure::Capabilities => "has file capabilities",
        })
    }
}

/// What `execve` reads of a file for its set-ID bits.
#[derive(Clone, Copy, Debug)]
struct SetIdFile {
    /// `st_mode`.
    mode: u32,
    /// `st_uid`.
    owner: u32,
    /// `st_gid`.
    group: u32,
    /// The file system is mounted `nosuid`.
    nosuid: bool,
}

/// The process that runs the file.
#[derive(Clone, Copy, Debug)]
struct Caller {
    /// The real user ID.
    uid: u32,
    /// The real group ID.
    gid: u32,
    /// `no_new_privs` is set.
    no_new_privs: bool,
}

impl Caller {
    fn this_process() -> Caller {
        // The kernel reads each argument of `prctl` as an unsigned long
        // and refuses PR_GET_NO_NEW_PRIVS unless the unused ones are zero.
        let zero: libc::c_ulong = 0;
        // SAFETY: getuid and getgid cannot fail; PR_GET_NO_NEW_PRIVS takes
        // no pointer and answers 0 or 1 (-1 on a kernel before 3.5, taken
        // as not set).
        let (uid, gid, nnp) = unsafe {
            (
                libc::getuid(),
                libc::getgid(),
                libc::prctl(libc::PR_GET_NO_NEW_PRIVS, zero, zero, zero, zero),
            )
        };
        Caller {
            uid,
            gid,
            no_new_privs: nnp == 1,
        }
    }

    /// Whether the kernel may grant this caller new IDs or capabilities
    /// from a file.
    fn may_gain(&self, file: &SetIdFile) -> bool {
        !file.nosuid && !self.no_new_privs
    }
}

/// Whether running `file` gives `caller` an effective user or group ID
/// other than its real one.
fn changes_ids(file: &SetIdFile, caller: &Caller) -> bool {
    let setuid = file.mode & libc::S_ISUID != 0 && file.owner != caller.uid;
    let group_bits = libc::S_ISGID | libc::S_IXGRP;
    let setgid = file.mode & group_bits == group_bits && file.group != caller.gid;
    caller.may_gain(file) && (setuid || setgid)
}

/// Why this process would run the regular file at `path` (whose stat data
/// is `meta`) in secure-execution mode; `None` when it would not.
pub fn secure_execution(path: &Path, meta: &Metadata) -> Option<Secure> {
    let caller = Caller::this_process();
    let file = SetIdFile {
        mode: meta.mode(),
        owner: meta.uid(),
        group: meta.gid(),
        nosuid: mount::nosuid(path),
    };
    if changes_ids(&file, &caller) {
        return Some(Secure::SetId);
    }
    (caller.uid != 0 && caller.may_gain(&file) && has_capabilities(path))
        .then_some(Secure::Capabilities)
}

/// Whether the file carries `security.capability` (file capabilities).
/// The attribute is read without read permission on the file.
fn has_capabilities(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: NUL-terminated strings; a null buffer of size 0 asks only for
    // the value's size.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_id_bits_of_another_user_or_group_change_ids_unless_ignored() {
        let user = Caller {
            uid: 65534,
            gid: 65534,
            no_new_privs: false,
        };
        let root = Caller {
            uid: 0,
            gid: 0,
            ..user
        };
        let file = |mode: u32| SetIdFile {
            mode: libc::S_IFREG | mode,
            owner: 0,
            group: 0,
            nosuid: false,
        };
        // Mode 4711 owned by root: execute-only, set-user-ID.
        assert!(changes_ids(&file(0o4711), &user));
        assert!(changes_ids(&file(0o4755), &user));
        assert!(!changes_ids(&file(0o4711), &root), "root's own file");
        assert!(!changes_ids(&file(0o0711), &user));
        assert!(changes_ids(&file(0o2711), &user));
        // Set-group-ID without group execute: mandatory locking, no new ID.
        assert!(!changes_ids(&file(0o2701), &user));
        let own = SetIdFile {
            owner: 65534,
            group: 65534,
            ..file(0o6755)
        };
        assert!(!changes_ids(&own, &user), "the caller's own user and group");
        let nosuid = SetIdFile {
            nosuid: true,
            ..file(0o4711)
        };
        assert!(!changes_ids(&nosuid, &user));
        let nnp = Caller {
            no_new_privs: true,
            ..user
        };
        assert!(!changes_ids(&file(0o4711), &nnp));
    }

    #[test]
    fn a_plain_file_is_not_secure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"").unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(secure_execution(&p, &meta), None);
        assert_eq!(
            Secure::SetId.to_string(),
            "is set-user-ID or set-group-ID to another user or group"
        );
    }
}
