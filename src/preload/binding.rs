//! Where the process's allocator calls go first: [`Binding`].

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The functions looked up, in this order.
const FUNCTIONS: [&CStr; 6] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"posix_memalign",
    c"malloc_usable_size",
];

/// The most bytes of an object's path kept (its end, where the file name
/// is).
const PATH_KEPT: usize = 256;

/// Which object the process's allocator calls reach first. The dynamic
/// linker binds each call of `malloc`, `free`, ... to the first definition
/// in its global scope, in load order: the program, the objects of
/// `LD_PRELOAD`, then the libraries they need (`ld.so(8)`). This library
/// serves the program only where it comes first: loaded before
/// `libc.so.6` (not opened with `dlopen`), and no object loaded ahead of it
/// defining an allocator function. An allocator preloaded first
/// (`LD_PRELOAD="libtcmalloc_minimal.so.4 libckalloc_preload.so"`) serves
/// every request then; a wrapper preloaded first (a tracer, glibc's
/// `libc_malloc_debug.so`) decides what it passes on. Either way the
/// library cannot tell what reaches it, so it says where calls go first,
/// in the summary and the JSON statistics.
///
/// Read once when the library loads ([`note_binding`]): for each object
/// ahead of this library in load order (`dl_iterate_phdr`), and for each of
/// `malloc`, `free`, `calloc`, `realloc`, `posix_memalign` and
/// `malloc_usable_size`, whether the object itself defines the function,
/// looked up in its dynamic symbol table through its hash table as the
/// dynamic linker does. A definition counts when a program's reference
/// (`malloc@GLIBC_2.2.5`) binds to it: unversioned, or of glibc's version
/// even when hidden (glibc's `libc_malloc_debug.so` defines only that,
/// which a lookup by name alone skips), never of another version (glibc's
/// `check_match`). Valgrind's tools that replace the allocator preload a
/// `vgpreload_<tool>` object that takes every object's `malloc`; it counts
/// by its name. An undefined symbol is not a definition,
/// even with an address: a program built without PIE that takes a
/// function's address has it at its own PLT entry (Debian's `python3`
/// takes `malloc`'s and `free`'s), which jumps to the definition that
/// follows. No `dlsym`: it cannot search a preloaded object alone, and
/// `dlopen` of one would run its constructor early.
///
/// C++'s `operator new` is not looked at: this library does not define it,
/// so `new` reaches it through libstdc++'s call of `malloc`, unless an
/// object defines `operator new` itself (jemalloc, tcmalloc and mimalloc
/// do) and then serves `new` even when it is loaded behind this library.
///
/// [`binding`] gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Binding {
    /// Not read yet: a call before the library's constructor ran (from a
    /// program's `.preinit_array` or another library's constructor), or
    /// the crate used without `libckalloc_preload.so`'s constructor.
    Unknown,
    /// To this library: it serves the program.
    ThisLibrary,
    /// Not to this library: it was loaded after `libc.so.6` (with
    /// `dlopen`, as `ctypes.CDLL` does), so whatever came first serves.
    OpenedAfterLibc,
    /// To another object, loaded ahead of this library.
    Ahead(Ahead),
}

/// The object ahead of this library that the process's allocator calls
/// reach first ([`Binding::Ahead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ahead {
    /// The object's path as read at load: its last 256 bytes. The
    /// dynamic linker's name for it (`dlpi_name`), or for the program the
    /// path it was executed by (`AT_EXECFN`).
    pub object: &'static [u8],
    /// Whether `object` is cut (the path was longer).
    pub cut: bool,
    /// Whether the object is the program itself, which defines the
    /// function.
    pub program: bool,
    /// The first function the object was found to define, looked up in
    /// the order given at [`Binding`].
    pub function: &'static CStr,
}

impl Binding {
    /// Whether this library serves the program's allocator calls (`None`:
    /// not read yet).
    pub fn serves(self) -> Option<bool> {
        match self {
            Binding::Unknown => None,
            b => Some(b == Binding::ThisLibrary),
        }
    }

    /// Whether the library was loaded before `libc.so.6` (with
    /// `LD_PRELOAD`, `ld.so --preload`, or linked ahead of libc), so that
    /// its functions come before glibc's, wherever the calls go first.
    pub fn loaded_before_libc(self) -> bool {
        matches!(self, Binding::ThisLibrary | Binding::Ahead(_))
    }
}

