//! Which object the process's allocator calls reach first. The dynamic
//! linker binds each call of `malloc`, `free`, ... to the first definition
//! in its global scope, in load order: the program, the objects of
//! `LD_PRELOAD`, then the libraries they need (`ld.so(8)`). This library
//! serves the program only where it comes first: loaded before
//! `libc.so.6` (not opened with `dlopen`), and no object loaded ahead of it
//! defining an allocator function. An allocator preloaded first
//! (`LD_PRELOAD="libtcmalloc_minimal.so.4 libckalloc_preload.so"`) serves
//! every request then; a wrapper preloaded first (a tracer) decides what
//! it passes on. Either way the library cannot tell what reaches it, so it
//! says where calls go first, in the summary and the JSON statistics.
//!
//! Read once when the library loads ([`note_binding`]): `dlsym` with
//! `RTLD_DEFAULT` for each of [`FUNCTIONS`], and `dladdr` of its answer.
//! An answer inside the program itself is passed over: a program built
//! without PIE that takes a function's address is answered with its own
//! PLT entry (Debian's `python3` takes `malloc`'s and `free`'s, `node`
//! also `calloc`'s and `realloc`'s), which says nothing of where its calls
//! go. When every answer is the program's, the program defines the
//! functions itself (an allocator linked in statically) and comes first.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

/// The functions looked up, in this order: every allocator defines them,
/// and a program without PIE rarely takes the address of the last two.
const FUNCTIONS: [&CStr; 6] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"posix_memalign",
    c"malloc_usable_size",
];

/// Where the process's allocator calls go first ([`binding`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Binding {
    /// Not read: no [`note_binding`] in this process (the crate used
    /// without `libckalloc_preload.so`'s constructor).
    Unknown,
    /// To this library: it serves the program.
    ThisLibrary,
    /// To glibc: the library was loaded after `libc.so.6` (with `dlopen`,
    /// as `ctypes.CDLL` does), so it serves nothing.
    Glibc,
    /// To another object, loaded ahead of this library.
    Ahead {
        /// The object's path as the dynamic linker has it (`dli_fname`;
        /// for the program itself, its `argv[0]`).
        object: &'static CStr,
        /// The first it was found to define of `malloc`, `free`, `calloc`,
        /// `realloc`, `posix_memalign` and `malloc_usable_size`, looked up
        /// in that order.
        function: &'static CStr,
    },
}

impl Binding {
    /// Whether this library serves the program's allocator calls.
    pub fn serves(self) -> bool {
        self == Binding::ThisLibrary
    }
}

const UNKNOWN: u8 = 0;
const THIS_LIBRARY: u8 = 1;
const GLIBC: u8 = 2;
const AHEAD: u8 = 3;

/// One of the states above; [`AHEAD`] is stored after `OBJECT` and
/// `FUNCTION` (release), so a reader that sees it sees them.
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static OBJECT: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
static FUNCTION: AtomicU8 = AtomicU8::new(0);

/// Where the process's allocator calls go first, as read at load.
/// Thread-safe; never allocates.
pub fn binding() -> Binding {
    match STATE.load(Ordering::Acquire) {
        THIS_LIBRARY => Binding::ThisLibrary,
        GLIBC => Binding::Glibc,
        AHEAD => {
            let object = OBJECT.load(Ordering::Relaxed);
            let function = FUNCTIONS
                .get(usize::from(FUNCTION.load(Ordering::Relaxed)))
                .copied();
            match (object.is_null(), function) {
                (false, Some(function)) => Binding::Ahead {
                    // SAFETY: a path of the dynamic linker's list of loaded
                    // objects (`dli_fname`), NUL-terminated; an object that
                    // defines an allocator function the process calls is
                    // never unloaded while the process runs.
                    object: unsafe { CStr::from_ptr(object) },
                    function,
                },
                _ => Binding::Unknown,
            }
        }
        _ => Binding::Unknown,
    }
}

/// Read where the process's allocator calls go first (the module docs)
/// and keep it for [`binding`]: `loaded_before_libc` says whether the
/// library comes before `libc.so.6` in load order. Called once, from the
/// library's constructor. `dlsym` and `dladdr` may call `malloc`, which
/// never comes back here.
pub fn note_binding(loaded_before_libc: bool) {
    let state = if !loaded_before_libc {
        GLIBC
    } else if let Some((object, function)) = first_definition_ahead() {
        OBJECT.store(object, Ordering::Relaxed);
        FUNCTION.store(function, Ordering::Relaxed);
        AHEAD
    } else {
        THIS_LIBRARY
    };
    STATE.store(state, Ordering::Release);
}

/// The object holding address `p` (its base, as `dli_fbase`) and its path
/// (`dli_fname`); `None` for a null `p` or one in no loaded object.
fn object_of(p: *const c_void) -> Option<(*mut c_void, *const c_char)> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `Dl_info` is plain data (pointers), valid zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only writes `info`; any address may be asked about.
    (unsafe { libc::dladdr(p, &mut info) } != 0 && !info.dli_fname.is_null())
        .then_some((info.dli_fbase, info.dli_fname))
}

/// The first object other than this library whose definition of one of
/// [`FUNCTIONS`] the global scope answers with, and that function's index
/// in [`FUNCTIONS`]; `None` when this library answers for every function
/// the program's own entries do not. The program is that object only when
/// it answers for all of them.
fn first_definition_ahead() -> Option<(*mut c_char, u8)> {
    let own = object_of(note_binding as *const c_void)?.0;
    // SAFETY: reads the auxiliary vector; 0 when AT_ENTRY is absent.
    let entry = unsafe { libc::getauxval(libc::AT_ENTRY) } as *const c_void;
    let program = object_of(entry);
    let mut ours = false;
    for (i, name) in FUNCTIONS.iter().enumerate() {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the global
        // scope and returns null when nothing defines the name.
        let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        let Some((base, path)) = object_of(found) else {
            continue;
        };
        if base == own {
            ours = true;
        } else if program.is_none_or(|(p, _)| p != base) {
            return Some((path.cast_mut(), i as u8));
        }
    }
    match program {
        Some((_, path)) if !ours => Some((path.cast_mut(), 0)),
        _ => None,
    }
}
