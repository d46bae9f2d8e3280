//! The pool specification grammar (IREE's `--device_allocator=caching:<spec>`
//! form, parsed strictly), heaps, heap keys and [`SpecError`].
//!
//! Grammar (whitespace around every field and name is trimmed):
//!
//! ```text
//! spec      := "" | pair ("," pair)*            at most 16 pairs
//! pair      := heap_key ["=" limits]
//! heap_key  := side [";" side]                  memory type, then buffer usage
//! side      := "*" | name ("|" name)*           names are case-insensitive
//! limits    := [size] [";" [size] [";" [count]]]   empty or "*" keeps the default
//! size      := digits [suffix]                  digits: "0" or no leading zero
//! suffix    := b | kb | kib | mb | mib | gb | gib | tb | tib   (lowercase only)
//! count     := digits                           a decimal u32
//! ```
//!
//! Unlike IREE's parser this one rejects what IREE silently misreads:
//! upper-case suffixes, trailing junk, fractions, signs, leading zeros,
//! values that overflow `u64`/`usize`, more than three limit fields and empty
//! pairs.

use std::fmt;
use std::str::FromStr;

/// Maximum number of pools in one caching allocator (IREE's limit).
pub const MAX_POOLS: usize = 16;

// ---------------------------------------------------------------------------
// Memory types and buffer usage (IREE's bit values)
// ---------------------------------------------------------------------------

/// A set of IREE memory type bits (`iree_hal_memory_type_t`).
///
/// Values are built only from the named constants and `|`, so every value
/// has a name-based spelling and [`Display`](fmt::Display) round-trips.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemoryType(u32);

impl MemoryType {
    /// No bits: in a heap key this is the wildcard `*`.
    pub const NONE: MemoryType = MemoryType(0);
    /// `optimal`: an allocation-time hint; every heap satisfies it.
    pub const OPTIMAL: MemoryType = MemoryType(1 << 0);
    /// `host_visible`: the host can map the memory.
    pub const HOST_VISIBLE: MemoryType = MemoryType(1 << 1);
    /// `host_coherent`: no flush/invalidate is needed between host and device.
    pub const HOST_COHERENT: MemoryType = MemoryType(1 << 2);
    /// `host_cached`: host accesses go through the CPU caches.
    pub const HOST_CACHED: MemoryType = MemoryType(1 << 3);
    /// `host_local`: ordinary host memory (host_visible | host_coherent | bit 6).
    pub const HOST_LOCAL: MemoryType = MemoryType((1 << 1) | (1 << 2) | (1 << 6));
    /// `device_visible`: the device can use the memory for execution.
    pub const DEVICE_VISIBLE: MemoryType = MemoryType(1 << 4);
    /// `device_local`: the fastest memory for the device (device_visible | bit 5).
    pub const DEVICE_LOCAL: MemoryType = MemoryType((1 << 4) | (1 << 5));

