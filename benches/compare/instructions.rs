//! Instruction counts (callgrind, through gungraun) of the hot paths, next to
//! the peers a user would otherwise pick.
//!
//! Run with `cargo bench -p ckalloc-benches --bench instructions` (needs
//! valgrind and `cargo install gungraun-runner --version 0.20.0 --locked`).
//!
//! Each benchmark sets its state up, then calls one `#[inline(never)]`
//! function `op_*` exactly once; the callgrind entry point is that function,
//! so the count is exactly one operation (its body and `ret`), without the
//! set-up, the harness or `black_box` overhead. "hidden" variants take the
//! [`Layout`] as a run-time argument (as `Vec::push` sees it through a
//! non-inlined `RawVec::grow`); "known" variants use a constant layout.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ops::DerefMut;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator};
use ckalloc::caching::CachingAllocator;
use ckalloc::{BumpArena, CkHuge, LocalArena};
use gungraun::{
    library_benchmark, library_benchmark_group, main, Callgrind, EntryPoint, LibraryBenchmarkConfig,
};

type Block = Result<NonNull<[u8]>, AllocError>;

const L64: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};
const L128: Layout = match Layout::from_size_align(128, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};
const MIB4: Layout = match Layout::from_size_align(4 << 20, 64) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// Count only the given `op_*` function (inclusive of what it calls).
fn only(op: &str) -> LibraryBenchmarkConfig {
    let mut c = LibraryBenchmarkConfig::default();
    c.tool(Callgrind::default().entry_point(EntryPoint::Custom(format!("instructions::{op}"))));
    c
}

fn arena() -> &'static BumpArena {
    Box::leak(Box::new(BumpArena::builder(64 << 20).build().unwrap()))
}

/// An arena whose thread chunk is set up: the first allocation through
/// `&BumpArena` takes this thread's chunk from the shared pointer.
fn shared() -> &'static BumpArena {
    let a = arena();
    black_box(a.allocate(L64).unwrap());
    a
}

fn local() -> &'static LocalArena<'static> {
    let l = Box::leak(Box::new(arena().local()));
    // The first allocation takes a chunk from the shared pointer.
    black_box((&*l).allocate(L64).unwrap());
    l
}

fn bumpalo() -> &'static bumpalo::Bump {
    let b = Box::leak(Box::new(bumpalo::Bump::with_capacity(1 << 20)));
    black_box((&*b).allocate(L64).unwrap());
    b
}

fn bump_scope() -> &'static bump_scope::Bump {
    let b = Box::leak(Box::new(bump_scope::Bump::with_capacity(
        L64.pad_to_align(),
    )));
    let b: &'static bump_scope::Bump = b;
    black_box(
        b.allocate(Layout::from_size_align(1 << 20, 8).unwrap())
            .unwrap(),
    );
    // A fresh chunk so the measured allocation fits.
    let b2 = Box::leak(Box::new(bump_scope::Bump::with_capacity(
        Layout::from_size_align(1 << 20, 8).unwrap(),
    )));
    black_box(b2.allocate(L64).unwrap());
    b2
}

// ---- bump allocation ----------------------------------------------------

macro_rules! alloc_ops {
    ($known:ident, $hidden:ident, $grow:ident, $t:ty) => {
        #[inline(never)]
        fn $known(a: $t) -> Block {
            a.allocate(L64)
        }
        #[inline(never)]
        fn $hidden(a: $t, l: Layout) -> Block {
            a.allocate(l)
        }
        #[inline(never)]
        unsafe fn $grow(a: $t, p: NonNull<u8>, old: Layout, new: Layout) -> Block {
            // SAFETY: `p` is the caller's live block of layout `old`.
            unsafe { a.grow(p, old, new) }
        }
    };
}

alloc_ops!(
    op_local_known,
    op_local_hidden,
    op_local_grow,
    &&LocalArena<'static>
);
alloc_ops!(
    op_shared_known,
    op_shared_hidden,
    op_shared_grow,
    &&BumpArena
);
alloc_ops!(
    op_bumpalo_known,
    op_bumpalo_hidden,
    op_bumpalo_grow,
    &&bumpalo::Bump
);
alloc_ops!(
    op_bump_scope_known,
    op_bump_scope_hidden,
    op_bump_scope_grow,
    &bump_scope::Bump
);

#[library_benchmark(config = only("op_local_known"))]
fn local_known() -> Block {
    let a = local();
    black_box(op_local_known(black_box(&a)))
}
#[library_benchmark(config = only("op_local_hidden"))]
fn local_hidden() -> Block {
    let a = local();
    black_box(op_local_hidden(black_box(&a), black_box(L64)))
}
/// `&LocalArena` itself in a register (the allocator handle inlined into the
/// caller), rather than loaded through the `&&LocalArena` that
/// `Allocator::allocate(&self)` receives from a `Vec` that stores the handle.
#[inline(never)]
fn op_local_hidden_reg(a: &LocalArena<'static>, l: Layout) -> Block {
    (&a).allocate(l)
}

