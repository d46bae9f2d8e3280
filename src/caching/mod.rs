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
//! Pools are configured with IREE's spec grammar (below, and [`CachingSpec`]):
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
//! # Spec fields
//!
//! A spec is `heap_key[=max_allocation_size;max_allocation_capacity;max_free_allocation_count]`
//! pairs joined by `,`, at most 16 pools, in priority order; the empty spec is
//! one unbounded pool. [`CachingSpec`] gives the grammar; the fields:
//!
//! | field | unit / form | default | rejected (unlike IREE) |
//! | --- | --- | --- | --- |
//! | `max_allocation_size` | bytes: decimal and an optional `b kb kib mb mib gb gib tb tib` (lowercase) | the heap's maximum | `1GiB`, `8x`, `123fb`, `1.5gib`, `-1`, `010`, overflow of `u64`/`usize` |
//! | `max_allocation_capacity` | bytes, as above: live + cached bytes of the pool | unlimited | as above |
//! | `max_free_allocation_count` | a decimal `u32`: blocks kept on the pool's free list | 64 | suffixes, signs, leading zeros, more than `u32::MAX` |
//! | memory type (left of `;` in the key) | `*` or names joined by `\|`: `host_local device_local host_visible host_coherent host_cached device_visible optimal` | `*` | unknown or empty names, `*` mixed with names |
//! | buffer usage (right of `;`) | `*` or names joined by `\|`: `transfer[_source/_target] dispatch dispatch_storage[_read/_write] dispatch_image[_read/_write] dispatch_indirect_params dispatch_uniform_read sharing_{export,replicate,concurrent,immutable} mapping mapping_{scoped,persistent,optional,access_random,access_sequential_write}` | `*` | as above |
//!
//! Fields are trimmed; an empty field or `*` keeps the default, and missing
//! trailing fields keep theirs. Every [`SpecError`] has a stable
//! [`kind()`](SpecError::kind) and names the pair, the field and the
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
//! # Spec grammar
//!
//! A spec lists pools in priority order as IREE's
//! `heap_key=max_allocation_size;max_allocation_capacity;max_free_allocation_count`
//! pairs (`caching_allocator.h`, `iree_hal_caching_allocator_pool_params_t`),
//! parsed strictly; whitespace around every field and name is trimmed:
//!
//! ```text
//! spec      := "" | pair ("," pair)*            at most 16 pairs (MAX_POOLS)
//! pair      := heap_key ["=" limits]
//! heap_key  := side [";" side]                  memory type, then buffer usage
//! side      := "*" | name ("|" name)*           IREE names, case-insensitive
//! limits    := [size] [";" [size] [";" [count]]]   empty or "*" keeps the default
//! size      := digits [suffix]                  digits: "0" or no leading zero
//! suffix    := b | kb | kib | mb | mib | gb | gib | tb | tib   (lowercase only)
//! count     := digits                           a decimal u32
//! ```
//!
//! Names are IREE's memory types ([`MemoryType`]: `host_local`,
//! `device_local`, `optimal`, `host_visible`, ...) and buffer usages
//! ([`BufferUsage`]: `transfer`, `dispatch_storage`, `mapping`, ...); `*` is
//! the wildcard. The defaults are IREE's: `max_allocation_size` = the heap's
//! maximum, `max_allocation_capacity` = unlimited, `max_free_allocation_count`
//! = 64 ([`DEFAULT_MAX_FREE_ALLOCATION_COUNT`]). An empty spec means one
//! unbounded pool.
//!
//! # Units
//!
//! Every size, capacity and byte counter is in bytes (`kb` = 1000, `kib` =
//! 1024, and so on); sizes must fit `u64` and `usize`. Capacity and
//! statistics count a block by the size it was allocated with from the inner
//! allocator (after the pool's [`RoundUp`]). Alignment is the request's
//! [`Layout`] alignment; a cached block is reused only if its address
//! satisfies it.
//!
//! # Errors
//!
//! A rejected spec or configuration is a [`SpecError`] with a stable
//! [`SpecErrorKind`], the [`SpecField`] it is about, the offending pair
//! (index and text) and the offending text; its message escapes control
//! characters and cuts long text short. Allocation failures are
//! [`AllocError`], after the cache was trimmed and the inner allocator
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