    /// The raw IREE bit pattern.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// True if every bit of `other` is set in `self`.
    pub const fn contains(self, other: MemoryType) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if no bit is set (the wildcard).
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for MemoryType {
    type Output = MemoryType;
    fn bitor(self, rhs: MemoryType) -> MemoryType {
        MemoryType(self.0 | rhs.0)
    }
}

/// Names in display order: composites first so the greedy spelling is short.
const MEMORY_TYPE_NAMES: &[(&str, MemoryType)] = &[
    ("host_local", MemoryType::HOST_LOCAL),
    ("device_local", MemoryType::DEVICE_LOCAL),
    ("optimal", MemoryType::OPTIMAL),
    ("host_visible", MemoryType::HOST_VISIBLE),
    ("host_coherent", MemoryType::HOST_COHERENT),
    ("host_cached", MemoryType::HOST_CACHED),
    ("device_visible", MemoryType::DEVICE_VISIBLE),
];

/// A set of IREE buffer usage bits (`iree_hal_buffer_usage_t`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BufferUsage(u32);

impl BufferUsage {
    /// No bits: in a heap key this is the wildcard `*`.
    pub const NONE: BufferUsage = BufferUsage(0);
    /// `transfer_source`.
    pub const TRANSFER_SOURCE: BufferUsage = BufferUsage(1 << 0);
    /// `transfer_target`.
    pub const TRANSFER_TARGET: BufferUsage = BufferUsage(1 << 1);
    /// `transfer` (source | target).
    pub const TRANSFER: BufferUsage = BufferUsage(0b11);
    /// `dispatch_indirect_params`.
    pub const DISPATCH_INDIRECT_PARAMS: BufferUsage = BufferUsage(1 << 8);
    /// `dispatch_uniform_read`.
    pub const DISPATCH_UNIFORM_READ: BufferUsage = BufferUsage(1 << 9);
    /// `dispatch_storage_read`.
    pub const DISPATCH_STORAGE_READ: BufferUsage = BufferUsage(1 << 10);
    /// `dispatch_storage_write`.
    pub const DISPATCH_STORAGE_WRITE: BufferUsage = BufferUsage(1 << 11);
    /// `dispatch_storage` (read | write).
    pub const DISPATCH_STORAGE: BufferUsage = BufferUsage((1 << 10) | (1 << 11));
    /// `dispatch_image_read`.
    pub const DISPATCH_IMAGE_READ: BufferUsage = BufferUsage(1 << 12);
    /// `dispatch_image_write`.
    pub const DISPATCH_IMAGE_WRITE: BufferUsage = BufferUsage(1 << 13);
    /// `dispatch_image` (read | write).
    pub const DISPATCH_IMAGE: BufferUsage = BufferUsage((1 << 12) | (1 << 13));
    /// `dispatch` (every dispatch bit).
    pub const DISPATCH: BufferUsage = BufferUsage(0b11_1111 << 8);
    /// `sharing_export`.
    pub const SHARING_EXPORT: BufferUsage = BufferUsage(1 << 16);
    /// `sharing_replicate`.
    pub const SHARING_REPLICATE: BufferUsage = BufferUsage(1 << 17);
    /// `sharing_concurrent`.
    pub const SHARING_CONCURRENT: BufferUsage = BufferUsage(1 << 18);
    /// `sharing_immutable`.
    pub const SHARING_IMMUTABLE: BufferUsage = BufferUsage(1 << 19);
    /// `mapping_scoped`.
    pub const MAPPING_SCOPED: BufferUsage = BufferUsage(1 << 24);
    /// `mapping_persistent`.
    pub const MAPPING_PERSISTENT: BufferUsage = BufferUsage(1 << 25);
    /// `mapping_optional`.
    pub const MAPPING_OPTIONAL: BufferUsage = BufferUsage(1 << 26);
    /// `mapping_access_random`.
    pub const MAPPING_ACCESS_RANDOM: BufferUsage = BufferUsage(1 << 27);
    /// `mapping_access_sequential_write`.
    pub const MAPPING_ACCESS_SEQUENTIAL_WRITE: BufferUsage = BufferUsage(1 << 28);
    /// `mapping` (scoped | access_random).
    pub const MAPPING: BufferUsage = BufferUsage((1 << 24) | (1 << 27));
    /// Every usage bit above.
    pub const ALL: BufferUsage =
        BufferUsage(0b11 | (0b11_1111 << 8) | (0b1111 << 16) | (0b1_1111 << 24));