const UNKNOWN: u8 = 0;
const THIS_LIBRARY: u8 = 1;
const AFTER_LIBC: u8 = 2;
const AHEAD: u8 = 3;
const AHEAD_PROGRAM: u8 = 4;

/// What [`note_binding`] found: the path of the object ahead and the
/// function, written once before `state` is published.
struct Found {
    path: UnsafeCell<[u8; PATH_KEPT]>,
    len: AtomicUsize,
    cut: AtomicU8,
    function: AtomicU8,
    /// One of the states above; stored last (release), so a reader that
    /// sees [`AHEAD`] sees the rest.
    state: AtomicU8,
}

// SAFETY: `path` is written only by `note_binding`, which the library's
// constructor calls once, before `state` is published (Release/Acquire);
// it is only read after a reader saw `state` published.
unsafe impl Sync for Found {}

static FOUND: Found = Found {
    path: UnsafeCell::new([0; PATH_KEPT]),
    len: AtomicUsize::new(0),
    cut: AtomicU8::new(0),
    function: AtomicU8::new(0),
    state: AtomicU8::new(UNKNOWN),
};

/// Where the process's allocator calls go first, as read at load.
/// Thread-safe; never allocates.
pub fn binding() -> Binding {
    let state = FOUND.state.load(Ordering::Acquire);
    match state {
        THIS_LIBRARY => Binding::ThisLibrary,
        AFTER_LIBC => Binding::OpenedAfterLibc,
        AHEAD | AHEAD_PROGRAM => {
            let len = FOUND.len.load(Ordering::Relaxed).min(PATH_KEPT);
            // SAFETY: written before `state` was published, never again.
            let path = unsafe { &(&*FOUND.path.get())[..len] };
            Binding::Ahead(Ahead {
                object: path,
                cut: FOUND.cut.load(Ordering::Relaxed) != 0,
                program: state == AHEAD_PROGRAM,
                function: FUNCTIONS
                    .get(usize::from(FOUND.function.load(Ordering::Relaxed)))
                    .copied()
                    .unwrap_or(c"malloc"),
            })
        }
        _ => Binding::Unknown,
    }
}

/// Read where the process's allocator calls go first ([`Binding`]) and
/// keep it for [`binding`]. Called once, from the library's constructor.
/// Never allocates (`dl_iterate_phdr` may call `malloc` the first time,
/// which never comes back here).
pub fn note_binding() {
    let state = match walk_ahead() {
        Walk::AfterLibc => AFTER_LIBC,
        Walk::NoOwn => UNKNOWN,
        Walk::Clear => THIS_LIBRARY,
        Walk::Hit(hit) => {
            // SAFETY: `path` is NUL-terminated: a `dlpi_name` or the
            // `AT_EXECFN` string, both kept for the process's life.
            let bytes = unsafe { CStr::from_ptr(hit.path) }.to_bytes();
            let kept = &bytes[bytes.len().saturating_sub(PATH_KEPT)..];
            // SAFETY: the only writer, before `state` is published.
            unsafe { (&mut *FOUND.path.get())[..kept.len()].copy_from_slice(kept) };
            FOUND.len.store(kept.len(), Ordering::Relaxed);
            FOUND
                .cut
                .store(u8::from(kept.len() < bytes.len()), Ordering::Relaxed);
            FOUND.function.store(hit.function, Ordering::Relaxed);
            if hit.program {
                AHEAD_PROGRAM
            } else {
                AHEAD
            }
        }
    };
    FOUND.state.store(state, Ordering::Release);
}

/// The program headers of the object `info` describes.
///
/// # Safety
/// `info` is an object `dl_iterate_phdr` passed, still loaded.
unsafe fn program_headers(info: &libc::dl_phdr_info) -> &[libc::Elf64_Phdr] {
    // SAFETY: `dlpi_phdr` holds `dlpi_phnum` program headers.
    unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
}

