//! Reading the parts of an ELF file that decide what `ld.so` and the
//! kernel do with it (`elf.h`, `elf(5)`): the ELF header (class, byte
//! order, type, machine), the program headers (`PT_INTERP`, `PT_DYNAMIC`,
//! `PT_LOAD`), the dynamic section's flags and its symbol table. Every
//! read is bounded (a program header table of 64 KiB, as Linux; a dynamic
//! section or table of 16 MiB), so a hostile file costs little and never
//! panics.

use std::fs::File;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The first bytes of every ELF file (`ELFMAG`).
pub const MAGIC: &[u8; 4] = b"\x7fELF";

/// `ET_DYN` (`elf.h`): a shared object (a library, a position-independent
/// executable, `ld.so` itself).
pub const ET_DYN: u16 = 3;

/// `e_machine` of this build's target (`elf.h`: `EM_X86_64`, `EM_AARCH64`).
const THIS_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    183
} else {
    62
};

/// The fields of an ELF header (`Elf32_Ehdr`, `Elf64_Ehdr`) that the
/// checks of `ckalloc run` read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `ELFCLASS64` (else `ELFCLASS32`).
    pub class64: bool,
    /// `ELFDATA2LSB` (else `ELFDATA2MSB`).
    pub little: bool,
    /// `e_type`: [`ET_DYN`], `ET_EXEC`, `ET_REL`, ...
    pub file_type: u16,
    /// `e_machine`.
    pub machine: u16,
    /// `e_phoff`.
    phoff: u64,
    /// `e_phentsize`.
    phentsize: usize,
    /// `e_phnum`.
    phnum: usize,
}

/// Why a file's head is not an ELF header ([`Header::parse`],
/// [`Header::read`]).
#[derive(Debug)]
pub enum HeaderError {
    /// The file does not start with [`MAGIC`] (it is shorter, or another
    /// format).
    NotElf,
    /// [`MAGIC`], then a class or byte order `elf.h` does not define, or a
    /// header cut short.
    Damaged,
    /// The file could not be read.
    Read(std::io::Error),
}

/// The most bytes of an ELF header (`Elf64_Ehdr`).
const HEADER: usize = 64;

impl Header {
    /// The ELF header at the start of `bytes`.
    ///
    /// # Errors
    /// [`HeaderError::NotElf`] without the magic; [`HeaderError::Damaged`]
    /// for an unknown class or byte order, or when `bytes` end before the
    /// header's last field read.
    pub fn parse(bytes: &[u8]) -> Result<Header, HeaderError> {
        if !bytes.starts_with(MAGIC) {
            return Err(HeaderError::NotElf);
        }
        let class64 = match bytes.get(4) {
            Some(1) => false,
            Some(2) => true,
            _ => return Err(HeaderError::Damaged),
        };
        let little = match bytes.get(5) {
            Some(1) => true,
            Some(2) => false,
            _ => return Err(HeaderError::Damaged),
        };
        let int = |at, len| read_int(bytes, at, len, little);
        let fields = || {
            let (phoff, phentsize, phnum) = if class64 {
                (int(32, 8)?, int(54, 2)?, int(56, 2)?)
            } else {
                (int(28, 4)?, int(42, 2)?, int(44, 2)?)
            };
            Some(Header {
                class64,
                little,
                file_type: u16::try_from(int(16, 2)?).ok()?,
                machine: u16::try_from(int(18, 2)?).ok()?,
                phoff,
                phentsize: usize::try_from(phentsize).ok()?,
                phnum: usize::try_from(phnum).ok()?,
            })
        };
        fields().ok_or(HeaderError::Damaged)
    }

