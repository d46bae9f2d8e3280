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

use super::elf::{loader_of, MAGIC};
use crate::access::permitted;

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

/// The search (see the module's text) over [`places`]. For a name with a
/// slash the error shown is that of its one try; in a `PATH` search, the
/// first `EACCES`, else the first error of a file that exists (its
/// interpreter missing), else "not found in PATH".
fn search(program: &OsStr, args: &[CString], envp: &[CString]) -> NotRun {
    let mut denied: Option<PathBuf> = None;
    let mut present: Option<(i32, PathBuf)> = None;
    let mut last = libc::ENOENT;
    for path in places(program) {
        let Some(c) = CString::new(path.as_os_str().as_bytes()).ok() else {
            continue;
        };
        let argv: Vec<&CStr> = args.iter().map(CString::as_c_str).collect();
        let mut errno = execve(&c, &argv, envp);
        if errno == libc::ENOEXEC {
            if let Some(refused) = not_for_the_shell(&path) {
                return refused;
            }
            let argv: Vec<&CStr> = [SHELL, &c]
                .into_iter()
                .chain(args[1..].iter().map(CString::as_c_str))
                .collect();
            errno = execve(SHELL, &argv, envp);
        }
        last = errno;
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
    if program.as_bytes().contains(&b'/') {
        return explain(last, Path::new(program));
    }
    if let Some(path) = denied {
        return explain(libc::EACCES, &path);
    }
    if let Some((errno, path)) = present {
        return explain(errno, &path);
    }
    NotRun {
        code: 127,
        why: format!("cannot run {}: not found in PATH", shown(program)),
    }
}

/// The refusal of a file the kernel answered `ENOEXEC` for that must not
/// go to `/bin/sh`: an ELF file (another machine's, or damaged), a binary
/// file (a NUL byte in its first line within 80 bytes, bash's
/// `check_binary_file` rule), or a script whose `#!` interpreter the kernel
/// would not run (its body is another language's, not commands for the
/// shell). `None` for a file of commands.
fn not_for_the_shell(path: &Path) -> Option<NotRun> {
    let head = head_of(path);
    let why = if head.starts_with(MAGIC) {
        "exec format error (an ELF file this kernel cannot run: built for another machine, or \
         damaged)"
            .to_owned()
    } else if head[..head.len().min(80)]
        .split(|&b| b == b'\n')
        .next()
        .is_some_and(|first| first.contains(&0))
    {
        "exec format error (a binary file: a NUL byte in its first line, where bash refuses \
         it too)"
            .to_owned()
    } else if let Some(line) = head.strip_prefix(b"#!") {
        let interp = interpreter_of(line);
        // `#!` alone: the kernel finds no interpreter, and `execvp` hands
        // the file to the shell, as `env` and bash do.
        if interp.is_empty() {
            return None;
        }
        if head.len() == HEAD && !head.contains(&b'\n') {
            return Some(NotRun {
                code: 126,
                why: format!(
                    "cannot run {}: exec format error: its #! line is longer than the {} bytes \
                     Linux reads (BINPRM_BUF_SIZE); shorten the interpreter's path (a deep \
                     virtual environment: run its python by path instead)",
                    shown(path.as_os_str()),
                    HEAD - 1
                ),
            });
        }
        format!(
            "exec format error: its interpreter {} (the #! line) is not a program this kernel \
             runs",
            shown(OsStr::from_bytes(interpreter_of(line)))
        )
    } else {
        return None;
    };
    Some(NotRun {
        code: 126,
        why: format!("cannot run {}: {why}", shown(path.as_os_str())),
    })
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

/// The message and status for `errno` from running `path`: 127 when
/// something it needs does not exist (the file, its `#!` interpreter, its
/// dynamic loader), as `sh`, `env` and bash return; 126 otherwise. When the
/// file exists, an error the kernel met on its way to the interpreter or
/// the loader is told as theirs.
fn explain(errno: i32, path: &Path) -> NotRun {
    let name = shown(path.as_os_str());
    let meta = std::fs::metadata(path);
    let theirs = match errno {
        // A file this process may not execute is refused for itself.
        libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EACCES
            if meta.as_ref().is_ok_and(|m| m.is_file()) && permitted(path, libc::X_OK) =>
        {
            needs(path, 0)
        }
        _ => None,
    };
    let (code, what) = match (theirs, errno) {
        (Some(t), _) => t,
        (None, libc::ENOENT) if meta.is_ok() => (
            127,
            "its #! interpreter or its dynamic loader does not exist (the file cannot be read \
             to tell which)"
                .to_owned(),
        ),
        (None, libc::ENOENT) => (127, "no such file or directory".to_owned()),
        (None, libc::ENOTDIR) => (
            126,
            "not a directory (a component of the path is a file)".to_owned(),
        ),
        (None, libc::EACCES) => match &meta {
            Ok(m) if m.is_dir() => (126, "is a directory".to_owned()),
            Ok(m) if !m.is_file() => (
                126,
                "not a regular file (a FIFO, socket or device)".to_owned(),
            ),
            _ => (
                126,
                "permission denied (no execute permission on the file or no search permission \
                 on a directory of its path, or a file system mounted noexec)"
                    .to_owned(),
            ),
        },
        (None, e) => (126, std::io::Error::from_raw_os_error(e).to_string()),
    };
    NotRun {
        code,
        why: format!("cannot run {name}: {what}"),
    }
}

/// What keeps the regular file at `path` from running although it is
/// there: its `#!` interpreter (followed through `#!` chains as Linux
/// does, at most [`MAX_INTERPRETERS`] deep) or its dynamic loader is
/// missing (127), or is a directory, not executable, or unreachable (126);
/// `None` when neither is the cause or the file cannot be read.
fn needs(path: &Path, depth: usize) -> Option<(u8, String)> {
    let head = head_of(path);
    if head.starts_with(MAGIC) {
        return loader_problem(path);
    }
    let line = head.strip_prefix(b"#!")?;
    let interp = interpreter_of(line);
    let p = Path::new(OsStr::from_bytes(interp));
    let shown_interp = format!("its interpreter {} (the #! line)", shown(p.as_os_str()));
    let (code, what) = match std::fs::metadata(p) {
        Err(_) if interp.ends_with(b"\r") => (
            127,
            "does not exist: the line ends in a carriage return (CRLF line endings; convert \
             them with `dos2unix` or `sed -i 's/\\r$//'`)"
                .to_owned(),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (127, "does not exist".to_owned()),
        Err(e) => (126, format!("cannot be reached: {e}")),
        Ok(m) if m.is_dir() => (126, "is a directory".to_owned()),
        Ok(m) if !m.is_file() || !permitted(p, libc::X_OK) => {
            (126, "is not an executable file".to_owned())
        }
        Ok(_) if depth + 1 >= MAX_INTERPRETERS && head_of(p).starts_with(b"#!") => (
            126,
            format!("is a script too, and #! chains deeper than {MAX_INTERPRETERS} do not run"),
        ),
        Ok(_) => {
            let (code, inner) = needs(p, depth + 1)?;
            (code, format!("cannot run: {inner}"))
        }
    };
    Some((code, format!("{shown_interp} {what}")))
}

/// `#!` scripts Linux runs in one chain before it gives up (`ELOOP`): a
/// script, its interpreter a script, and so on, 5 deep, then a program.
pub(super) const MAX_INTERPRETERS: usize = 5;

/// Why the ELF program at `path` cannot run for its dynamic loader
/// (`PT_INTERP`): missing (127), a directory, not executable or
/// unreachable (126); `None` when the loader is fine or none is named.
fn loader_problem(path: &Path) -> Option<(u8, String)> {
    let loader = loader_of(path)?;
    let shown_loader = format!("its dynamic loader {}", shown(loader.as_os_str()));
    let (code, what) = match std::fs::metadata(&loader) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (127, "does not exist".to_owned()),
        Err(e) => (126, format!("cannot be reached: {e}")),
        Ok(m) if m.is_dir() => (126, "is a directory".to_owned()),
        Ok(m) if !m.is_file() || !permitted(&loader, libc::X_OK) => {
            (126, "is not an executable file".to_owned())
        }
        Ok(_) => return None,
    };
    Some((code, format!("{shown_loader} (PT_INTERP) {what}")))
}

/// The interpreter path of a `#!` line (after the `#!`): its first word,
/// split at spaces and tabs and ended by a newline or a NUL as Linux reads
/// it (a carriage return stays part of it).
pub(super) fn interpreter_of(line: &[u8]) -> &[u8] {
    let line = line.split(|&b| b == b'\n').next().unwrap_or(line);
    let line = line.split(|&b| b == 0).next().unwrap_or(line);
    line.split(|&b| b == b' ' || b == b'\t')
        .find(|w| !w.is_empty())
        .unwrap_or(b"")
}

/// The bytes of a file's head that Linux reads for its format and `#!`
/// line (`BINPRM_BUF_SIZE`).
const HEAD: usize = 256;

/// The first [`HEAD`] bytes of the regular file at `path` (fewer when it is
/// shorter or cannot be read; none when it is not a regular file, so a FIFO
/// is never opened).
pub(super) fn head_of(path: &Path) -> Vec<u8> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Vec::new();
    }
    let mut head = [0u8; HEAD];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    head[..n].to_vec()
}

