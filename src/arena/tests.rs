//! Bump logic over heap-backed storage (runs under Miri).

use super::BumpArena;
use allocator_api2::alloc::{Allocator, Layout};
use allocator_api2::vec::Vec;

#[test]
fn shared_bump_aligns_frees_last_and_grows_in_place() {
    let arena = BumpArena::heap_for_tests(1 << 16, 100);
    let a = &arena;
    let l8 = Layout::from_size_align(8, 8).unwrap();
    let p = a.allocate(l8).unwrap();
    assert_eq!(p.as_ptr().cast::<u8>() as usize % 8, 0);
    assert_eq!(arena.offset_of(p.as_ptr().cast()), Some(104));
    let q = a.allocate(Layout::from_size_align(3, 1).unwrap()).unwrap();
    assert_eq!(arena.offset_of(q.as_ptr().cast()), Some(112));
    // SAFETY: q is the most recent block.
    unsafe { a.deallocate(q.cast(), Layout::from_size_align(3, 1).unwrap()) };
    assert_eq!(arena.used(), 12);
    // Grow p in place: it is the most recent block again.
    // SAFETY: p is live with layout l8.
    let g = unsafe { a.grow(p.cast(), l8, Layout::from_size_align(64, 8).unwrap()) }.unwrap();
    assert_eq!(g.cast::<u8>(), p.cast::<u8>());
    assert_eq!(arena.used(), 68);
    assert_eq!(arena.high_water_mark(), 68);
}

#[test]
fn vec_and_local_arena_over_heap_storage() {
    let mut arena = BumpArena::heap_for_tests(1 << 20, 0);
    {
        let mut v: Vec<u64, _> = Vec::new_in(&arena);
        for i in 0..1000 {
            v.push(i);
        }
        assert_eq!(v.iter().sum::<u64>(), 999 * 1000 / 2);
        // Doubling growth in place: nothing but the final vector is used.
        assert_eq!(arena.used(), v.capacity() * 8);
    }
    let cp = arena.checkpoint();
    {
        let local = arena.local();
        let mut w: Vec<u8, _> = Vec::new_in(&local);
        w.extend(0..=255u8);
        assert_eq!(w[200], 200);
        let x = allocator_api2::boxed::Box::new_in(5u32, &local);
        assert_eq!(*x, 5);
    }
    arena.rewind_to(cp).unwrap();
    assert_eq!(arena.used(), cp.used());
    arena.reset();
    assert_eq!(arena.used(), 0);
    assert!(arena.high_water_mark() >= 8000);
}

#[test]
fn exhaustion_is_an_error() {
    let arena = BumpArena::heap_for_tests(4096, 0);
    let a = &arena;
    assert!(a
        .allocate(Layout::from_size_align(4097, 1).unwrap())
        .is_err());
    assert!(a
        .allocate(Layout::from_size_align(4096, 1).unwrap())
        .is_ok());
    assert!(a.allocate(Layout::from_size_align(1, 1).unwrap()).is_err());
    let local = arena.local();
    assert!((&local)
        .allocate(Layout::from_size_align(1, 1).unwrap())
        .is_err());
}

const L64: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// An arena on the same thread-chunk slot as `slot` (others built on the way
/// are kept alive in `keep`).
fn arena_on_slot(slot: usize, keep: &mut std::vec::Vec<BumpArena>) -> BumpArena {
    loop {
        let a = BumpArena::heap_for_tests(1 << 20, 0);
        if a.slot_for_tests() == slot {
            return a;
        }
        keep.push(a);
    }
}

fn off(arena: &BumpArena, p: std::ptr::NonNull<[u8]>) -> usize {
    arena.offset_of(p.as_ptr().cast::<u8>()).unwrap()
}

/// A dropped arena's chunk is never bumped again, even by an arena on the
/// same slot (whose memory may sit at the same address).
#[test]
fn dropped_arenas_chunk_is_not_reused() {
    let a = BumpArena::heap_for_tests(1 << 20, 0);
    let slot = a.slot_for_tests();
    assert_eq!(off(&a, (&a).allocate(L64).unwrap()), 0);
    drop(a);
    let mut keep = std::vec::Vec::new();
    let b = arena_on_slot(slot, &mut keep);
    assert_eq!(off(&b, (&b).allocate(L64).unwrap()), 0);
    assert_eq!(b.used(), 64);
}

