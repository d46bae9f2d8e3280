//! Multi-threaded stress: 1 M mixed operations (allocate, free, grow,
//! shrink) on `&BumpArena` (shared and `LocalArena` handles) and on
//! `&CachingAllocator<CkHuge>`, once with as many threads as cores and once
//! with 8 threads (more threads than cores on a 2-core machine). Every block
//! is filled with a pattern naming its thread and sequence number and
//! checked before it is released or resized; at the end every live block is
//! checked, no two overlap, none is lost, and the statistics balance.
//!
//! `CKALLOC_STRESS_OPS` overrides the operation count per run (default
//! 1 000 000; Miri uses 500). About 5 s in debug on 2 cores,
//! a few seconds with `cargo test --release --test stress`.

mod common;
use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::caching::{CachingAllocator, RoundUp};
use ckalloc::{huge_stats, BumpArena, CkHuge};
use common::serial;
use std::ptr::NonNull;

const MIB: usize = 1 << 20;

fn total_ops() -> usize {
    std::env::var("CKALLOC_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(miri) { 500 } else { 1_000_000 })
}

fn thread_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut v = vec![cores];
    if cores != 8 {
        v.push(8);
    }
    v
}

/// xorshift64: deterministic per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A live block: where, its layout, and the id its bytes carry.
#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    id: u64,
}
// SAFETY: blocks are plain addresses handed back to the test's main thread
// after the worker that owns them has finished.
unsafe impl Send for Block {}

fn tag(id: u64) -> u8 {
    (id ^ (id >> 8) ^ (id >> 16) ^ (id >> 40)) as u8 | 1
}

/// Fill: every byte the tag; the first and last 8 bytes (when the block
/// holds 16) the id itself, so an overlap with any other block shows.
fn fill(ptr: NonNull<u8>, len: usize, id: u64) {
    // SAFETY: the caller owns `len` bytes at `ptr`.
    unsafe {
        ptr.as_ptr().write_bytes(tag(id), len);
        if len >= 16 {
            ptr.as_ptr().cast::<u64>().write_unaligned(id);
            ptr.as_ptr().add(len - 8).cast::<u64>().write_unaligned(id);
        }
    }
}

/// Check the first `len` bytes of a block filled by `fill(_, filled, id)`.
fn check(ptr: NonNull<u8>, len: usize, filled: usize, id: u64, what: &str) {
    // SAFETY: the caller owns at least `len <= filled` bytes at `ptr`.
    let s = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
    let t = tag(id);
    let idb = id.to_ne_bytes();
    let (head, tail) = if filled >= 16 {
        (8, filled - 8)
    } else {
        (0, filled)
    };
    let expected = |at: usize| {
        if at < head {
            idb[at]
        } else if at >= tail {
            idb[at - tail]
        } else {
            t
        }
    };
    let fail = |at: usize| -> ! {
        panic!(
            "{what}: block {id:#x} byte {at} of {len} is {:#x}, expected {:#x}",
            s[at],
            expected(at)
        )
    };
    for at in (0..head.min(len)).chain(tail.min(len)..len) {
        if s[at] != expected(at) {
            fail(at);
        }
    }
    // The middle in chunks (memcmp: fast in debug builds too).
    let pattern = [t; 256];
    let mut off = head.min(len);
    let end = tail.min(len);
    while off < end {
        let n = (end - off).min(256);
        if s[off..off + n] != pattern[..n] {
            let bad = (off..off + n).find(|&k| s[k] != t).unwrap_or(off);
            fail(bad);
        }
        off += n;
    }
}

