//! Replacing this process with the program: the search of `execvp(3)`
//! (glibc's `posix/execvpe.c`) with `execve(2)` called here, so that a
//! file the kernel will not run is never read as shell commands by
//! mistake.
//!
//! - A name with a slash is run as it is. Otherwise each `PATH` entry in
//!   turn (`/bin:/usr/bin` when `PATH` is unset; an empty entry is the
//!   current directory): `EACCES` is remembered and the search goes on;
//!   `ENOENT`, `ENOTDIR`, `ESTALE`, `ENODEV` and `ETIMEDOUT` go on; any
//!   other error ends it. An empty name is not found.
//! - A file the kernel refuses as `ENOEXEC` (no `#!` line and no format it
//!   knows) runs under `/bin/sh` with its arguments, as `execvp` runs it,
//!   unless it starts with the ELF magic: an ELF file for another machine
//!   or a damaged one is refused with "exec format error", as bash
//!   refuses it, where `execvp` would hand its bytes to the shell.
//! - The program gets this process's environment with `LD_PRELOAD`
//!   replaced, and `SIGPIPE` back at its default action (the Rust runtime
//!   ignores it, and an ignored signal stays ignored across `execve`).

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The shell `execvp` runs a file of commands with (`_PATH_BSHELL`).
const SHELL: &CStr = c"/bin/sh";

/// `PATH` when it is unset (glibc's `_CS_PATH`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// Why the program did not start: the exit status to return (127 when it
/// is not found, 126 when it is found but cannot run, as `sh` and `env`
/// return) and the message.
#[derive(Debug)]
pub struct NotRun {
    /// The exit status.
    pub code: u8,
    /// What happened, naming the file.
    pub why: String,
}

/// Runs `command` (the program, then its arguments) with
/// `LD_PRELOAD=preload`; returns only when it could not be started.
pub fn exec(command: &[OsString], preload: &OsStr) -> NotRun {
    let program = command.first().map_or(OsStr::new(""), OsString::as_os_str);
    if program.is_empty() {
        return NotRun {
            code: 127,
            why: "cannot run \"\": an empty program name".into(),
        };
    }
    let (Some(argv), Some(envp)) = (c_strings(command), environment(preload)) else {
        return NotRun {
            code: 126,
            why: format!(
                "cannot run {}: an argument holds a NUL byte",
                shown(program)
            ),
        };
    };
    // SAFETY: restoring a signal's default action has no precondition.
    let old = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let out = search(program, &argv, &envp);
    // SAFETY: as above; `old` came from `signal` itself.
    unsafe { libc::signal(libc::SIGPIPE, old) };
    out
}

/// The search (see the module's text) over [`places`]. The error shown
/// is the first `EACCES`, else the first error of a file that exists (its
/// interpreter missing), else "not found".
fn search(program: &OsStr, args: &[CString], envp: &[CString]) -> NotRun {
    let mut denied: Option<PathBuf> = None;
    let mut present: Option<(i32, PathBuf)> = None;
    for path in places(program) {
        let Some(c) = CString::new(path.as_os_str().as_bytes()).ok() else {
            continue;
        };
        let argv: Vec<&CStr> = args.iter().map(CString::as_c_str).collect();
        let mut errno = execve(&c, &argv, envp);
        if errno == libc::ENOEXEC {
            if starts_with_elf_magic(&path) {
                return NotRun {
                    code: 126,
                    why: format!(
                        "cannot run {}: exec format error (an ELF file this kernel cannot \
                         run: built for another machine, or damaged)",
                        shown(path.as_os_str())
                    ),
                };
            }
            let argv: Vec<&CStr> = [SHELL, &c]
                .into_iter()
                .chain(args[1..].iter().map(CString::as_c_str))
                .collect();
            errno = execve(SHELL, &argv, envp);
        }
        match errno {
            libc::EACCES => {
                denied.get_or_insert(path);
            }
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {
                if present.is_none() && std::fs::metadata(&path).is_ok() {
                    present = Some((errno, path));
                }
            }
            _ => return explain(errno, &path),
        }
    }
    if let Some(path) = denied {
        return explain(libc::EACCES, &path);
    }
    if let Some((errno, path)) = present {
        return explain(errno, &path);
    }
    if program.as_bytes().contains(&b'/') {
        return explain(libc::ENOENT, Path::new(program));
    }
    NotRun {
        code: 127,
        why: format!("cannot run {}: not found in PATH", shown(program)),
    }
}