/// Two live arenas on one slot: the second allocates through the shared
/// pointer (packed exactly) until it has missed `ADOPT_AFTER` times, then
/// takes the slot; every block stays disjoint and the abandoned chunk tails
/// are bounded.
#[test]
fn arenas_sharing_a_slot_stay_correct_and_bounded() {
    use super::shared::{ADOPT_AFTER, THREAD_SIZES};
    let a = BumpArena::heap_for_tests(1 << 20, 0);
    let mut keep = std::vec::Vec::new();
    let b = arena_on_slot(a.slot_for_tests(), &mut keep);
    // `a` holds the slot.
    let _ = (&a).allocate(L64).unwrap();
    for i in 0..ADOPT_AFTER as usize {
        let p = (&b).allocate(L64).unwrap();
        assert_eq!(off(&b, p), i * 64, "shared pointer, packed");
    }
    let n = if cfg!(miri) { 600 } else { 3000 };
    let mut blocks = std::vec::Vec::new();
    for i in 0..n {
        for (k, arena) in [&a, &b].into_iter().enumerate() {
            let p = arena.allocate(L64).unwrap().cast::<u8>();
            let tag = (i * 2 + k) as u8;
            // SAFETY: a fresh 64-byte block.
            unsafe { p.as_ptr().write_bytes(tag, 64) };
            blocks.push((p.as_ptr() as usize, tag));
        }
    }
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    for w in sorted.windows(2) {
        assert!(w[0].0 + 64 <= w[1].0, "overlap");
    }
    for &(p, tag) in &blocks {
        // SAFETY: every block is live and 64 bytes long.
        let s = unsafe { std::slice::from_raw_parts(p as *const u8, 64) };
        assert!(s.iter().all(|&x| x == tag));
    }
    let live = (2 * n + ADOPT_AFTER as usize + 1) * 64;
    // After a steal the chunk restarts at 16 KiB; ADOPT_AFTER blocks of 64
    // bytes (16 KiB) fit in two chunks, so each steal abandons < 32 KiB.
    let steals = 2 * n / ADOPT_AFTER as usize + 2;
    eprintln!("used {} + {} for {live} live bytes", a.used(), b.used());
    assert!(
        a.used() + b.used() <= live + steals * 2 * THREAD_SIZES.first,
        "used {} + {} for {live} live bytes",
        a.used(),
        b.used()
    );
}

// ---- cross-thread reuse, ordering, views --------------------------

use std::sync::atomic::Ordering::Relaxed;

const L16K: Layout = match Layout::from_size_align(16 << 10, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// A block written and freed on one thread, then handed out again on
/// another thread that never synchronised with the first, must not race:
/// the free has to publish the old writes (release) and the allocation
/// has to see them (acquire). Under Miri a `Relaxed` handover is reported
/// as a data race; natively (x86) this test cannot fail.
fn freed_block_reaches_other_thread_in_order(arena: &BumpArena) {
    let start = arena.cursor.load(Relaxed);
    // Fill this thread's first chunk exactly (or take one block from the
    // shared pointer): the block ends at the shared pointer.
    let p = (&arena).allocate(L16K).unwrap().cast::<u8>();
    assert_eq!(
        p.as_ptr() as usize + L16K.size(),
        arena.cursor.load(Relaxed)
    );
    let p = SendPtr(p);
    std::thread::scope(|s| {
        s.spawn(move || {
            let p = p;
            // SAFETY: a live 16 KiB block owned by this thread now.
            unsafe { p.0.as_ptr().write_bytes(0xAA, L16K.size()) };
            // SAFETY: allocated from `arena` with L16K, not used after.
            unsafe { (&arena).deallocate(p.0, L16K) };
        });
        s.spawn(move || {
            // Wait (without synchronising) until the block is free again.
            while arena.cursor.load(Relaxed) != start {
                std::thread::yield_now();
            }
            let q = (&arena).allocate(L64).unwrap().cast::<u8>();
            assert_eq!(q.as_ptr() as usize, start, "the freed block is reused");
            // SAFETY: a fresh 64-byte block.
            unsafe { q.as_ptr().write_bytes(0x55, 64) };
        });
    });
}

struct SendPtr(std::ptr::NonNull<u8>);
// SAFETY: test-only carrier of a block that moves to another thread.
unsafe impl Send for SendPtr {}

#[test]
fn cross_thread_free_then_reuse_is_ordered_thread_chunks() {
    let arena = BumpArena::heap_for_tests(1 << 17, 0);
    freed_block_reaches_other_thread_in_order(&arena);
}

#[test]
fn cross_thread_free_then_reuse_is_ordered_shared_pointer() {
    let mut arena = BumpArena::heap_for_tests(1 << 17, 0);
    arena.token = super::shared::NO_THREAD_CHUNKS;
    freed_block_reaches_other_thread_in_order(&arena);
}

/// The same through a [`LocalArena`](super::LocalArena) whose dropped
/// handle gives its chunk back: bytes it wrote into a freed block must be
/// ordered before the next owner's writes.
#[test]
fn local_arena_give_back_then_reuse_is_ordered() {
    let arena = BumpArena::heap_for_tests(1 << 17, 0);
    let start = arena.cursor.load(Relaxed);
    let arena = &arena;
    // Relaxed flag: signals without synchronising.
    let taken = &std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(move || {
            let local = arena.local();
            let p = (&local).allocate(L64).unwrap().cast::<u8>();
            taken.store(true, Relaxed);
            // SAFETY: a fresh 64-byte block.
            unsafe { p.as_ptr().write_bytes(0xAA, 64) };
            // SAFETY: the most recent block, allocated with L64.
            unsafe { (&local).deallocate(p, L64) };
            drop(local); // gives the whole chunk back
        });
        s.spawn(move || {
            // Wait until a chunk was taken and given back (without
            // synchronising).
            while !taken.load(Relaxed) || arena.cursor.load(Relaxed) != start {
                std::thread::yield_now();
            }
            let q = arena.allocate(L64).unwrap().cast::<u8>();
            assert_eq!(q.as_ptr() as usize, start);
            // SAFETY: a fresh 64-byte block.
            unsafe { q.as_ptr().write_bytes(0x55, 64) };
        });
    });
}