mod error;
mod flags;
mod heap;
mod pool;
mod registry;
mod spec;
mod stats;

use std::alloc::Layout;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use allocator_api2::alloc::{AllocError, Allocator};

use crate::lock::HeldLock;
use crate::Escaped;

pub use error::{SpecError, SpecErrorKind, SpecField};
pub use flags::{BufferUsage, MemoryType};
pub use heap::{DeclareHeap, Heap, HeapKey};
use pool::{
    add, home_shard, sub, BlockPtr, BlockTable, DescPtr, FreeBlock, Pool, SHARDS, UNPOOLED,
};
pub(crate) use registry::hold_registry;
use registry::{HeapSlice, Registration};
pub use spec::{CachingSpec, PoolSpec, MAX_POOLS};
pub use stats::{CacheStats, PoolStats};

/// The pool lock, for `benches/compare` (which measures it against other
/// locks); not part of the supported API.
#[doc(hidden)]
pub use crate::lock::PoolLock;

/// IREE's default `max_free_allocation_count`.
pub const DEFAULT_MAX_FREE_ALLOCATION_COUNT: u32 = 64;

/// Parameters of one pool (`iree_hal_caching_allocator_pool_params_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolParams {
    /// The heap the pool's memory comes from; its memory types and usages
    /// must be satisfied by the inner allocator's heap.
    pub heap: Heap,
    /// Largest request in bytes the pool takes; larger requests go to a later
    /// pool or, if none takes them, straight to the inner allocator.
    pub max_allocation_size: u64,
    /// Most bytes (live + cached, as allocated from the inner allocator) the
    /// pool holds; beyond it requests are served unpooled. `u64::MAX` = unlimited.
    pub max_allocation_capacity: u64,
    /// Most blocks the pool's free lists keep.
    pub max_free_allocation_count: u32,
}

impl PoolParams {
    /// IREE's defaults for `heap`: size limit the heap's maximum, capacity
    /// unlimited, free count 64.
    pub fn new(heap: Heap) -> PoolParams {
        PoolParams {
            heap,
            max_allocation_size: heap.max_allocation_size,
            max_allocation_capacity: u64::MAX,
            max_free_allocation_count: DEFAULT_MAX_FREE_ALLOCATION_COUNT,
        }
    }
}

/// Size rounding applied inside a pool before looking for a cached block.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RoundUp {
    /// Exact sizes (IREE's behaviour).
    #[default]
    None,
    /// PyTorch's `roundup_power2_divisions`: the range between two powers of
    /// two is split into `n` equal steps and sizes round up to the next step
    /// (`n = 1` rounds to the next power of two). `n` must be a power of two
    /// in `1..=65536`; powers of two are never rounded.
    PowerOfTwoDivisions(u32),
}

impl RoundUp {
    fn is_valid(self) -> bool {
        match self {
            RoundUp::None => true,
            RoundUp::PowerOfTwoDivisions(n) => n.is_power_of_two() && n <= 1 << 16,
        }
    }

    /// The rounded size in bytes; `size` itself if rounding would overflow.
    pub fn apply(self, size: usize) -> usize {
        match self {
            RoundUp::None => size,
            RoundUp::PowerOfTwoDivisions(n) => {
                if size <= 1 || size.is_power_of_two() {
                    return size;
                }
                let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
                let step = floor >> n.trailing_zeros();
                if step == 0 {
                    return floor.checked_mul(2).unwrap_or(size);
                }
                let down = size & !(step - 1);
                if down == size {
                    size
                } else {
                    down.checked_add(step).unwrap_or(size)
                }
            }
        }
    }
}

enum PoolsSource {
    Unbounded,
    Spec(CachingSpec),
    Params(Vec<PoolParams>),
}

/// Builder for a [`CachingAllocator`] with a declared heap and rounding options.
pub struct CachingBuilder<A: Allocator> {
    inner: A,
    heap: Heap,
    source: PoolsSource,
    round_up: RoundUp,
    pool_round_up: Vec<(usize, RoundUp)>,
}

