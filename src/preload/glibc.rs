//! glibc's own allocator, reached past the preload library's exported
//! `malloc`: the `__libc_*` entry points glibc 2.36 exports
//! (`malloc/malloc.c`: `__libc_malloc`, `__libc_free`, `__libc_calloc`,
//! `__libc_realloc`, `__libc_memalign`, `__libc_valloc`, `__libc_pvalloc`,
//! `__libc_mallopt`), and, for the functions glibc exports under their
//! public name only (`malloc_usable_size`, `malloc_trim`), libc's own definition, found once
//! with `dlsym` and cached: `RTLD_NEXT` when its answer lies in glibc's
//! own object (another allocator preloaded after this library would answer
//! there, for pointers it never made), else the handle of `libc.so.6`
//! (already loaded: `RTLD_NOLOAD`).
//!
//! [`GlibcMalloc`] is a [`GlobalAlloc`] over them: the small allocator of
//! the preload path, and the `#[global_allocator]` of the preload library,
//! whose Rust code must not reach `System` (`System` calls the exported
//! `malloc`, the library itself).

use crate::lock::PoolLock;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// glibc's alignment of `malloc` blocks (`MALLOC_ALIGNMENT` on x86_64 and
/// aarch64: 16 bytes).
pub const MALLOC_ALIGNMENT: usize = 16;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
    fn __libc_mallopt(param: c_int, value: c_int) -> c_int;
}

/// glibc's `malloc(size)`.
#[inline]
pub fn malloc(size: usize) -> *mut c_void {
    // SAFETY: any size is valid; glibc returns null or a block.
    unsafe { __libc_malloc(size) }
}

/// glibc's `free(p)`.
///
/// # Safety
/// `p` is null or a live block of glibc's allocator.
#[inline]
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { __libc_free(p) }
}

/// glibc's `calloc(n, size)` (it checks `n * size` for overflow).
#[inline]
pub fn calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: any sizes are valid.
    unsafe { __libc_calloc(n, size) }
}

/// glibc's `realloc(p, size)`.
///
/// # Safety
/// `p` is null or a live block of glibc's allocator.
#[inline]
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { __libc_realloc(p, size) }
}

/// glibc's `memalign(align, size)` (any `align`: glibc rounds a value that
/// is not a power of two up to one, and sets `EINVAL` past `SIZE_MAX / 2 + 1`).
#[inline]
pub fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: any arguments are valid.
    unsafe { __libc_memalign(align, size) }
}

/// glibc's `valloc(size)`.
#[inline]
pub fn valloc(size: usize) -> *mut c_void {
    // SAFETY: any size is valid.
    unsafe { __libc_valloc(size) }
}

/// glibc's `pvalloc(size)`.
#[inline]
pub fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: any size is valid.
    unsafe { __libc_pvalloc(size) }
}

/// A symbol of the libraries after this one, looked up once.
struct Next {
    name: &'static CStr,
    /// Null: not looked up yet; `NOT_FOUND`: looked up, absent.
    addr: AtomicPtr<c_void>,
}

const NOT_FOUND: *mut c_void = std::ptr::dangling_mut::<c_void>();