// ---- multi-thread stress with cross-thread free/grow/shrink -------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy)]
struct Blk {
    ptr: std::ptr::NonNull<u8>,
    addr: usize,
    layout: Layout,
    tag: u8,
}
// SAFETY: test-only: a block address moving between threads with its owner.
unsafe impl Send for Blk {}

fn fill(b: &Blk) {
    // SAFETY: a live block of `b.layout.size()` bytes owned by the caller.
    unsafe { b.ptr.as_ptr().write_bytes(b.tag, b.layout.size()) };
}

fn check(b: &Blk) {
    // SAFETY: as in `fill`.
    let s = unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.layout.size()) };
    if let Some(i) = s.iter().position(|&x| x != b.tag) {
        panic!(
            "block {:#x}+{} (tag {}) clobbered at +{i}: {}",
            b.addr,
            b.layout.size(),
            b.tag,
            s[i]
        );
    }
}

/// Live blocks of all threads, to catch overlaps the moment they are handed
/// out (the mutex orders the checks only).
struct Registry(std::sync::Mutex<std::collections::BTreeMap<usize, usize>>);
impl Registry {
    fn add(&self, b: &Blk) {
        let (a, e) = (b.addr, b.addr + b.layout.size());
        if a == e {
            return;
        }
        let mut m = self.0.lock().unwrap();
        if let Some((&pa, &pe)) = m.range(..e).next_back() {
            assert!(
                pe <= a || pa >= e,
                "overlap: {pa:#x}..{pe:#x} and {a:#x}..{e:#x}"
            );
        }
        m.insert(a, e);
    }
    fn remove(&self, b: &Blk) {
        if b.layout.size() > 0 {
            assert_eq!(
                self.0.lock().unwrap().remove(&b.addr),
                Some(b.addr + b.layout.size())
            );
        }
    }
}

fn random_layout(r: &mut Rng) -> Layout {
    // Miri checks every byte written: smaller blocks there.
    let scale = if cfg!(miri) { 16 } else { 1 };
    let size = match r.below(10) {
        0 => 0,
        1..=6 => r.below(200) as usize,
        7 | 8 => r.below(5000 / scale) as usize,
        _ => r.below(40_000 / scale) as usize,
    };
    let align = match r.below(10) {
        0 => 4096,
        1 => 1 << r.below(13),
        _ => 1 << r.below(4),
    };
    Layout::from_size_align(size, align).unwrap()
}