impl<A: Allocator> CachingBuilder<A> {
    /// Sets the inner allocator's heap (default [`Heap::host`]).
    pub fn heap(mut self, heap: Heap) -> Self {
        self.heap = heap;
        self
    }
    /// Takes the heap the inner allocator declares through [`DeclareHeap`].
    pub fn declared_heap(mut self) -> Self
    where
        A: DeclareHeap,
    {
        self.heap = self.inner.heap();
        self
    }
    /// Uses the pools of a parsed spec (an empty spec means one unbounded pool).
    pub fn spec(mut self, spec: CachingSpec) -> Self {
        self.source = PoolsSource::Spec(spec);
        self
    }
    /// Uses explicit pool parameters, in priority order.
    pub fn pools(mut self, pools: impl IntoIterator<Item = PoolParams>) -> Self {
        self.source = PoolsSource::Params(pools.into_iter().collect());
        self
    }
    /// Size rounding for every pool (default [`RoundUp::None`]).
    pub fn round_up(mut self, round_up: RoundUp) -> Self {
        self.round_up = round_up;
        self
    }
    /// Size rounding for pool `index` (zero-based, spec order), overriding [`round_up`](Self::round_up).
    pub fn pool_round_up(mut self, index: usize, round_up: RoundUp) -> Self {
        self.pool_round_up.push((index, round_up));
        self
    }

    /// Builds the allocator.
    ///
    /// # Errors
    /// [`SpecErrorKind::NoMatchingHeap`] if a pool's heap key or heap is not
    /// satisfied by the inner heap, [`SpecErrorKind::TooManyPools`] over
    /// [`MAX_POOLS`], [`SpecErrorKind::BadRoundUp`] / [`SpecErrorKind::NoSuchPool`]
    /// for invalid rounding options.
    pub fn build(self) -> Result<CachingAllocator<A>, SpecError> {
        let heap = self.heap;
        let params: Vec<PoolParams> = match self.source {
            PoolsSource::Unbounded => vec![PoolParams::new(heap)],
            PoolsSource::Spec(spec) if spec.pools.is_empty() => vec![PoolParams::new(heap)],
            PoolsSource::Spec(spec) => resolve_spec(&spec, &heap)?,
            PoolsSource::Params(p) => {
                check_pools(&p, &heap)?;
                p
            }
        };
        if !self.round_up.is_valid() {
            return Err(bad_round_up(None, self.round_up));
        }
        let mut rounds = vec![self.round_up; params.len()];
        for (i, r) in self.pool_round_up {
            if !r.is_valid() {
                return Err(bad_round_up(Some(i), r));
            }
            match rounds.get_mut(i) {
                Some(slot) => *slot = r,
                None => {
                    return Err(SpecError::new(
                        SpecErrorKind::NoSuchPool,
                        Some(i),
                        "",
                        SpecField::Option,
                        &i.to_string(),
                    )
                    .with_detail(format!("the allocator has {} pools", params.len())))
                }
            }
        }
        let pools = params
            .into_iter()
            .zip(rounds)
            .map(|(p, r)| Pool::new(p, r))
            .collect();
        let pools = HeapSlice::new(pools);
        let table = BlockTable::new();
        Ok(CachingAllocator {
            _registration: Registration::new(&pools, table.shards()),
            inner: self.inner,
            heap,
            pools,
            table,
            no_pool_bypasses: AtomicU64::new(0),
            no_pool_failures: AtomicU64::new(0),
            unpooled_live: AtomicU64::new(0),
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        })
    }
}

fn bad_round_up(pool: Option<usize>, r: RoundUp) -> SpecError {
    SpecError::new(
        SpecErrorKind::BadRoundUp,
        pool,
        "",
        SpecField::Option,
        &format!("{r:?}"),
    )
    .with_detail("divisions must be a power of two in 1..=65536".to_owned())
}

fn check_pools(pools: &[PoolParams], heap: &Heap) -> Result<(), SpecError> {
    if pools.len() > MAX_POOLS {
        return Err(SpecError::new(
            SpecErrorKind::TooManyPools,
            Some(MAX_POOLS),
            "",
            SpecField::Pair,
            &pools.len().to_string(),
        )
        .with_detail(format!("at most {MAX_POOLS} pools")));
    }
    for (i, p) in pools.iter().enumerate() {
        let key = HeapKey {
            memory_type: p.heap.memory_type,
            buffer_usage: p.heap.allowed_usage,
        };
        if !heap.satisfies(&key) {
            return Err(SpecError::new(
                SpecErrorKind::NoMatchingHeap,
                Some(i),
                p.heap.name,
                SpecField::HeapKey,
                &key.to_string(),
            )
            .with_detail(format!("the inner allocator's heap is {heap}")));
        }
    }
    Ok(())
}