impl Next {
    const fn new(name: &'static CStr) -> Next {
        Next {
            name,
            addr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The address in `libc.so.6`, `None` when it cannot be found there.
    /// First `dlsym(RTLD_NEXT)`, kept when the answer lies in the object
    /// that holds `__libc_malloc`: it runs no constructor, where `dlopen`
    /// runs the ones not run yet (this library's among them, before the
    /// environment is set up, when a program calls from its
    /// `.preinit_array`). Else (another allocator preloaded after this
    /// library answered) `dlopen` of `libc.so.6`. `dlopen`, `dlsym` and
    /// `dladdr` may call `malloc` or `calloc` the first time; those never
    /// come back here, so the lookup cannot recurse.
    fn get(&self) -> Option<*mut c_void> {
        let mut a = self.addr.load(Ordering::Acquire);
        if a.is_null() {
            // SAFETY: NUL-terminated names; `dladdr` writes only `info`;
            // RTLD_NOLOAD only finds the libc this process already has
            // (the handle is never closed).
            let found = unsafe {
                let next = libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr());
                let object = |p: *const c_void| {
                    let mut info: libc::Dl_info = std::mem::zeroed();
                    (libc::dladdr(p, &mut info) != 0).then_some(info.dli_fbase)
                };
                if !next.is_null() && object(next) == object(__libc_malloc as *const c_void) {
                    next
                } else {
                    let libc_so =
                        libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
                    if libc_so.is_null() {
                        std::ptr::null_mut()
                    } else {
                        libc::dlsym(libc_so, self.name.as_ptr())
                    }
                }
            };
            a = if found.is_null() { NOT_FOUND } else { found };
            self.addr.store(a, Ordering::Release);
        }
        (a != NOT_FOUND).then_some(a)
    }
}

static USABLE_SIZE: Next = Next::new(c"malloc_usable_size");
static TRIM: Next = Next::new(c"malloc_trim");

/// glibc's `malloc_usable_size(p)`, 0 when it cannot be found.
///
/// # Safety
/// `p` is null or a live block of glibc's allocator.
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    let Some(f) = USABLE_SIZE.get() else {
        return 0;
    };
    // SAFETY: `malloc_usable_size`'s C signature; the caller's contract.
    unsafe {
        let f: unsafe extern "C" fn(*mut c_void) -> usize = std::mem::transmute(f);
        f(p)
    }
}

/// glibc's `malloc_trim(pad)`, 0 when it cannot be found.
pub fn trim(pad: usize) -> c_int {
    let Some(f) = TRIM.get() else {
        return 0;
    };
    // SAFETY: `malloc_trim`'s C signature; any `pad` is valid.
    unsafe {
        let f: unsafe extern "C" fn(usize) -> c_int = std::mem::transmute(f);
        f(pad)
    }
}

extern "C" {
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
    fn ftrylockfile(f: *mut libc::FILE) -> c_int;
    fn funlockfile(f: *mut libc::FILE);
    fn fflush_unlocked(f: *mut libc::FILE) -> c_int;
}

/// Write out what the program left in the buffers of C's `stdout` and
/// `stderr` (`fflush_unlocked`), each only when its lock is free
/// (`ftrylockfile`): a thread stopped in the middle of `printf` holds it,
/// and then that stream is left as it is (glibc's `exit` flushes it later,
/// without its lock). Never blocks; never allocates.
pub fn flush_stdio_if_unlocked() {
    // SAFETY: reads glibc's `stdout` and `stderr` pointers (set before any
    // constructor runs, never freed); each stream is flushed only while
    // this thread holds its lock, as `fflush_unlocked` requires.
    unsafe {
        for f in [stdout, stderr] {
            if !f.is_null() && ftrylockfile(f) == 0 {
                fflush_unlocked(f);
                funlockfile(f);
            }
        }
    }
}

/// A [`GlobalAlloc`] over glibc's own allocator (see the module docs).
/// Thread-safe as glibc's allocator is.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlibcMalloc;

// SAFETY: glibc returns blocks of at least the size asked for, aligned to
// `MALLOC_ALIGNMENT` from `malloc`/`calloc`/`realloc` and to the alignment
// asked for from `memalign`; a larger alignment always goes to `memalign`,
// and `realloc` of such a block allocates a new aligned one and copies.
unsafe impl GlobalAlloc for GlibcMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGNMENT {
            malloc(layout.size()).cast()
        } else {
            memalign(layout.align(), layout.size()).cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGNMENT {
            return calloc(1, layout.size()).cast();
        }
        let p = memalign(layout.align(), layout.size()).cast::<u8>();
        if !p.is_null() {
            // SAFETY: a fresh block of `layout.size()` bytes.
            unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the block came from glibc (`alloc`).
        unsafe { free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGNMENT {
            // SAFETY: the block came from glibc; `new_size` is non-zero.
            return unsafe { realloc(ptr.cast(), new_size) }.cast();
        }
        let p = memalign(layout.align(), new_size).cast::<u8>();
        if !p.is_null() {
            // SAFETY: disjoint blocks of at least min(old, new) bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                free(ptr.cast());
            }
        }
        p
    }
}