    /// The ELF header of the open `file` (read at offset 0, whatever the
    /// file's position).
    ///
    /// # Errors
    /// As [`Header::parse`], and [`HeaderError::Read`] when the read fails.
    pub fn read(file: &File) -> Result<Header, HeaderError> {
        let mut head = [0u8; HEADER];
        let mut len = 0;
        while len < HEADER {
            match file.read_at(&mut head[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(HeaderError::Read(e)),
            }
        }
        Header::parse(&head[..len])
    }

    /// Whether the file is built for this build's target: its class, byte
    /// order and `e_machine`.
    pub fn of_this_machine(&self) -> bool {
        self.class64 == cfg!(target_pointer_width = "64")
            && self.little == cfg!(target_endian = "little")
            && self.machine == THIS_MACHINE
    }
}

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
    let elf = ProgramHeaders::read(path)?;
    let (offset, size) = elf.offset_and_size(elf.find(PT_DYNAMIC)?)?;
    let (class64, little) = (elf.header.class64, elf.header.little);
    let word = if class64 { 8 } else { 4 };
    let mut table = vec![0u8; size.min(MAX_DYNAMIC)];
    elf.file.read_exact_at(&mut table, offset).ok()?;
    let (mut flags_1, mut strtab, mut strsz, mut symtab) = (0, None, None, None);
    for e in table.chunks_exact(2 * word) {
        let tag = read_int(e, 0, word, little)?;
        let value = read_int(e, word, word, little)?;
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
    let (entry, shndx_at) = if class64 { (24, 6) } else { (16, 14) };
    let defines = symbols.chunks_exact(entry).any(|sym| {
        let defined = read_int(sym, shndx_at, 2, little).is_some_and(|s| s != SHN_UNDEF);
        let name = read_int(sym, 0, 4, little)
            .and_then(|at| strings.get(usize::try_from(at).ok()?..))
            .and_then(|rest| rest.split(|&b| b == 0).next());
        defined && name == Some(symbol)
    });
    Some(DynamicFacts {
        pie: flags_1 & DF_1_PIE != 0,
        defines_symbol: defines,
    })
}

/// Whether every loadable segment (`PT_LOAD`) of the ELF `file` lies in
/// the file (`p_offset + p_filesz` at most its length), as `ld.so` maps
/// them: a file cut short faults (`SIGBUS`) where a segment's pages pass
/// its end. `None` when the headers cannot be read.
pub fn loads_fit(file: &File) -> Option<bool> {
    let elf = ProgramHeaders::of(file.try_clone().ok()?)?;
    let len = file.metadata().ok()?.len();
    let little = elf.header.little;
    let mut fit = true;
    for h in elf.entries() {
        if read_int(h, 0, 4, little)? == u64::from(PT_LOAD) {
            let (offset, size) = elf.offset_and_size(h)?;
            fit &= offset
                .checked_add(size as u64)
                .is_some_and(|end| end <= len);
        }
    }
    Some(fit)
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
    file: File,
    header: Header,
    table: Vec<u8>,
}

impl ProgramHeaders {
    /// `None` when the ELF header or the table cannot be read, an entry is
    /// shorter than `p_type`'s 4 bytes, or the table is over 64 KiB.
    fn read(path: &Path) -> Option<ProgramHeaders> {
        ProgramHeaders::of(File::open(path).ok()?)
    }

    /// The table of the open `file`, as [`read`](Self::read).
    fn of(file: File) -> Option<ProgramHeaders> {
        let header = Header::read(&file).ok()?;
        if header.phentsize < 4 {
            return None;
        }
        let len = header.phentsize.checked_mul(header.phnum)?;
        // Linux refuses a program header table over 64 KiB (`load_elf_phdrs`),
        // and the read stays that small.
        if len > MAX_PROGRAM_HEADERS {
            return None;
        }
        let mut table = vec![0u8; len];
        file.read_exact_at(&mut table, header.phoff).ok()?;
        Some(ProgramHeaders {
            file,
            header,
            table,
        })
    }

    /// The entries of the table, `e_phentsize` bytes each.
    fn entries(&self) -> std::slice::ChunksExact<'_, u8> {
        self.table.chunks_exact(self.header.phentsize)
    }

    /// `p_type` of every header.
    fn types(&self) -> Vec<u32> {
        self.entries()
            .filter_map(|h| read_int(h, 0, 4, self.header.little).map(|t| t as u32))
            .collect()
    }