    /// The raw IREE bit pattern.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// True if every bit of `other` is set in `self`.
    pub const fn contains(self, other: BufferUsage) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if no bit is set (the wildcard).
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for BufferUsage {
    type Output = BufferUsage;
    fn bitor(self, rhs: BufferUsage) -> BufferUsage {
        BufferUsage(self.0 | rhs.0)
    }
}

const BUFFER_USAGE_NAMES: &[(&str, BufferUsage)] = &[
    ("dispatch", BufferUsage::DISPATCH),
    ("transfer", BufferUsage::TRANSFER),
    ("dispatch_storage", BufferUsage::DISPATCH_STORAGE),
    ("dispatch_image", BufferUsage::DISPATCH_IMAGE),
    ("mapping", BufferUsage::MAPPING),
    ("transfer_source", BufferUsage::TRANSFER_SOURCE),
    ("transfer_target", BufferUsage::TRANSFER_TARGET),
    (
        "dispatch_indirect_params",
        BufferUsage::DISPATCH_INDIRECT_PARAMS,
    ),
    ("dispatch_uniform_read", BufferUsage::DISPATCH_UNIFORM_READ),
    ("dispatch_storage_read", BufferUsage::DISPATCH_STORAGE_READ),
    (
        "dispatch_storage_write",
        BufferUsage::DISPATCH_STORAGE_WRITE,
    ),
    ("dispatch_image_read", BufferUsage::DISPATCH_IMAGE_READ),
    ("dispatch_image_write", BufferUsage::DISPATCH_IMAGE_WRITE),
    ("sharing_export", BufferUsage::SHARING_EXPORT),
    ("sharing_replicate", BufferUsage::SHARING_REPLICATE),
    ("sharing_concurrent", BufferUsage::SHARING_CONCURRENT),
    ("sharing_immutable", BufferUsage::SHARING_IMMUTABLE),
    ("mapping_scoped", BufferUsage::MAPPING_SCOPED),
    ("mapping_persistent", BufferUsage::MAPPING_PERSISTENT),
    ("mapping_optional", BufferUsage::MAPPING_OPTIONAL),
    ("mapping_access_random", BufferUsage::MAPPING_ACCESS_RANDOM),
    (
        "mapping_access_sequential_write",
        BufferUsage::MAPPING_ACCESS_SEQUENTIAL_WRITE,
    ),
];

/// Writes `bits` as names joined by `|`, composites first, or `*` if empty.
fn write_names(f: &mut fmt::Formatter<'_>, mut bits: u32, table: &[(&str, u32)]) -> fmt::Result {
    if bits == 0 {
        return f.write_str("*");
    }
    let mut first = true;
    for &(name, b) in table {
        if b != 0 && bits & b == b {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            first = false;
            bits &= !b;
        }
    }
    debug_assert_eq!(bits, 0, "every constructible bit has a name");
    Ok(())
}

fn memory_type_table() -> [(&'static str, u32); 7] {
    let mut t = [("", 0u32); 7];
    for (i, (n, m)) in MEMORY_TYPE_NAMES.iter().enumerate() {
        t[i] = (n, m.0);
    }
    t
}

fn buffer_usage_table() -> Vec<(&'static str, u32)> {
    BUFFER_USAGE_NAMES.iter().map(|(n, u)| (*n, u.0)).collect()
}

impl fmt::Display for MemoryType {
    /// Lowercase IREE names joined by `|` (composites first), `*` if empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_names(f, self.0, &memory_type_table())
    }
}
impl fmt::Debug for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryType({self})")
    }
}
impl fmt::Display for BufferUsage {
    /// Lowercase IREE names joined by `|` (composites first), `*` if empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_names(f, self.0, &buffer_usage_table())
    }
}
impl fmt::Debug for BufferUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BufferUsage({self})")
    }
}

// ---------------------------------------------------------------------------
// Heaps
// ---------------------------------------------------------------------------

/// The memory heap an inner allocator serves (`iree_hal_allocator_memory_heap_t`).
///
/// The default, [`Heap::host`], is what IREE's CPU devices report for their
/// single heap, widened to name what host memory is: ordinary host memory
/// (`host_local`, `host_cached`) that CPU "device" code uses directly
/// (`device_local`), allowing every buffer usage. An inner allocator with a
/// narrower heap declares it through [`DeclareHeap`] or the builder's
/// [`heap`](crate::caching::CachingBuilder::heap).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Heap {
    /// A short human-readable name used in errors and summaries.
    pub name: &'static str,
    /// Memory type bits the heap's memory has.
    pub memory_type: MemoryType,
    /// Buffer usages the heap allows.
    pub allowed_usage: BufferUsage,
    /// Largest single allocation in bytes the heap can serve.
    pub max_allocation_size: u64,
}