/// The largest `M_MMAP_THRESHOLD` glibc's dynamic threshold sets on
/// 64-bit targets (`DEFAULT_MMAP_THRESHOLD_MAX` in `malloc/malloc.c`:
/// 32 MiB); a freed mapping larger than this leaves the dynamic threshold
/// as it is.
pub const MMAP_THRESHOLD_MAX: usize = 32 << 20;

/// glibc's default `M_MMAP_THRESHOLD` (`DEFAULT_MMAP_THRESHOLD_MIN`,
/// 128 KiB), where its dynamic threshold starts.
pub const MMAP_THRESHOLD_DEFAULT: usize = 128 << 10;

/// The `mallopt` settings that decide where glibc's requests between
/// 128 KiB and the preload threshold come from (`mallopt(3)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `M_MMAP_THRESHOLD`, in bytes: a request whose chunk (the request
    /// plus glibc's 8-byte header, rounded up to 16; for `memalign`, plus
    /// the alignment) reaches this many bytes, and that no free chunk or
    /// the heap's top serves, gets a mapping of its own, unmapped at `free`.
    pub mmap: usize,
    /// `M_TRIM_THRESHOLD`, in bytes: the free memory at the top of each of
    /// glibc's heaps (one per arena) that `free` leaves in place.
    pub trim: usize,
}

impl Thresholds {
    /// The thresholds for a preload threshold of `preload` bytes: those
    /// glibc's dynamic threshold (`malloc/malloc.c`) sets itself when the
    /// program frees a mapped chunk of `preload` bytes. The mmap threshold
    /// is `preload`, kept within glibc's 128 KiB to 32 MiB, and the trim
    /// threshold twice that (4 MiB at the default 2 MiB).
    pub fn for_preload_threshold(preload: usize) -> Thresholds {
        let mmap = preload.clamp(MMAP_THRESHOLD_DEFAULT, MMAP_THRESHOLD_MAX);
        Thresholds {
            mmap,
            trim: 2 * mmap,
        }
    }
}

/// Whether an environment variable glibc reads at start-up sets one of
/// the `names` (tunables of `glibc.malloc.`, as `mmap_threshold`) or one
/// of their `aliases` (`MALLOC_*_` variables), as
/// [`thresholds_from_environment`] says for the two thresholds (every
/// `GLIBC_TUNABLES`, none in a secure-execution program). Never
/// allocates.
fn environment_sets(names: &[&[u8]], aliases: &[&[u8]]) -> bool {
    if crate::sys::secure_execution() {
        return false;
    }
    crate::sys::env_entries().any(|(name, value)| {
        if name == b"GLIBC_TUNABLES" {
            value.split(|&b| b == b':').any(|entry| {
                entry
                    .strip_prefix(b"glibc.malloc.".as_slice())
                    .is_some_and(|t| {
                        names
                            .iter()
                            .any(|n| t.strip_prefix(*n).is_some_and(|r| r.first() == Some(&b'=')))
                    })
            })
        } else {
            aliases.contains(&name)
        }
    })
}

/// Whether the environment configures glibc's mmap or trim threshold
/// itself: a `glibc.malloc.mmap_threshold=` or
/// `glibc.malloc.trim_threshold=` entry in any `GLIBC_TUNABLES` variable
/// (entries are separated by `:`, and glibc reads every `GLIBC_TUNABLES`
/// of the environment, as its `elf/dl-tunables.c` does; `getenv` would
/// find only the first of a name a raw `execve` passed twice), or
/// `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` set, even empty
/// (glibc then reads 0; `mallopt(3)`, "ENVIRONMENT"). Never in a
/// set-user-ID or set-group-ID program (`AT_SECURE`), whose environment
/// glibc does not take either threshold from (both tunables are
/// `SXID_IGNORE` in its `dl-tunables.list`). One walk of the environment,
/// which nobody may change meanwhile (the contract of `getenv` too); never
/// allocates.
pub fn thresholds_from_environment() -> bool {
    environment_sets(
        &[b"mmap_threshold", b"trim_threshold"],
        &[b"MALLOC_MMAP_THRESHOLD_", b"MALLOC_TRIM_THRESHOLD_"],
    )
}