    /// The first header of type `p_type`.
    fn find(&self, p_type: u32) -> Option<&[u8]> {
        self.entries()
            .find(|h| read_int(h, 0, 4, self.header.little) == Some(u64::from(p_type)))
    }

    /// The file offset of virtual address `vaddr`, through the `PT_LOAD`
    /// header whose file bytes hold it.
    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        let (class64, little) = (self.header.class64, self.header.little);
        self.entries().find_map(|h| {
            if read_int(h, 0, 4, little)? != u64::from(PT_LOAD) {
                return None;
            }
            let at = if class64 { 16 } else { 8 };
            let width = if class64 { 8 } else { 4 };
            let start = read_int(h, at, width, little)?;
            let (offset, size) = self.offset_and_size(h)?;
            let within = vaddr.checked_sub(start)?;
            (within < size as u64).then(|| offset.checked_add(within))?
        })
    }

    /// `p_offset` and `p_filesz` of a header.
    fn offset_and_size(&self, h: &[u8]) -> Option<(u64, usize)> {
        let little = self.header.little;
        let (offset, size) = if self.header.class64 {
            (read_int(h, 8, 8, little)?, read_int(h, 32, 8, little)?)
        } else {
            (read_int(h, 4, 4, little)?, read_int(h, 16, 4, little)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_class_byte_order_type_and_machine() {
        let parse = |b: &[u8]| Header::parse(b);
        assert!(matches!(parse(b""), Err(HeaderError::NotElf)));
        assert!(matches!(parse(b"\x7fEL"), Err(HeaderError::NotElf)));
        assert!(matches!(parse(b"MZ\x90\0"), Err(HeaderError::NotElf)));
        assert!(matches!(parse(b"\x7fELF"), Err(HeaderError::Damaged)));
        assert!(matches!(
            parse(b"\x7fELF\x03\x01"),
            Err(HeaderError::Damaged)
        ));
        assert!(matches!(
            parse(b"\x7fELF\x02\x00"),
            Err(HeaderError::Damaged)
        ));
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let file = File::open(&sh).unwrap();
        let ours = Header::read(&file).unwrap();
        assert!(ours.of_this_machine(), "{ours:?}");
        let bytes = std::fs::read(&sh).unwrap();
        assert_eq!(parse(&bytes[..64]).unwrap(), ours);
        // Cut before e_phnum (a 64-bit header's last field read).
        assert!(matches!(parse(&bytes[..57]), Err(HeaderError::Damaged)));
        // Another machine (EM_ARM, 40), the other byte order, the other
        // class.
        let mut other = bytes[..64].to_vec();
        other[18..20].copy_from_slice(&40u16.to_le_bytes());
        assert_eq!(parse(&other).unwrap().machine, 40);
        assert!(!parse(&other).unwrap().of_this_machine());
        let mut other = bytes[..64].to_vec();
        other[5] = 2;
        assert!(!parse(&other).unwrap().little);
        assert!(!parse(&other).unwrap().of_this_machine());
        let mut other = bytes[..64].to_vec();
        other[4] = 1;
        assert!(!parse(&other).unwrap().of_this_machine());
        // An object file (`ET_REL`) has no program headers: its header
        // reads, its table does not.
        let mut object = bytes[..64].to_vec();
        object[16..18].copy_from_slice(&1u16.to_le_bytes());
        object[54..58].fill(0);
        assert_eq!(parse(&object).unwrap().file_type, 1);
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().join("o");
        std::fs::write(&o, &object).unwrap();
        assert_eq!(has_interp(&o), None);
        let libc_so = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if libc_so.exists() {
            let h = Header::read(&File::open(libc_so).unwrap()).unwrap();
            assert_eq!(h.file_type, ET_DYN);
        }
    }

    #[test]
    fn a_cut_elf_header_is_not_read_as_static() {
        assert!(Header::parse(b"\x7fELF\x02\x01").is_err());
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        assert_eq!(has_interp(&sh), Some(true));
        let bytes = std::fs::read(&sh).unwrap();
        assert!(Header::parse(&bytes[..40]).is_err());
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
