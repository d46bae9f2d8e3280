//! The engine of the preload library, `libckalloc_preload.so` (package
//! `ckalloc-preload`, directory `preload/`): the C allocation API served
//! by ckalloc for programs that are not recompiled, loaded with
//! `LD_PRELOAD` the way users load jemalloc or tcmalloc. Behind the
//! `preload` feature, Linux with glibc only.
//!
//! ```text
//! cargo build --release -p ckalloc-preload
//! LD_PRELOAD=$PWD/target/release/libckalloc_preload.so python3 serve.py
//! ckalloc run -- python3 serve.py            # the same, found for you
//! ```
//!
//! The library exports `malloc`, `free`, `calloc`, `realloc`,
//! `reallocarray`, `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`,
//! `pvalloc`, `malloc_usable_size`, `malloc_trim` and `mallopt`, each a thin wrapper
//! of the function of the same name here. `libckalloc.so` (the C ABI of
//! `ckernel_alloc.h`, feature `capi`) exports none of them: linking it
//! never replaces a program's `malloc`.
//!
//! # Routing
//!
//! A request of at least [`env::preload_threshold`](crate::env::preload_threshold)
//! bytes (`CKALLOC_PRELOAD_THRESHOLD`, default 2 MiB) gets a block of the
//! huge-page engine ([`huge`](crate::huge)) with the C front's policy,
//! [`Policy::C_MALLOC`](crate::huge::Policy::C_MALLOC)
//! ([below](#huge-blocks-first-touch-and-retention)). The engine finds a
//! block from its address alone in its extent map, so `free`, `realloc` and
//! `malloc_usable_size` tell a ckalloc block from any other pointer in
//! constant time (one alignment test, then two loads), without touching
//! memory at the pointer, and a huge `realloc` is one call of the engine.
//!
//! Smaller requests, and every pointer the engine does not hold, go to
//! glibc's own allocator through the entry points glibc 2.36 exports
//! for that purpose:
//!
//! | call | reaches glibc through |
//! | --- | --- |
//! | `malloc`, `free`, `calloc`, `realloc` | `__libc_malloc`, `__libc_free`, `__libc_calloc`, `__libc_realloc` |
//! | `memalign`, `aligned_alloc`, `posix_memalign` | `__libc_memalign` (glibc exports no `__libc_posix_memalign` or `__libc_aligned_alloc`; the checks of each are done here) |
//! | `valloc`, `pvalloc` | `__libc_valloc`, `__libc_pvalloc` |
//! | `reallocarray` | the overflow check here, then `realloc` (`__libc_reallocarray` is `GLIBC_PRIVATE`) |
//! | `mallopt` | `__libc_mallopt` |
//! | `malloc_usable_size`, `malloc_trim` | glibc's exported functions, found once with `dlsym` on `libc.so.6` and cached (not `RTLD_NEXT`, where another preloaded allocator would answer; `dlsym` may call `malloc` or `calloc`, which never need it, so the lookup cannot recurse) |
//!
//! When the library is loaded with `LD_PRELOAD` it sets glibc up for them
//! with glibc's `mallopt(3)` ([`configure_glibc_thresholds`]):
//! `M_MMAP_THRESHOLD` at the threshold (kept within glibc's range, 128 KiB
//! to 32 MiB) and `M_TRIM_THRESHOLD` at twice that (4 MiB at the default),
//! the values glibc's dynamic threshold (`malloc/malloc.c`) sets itself
//! once the program frees a mapped chunk of the threshold's size. glibc's
//! defaults (128 KiB and 128 KiB) map a request from 128 KiB up that its
//! heap has no free chunk for until the dynamic threshold has grown past
//! it, and `free` gives the mapping back, so each request of a model
//! server faults its mid-sized tensors in again; with these, such requests
//! come from glibc's heaps.
//!
//! The trim threshold then follows the huge blocks the program frees, as
//! glibc's dynamic threshold follows the mapped chunks it frees: a freed
//! block requested with at most 32 MiB less 64 KiB raises it to twice the
//! requested size rounded down to a whole MiB (a 3.5 MiB request: 6 MiB),
//! so to under 64 MiB, and a larger one raises nothing
//! ([`glibc::follow_freed_block`]). Under glibc alone the same
//! `malloc` would get a mapping of at least that size and, at its `free`,
//! raise the trim threshold to twice the mapping's size; so such a raise
//! never takes the threshold past the one glibc's dynamic threshold would reach
//! for the same `malloc` calls on its own (the 4 MiB set at load may be
//! more than glibc's own in a program that frees no mapping), and a model
//! server's requests, which free their tensors at the top of glibc's
//! heap and ask for them again in the next request, do not give that top
//! back and fault it in again at every request (`benches/README.md` has
//! the serving trace's page faults with and without it). What glibc keeps
//! is glibc's, as it is once its dynamic threshold has grown: up to the
//! trim threshold free at the top of each arena's heap (one arena per
//! thread that allocated concurrently, up to 8 per core; `malloc_trim`
//! gives back the main arena's top only, and free chunks inside every
//! heap), and freed memory that live blocks
//! above it pin. glibc may still map a request just below
//! the threshold (its chunk adds 8 to 23 bytes) and an aligned one whose
//! size and alignment together reach it.
//!
//! glibc's main heap can still give back and fault in again what a
//! request's blocks below the threshold free at its end: at batch 16 by 16
//! tokens, PyTorch's activations (up to 1.5 MiB each) free more than 4 MiB
//! at the top of the heap, and glibc gave it back at every request (1,000
//! to 2,000 page faults each) while no freed huge block raised the
//! threshold. So the trim threshold also follows that heap: when it grows
//! again, within the decay window, into a top its `free` trimmed, the
//! library raises the trim threshold to twice what grew back, up to four
//! times the threshold set at load (16 MiB), and never lowers it
//! ([`glibc::follow_heap_regrowth`] says what is watched, what is not, and
//! what the raise may keep in every arena).
//!
//! The library leaves glibc as it is when the environment sets either
//! threshold (a `glibc.malloc.mmap_threshold=` or
//! `glibc.malloc.trim_threshold=` entry in any `GLIBC_TUNABLES` of the
//! environment, as glibc reads every one a raw `execve` passed,
//! `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`), when it was opened
//! with `dlopen` (it then comes after libc, and its `malloc` is not the
//! process's), and when the environment is not set up yet. A library
//! before it in `LD_PRELOAD` that wraps `malloc` (heaptrack,
//! `libmemusage.so`) does not change this. It sets the thresholds in its
//! constructor. A `mallopt` of the program's that sets `M_TRIM_THRESHOLD`,
//! `M_TOP_PAD`, `M_MMAP_THRESHOLD` or `M_MMAP_MAX` (the library's `mallopt`
//! passes it to glibc's) stands: made earlier (in the constructor of a
//! library the program links, which runs before a preloaded library's),
//! the library sets no threshold; made later, it ends the raising of the
//! trim threshold, as it ends glibc's dynamic threshold. `MALLOC_TOP_PAD_`
//! and `MALLOC_MMAP_MAX_` (or their `GLIBC_TUNABLES` entries) end glibc's
//! dynamic threshold too: the library then sets the thresholds and does not
//! raise the trim threshold. The summary's `glibc:` line and
//! [`PreloadStats::glibc_thresholds`] say which happened.
//!
//! # Semantics (glibc 2.36, `malloc(3)`, `posix_memalign(3)`, `malloc_usable_size(3)`)
//!
//! - `malloc(0)` returns a unique pointer (glibc's); `free(NULL)` does
//!   nothing; failures return null with `errno = ENOMEM`; the huge path
//!   leaves `errno` as it was on success.
//! - `calloc` fails with `ENOMEM` when `n * size` overflows; huge blocks
//!   read zero, also when they come from retained memory.
//! - `realloc(NULL, n)` is `malloc(n)`; `realloc(p, 0)` frees `p` and
//!   returns null (glibc's `REALLOC_ZERO_BYTES_FREES`); a block moves
//!   across the threshold in either direction with its contents, and
//!   huge blocks grow and shrink in place or move their pages with
//!   `mremap`, as `CkHuge`'s do. A shrink of a huge block never fails. On
//!   failure `p` is untouched.
//! - `memalign` and `aligned_alloc` follow glibc 2.36: an alignment up to
//!   16 is `malloc`'s, one that is not a power of two is rounded up to the
//!   next, one above `SIZE_MAX / 2 + 1` fails with `EINVAL` (glibc 2.38's
//!   `aligned_alloc` refuses alignments that are not powers of two; 2.36's
//!   does not). `posix_memalign` returns `EINVAL` unless the alignment is
//!   a power of two and a multiple of `sizeof(void *)`. Huge blocks honour
//!   every alignment up to 1 GiB and beyond (by over-reserving address
//!   space).
//! - `malloc_usable_size` of a huge block is its whole length (the
//!   request rounded up to 2 MiB; above 1 GiB, to its span's unit), all of
//!   it writable.
//! - Memory a program never writes stays uncommitted, as with glibc: a
//!   fresh block faults in when written.
//! - `malloc_trim` purges every retained huge block (`MADV_DONTNEED`) and
//!   unmaps the engine's idle spans, then runs glibc's. Retained blocks
//!   decay by the clock on the engine's background thread (below): what
//!   the last `CKALLOC_RETAIN_DECAY_MS` (default 2 s) of demand cannot take
//!   back is given back within about 2.35 s of its free, or of the last
//!   miss it did not fit while that recent (64 runs a step of 100 ms),
//!   also while the program makes no call; with the thread off, at the next
//!   huge-path call (small requests run no step, to keep glibc's path as
//!   is). Retention is capped at the larger of 128 MiB and twice the peak of
//!   live huge bytes, or `CKALLOC_RETAIN_BYTES` when set. The rules and bounds:
//!   [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#bounds-of-retention).
//! - `mallinfo2`, `malloc_stats` and `malloc_info` are glibc's and count
//!   glibc's memory only: ckalloc's blocks are in [`huge_stats`](crate::huge_stats)
//!   and in the `CKALLOC_SHOW_STATS` summary.
//! - C++ `operator new` and `delete` reach these functions through
//!   libstdc++'s `malloc` and `free`.
//!
//! # Huge blocks: first touch and retention
//!
//! The C front's policy differs from `CkHuge`'s in a Rust program in five
//! rules, each a row of
//! [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-rules)
//! (with the measurements behind it in `benches/README.md`):
//!
//! - **First touch**: a fresh block faults in when the program writes it,
//!   as glibc's, jemalloc's and PyTorch's own mappings do, with no probe:
//!   in base pages while the background thread promotes (where THP's
//!   `defrag` mode would make a `MADV_HUGEPAGE` fault compact memory
//!   synchronously, Debian's default), so no request waits on compaction
//!   or on the host; the thread collapses it into huge pages once it has
//!   lived 250 ms. As THP while the thread's fault check finds huge pages
//!   cheap now, and without the thread.
//! - **Retention cap**: while `CKALLOC_RETAIN_BYTES` is unset, twice the
//!   high-water mark of live huge bytes
//!   ([`HugeStats::peak_live_bytes`](crate::HugeStats::peak_live_bytes)),
//!   at least 128 MiB, so a program that frees and allocates a 256 MiB
//!   buffer in a loop reuses it; a `CKALLOC_RETAIN_BYTES` that parses is
//!   the exact cap.
//! - **A full cache** purges its oldest retained blocks to make room: the
//!   block freed last is the one a C program asks for again.
//! - **Zeroing**: a `calloc` served from retained memory is cleared with
//!   `MADV_DONTNEED` at every length (a hugetlb block: `memset`), so
//!   pages the program never writes stay uncommitted.
//! - **Growth on a miss**: a request that needs no zeroing (not `calloc`)
//!   that no retained block serves takes the place with the most retained
//!   units and free units around them, so only the added units fault in
//!   ([`HugeStats::retention_extends`](crate::HugeStats::retention_extends)).
//!
//! When the engine has no memory for a request (address space under
//! `ulimit -v`, the VMA limit, the span table) it gives back what it
//! retains and tries again, and then the request is served by glibc
//! (counted in the summary): retained memory never makes a request fail
//! that glibc would serve.
//!
//! # Start-up, threads, fork
//!
//! - The paths never call the exported allocator (the library's Rust code
//!   allocates through [`GlibcMalloc`]), never panic and never print. The
//!   environment is read with `getenv`, without allocating; a call from the
//!   dynamic loader before the C library has set up the environment uses
//!   the defaults and reads again later.
//! - **One thread.** The library starts one thread of its own, the
//!   engine's background thread (`ckalloc-bg` in `top -H`), as jemalloc's
//!   `background_thread` and tcmalloc's background actions do: every
//!   100 ms it gives back retained memory by the clock and collapses
//!   long-lived base-page blocks into huge pages (`MADV_COLLAPSE`, at most
//!   a quarter of one core). It starts at the first huge-path call after
//!   the library's constructor, at that call's thread's priority (never
//!   inside another start: a `malloc` that `pthread_create` makes goes on
//!   without it), with every signal blocked; a `pthread_create` that fails
//!   (a pid limit, a seccomp filter) is silent and leaves the library
//!   working without it; a fork child starts its own at its first huge-path call.
//!   `CKALLOC_BACKGROUND_THREAD=0` keeps it from starting: do that for a
//!   program that calls `unshare(CLONE_NEWUSER)` (refused in a
//!   multi-threaded process) or that must stay single-threaded across
//!   `fork()` (CPython 3.12 and later warn at `os.fork()` in a process
//!   with more than one thread). The rules:
//!   [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-background-thread).
//!   What it costs: while it runs and THP's `defrag` mode makes a
//!   `MADV_HUGEPAGE` fault compact memory (Debian's default, `madvise`),
//!   fresh blocks fault in 4 KiB pages (512 faults per 2 MiB, where a huge
//!   page is one) and become huge pages later, so no request waits on
//!   compaction, unless its fault check (a timed huge-page fault and the
//!   free 2 MiB blocks, every tick while blocks are allocated) finds huge
//!   pages cheap. A program that keeps faulting fresh memory pays for it
//!   when free 2 MiB blocks are at hand: a C stress program of 4 threads
//!   writing fresh 1-256 MiB blocks ran 34.5 s with the thread, 4.7 s with
//!   `CKALLOC_BACKGROUND_THREAD=0` and 56.5 s under glibc; and a parent
//!   whose memory is still in base pages forks slower (its page tables are
//!   copied page by page; copy-on-write pages are collapsed only after the
//!   parent writes them). When memory is fragmented the trade goes the
//!   other way: stress-ng's malloc stressor ran at 34,711 bogo ops/s with
//!   the thread and 400 without it, which waited on compaction
//!   (`benches/README.md`). `CKALLOC_THP=0` keeps base pages throughout.
//! - A signal handler that interrupts `malloc` and calls `malloc` is not
//!   supported (as in glibc); handlers elsewhere work.
//! - `fork`: the engine's `pthread_atfork` child hook (registered when the
//!   library loads) lets a child of a multi-threaded parent allocate and
//!   gives back the retained blocks the child inherits; the extent map is
//!   lock-free; glibc handles its own arenas. `vfork` and `posix_spawn` run
//!   no `atfork` handlers: their child may only `exec` or `_exit` (POSIX),
//!   which never call the allocator.
//!
//! # Seeing what you got
//!
//! `CKALLOC_SHOW_STATS=1` (read at load; not in a set-user-ID program,
//! [`crate::env`]) prints one summary when the process calls `exit` (or returns
//! from `main`), for a process that served at least one huge block (`=all`:
//! every process, so a shell or a pyenv shim in front of the program stays
//! quiet by default); a process whose allocator calls go first elsewhere prints
//! one line that says where ([`Binding`]: an allocator preloaded ahead of this
//! library, or the library opened with `dlopen`). `CKALLOC_STATS_FILE=PATH`
//! appends the summary to a file instead of stderr (and asks for summaries
//! while `CKALLOC_SHOW_STATS` is unset): `%p` in `PATH` is replaced by the
//! process ID, so each process of a tree writes its own file and no summary
//! mixes into a stream a parent parses; `%%` is one `%`; any other `%` sequence
//! is not taken and no summary is written (`ckalloc run` says so); a relative
//! path is taken from the directory the process had at load; one `write(2)` per
//! summary to a file opened `O_APPEND`, so two processes sharing a path never
//! interleave within a summary. Without a file, the summary goes into the
//! stderr the process had at load: through descriptor 2 while it is still that
//! file, else through a copy of it the library made at load (close-on-exec,
//! numbered from 512, or from half the descriptor limit when that is lower), so
//! a program that closed stderr first (GNU coreutils do, in an `atexit` handler
//! that runs before the library's) or reused its number still gets it there; a
//! program that closed the copy too gets none. While the variable is on, the
//! copy keeps stderr open until exit: a reader of a pipe on it sees its end
//! then, not when the program closes descriptor 2. The library's destructor
//! runs before glibc's `exit` writes out the C streams' buffers, so it first
//! writes out what the program left in `stdout`'s and `stderr`'s buffers itself
//! (`fflush_unlocked`), each only when `ftrylockfile` gets the stream's lock: a
//! thread stopped inside `printf` holds it, and the library never waits for it
//! (that stream's last lines may then follow the summary). Python flushes its
//! own `sys.stdout` before `exit`. The summary is written without dying of
//! `SIGPIPE` when stderr is a closed pipe: huge blocks served and bytes
//! requested at allocation (growth by `realloc` is not in these bytes: it shows
//! in the resize counts), the threshold and the retention cap in use (the rule
//! above while `CKALLOC_RETAIN_BYTES` is unset), a `glibc:` line with glibc's
//! thresholds ([`GlibcThresholds`]), then [`huge_stats`](crate::huge_stats)
//! (blocks and bytes per tier, live, retained and span bytes, retention,
//! resizes and purges, the engine's system calls by kind, first touch, short
//! tails, the settings), every line labelled `ckalloc[PID]: `, formatted
//! without allocating. The first-touch line and the `CKALLOC_FIRST_TOUCH_PROBE`
//! setting concern `CkHuge` in Rust code only (the C API never applies the
//! policy), and the `CKALLOC_RETAIN_BYTES` setting shows the variable, not the
//! cap in use. A child that inherits the variable prints its own; a child of
//! `fork` prints one only when it served a huge block itself (or under `all`),
//! and starts from a copy of its parent's counters, as jemalloc's and
//! mimalloc's statistics do, so its summary includes what the parent did before
//! the fork (subtract the parent's, or set the variable in the parent only).
//! `_exit` (and a death by signal) prints none: dash, the `sh` of Debian and
//! Ubuntu, leaves through `_exit`, so `sh -c 'a; b'` prints the summaries of
//! `a` and `b` and none of its own (it served no huge block anyway), and a
//! program dash runs as its last command replaces it (`exec`).
//!
//! The library exports one function of its own beside the allocation
//! API, `size_t ckalloc_stats_json(char *buf, size_t len)`: the same
//! statistics as one JSON object (the keys are listed at
//! [`write_stats_json`]), written as `snprintf` writes, for a program to
//! read at run time; the Python package's `ckalloc.stats()` calls it. The
//! library writes to no stream on its own: a setting it does not take is
//! reported in the summary, by `ckalloc probe` and by `ckalloc run`, which
//! checks every `CKALLOC_*` variable before the program starts.
//!
//! # Limits
//!
//! - Static binaries and set-user-ID or set-group-ID programs ignore
//!   `LD_PRELOAD` (`ld.so(8)`); so do programs that link their own
//!   allocator statically (it takes the calls first).
//! - A library opened with `dlopen(RTLD_DEEPBIND)` resolves `malloc` and
//!   `free` to glibc's own: a ckalloc block freed there reaches glibc's
//!   `free`, which aborts ("free(): invalid pointer") or worse. jemalloc
//!   and tcmalloc have the same limit.
//! - AddressSanitizer, valgrind and other tools that replace `malloc`
//!   take the calls themselves. Another allocator in the same
//!   `LD_PRELOAD` (jemalloc, tcmalloc, mimalloc) splits the calls between
//!   the two (C++ `operator new` then goes to it), and each corrupts the
//!   other's blocks: `ckalloc run` refuses to add the library then.
//! - The extent map holds addresses below 2^47 (4-level paging); a span
//!   the kernel maps above (only when asked with a hint) is given back and
//!   the request served by glibc instead, counted in the summary.
//! - A huge block the program changes (`mprotect`, `mlock`, `madvise`)
//!   and frees keeps those changes while it is retained, as freed memory
//!   does under jemalloc and mimalloc; `malloc(3)` leaves the case
//!   unspecified. A `malloc` that reuses it before it is purged gets it as
//!   the program left it (still locked, say: `munlock` before `free` what
//!   should not stay locked). The engine never faults on it: a `calloc`
//!   that reuses it makes it read-write before clearing it, and a purge
//!   (decay, `malloc_trim`) leaves the range read-write and unlocked. A
//!   `realloc` that moves a block moves its pages,
//!   and what the program did to them, with it (`mremap`), as glibc's
//!   `mremap` of a chunk does; the old place is purged and made plain.
//! - A hugetlb block (a hugetlb pool reserved in `nr_hugepages`) is made of
//!   2 MiB pages the kernel cannot split: `mprotect`, `madvise`, `mlock`
//!   and `munmap` of a range inside it that does not start and end on a
//!   2 MiB boundary fail with `EINVAL` (`mmap(2)`), so a program that puts
//!   a guard page inside a `malloc`'d buffer gets an error there that it
//!   does not get from glibc. `CKALLOC_HUGETLB=0` keeps such a program on
//!   THP. A threshold far below 2 MiB gives every small request a 2 MiB
//!   page and uses up the pool quickly (THP serves the rest).
//! - Under an address-space limit (`ulimit -v`, `RLIMIT_AS`) a huge block
//!   takes whole 2 MiB units: under the process's size plus 2 GiB, 512
//!   live `malloc(3 MiB)` fit, against glibc's 681. A `realloc` that
//!   cannot grow a block in place needs the old and the new length at
//!   once. The numbers for every peer are in
//!   [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#limits).
//! - A Rust program that uses `CkHuge` under this library has two engines
//!   (its own and the library's), each with its own cap
//!   ([docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#limits)).
//! - musl and 32-bit targets are not supported (the library needs
//!   glibc's `__libc_*` entry points and a 47-bit address space).