/// Whether address `a` lies in one of the loaded segments (`PT_LOAD`) of
/// the object `info` describes.
///
/// # Safety
/// As [`program_headers`].
unsafe fn holds(info: &libc::dl_phdr_info, a: usize) -> bool {
    // SAFETY: the caller's contract.
    unsafe { program_headers(info) }.iter().any(|ph| {
        let start = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
        ph.p_type == libc::PT_LOAD && a >= start && a - start < ph.p_memsz as usize
    })
}

/// An object ahead of this library that defines one of [`FUNCTIONS`].
struct Hit {
    path: *const c_char,
    function: u8,
    program: bool,
}

/// `d_tag`s of `<elf.h>` read here.
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_VERDEF: i64 = 0x6fff_fffc;
const DT_VERDEFNUM: i64 = 0x6fff_fffd;

/// The symbol version glibc gives its allocator functions on this
/// architecture, which a program's references name (`malloc@GLIBC_2.2.5`
/// on x86_64).
#[cfg(target_arch = "aarch64")]
const GLIBC_VERSION: &[u8] = b"GLIBC_2.17";
#[cfg(not(target_arch = "aarch64"))]
const GLIBC_VERSION: &[u8] = b"GLIBC_2.2.5";

/// The longest hash chain followed (a bound on a walk over a table that
/// is not what it should be).
const CHAIN_MAX: u32 = 1 << 20;

/// `Elf64_Dyn` of `<elf.h>`.
#[repr(C)]
struct Dyn {
    d_tag: i64,
    d_val: u64,
}

/// The tables of one loaded object's dynamic symbol table.
struct Symbols {
    symtab: *const libc::Elf64_Sym,
    strtab: *const c_char,
    gnu_hash: *const u32,
    hash: *const u32,
    /// `DT_VERSYM`: each symbol's version index; null without versions.
    versym: *const u16,
    /// `DT_VERDEF` and `DT_VERDEFNUM`: the versions the object defines.
    verdef: *const u8,
    verdefnum: usize,
}

impl Symbols {
    /// The tables of the object `info` describes; `None` without a
    /// dynamic section, a symbol table or a hash table.
    ///
    /// # Safety
    /// `info` is an object `dl_iterate_phdr` passed, still loaded.
    unsafe fn of(info: &libc::dl_phdr_info) -> Option<Symbols> {
        let base = info.dlpi_addr as usize;
        // SAFETY: the caller's contract.
        let dynamic = unsafe { program_headers(info) }
            .iter()
            .find(|ph| ph.p_type == libc::PT_DYNAMIC)?;
        let mut d = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
        // glibc adds the load address to these entries in place, except in
        // a read-only dynamic section (the vDSO's). Whichever of the two an
        // entry holds, it must lie in one of the object's loaded segments;
        // an object whose entries fit neither is not read.
        // SAFETY: the caller's contract.
        let loaded = |a: usize| unsafe { holds(info, a) };
        let at = |v: u64| {
            let v = v as usize;
            if loaded(v) {
                v as *const u8
            } else if loaded(v.wrapping_add(base)) {
                v.wrapping_add(base) as *const u8
            } else {
                std::ptr::null()
            }
        };
        let mut t = Symbols {
            symtab: std::ptr::null(),
            strtab: std::ptr::null(),
            gnu_hash: std::ptr::null(),
            hash: std::ptr::null(),
            versym: std::ptr::null(),
            verdef: std::ptr::null(),
            verdefnum: 0,
        };
        loop {
            // SAFETY: the loaded dynamic section, which ends with DT_NULL.
            let e = unsafe { &*d };
            match e.d_tag {
                DT_NULL => break,
                DT_HASH => t.hash = at(e.d_val).cast(),
                DT_STRTAB => t.strtab = at(e.d_val).cast(),
                DT_SYMTAB => t.symtab = at(e.d_val).cast(),
                DT_GNU_HASH => t.gnu_hash = at(e.d_val).cast(),
                DT_VERSYM => t.versym = at(e.d_val).cast(),
                DT_VERDEF => t.verdef = at(e.d_val),
                DT_VERDEFNUM => t.verdefnum = e.d_val as usize,
                _ => {}
            }
            // SAFETY: not past DT_NULL, which ends the section.
            d = unsafe { d.add(1) };
        }
        let usable = !t.symtab.is_null()
            && !t.strtab.is_null()
            && (!t.gnu_hash.is_null() || !t.hash.is_null());
        usable.then_some(t)
    }

