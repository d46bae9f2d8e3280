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
//! `pvalloc`, `malloc_usable_size` and `malloc_trim`, each a thin wrapper
//! of the function of the same name here. `libckalloc.so` (the C ABI of
//! `ckernel_alloc.h`, feature `capi`) exports none of them: linking it
//! never replaces a program's `malloc`.
//!
//! # Routing
//!
//! A request of at least [`env::preload_threshold`](crate::env::preload_threshold)
//! bytes (`CKALLOC_PRELOAD_THRESHOLD`, default 2 MiB) gets a huge-page
//! block from the engine of [`CkHuge`](crate::CkHuge): the tier ladder
//! (hugetlb, THP, normal pages), the retention cache and short tails
//! ([`huge`](crate::huge) documents each; [below](#huge-blocks-first-touch-and-retention),
//! how the C API sets first touch and retention). The block's
//! start and mapped length go into the engine's block registry (a
//! lock-free two-level radix map over 2 MiB-aligned addresses), so `free`,
//! `realloc` and `malloc_usable_size` tell a ckalloc block from any other
//! pointer in constant time from its address alone (one alignment test,
//! then two loads), without touching memory at the pointer.
//!
//! Smaller requests, and every pointer the registry does not hold, go to
//! glibc's own allocator through the entry points glibc 2.36 exports
//! for that purpose:
//!
//! | call | reaches glibc through |
//! | --- | --- |
//! | `malloc`, `free`, `calloc`, `realloc` | `__libc_malloc`, `__libc_free`, `__libc_calloc`, `__libc_realloc` |
//! | `memalign`, `aligned_alloc`, `posix_memalign` | `__libc_memalign` (glibc exports no `__libc_posix_memalign` or `__libc_aligned_alloc`; the checks of each are done here) |
//! | `valloc`, `pvalloc` | `__libc_valloc`, `__libc_pvalloc` |
//! | `reallocarray` | the overflow check here, then `realloc` (`__libc_reallocarray` is `GLIBC_PRIVATE`) |
//! | `malloc_usable_size`, `malloc_trim` | glibc's exported functions, found once with `dlsym` on `libc.so.6` and cached (not `RTLD_NEXT`, where another preloaded allocator would answer; `dlsym` may call `malloc` or `calloc`, which never need it, so the lookup cannot recurse) |
//!
//! # Semantics (glibc 2.36, `malloc(3)`, `posix_memalign(3)`, `malloc_usable_size(3)`)
//!
//! - `malloc(0)` returns a unique pointer (glibc's); `free(NULL)` does
//!   nothing; failures return null with `errno = ENOMEM`; the huge path
//!   leaves `errno` as it was on success.
//! - `calloc` fails with `ENOMEM` when `n * size` overflows; huge blocks
//!   read zero, also when they come from the retention cache.
//! - `realloc(NULL, n)` is `malloc(n)`; `realloc(p, 0)` frees `p` and
//!   returns null (glibc's `REALLOC_ZERO_BYTES_FREES`); a block moves
//!   across the threshold in either direction with its contents, and
//!   huge blocks grow and shrink with `mremap` as `CkHuge` does. On
//!   failure `p` is untouched.
//! - `memalign` and `aligned_alloc` follow glibc 2.36: an alignment up to
//!   16 is `malloc`'s, one that is not a power of two is rounded up to the
//!   next, one above `SIZE_MAX / 2 + 1` fails with `EINVAL` (glibc 2.38's
//!   `aligned_alloc` refuses alignments that are not powers of two; 2.36's
//!   does not). `posix_memalign` returns `EINVAL` unless the alignment is
//!   a power of two and a multiple of `sizeof(void *)`. Huge blocks honour
//!   every alignment up to 1 GiB and beyond (by over-reserving address
//!   space).
//! - `malloc_usable_size` of a huge block is its whole mapped length
//!   (the request rounded up to 2 MiB), all of it writable.
//! - Memory a program never writes stays uncommitted, as with glibc: a
//!   fresh block faults in when written.
//! - `malloc_trim` gives every retained huge block back to the kernel,
//!   then runs glibc's. Retained blocks decay (`CKALLOC_RETAIN_DECAY_MS`)
//!   in steps that run on the huge path's calls only (one step per 256
//!   huge-path calls of a thread), so that small requests pay nothing for
//!   them: a process that stops making huge requests keeps what is
//!   retained (at most the larger of 128 MiB and twice its peak of live
//!   huge bytes, or `CKALLOC_RETAIN_BYTES` when set) until `malloc_trim`
//!   or until its huge-path calls run a step. A freed block that merges
//!   with retained neighbours keeps the age of the oldest, so a retained
//!   block that requests keep being carved from and merged back into is
//!   still given back once its oldest part has been unused for the delay
//!   (the next request then maps afresh).
//! - `mallinfo2`, `malloc_stats` and `malloc_info` are glibc's and count
//!   glibc's memory only: ckalloc's blocks are in [`huge_stats`](crate::huge_stats)
//!   and in the `CKALLOC_SHOW_STATS` summary.
//! - C++ `operator new` and `delete` reach these functions through
//!   libstdc++'s `malloc` and `free`.
//!
//! # Huge blocks: first touch and retention
//!
//! The C API's huge blocks differ from `CkHuge`'s in a Rust program in the
//! ways below (the engine's C API mode), measured with the preload client
//! (`benches/preload-client`:
//! PyTorch running all-MiniLM-L6-v2, and blocks of 2 to 256 MiB allocated,
//! touched and freed):
//!
//! - **First touch**: a fresh block is advised `MADV_HUGEPAGE` and faults
//!   in when the program writes it, as glibc's, jemalloc's and PyTorch's
//!   own huge-page mappings do; the first-touch policy of
//!   [`huge`](crate::huge#first-touch-ckhuge) (fault blocks in page by
//!   page, send the rest to 4 KiB pages after a slow page) is not applied.
//!   A program's large buffers are retained and reused for its whole run,
//!   so a block sent to 4 KiB pages pays a fault per 4 KiB once and a TLB
//!   miss per 4 KiB page on every reuse. Measured on memory the VM had
//!   reported to its host (the client's `4k` state), PyTorch's forward
//!   passes took 16,360 minor faults and 330 ms (median) with the policy
//!   and 2,518 faults and 316 ms without it, against glibc
//!   `hugetlb=1`'s 5,178 faults and 318 ms.
//! - **Retention cap**: while `CKALLOC_RETAIN_BYTES` is unset, the cache
//!   keeps up to twice the high-water mark of live huge bytes
//!   ([`HugeStats::peak_live_bytes`](crate::HugeStats::peak_live_bytes)),
//!   at least the 128 MiB default, and a freed block that does not fit
//!   gives back older retained blocks (`munmap`) to make room: the block
//!   freed last is the one a C program asks for again. A program that
//!   frees and allocates a 256 MiB buffer in a loop thus reuses it, as it
//!   does under jemalloc (whose dirty pages have no cap, only a 10 s
//!   decay), where a fixed 128 MiB cap mapped and faulted it in every
//!   time (42 ms per 128 MiB block against jemalloc's 0.9 ms). The bound:
//!   retained bytes stay under the larger of 128 MiB and twice the live
//!   peak, so huge-page memory mapped at once is the live bytes plus at most
//!   that (plus blocks another thread is unmapping at that moment); decay
//!   (`CKALLOC_RETAIN_DECAY_MS`) gives unused blocks back. A
//!   `CKALLOC_RETAIN_BYTES` that parses is the exact cap, as in Rust
//!   programs; one that does not parse is reported in the summary and this
//!   default rule applies.
//! - **Zeroing**: a `calloc` served from the cache is cleared with
//!   `MADV_DONTNEED` at every length (`CkHuge` in Rust programs memsets
//!   blocks up to 16 MiB), so it reads zero without committing pages the
//!   program never writes.
//! - **Growth on a miss**: a request that needs no zeroing (`malloc`,
//!   `realloc`, the aligned calls; not `calloc`) that no retained block of
//!   its length or longer serves takes the longest shorter one and grows it
//!   with `mremap` (in place when it is one VMA and the address space after
//!   it is free, else moved onto the start of a fresh aligned mapping: see
//!   [Growing](crate::huge#growing)), so only the added bytes are fresh
//!   memory that must fault in; the moved pages keep their THP. This is what
//!   coalescing freed neighbours gives jemalloc: a program that frees a 128
//!   MiB buffer and asks for 256 MiB faults in 128 MiB, not 256. A block
//!   that cannot grow goes back to the cache with its decay stamp (it keeps
//!   ageing) and a fresh mapping serves the request. On Linux before 6.11
//!   that is a block of several VMAs: retained neighbours merged into one
//!   block, a block grown before, or one whose request left a [short
//!   tail](crate::huge#short-tails-ckhuge) (64 MiB + 16 bytes, say: its last
//!   2 MiB page is a VMA of its own); later kernels move those VMA by VMA.
//!   While the hugetlb tier serves the mappings there is no growth at all:
//!   hugetlb blocks cannot grow, and a miss maps a fresh hugetlb block.
//!   [`HugeStats::retention_grows`](crate::HugeStats::retention_grows)
//!   counts the misses served by growth.
//! - **A mapping that fails** (address space under `ulimit -v`, the VMA
//!   limit) gives the retention cache back and is tried once more, so
//!   retained memory never makes a request fail that glibc would serve.
//!
//! # Start-up, threads, fork
//!
//! - The paths never call the exported allocator (the library's Rust code
//!   allocates through [`GlibcMalloc`]), never panic, never print and
//!   start no thread. The environment is read with `getenv`, without
//!   allocating; a call from the dynamic loader before the C library has
//!   set up the environment uses the defaults and reads again later.
//! - A signal handler that interrupts `malloc` and calls `malloc` is not
//!   supported (as in glibc); handlers elsewhere work.
//! - `fork`: the retention cache's `pthread_atfork` handlers (registered
//!   when the library loads) let a child of a multi-threaded parent
//!   allocate; the registry is lock-free and needs none; glibc handles
//!   its own arenas. `vfork` and `posix_spawn` run no `atfork` handlers:
//!   their child may only `exec` or `_exit` (POSIX), which never call the
//!   allocator, so nothing is needed there.
//!
//! # Seeing what you got
//!
//! `CKALLOC_SHOW_STATS=1` (read when the library loads) prints one
//! summary when the process calls `exit` (or returns from `main`), into
//! the stderr the process had at load: through descriptor 2 while it is
//! still that file, else through a copy of it the library made at load
//! (close-on-exec, numbered from 512), so a program that closed stderr
//! first (GNU coreutils do, in an `atexit` handler that runs before the
//! library's) or reused its number still gets it there; a program that
//! closed the copy too gets none. While the variable is on, the copy keeps
//! stderr open until exit: a reader of a pipe on it sees its end then, not
//! when the program closes descriptor 2. The summary is written without
//! dying of `SIGPIPE` when stderr is a closed pipe: huge blocks served and bytes
//! requested at allocation (growth by `realloc` is not in these bytes: it
//! shows in the `remaps` count, or, on the hugetlb tier, whose blocks
//! cannot grow, as a new mapping), the threshold and the retention cap in
//! use (the rule above while `CKALLOC_RETAIN_BYTES` is unset), then
//! [`huge_stats`](crate::huge_stats)
//! (blocks and bytes per tier, retention hits and misses, decayed bytes,
//! live bytes and their peak, the peak of mapped bytes, the first-touch
//! policy, the settings), every line labelled `ckalloc[PID]: `, formatted
//! without allocating. The first-touch line and the
//! `CKALLOC_FIRST_TOUCH_PROBE` setting concern `CkHuge` in Rust code only
//! (the C API never applies the policy), and the `CKALLOC_RETAIN_BYTES`
//! setting shows the variable, not the cap in use. A child that inherits
//! the variable prints its own; a child of `fork` starts from a copy of
//! its parent's counters, as jemalloc's and mimalloc's statistics do, so
//! its summary includes what the parent did before the fork (subtract the
//! parent's, or set the variable in the parent only). `_exit` (and a death
//! by signal) prints none.
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
//! - The registry holds addresses below 2^47 (4-level paging); a
//!   block the kernel maps above (only when asked with a hint) is served
//!   by glibc instead. Mapping a 32 KiB registry leaf can fail with
//!   `ENOMEM`: the request is then served by glibc too, counted in the
//!   summary; a `realloc` that moved a huge block in that moment copies
//!   it into glibc's memory, and returns null (with the old block gone)
//!   only if glibc has no memory either.
//! - A huge block the program changes the protection of (`mprotect`) and
//!   frees keeps that protection in the retention cache, and so does the
//!   block served from it next (whole, carved, or grown: `mremap` keeps a
//!   mapping's protection): a write to it then faults. glibc unmaps its
//!   `mmap` blocks on `free`, so this works there. Restore
//!   `PROT_READ | PROT_WRITE` before freeing; `malloc(3)` leaves the case
//!   unspecified, and jemalloc and mimalloc, which also reuse freed
//!   memory, have the same limit (and so for `madvise` and `mlock` flags).
//!   A `realloc` of a live block part of which is not read-write copies
//!   the block from that part on, so the grown block is writable
//!   throughout, as glibc's copy is. A block the program changed whole
//!   (one `mprotect` over all its pages) is one VMA: it grows or moves
//!   with `mremap` keeping its flags, and the added bytes take them too, as
//!   with glibc's `mremap` of a mapped chunk (a read-only block stays
//!   read-only). A range made unreadable (`PROT_NONE`, a guard page) faults
//!   in the copy, as in glibc's. A block `realloc` copies out of is
//!   unmapped, never retained. A growing `realloc` advises the
//!   block for its tier, replacing a program's `MADV_NOHUGEPAGE` on it
//!   (glibc keeps it).
//! - A hugetlb block (a hugetlb pool reserved in `nr_hugepages`) is made of
//!   2 MiB pages the kernel cannot split: `mprotect`, `madvise`, `mlock`
//!   and `munmap` of a range inside it that does not start and end on a
//!   2 MiB boundary fail with `EINVAL` (`mmap(2)`), so a program that puts
//!   a guard page inside a `malloc`'d buffer gets an error there that it
//!   does not get from glibc. `CKALLOC_HUGETLB=0` keeps such a program on
//!   THP. A threshold far below 2 MiB gives every small request a 2 MiB
//!   page and uses up the pool quickly (THP serves the rest).
//! - Under an address-space limit (`ulimit -v`, `RLIMIT_AS`), a `realloc`
//!   that cannot grow a huge block in place needs the old and the new
//!   length at once (the aligned reservation it moves onto), where glibc's
//!   `mremap` of a chunk needs only the new length: growing 256 MiB to 512
//!   MiB succeeded under `ulimit -v 650000` (KiB) with glibc and from
//!   800000 with ckalloc and mimalloc; jemalloc and tcmalloc, which copy,
//!   failed at 800000 too.
//! - musl and 32-bit targets are not supported (the library needs
//!   glibc's `__libc_*` entry points and a 47-bit address space).

mod api;
pub mod glibc;
mod report;

pub use api::{
    aligned_alloc, calloc, free, malloc, malloc_trim, malloc_usable_size, memalign, posix_memalign,
    pvalloc, realloc, reallocarray, valloc,
};
pub use glibc::GlibcMalloc;
pub use report::{print_at_exit, remember_stderr, write_summary};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

/// The threshold ([`env::preload_threshold`](crate::env::preload_threshold))
/// once the environment it comes from is set up; `None` before that (a call
/// from the dynamic loader), when a caller must not keep the answer. The
/// preload library caches it in a static of its own, which its fast paths
/// read without going through the global offset table.
pub fn settled_threshold() -> Option<usize> {
    let t = crate::env::preload_threshold();
    crate::sys::environment_ready().then_some(t)
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
    /// The most bytes the retention cache may hold now: while
    /// `CKALLOC_RETAIN_BYTES` is unset, twice the high-water mark of live
    /// huge bytes and at least that variable's default, so it grows with
    /// the program ([`env::retain_bytes`](crate::env::retain_bytes)).
    pub retain_cap: usize,
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
    }
}