/// `s` for a message: control characters escaped
/// ([`ckalloc::Escaped`], as every path of a message), and quoted when
/// empty.
fn shown(s: &OsStr) -> String {
    if s.is_empty() {
        return "\"\"".into();
    }
    crate::format::shown(Path::new(s))
}

/// Each of `items` as a C string; `None` when one holds a NUL byte.
fn c_strings(items: &[OsString]) -> Option<Vec<CString>> {
    items
        .iter()
        .map(|a| CString::new(a.as_bytes()).ok())
        .collect()
}

/// This process's environment, every entry as it is (also one without
/// `=`, which `env` passes on too), but `LD_PRELOAD` set to `preload`.
fn environment(preload: &OsStr) -> Option<Vec<CString>> {
    extern "C" {
        /// Mutable: `setenv`, `putenv` and `clearenv` replace it.
        static mut environ: *const *const libc::c_char;
    }
    let mut out = Vec::new();
    // SAFETY: `environ` (read through a raw pointer, no reference to the
    // mutable static) is the C library's null-terminated array of
    // NUL-terminated strings; nothing in this single-threaded program
    // changes the environment while it is read.
    unsafe {
        let mut at = std::ptr::addr_of!(environ).read();
        while !at.is_null() && !(*at).is_null() {
            let entry = CStr::from_ptr(*at);
            if !entry.to_bytes().starts_with(b"LD_PRELOAD=") {
                out.push(entry.to_owned());
            }
            at = at.add(1);
        }
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
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let n = explain(libc::ENOENT, &script);
        assert_eq!(n.code, 127);
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