    /// Whether symbol `i` is named `name` and defined here in a way a
    /// program's reference binds to: in a section (not undefined, as a
    /// program's reference is even where its PLT entry gives it an
    /// address), global or weak, and unversioned or of glibc's version
    /// (glibc's `check_match`: a reference to `malloc@GLIBC_2.2.5` binds to
    /// no other version, hidden or not).
    ///
    /// # Safety
    /// `i` indexes the symbol table (a hash table gave it).
    unsafe fn defines_at(&self, i: usize, name: &CStr) -> bool {
        // SAFETY: the caller's index; the name offset is within the
        // string table, whose strings are NUL-terminated.
        let (sym, n) = unsafe {
            let sym = &*self.symtab.add(i);
            (sym, CStr::from_ptr(self.strtab.add(sym.st_name as usize)))
        };
        let bind = sym.st_info >> 4;
        if sym.st_shndx == 0 || !(bind == 1 || bind == 2) || n != name {
            return false;
        }
        if self.versym.is_null() {
            return true;
        }
        // SAFETY: `DT_VERSYM` has an entry per symbol.
        let ndx = unsafe { *self.versym.add(i) } & 0x7fff;
        // SAFETY: the object's version definitions, if any.
        ndx == 1 || unsafe { self.version_name(ndx) } == Some(GLIBC_VERSION)
    }

    /// The name of the version the object defines at index `ndx`
    /// (`Elf64_Verdef` and its first `Elf64_Verdaux`).
    ///
    /// # Safety
    /// `verdef` and `verdefnum` are the object's (or null and 0).
    unsafe fn version_name(&self, ndx: u16) -> Option<&[u8]> {
        let mut d = self.verdef;
        for _ in 0..self.verdefnum {
            if d.is_null() {
                return None;
            }
            // SAFETY: an `Elf64_Verdef` (20 bytes: version, flags, index,
            // count as u16; hash, aux and next offsets as u32), possibly
            // unaligned; its aux entry's first word is the name's offset
            // in the string table.
            unsafe {
                let half = |o: usize| d.add(o).cast::<u16>().read_unaligned();
                let word = |o: usize| d.add(o).cast::<u32>().read_unaligned();
                if half(4) == ndx {
                    let aux = d.add(word(12) as usize);
                    let name = aux.cast::<u32>().read_unaligned() as usize;
                    return Some(CStr::from_ptr(self.strtab.add(name)).to_bytes());
                }
                let next = word(16) as usize;
                if next == 0 {
                    return None;
                }
                d = d.add(next);
            }
        }
        None
    }

    /// Whether the object defines `name` as [`Symbols::defines_at`] says,
    /// looked up in its GNU hash table, else its ELF hash table (the
    /// lookups of the System V ABI and of glibc's `dl-lookup.c`).
    ///
    /// # Safety
    /// The tables are those of a loaded object ([`Symbols::of`]).
    unsafe fn defines(&self, name: &CStr) -> bool {
        let bytes = name.to_bytes();
        if !self.gnu_hash.is_null() {
            let h = bytes.iter().fold(5381u32, |h, &c| {
                h.wrapping_mul(33).wrapping_add(u32::from(c))
            });
            // SAFETY: the GNU hash table's header, bloom filter (64-bit
            // words), buckets and chain, as the linker wrote them.
            unsafe {
                let g = self.gnu_hash;
                let (nbuckets, symoffset, bloom_size) = (*g, *g.add(1), *g.add(2));
                if nbuckets == 0 {
                    return false;
                }
                let buckets = g.add(4 + 2 * bloom_size as usize);
                let chain = buckets.add(nbuckets as usize);
                let first = *buckets.add((h % nbuckets) as usize);
                if first < symoffset {
                    return false;
                }
                for i in (first..first.saturating_add(CHAIN_MAX)).map(|i| i as usize) {
                    let c = *chain.add(i - symoffset as usize);
                    if c | 1 == h | 1 && self.defines_at(i, name) {
                        return true;
                    }
                    if c & 1 != 0 {
                        return false;
                    }
                }
                return false;
            }
        }
        let h = bytes.iter().fold(0u32, |h, &c| {
            let h = (h << 4).wrapping_add(u32::from(c));
            (h ^ ((h & 0xf000_0000) >> 24)) & 0x0fff_ffff
        });
        // SAFETY: the ELF hash table's header, buckets and chain.
        unsafe {
            let t = self.hash;
            let (nbucket, nchain) = (*t, *t.add(1));
            if nbucket == 0 {
                return false;
            }
            let chain = t.add(2 + nbucket as usize);
            let mut i = *t.add(2 + (h % nbucket) as usize);
            let mut steps = 0;
            while i != 0 && i < nchain && steps < nchain.min(CHAIN_MAX) {
                if self.defines_at(i as usize, name) {
                    return true;
                }
                i = *chain.add(i as usize);
                steps += 1;
            }
        }
        false
    }
}