mod api;
mod binding;
pub mod glibc;
mod heap_regrowth;
mod json;
mod report;

pub use api::{
    aligned_alloc, calloc, fast_path_bound, free, malloc, malloc_trim, malloc_usable_size, mallopt,
    memalign, posix_memalign, pvalloc, realloc, reallocarray, valloc,
};
pub use binding::{binding, note_binding, Ahead, Binding};
pub use glibc::GlibcMalloc;
pub use json::write_stats_json;
pub use report::{print_at_exit, remember_output, write_summary};

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// The alignment of every huge-page block the C API hands out (2 MiB, the
/// block registry's granule): a pointer that is not a multiple of it is
/// never a ckalloc block.
pub const BLOCK_ALIGN: usize = crate::sys::HUGE_PAGE_2M;

pub(crate) struct Counters {
    pub(crate) blocks: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) glibc_fallbacks: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    blocks: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
    glibc_fallbacks: AtomicU64::new(0),
};

/// Of [`Counters::blocks`], those this process inherited from its parent
/// at `fork` (the child starts from a copy of the parent's counters): a
/// child that served none itself prints no `CKALLOC_SHOW_STATS=1` summary.
pub(crate) static INHERITED_BLOCKS: AtomicU64 = AtomicU64::new(0);

/// Whether this process served a huge block itself (not only its parent
/// before `fork`).
pub(crate) fn served_huge_blocks() -> bool {
    COUNTERS.blocks.load(Relaxed) > INHERITED_BLOCKS.load(Relaxed)
}