fn resolve_spec(spec: &CachingSpec, heap: &Heap) -> Result<Vec<PoolParams>, SpecError> {
    if spec.pools.len() > MAX_POOLS {
        return Err(SpecError::new(
            SpecErrorKind::TooManyPools,
            Some(MAX_POOLS),
            &spec.pools[MAX_POOLS].to_string(),
            SpecField::Pair,
            &spec.pools.len().to_string(),
        )
        .with_detail(format!("at most {MAX_POOLS} pools")));
    }
    spec.pools
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if !heap.satisfies(&p.heap_key) {
                return Err(SpecError::new(
                    SpecErrorKind::NoMatchingHeap,
                    Some(i),
                    &p.to_string(),
                    SpecField::HeapKey,
                    &p.heap_key.to_string(),
                )
                .with_detail(format!("the inner allocator's heap is {heap}")));
            }
            let mut params = PoolParams::new(*heap);
            if let Some(v) = p.max_allocation_size {
                params.max_allocation_size = v;
            }
            if let Some(v) = p.max_allocation_capacity {
                params.max_allocation_capacity = v;
            }
            if let Some(v) = p.max_free_allocation_count {
                params.max_free_allocation_count = v;
            }
            Ok(params)
        })
        .collect()
}

/// A caching allocator over the inner allocator `A`.
///
/// See the [module documentation](self) for the request path. Blocks are
/// counted (capacity, statistics) by the size they were allocated with from
/// `A`; a block remembers that layout and goes back to `A` with it.
/// Allocations return the whole block (its length may exceed the request
/// when a pool rounds sizes). Zero-size requests get a dangling, aligned
/// pointer and never reach `A`.
///
/// Dropping the allocator returns every cached block to `A`. Blocks still
/// live at that point are not returned (they cannot be in safe code: every
/// borrowing collection must be dropped first).
pub struct CachingAllocator<A: Allocator> {
    /// The entry of the process-wide registry the fork handlers walk. Declared
    /// first so it is dropped (unregistered) before `pools` and `table`.
    _registration: Registration,
    inner: A,
    heap: Heap,
    pools: HeapSlice<Pool>,
    table: BlockTable,
    no_pool_bypasses: AtomicU64,
    no_pool_failures: AtomicU64,
    /// Bytes of unpooled (bypass) blocks currently live.
    unpooled_live: AtomicU64,
    /// Bytes currently held from the inner allocator (live + cached).
    held: AtomicU64,
    peak: AtomicU64,
}

impl<A: Allocator> fmt::Debug for CachingAllocator<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("heap", &self.heap)
            .field("pools", &self.pool_params())
            .finish_non_exhaustive()
    }
}

impl<A: Allocator> CachingAllocator<A> {
    /// A builder (heap [`Heap::host`], one unbounded pool, no rounding).
    pub fn builder(inner: A) -> CachingBuilder<A> {
        CachingBuilder {
            inner,
            heap: Heap::host(),
            source: PoolsSource::Unbounded,
            round_up: RoundUp::None,
            pool_round_up: Vec::new(),
        }
    }

    /// One pool taking every size, with IREE's defaults (unlimited capacity,
    /// 64 free blocks), over a [`Heap::host`] heap.
    pub fn unbounded(inner: A) -> CachingAllocator<A> {
        match Self::builder(inner).build() {
            Ok(c) => c,
            // The default configuration is always valid.
            Err(_) => unreachable!("the unbounded configuration is valid"),
        }
    }

    /// Pools from explicit parameters, in priority order (zero pools: every
    /// request bypasses the cache).
    ///
    /// # Errors
    /// `TooManyPools` over 16 pools; `NoMatchingHeap` if a pool's heap is not
    /// satisfied by [`Heap::host`] (use [`builder`](Self::builder) for another heap).
    pub fn with_pools(
        inner: A,
        pools: impl IntoIterator<Item = PoolParams>,
    ) -> Result<CachingAllocator<A>, SpecError> {
        Self::builder(inner).pools(pools).build()
    }

