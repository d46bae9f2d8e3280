//! Two threads sharing one pool (and blocks freed on the other thread): no
//! block is handed out twice, none is lost, contents survive, and the
//! statistics balance at the end.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{mpsc, Mutex};

use crate::common::caching::Counting;
use allocator_api2::alloc::Allocator;
use ckalloc::caching::CachingAllocator;

const OPS: usize = if cfg!(miri) { 60 } else { 20_000 };
// Miri checks every byte it fills and compares: keep blocks small there.
const SIZES: [usize; 4] = if cfg!(miri) {
    [16, 64, 256, 1024]
} else {
    [64, 256, 4096, 24 * 1024]
};

/// A live block of the shared pool: its address, its size (allocated with
/// `Layout::from_size_align(size, 8)`) and the byte it is filled with. Whoever
/// holds the `Block` owns the block; [`check_and_free`] consumes it.
struct Block(NonNull<u8>, usize, u8);
// SAFETY: a `Block` is the only handle to its bytes, and the caching
// allocator (`Sync`) may free a block on any thread, so moving the handle to
// the thread that frees it is sound.
unsafe impl Send for Block {}

/// Live ranges over both threads: inserting an overlapping range fails the test.
struct Registry(Mutex<BTreeMap<usize, usize>>);
impl Registry {
    fn insert(&self, addr: usize, len: usize) {
        let mut m = self.0.lock().unwrap();
        if let Some((&a, &l)) = m.range(..=addr).next_back() {
            assert!(
                a + l <= addr,
                "block {addr:#x} overlaps live block {a:#x}+{l}"
            );
        }
        if let Some((&a, _)) = m.range(addr..).next() {
            assert!(
                addr + len <= a,
                "block {addr:#x}+{len} overlaps live block {a:#x}"
            );
        }
        m.insert(addr, len);
    }
    fn remove(&self, addr: usize) {
        assert!(self.0.lock().unwrap().remove(&addr).is_some());
    }
}

fn check_and_free(c: &CachingAllocator<&Counting>, reg: &Registry, b: Block) {
    let Block(p, size, tag) = b;
    // SAFETY: `b` owns a live block of `size` bytes, all written with `tag`
    // when it was allocated; no one else reads or writes it.
    let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
    assert!(
        bytes.iter().all(|&x| x == tag),
        "block contents changed while live"
    );
    reg.remove(p.as_ptr() as usize);
    // SAFETY: the block came from `c` with this layout and `b` was its only
    // handle, consumed here, so it is freed once; `bytes` is not used after.
    unsafe { c.deallocate(p, Layout::from_size_align(size, 8).unwrap()) };
}

#[test]
fn two_threads_one_pool_no_lost_or_shared_blocks() {
    let inner = Counting::new();
    let c = CachingAllocator::from_spec(&inner, "*=*;*;32").unwrap();
    let reg = Registry(Mutex::new(BTreeMap::new()));
    let (tx0, rx1) = mpsc::channel::<Block>();
    let (tx1, rx0) = mpsc::channel::<Block>();
    std::thread::scope(|s| {
        for (t, (tx, rx)) in [(tx0, rx0), (tx1, rx1)].into_iter().enumerate() {
            let (c, reg) = (&c, &reg);
            s.spawn(move || {
                let mut mine: Vec<Block> = Vec::new();
                let mut x = 0x9E37_79B9u32 ^ t as u32;
                for i in 0..OPS {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    // Free blocks the other thread sent us.
                    while let Ok(b) = rx.try_recv() {
                        check_and_free(c, reg, b);
                    }
                    if mine.len() < 8 && !x.is_multiple_of(3) {
                        let size = SIZES[(x as usize >> 4) % SIZES.len()];
                        let tag = (t * 100 + i % 100) as u8;
                        let p = c
                            .allocate(Layout::from_size_align(size, 8).unwrap())
                            .unwrap();
                        reg.insert(p.cast::<u8>().as_ptr() as usize, p.len());
                        let p = p.cast::<u8>();
                        // SAFETY: a fresh block of at least `size` bytes.
                        unsafe { p.as_ptr().write_bytes(tag, size) };
                        mine.push(Block(p, size, tag));
                    } else if !mine.is_empty() {
                        let b = mine.swap_remove(x as usize % mine.len());
                        if x.is_multiple_of(5) {
                            let _ = tx.send(b); // the other thread frees it
                        } else {
                            check_and_free(c, reg, b);
                        }
                    }
                }
                for b in mine {
                    check_and_free(c, reg, b);
                }
                drop(tx);
                // Drain what the other thread still sends until it hangs up.
                for b in rx.iter() {
                    check_and_free(c, reg, b);
                }
            });
        }
    });
    let s = c.stats();
    assert_eq!(s.live_bytes, 0, "{s}");
    assert_eq!(s.pools[0].live_bytes, 0);
    assert_eq!(
        inner.live_blocks() as u64,
        s.cached_blocks,
        "every block is cached or returned"
    );
    assert!(s.cached_blocks <= 32);
    assert_eq!(s.hits + s.misses, s.pools[0].hits + s.pools[0].misses);
    assert!(s.hits > 0);
    c.trim();
    assert_eq!(inner.live_blocks(), 0);
    let s = c.stats();
    assert_eq!((s.cached_blocks, s.cached_bytes), (0, 0));
}

#[test]
fn concurrent_capacity_is_never_exceeded() {
    let inner = Counting::new();
    let unit = if cfg!(miri) { 256 } else { 4096 };
    let cap = 16 * unit as u64;
    let c = CachingAllocator::from_spec(&inner, &format!("*=*;{cap};8")).unwrap();
    std::thread::scope(|s| {
        for t in 0..2usize {
            let c = &c;
            s.spawn(move || {
                let mut held = Vec::new();
                for i in 0..OPS / 4 {
                    let size = unit * (1 + (i + t) % 6);
                    let l = Layout::from_size_align(size, 8).unwrap();
                    held.push((c.allocate(l).unwrap().cast::<u8>(), l));
                    if held.len() > 4 {
                        let (p, l) = held.remove(0);
                        // SAFETY: `held` holds live blocks of `c` with their
                        // layouts; removed from it, this one is freed once.
                        unsafe { c.deallocate(p, l) };
                    }
                    let p = c.stats().pools[0].peak_bytes;
                    assert!(p <= cap, "pool peak {p} over capacity");
                }
                for (p, l) in held {
                    // SAFETY: as above, each block left in `held` once.
                    unsafe { c.deallocate(p, l) };
                }
            });
        }
    });
    let s = c.stats();
    assert!(s.pools[0].peak_bytes <= cap);
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.pools[0].cached_bytes, s.cached_bytes);
    drop(c);
    assert_eq!(inner.live_blocks(), 0);
}