impl Heap {
    /// Host memory satisfying both the host and the device memory types, with
    /// every usage allowed and `isize::MAX` bytes as the allocation limit.
    pub const fn host() -> Heap {
        Heap {
            name: "host",
            memory_type: MemoryType(
                MemoryType::HOST_LOCAL.0 | MemoryType::HOST_CACHED.0 | MemoryType::DEVICE_LOCAL.0,
            ),
            allowed_usage: BufferUsage::ALL,
            max_allocation_size: isize::MAX as u64,
        }
    }

    /// True if this heap satisfies `key` (IREE's `iree_hal_select_heap` rule:
    /// all requested memory type bits and usage bits are present). The
    /// `optimal` bit is an allocation-time hint and is satisfied by every heap.
    pub fn satisfies(&self, key: &HeapKey) -> bool {
        let wanted = MemoryType(key.memory_type.0 & !MemoryType::OPTIMAL.0);
        self.memory_type.contains(wanted) && self.allowed_usage.contains(key.buffer_usage)
    }
}

impl Default for Heap {
    fn default() -> Heap {
        Heap::host()
    }
}

impl fmt::Display for Heap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (memory types {}; usage {})",
            self.name, self.memory_type, self.allowed_usage
        )
    }
}

/// Lets an inner allocator declare the heap it serves.
///
/// The caching allocator uses the declared heap to check each pool's heap key
/// ([`SpecErrorKind::NoMatchingHeap`]) and as the source of the default
/// per-pool size limit. The default method returns [`Heap::host`].
pub trait DeclareHeap {
    /// The heap this allocator's memory comes from.
    fn heap(&self) -> Heap {
        Heap::host()
    }
}

impl DeclareHeap for allocator_api2::alloc::Global {}
impl<T: DeclareHeap + ?Sized> DeclareHeap for &T {
    fn heap(&self) -> Heap {
        (**self).heap()
    }
}

/// The heap selector on the left of `=`: `memory_type[;buffer_usage]`.
/// Empty sets are wildcards (`*`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct HeapKey {
    /// Required memory type bits (`*` = none required).
    pub memory_type: MemoryType,
    /// Required buffer usage bits (`*` = none required).
    pub buffer_usage: BufferUsage,
}

impl fmt::Display for HeapKey {
    /// Canonical: `memory_type` alone when the usage is `*`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.memory_type)?;
        if !self.buffer_usage.is_empty() {
            write!(f, ";{}", self.buffer_usage)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

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
    /// More than [`MAX_POOLS`] pools.
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

// ---------------------------------------------------------------------------
// Spec
// ---------------------------------------------------------------------------

/// One parsed pair: a heap key and optional limits (`None` = IREE's default).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PoolSpec {
    /// The heap selector.
    pub heap_key: HeapKey,
    /// `max_allocation_size` in bytes; `None` = the heap's maximum.
    pub max_allocation_size: Option<u64>,
    /// `max_allocation_capacity` in bytes; `None` = unlimited.
    pub max_allocation_capacity: Option<u64>,
    /// `max_free_allocation_count`; `None` = 64.
    pub max_free_allocation_count: Option<u32>,
}

/// A parsed caching spec: pools in priority order (empty = unbounded).
///
/// Grammar (IREE's `heap_key=max_allocation_size;max_allocation_capacity;max_free_allocation_count`
/// pairs, parsed strictly; whitespace around every field and name is trimmed):
///
/// ```text
/// spec      := "" | pair ("," pair)*            at most 16 pairs
/// pair      := heap_key ["=" limits]
/// heap_key  := side [";" side]                  memory type, then buffer usage
/// side      := "*" | name ("|" name)*           IREE names, case-insensitive
/// limits    := [size] [";" [size] [";" [count]]]   empty or "*" keeps the default
/// size      := digits [suffix]                  digits: "0" or no leading zero
/// suffix    := b | kb | kib | mb | mib | gb | gib | tb | tib   (lowercase only)
/// count     := digits                           a decimal u32
/// ```
///
/// Sizes are bytes (`kb` = 1000, `kib` = 1024, ...) and must fit `u64` and
/// `usize`. Rejected, unlike IREE: upper-case suffixes (`1GiB`), trailing
/// junk (`8x`), fractions, signs, leading zeros (`010`), overflow, a fourth
/// limit field, empty pairs (`a,,b`, trailing `,`) and empty names.
///
/// ```
/// use ckalloc::caching::CachingSpec;
/// let spec: CachingSpec = " device_local = 1024mib ; 1gib ; 8 ".parse().unwrap();
/// assert_eq!(spec.to_string(), "device_local=1gib;1gib;8");
/// assert!("host_local=1GiB".parse::<CachingSpec>().is_err());
/// ```
///
/// Parse with `str::parse`; [`Display`](fmt::Display) prints the canonical
/// form (lowercase names, sizes in the largest exact binary unit, `*` for
/// defaults, trailing defaults dropped, pairs joined by `,`), which parses
/// back to an equal value.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CachingSpec {
    /// The pools, in spec order (at most [`MAX_POOLS`]).
    pub pools: Vec<PoolSpec>,
}