fn after_fork_child() {
    INHERITED_BLOCKS.store(COUNTERS.blocks.load(Relaxed), Relaxed);
    heap_regrowth::after_fork_in_child();
    report::after_fork_in_child();
    glibc::after_fork();
}

/// The fork hooks of stage `PreloadCounters` (`crate::fork`): the lock of
/// glibc's trim threshold is held across the fork
/// ([`glibc::before_fork`]), and the child notes the huge blocks it
/// inherited.
static FORK_HOOKS: crate::fork::Hooks = crate::fork::Hooks {
    prepare: glibc::before_fork,
    parent: glibc::after_fork,
    child: after_fork_child,
};

crate::fork::at_load!(ADD_PRELOAD_FORK_HOOKS, {
    crate::fork::add(crate::fork::Stage::PreloadCounters, &FORK_HOOKS);
});

/// The threshold ([`env::preload_threshold`](crate::env::preload_threshold))
/// once the environment it comes from is set up; `None` before that (a call
/// from the dynamic loader), when a caller must not keep the answer.
pub(crate) fn settled_threshold() -> Option<usize> {
    let t = crate::env::preload_threshold();
    crate::sys::environment_ready().then_some(t)
}

/// What the preload library did with glibc's mmap and trim thresholds
/// when it loaded ([`configure_glibc_thresholds`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GlibcThresholds {
    /// Not set by the library: `libckalloc_preload.so` is not loaded, was
    /// opened with `dlopen` (after libc), or loaded before the environment
    /// was set up. glibc's thresholds are then what glibc and the program
    /// made them.
    #[default]
    Untouched,
    /// Set at load ([`glibc::Thresholds::for_preload_threshold`]); `trim`
    /// is the trim threshold now, raised since by the huge blocks the
    /// program freed ([`glibc::follow_freed_block`]) and by glibc's main
    /// heap growing again into a top it trimmed
    /// ([`glibc::follow_heap_regrowth`]).
    Set(glibc::Thresholds),
    /// Set by the program with `mallopt` ([`glibc::program_mallopt`]),
    /// before the library loaded (from another library's constructor; the
    /// library then set none) or after: glibc's thresholds are the
    /// program's.
    Program,
    /// Left as the environment configures them
    /// ([`glibc::thresholds_from_environment`]).
    Environment,
    /// `mallopt` refused them: glibc keeps its defaults.
    Refused,
}