#[library_benchmark(config = only("op_local_hidden_reg"))]
fn local_hidden_reg() -> Block {
    let a = local();
    black_box(op_local_hidden_reg(black_box(a), black_box(L64)))
}

#[library_benchmark(config = only("op_local_grow"))]
fn local_grow() -> Block {
    let a = local();
    let p = (&a).allocate(L64).unwrap();
    // SAFETY: `p` was just allocated with L64.
    black_box(unsafe { op_local_grow(black_box(&a), p.cast(), black_box(L64), black_box(L128)) })
}

#[library_benchmark(config = only("op_shared_known"))]
fn shared_known() -> Block {
    let a = shared();
    black_box(op_shared_known(black_box(&a)))
}
#[library_benchmark(config = only("op_shared_hidden"))]
fn shared_hidden() -> Block {
    let a = shared();
    black_box(op_shared_hidden(black_box(&a), black_box(L64)))
}
#[library_benchmark(config = only("op_shared_grow"))]
fn shared_grow() -> Block {
    let a = shared();
    let p = a.allocate(L64).unwrap();
    // SAFETY: `p` was just allocated with L64.
    black_box(unsafe { op_shared_grow(black_box(&a), p.cast(), black_box(L64), black_box(L128)) })
}

#[library_benchmark(config = only("op_bumpalo_known"))]
fn bumpalo_known() -> Block {
    let a = bumpalo();
    black_box(op_bumpalo_known(black_box(&a)))
}
#[library_benchmark(config = only("op_bumpalo_hidden"))]
fn bumpalo_hidden() -> Block {
    let a = bumpalo();
    black_box(op_bumpalo_hidden(black_box(&a), black_box(L64)))
}
#[library_benchmark(config = only("op_bumpalo_grow"))]
fn bumpalo_grow() -> Block {
    let a = bumpalo();
    let p = a.allocate(L64).unwrap();
    // SAFETY: `p` was just allocated with L64.
    black_box(unsafe { op_bumpalo_grow(black_box(&a), p.cast(), black_box(L64), black_box(L128)) })
}

#[library_benchmark(config = only("op_bump_scope_known"))]
fn bump_scope_known() -> Block {
    let a = bump_scope();
    black_box(op_bump_scope_known(black_box(a)))
}
#[library_benchmark(config = only("op_bump_scope_hidden"))]
fn bump_scope_hidden() -> Block {
    let a = bump_scope();
    black_box(op_bump_scope_hidden(black_box(a), black_box(L64)))
}
#[library_benchmark(config = only("op_bump_scope_grow"))]
fn bump_scope_grow() -> Block {
    let a = bump_scope();
    let p = a.allocate(L64).unwrap();
    // SAFETY: `p` was just allocated with L64.
    black_box(unsafe {
        op_bump_scope_grow(black_box(a), p.cast(), black_box(L64), black_box(L128))
    })
}

library_benchmark_group!(
    name = bump,
    benchmarks = [
        local_known,
        local_hidden,
        local_hidden_reg,
        local_grow,
        shared_known,
        shared_hidden,
        shared_grow,
        bumpalo_known,
        bumpalo_hidden,
        bumpalo_grow,
        bump_scope_known,
        bump_scope_hidden,
        bump_scope_grow
    ]
);

// ---- caching allocator and CkHuge ---------------------------------------

#[inline(never)]
fn op_cache_hit(c: &CachingAllocator<CkHuge>, l: Layout) {
    let p = c.allocate(l).unwrap();
    // SAFETY: `p` was just allocated from `c` with `l`.
    unsafe { c.deallocate(p.cast(), l) };
}

#[library_benchmark(config = only("op_cache_hit"))]
fn cache_hit_4mib() -> u64 {
    let c = CachingAllocator::unbounded(CkHuge::new());
    // Put one 4 MiB block in the cache and warm the calling thread's state.
    for _ in 0..2 {
        let p = c.allocate(MIB4).unwrap();
        // SAFETY: just allocated with MIB4.
        unsafe { c.deallocate(p.cast(), MIB4) };
    }
    op_cache_hit(black_box(&c), black_box(MIB4));
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (2, 1));
    s.hits
}

#[inline(never)]
fn op_ckhuge_retained(a: &CkHuge, l: Layout) {
    // SAFETY: non-zero size.
    let p = unsafe { GlobalAlloc::alloc(a, l) };
    assert!(!p.is_null());
    // SAFETY: just allocated from `a` with `l`.
    unsafe { GlobalAlloc::dealloc(a, p, l) };
}

