//! [`SpecError`]: a rejected caching spec or pool configuration, with its
//! stable [`SpecErrorKind`] and the [`SpecField`] it is about.

use std::fmt;

use crate::Escaped;

/// At most this many characters of the pair and of the offending text are
/// printed by [`SpecError`]'s `Display` and `Debug` (counted before
/// escaping); longer text is cut and followed by its length in bytes.
pub(super) const SHOWN_CHARS: usize = 80;

/// The stable kind of a [`SpecError`].
#[non_exhaustive]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum SpecErrorKind {
    /// A pair has no heap key (`=1gib`, an empty pair such as `a,,b` or a trailing `,`).
    EmptyHeapKey,
    /// An empty name or empty side in a heap key (`host_local|`, `;transfer`).
    EmptyName,
    /// A memory type or buffer usage name IREE does not define.
    UnknownName,
    /// `*` joined by `|` with names (`*|host_local`): `*` stands alone.
    WildcardWithNames,
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
    /// The name given to
    /// [`CachingAllocator::from_env`](super::CachingAllocator::from_env)
    /// cannot name an environment variable: it is empty or contains `=` or
    /// NUL.
    BadVariableName,
}

impl SpecErrorKind {
    fn describe(self) -> &'static str {
        match self {
            SpecErrorKind::EmptyHeapKey => "empty heap key",
            SpecErrorKind::EmptyName => "empty name",
            SpecErrorKind::UnknownName => "unknown name",
            SpecErrorKind::WildcardWithNames => "`*` mixed with names",
            SpecErrorKind::BadSize => "invalid size",
            SpecErrorKind::BadCount => "invalid count",
            SpecErrorKind::TooManyFields => "too many fields",
            SpecErrorKind::TooManyPools => "too many pools",
            SpecErrorKind::NoMatchingHeap => "no matching heap",
            SpecErrorKind::BadRoundUp => "invalid round-up option",
            SpecErrorKind::NoSuchPool => "no such pool",
            SpecErrorKind::NotUnicode => "spec is not valid Unicode",
            SpecErrorKind::BadVariableName => "invalid environment variable name",
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
    /// The name of the environment variable
    /// [`CachingAllocator::from_env`](super::CachingAllocator::from_env)
    /// reads.
    Variable,
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
            SpecField::Variable => "environment variable",
        })
    }
}

/// A rejected caching spec or pool configuration.
///
/// Names the pair (index and text), the field and the offending text, and
/// carries a stable [`SpecErrorKind`].
///
/// `Display` (and `Debug`) print the pair and the offending text escaped
/// (control and invisible formatting characters written as `\0`,
/// `\u{1b}`, ... as [`Escaped`] does) and cut to their first 80
/// characters followed by `... (N bytes)`, so a message stays one short
/// line whatever the input. [`pair`](Self::pair) and [`text`](Self::text)
/// return the raw, complete text. The error keeps its own copy of both,
/// so an error about a very long pair holds that pair and the offending
/// part of it (up to twice its size) until it is dropped.
///
/// ```
/// use ckalloc::caching::CachingSpec;
/// let long = format!("host_local=1{}x", "0".repeat(1 << 20));
/// let err = long.parse::<CachingSpec>().unwrap_err();
/// assert_eq!(err.text().len(), (1 << 20) + 2); // raw and complete
/// let msg = err.to_string();
/// assert!(msg.len() < 1024 && msg.contains("1048578 bytes"));
/// let err = "host_local=\u{1b}[2J".parse::<CachingSpec>().unwrap_err();
/// assert!(err.to_string().contains("`\\u{1b}[2J`"));
/// ```
#[derive(Clone, PartialEq, Eq)]
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
    /// Adds a detail to the message. The detail is printed escaped but not
    /// cut, so any input it quotes must be cut by the caller (with
    /// [`Escaped::capped`]).
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
    /// The offending pair's text as written (untrimmed, complete and not
    /// escaped; `Display` escapes it and cuts it short). Empty when the
    /// error is not about a pair of a spec string.
    pub fn pair(&self) -> &str {
        &self.pair
    }
    /// The field the error is about.
    pub fn field(&self) -> SpecField {
        self.field
    }
    /// The offending text (trimmed field, name or value), complete and not
    /// escaped; `Display` escapes it and cuts it short.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "caching spec: {}", self.kind.describe())?;
        if let Some(i) = self.pair_index {
            write!(
                f,
                " in pair {} `{}`",
                i,
                Escaped::capped(&self.pair, SHOWN_CHARS)
            )?;
        }
        write!(
            f,
            ", {} `{}`",
            self.field,
            Escaped::capped(&self.text, SHOWN_CHARS)
        )?;
        if let Some(d) = &self.detail {
            write!(f, ": {}", Escaped::new(d))?;
        }
        Ok(())
    }
}

/// A string's `Debug` form, cut after [`SHOWN_CHARS`] characters and then
/// followed by its length in bytes.
struct CappedDebug<'a>(&'a str);

impl fmt::Debug for CappedDebug<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(SHOWN_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

/// Like a derived `Debug`, but the pair and the text are cut as in
/// `Display`, so `unwrap()` on a huge rejected spec prints a short
/// panic message.
impl fmt::Debug for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpecError")
            .field("kind", &self.kind)
            .field("pair_index", &self.pair_index)
            .field("pair", &CappedDebug(&self.pair))
            .field("field", &self.field)
            .field("text", &CappedDebug(&self.text))
            .field("detail", &self.detail)
            .finish()
    }
}

impl std::error::Error for SpecError {}