fn stress(arena: &BumpArena, threads: usize, ops: usize, seed: u64) -> usize {
    use std::sync::mpsc;
    let reg = Registry(std::sync::Mutex::new(Default::default()));
    let (lo, hi) = (arena.runtime_start(), arena.end);
    let (txs, rxs): (std::vec::Vec<_>, std::vec::Vec<_>) =
        (0..threads).map(|_| mpsc::channel::<Blk>()).unzip();
    let fails = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (t, rx) in rxs.into_iter().enumerate() {
            let next = txs[(t + 1) % threads].clone();
            let (reg, fails) = (&reg, &fails);
            s.spawn(move || {
                let a = arena;
                let mut r = Rng(seed + t as u64 * 7919 + 1);
                let mut mine: std::vec::Vec<Blk> = std::vec::Vec::new();
                // Blocks of `LocalArena` handles (dropped): kept to the end.
                let mut pinned: std::vec::Vec<Blk> = std::vec::Vec::new();
                let mut tag = (t as u8).wrapping_mul(37);
                for _ in 0..ops {
                    while let Ok(b) = rx.try_recv() {
                        check(&b);
                        mine.push(b);
                    }
                    tag = tag.wrapping_add(1);
                    match r.below(10) {
                        0..=2 => {
                            let layout = random_layout(&mut r);
                            match a.allocate(layout) {
                                Ok(p) => {
                                    let ptr = p.cast::<u8>();
                                    let addr = ptr.as_ptr() as usize;
                                    assert_eq!(p.len(), layout.size());
                                    assert_eq!(addr % layout.align(), 0);
                                    // A zero-size block that does not fit is dangling.
                                    assert!(
                                        (layout.size() == 0 && addr == layout.align())
                                            || (addr >= lo && addr + layout.size() <= hi)
                                    );
                                    let b = Blk {
                                        ptr,
                                        addr,
                                        layout,
                                        tag,
                                    };
                                    reg.add(&b);
                                    fill(&b);
                                    mine.push(b);
                                }
                                Err(_) => {
                                    fails.fetch_add(1, Relaxed);
                                }
                            }
                        }
                        4 | 5 if !mine.is_empty() => {
                            // Free the most recent block (often the last one
                            // of a chunk) or a random one.
                            let i = if r.below(2) == 0 {
                                mine.len() - 1
                            } else {
                                r.below(mine.len() as u64) as usize
                            };
                            let b = mine.swap_remove(i);
                            check(&b);
                            reg.remove(&b);
                            let p = b.ptr;
                            // SAFETY: a live block of `a` with this layout.
                            unsafe { a.deallocate(p, b.layout) };
                        }
                        6 | 7 if !mine.is_empty() => {
                            let i = if r.below(2) == 0 {
                                mine.len() - 1
                            } else {
                                r.below(mine.len() as u64) as usize
                            };
                            let b = mine[i];
                            check(&b);
                            let new = random_layout(&mut r);
                            let p = b.ptr;
                            reg.remove(&b);
                            // SAFETY: a live block of `a` with layout b.layout.
                            let res = unsafe {
                                if new.size() >= b.layout.size() {
                                    if r.below(2) == 0 {
                                        a.grow(p, b.layout, new)
                                    } else {
                                        a.grow_zeroed(p, b.layout, new)
                                    }
                                } else {
                                    a.shrink(p, b.layout, new)
                                }
                            };
                            match res {
                                Ok(q) => {
                                    let ptr = q.cast::<u8>();
                                    let addr = ptr.as_ptr() as usize;
                                    assert_eq!(q.len(), new.size());
                                    assert_eq!(addr % new.align(), 0);
                                    assert!(addr >= lo && addr + new.size() <= hi);
                                    // The kept prefix survived the move.
                                    let keep = b.layout.size().min(new.size());
                                    // SAFETY: the new block holds `keep` bytes.
                                    let s =
                                        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), keep) };
                                    assert!(s.iter().all(|&x| x == b.tag), "prefix lost");
                                    let nb = Blk {
                                        ptr,
                                        addr,
                                        layout: new,
                                        tag,
                                    };
                                    reg.add(&nb);
                                    fill(&nb);
                                    mine[i] = nb;
                                }
                                Err(_) => {
                                    reg.add(&b);
                                    fails.fetch_add(1, Relaxed);
                                }
                            }
                        }
                        3 => {
                            // A `LocalArena` burst on this thread, between
                            // this thread's `&BumpArena` blocks; the last
                            // block is sometimes freed through the handle.
                            let local = a.local();
                            let mut last = None;
                            for _ in 0..r.below(4) {
                                let layout = random_layout(&mut r);
                                if let Ok(p) = (&local).allocate(layout) {
                                    let ptr = p.cast::<u8>();
                                    let addr = ptr.as_ptr() as usize;
                                    assert_eq!(addr % layout.align(), 0);
                                    // A zero-size block that does not fit is dangling.
                                    assert!(
                                        (layout.size() == 0 && addr == layout.align())
                                            || (addr >= lo && addr + layout.size() <= hi)
                                    );
                                    let b = Blk {
                                        ptr,
                                        addr,
                                        layout,
                                        tag,
                                    };
                                    reg.add(&b);
                                    fill(&b);
                                    pinned.push(b);
                                    last = Some(b);
                                }
                            }
                            if let (Some(b), 0) = (last, r.below(2)) {
                                check(&b);
                                reg.remove(&b);
                                pinned.pop();
                                // SAFETY: the handle's most recent block.
                                unsafe { (&local).deallocate(b.ptr, b.layout) };
                            }
                        }
                        8 if !mine.is_empty() => {
                            let i = r.below(mine.len() as u64) as usize;
                            let b = mine.swap_remove(i);
                            // The next thread may have finished already.
                            if let Err(e) = next.send(b) {
                                mine.push(e.0);
                            }
                        }
                        _ => {
                            // Each figure is a snapshot (other threads move
                            // the shared pointer between two calls), but
                            // each stays in range.
                            assert!(a.used() <= hi - lo);
                            assert!(a.remaining() <= hi - lo);
                            assert!(a.high_water_mark() <= hi - lo);
                        }
                    }
                }
                for b in mine.iter().chain(&pinned) {
                    check(b);
                }
                mine
            });
        }
        drop(txs);
    });
    fails.into_inner()
}