/// What the walk of the loaded objects found before this library.
enum Walk {
    /// `libc.so.6` comes first: this library was opened with `dlopen`.
    AfterLibc,
    /// An object ahead of it defines an allocator function.
    Hit(Hit),
    /// None does.
    Clear,
    /// This library is not among the loaded objects.
    NoOwn,
}

/// Walk the loaded objects in load order (`dl_iterate_phdr`: the program,
/// then the objects of `LD_PRELOAD`, then the libraries they need, then
/// those opened with `dlopen`) up to this library: `libc.so.6` before it
/// means it was opened with `dlopen`; else the first object that defines one of
/// [`FUNCTIONS`] itself ([`Binding`]), with the first such function (the
/// program's path is the one it was executed by, `AT_EXECFN`).
fn walk_ahead() -> Walk {
    struct State {
        own: usize,
        first: bool,
        hit: Option<Hit>,
        found: Option<Walk>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid `info` for the call, and
        // `data` is the `State` below, borrowed for the whole walk.
        let (info, st) = unsafe { (&*info, &mut *data.cast::<State>()) };
        let program = std::mem::replace(&mut st.first, false);
        // SAFETY: `dl_iterate_phdr` passed `info` for this call.
        let holds_own = unsafe { holds(info, st.own) };
        let is_libc = !info.dlpi_name.is_null()
            // SAFETY: a non-null `dlpi_name` is a NUL-terminated path.
            && unsafe { CStr::from_ptr(info.dlpi_name) }
                .to_bytes()
                .ends_with(b"/libc.so.6");
        if holds_own {
            st.found = Some(st.hit.take().map_or(Walk::Clear, Walk::Hit));
            return 1;
        }
        if is_libc {
            st.found = Some(Walk::AfterLibc);
            return 1;
        }
        if st.hit.is_some() {
            return 0;
        }
        // Valgrind's tools that replace the allocator preload an object
        // (`vgpreload_memcheck-amd64-linux.so`) whose functions it
        // redirects every object's `malloc` to, this library's included;
        // they are found by its name, not by symbol.
        let file = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: a non-null `dlpi_name` is a NUL-terminated path.
            let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
            path.rsplit(|&b| b == b'/').next().unwrap_or(path)
        };
        let valgrind = file.starts_with(b"vgpreload_") && !file.starts_with(b"vgpreload_core");
        // SAFETY: an object `dl_iterate_phdr` passed, loaded for the call.
        let symbols = unsafe { Symbols::of(info) };
        for (i, name) in FUNCTIONS.iter().enumerate() {
            // SAFETY: the tables of that loaded object.
            if valgrind || symbols.as_ref().is_some_and(|t| unsafe { t.defines(name) }) {
                let path = if program {
                    // SAFETY: reads the auxiliary vector; 0 when absent.
                    unsafe { libc::getauxval(libc::AT_EXECFN) as *const c_char }
                } else {
                    info.dlpi_name
                };
                st.hit = Some(Hit {
                    path: if path.is_null() { c"".as_ptr() } else { path },
                    function: i as u8,
                    program,
                });
                return 0;
            }
        }
        0
    }
    let mut st = State {
        own: note_binding as *const () as usize,
        first: true,
        hit: None,
        found: None,
    };
    // SAFETY: `visit` matches the callback type and reads `st` only
    // during the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut st).cast()) };
    st.found.unwrap_or(Walk::NoOwn)
}
