//! Fuzz the caching spec parser: never panics; accepted specs round-trip
//! through `Display`; a reference parser written independently here (byte
//! scanning, its own name tables and bit values) agrees on acceptance, the
//! error kind, and every parsed value.
#![no_main]

use allocator_api2::alloc::Global;
use ckalloc::caching::{CachingAllocator, CachingSpec, SpecErrorKind};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct RefPool {
    mem: u32,
    usage: u32,
    size: Option<u64>,
    cap: Option<u64>,
    count: Option<u32>,
}

const MEM: &[(&str, u32)] = &[
    ("optimal", 0x1),
    ("host_visible", 0x2),
    ("host_coherent", 0x4),
    ("host_cached", 0x8),
    ("host_local", 0x46),
    ("device_visible", 0x10),
    ("device_local", 0x30),
];

const USAGE: &[(&str, u32)] = &[
    ("transfer_source", 0x1),
    ("transfer_target", 0x2),
    ("transfer", 0x3),
    ("dispatch_indirect_params", 0x100),
    ("dispatch_uniform_read", 0x200),
    ("dispatch_storage_read", 0x400),
    ("dispatch_storage_write", 0x800),
    ("dispatch_storage", 0xC00),
    ("dispatch_image_read", 0x1000),
    ("dispatch_image_write", 0x2000),
    ("dispatch_image", 0x3000),
    ("dispatch", 0x3F00),
    ("sharing_export", 0x1_0000),
    ("sharing_replicate", 0x2_0000),
    ("sharing_concurrent", 0x4_0000),
    ("sharing_immutable", 0x8_0000),
    ("mapping_scoped", 0x100_0000),
    ("mapping_persistent", 0x200_0000),
    ("mapping_optional", 0x400_0000),
    ("mapping_access_random", 0x800_0000),
    ("mapping_access_sequential_write", 0x1000_0000),
    ("mapping", 0x900_0000),
];

fn ws(b: u8) -> bool {
    b == b' ' || (0x09..=0x0d).contains(&b)
}

fn strip(s: &[u8]) -> &[u8] {
    let mut a = 0;
    let mut z = s.len();
    while a < z && ws(s[a]) {
        a += 1;
    }
    while z > a && ws(s[z - 1]) {
        z -= 1;
    }
    &s[a..z]
}