/// Rounds of `stress` with a reset in between.
fn stress_rounds(arena: &mut BumpArena, rounds: u64, threads: usize, ops: usize) {
    for seed in 0..rounds {
        let fails = stress(arena, threads, ops, seed);
        let (used, hwm) = (arena.used(), arena.high_water_mark());
        eprintln!("round {seed}: {fails} failed, used {used}, high-water mark {hwm}");
        assert!(hwm >= used);
        arena.reset();
        assert_eq!(arena.used(), 0);
        assert_eq!(arena.high_water_mark(), hwm.max(used), "the peak stays");
    }
}

#[test]
fn stress_cross_thread_thread_chunks() {
    let (rounds, threads, ops) = if cfg!(miri) {
        (1, 3, 150)
    } else {
        (6, 4, 3000)
    };
    let mut arena = BumpArena::heap_for_tests(if cfg!(miri) { 4 << 20 } else { 64 << 20 }, 4096);
    stress_rounds(&mut arena, rounds, threads, ops);
}

#[test]
fn stress_cross_thread_shared_pointer() {
    let (rounds, threads, ops) = if cfg!(miri) {
        (1, 3, 150)
    } else {
        (6, 4, 3000)
    };
    let mut arena = BumpArena::heap_for_tests(if cfg!(miri) { 4 << 20 } else { 64 << 20 }, 4096);
    arena.token = super::shared::NO_THREAD_CHUNKS;
    stress_rounds(&mut arena, rounds, threads, ops);
}

/// A tight arena: exhaustion under contention is an error, never overlap.
#[test]
fn stress_cross_thread_tight_arena() {
    let (rounds, threads, ops) = if cfg!(miri) {
        (1, 3, 150)
    } else {
        (4, 4, 3000)
    };
    let mut arena = BumpArena::heap_for_tests(1 << 20, 0);
    stress_rounds(&mut arena, rounds, threads, ops);
}

// ---- single-thread invariants, parity, edge layouts ----------------

/// One thread, one op sequence: with and without thread chunks the blocks
/// land at the same offsets (exact packing), and `used() + remaining()` is
/// the runtime size, `high_water_mark() >= used()`, and the peak never
/// falls, after every operation.
#[test]
fn one_thread_matches_shared_pointer_exactly() {
    for runtime in [256 << 10, if cfg!(miri) { 1 << 20 } else { 16 << 20 }] {
        one_thread_parity(runtime);
    }
}