/// Whether the environment turns glibc's dynamic threshold off with a
/// setting other than the two thresholds: `glibc.malloc.top_pad` or
/// `glibc.malloc.mmap_max` in a `GLIBC_TUNABLES`, or `MALLOC_TOP_PAD_` or
/// `MALLOC_MMAP_MAX_` (glibc's `ptmalloc_init` sets them as `mallopt`
/// would, which ends the dynamic threshold). The library then sets the
/// thresholds but does not raise the trim threshold. Never allocates.
fn dynamic_threshold_off_by_environment() -> bool {
    environment_sets(
        &[b"top_pad", b"mmap_max"],
        &[b"MALLOC_TOP_PAD_", b"MALLOC_MMAP_MAX_"],
    )
}

/// glibc's own `mallopt(param, value)` (`__libc_mallopt`, not the first
/// `mallopt` of the process, which another preloaded allocator may
/// define, and reachable before the C library is initialized, from a
/// program's `.preinit_array`): 1 when glibc took the value, else 0.
fn mallopt(param: c_int, value: c_int) -> c_int {
    // SAFETY: glibc's `mallopt` takes any parameter and value.
    unsafe { __libc_mallopt(param, value) }
}

/// `mallopt` of a byte count; false when it does not fit a C `int`.
fn mallopt_bytes(param: c_int, bytes: usize) -> bool {
    c_int::try_from(bytes).is_ok_and(|v| mallopt(param, v) == 1)
}

/// The trim threshold the library set and glibc has, in bytes; 0 while
/// the library does not raise it ([`follow_freed_block`],
/// [`follow_heap_regrowth`]). Changed only under [`TRIM_LOCK`].
static TRIM_SET: AtomicUsize = AtomicUsize::new(0);

/// Orders the library's `mallopt(M_TRIM_THRESHOLD)` calls against each
/// other and against the program's `mallopt` ([`program_mallopt`]).
static TRIM_LOCK: PoolLock<()> = PoolLock::new(());

/// Whether the program set one of glibc's thresholds with `mallopt`
/// ([`program_mallopt`]) and glibc took it, at any time (also before the
/// library's constructor ran, from another library's constructor).
static PROGRAM_SET: AtomicBool = AtomicBool::new(false);

/// Whether the program set one of glibc's thresholds with `mallopt`
/// ([`program_mallopt`]), before or after [`set_thresholds`].
pub fn program_set_thresholds() -> bool {
    PROGRAM_SET.load(Ordering::Relaxed)
}

/// Set glibc's mmap and trim thresholds with glibc's own `mallopt`
/// (`M_MMAP_THRESHOLD`, `M_TRIM_THRESHOLD`), which also ends glibc's
/// dynamic threshold. Returns whether glibc took both; from then on
/// [`follow_freed_block`] and [`follow_heap_regrowth`] raise the trim
/// threshold, unless the environment turned glibc's dynamic threshold off
/// (`MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_` or their tunables).
pub fn set_thresholds(t: Thresholds) -> bool {
    let _held = TRIM_LOCK.lock();
    let set = mallopt_bytes(libc::M_MMAP_THRESHOLD, t.mmap)
        && mallopt_bytes(libc::M_TRIM_THRESHOLD, t.trim);
    let follow = set && !dynamic_threshold_off_by_environment();
    TRIM_SET.store(if follow { t.trim } else { 0 }, Ordering::Relaxed);
    set
}

/// The trim threshold the library set and raised since, in bytes, while
/// it raises it ([`follow_freed_block`], [`follow_heap_regrowth`]); 0 when
/// it set none
/// ([`set_thresholds`] was not called or failed), when the environment
/// turned glibc's dynamic threshold off, or when the program set glibc's
/// thresholds itself since ([`program_mallopt`]).
pub fn trim_threshold() -> usize {
    TRIM_SET.load(Ordering::Relaxed)
}