    /// Pools from an IREE spec string such as `device_local=1gib;1gib;8`;
    /// an empty spec is [`unbounded`](Self::unbounded).
    ///
    /// # Errors
    /// Any [`SpecError`] of the grammar, or `NoMatchingHeap`.
    pub fn from_spec(inner: A, spec: &str) -> Result<CachingAllocator<A>, SpecError> {
        Self::builder(inner).spec(spec.parse()?).build()
    }

    /// Pools from the spec in environment variable `var`; unset or empty
    /// means unbounded.
    ///
    /// # Errors
    /// [`SpecErrorKind::BadVariableName`] (field [`SpecField::Variable`],
    /// text `var`) if `var` cannot name an environment variable: it is
    /// empty or contains `=` or NUL (such a variable can never be set, so
    /// the name is a mistake rather than an unset variable).
    /// [`SpecErrorKind::NotUnicode`] if the value is not Unicode, else as
    /// [`from_spec`](Self::from_spec).
    ///
    /// ```
    /// use allocator_api2::alloc::Global;
    /// use ckalloc::caching::{CachingAllocator, SpecErrorKind};
    /// let err = CachingAllocator::from_env(Global, "A=B").unwrap_err();
    /// assert_eq!(err.kind(), SpecErrorKind::BadVariableName);
    /// ```
    pub fn from_env(inner: A, var: &str) -> Result<CachingAllocator<A>, SpecError> {
        if var.is_empty() || var.contains(['=', '\0']) {
            return Err(SpecError::new(
                SpecErrorKind::BadVariableName,
                None,
                "",
                SpecField::Variable,
                var,
            )
            .with_detail("a name must be non-empty and contain neither `=` nor NUL".to_owned()));
        }
        match crate::env::var_os(var) {
            None => Ok(Self::unbounded(inner)),
            Some(v) => match v.to_str() {
                Some(s) => Self::from_spec(inner, s),
                None => Err(SpecError::new(
                    SpecErrorKind::NotUnicode,
                    None,
                    "",
                    SpecField::Pair,
                    &v.to_string_lossy(),
                )
                .with_detail(format!(
                    "environment variable {}",
                    Escaped::capped(var, error::SHOWN_CHARS)
                ))),
            },
        }
    }

    /// The inner allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// The inner allocator's heap.
    pub fn heap(&self) -> Heap {
        self.heap
    }

    /// The pools' parameters, in priority order.
    pub fn pool_params(&self) -> Vec<PoolParams> {
        self.pools.iter().map(|p| p.params).collect()
    }