fn one_thread_parity(runtime: usize) {
    let on = BumpArena::heap_for_tests(runtime + 4096, 4096);
    let mut off_arena = BumpArena::heap_for_tests(runtime + 4096, 4096);
    off_arena.token = super::shared::NO_THREAD_CHUNKS;
    let mut r = Rng(12345);
    let mut live: [std::vec::Vec<(usize, Layout)>; 2] = Default::default();
    let mut peak = [0usize; 2];
    let n = if cfg!(miri) { 300 } else { 20_000 };
    for step in 0..n {
        let op = r.below(10);
        let layout = random_layout(&mut r);
        let pick = r.next();
        let mut offs = [None, None];
        for (k, arena) in [&on, &off_arena].into_iter().enumerate() {
            let live = &mut live[k];
            // (`offset_of` refuses the end, where a zero-size block may sit.)
            // (Wrapping: a zero-size block that does not fit is dangling,
            // below the arena.)
            let offset = |p: std::ptr::NonNull<[u8]>| {
                (p.cast::<u8>().as_ptr() as usize).wrapping_sub(arena.as_ptr() as usize)
            };
            let at = |o: usize| {
                std::ptr::NonNull::new(arena.as_ptr().wrapping_add(o).cast_mut()).unwrap()
            };
            match op {
                0..=4 => {
                    if let Ok(p) = arena.allocate(layout) {
                        offs[k] = Some(offset(p));
                        live.push((offset(p), layout));
                    }
                }
                5 | 6 if !live.is_empty() => {
                    let i = if pick.is_multiple_of(2) {
                        live.len() - 1
                    } else {
                        pick as usize % live.len()
                    };
                    let (o, l) = live.swap_remove(i);
                    let p = at(o);
                    // SAFETY: a live block with layout `l`.
                    unsafe { arena.deallocate(p, l) };
                }
                7 | 8 if !live.is_empty() => {
                    let i = if pick.is_multiple_of(2) {
                        live.len() - 1
                    } else {
                        pick as usize % live.len()
                    };
                    let (o, l) = live[i];
                    let p = at(o);
                    // SAFETY: a live block with layout `l`.
                    let res = unsafe {
                        if layout.size() >= l.size() {
                            arena.grow(p, l, layout)
                        } else {
                            arena.shrink(p, l, layout)
                        }
                    };
                    if let Ok(q) = res {
                        offs[k] = Some(offset(q));
                        live[i] = (offset(q), layout);
                    }
                }
                _ => {}
            }
            let (u, rem, hwm) = (arena.used(), arena.remaining(), arena.high_water_mark());
            assert_eq!(u + rem, runtime, "step {step}");
            assert!(hwm >= u, "step {step}");
            assert!(hwm >= peak[k], "step {step}: the peak fell");
            peak[k] = hwm;
        }
        assert_eq!(offs[0], offs[1], "step {step}: op {op} {layout:?}");
        assert_eq!(on.used(), off_arena.used(), "step {step}");
        assert_eq!(
            on.high_water_mark(),
            off_arena.high_water_mark(),
            "step {step}"
        );
    }
    eprintln!(
        "runtime {runtime}: used {} high-water mark {}",
        on.used(),
        on.high_water_mark()
    );
}