/// Raise glibc's trim threshold for a freed huge block requested with
/// `size` bytes, as glibc's dynamic threshold does (`malloc/malloc.c`,
/// `__libc_free`) when the program frees a mapped chunk larger than its
/// mmap threshold and at most [`MMAP_THRESHOLD_MAX`] (32 MiB): to twice
/// `size`, so under 64 MiB. A block of
/// more than 32 MiB less 64 KiB raises nothing, as a mapping over 32 MiB
/// (glibc's chunk adds a header and rounds up to a page) leaves glibc's
/// dynamic threshold as it is. `size` is rounded down to a whole MiB first, so
/// the threshold rises at most 32 times in a process. Under glibc alone
/// the same request gets a mapping whose chunk holds at least `size`
/// bytes (plus the alignment's padding for an aligned request), so these
/// raises keep the library's threshold at or under glibc's own for the
/// same `malloc` calls ([`follow_heap_regrowth`] may raise it further).
/// Does nothing while the library does not raise the
/// threshold ([`trim_threshold`] is 0). Never allocates; thread-safe. A
/// raise calls `mallopt`, which takes glibc's main arena lock and
/// consolidates its fast bins.
pub fn follow_freed_block(size: usize) {
    // glibc's chunk for `size` adds its header and rounds up to a page
    // (64 KiB at most): one over the maximum raises nothing there.
    if size > MMAP_THRESHOLD_MAX - (64 << 10) {
        return;
    }
    raise_trim_threshold(size / MIB * MIB * 2, Raise::FreedBlock);
}

/// One MiB, the step of the trim threshold's raises.
const MIB: usize = 1 << 20;

/// [`follow_heap_regrowth`] raises the trim threshold to at most this many
/// times the one set at load (16 MiB at the default), a bound on each
/// arena's free top; freed huge blocks may raise it past that.
pub const HEAP_REGROWTH_RAISE_FACTOR: usize = 4;

/// The highest trim threshold [`follow_heap_regrowth`] raises to.
fn heap_regrowth_cap() -> usize {
    Thresholds::for_preload_threshold(crate::env::preload_threshold())
        .trim
        .saturating_mul(HEAP_REGROWTH_RAISE_FACTOR)
}

/// Raise glibc's trim threshold for glibc's main heap, which gave bytes of
/// its top back to the kernel at a `free` and then grew `regrown` of them
/// again within the decay window (`CKALLOC_RETAIN_DECAY_MS`; the preload
/// library watches the program break around requests of 64 KiB and more
/// below its threshold, as [`crate::preload`] says): to twice `regrown`,
/// rounded up to a whole MiB and at most [`HEAP_REGROWTH_RAISE_FACTOR`]
/// times the threshold set at load (16 MiB at the default). The raised
/// threshold stays: glibc's own dynamic threshold never comes down either.
/// Does nothing while the library does not raise the threshold
/// ([`trim_threshold`] is 0). Never allocates; thread-safe.
///
/// At batch 16 by 16 tokens PyTorch's activations free more than 4 MiB at
/// the top of glibc's main heap at the end of every request, which glibc
/// gave back and faulted in again at the next. The preload
/// library watches the program break around `malloc`, `calloc`,
/// `memalign`, `posix_memalign` and `aligned_alloc` requests of 64 KiB and
/// more below its threshold: a fall is a trim, and a rise within the
/// decay window (`CKALLOC_RETAIN_DECAY_MS`, 2 s, read on the coarse clock;
/// `0` turns this off) of the watched call before that trim is regrowth,
/// whatever the program grows the heap for; so a one-off large free
/// followed by a little growth raises little. This raise goes past glibc's
/// own dynamic threshold, which leaves such a program giving the top back
/// at every request. Once raised, the threshold is every arena's, so each
/// arena may keep up to the cap free at its top (`benches/README.md` has
/// a 16-thread program's cost). Only the main heap is watched (the other
/// arenas' heaps are mappings that leave the break alone): threads that
/// churn their own arenas while the main heap does not raise nothing. Not
/// watched: growth by `realloc`, `valloc` and `pvalloc` and by requests
/// under 64 KiB, and a trim and regrowth farther apart than the window (a
/// request that computes for longer than the window between its last
/// watched request before the trim and the next after it). The program's
/// `malloc_trim` raises nothing, also on another thread or across a
/// `fork()` (a program that moves the break itself with `brk` or `sbrk`
/// may); the program's `mallopt` ends this raising
/// ([`program_mallopt`]).
pub fn follow_heap_regrowth(regrown: usize) {
    let cap = heap_regrowth_cap();
    let want = regrown
        .checked_mul(2)
        .and_then(|b| b.checked_next_multiple_of(MIB))
        .map_or(cap, |b| b.min(cap));
    raise_trim_threshold(want, Raise::HeapRegrowth);
}