/// Whitespace as C's `isspace` (what IREE's trim uses).
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

fn trim(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Parses a strict size: `0` or digits without a leading zero, then an
/// optional lowercase suffix. `None` on any deviation or overflow.
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    let mult: u64 = match suffix {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => 1 << 10,
        "mb" => 1000 * 1000,
        "mib" => 1 << 20,
        "gb" => 1000 * 1000 * 1000,
        "gib" => 1 << 30,
        "tb" => 1000 * 1000 * 1000 * 1000,
        "tib" => 1 << 40,
        _ => return None,
    };
    let value = digits.parse::<u64>().ok()?.checked_mul(mult)?;
    usize::try_from(value).ok()?;
    Some(value)
}

fn parse_count(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse::<u32>().ok()
}

/// Writes a size in the largest exact binary unit (`64mib`), else bytes.
pub(crate) fn fmt_size(v: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("tib", 40), ("gib", 30), ("mib", 20), ("kib", 10)];
    if v != 0 {
        for (name, shift) in UNITS {
            if v.trailing_zeros() >= shift {
                return format!("{}{}", v >> shift, name);
            }
        }
    }
    v.to_string()
}

fn parse_side(
    side: &str,
    field: SpecField,
    err: &dyn Fn(SpecErrorKind, SpecField, &str) -> SpecError,
    table: &[(&str, u32)],
) -> Result<u32, SpecError> {
    let side = trim(side);
    if side.is_empty() {
        return Err(err(SpecErrorKind::EmptyName, field, side));
    }
    if side == "*" {
        return Ok(0);
    }
    let mut bits = 0;
    for name in side.split('|') {
        let name = trim(name);
        if name.is_empty() {
            return Err(err(SpecErrorKind::EmptyName, field, side));
        }
        match table.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            Some((_, b)) => bits |= b,
            None => return Err(err(SpecErrorKind::UnknownName, field, name)),
        }
    }
    Ok(bits)
}

