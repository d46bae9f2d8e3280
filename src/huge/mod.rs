//! Huge-page memory: the tier ladder, [`HugeRegion`], [`huge_alloc`] /
//! [`huge_free`] and the [`CkHuge`] allocator.
//!
//! # Tiers
//!
//! Every mapping walks a ladder and records the rung it stopped at
//! ([`Backing`]):
//!
//! 1. **hugetlb** — `mmap(MAP_HUGETLB | MAP_HUGE_2MB)` (or `MAP_HUGE_1GB` when
//!    [`HugeOptions::allow_1gib`] is set). Needs pages reserved in
//!    `/proc/sys/vm/nr_hugepages`. After a failure the tier is skipped for a
//!    back-off period
//!    ([`env::hugetlb_backoff_ms`](crate::env::hugetlb_backoff_ms), default
//!    1000 ms) instead of paying a failed system call on every allocation,
//!    as mimalloc does; see [`reset_hugetlb_backoff`].
//! 2. **THP** — anonymous memory over-reserved and trimmed to a 2 MiB-aligned
//!    range, then `madvise(MADV_HUGEPAGE)` (transparent huge pages back only
//!    whole, aligned 2 MiB extents). [`Backing::TransparentHuge`] means the range
//!    is eligible; [`huge_page_coverage`](crate::huge_page_coverage) measures
//!    what the kernel actually gave.
//! 3. **normal pages** — the same aligned mapping without THP advice (THP is
//!    `never`, turned off with `CKALLOC_THP=0`, or `madvise` failed).
//!
//! By default the ladder goes all the way down; [`HugeOptions::require`] turns a
//! lower rung into an error instead. Sizes are rounded up to 2 MiB (1 GiB for
//! 1 GiB hugetlb pages); a rounding that overflows is an error, never a wrap.
//!
//! Nothing on these paths allocates, locks, panics or prints: they are used by
//! the global allocator. [`CkHuge`]'s retention cache takes no lock either
//! (slots are claimed with one compare-and-swap and never waited for). The one exception, prefaulting on several threads
//! ([`HugeOptions::populate_threads`]), spawns scoped threads and is only
//! reached from explicit constructors, never from [`CkHuge`] or
//! [`huge_alloc`], whose options are fixed.
//!
//! # Options
//!
//! | option | default | effect |
//! | --- | --- | --- |
//! | [`HugeOptions::require`] | `Backing::Normal` | fail with [`HugeError::TierUnavailable`] instead of falling below this tier |
//! | [`HugeOptions::hugetlb`] | `true` | try the hugetlb tier at all |
//! | [`HugeOptions::allow_1gib`] | `false` | try 1 GiB hugetlb pages first (the size is rounded up to 1 GiB) |
//! | [`HugeOptions::populate`] | `false` | prefault with `MADV_POPULATE_WRITE` (Linux 5.14+), which reports failure, unlike `MAP_POPULATE` |
//! | [`HugeOptions::populate_threads`] | 1 | prefault on up to `n` threads, each on its own 8 MiB chunks of whole huge pages; 0 = `available_parallelism()` |
//! | [`HugeOptions::mlock`] | `false` | `mlock` the mapping (counts against `RLIMIT_MEMLOCK`) |
//! | [`HugeOptions::numa_node`] | `None` | `mbind(MPOL_BIND)` to one node, before prefaulting |
//! | [`HugeOptions::dont_dump`] | `false` | `MADV_DONTDUMP`: leave the mapping out of core dumps |
//! | [`CkHuge::with_threshold`] | 2 MiB | requests of at least this many bytes get a mapping of their own |
//! | [`CkHuge::uncached`], [`CkHuge::retain_max_bytes`] | retain blocks up to the process-wide cap | never retain / retain only blocks up to this length (see [Retention](#retention-ckhuge)) |
//!
//! The environment switches of this layer (`CKALLOC_HUGETLB`, `CKALLOC_THP`,
//! `CKALLOC_HUGETLB_BACKOFF_MS`, and `CkHuge`'s `CKALLOC_RETAIN_BYTES` and
//! `CKALLOC_RETAIN_DECAY_MS`) are read once, without allocating, on first
//! use; [`env`](crate::env) lists them with every other variable.
//!
//! # Reserving hugetlb pages
//!
//! ```text
//! cat /proc/sys/vm/nr_hugepages                 # 0 on most machines
//! echo 512 | sudo tee /proc/sys/vm/nr_hugepages # 512 x 2 MiB = 1 GiB
//! echo 1 | sudo tee /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages   # one 1 GiB page
//! echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled           # THP on request
//! ```
//!
//! Hugetlb pages are taken from RAM when reserved and never swapped; write 0
//! to give them back. [`probe`](crate::probe) reports the system's state
//! (THP modes, hugetlb pools, `RLIMIT_MEMLOCK`) and
//! [`huge_stats`] the per-tier counters (mappings, bytes,
//! fallbacks).
//!
//! # What the kernel gave
//!
//! [`huge_page_coverage`](crate::huge_page_coverage) measures a range page
//! by page with the `PAGEMAP_SCAN` ioctl (Linux 6.7+), or per VMA from
//! `/proc/self/smaps` on older kernels
//! ([`HugeCoverage::exact`](crate::HugeCoverage::exact) says which).
//!
//! # Retention (`CkHuge`)
//!
//! Through [`GlobalAlloc`](std::alloc::GlobalAlloc), a freed huge-page block is not unmapped at once:
//! it goes to one process-wide retention cache shared by every `CkHuge`
//! value, and later requests get its memory back without a system call, as
//! glibc's `malloc` and mimalloc reuse freed memory:
//!
//! - **any length serves**: a request takes a retained block of exactly its
//!   2 MiB-rounded length when there is one (and its alignment the block's
//!   address meets), the most recently freed of several (last in, first
//!   out, as glibc's and jemalloc's thread caches: its pages are the
//!   likeliest to be in the CPU caches and the TLB); else it carves its length from the front of the
//!   shortest longer block, whose rest stays retained. A freed block merges
//!   with the retained blocks right before and after it, so the pieces of a
//!   carved block become one again. Carving and merging are bookkeeping
//!   only (no `munmap`, no `mremap`): a buffer read whole and freed (a
//!   model file, say) serves the tensors and activations that follow from
//!   memory that is already faulted in, instead of pages the kernel must
//!   find and clear. Only when no retained block is long enough is a new
//!   block mapped (the preload library's C API, for requests that need no
//!   zeroing, grows the longest shorter one with `mremap` instead:
//!   [preload](crate::preload#huge-blocks-first-touch-and-retention)).
//!   Every block handed out has exactly the length `dealloc` and `realloc`
//!   rebuild from the layout.
//! - **threads keep to their own blocks**: a request looks at the blocks its
//!   own thread freed or carves first, then at other threads' whole blocks,
//!   and carves a block another thread is carving from its other end; a
//!   freed block merges with its own thread's neighbours and with a block
//!   another thread carves, never with another thread's whole block. Each
//!   thread's pieces so merge back into its whole block (as jemalloc's
//!   threads each use an arena of their own): two threads cycling through
//!   2 MiB to 256 MiB blocks map nothing new, and a thread freeing and asking
//!   for one length gets its own block back.
//! - **cap**: at most [`env::retain_bytes`](crate::env::retain_bytes) bytes
//!   (`CKALLOC_RETAIN_BYTES`, default 128 MiB; `1gib`-style sizes accepted)
//!   and 64 blocks are retained, process-wide; a freed block that does not
//!   fit is unmapped. Per value,
//!   [`retain_max_bytes`](CkHuge::retain_max_bytes) bounds the length of the
//!   blocks it puts into (and takes from) the cache;
//!   [`uncached`](CkHuge::uncached) retains nothing and maps every block
//!   afresh (C-Kernel-Engine's `ck_huge_alloc` behaviour). The preload
//!   library's C API ([`preload`](crate::preload#huge-blocks-first-touch-and-retention))
//!   raises the cap, while `CKALLOC_RETAIN_BYTES` is unset, to twice the
//!   high-water mark of live bytes
//!   ([`peak_live_bytes`](crate::HugeStats::peak_live_bytes)); there a
//!   freed block that does not fit gives back older retained blocks to make
//!   room instead of being unmapped itself, and a block merged with
//!   retained neighbours keeps the decay stamp of the oldest (in Rust
//!   programs the merged block starts a new delay). A fresh mapping that
//!   fails gives the cache back and is tried once more.
//! - **decay**: a block unused for
//!   [`env::retain_decay_ms`](crate::env::retain_decay_ms)
//!   (`CKALLOC_RETAIN_DECAY_MS`, default 1000 ms; after mimalloc's
//!   `purge_delay` and jemalloc's `dirty_decay_ms`) is unmapped by a later
//!   allocator call: every 256 calls of a thread (mapped-path calls, and
//!   small-path allocations while a block is retained) read the monotonic
//!   clock and give back at most 4 expired blocks. A global allocator has no
//!   thread of its own, so a process that frees large blocks and then makes
//!   no allocator calls (sleeps, waits on I/O) keeps up to the cap mapped
//!   and resident until its next calls; [`release_retained`] gives
//!   everything back at once.
//! - **zeroing**: an `alloc_zeroed` hit of at most 16 MiB is cleared with a
//!   memset (its pages are resident, and clearing them costs less than
//!   faulting them back in for the kernel to clear); a larger hit is given
//!   back with `madvise(MADV_DONTNEED)`, after which its anonymous pages
//!   read as zero and fault in on first touch (memset if `madvise` fails).
//!   The preload library's C API uses `MADV_DONTNEED` at every length.
//! - **hugetlb** blocks are retained like the others and count against the
//!   cap: they come from the reserved pool, and retaining one keeps it out
//!   of that pool until it decays or is released.
//! - **threads**: the cache is 4 shards of 16 slots; a thread claims a slot
//!   with one compare-and-swap and releases it with a store, starting at its
//!   own shard, so no thread ever waits for another (no lock, no convoy).
//!   The thread-local state (shard number, call counter) is `const`
//!   initialised, has no destructor and is reached with `try_with`; the
//!   blocks an exiting thread freed stay in the shared slots for other
//!   threads.
//! - **fork**: nothing blocks, so the child of `fork()` can allocate whatever
//!   the other threads of the parent were doing; a fork hook of the crate's
//!   `pthread_atfork` child handler (registered when the library is loaded)
//!   empties slots that were mid-operation at the fork and recounts the
//!   retained bytes.
//! - [`huge_stats`] reports the retained bytes, hits (and how many were
//!   carved), misses (and how many grew a retained block), the bytes decay
//!   gave back and the settings in use;
//!   [`live_bytes`](crate::HugeStats::live_bytes) excludes retained blocks.
//!
//! The sequence the policy was measured on: candle loading
//! all-MiniLM-L6-v2 and running 6 forward passes at batch 16 x 128
//! (`benches/real-client`, `CkHuge::new()` as the global allocator, the
//! defaults above). The load reads the 86.7 MiB `model.safetensors` into
//! one buffer, builds the tensors from it and frees it; the buffer is
//! retained (it fits the 128 MiB cap), and the forward passes' activations,
//! blocks of 3 MiB and 12 MiB (about 1 GiB per pass), are carved from it
//! and from each other as they are freed. `huge_stats()` at the end of
//! such a run: 15 mappings (194 MiB), 1,038 retention hits of which 583
//! carved, 15 misses, 6 unmaps (66 MiB), nothing given back by decay. With
//! exact lengths only and blocks up to a quarter of the cap, the same run
//! unmapped the buffer and faulted in fresh pages for every tensor.
//!
//! # First touch (`CkHuge`)
//!
//! A THP fault needs a free 2 MiB block, which the kernel clears. On bare
//! metal that takes about 100 us. In a VM that reports free memory to its
//! host (virtio-balloon free page reporting, Linux's `mm/page_reporting.c`),
//! free 2 MiB blocks are handed back to the host a few seconds after they
//! are freed, and a THP taken from such a block faults on the host as well,
//! 4 KiB at a time; 4 KiB faults meanwhile take the fragments below 2 MiB,
//! which are never reported and stay backed. Measured on a 2-core VM of
//! that kind (first touch of 1 GiB as 64 mappings of 16 MiB by a small C
//! program, two trials per cell):
//!
//! | memory state before | THP | 4 KiB pages |
//! | --- | --- | --- |
//! | 4 GiB of 4 KiB pages touched and freed (2 MiB blocks reported) | 1966-2691 ms | 410-419 ms |
//! | 2 GiB of THP touched and freed (2 MiB blocks backed) | 65-256 ms | 380-416 ms |
//!
//! The policy: a fresh THP block of at least 4 MiB is faulted in at
//! allocation, one 2 MiB page at a time (`MADV_POPULATE_WRITE`, Linux
//! 5.14), each page timed. While every page comes in within 1 ms the
//! whole block ends up resident as THP. At the first page slower than
//! that, the rest of the block is advised `MADV_NOHUGEPAGE` and faults in
//! as 4 KiB pages when the caller writes it, and so are the blocks mapped
//! in the next 200 ms (no pages faulted in by the policy): the kernel hands
//! out unreported 2 MiB blocks before reported ones, so once one page is
//! slow the next ones would be too. After the window the next block is
//! faulted in the same way again. Blocks shorter than 4 MiB, hugetlb
//! blocks and normal pages are left alone. The policy applies to blocks
//! of both interfaces (`GlobalAlloc` and `Allocator`), but not to the
//! preload library's C API, whose blocks fault in as THP when written
//! ([`preload`](crate::preload#huge-blocks-first-touch-and-retention) says
//! why). A block `realloc`
//! grows with `mremap` is advised whole by the policy's state at that
//! moment: base pages inside the window, THP otherwise (pages already
//! faulted in keep their size); its new pages are not faulted in.
//!
//! Faulting a block in page by page, rather than timing one page and
//! leaving the rest to the caller, keeps what the timing learned true for
//! the whole block: free 2 MiB blocks can run out of backed ones in the
//! middle of a 1 GiB buffer. Measured as the table above (1 GiB as 64
//! vectors of 16 MiB filled by `vec![x; n]`, memory prepared before each
//! run), first touch took 178-295 ms with the policy and 96-1955 ms
//! without it after 4 GiB of 4 KiB pages (glibc's 4 KiB pages: 426-457
//! ms), and 85-103 ms against 69-113 ms after 2 GiB of THP.
//!
//! The cost: a block of 4 MiB or more is resident from its allocation
//! while its pages come in fast. A caller that writes all of it pays
//! nothing extra (its writes would fault the same pages in); a caller that
//! reserves a block and never writes most of it holds it resident anyway.
//! `CKALLOC_FIRST_TOUCH_PROBE=off` keeps such reservations lazy.
//!
//! The cost and the outcome are counted in
//! [`HugeStats`] (`first_touch_*`). `CKALLOC_FIRST_TOUCH_PROBE`
//! (a `CKALLOC_*` switch, on by default; [`env`](crate::env)) turns the
//! policy off: every THP block then stays THP.
//!
//! # Short tails (`CkHuge`)
//!
//! Through [`GlobalAlloc`](std::alloc::GlobalAlloc) the caller owns exactly `layout.size()` bytes, so
//! when a THP block's last 2 MiB page holds less than 1 MiB of the request
//! (`size % 2 MiB` is neither 0 nor 1 MiB or more), that page is advised
//! `MADV_NOHUGEPAGE` (`madvise(2)`) and faults in as 4 KiB pages: a
//! 2.25 MiB request whose bytes are all written clears and keeps resident
//! 2.25 MiB, not 4 MiB (a block below 2 MiB, with a lower threshold, is all
//! 4 KiB pages). Longer tails, sizes that are multiples of 2 MiB, and every
//! block served through [`Allocator`](allocator_api2::alloc::Allocator) (whose slice covers the whole
//! 2 MiB-rounded length) stay huge. Normal-page blocks (THP off,
//! `CKALLOC_THP=0`) get no advice, and hugetlb blocks none when mapped
//! (`realloc` cannot tell them from THP blocks and may advise their last
//! page, which leaves hugetlb pages as they are).
//!
//! - **Advice is about future faults.** A page already faulted in keeps
//!   its page size: a huge page stays huge when later advised
//!   `MADV_NOHUGEPAGE`, and 4 KiB pages stay 4 KiB pages when later advised
//!   `MADV_HUGEPAGE` (until khugepaged collapses them).
//! - **Retained blocks** keep the advice they have: a block mapped for a
//!   short tail and reused for a long tail (same rounded length) serves its
//!   last page as 4 KiB pages; a block mapped for a long tail and reused for
//!   a short tail keeps its whole last page huge (and resident, if it was
//!   touched before).
//! - **`realloc`** advises the new last page `MADV_NOHUGEPAGE` when the new
//!   size leaves a short tail (growing, shrinking to a shorter mapping, or
//!   within the same length from a long tail), and `MADV_HUGEPAGE` when it
//!   grows past one or, within the same length, goes from a short tail to a
//!   long one.
//! - **VMAs**: an advised block is two VMAs (two lines of
//!   `/proc/self/maps`, counted against `vm.max_map_count`), more after it
//!   grew; freeing the block unmaps all of them. `mremap` resizes one VMA
//!   only, so `realloc` moves such a block VMA by VMA, as
//!   [below](#growing). Before Linux 6.11, which has no `PROCMAP_QUERY` to
//!   find the VMAs, such a block is copied into a new one instead (as
//!   mimalloc's `realloc` does for large blocks).
//!
//!
//! # Growing
//!
//! [`CkHuge`] grows a mapped block with `mremap` (mremap(2)), copying no
//! byte. A block of one VMA grows in place when the address space after it
//! is free, else moves and grows at once onto a reservation of the new
//! length made at the block's alignment (`MREMAP_FIXED`, which replaces it
//! atomically); either way it stays one VMA and the added bytes take its
//! flags (a block the program made read-only whole stays read-only). The
//! moved pages stay faulted in, huge pages included. A block of several
//! VMAs (a short tail, an earlier growth, retained neighbours merged, a
//! range the program gave other flags with `mprotect`, `madvise` or
//! `mlock`) never grows in place, which would give the added bytes the
//! flags of its last VMA: the reservation becomes fresh anonymous memory
//! and the block moves onto its start one VMA at a time, each found with
//! the `PROCMAP_QUERY` ioctl (Linux 6.11); from the first VMA that cannot
//! move (not private read-write, or sealed with mseal(2)) the rest of the
//! block is copied. Moved VMAs keep their flags; the rest of the fresh
//! memory is the added bytes, advised for their tier.
//! Kernels before 6.11 copy every such block. hugetlb blocks cannot grow
//! (`EINVAL`) and are copied. A block copied out of is unmapped, never
//! retained: a range the program changed must not serve another request.

mod alloc;
mod error;
mod first_touch;
mod global;
mod ladder;
mod options;
mod prefault;
mod region;
#[cfg_attr(not(any(feature = "capi", feature = "preload")), allow(dead_code))]
pub(crate) mod registry;
mod remap;
mod retain;
mod stats;

pub use crate::tier::Backing;
pub use alloc::{huge_alloc, huge_free};
pub use error::HugeError;
#[doc(hidden)]
pub use first_touch::hold_first_touch_base_pages;
pub use global::CkHuge;
pub use ladder::reset_hugetlb_backoff;
pub use options::HugeOptions;
pub use region::HugeRegion;
#[doc(hidden)]
pub use retain::hold_retention_slots;
pub use retain::release_retained;
pub use stats::{huge_stats, HugeStats, TierStats};

#[cfg(target_os = "linux")]
pub(crate) use ladder::apply_options;
pub(crate) use ladder::{last_map_hugetlb, map_huge, unmap, Mapping};