/// Whether [`follow_heap_regrowth`] may still raise the trim threshold:
/// the library raises it, and it is under that function's cap.
pub fn trim_threshold_may_rise() -> bool {
    let cur = TRIM_SET.load(Ordering::Relaxed);
    cur != 0 && cur < heap_regrowth_cap()
}

/// What raised the trim threshold the library set at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Raise {
    /// A freed huge block ([`follow_freed_block`]).
    FreedBlock = 1,
    /// glibc's main heap growing again into the top it trimmed
    /// ([`follow_heap_regrowth`]).
    HeapRegrowth = 2,
}

/// The [`Raise`] kinds that raised the trim threshold, as bits.
static RAISED_BY: AtomicU8 = AtomicU8::new(0);

/// Whether freed huge blocks ([`follow_freed_block`]) and glibc's heap
/// growing again after a trim ([`follow_heap_regrowth`]) raised the trim
/// threshold, in that order.
pub fn trim_threshold_raised_by() -> (bool, bool) {
    let bits = RAISED_BY.load(Ordering::Relaxed);
    (
        bits & Raise::FreedBlock as u8 != 0,
        bits & Raise::HeapRegrowth as u8 != 0,
    )
}

/// Set glibc's trim threshold to `want` bytes if that is more than the
/// library's threshold now, while the library raises it. A raise calls
/// `mallopt` under [`TRIM_LOCK`], which takes glibc's main arena lock and
/// consolidates its fast bins.
fn raise_trim_threshold(want: usize, why: Raise) {
    let cur = TRIM_SET.load(Ordering::Relaxed);
    if cur == 0 || want <= cur {
        return;
    }
    let _held = TRIM_LOCK.lock();
    let cur = TRIM_SET.load(Ordering::Relaxed);
    if cur != 0 && want > cur && mallopt_bytes(libc::M_TRIM_THRESHOLD, want) {
        TRIM_SET.store(want, Ordering::Relaxed);
        RAISED_BY.fetch_or(why as u8, Ordering::Relaxed);
    }
}

/// The program's `mallopt(param, value)`, passed to glibc's. A setting of
/// `M_TRIM_THRESHOLD`, `M_TOP_PAD`, `M_MMAP_THRESHOLD` or `M_MMAP_MAX`
/// that glibc takes ends glibc's dynamic threshold (`malloc/malloc.c`),
/// and so ends the library's raising of the trim threshold
/// ([`follow_freed_block`], [`follow_heap_regrowth`]); made before the
/// library's constructor ran
/// (from another library's constructor), it keeps the library from
/// setting the thresholds ([`program_set_thresholds`]). Either way the
/// program's setting stands. One glibc refuses changes nothing.
pub fn program_mallopt(param: c_int, value: c_int) -> c_int {
    if ![
        libc::M_TRIM_THRESHOLD,
        libc::M_TOP_PAD,
        libc::M_MMAP_THRESHOLD,
        libc::M_MMAP_MAX,
    ]
    .contains(&param)
    {
        return mallopt(param, value);
    }
    let _held = TRIM_LOCK.lock();
    let took = mallopt(param, value);
    if took == 1 {
        PROGRAM_SET.store(true, Ordering::Relaxed);
        TRIM_SET.store(0, Ordering::Relaxed);
    }
    took
}

/// For the `fork()` prepare handler: takes the lock that orders the
/// `mallopt` calls of [`follow_freed_block`], [`follow_heap_regrowth`] and
/// [`program_mallopt`], so
/// that no fork falls between a `mallopt` and the record of it; the
/// parent and the child give it back ([`after_fork`]). It runs before
/// glibc's `fork` takes the arenas' locks, so a holder waiting in
/// `mallopt` finishes first.
pub fn before_fork() {
    TRIM_LOCK.raw_lock();
}

/// For the `fork()` parent and child handlers: gives back the lock
/// [`before_fork`] took.
pub fn after_fork() {
    // SAFETY: `before_fork` took the lock on this thread (the child's one
    // thread is the one that forked) without a guard.
    unsafe { TRIM_LOCK.force_unlock() };
}
