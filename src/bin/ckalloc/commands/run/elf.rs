//! Reading the parts of an ELF file that decide what `ld.so` and the
//! kernel do with it (`elf.h`, `elf(5)`): the program headers
//! (`PT_INTERP`, `PT_DYNAMIC`, `PT_LOAD`), the dynamic section's flags and
//! its symbol table. Every read is bounded (a program header table of 64
//! KiB, as Linux; a dynamic section or table of 16 MiB), so a hostile file
//! costs little and never panics.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Whether the ELF file at `path` has a `PT_INTERP` program header; `None`
/// when its headers cannot be read. Reads the ELF header and the program
/// headers only.
pub fn has_interp(path: &Path) -> Option<bool> {
    let elf = ProgramHeaders::read(path)?;
    Some(elf.types().contains(&PT_INTERP))
}

/// What `ld.so` would see in the shared object at `path`: whether it is a
/// position-independent executable (`DF_1_PIE` in `DT_FLAGS_1`), which
/// `ld.so` refuses to preload ("cannot dynamically load
/// position-independent executable"), and whether its dynamic symbol table
/// (`DT_SYMTAB`, named in `DT_STRTAB`) defines `symbol` (a symbol it only
/// imports does not count); `None` when the headers, the dynamic section or
/// the tables cannot be read. The symbol table is read up to the string
/// table, where linkers place it (`.dynsym` before `.dynstr`).
pub fn dynamic_facts(path: &Path, symbol: &[u8]) -> Option<DynamicFacts> {
    use std::os::unix::fs::FileExt;
    let elf = ProgramHeaders::read(path)?;
    let (offset, size) = elf.offset_and_size(elf.find(PT_DYNAMIC)?)?;
    let word = if elf.class64 { 8 } else { 4 };
    let mut table = vec![0u8; size.min(MAX_DYNAMIC)];
    elf.file.read_exact_at(&mut table, offset).ok()?;
    let (mut flags_1, mut strtab, mut strsz, mut symtab) = (0, None, None, None);
    for e in table.chunks_exact(2 * word) {
        let tag = read_int(e, 0, word, elf.little)?;
        let value = read_int(e, word, word, elf.little)?;
        match tag {
            DT_NULL => break,
            DT_FLAGS_1 => flags_1 = value,
            DT_STRTAB => strtab = Some(value),
            DT_STRSZ => strsz = Some(value),
            DT_SYMTAB => symtab = Some(value),
            _ => {}
        }
    }
    let read = |vaddr: u64, len: u64| -> Option<Vec<u8>> {
        let len = usize::try_from(len).ok()?.min(MAX_DYNAMIC);
        let mut bytes = vec![0u8; len];
        elf.file
            .read_exact_at(&mut bytes, elf.file_offset(vaddr)?)
            .ok()?;
        Some(bytes)
    };
    let (strtab, symtab) = (strtab?, symtab?);
    let strings = read(strtab, strsz?)?;
    let symbols = read(symtab, strtab.checked_sub(symtab)?)?;
    // `Elf64_Sym`: st_name (4), st_info, st_other, st_shndx (2), ...;
    // `Elf32_Sym`: st_name (4), st_value, st_size, st_info, st_other,
    // st_shndx (2).
    let (entry, shndx_at) = if elf.class64 { (24, 6) } else { (16, 14) };
    let defines = symbols.chunks_exact(entry).any(|sym| {
        let defined = read_int(sym, shndx_at, 2, elf.little).is_some_and(|s| s != SHN_UNDEF);
        let name = read_int(sym, 0, 4, elf.little)
            .and_then(|at| strings.get(usize::try_from(at).ok()?..))
            .and_then(|rest| rest.split(|&b| b == 0).next());
        defined && name == Some(symbol)
    });
    Some(DynamicFacts {
        pie: flags_1 & DF_1_PIE != 0,
        defines_symbol: defines,
    })
}

/// [`dynamic_facts`]' answer.
pub struct DynamicFacts {
    /// A position-independent executable, not a library.
    pub pie: bool,
    /// The dynamic symbol table defines the symbol asked for.
    pub defines_symbol: bool,
}

/// The dynamic loader an ELF program names (`PT_INTERP`), `None` when it
/// names none or its headers cannot be read.
pub fn loader_of(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileExt;
    let elf = ProgramHeaders::read(path)?;
    let (offset, size) = elf.offset_and_size(elf.find(PT_INTERP)?)?;
    let mut name = vec![0u8; size.min(PATH_MAX)];
    elf.file.read_exact_at(&mut name, offset).ok()?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    name.truncate(end);
    Some(PathBuf::from(std::ffi::OsString::from_vec(name)))
}

/// Linux's `PATH_MAX`, the longest `PT_INTERP` read.
const PATH_MAX: usize = 4096;

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
const DT_SYMTAB: u64 = 6;
/// `SHN_UNDEF` (`elf.h`): the section index of a symbol a file imports.
const SHN_UNDEF: u64 = 0;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_elf_header_is_not_read_as_static() {
        assert_eq!(program_headers_at(b"\x7fELF\x02\x01"), None);
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
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
    fn a_library_defines_what_it_exports_and_names_its_loader() {
        let libc_so = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if libc_so.exists() {
            let facts = dynamic_facts(libc_so, b"malloc").unwrap();
            assert!(facts.defines_symbol && !facts.pie);
            assert!(
                !dynamic_facts(libc_so, b"no_such_symbol_here")
                    .unwrap()
                    .defines_symbol
            );
        }
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let loader = loader_of(&sh).unwrap();
        assert!(loader.exists(), "{loader:?}");
        assert!(dynamic_facts(&sh, b"main").is_some_and(|f| f.pie));
    }
}