/// The operations one thread runs; `A` is the allocator handle it uses.
fn worker<A: Allocator>(
    a: &A,
    thread: usize,
    ops: usize,
    sizes: &dyn Fn(&mut Rng) -> Layout,
) -> (Vec<Block>, u64) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((thread as u64 + 1) << 32));
    let mut live: Vec<Block> = Vec::new();
    let mut seq = 0u64;
    let mut allocations = 0u64;
    let next_id = |seq: &mut u64| {
        *seq += 1;
        ((thread as u64) << 48) | *seq
    };
    for _ in 0..ops {
        let r = rng.below(100);
        if live.is_empty() || (r < 45 && live.len() < 256) {
            let layout = sizes(&mut rng);
            let p = a.allocate(layout).expect("allocate").cast::<u8>();
            assert_eq!(p.as_ptr() as usize % layout.align(), 0, "alignment");
            allocations += 1;
            let id = next_id(&mut seq);
            fill(p, layout.size(), id);
            live.push(Block { ptr: p, layout, id });
        } else if r < 80 {
            // Free a random block (often the most recent one, which a bump
            // allocator can take back).
            let i = if rng.below(2) == 0 {
                live.len() - 1
            } else {
                rng.below(live.len() as u64) as usize
            };
            let b = live.swap_remove(i);
            check(b.ptr, b.layout.size(), b.layout.size(), b.id, "free");
            // SAFETY: allocated by `a` with this layout, not used again.
            unsafe { a.deallocate(b.ptr, b.layout) };
        } else if r < 90 {
            let i = live.len() - 1;
            let b = live[i];
            check(b.ptr, b.layout.size(), b.layout.size(), b.id, "grow");
            let extra = rng.below(2048) as usize + 1;
            let new = Layout::from_size_align(b.layout.size() + extra, b.layout.align()).unwrap();
            // SAFETY: live block of `a` with this layout; new >= old.
            let q = unsafe { a.grow(b.ptr, b.layout, new) }
                .expect("grow")
                .cast::<u8>();
            check(q, b.layout.size(), b.layout.size(), b.id, "after grow");
            let id = next_id(&mut seq);
            fill(q, new.size(), id);
            live[i] = Block {
                ptr: q,
                layout: new,
                id,
            };
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let b = live[i];
            check(b.ptr, b.layout.size(), b.layout.size(), b.id, "shrink");
            let size = b.layout.size() / 2 + 1;
            let new = Layout::from_size_align(size, b.layout.align()).unwrap();
            // SAFETY: live block of `a` with this layout; new <= old.
            let q = unsafe { a.shrink(b.ptr, b.layout, new) }
                .expect("shrink")
                .cast::<u8>();
            check(q, size, b.layout.size(), b.id, "after shrink");
            let id = next_id(&mut seq);
            fill(q, size, id);
            live[i] = Block {
                ptr: q,
                layout: new,
                id,
            };
        }
    }
    (live, allocations)
}

/// Sort all live blocks, check they are disjoint, inside `bounds` when
/// given, and hold their pattern.
fn check_all(blocks: &mut [Block], bounds: Option<(usize, usize)>) {
    blocks.sort_unstable_by_key(|b| b.ptr.as_ptr() as usize);
    for w in blocks.windows(2) {
        let (a, b) = (w[0], w[1]);
        assert!(
            a.ptr.as_ptr() as usize + a.layout.size() <= b.ptr.as_ptr() as usize,
            "live blocks overlap: {a:x?} and {b:x?}"
        );
    }
    for b in blocks.iter() {
        if let Some((lo, hi)) = bounds {
            let p = b.ptr.as_ptr() as usize;
            assert!(p >= lo && p + b.layout.size() <= hi, "{b:x?} outside");
        }
        check(b.ptr, b.layout.size(), b.layout.size(), b.id, "end");
    }
}

fn small_sizes(rng: &mut Rng) -> Layout {
    let size = rng.below(if cfg!(miri) { 64 } else { 600 }) as usize + 1;
    let align = 1usize << rng.below(7);
    Layout::from_size_align(size, align).unwrap()
}

#[test]
#[cfg_attr(
    miri,
    ignore = "the arena maps with madvise and PROT_NONE, which Miri lacks"
)]
fn bump_arena_mixed_ops_many_threads() {
    let _g = serial();
    let ops = total_ops();
    // Four rounds with a reset in between bound the memory touched.
    let rounds = 4;
    let total = if cfg!(miri) { 8 * MIB } else { 512 * MIB };
    // Per-thread chunks behind `&BumpArena` (the default), then one shared
    // compare-and-swap per allocation.
    for thread_chunks in [true, false] {
        bump_arena_rounds(ops, rounds, total, thread_chunks);
    }
}

fn bump_arena_rounds(ops: usize, rounds: usize, total: usize, thread_chunks: bool) {
    let mut arena = BumpArena::builder(total)
        .activations_base(4096)
        .thread_chunks(thread_chunks)
        .build()
        .unwrap();
    let lo = arena.as_ptr() as usize + 4096;
    let hi = arena.as_ptr() as usize + total;
    let mut hwm = 0;
    for threads in thread_counts() {
        for _round in 0..rounds {
            let per_thread = ops / rounds / threads;
            let arena_ref = &arena;
            let mut blocks: Vec<Block> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        s.spawn(move || {
                            // Odd threads bump in a LocalArena, even ones
                            // on the shared pointer.
                            if t % 2 == 1 {
                                let local = arena_ref.local();
                                let (live, _) = worker(&&local, t, per_thread, &small_sizes);
                                // Blocks stay valid after the handle drops.
                                drop(local);
                                live
                            } else {
                                worker(&arena_ref, t, per_thread, &small_sizes).0
                            }
                        })
                    })
                    .collect();
                hs.into_iter()
                    .flat_map(|h| h.join().expect("worker panicked"))
                    .collect()
            });
            check_all(&mut blocks, Some((lo, hi)));
            let live_bytes: usize = blocks.iter().map(|b| b.layout.size()).sum();
            let used = arena.used();
            assert!(used >= live_bytes, "used {used} < live {live_bytes}");
            assert_eq!(used + arena.remaining(), total - 4096);
            assert!(arena.high_water_mark() >= used);
            assert!(arena.high_water_mark() >= hwm, "the high-water mark fell");
            hwm = arena.high_water_mark();
            eprintln!(
                "arena (thread chunks {thread_chunks}), {threads} threads: {} live blocks ({live_bytes} bytes), used {used}, high-water mark {hwm}",
                blocks.len()
            );
            drop(blocks);
            arena.reset();
            assert_eq!(arena.used(), 0);
            assert_eq!(arena.remaining(), total - 4096);
            assert_eq!(arena.high_water_mark(), hwm, "reset keeps the mark");
        }
    }
}

