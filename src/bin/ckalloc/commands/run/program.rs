//! Whether the dynamic loader will preload a library into a program:
//! `ld.so` reads `LD_PRELOAD` only for a dynamically linked ELF executable
//! (one with a `PT_INTERP` program header, the path of `ld.so` itself), and
//! in secure-execution mode (`AT_SECURE`: a set-user-ID file owned by
//! another user, a set-group-ID file of another group, file capabilities
//! that a user other than root gains; `ld.so(8)`, `getauxval(3)`) it
//! ignores entries holding a slash unless they sit in the standard
//! directories and are set-user-ID themselves. A
//! script runs its `#!` interpreter, which is the program that matters
//! (`env NAME` looked up in `PATH` as `env` does).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::exec::{executable, places};

/// `#!` chains followed at most this deep (Linux allows 4 levels).
const MAX_INTERPRETERS: usize = 4;

/// Why the library will not reach a program: one warning line's text, or
/// `None` when nothing stops it (or the program cannot be read, which
/// `exec` reports itself).
pub fn why_not_preloaded(program: &OsStr) -> Option<String> {
    let mut path = resolve(program)?;
    for _ in 0..=MAX_INTERPRETERS {
        // Only a regular file is opened: opening a FIFO would wait for a
        // writer (`exec` refuses one anyway).
        if !std::fs::metadata(&path).ok()?.is_file() {
            return None;
        }
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
        let shown = path.display().to_string().escape_debug().to_string();
        if !has_interp(&path)? {
            return Some(format!(
                "{shown} is statically linked (no PT_INTERP): the dynamic loader never runs, \
                 so LD_PRELOAD and ckalloc do not apply to it"
            ));
        }
        let meta = std::fs::metadata(&path).ok()?;
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let setuid = meta.mode() & libc::S_ISUID != 0 && meta.uid() != uid;
        let setgid = meta.mode() & libc::S_ISGID != 0 && meta.gid() != gid;
        if setuid || setgid {
            return Some(format!(
                "{shown} is set-user-ID or set-group-ID to another user or group: ld.so runs \
                 it in secure-execution mode and ignores a preload path with a slash, so \
                 ckalloc does not apply"
            ));
        }
        if uid != 0 && has_capabilities(&path) {
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
/// first regular file of that name among the `PATH` places ([`places`])
/// this process may execute.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    let mut places = places(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return places.pop();
    }
    places
        .into_iter()
        .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file()) && executable(c))
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
/// when its headers cannot be read. Reads the ELF header and the program
/// headers only.
fn has_interp(path: &Path) -> Option<bool> {
    let elf = ProgramHeaders::read(path)?;
    Some(elf.types().contains(&PT_INTERP))
}

/// What `ld.so` would see in the shared object at `path`: whether it is a
/// position-independent executable (`DF_1_PIE` in `DT_FLAGS_1`), which
/// `ld.so` refuses to preload ("cannot dynamically load
/// position-independent executable"), and whether its dynamic string table
/// (`DT_STRTAB`, `DT_STRSZ`) holds `symbol`; `None` when the headers, the
/// dynamic section or the string table cannot be read.
pub fn dynamic_facts(path: &Path, symbol: &[u8]) -> Option<DynamicFacts> {
    use std::os::unix::fs::FileExt;
    let elf = ProgramHeaders::read(path)?;
    let (offset, size) = elf.offset_and_size(elf.find(PT_DYNAMIC)?)?;
    let entry = if elf.class64 { 16 } else { 8 };
    let mut table = vec![0u8; size.min(MAX_DYNAMIC)];
    elf.file.read_exact_at(&mut table, offset).ok()?;
    let half = entry / 2;
    let (mut flags_1, mut strtab, mut strsz) = (0, None, None);
    for e in table.chunks_exact(entry) {
        let tag = read_int(e, 0, half, elf.little)?;
        let value = read_int(e, half, half, elf.little)?;
        match tag {
            DT_NULL => break,
            DT_FLAGS_1 => flags_1 = value,
            DT_STRTAB => strtab = Some(value),
            DT_STRSZ => strsz = Some(value),
            _ => {}
        }
    }
    let at = elf.file_offset(strtab?)?;
    let len = usize::try_from(strsz?).ok()?.min(MAX_DYNAMIC);
    let mut strings = vec![0u8; len];
    elf.file.read_exact_at(&mut strings, at).ok()?;
    Some(DynamicFacts {
        pie: flags_1 & DF_1_PIE != 0,
        names_symbol: strings.split(|&b| b == 0).any(|name| name == symbol),
    })
}

/// [`dynamic_facts`]' answer.
pub struct DynamicFacts {
    /// A position-independent executable, not a library.
    pub pie: bool,
    /// The dynamic string table holds the symbol asked for.
    pub names_symbol: bool,
}

/// The most bytes of a dynamic section or string table read (16 MiB).
const MAX_DYNAMIC: usize = 16 << 20;

/// An ELF file's program header table, read whole.
struct ProgramHeaders {
    file: std::fs::File,
    table: Vec<u8>,
    entry: usize,
    class64: bool,
    little: bool,
}

