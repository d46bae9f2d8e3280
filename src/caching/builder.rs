//! [`CachingBuilder`] and the constructors of [`CachingAllocator`]: the
//! pools from a spec, parameters or nothing, checked against the heap.

use allocator_api2::alloc::Allocator;

use super::allocator::CachingAllocator;
use super::error::{SpecError, SpecErrorKind, SpecField};
use super::heap::{DeclareHeap, Heap, HeapKey};
use super::heap_slice::HeapSlice;
use super::params::{PoolParams, RoundUp};
use super::pool::Pool;
use super::spec::{CachingSpec, MAX_POOLS};
use crate::Escaped;

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
        Ok(CachingAllocator::assemble(
            self.inner,
            heap,
            HeapSlice::new(pools),
        ))
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
                    Escaped::capped(var, super::error::SHOWN_CHARS)
                ))),
            },
        }
    }
}