impl GlibcThresholds {
    /// The word the JSON statistics use: `untouched`, `set`, `environment`,
    /// `program` or `refused`.
    pub fn name(self) -> &'static str {
        match self {
            GlibcThresholds::Untouched => "untouched",
            GlibcThresholds::Set(_) => "set",
            GlibcThresholds::Environment => "environment",
            GlibcThresholds::Program => "program",
            GlibcThresholds::Refused => "refused",
        }
    }
}

/// The summary's words when set: `mmap threshold 2.00 MiB, trim
/// threshold 4.00 MiB (set at load)`, or `… trim threshold 24.00 MiB (set
/// at load, the trim threshold raised by freed huge blocks)`, naming what
/// raised it ([`glibc::trim_threshold_raised_by`], read when formatted):
/// freed huge blocks ([`glibc::follow_freed_block`]), glibc's heap growing
/// into a trimmed top ([`glibc::follow_heap_regrowth`]), or both.
impl std::fmt::Display for GlibcThresholds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GlibcThresholds::Set(t) => {
                write!(
                    f,
                    "mmap threshold {}, trim threshold {} (set at load",
                    crate::units::ExactBytes(t.mmap as u64),
                    crate::units::ExactBytes(t.trim as u64)
                )?;
                let at_load = glibc::Thresholds::for_preload_threshold(t.mmap).trim;
                if t.trim <= at_load {
                    return f.write_str(")");
                }
                f.write_str(match glibc::trim_threshold_raised_by() {
                    (true, true) => {
                        ", the trim threshold raised by freed huge blocks and by glibc's heap growing into a trimmed top)"
                    }
                    (false, true) => {
                        ", the trim threshold raised by glibc's heap growing into a trimmed top)"
                    }
                    _ => ", the trim threshold raised by freed huge blocks)",
                })
            }
            GlibcThresholds::Environment => f.write_str(
                "thresholds as the environment sets them (GLIBC_TUNABLES or MALLOC_*_THRESHOLD_)",
            ),
            GlibcThresholds::Program => f.write_str("thresholds as the program set them (mallopt)"),
            GlibcThresholds::Refused => {
                f.write_str("thresholds not set by ckalloc (mallopt refused them)")
            }
            GlibcThresholds::Untouched => f.write_str("thresholds not set by ckalloc"),
        }
    }
}