#[library_benchmark(config = only("op_ckhuge_retained"))]
fn ckhuge_retained_4mib() -> u64 {
    let a = CkHuge::new();
    // Put one 4 MiB block in the retention cache and warm the thread's state.
    for _ in 0..2 {
        // SAFETY: non-zero size; freed with its layout.
        unsafe { GlobalAlloc::dealloc(&a, GlobalAlloc::alloc(&a, MIB4), MIB4) };
    }
    op_ckhuge_retained(black_box(&a), black_box(MIB4));
    let s = ckalloc::huge_stats();
    assert_eq!((s.retention_hits, s.retention_misses), (2, 1));
    s.retention_hits
}

#[inline(never)]
fn op_ckhuge_small(a: &CkHuge, l: Layout) {
    let p = a.allocate(l).unwrap();
    // SAFETY: `p` was just allocated from `a` with `l`.
    unsafe { a.deallocate(p.cast(), l) };
}

#[inline(never)]
fn op_system_small(l: Layout) {
    // SAFETY: non-zero size.
    let p = unsafe { System.alloc(l) };
    assert!(!p.is_null());
    // SAFETY: just allocated with `l`.
    unsafe { System.dealloc(p, l) };
}

#[library_benchmark(config = only("op_ckhuge_small"))]
fn ckhuge_small_64() {
    let a = CkHuge::new();
    // Warm malloc's arena (not through `op_*`: every call of it is counted).
    let p = a.allocate(L64).unwrap();
    // SAFETY: just allocated with L64.
    unsafe { a.deallocate(p.cast(), L64) };
    op_ckhuge_small(black_box(&a), black_box(L64));
}

#[library_benchmark(config = only("op_system_small"))]
fn system_small_64() {
    // SAFETY: warm-up outside `op_*`; non-zero size, freed with its layout.
    unsafe { System.dealloc(System.alloc(L64), L64) };
    op_system_small(black_box(L64));
}

library_benchmark_group!(
    name = caching,
    benchmarks = [
        cache_hit_4mib,
        ckhuge_retained_4mib,
        ckhuge_small_64,
        system_small_64
    ]
);

// ---- pool lock variants --------------------------------------------------
// The lock traffic of a cache hit and its release (two uncontended critical
// sections with the hot counter updates) under each lock the pool lock is
// measured against (the `compare` bench, row 7).

#[derive(Default)]
struct ShardModel {
    top: Option<usize>,
    hits: u64,
    live_bytes: u64,
    cached_bytes: u64,
}

macro_rules! lock_bench {
    ($op:ident, $bench:ident, $t:ty, $lock:ident) => {
        #[inline(never)]
        fn $op(shard: &$t) {
            const SIZE: u64 = 4 << 20;
            let block = {
                let mut s = $lock(shard);
                s.hits = s.hits.wrapping_add(1);
                s.live_bytes = s.live_bytes.wrapping_add(SIZE);
                s.cached_bytes = s.cached_bytes.wrapping_sub(SIZE);
                s.top.take()
            };
            let block = black_box(block).or(Some(1 << 21));
            let mut s = $lock(shard);
            s.top = block;
            s.live_bytes = s.live_bytes.wrapping_sub(SIZE);
            s.cached_bytes = s.cached_bytes.wrapping_add(SIZE);
        }

        #[library_benchmark(config = only(stringify!($op)))]
        fn $bench() {
            let shard = <$t>::default();
            $op(black_box(&shard));
        }
    };
}

type SpinShard = ckalloc::caching::PoolLock<ShardModel>;
type StdShard = std::sync::Mutex<ShardModel>;
type ParkingLotShard = parking_lot::Mutex<ShardModel>;

#[inline(always)]
fn lock_spin(l: &SpinShard) -> impl DerefMut<Target = ShardModel> + '_ {
    l.lock()
}
#[inline(always)]
fn lock_std(l: &StdShard) -> impl DerefMut<Target = ShardModel> + '_ {
    l.lock().unwrap()
}
#[inline(always)]
fn lock_parking_lot(l: &ParkingLotShard) -> impl DerefMut<Target = ShardModel> + '_ {
    l.lock()
}

lock_bench!(op_pool_lock, lock_pool_lock, SpinShard, lock_spin);
lock_bench!(op_std_mutex, lock_std_mutex, StdShard, lock_std);
lock_bench!(
    op_parking_lot_mutex,
    lock_parking_lot_mutex,
    ParkingLotShard,
    lock_parking_lot
);

library_benchmark_group!(
    name = pool_lock,
    benchmarks = [lock_pool_lock, lock_std_mutex, lock_parking_lot_mutex]
);

main!(library_benchmark_groups = bump, caching, pool_lock);