    /// Holds the lock of free-list shard `shard` of pool `pool` on the
    /// calling thread until the returned value is dropped; `None` if there is
    /// no such pool or shard. A test hook, not part of the supported API.
    #[doc(hidden)]
    pub fn hold_pool_shard_lock(&self, pool: usize, shard: usize) -> Option<HeldLock<'_>> {
        Some(self.pools.get(pool)?.shards.get(shard)?.state.hold())
    }

    /// The number of free-list shards of each pool (test hook).
    #[doc(hidden)]
    pub fn pool_shard_count(&self) -> usize {
        SHARDS
    }

    /// Holds every shard lock of the block table on the calling thread until
    /// the returned values are dropped. A test hook, not part of the
    /// supported API.
    #[doc(hidden)]
    pub fn hold_block_table_locks(&self) -> Vec<HeldLock<'_>> {
        self.table.shards().iter().map(|t| t.0.hold()).collect()
    }

    /// A snapshot of the statistics (exact when no other thread is allocating).
    pub fn stats(&self) -> CacheStats {
        let mut s = CacheStats::default();
        for (index, p) in self.pools.iter().enumerate() {
            let ps = PoolStats {
                index,
                max_allocation_size: p.params.max_allocation_size,
                max_allocation_capacity: p.params.max_allocation_capacity,
                max_free_allocation_count: p.params.max_free_allocation_count,
                hits: p.sum_locked(|s| s.hits),
                misses: p.sum(|c| &c.misses),
                bypasses: p.sum(|c| &c.bypasses),
                evictions: p.sum(|c| &c.evictions),
                trimmed: p.sum(|c| &c.trimmed),
                live_bytes: p.sum_locked(|s| s.live_bytes),
                cached_bytes: p.sum_locked(|s| s.cached_bytes),
                cached_blocks: p.sum_locked(|s| s.free.len() as u64),
                peak_bytes: p.peak.load(Relaxed),
                inner_failures: p.sum(|c| &c.inner_failures),
            };
            s.hits += ps.hits;
            s.misses += ps.misses;
            s.bypasses += ps.bypasses;
            s.evictions += ps.evictions;
            s.trimmed += ps.trimmed;
            s.live_bytes += ps.live_bytes;
            s.cached_bytes += ps.cached_bytes;
            s.cached_blocks += ps.cached_blocks;
            s.inner_failures += ps.inner_failures;
            s.pools.push(ps);
        }
        s.bypasses += self.no_pool_bypasses.load(Relaxed);
        s.inner_failures += self.no_pool_failures.load(Relaxed);
        s.live_bytes += self.unpooled_live.load(Relaxed);
        s.peak_bytes = self.peak.load(Relaxed);
        s
    }

    /// Returns every cached block to the inner allocator, oldest first.
    pub fn trim(&self) {
        self.trim_to(0);
    }

    /// Returns cached blocks to the inner allocator, oldest first across all
    /// pools, until at most `bytes` bytes stay cached.
    pub fn trim_to(&self, bytes: u64) {
        let home = home_shard();
        loop {
            let cached: u64 = self.pools.iter().fold(0u64, |acc, p| {
                acc.wrapping_add(p.sum_locked(|s| s.cached_bytes))
            });
            if cached <= bytes {
                return;
            }
            let oldest = self
                .pools
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.oldest().map(|(seq, shard)| (seq, i, shard)))
                .min();
            let Some((seq, pi, shard)) = oldest else {
                return;
            };
            let pool = &self.pools[pi];
            if let Some(fb) = pool.pop_if_front(shard, seq) {
                add(&pool.shards[home].counters.trimmed, 1);
                self.free_cached(pool, fb);
            }
        }
    }

    /// Accounts for a block that left a free list (popped with its slot and
    /// cached bytes accounted) for the inner allocator, and frees it.
    fn free_cached(&self, pool: &Pool, fb: FreeBlock) {
        let b = fb.size() as u64;
        sub(&pool.committed, b);
        sub(&self.held, b);
        self.free_to_inner(fb.ptr, fb.desc);
    }

    /// Forgets a block that is neither live nor cached and returns it to the
    /// inner allocator with its layout.
    fn free_to_inner(&self, ptr: BlockPtr, desc: DescPtr) {
        let pool = desc.get().pool;
        if pool != UNPOOLED {
            self.pools[pool as usize].scrub(ptr.addr());
        }
        if let Some(layout) = self.table.forget(ptr.addr()) {
            // SAFETY: the block was allocated by `self.inner` with exactly
            // `layout` (its descriptor), is not live, and is no longer
            // reachable from any list or the table.
            unsafe { self.inner.deallocate(ptr.0, layout) };
        }
    }

    #[inline]
    fn pool_for(&self, size: usize) -> Option<usize> {
        // The common configuration: the first pool takes it.
        if let Some(p) = self.pools.first() {
            if size as u64 <= p.params.max_allocation_size {
                return Some(0);
            }
        }
        self.pools
            .iter()
            .position(|p| size as u64 <= p.params.max_allocation_size)
    }

    /// Reserves `b` bytes of capacity in pool `pi`, evicting cached blocks
    /// oldest first if that makes room. Returns the new committed total.
    fn reserve(&self, pi: usize, home: usize, b: u64) -> Option<u64> {
        let pool = &self.pools[pi];
        let cap = pool.params.max_allocation_capacity;
        if b > cap {
            return None;
        }
        loop {
            let cur = pool.committed.load(Relaxed);
            if cur.checked_add(b).is_some_and(|n| n <= cap) {
                if pool
                    .committed
                    .compare_exchange_weak(cur, cur + b, Relaxed, Relaxed)
                    .is_ok()
                {
                    return Some(cur + b);
                }
                continue;
            }
            // Evict only if dropping every cached block could make room.
            let cached = pool.sum_locked(|s| s.cached_bytes);
            let live = cur.wrapping_sub(cached);
            if live.checked_add(b).is_none_or(|n| n > cap) {
                return None;
            }
            let fb = pool.pop_oldest()?;
            add(&pool.shards[home].counters.evictions, 1);
            self.free_cached(pool, fb);
        }
    }

    /// Calls the inner allocator (no lock held); on failure trims the cache
    /// and retries once.
    fn inner_alloc(
        &self,
        layout: Layout,
        zeroed: bool,
        pool: Option<usize>,
        home: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let call = || {
            if zeroed {
                self.inner.allocate_zeroed(layout)
            } else {
                self.inner.allocate(layout)
            }
        };
        let fail = || match pool {
            Some(pi) => add(&self.pools[pi].shards[home].counters.inner_failures, 1),
            None => add(&self.no_pool_failures, 1),
        };
        match call() {
            Ok(p) => Ok(p.cast()),
            Err(_) => {
                fail();
                self.trim();
                match call() {
                    Ok(p) => Ok(p.cast()),
                    Err(e) => {
                        fail();
                        Err(e)
                    }
                }
            }
        }
    }

    fn note_held(&self, b: u64) {
        let now = self.held.fetch_add(b, Relaxed) + b;
        self.peak.fetch_max(now, Relaxed);
    }

    /// Serves `layout` straight from the inner allocator (a bypass).
    fn alloc_unpooled(
        &self,
        layout: Layout,
        zeroed: bool,
        pool: Option<usize>,
        home: usize,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let p = self.inner_alloc(layout, zeroed, pool, home)?;
        let b = layout.size() as u64;
        match pool {
            Some(pi) => add(&self.pools[pi].shards[home].counters.bypasses, 1),
            None => add(&self.no_pool_bypasses, 1),
        }
        add(&self.unpooled_live, b);
        self.note_held(b);
        self.table.insert(p.as_ptr() as usize, layout, UNPOOLED);
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    fn alloc_impl(&self, layout: Layout, zeroed: bool) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(NonNull::slice_from_raw_parts(dangling(layout.align()), 0));
        }
        let home = home_shard();
        let Some(pi) = self.pool_for(layout.size()) else {
            return self.alloc_unpooled(layout, zeroed, None, home);
        };
        let pool = &self.pools[pi];
        let b = pool.block_size(layout.size());
        // The cache hit (see `Pool::take_from`).
        if let Some(block) = pool.take(home, b, layout.align()) {
            let start = block.ptr.0;
            if zeroed {
                // SAFETY: the block is `b` bytes long and now owned by this call.
                unsafe { ptr::write_bytes(start.as_ptr(), 0, b) };
            }
            return Ok(NonNull::slice_from_raw_parts(start, b));
        }
        let block_layout = Layout::from_size_align(b, layout.align()).map_err(|_| AllocError)?;
        let counters = &pool.shards[home].counters;
        if self.reserve(pi, home, b as u64).is_none() {
            return self.alloc_unpooled(layout, zeroed, Some(pi), home);
        }
        match self.inner_alloc(block_layout, zeroed, Some(pi), home) {
            Ok(p) => {
                add(&counters.misses, 1);
                // After the call: a retry may have trimmed this pool meanwhile.
                pool.peak.fetch_max(pool.committed.load(Relaxed), Relaxed);
                self.note_held(b as u64);
                let addr = p.as_ptr() as usize;
                let desc = self.table.insert(addr, block_layout, pi as u32);
                pool.add_live(home, b as u64, addr, desc);
                Ok(NonNull::slice_from_raw_parts(p, b))
            }
            Err(e) => {
                sub(&pool.committed, b as u64);
                Err(e)
            }
        }
    }

    /// Releases a live block (its descriptor was just marked not live).
    #[inline]
    fn release(&self, ptr: NonNull<u8>, desc: DescPtr) {
        let d = desc.get();
        let b = d.layout.size() as u64;
        if d.pool == UNPOOLED {
            sub(&self.unpooled_live, b);
            sub(&self.held, b);
            self.free_to_inner(BlockPtr(ptr), desc);
            return;
        }
        self.put(home_shard(), FreeBlock::released(ptr, desc));
    }

    /// Caches a released pooled block, or returns it to the inner allocator
    /// when the pool's free count is reached.
    fn put(&self, home: usize, fb: FreeBlock) {
        let pool = &self.pools[fb.desc.get().pool as usize];
        if let Err(fb) = pool.put(home, fb) {
            let b = fb.size() as u64;
            sub(&pool.committed, b);
            sub(&self.held, b);
            self.free_to_inner(fb.ptr, fb.desc);
        }
    }

    /// True if a live block can serve `new` without moving.
    fn fits_in_place(&self, addr: usize, info: &pool::Desc, new: Layout) -> bool {
        if !addr.is_multiple_of(new.align()) {
            return false;
        }
        let b = info.layout.size();
        if info.pool == UNPOOLED {
            return new.size() == b;
        }
        self.pool_for(new.size()) == Some(info.pool as usize)
            && self.pools[info.pool as usize].block_size(new.size()) == b
    }

    /// Shared body of grow/shrink: in place if the block fits, else a new
    /// block through the cache, a copy, and the old block released to the cache.
    ///
    /// # Safety
    /// As [`Allocator::grow`] / [`Allocator::shrink`].
    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
        zeroed: bool,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 {
            return self.alloc_impl(new, zeroed);
        }
        let addr = ptr.as_ptr() as usize;
        let desc = self.table.get_live(addr).ok_or(AllocError)?;
        let b = desc.get().layout.size();
        if new.size() != 0 && self.fits_in_place(addr, desc.get(), new) {
            if zeroed && b > old.size() {
                // SAFETY: bytes old.size()..b lie inside the caller's live block.
                unsafe { ptr::write_bytes(ptr.as_ptr().add(old.size()), 0, b - old.size()) };
            }
            return Ok(NonNull::slice_from_raw_parts(ptr, b));
        }
        let fresh = self.alloc_impl(new, false)?;
        let keep = old.size().min(new.size());
        // SAFETY: both blocks are live and distinct (the old one is still in
        // the table, so the cache could not hand it out again); `keep` bytes
        // fit in both.
        unsafe {
            ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.cast::<u8>().as_ptr(), keep);
            if zeroed {
                let len = fresh.len();
                ptr::write_bytes(fresh.cast::<u8>().as_ptr().add(keep), 0, len - keep);
            }
        }
        if let Some(desc) = self.table.release(addr) {
            self.release(ptr, desc);
        }
        Ok(fresh)
    }
}