const THRESHOLDS_UNTOUCHED: u8 = 0;
const THRESHOLDS_SET: u8 = 1;
const THRESHOLDS_ENVIRONMENT: u8 = 2;
const THRESHOLDS_REFUSED: u8 = 3;
const THRESHOLDS_PROGRAM: u8 = 4;

static GLIBC_THRESHOLDS: AtomicU8 = AtomicU8::new(THRESHOLDS_UNTOUCHED);

/// Configure glibc for the requests the preload library leaves to it,
/// those below the threshold: unless the environment configures glibc's
/// thresholds itself, set its `M_MMAP_THRESHOLD` to the preload threshold
/// and its `M_TRIM_THRESHOLD` to twice that
/// ([`glibc::Thresholds::for_preload_threshold`]; the module docs say why
/// and what glibc keeps then). For the preload library's constructor, and
/// only when the library's `malloc` is the process's (not after `dlopen`).
/// A `mallopt` of glibc's thresholds made before it stands: it then sets
/// none ([`GlibcThresholds::Program`]). Never allocates.
pub fn configure_glibc_thresholds() {
    let Some(threshold) = settled_threshold() else {
        return;
    };
    let state = if glibc::thresholds_from_environment() {
        THRESHOLDS_ENVIRONMENT
    } else if glibc::program_set_thresholds() {
        THRESHOLDS_PROGRAM
    } else if glibc::set_thresholds(glibc::Thresholds::for_preload_threshold(threshold)) {
        THRESHOLDS_SET
    } else {
        THRESHOLDS_REFUSED
    };
    GLIBC_THRESHOLDS.store(state, Relaxed);
}