impl ProgramHeaders {
    /// `None` when the ELF header or the table cannot be read, or the
    /// table is over 64 KiB.
    fn read(path: &Path) -> Option<ProgramHeaders> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path).ok()?;
        let mut header = [0u8; 64];
        let n = file.read_at(&mut header, 0).ok()?;
        let (phoff, entry, count, little) = program_headers_at(&header[..n])?;
        let len = entry.checked_mul(count)?;
        // Linux refuses a program header table over 64 KiB (`load_elf_phdrs`),
        // and the read stays that small.
        if len > MAX_PROGRAM_HEADERS {
            return None;
        }
        let mut table = vec![0u8; len];
        file.read_exact_at(&mut table, u64::try_from(phoff).ok()?)
            .ok()?;
        Some(ProgramHeaders {
            file,
            table,
            entry,
            class64: header[4] == 2,
            little,
        })
    }

    /// `p_type` of every header.
    fn types(&self) -> Vec<u32> {
        self.table
            .chunks_exact(self.entry)
            .filter_map(|h| read_int(h, 0, 4, self.little).map(|t| t as u32))
            .collect()
    }

    /// The first header of type `p_type`.
    fn find(&self, p_type: u32) -> Option<&[u8]> {
        self.table
            .chunks_exact(self.entry)
            .find(|h| read_int(h, 0, 4, self.little) == Some(u64::from(p_type)))
    }

    /// The file offset of virtual address `vaddr`, through the `PT_LOAD`
    /// header whose file bytes hold it.
    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.table.chunks_exact(self.entry).find_map(|h| {
            if read_int(h, 0, 4, self.little)? != u64::from(PT_LOAD) {
                return None;
            }
            let at = if self.class64 { 16 } else { 8 };
            let width = if self.class64 { 8 } else { 4 };
            let start = read_int(h, at, width, self.little)?;
            let (offset, size) = self.offset_and_size(h)?;
            let within = vaddr.checked_sub(start)?;
            (within < size as u64).then(|| offset.checked_add(within))?
        })
    }

    /// `p_offset` and `p_filesz` of a header.
    fn offset_and_size(&self, h: &[u8]) -> Option<(u64, usize)> {
        let (offset, size) = if self.class64 {
            (
                read_int(h, 8, 8, self.little)?,
                read_int(h, 32, 8, self.little)?,
            )
        } else {
            (
                read_int(h, 4, 4, self.little)?,
                read_int(h, 16, 4, self.little)?,
            )
        };
        Some((offset, usize::try_from(size).ok()?))
    }
}

/// `PT_LOAD`, `PT_DYNAMIC`, the `DT_*` tags read and `DF_1_PIE` (`elf.h`).
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_FLAGS_1: u64 = 0x6fff_fffb;
const DF_1_PIE: u64 = 0x0800_0000;

/// The largest program header table Linux loads (`ELF_MIN_ALIGN`, 64 KiB).
const MAX_PROGRAM_HEADERS: usize = 65536;

/// `PT_INTERP` (`elf.h`).
const PT_INTERP: u32 = 3;

/// The unsigned integer of `len` bytes at `at` in `bytes`.
fn read_int(bytes: &[u8], at: usize, len: usize, little: bool) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(len)?)?;
    let mut v = 0u64;
    for i in 0..len {
        let byte = if little { b[len - 1 - i] } else { b[i] };
        v = v << 8 | u64::from(byte);
    }
    Some(v)
}

/// Where an ELF image's program headers are, from its ELF header: (offset,
/// entry size, count, little-endian); `None` when the header is cut or
/// malformed (an entry shorter than `p_type`'s 4 bytes included).
fn program_headers_at(elf: &[u8]) -> Option<(usize, usize, usize, bool)> {
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
    let int = |at, len| read_int(elf, at, len, little);
    let (phoff, phentsize, phnum) = if class64 {
        (int(32, 8)?, int(54, 2)?, int(56, 2)?)
    } else {
        (int(28, 4)?, int(42, 2)?, int(44, 2)?)
    };
    let phentsize = usize::try_from(phentsize).ok().filter(|&n| n >= 4)?;
    Some((
        usize::try_from(phoff).ok()?,
        phentsize,
        usize::try_from(phnum).ok()?,
        little,
    ))
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
        assert_eq!(program_headers_at(b"\x7fELF\x02\x01"), None);
        let sh = resolve(OsStr::new("sh")).unwrap();
        assert_eq!(has_interp(&sh), Some(true));
        let bytes = std::fs::read(&sh).unwrap();
        assert_eq!(program_headers_at(&bytes[..40]), None);
        let dir = tempfile::tempdir().unwrap();
        let cut = dir.path().join("cut");
        std::fs::write(&cut, &bytes[..100]).unwrap();
        assert_eq!(has_interp(&cut), None, "headers past the end");
        // 65535 headers of 65535 bytes: refused without reading 4 GiB.
        let mut huge = bytes[..64].to_vec();
        huge[54..58].copy_from_slice(&[0xff; 4]);
        std::fs::write(&cut, &huge).unwrap();
        assert_eq!(has_interp(&cut), None, "a table over 64 KiB");
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
