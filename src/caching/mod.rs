//! Caching allocator over any [`allocator_api2`] allocator, following the
//! public contract of IREE's HAL caching allocator
//! (`runtime/src/iree/hal/utils/caching_allocator.h`).
//!
//! [`CachingAllocator<A>`] keeps freed blocks in per-pool free lists and hands
//! them out again instead of returning them to the inner allocator `A` (for
//! example a huge-page allocator where each miss costs an `mmap`, page faults
//! and zeroing).
//!
//! ```text
//!   request (size, align)
//!      │ first pool, in spec order, with max_allocation_size ≥ size
//!      ▼                                 (none → inner allocator: bypass)
//!   pool ── round size (RoundUp) ── free list has a block of that size
//!      │                               whose address satisfies align? → hit
//!      ▼ miss
//!   capacity: live + cached + new ≤ max_allocation_capacity?
//!      │ no → evict cached blocks oldest first; still no → bypass (unpooled)
//!      ▼ yes
//!   inner.allocate (outside any lock; on failure: trim, retry once)
//! ```
//!
//! Pools are configured with IREE's spec grammar ([`CachingSpec`]):
//!
//! ```
//! use allocator_api2::{alloc::Global, vec::Vec};
//! use ckalloc::caching::CachingAllocator;
//!
//! // At most one block over 100 MiB kept, up to ten under it.
//! let cache = CachingAllocator::from_spec(Global, "*=100mib;*;10,*=*;*;1").unwrap();
//! let mut v: Vec<u8, _> = Vec::with_capacity_in(4096, &cache);
//! v.push(1);
//! drop(v);
//! let v2: Vec<u8, _> = Vec::with_capacity_in(4096, &cache); // served from the cache
//! assert_eq!(cache.stats().hits, 1);
//! # drop(v2);
//! ```
//!
//! # Spec
//!
//! [`CachingSpec`] documents IREE's spec grammar once: the pairs, the three
//! limit fields with their units and defaults, the memory type and buffer
//! usage names, and what is rejected unlike IREE. Every [`SpecError`] has a
//! stable [`kind()`](SpecError::kind) and names the pair, the field and the
//! offending text. [`CachingSpec`]'s `Display` is canonical and parses back
//! to an equal value. [`CachingAllocator::from_env`] reads a spec from the
//! environment variable the caller names (unset or empty: one unbounded
//! pool; a name that no variable can have, empty or containing `=` or NUL,
//! is [`SpecErrorKind::BadVariableName`]).
//!
//! **Heaps.** The inner allocator's heap defaults to [`Heap::host`]: host
//! memory that CPU code uses directly, so it satisfies host *and* device
//! memory types (`host_local|device_local|host_cached`, every usage), as
//! IREE's CPU devices report. An allocator with a narrower heap declares it
//! with [`DeclareHeap`] (then [`CachingBuilder::declared_heap`]) or
//! [`CachingBuilder::heap`]; a key the heap cannot satisfy is
//! [`SpecErrorKind::NoMatchingHeap`].
//!
//! # Behaviour
//!
//! * A request goes to the first pool (spec order) whose
//!   `max_allocation_size` is at least its size; with no such pool it goes to
//!   the inner allocator, counted as a bypass. Within a pool the size is
//!   rounded ([`RoundUp::None`] by default, or
//!   [`RoundUp::PowerOfTwoDivisions`] as PyTorch's
//!   `roundup_power2_divisions`).
//! * Reuse: the most recently freed block of that exact (rounded) size whose
//!   address satisfies the requested alignment. The whole block is returned
//!   (`len()` may exceed the request); it keeps its previous contents unless
//!   it is requested zeroed. A block goes back to the inner allocator with
//!   the layout it was allocated with.
//! * Capacity: a pool's live + cached bytes never exceed
//!   `max_allocation_capacity`; a new block that would exceed it evicts cached
//!   blocks oldest first (only if that can make room), else the request is
//!   served unpooled (a bypass). A freed block is kept if the pool's free list
//!   holds fewer than `max_free_allocation_count` blocks, else it goes back to
//!   the inner allocator.
//! * [`trim`](CachingAllocator::trim) returns every cached block, oldest
//!   first across pools; [`trim_to`](CachingAllocator::trim_to) stops once
//!   at most the given bytes stay cached. An inner allocation failure
//!   triggers `trim()` and one retry, then `AllocError`. `Drop` returns every
//!   cached block. Zero-size requests never reach the inner allocator.
//! * `grow`/`shrink` stay in place when the new size maps to the same pool and
//!   block size; otherwise they allocate through the cache, copy, and release
//!   the old block to the cache.
//! * [`stats`](CachingAllocator::stats) sums every counter exactly; its
//!   `Display` is a summary in the spirit of PyTorch's `memory_summary`.
//!
//! # Units
//!
//! Every size, capacity and byte counter is in bytes; sizes must fit `u64`
//! and `usize`. Capacity and
//! statistics count a block by the size it was allocated with from the inner
//! allocator (after the pool's [`RoundUp`]). Alignment is the request's
//! [`Layout`](std::alloc::Layout) alignment; a cached block is reused only if its address
//! satisfies it.
//!
//! # Errors
//!
//! A rejected spec or configuration is a [`SpecError`] with a stable
//! [`SpecErrorKind`], the [`SpecField`] it is about, the offending pair
//! (index and text) and the offending text; its message escapes control
//! characters and cuts long text short. Allocation failures are
//! [`AllocError`](allocator_api2::alloc::AllocError), after the cache was trimmed and the inner allocator
//! retried once.
//!
//! # Differences from IREE
//!
//! IREE's implementation does not do what its header says; this one does:
//! the pool is chosen by size as well as heap; capacity is enforced on live +
//! cached bytes with oldest-first eviction; the spec parser rejects what
//! IREE silently misreads (`1GiB`, `8x`, `1.5gib`, `-1`, `010`, overflow,
//! a fourth limit field, empty pairs and empty names).
//!
//! # Thread safety
//!
//! `CachingAllocator<A>` is `Send`/`Sync` when `A` is. There is no global
//! lock: each pool's free lists are split into shards (threads are spread
//! over them) with one lock each, blocks held from the inner allocator are
//! tracked in an address-sharded table, limits are enforced with per-shard
//! free-count slots and atomics, and the inner allocator is always called
//! with no lock held. A cache hit takes only the calling thread's shard
//! lock; its release on the same thread takes the same lock and no table
//! lookup (see `pool.rs`). The locks are spin-then-yield locks whose state is
//! one atomic flag.
//!
//! # Fork safety
//!
//! Every live `CachingAllocator` is in a process-wide registry (entered on
//! construction, left in `Drop`; the cache hit and release paths never touch
//! it), and the crate's `pthread_atfork` handlers take every instance's
//! shard and block-table locks before `fork()` and release them after it, in
//! parent and child. A child forked while other threads are inside an
//! allocator shared with it can go on using that allocator: its cached and
//! live blocks are the parent's, copied on write. The guarantee, the lock
//! order and its limits are in `docs/reliability.md`, section "Fork safety".

// Each file uses only files before it in this order (and `crate::env`,
// `crate::lock`, `crate::fork`, `crate::zero_size`, `crate::Escaped`):
// error, flags, heap, spec, params, heap_slice, clock, table, pool, registry,
// stats, allocator, builder.
mod allocator;
mod builder;
mod clock;
mod error;
mod flags;
mod heap;
mod heap_slice;
mod params;
mod pool;
mod registry;
mod spec;
mod stats;
mod table;

pub use allocator::CachingAllocator;
pub use builder::CachingBuilder;
pub use error::{SpecError, SpecErrorKind, SpecField};
pub use flags::{BufferUsage, MemoryType};
pub use heap::{DeclareHeap, Heap, HeapKey};
pub use params::{PoolParams, RoundUp, DEFAULT_MAX_FREE_ALLOCATION_COUNT};
pub(crate) use registry::hold_registry;
pub use spec::{CachingSpec, PoolSpec, MAX_POOLS};
pub use stats::{CacheStats, PoolStats};

/// The pool lock, for `benches/compare` (which measures it against other
/// locks); not part of the supported API.
#[doc(hidden)]
pub use crate::lock::PoolLock;