/// What [`configure_glibc_thresholds`] did in this process.
pub fn glibc_thresholds() -> GlibcThresholds {
    match GLIBC_THRESHOLDS.load(Relaxed) {
        THRESHOLDS_PROGRAM => GlibcThresholds::Program,
        THRESHOLDS_SET if glibc::program_set_thresholds() => GlibcThresholds::Program,
        THRESHOLDS_SET => match glibc::trim_threshold() {
            // The environment turned glibc's dynamic threshold off.
            0 => GlibcThresholds::Set(glibc::Thresholds::for_preload_threshold(
                crate::env::preload_threshold(),
            )),
            trim => GlibcThresholds::Set(glibc::Thresholds {
                trim,
                ..glibc::Thresholds::for_preload_threshold(crate::env::preload_threshold())
            }),
        },
        THRESHOLDS_ENVIRONMENT => GlibcThresholds::Environment,
        THRESHOLDS_REFUSED => GlibcThresholds::Refused,
        _ => GlibcThresholds::Untouched,
    }
}

/// The preload path's own counters (the engine's are in
/// [`huge_stats`](crate::huge_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreloadStats {
    /// Huge-page blocks handed out by the C API (fresh or retained).
    pub blocks: u64,
    /// Bytes those requests asked for.
    pub bytes: u64,
    /// Requests over the threshold served by glibc because the engine had
    /// no memory for them (glibc would serve them, so ckalloc does too).
    pub glibc_fallbacks: u64,
    /// The threshold in use, in bytes.
    pub threshold: usize,
    /// The most bytes the engine may retain for the C front now: while
    /// `CKALLOC_RETAIN_BYTES` is unset, twice the high-water mark of live
    /// huge bytes and at least that variable's default, so it grows with
    /// the program ([`env::retain_bytes`](crate::env::retain_bytes)).
    pub retain_cap: usize,
    /// What the library did with glibc's mmap and trim thresholds when it
    /// loaded ([`configure_glibc_thresholds`]).
    pub glibc_thresholds: GlibcThresholds,
}

/// Read the preload counters. Never allocates; thread-safe (relaxed
/// atomics, as [`huge_stats`](crate::huge_stats)).
pub fn stats() -> PreloadStats {
    PreloadStats {
        blocks: COUNTERS.blocks.load(Relaxed),
        bytes: COUNTERS.bytes.load(Relaxed),
        glibc_fallbacks: COUNTERS.glibc_fallbacks.load(Relaxed),
        threshold: crate::env::preload_threshold(),
        retain_cap: api::retain_cap(),
        glibc_thresholds: glibc_thresholds(),
    }
}