/// The paths `execvp` tries for `program`, in order.
pub(super) fn places(program: &OsStr) -> Vec<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return vec![PathBuf::from(program)];
    }
    let path = std::env::var_os("PATH");
    let path = path.as_ref().map_or(DEFAULT_PATH, |p| p.as_bytes());
    path.split(|&b| b == b':')
        .map(|dir| match dir {
            b"" => PathBuf::from(program),
            _ => Path::new(OsStr::from_bytes(dir)).join(program),
        })
        .collect()
}

/// `execve(path, argv, envp)`; the `errno` it failed with.
fn execve(path: &CStr, argv: &[&CStr], envp: &[CString]) -> i32 {
    let argv: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: Vec<*const libc::c_char> = envp
        .iter()
        .map(|e| e.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    // SAFETY: `path` and every string are NUL-terminated and outlive the
    // call; both arrays end with a null pointer.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::ENOEXEC)
}

/// The message and status for `errno` from running `path`.
fn explain(errno: i32, path: &Path) -> NotRun {
    let name = shown(path.as_os_str());
    let meta = std::fs::metadata(path);
    let (code, what) = match errno {
        // The file is there: what is missing is the program that runs it.
        libc::ENOENT if meta.is_ok() => (126, missing_interpreter(path)),
        libc::ENOENT => (127, "no such file or directory".to_owned()),
        libc::EACCES if meta.as_ref().is_ok_and(|m| m.is_dir()) => {
            (126, "is a directory".to_owned())
        }
        libc::EACCES => (
            126,
            "permission denied (no execute permission, or a file system mounted noexec)".into(),
        ),
        e => (126, std::io::Error::from_raw_os_error(e).to_string()),
    };
    NotRun {
        code,
        why: format!("cannot run {name}: {what}"),
    }
}

/// Why the kernel said `ENOENT` for a file that exists: its `#!`
/// interpreter, or for an ELF program its dynamic loader (`PT_INTERP`),
/// does not exist.
fn missing_interpreter(path: &Path) -> String {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    if let Some(line) = head[..n].strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or(line);
        let first = line
            .split(|b| b.is_ascii_whitespace())
            .find(|w| !w.is_empty())
            .unwrap_or(b"");
        return format!(
            "its interpreter {} (the #! line) does not exist",
            shown(OsStr::from_bytes(first))
        );
    }
    "its program interpreter (the dynamic loader its PT_INTERP names) does not exist".into()
}

/// Whether the file at `path` starts with `\x7fELF`.
fn starts_with_elf_magic(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

/// `s` for a message: escaped, and quoted when empty.
fn shown(s: &OsStr) -> String {
    let text = s.to_string_lossy();
    if text.is_empty() {
        return "\"\"".into();
    }
    text.escape_debug().to_string()
}

/// Each of `items` as a C string; `None` when one holds a NUL byte.
fn c_strings(items: &[OsString]) -> Option<Vec<CString>> {
    items
        .iter()
        .map(|a| CString::new(a.as_bytes()).ok())
        .collect()
}

/// This process's environment as `NAME=value` strings, `LD_PRELOAD` set
/// to `preload`.
fn environment(preload: &OsStr) -> Option<Vec<CString>> {
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os().filter(|(n, _)| n != "LD_PRELOAD") {
        let mut e = name.as_bytes().to_vec();
        e.push(b'=');
        e.extend_from_slice(value.as_bytes());
        out.push(CString::new(e).ok()?);
    }
    let mut e = b"LD_PRELOAD=".to_vec();
    e.extend_from_slice(preload.as_bytes());
    out.push(CString::new(e).ok()?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_follow_path_as_execvp_does() {
        assert_eq!(places(OsStr::new("./x")), [PathBuf::from("./x")]);
        assert_eq!(places(OsStr::new("/a/x")), [PathBuf::from("/a/x")]);
        let p = places(OsStr::new("sh"));
        let path = std::env::var_os("PATH").unwrap();
        assert_eq!(p.len(), std::env::split_paths(&path).count());
        assert!(p.iter().all(|c| c.ends_with("sh")));
    }

    #[test]
    fn messages_name_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s");
        std::fs::write(&script, "#!/nonexistent/interp -x\n").unwrap();
        let n = explain(libc::ENOENT, &script);
        assert_eq!(n.code, 126);
        assert!(
            n.why
                .ends_with("its interpreter /nonexistent/interp (the #! line) does not exist"),
            "{}",
            n.why
        );
        let n = explain(libc::ENOENT, &dir.path().join("none"));
        assert_eq!(n.code, 127);
        assert!(n.why.ends_with("no such file or directory"), "{}", n.why);
        let n = explain(libc::EACCES, dir.path());
        assert_eq!((n.code, n.why.ends_with("is a directory")), (126, true));
        assert_eq!(shown(OsStr::new("")), "\"\"");
        assert_eq!(shown(OsStr::new("a\nb")), "a\\nb");
    }
}