fn parse_pair(index: usize, pair: &str) -> Result<PoolSpec, SpecError> {
    let err = |kind, field, text: &str| SpecError::new(kind, Some(index), pair, field, text);
    let (key, limits) = match pair.split_once('=') {
        Some((k, l)) => (k, Some(l)),
        None => (pair, None),
    };
    let key = trim(key);
    if key.is_empty() {
        return Err(err(SpecErrorKind::EmptyHeapKey, SpecField::HeapKey, key));
    }
    let (mt, usage) = match key.split_once(';') {
        Some((m, u)) => (m, Some(u)),
        None => (key, None),
    };
    let memory_type = MemoryType(parse_side(
        mt,
        SpecField::MemoryType,
        &err,
        &memory_type_table(),
    )?);
    let buffer_usage = match usage {
        Some(u) => BufferUsage(parse_side(
            u,
            SpecField::BufferUsage,
            &err,
            &buffer_usage_table(),
        )?),
        None => BufferUsage::NONE,
    };
    let mut spec = PoolSpec {
        heap_key: HeapKey {
            memory_type,
            buffer_usage,
        },
        ..PoolSpec::default()
    };
    if let Some(limits) = limits {
        let fields: Vec<&str> = limits.split(';').collect();
        if fields.len() > 3 {
            return Err(err(
                SpecErrorKind::TooManyFields,
                SpecField::Pair,
                trim(limits),
            ));
        }
        let is_default = |f: &str| f.is_empty() || f == "*";
        for (i, raw) in fields.iter().enumerate() {
            let f = trim(raw);
            if is_default(f) {
                continue;
            }
            match i {
                0 => {
                    spec.max_allocation_size = Some(parse_size(f).ok_or_else(|| {
                        err(SpecErrorKind::BadSize, SpecField::MaxAllocationSize, f)
                    })?)
                }
                1 => {
                    spec.max_allocation_capacity = Some(parse_size(f).ok_or_else(|| {
                        err(SpecErrorKind::BadSize, SpecField::MaxAllocationCapacity, f)
                    })?)
                }
                _ => {
                    spec.max_free_allocation_count = Some(parse_count(f).ok_or_else(|| {
                        err(
                            SpecErrorKind::BadCount,
                            SpecField::MaxFreeAllocationCount,
                            f,
                        )
                    })?)
                }
            }
        }
    }
    Ok(spec)
}

impl FromStr for CachingSpec {
    type Err = SpecError;

    /// Parses the grammar described on [`CachingSpec`]. An empty (or all
    /// whitespace) spec gives no pools, which means unbounded.
    fn from_str(s: &str) -> Result<CachingSpec, SpecError> {
        let mut pools = Vec::new();
        if trim(s).is_empty() {
            return Ok(CachingSpec { pools });
        }
        for (index, pair) in s.split(',').enumerate() {
            if index >= MAX_POOLS {
                return Err(SpecError::new(
                    SpecErrorKind::TooManyPools,
                    Some(index),
                    pair,
                    SpecField::Pair,
                    trim(pair),
                )
                .with_detail(format!("at most {MAX_POOLS} pools")));
            }
            pools.push(parse_pair(index, pair)?);
        }
        Ok(CachingSpec { pools })
    }
}

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.heap_key)?;
        let fields = [
            self.max_allocation_size.map(fmt_size),
            self.max_allocation_capacity.map(fmt_size),
            self.max_free_allocation_count.map(|c| c.to_string()),
        ];
        let last = fields.iter().rposition(Option::is_some);
        if let Some(last) = last {
            f.write_str("=")?;
            for (i, v) in fields[..=last].iter().enumerate() {
                if i > 0 {
                    f.write_str(";")?;
                }
                f.write_str(v.as_deref().unwrap_or("*"))?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for CachingSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.pools.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("1gib"), Some(1 << 30));
        assert_eq!(parse_size("2kb"), Some(2000));
        assert_eq!(parse_size("010"), None);
        assert_eq!(parse_size("1GiB"), None);
        assert_eq!(parse_size("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_size("18446744073709551616"), None);
        assert_eq!(parse_size("16777216tib"), None);
        assert_eq!(fmt_size(64 << 20), "64mib");
        assert_eq!(fmt_size(1000), "1000");
        assert_eq!(fmt_size(1536), "1536");
        assert_eq!(fmt_size(3 << 40), "3tib");
    }

    #[test]
    fn names_display() {
        assert_eq!(
            Heap::host().memory_type.to_string(),
            "host_local|device_local|host_cached"
        );
        let all: CachingSpec = format!("*;{}", BufferUsage::ALL).parse().unwrap();
        assert_eq!(all.pools[0].heap_key.buffer_usage, BufferUsage::ALL);
    }
}