#[test]
fn caching_over_ckhuge_mixed_ops_many_threads() {
    let _g = serial();
    let ops = total_ops();
    let huge_before = huge_stats().live_bytes;
    // Small blocks in a bounded pool, mid-size in a second, and everything
    // bigger (the CkHuge mapping path, >= 2 MiB) bypasses the cache.
    // Rounding to quarter powers of two makes blocks come back from the free
    // lists often, which is where a block handed out twice would show.
    let c = CachingAllocator::builder(CkHuge::new())
        .spec(
            "*=4kib;8mib;64,*=1536kib;64mib;32,*=8mib;64mib;4"
                .parse()
                .unwrap(),
        )
        .round_up(RoundUp::PowerOfTwoDivisions(4))
        .build()
        .unwrap();
    let sizes = |rng: &mut Rng| {
        let r = rng.below(1000);
        let size = if cfg!(miri) {
            rng.below(256) as usize + 1
        } else if r < 2 {
            // Mapped by CkHuge: 2..6 MiB.
            2 * MIB + rng.below(4 * MIB as u64) as usize
        } else if r < 40 {
            4096 + rng.below(128 << 10) as usize
        } else {
            rng.below(4096) as usize + 1
        };
        let align = 1usize << rng.below(7);
        Layout::from_size_align(size, align).unwrap()
    };
    let mut allocations = 0;
    for threads in thread_counts() {
        let per_thread = ops / threads;
        let c_ref = &c;
        let (mut blocks, n): (Vec<Block>, u64) = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| s.spawn(move || worker(&c_ref, t, per_thread, &sizes)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("worker panicked"))
                .fold((Vec::new(), 0), |(mut v, n), (l, k)| {
                    v.extend(l);
                    (v, n + k)
                })
        });
        allocations += n;
        check_all(&mut blocks, None);
        let st = c.stats();
        eprintln!(
            "caching, {threads} threads: {} live blocks; {st}",
            blocks.len()
        );
        let live: u64 = blocks.iter().map(|b| b.layout.size() as u64).sum();
        assert!(
            st.live_bytes >= live,
            "stats live {} < blocks {live}",
            st.live_bytes
        );
        for b in blocks {
            // SAFETY: live blocks of `c` with their layouts.
            unsafe { c.deallocate(b.ptr, b.layout) };
        }
        let st = c.stats();
        assert_eq!(st.live_bytes, 0, "every block was returned: {st}");
        assert_eq!(st.inner_failures, 0, "{st}");
        assert!(st.hits + st.misses + st.bypasses >= allocations, "{st}");
        for (p, params) in st.pools.iter().zip(c.pool_params()) {
            assert!(p.cached_bytes <= params.max_allocation_capacity, "{st}");
            assert!(p.cached_blocks <= u64::from(params.max_free_allocation_count));
            assert_eq!(p.live_bytes, 0);
        }
    }
    c.trim();
    let st = c.stats();
    assert_eq!((st.cached_bytes, st.cached_blocks), (0, 0), "{st}");
    assert!(st.hits > 0 && st.misses > 0, "{st}");
    drop(c);
    assert_eq!(
        huge_stats().live_bytes,
        huge_before,
        "every CkHuge mapping was unmapped"
    );
}

#[test]
fn the_pattern_check_notices_a_changed_byte() {
    for len in [1usize, 15, 16, 17, 300, 600] {
        for at in [0, len / 2, len - 1] {
            let mut buf = vec![0u8; len];
            let p = NonNull::new(buf.as_mut_ptr()).unwrap();
            fill(p, len, 0x0001_0000_0000_0042);
            check(p, len, len, 0x0001_0000_0000_0042, "self-test");
            // SAFETY: `at < len`; through `p`, which the check reads.
            unsafe { *p.as_ptr().add(at) ^= 0x80 };
            let r = std::panic::catch_unwind(|| check(p, len, len, 0x0001_0000_0000_0042, "x"));
            assert!(r.is_err(), "len {len}: change at {at} not seen");
        }
    }
}
