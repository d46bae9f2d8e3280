//! The pool specification parser (IREE's `--device_allocator=caching:<spec>`
//! form, parsed strictly) and its result, [`CachingSpec`].
//!
//! The grammar is documented once, on [`CachingSpec`].
//!
//! Unlike IREE's parser this one rejects what IREE silently misreads:
//! upper-case suffixes, trailing junk, fractions, signs, leading zeros,
//! values that overflow `u64`/`usize`, more than three limit fields and empty
//! pairs.

use std::fmt;
use std::str::FromStr;

use super::error::{SpecError, SpecErrorKind, SpecField};
use super::flags::{flag_named, BufferUsage, MemoryType};
use super::heap::HeapKey;
use crate::units::{self, SuffixCase};

/// Maximum number of pools in one caching allocator (IREE's limit).
pub const MAX_POOLS: usize = 16;

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
/// Pools are in priority order, at most [`MAX_POOLS`]; the empty spec is one
/// unbounded pool. Names are IREE's memory types ([`MemoryType`]) and buffer
/// usages ([`BufferUsage`]); `*` is the wildcard. The fields:
///
/// | field | unit / form | default | rejected (unlike IREE) |
/// | --- | --- | --- | --- |
/// | `max_allocation_size` | bytes: decimal and an optional `b kb kib mb mib gb gib tb tib` (lowercase; `kb` = 1000, `kib` = 1024) | the heap's maximum | `1GiB`, `8x`, `123fb`, `1.5gib`, `-1`, `010`, overflow of `u64`/`usize` |
/// | `max_allocation_capacity` | bytes, as above: live + cached bytes of the pool | unlimited | as above |
/// | `max_free_allocation_count` | a decimal `u32`: blocks kept on the pool's free list | 64 ([`DEFAULT_MAX_FREE_ALLOCATION_COUNT`](super::DEFAULT_MAX_FREE_ALLOCATION_COUNT)) | suffixes, signs, leading zeros, more than `u32::MAX` |
/// | memory type (left of `;` in the key) | `*` or names joined by `\|`: `host_local device_local host_visible host_coherent host_cached device_visible optimal` | `*` | unknown or empty names, `*` mixed with names |
/// | buffer usage (right of `;`) | `*` or names joined by `\|`: `transfer[_source/_target] dispatch dispatch_storage[_read/_write] dispatch_image[_read/_write] dispatch_indirect_params dispatch_uniform_read sharing_{export,replicate,concurrent,immutable} mapping mapping_{scoped,persistent,optional,access_random,access_sequential_write}` | `*` | as above |
///
/// Fields are trimmed; an empty field or `*` keeps the default, and missing
/// trailing fields keep theirs. Also rejected, unlike IREE: a fourth limit
/// field, empty pairs (`a,,b`, trailing `,`) and empty names.
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

/// Parses a strict size (the syntax of `crate::units::parse_size`, suffix
/// in lowercase).
fn parse_size(s: &str) -> Option<u64> {
    units::parse_size(s.as_bytes(), SuffixCase::Lower).ok()
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

/// Parses one side of a heap key: `*` or IREE names joined by `|`.
fn parse_side<F: bitflags::Flags + Copy>(
    side: &str,
    field: SpecField,
    err: &dyn Fn(SpecErrorKind, SpecField, &str) -> SpecError,
) -> Result<F, SpecError> {
    let side = trim(side);
    if side.is_empty() {
        return Err(err(SpecErrorKind::EmptyName, field, side));
    }
    if side == "*" {
        return Ok(F::empty());
    }
    let mut set = F::empty();
    for name in side.split('|') {
        let name = trim(name);
        if name.is_empty() {
            return Err(err(SpecErrorKind::EmptyName, field, side));
        }
        match flag_named::<F>(name) {
            Some(flag) => set = set.union(flag),
            None if name == "*" => return Err(err(SpecErrorKind::WildcardWithNames, field, side)),
            None => return Err(err(SpecErrorKind::UnknownName, field, name)),
        }
    }
    Ok(set)
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
    let memory_type = parse_side::<MemoryType>(mt, SpecField::MemoryType, &err)?;
    let buffer_usage = match usage {
        Some(u) => parse_side::<BufferUsage>(u, SpecField::BufferUsage, &err)?,
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
    use crate::caching::Heap;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1gib"), Some(1 << 30));
        assert_eq!(parse_size("1GiB"), None);
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