#[inline]
fn dangling(align: usize) -> NonNull<u8> {
    // SAFETY: `align` is a non-zero power of two, so the pointer is non-null;
    // it is only used for zero-sized accesses.
    unsafe { NonNull::new_unchecked(ptr::null_mut::<u8>().wrapping_add(align)) }
}

impl<A: Allocator> Drop for CachingAllocator<A> {
    fn drop(&mut self) {
        self.trim();
    }
}

// SAFETY: blocks handed out come from `inner` (which upholds the Allocator
// contract) and stay valid until deallocated through this allocator; a block
// is in at most one of {live table, one free list} at a time, so no block is
// handed out twice; moving the allocator keeps `inner` and so the blocks.
unsafe impl<A: Allocator> Allocator for CachingAllocator<A> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.alloc_impl(layout, false)
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.alloc_impl(layout, true)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let addr = ptr.as_ptr() as usize;
        // Fast path: the pool this size maps to, the calling thread's shard
        // handed the block out recently.
        if let Some(pi) = self.pool_for(layout.size()) {
            let home = home_shard();
            match self.pools[pi].release_recent(home, ptr) {
                Some(Ok(())) => return,
                Some(Err(fb)) => {
                    // `release_recent` marked it not live and left its live
                    // bytes counted; `put` moves them.
                    self.put(home, fb);
                    return;
                }
                None => {}
            }
        }
        // A pointer not in the table violates the caller contract; ignoring
        // it is the only option that cannot corrupt the cache.
        if let Some(desc) = self.table.release(addr) {
            self.release(ptr, desc);
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded caller contract.
        unsafe { self.resize(ptr, old, new, false) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded caller contract.
        unsafe { self.resize(ptr, old, new, true) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if new.size() == 0 {
            // SAFETY: forwarded caller contract.
            unsafe { self.deallocate(ptr, old) };
            return Ok(NonNull::slice_from_raw_parts(dangling(new.align()), 0));
        }
        // SAFETY: forwarded caller contract.
        unsafe { self.resize(ptr, old, new, false) }
    }
}

const _: () = assert!(SHARDS.is_power_of_two());