/// Zero-size and huge-alignment layouts: aligned, inside the arena (a
/// zero-size block may sit at its end, or dangle when its alignment does not
/// fit), and an impossible alignment of a sized block is an error, not a
/// wrap-around.
#[test]
fn zero_size_and_huge_alignment() {
    let arena = BumpArena::heap_for_tests(1 << 16, 100);
    let a = &arena;
    let base = arena.as_ptr() as usize;
    for align in [1usize, 8, 4096, 1 << 20, 1 << 40, 1 << 62] {
        let l = Layout::from_size_align(0, align).unwrap();
        if let Ok(p) = a.allocate(l) {
            let addr = p.cast::<u8>().as_ptr() as usize;
            assert_eq!(addr % align, 0);
            // Inside the arena, or dangling when the alignment does not fit.
            assert!(
                addr == align || (addr >= base + 100 && addr <= base + (1 << 16)),
                "{align}"
            );
            // SAFETY: allocated with `l`.
            unsafe { a.deallocate(p.cast(), l) };
        }
        let l = Layout::from_size_align(1, align).unwrap();
        if let Ok(p) = a.allocate(l) {
            let addr = p.cast::<u8>().as_ptr() as usize;
            assert_eq!(addr % align, 0);
            assert!(addr >= base + 100 && addr < base + (1 << 16), "{align}");
        } else {
            assert!(
                align > 1 << 16 || !base.is_multiple_of(align),
                "{align} should fit"
            );
        }
    }
    let big = Layout::from_size_align(isize::MAX as usize - (1 << 20) + 1, 1 << 20).unwrap();
    assert!(a.allocate(big).is_err());
    // Fill the arena, then zero-size blocks still work at the end.
    let rest = arena.remaining();
    let p = a
        .allocate(Layout::from_size_align(rest, 1).unwrap())
        .unwrap();
    // By address: the block ends at the arena's end, and with nothing
    // left (`rest` 0) `p` is the one-past-the-end pointer, which has no
    // offset.
    assert_eq!(p.cast::<u8>().as_ptr() as usize + rest, base + (1 << 16));
    assert_eq!(arena.remaining(), 0);
    let z = a.allocate(Layout::new::<()>()).unwrap();
    assert_eq!(z.cast::<u8>().as_ptr() as usize, base + (1 << 16));
    assert!(a.allocate(Layout::new::<u8>()).is_err());
}

/// A single thread gets every byte `remaining()` promises, in pieces of
/// any size, from `&BumpArena` and from a `LocalArena` alike.
#[test]
fn one_thread_can_allocate_all_that_remains() {
    for sizes in [
        &[1usize, 3, 7][..],
        &[5000, 1, 20_000],
        &[16 << 10],
        &[300_000],
    ] {
        let runtime = if cfg!(miri) { 6_000 } else { 1 << 20 };
        let arena = BumpArena::heap_for_tests(runtime + 123, 123);
        let mut i = 0;
        while arena.remaining() > 0 {
            let want = sizes[i % sizes.len()].min(arena.remaining());
            i += 1;
            let l = Layout::from_size_align(want, 1).unwrap();
            assert!(
                (&arena).allocate(l).is_ok(),
                "{want} of {} remaining",
                arena.remaining()
            );
            if i % 3 == 0 && arena.remaining() > 0 {
                let local = arena.local();
                let want = sizes[i % sizes.len()].min(arena.remaining());
                let l = Layout::from_size_align(want, 1).unwrap();
                assert!(
                    (&local).allocate(l).is_ok(),
                    "local: {want} of {}",
                    arena.remaining()
                );
            }
        }
        assert_eq!(arena.used(), runtime);
    }
}

// ---- per-thread views across threads, slot conflicts ---------------

/// A checkpoint taken on one thread and rewound on another with nothing
/// allocated in between is valid (it is with `thread_chunks(false)`). The
/// taker's view counts the rewinding thread's chunk tail, so the rewinding
/// thread sees it "above the bump pointer".
///
/// Fixing only the check (compare with the shared pointer) is not enough:
/// blocks this thread allocates after such a checkpoint land in its chunk
/// tail, below the checkpoint, and a rewind would not free them.
#[test]

fn checkpoint_from_another_thread_rewinds() {
    let mut arena = BumpArena::heap_for_tests(1 << 20, 0);
    let _ = (&arena).allocate(L64).unwrap();
    let cp = std::thread::scope(|s| s.spawn(|| arena.checkpoint()).join().unwrap());
    arena.rewind_to(cp).unwrap();
    assert!(arena.used() <= cp.used());
    // Blocks allocated after the checkpoint are freed by the rewind.
    let after = (&arena).allocate(L64).unwrap();
    arena.rewind_to(cp).unwrap();
    let again = (&arena).allocate(L64).unwrap();
    assert_eq!(
        off(&arena, again),
        off(&arena, after),
        "the rewind freed it"
    );
    arena.rewind_to(cp).unwrap();
    assert!(
        arena.used() <= cp.used(),
        "used {} > {}",
        arena.used(),
        cp.used()
    );
}

/// The high-water mark never falls, whichever thread reads it: a reset
/// records only the resetting thread's view, so a thread that saw the
/// other thread's chunk tail counted sees the peak drop.
#[test]

