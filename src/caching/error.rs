//! [`SpecError`]: a rejected caching spec or pool configuration, with its
//! stable [`SpecErrorKind`] and the [`SpecField`] it is about.

use std::fmt;

/// The stable kind of a [`SpecError`].
#[non_exhaustive]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum SpecErrorKind {
    /// A pair has no heap key (`=1gib`, an empty pair such as `a,,b` or a trailing `,`).
    EmptyHeapKey,
    /// An empty name or empty side in a heap key (`host_local|`, `;transfer`).
    EmptyName,
    /// A memory type or buffer usage name IREE does not define (or `*` mixed with names).
    UnknownName,
    /// A size field that is not a strict decimal with a lowercase suffix, or overflows.
    BadSize,
    /// A count field that is not a strict decimal `u32`.
    BadCount,
    /// More than three `;`-separated limit fields.
    TooManyFields,
    /// More than [`MAX_POOLS`](super::MAX_POOLS) pools.
    TooManyPools,
    /// The inner allocator's heap cannot satisfy the pool's heap key.
    NoMatchingHeap,
    /// An invalid [`RoundUp`](crate::caching::RoundUp) option.
    BadRoundUp,
    /// A per-pool option names a pool index that does not exist.
    NoSuchPool,
    /// The environment variable holding the spec is not valid Unicode.
    NotUnicode,
}

impl SpecErrorKind {
    fn describe(self) -> &'static str {
        match self {
            SpecErrorKind::EmptyHeapKey => "empty heap key",
            SpecErrorKind::EmptyName => "empty name",
            SpecErrorKind::UnknownName => "unknown name",
            SpecErrorKind::BadSize => "invalid size",
            SpecErrorKind::BadCount => "invalid count",
            SpecErrorKind::TooManyFields => "too many fields",
            SpecErrorKind::TooManyPools => "too many pools",
            SpecErrorKind::NoMatchingHeap => "no matching heap",
            SpecErrorKind::BadRoundUp => "invalid round-up option",
            SpecErrorKind::NoSuchPool => "no such pool",
            SpecErrorKind::NotUnicode => "spec is not valid Unicode",
        }
    }
}

/// Which part of a pair an error is about.
#[non_exhaustive]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum SpecField {
    /// The whole spec or pair.
    Pair,
    /// The heap key as a whole.
    HeapKey,
    /// The memory type side of the heap key.
    MemoryType,
    /// The buffer usage side of the heap key.
    BufferUsage,
    /// The first limit: `max_allocation_size`.
    MaxAllocationSize,
    /// The second limit: `max_allocation_capacity`.
    MaxAllocationCapacity,
    /// The third limit: `max_free_allocation_count`.
    MaxFreeAllocationCount,
    /// A builder option (rounding).
    Option,
}

impl fmt::Display for SpecField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecField::Pair => "pair",
            SpecField::HeapKey => "heap key",
            SpecField::MemoryType => "memory type",
            SpecField::BufferUsage => "buffer usage",
            SpecField::MaxAllocationSize => "max_allocation_size",
            SpecField::MaxAllocationCapacity => "max_allocation_capacity",
            SpecField::MaxFreeAllocationCount => "max_free_allocation_count",
            SpecField::Option => "option",
        })
    }
}

/// A rejected caching spec or pool configuration.
///
/// Names the pair (index and text), the field and the offending text, and
/// carries a stable [`SpecErrorKind`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SpecError {
    kind: SpecErrorKind,
    pair_index: Option<usize>,
    pair: String,
    field: SpecField,
    text: String,
    detail: Option<String>,
}

impl SpecError {
    pub(crate) fn new(
        kind: SpecErrorKind,
        pair_index: Option<usize>,
        pair: &str,
        field: SpecField,
        text: &str,
    ) -> SpecError {
        SpecError {
            kind,
            pair_index,
            pair: pair.to_owned(),
            field,
            text: text.to_owned(),
            detail: None,
        }
    }
    pub(crate) fn with_detail(mut self, detail: String) -> SpecError {
        self.detail = Some(detail);
        self
    }
    /// The stable error kind.
    pub fn kind(&self) -> SpecErrorKind {
        self.kind
    }
    /// Zero-based index of the offending pair (pool), if the error is about one.
    pub fn pair_index(&self) -> Option<usize> {
        self.pair_index
    }
    /// The offending pair's text as written (untrimmed).
    pub fn pair(&self) -> &str {
        &self.pair
    }
    /// The field the error is about.
    pub fn field(&self) -> SpecField {
        self.field
    }
    /// The offending text (trimmed field, name or value).
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "caching spec: {}", self.kind.describe())?;
        if let Some(i) = self.pair_index {
            write!(f, " in pair {} `{}`", i, self.pair)?;
        }
        write!(f, ", {} `{}`", self.field, self.text)?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecError {}
