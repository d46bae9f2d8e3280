//! Statistics snapshots ([`CacheStats`], [`PoolStats`]) and their summary table.

use std::fmt;

use super::spec::fmt_size;

/// ShardCounters of one pool. All sizes are in bytes of blocks as allocated from
/// the inner allocator (after rounding).
///
/// Each counter is exact; a snapshot taken while other threads allocate may
/// mix counters from slightly different moments, and is consistent once the
/// allocator is quiescent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The pool's index in spec order.
    pub index: usize,
    /// The pool's `max_allocation_size` in bytes.
    pub max_allocation_size: u64,
    /// The pool's `max_allocation_capacity` in bytes (`u64::MAX` = unlimited).
    pub max_allocation_capacity: u64,
    /// The pool's `max_free_allocation_count`.
    pub max_free_allocation_count: u32,
    /// Requests served from a cached block.
    pub hits: u64,
    /// Requests served by a new pooled block from the inner allocator.
    pub misses: u64,
    /// Requests this pool chose but served unpooled (over its capacity).
    pub bypasses: u64,
    /// Cached blocks returned to the inner allocator to make room under the capacity.
    pub evictions: u64,
    /// Cached blocks returned to the inner allocator by `trim`/`trim_to`/drop.
    pub trimmed: u64,
    /// Bytes of pooled blocks currently handed out.
    pub live_bytes: u64,
    /// Bytes of blocks in the pool's free lists.
    pub cached_bytes: u64,
    /// Number of blocks in the pool's free lists.
    pub cached_blocks: u64,
    /// High-water mark of `live_bytes + cached_bytes`.
    pub peak_bytes: u64,
    /// Failed inner allocation calls made for this pool.
    pub inner_failures: u64,
}

/// Totals over the whole caching allocator plus one [`PoolStats`] per pool.
///
/// Totals include unpooled blocks (bypasses): `live_bytes` counts them,
/// `bypasses` counts requests no pool took plus the pools' bypasses, and
/// `peak_bytes` is the high-water mark of all bytes held from the inner
/// allocator (live + cached).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Requests served from a cached block.
    pub hits: u64,
    /// Requests served by a new pooled block from the inner allocator.
    pub misses: u64,
    /// Requests served unpooled (no pool matched, or a pool was over capacity).
    pub bypasses: u64,
    /// Cached blocks freed to make room under a pool's capacity.
    pub evictions: u64,
    /// Cached blocks freed by `trim`/`trim_to`/drop.
    pub trimmed: u64,
    /// Bytes currently handed out (pooled and unpooled).
    pub live_bytes: u64,
    /// Bytes in free lists.
    pub cached_bytes: u64,
    /// Blocks in free lists.
    pub cached_blocks: u64,
    /// High-water mark of bytes held from the inner allocator (live + cached).
    pub peak_bytes: u64,
    /// Failed inner allocation calls (each call counts, retries included).
    pub inner_failures: u64,
    /// Per-pool counters in spec order.
    pub pools: Vec<PoolStats>,
}

fn lim(v: u64) -> String {
    if v == u64::MAX || v == isize::MAX as u64 {
        "*".to_owned()
    } else {
        fmt_size(v)
    }
}

fn bytes(v: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if v >= unit {
            let whole = v / unit;
            let tenths = (v % unit) * 10 / unit;
            return format!("{whole}.{tenths} {name}");
        }
    }
    format!("{v} B")
}

impl fmt::Display for CacheStats {
    /// A fixed-width summary table in the spirit of PyTorch's `memory_summary`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = "=".repeat(112);
        writeln!(f, "{rule}")?;
        writeln!(f, " ckalloc caching allocator summary")?;
        writeln!(f, "{rule}")?;
        let requests = self.hits + self.misses + self.bypasses;
        let rate = if requests == 0 {
            0.0
        } else {
            self.hits as f64 * 100.0 / requests as f64
        };
        writeln!(
            f,
            " requests {requests:>10} | hits {:>10} ({rate:5.1}%) | misses {:>10} | bypasses {:>10}",
            self.hits, self.misses, self.bypasses
        )?;
        writeln!(
            f,
            " live {:>14} | cached {:>12} in {:>6} blocks | peak {:>12} | evictions {:>6}",
            bytes(self.live_bytes),
            bytes(self.cached_bytes),
            self.cached_blocks,
            bytes(self.peak_bytes),
            self.evictions
        )?;
        writeln!(
            f,
            " trimmed blocks {:>6} | inner failures {:>6}",
            self.trimmed, self.inner_failures
        )?;
        writeln!(f, "{}", "-".repeat(112))?;
        writeln!(
            f,
            " {:>4} {:>9} {:>9} {:>5} | {:>8} {:>8} {:>8} {:>6} | {:>11} {:>11} {:>6} {:>11}",
            "pool",
            "max_size",
            "capacity",
            "count",
            "hits",
            "misses",
            "bypass",
            "evict",
            "live",
            "cached",
            "blocks",
            "peak"
        )?;
        for p in &self.pools {
            writeln!(
                f,
                " {:>4} {:>9} {:>9} {:>5} | {:>8} {:>8} {:>8} {:>6} | {:>11} {:>11} {:>6} {:>11}",
                p.index,
                lim(p.max_allocation_size),
                lim(p.max_allocation_capacity),
                p.max_free_allocation_count,
                p.hits,
                p.misses,
                p.bypasses,
                p.evictions,
                bytes(p.live_bytes),
                bytes(p.cached_bytes),
                p.cached_blocks,
                bytes(p.peak_bytes)
            )?;
        }
        write!(f, "{rule}")
    }
}