/// Splits on every occurrence of `sep`.
fn pieces(s: &[u8], sep: u8) -> Vec<&[u8]> {
    let mut out = vec![];
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        if b == sep {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out
}

fn lower(s: &[u8]) -> Vec<u8> {
    s.iter().map(|b| b.to_ascii_lowercase()).collect()
}

fn names(side: &[u8], table: &[(&str, u32)]) -> Result<u32, SpecErrorKind> {
    let side = strip(side);
    if side.is_empty() {
        return Err(SpecErrorKind::EmptyName);
    }
    if side == b"*" {
        return Ok(0);
    }
    let mut bits = 0;
    for n in pieces(side, b'|') {
        let n = strip(n);
        if n.is_empty() {
            return Err(SpecErrorKind::EmptyName);
        }
        if n == b"*" {
            return Err(SpecErrorKind::WildcardWithNames);
        }
        let n = lower(n);
        bits |= table
            .iter()
            .find(|(t, _)| t.as_bytes() == &n[..])
            .ok_or(SpecErrorKind::UnknownName)?
            .1;
    }
    Ok(bits)
}

/// Digits by hand with u128 accumulation, then the suffix table.
fn size(f: &[u8]) -> Option<u64> {
    let n = f.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 || (n > 1 && f[0] == b'0') {
        return None;
    }
    let mut v: u128 = 0;
    for &d in &f[..n] {
        v = v * 10 + u128::from(d - b'0');
        if v > u128::from(u64::MAX) {
            return None;
        }
    }
    let m: u128 = match &f[n..] {
        b"" | b"b" => 1,
        b"kb" => 1_000,
        b"kib" => 1_024,
        b"mb" => 1_000_000,
        b"mib" => 1_048_576,
        b"gb" => 1_000_000_000,
        b"gib" => 1_073_741_824,
        b"tb" => 1_000_000_000_000,
        b"tib" => 1_099_511_627_776,
        _ => return None,
    };
    let r = v * m;
    (r <= u128::from(u64::MAX) && r <= usize::MAX as u128).then_some(r as u64)
}

fn count(f: &[u8]) -> Option<u32> {
    if f.is_empty() || !f.iter().all(u8::is_ascii_digit) || (f.len() > 1 && f[0] == b'0') {
        return None;
    }
    let mut v: u64 = 0;
    for &d in f {
        v = v * 10 + u64::from(d - b'0');
        if v > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(v as u32)
}

fn reference(s: &[u8]) -> Result<Vec<RefPool>, SpecErrorKind> {
    if strip(s).is_empty() {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for (i, pair) in pieces(s, b',').into_iter().enumerate() {
        if i == 16 {
            return Err(SpecErrorKind::TooManyPools);
        }
        let eq = pair.iter().position(|&b| b == b'=');
        let (key, limits) = match eq {
            Some(p) => (&pair[..p], Some(&pair[p + 1..])),
            None => (pair, None),
        };
        let key = strip(key);
        if key.is_empty() {
            return Err(SpecErrorKind::EmptyHeapKey);
        }
        let semi = key.iter().position(|&b| b == b';');
        let (m, u) = match semi {
            Some(p) => (&key[..p], Some(&key[p + 1..])),
            None => (key, None),
        };
        let mem = names(m, MEM)?;
        let usage = match u {
            Some(u) => names(u, USAGE)?,
            None => 0,
        };
        let mut p = RefPool {
            mem,
            usage,
            size: None,
            cap: None,
            count: None,
        };
        if let Some(lim) = limits {
            let f = pieces(lim, b';');
            if f.len() > 3 {
                return Err(SpecErrorKind::TooManyFields);
            }
            let get = |i: usize| {
                f.get(i)
                    .map(|x| strip(x))
                    .filter(|x| !x.is_empty() && *x != b"*")
            };
            if let Some(x) = get(0) {
                p.size = Some(size(x).ok_or(SpecErrorKind::BadSize)?);
            }
            if let Some(x) = get(1) {
                p.cap = Some(size(x).ok_or(SpecErrorKind::BadSize)?);
            }
            if let Some(x) = get(2) {
                p.count = Some(count(x).ok_or(SpecErrorKind::BadCount)?);
            }
        }
        out.push(p);
    }
    Ok(out)
}

fn flatten(spec: &CachingSpec) -> Vec<RefPool> {
    spec.pools
        .iter()
        .map(|p| RefPool {
            mem: p.heap_key.memory_type.bits(),
            usage: p.heap_key.buffer_usage.bits(),
            size: p.max_allocation_size,
            cap: p.max_allocation_capacity,
            count: p.max_free_allocation_count,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        // Non-UTF-8 cannot reach the parser; the reference must not panic either.
        let _ = reference(data);
        return;
    };
    let ours = text.parse::<CachingSpec>();
    let theirs = reference(data);
    match (&ours, &theirs) {
        (Ok(spec), Ok(r)) => {
            assert_eq!(&flatten(spec), r, "values differ for {text:?}");
            let shown = spec.to_string();
            let again: CachingSpec = shown
                .parse()
                .unwrap_or_else(|e| panic!("canonical {shown:?} of {text:?} rejected: {e}"));
            assert_eq!(&again, spec, "round trip of {text:?} via {shown:?}");
            assert_eq!(again.to_string(), shown);
            // Every accepted spec builds over the default host heap.
            CachingAllocator::from_spec(Global, text).expect("host heap satisfies every key");
        }
        (Err(e), Err(k)) => {
            assert_eq!(e.kind(), *k, "error kind for {text:?}: {e}");
            let _ = e.to_string();
        }
        _ => panic!("parsers disagree on {text:?}: ours {ours:?}, reference {theirs:?}"),
    }
});