fn high_water_mark_never_falls_seen_from_another_thread() {
    let mut arena = BumpArena::heap_for_tests(1 << 20, 0);
    let _ = (&arena).allocate(L64).unwrap();
    let seen = std::thread::scope(|s| s.spawn(|| arena.high_water_mark()).join().unwrap());
    assert!(seen >= 64);
    arena.reset();
    let after = std::thread::scope(|s| s.spawn(|| arena.high_water_mark()).join().unwrap());
    assert!(after >= seen, "the peak fell from {seen} to {after}");
}

/// One thread: `remaining()` counts this thread's chunk tail as free, so a
/// `LocalArena` made on the same thread must reach it (it could not: a
/// request for what `remaining()` promised failed), and `&BumpArena` packs
/// on after the handle's blocks.
#[test]
fn local_arena_gets_what_remaining_promises() {
    let runtime = 1 << 20;
    let arena = BumpArena::heap_for_tests(runtime, 0);
    let _ = (&arena).allocate(L64).unwrap();
    let rest = arena.remaining();
    assert_eq!(rest, runtime - 64);
    let local = arena.local();
    let l = Layout::from_size_align(rest - 64, 1).unwrap();
    let p = (&local).allocate(l).unwrap();
    assert_eq!(
        off(&arena, p),
        64,
        "the local handle starts after the block"
    );
    drop(local);
    assert_eq!(arena.used(), runtime - 64);
    assert_eq!(off(&arena, (&arena).allocate(L64).unwrap()), runtime - 64);
    assert_eq!(arena.remaining(), 0);
    assert_eq!(arena.high_water_mark(), runtime);
}

/// A cross-thread free can move the shared pointer back into a thread's
/// full chunk; another thread then takes a chunk over the same range. A
/// block of that new chunk freed on the first thread ends at the first
/// thread's chunk cursor and passes its "most recent block" check, so the
/// first thread takes the freed block's range back. That range is free,
/// so no live block is handed out twice (the SAFETY argument holds, though
/// "the most recent block of its chunk" is not what is checked).
#[test]
fn free_attributed_to_another_threads_chunk_stays_disjoint() {
    let arena = BumpArena::heap_for_tests(1 << 20, 0);
    let arena = &arena;
    let half = Layout::from_size_align(8 << 10, 8).unwrap();
    let (tx_b, rx_b) = std::sync::mpsc::channel::<SendPtr>();
    let (tx_done, rx_done) = std::sync::mpsc::channel::<usize>();
    std::thread::scope(|s| {
        // Thread B: fills its first chunk with one block, which main frees.
        let b = s.spawn(move || {
            let b1 = arena.allocate(L16K).unwrap().cast::<u8>();
            tx_done.send(b1.as_ptr() as usize).unwrap();
            // Later: free a block of thread C's chunk here, then allocate.
            let c2 = rx_b.recv().unwrap();
            // SAFETY: C's live 8 KiB block, handed over.
            unsafe { arena.deallocate(c2.0, half) };
            let n = arena.allocate(half).unwrap().cast::<u8>();
            // SAFETY: a fresh 8 KiB block.
            unsafe { n.as_ptr().write_bytes(0xBB, half.size()) };
            n.as_ptr() as usize
        });
        let b1 = rx_done.recv().unwrap();
        let p = arena.ptr_at(b1 - arena.as_ptr() as usize).unwrap();
        // SAFETY: B's block, not used by B after sending it.
        unsafe { arena.deallocate(p, L16K) };
        assert_eq!(arena.cursor.load(Relaxed), b1, "moved back into B's chunk");
        // Thread C: a chunk over the same range, two 8 KiB blocks.
        let (c1, c2) = s
            .spawn(move || {
                let c1 = arena.allocate(half).unwrap().cast::<u8>();
                let c2 = arena.allocate(half).unwrap().cast::<u8>();
                // SAFETY: fresh 8 KiB blocks.
                unsafe { c1.as_ptr().write_bytes(0xC1, half.size()) };
                (c1.as_ptr() as usize, SendPtr(c2))
            })
            .join()
            .unwrap();
        assert_eq!(c1, b1);
        let c2_addr = c2.0.as_ptr() as usize;
        tx_b.send(c2).unwrap();
        let n = b.join().unwrap();
        assert_eq!(n, c2_addr, "B reuses the freed block's range");
        // C's live block is intact.
        // SAFETY: c1 is live (8 KiB).
        let c1s = unsafe { std::slice::from_raw_parts(p.as_ptr(), half.size()) };
        assert!(c1s.iter().all(|&x| x == 0xC1));
    });
}
