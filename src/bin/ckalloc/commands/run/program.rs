//! Whether the dynamic loader will preload a library into a program:
//! `ld.so` reads `LD_PRELOAD` only for a dynamically linked ELF executable
//! (one with a `PT_INTERP` program header, the path of `ld.so` itself), and
//! in secure-execution mode (set-user-ID or set-group-ID files, file
//! capabilities; `ld.so(8)`) it ignores entries holding a slash unless they
//! sit in the standard directories and are set-user-ID themselves. A
//! script runs its `#!` interpreter, which is the program that matters
//! (`env NAME` looked up in `PATH` as `env` does).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `#!` chains followed at most this deep (Linux allows 4 levels).
const MAX_INTERPRETERS: usize = 4;

/// Why the library will not reach a program: one warning line's text, or
/// `None` when nothing stops it (or the program cannot be read, which
/// `exec` reports itself).
pub fn why_not_preloaded(program: &OsStr) -> Option<String> {
    let mut path = resolve(program)?;
    for _ in 0..=MAX_INTERPRETERS {
        let mut head = [0u8; 256];
        let n = std::fs::File::open(&path).ok()?.read(&mut head).ok()?;
        let head = &head[..n];
        if let Some(line) = head.strip_prefix(b"#!") {
            path = interpreter(line)?;
            continue;
        }
        if !head.starts_with(b"\x7fELF") {
            return None;
        }
        let shown = path.display();
        if !has_interp(&path)? {
            return Some(format!(
                "{shown} is statically linked (no PT_INTERP): the dynamic loader never runs, \
                 so LD_PRELOAD and ckalloc do not apply to it"
            ));
        }
        let meta = std::fs::metadata(&path).ok()?;
        if meta.mode() & (libc::S_ISUID | libc::S_ISGID) != 0 {
            return Some(format!(
                "{shown} is set-user-ID or set-group-ID: ld.so runs it in secure-execution \
                 mode and ignores a preload path with a slash, so ckalloc does not apply"
            ));
        }
        if has_capabilities(&path) {
            return Some(format!(
                "{shown} has file capabilities: ld.so runs it in secure-execution mode and \
                 ignores a preload path with a slash, so ckalloc does not apply"
            ));
        }
        return None;
    }
    None
}

/// `program` as `execvp` finds it: a name with a slash as it is, else the
/// first executable file of that name in `PATH`.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(p))
        .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// The program a `#!` line runs: its first word, or for `env` (with or
/// without `-S`) the first word after the options, looked up in `PATH`.
fn interpreter(line: &[u8]) -> Option<PathBuf> {
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_ascii_whitespace();
    let first = words.next()?;
    if Path::new(first).file_name() != Some(OsStr::new("env")) {
        return Some(PathBuf::from(first));
    }
    let name = words.find(|w| !w.starts_with('-') && !w.contains('='))?;
    resolve(OsStr::new(name))
}

/// Whether the ELF file at `path` has a `PT_INTERP` program header; `None`
/// when its headers cannot be read.
fn has_interp(path: &Path) -> Option<bool> {
    let bytes = std::fs::read(path).ok()?;
    program_header_types(&bytes).map(|types| types.contains(&PT_INTERP))
}

/// `PT_INTERP` (`elf.h`).
const PT_INTERP: u32 = 3;

/// The `p_type` of every program header of an ELF image; `None` when the
/// header is cut or malformed.
fn program_header_types(elf: &[u8]) -> Option<Vec<u32>> {
    let class64 = match elf.get(4)? {
        1 => false,
        2 => true,
        _ => return None,
    };
    let little = match elf.get(5)? {
        1 => true,
        2 => false,
        _ => return None,
    };
    let int = |at: usize, len: usize| -> Option<u64> {
        let b = elf.get(at..at.checked_add(len)?)?;
        let mut v = 0u64;
        for i in 0..len {
            let byte = if little { b[len - 1 - i] } else { b[i] };
            v = v << 8 | u64::from(byte);
        }
        Some(v)
    };
    let (phoff, phentsize, phnum) = if class64 {
        (int(32, 8)?, int(54, 2)?, int(56, 2)?)
    } else {
        (int(28, 4)?, int(42, 2)?, int(44, 2)?)
    };
    let (phoff, phentsize) = (
        usize::try_from(phoff).ok()?,
        usize::try_from(phentsize).ok()?,
    );
    (0..usize::try_from(phnum).ok()?)
        .map(|i| {
            let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
            int(at, 4).map(|t| t as u32)
        })
        .collect()
}

/// Whether the file carries `security.capability` (file capabilities).
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
    }

    #[test]
    fn a_cut_elf_header_is_not_read_as_static() {
        assert_eq!(program_header_types(b"\x7fELF\x02\x01"), None);
        let sh = std::fs::read(resolve(OsStr::new("sh")).unwrap()).unwrap();
        assert!(program_header_types(&sh).unwrap().contains(&PT_INTERP));
        assert_eq!(program_header_types(&sh[..40]), None);
    }
}
