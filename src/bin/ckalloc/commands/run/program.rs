//! Whether the dynamic loader will preload a library into a program:
//! `ld.so` reads `LD_PRELOAD` only for a dynamically linked ELF executable
//! (one with a `PT_INTERP` program header, the path of `ld.so` itself), and
//! in secure-execution mode (a set-user-ID or set-group-ID file of another
//! user or group, file capabilities: [`secure`](super::secure)) it ignores
//! entries holding a slash unless they sit in the standard directories and
//! are set-user-ID themselves. A script runs its `#!` interpreter, which
//! is the program that matters (`env NAME` looked up in `PATH` as `env`
//! does). A file this process may execute but not read (mode 4711 or 0711)
//! is judged by its stat data alone.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::elf::{dynamic_facts, has_interp, Header, ET_DYN};
use super::exec::{head_of, interpreter_of, places, MAX_INTERPRETERS};
use super::secure::secure_execution;
use crate::access::permitted;

/// Why the library will not reach a program: one warning line's text, or
/// `None` when nothing stops it (or the program cannot be run, which
/// `exec` reports itself).
pub fn why_not_preloaded(program: &OsStr) -> Option<String> {
    let mut path = resolve(program)?;
    for _ in 0..=MAX_INTERPRETERS {
        // Only a regular file this process may execute is opened: opening
        // a FIFO would wait for a writer, reading some files in /sys
        // blocks, and `exec` refuses both anyway.
        let meta = std::fs::metadata(&path).ok()?;
        if !meta.is_file() || !permitted(&path, libc::X_OK) {
            return None;
        }
        let shown = crate::format::shown(&path);
        let secure = |why| {
            format!(
                "{shown} {why}: ld.so runs it in secure-execution mode and ignores a preload \
                 path with a slash, so ckalloc does not apply"
            )
        };
        // The kernel runs a file it cannot read for this process: whether
        // it is a script or a static program cannot be told, but its
        // set-ID bits can (an unreadable script would fail in its
        // interpreter anyway).
        if !permitted(&path, libc::R_OK) {
            return secure_execution(&path, &meta).map(secure);
        }
        let head = head_of(&path);
        if let Some(line) = head.strip_prefix(b"#!") {
            path = interpreter(line)?;
            continue;
        }
        let Ok(header) = Header::parse(&head) else {
            return None;
        };
        // A shared object run as a program (`ld.so` itself, run with the
        // program as its argument) has no PT_INTERP and loads preloads.
        let shared_object =
            header.file_type == ET_DYN && dynamic_facts(&path, b"").is_some_and(|f| !f.pie);
        if !has_interp(&path)? && !shared_object {
            return Some(format!(
                "{shown} is statically linked (no PT_INTERP): the dynamic loader never runs, \
                 so LD_PRELOAD and ckalloc do not apply to it"
            ));
        }
        return secure_execution(&path, &meta).map(secure);
    }
    None
}

/// `program` as `execvp` finds it: a name with a slash as it is, else the
/// first regular file of that name among the `PATH` places ([`places`])
/// this process may execute.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    let mut places = places(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return places.pop();
    }
    places
        .into_iter()
        .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file()) && permitted(c, libc::X_OK))
}

/// The program a `#!` line runs: its first word as Linux reads it
/// ([`interpreter_of`]), or for `env` (with or
/// without `-S`) the first word after the options, looked up in `PATH`.
fn interpreter(line: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let first = interpreter_of(line);
    if first.is_empty() {
        return None;
    }
    let first = Path::new(OsStr::from_bytes(first));
    if first.file_name() != Some(OsStr::new("env")) {
        return Some(first.to_path_buf());
    }
    // `env`'s options and assignments, then the program it looks up.
    let line = line.split(|&b| b == b'\n' || b == 0).next()?;
    let text = std::str::from_utf8(line).ok()?;
    let name = text
        .split_ascii_whitespace()
        .skip(1)
        .find(|w| !w.starts_with('-') && !w.contains('='))?;
    resolve(OsStr::new(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_passes_and_env_scripts_follow_their_interpreter() {
        assert_eq!(why_not_preloaded(OsStr::new("sh")), None);
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s");
        std::fs::write(&script, "#!/usr/bin/env -S sh -e\necho hi\n").unwrap();
        assert_eq!(why_not_preloaded(script.as_os_str()), None);
        assert_eq!(
            interpreter(b"/usr/bin/env python3 -u\n"),
            resolve(OsStr::new("python3"))
        );
        assert_eq!(interpreter(b" /bin/sh -e"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(why_not_preloaded(OsStr::new("/nonexistent/x")), None);
        // The dynamic loader run as a program loads preloads.
        let loader = OsStr::new("/lib64/ld-linux-x86-64.so.2");
        if Path::new(loader).exists() {
            assert_eq!(why_not_preloaded(loader), None);
        }
    }

    #[test]
    fn a_fifo_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o755) }, 0);
        assert_eq!(why_not_preloaded(fifo.as_os_str()), None);
    }
}
