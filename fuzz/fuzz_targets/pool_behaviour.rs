//! Fuzz the caching allocator with arbitrary allocate / deallocate / grow /
//! shrink / trim sequences (and injected inner failures) against a model:
//! no overlapping live blocks, contents preserved, limits never exceeded,
//! the exact block the model predicts is reused, and the statistics equal
//! the model's after every step.
//!
//! The inner allocator has a byte budget ([`INNER_BUDGET`], 8 MiB): a request that
//! would take it past the budget fails, as a real heap runs out. Without it,
//! a run of `Grow` ops under power-of-two rounding doubles one block again
//! and again while the pool keeps every old block, and the process goes past
//! libFuzzer's memory limit. With it, such a run exercises the caching
//! allocator's trim-and-retry on an inner failure, which the model predicts.
#![no_main]

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global};
use arbitrary::Arbitrary;
use ckalloc::caching::{CachingAllocator, CachingSpec, RoundUp};
use libfuzzer_sys::fuzz_target;

// ---------------------------------------------------------------- inner ----

/// Bytes the inner allocator hands out at most at one time (8 MiB): far
/// below libFuzzer's default 2 GiB RSS limit even with AddressSanitizer's
/// overhead, and far above what one op asks for (an `Alloc` at most 300 KiB,
/// a `Grow` at most 64 KiB more than the block it grows). Small enough that
/// filling and checking every live block after each op stays fast.
const INNER_BUDGET: u64 = 8 << 20;

/// Global with injectable failures and a byte budget; checks every block
/// comes back with the layout it was allocated with.
#[derive(Default)]
struct Inner {
    fail: Cell<u32>,
    bytes: Cell<u64>,
    live: RefCell<HashMap<usize, Layout>>,
}

unsafe impl Allocator for Inner {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self.fail.get() > 0 {
            self.fail.set(self.fail.get() - 1);
            return Err(AllocError);
        }
        let size = layout.size() as u64;
        if self.bytes.get() + size > INNER_BUDGET {
            return Err(AllocError);
        }
        let p = Global.allocate(layout)?;
        self.bytes.set(self.bytes.get() + size);
        self.live
            .borrow_mut()
            .insert(p.cast::<u8>().as_ptr() as usize, layout);
        Ok(p)
    }
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let was = self.live.borrow_mut().remove(&(ptr.as_ptr() as usize));
        assert_eq!(was, Some(layout), "block returned with a different layout");
        self.bytes.set(self.bytes.get() - layout.size() as u64);
        unsafe { Global.deallocate(ptr, layout) }
    }
}

// ---------------------------------------------------------------- input ----

#[derive(Arbitrary, Debug)]
struct PoolCfg {
    max_size: Option<u8>, // KiB
    cap: Option<u8>,      // KiB
    count: Option<u8>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        class: u8,
        raw: u16,
        align: u8,
        zeroed: bool,
    },
    Free {
        idx: u8,
    },
    Grow {
        idx: u8,
        extra: u16,
        zeroed: bool,
    },
    Shrink {
        idx: u8,
        less: u16,
    },
    Trim,
    TrimTo {
        kib: u8,
    },
    FailNext {
        n: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    pools: Vec<PoolCfg>,
    round: u8,
    ops: Vec<Op>,
}

// ---------------------------------------------------------------- model ----

#[derive(Clone, Copy, Debug)]
struct Cached {
    addr: usize,
    layout: Layout,
    seq: u64,
}

#[derive(Default, Debug, Clone)]
struct MPool {
    max_size: u64,
    cap: u64,
    count: u64,
    round: Option<u32>,
    free: Vec<Cached>, // oldest first
    committed: u64,
    live: u64,
    hits: u64,
    misses: u64,
    bypasses: u64,
    evictions: u64,
    trimmed: u64,
    peak: u64,
    failures: u64,
}

#[derive(Clone, Copy, Debug)]
struct Live {
    block: Layout,       // as allocated from the inner allocator
    pool: Option<usize>, // None = unpooled
    user: Layout,        // what the caller holds (for deallocate)
    len: usize,          // returned length
    tag: u8,
}

#[derive(Default)]
struct Model {
    pools: Vec<MPool>,
    seq: u64,
    no_pool_bypasses: u64,
    no_pool_failures: u64,
    unpooled_live: u64,
    held: u64,
    peak: u64,
    fail: u32,
}

fn round(r: Option<u32>, size: usize) -> usize {
    match r {
        None => size,
        Some(n) => RoundUp::PowerOfTwoDivisions(n).apply(size),
    }
}

impl Model {
    fn pool_for(&self, size: usize) -> Option<usize> {
        self.pools.iter().position(|p| size as u64 <= p.max_size)
    }
    fn cached_total(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|p| &p.free)
            .map(|c| c.layout.size() as u64)
            .sum()
    }
    fn drop_cached(&mut self, pi: usize, c: Cached) -> Cached {
        let p = &mut self.pools[pi];
        p.committed -= c.layout.size() as u64;
        self.held -= c.layout.size() as u64;
        c
    }
    /// Trim oldest-first across pools until at most `bytes` stay cached.
    fn trim_to(&mut self, bytes: u64) {
        while self.cached_total() > bytes {
            let (pi, _) = self
                .pools
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.free.first().map(|c| (i, c.seq)))
                .min_by_key(|&(_, s)| s)
                .unwrap();
            let c = self.pools[pi].free.remove(0);
            self.pools[pi].trimmed += 1;
            self.drop_cached(pi, c);
        }
    }
    /// Mirrors one inner allocation of `bytes` with retry; returns whether it
    /// succeeds. An injected failure comes first; then the budget decides,
    /// counted over `held` (every byte taken from the inner allocator).
    fn inner_call(&mut self, pool: Option<usize>, bytes: u64) -> bool {
        for attempt in 0..2 {
            if self.fail > 0 {
                self.fail -= 1;
            } else if self.held + bytes > INNER_BUDGET {
                // Over the budget: the inner allocator refuses.
            } else {
                return true;
            }
            match pool {
                Some(pi) => self.pools[pi].failures += 1,
                None => self.no_pool_failures += 1,
            }
            if attempt == 0 {
                self.trim_to(0);
            }
        }
        false
    }
    /// Predicts an allocation: Err(()) = failure, Ok((hit address, live)).
    fn alloc(&mut self, user: Layout) -> Result<(Option<usize>, Live), ()> {
        let size = user.size();
        let Some(pi) = self.pool_for(size) else {
            return self.unpooled(user, None);
        };
        let b = round(self.pools[pi].round, size);
        let p = &mut self.pools[pi];
        if let Some(pos) = p
            .free
            .iter()
            .rposition(|c| c.layout.size() == b && c.addr % user.align() == 0)
        {
            let c = p.free.remove(pos);
            p.hits += 1;
            p.live += b as u64;
            return Ok((
                Some(c.addr),
                Live {
                    block: c.layout,
                    pool: Some(pi),
                    user,
                    len: b,
                    tag: 0,
                },
            ));
        }
        let block = Layout::from_size_align(b, user.align()).unwrap();
        // Reserve capacity, evicting oldest first when that can make room.
        if b as u64 > p.cap {
            return self.unpooled(user, Some(pi));
        }
        loop {
            let p = &mut self.pools[pi];
            if p.committed + b as u64 <= p.cap {
                p.committed += b as u64;
                break;
            }
            if p.live + b as u64 > p.cap {
                return self.unpooled(user, Some(pi));
            }
            let c = p.free.remove(0);
            p.evictions += 1;
            self.drop_cached(pi, c);
        }
        if !self.inner_call(Some(pi), b as u64) {
            self.pools[pi].committed -= b as u64;
            return Err(());
        }
        let p = &mut self.pools[pi];
        p.misses += 1;
        p.live += b as u64;
        p.peak = p.peak.max(p.committed);
        self.held += b as u64;
        self.peak = self.peak.max(self.held);
        Ok((
            None,
            Live {
                block,
                pool: Some(pi),
                user,
                len: b,
                tag: 0,
            },
        ))
    }
    fn unpooled(&mut self, user: Layout, pool: Option<usize>) -> Result<(Option<usize>, Live), ()> {
        if !self.inner_call(pool, user.size() as u64) {
            return Err(());
        }
        match pool {
            Some(pi) => self.pools[pi].bypasses += 1,
            None => self.no_pool_bypasses += 1,
        }
        self.unpooled_live += user.size() as u64;
        self.held += user.size() as u64;
        self.peak = self.peak.max(self.held);
        Ok((
            None,
            Live {
                block: user,
                pool: None,
                user,
                len: user.size(),
                tag: 0,
            },
        ))
    }
    fn release(&mut self, addr: usize, l: Live) {
        let b = l.block.size() as u64;
        let Some(pi) = l.pool else {
            self.unpooled_live -= b;
            self.held -= b;
            return;
        };
        let p = &mut self.pools[pi];
        p.live -= b;
        if (p.free.len() as u64) < p.count {
            p.free.push(Cached {
                addr,
                layout: l.block,
                seq: self.seq,
            });
            self.seq += 1;
        } else {
            p.committed -= b;
            self.held -= b;
        }
    }
    fn fits_in_place(&self, addr: usize, l: &Live, new: Layout) -> bool {
        if !addr.is_multiple_of(new.align()) {
            return false;
        }
        match l.pool {
            None => new.size() == l.block.size(),
            Some(pi) => {
                self.pool_for(new.size()) == Some(pi)
                    && round(self.pools[pi].round, new.size()) == l.block.size()
            }
        }
    }
}

// ---------------------------------------------------------------- check ----

fn check_stats(c: &CachingAllocator<&Inner>, m: &Model) {
    let s = c.stats();
    let sum = |f: fn(&MPool) -> u64| m.pools.iter().map(f).sum::<u64>();
    assert_eq!(s.hits, sum(|p| p.hits));
    assert_eq!(s.misses, sum(|p| p.misses));
    assert_eq!(s.bypasses, sum(|p| p.bypasses) + m.no_pool_bypasses);
    assert_eq!(s.evictions, sum(|p| p.evictions));
    assert_eq!(s.trimmed, sum(|p| p.trimmed));
    assert_eq!(s.live_bytes, sum(|p| p.live) + m.unpooled_live);
    assert_eq!(s.cached_bytes, m.cached_total());
    assert_eq!(s.cached_blocks, sum(|p| p.free.len() as u64));
    assert_eq!(s.peak_bytes, m.peak);
    assert_eq!(s.inner_failures, sum(|p| p.failures) + m.no_pool_failures);
    for (ps, mp) in s.pools.iter().zip(&m.pools) {
        assert_eq!(ps.hits, mp.hits);
        assert_eq!(ps.misses, mp.misses);
        assert_eq!(ps.bypasses, mp.bypasses);
        assert_eq!(ps.evictions, mp.evictions);
        assert_eq!(ps.live_bytes, mp.live);
        assert_eq!(ps.cached_blocks, mp.free.len() as u64);
        assert_eq!(ps.peak_bytes, mp.peak);
        // Limits.
        assert!(
            ps.live_bytes + ps.cached_bytes <= mp.cap,
            "capacity exceeded"
        );
        assert!(ps.cached_blocks <= mp.count, "free count exceeded");
        assert!(ps.peak_bytes <= mp.cap);
    }
}

fn fill(p: NonNull<u8>, len: usize, tag: u8) {
    unsafe { p.as_ptr().write_bytes(tag, len) };
}

/// Compares 4 KiB at a time with slice equality (a `memcmp`): a byte loop
/// here, instrumented for coverage, would be most of each execution's time.
fn check(p: NonNull<u8>, len: usize, tag: u8) {
    let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
    let want = [tag; 4096];
    for chunk in s.chunks(want.len()) {
        assert!(chunk == &want[..chunk.len()], "contents changed");
    }
}

fn no_overlap(live: &BTreeMap<usize, Live>, addr: usize, len: usize) {
    if let Some((&a, l)) = live.range(..=addr).next_back() {
        assert!(a + l.len <= addr, "overlaps a live block");
    }
    if let Some((&a, _)) = live.range(addr..).next() {
        assert!(addr + len <= a, "overlaps a live block");
    }
}

fuzz_target!(|input: Input| {
    let mut spec = String::new();
    for (i, p) in input.pools.iter().take(4).enumerate() {
        if i > 0 {
            spec.push(',');
        }
        let f = |v: Option<u8>, unit: &str| v.map_or("*".to_string(), |v| format!("{v}{unit}"));
        spec += &format!(
            "*={};{};{}",
            f(p.max_size, "kib"),
            f(p.cap, "kib"),
            f(p.count, "")
        );
    }
    let round = match input.round % 4 {
        0 | 1 => None,
        2 => Some(1),
        _ => Some(4),
    };
    let inner = Inner::default();
    let parsed: CachingSpec = spec.parse().unwrap();
    let mut b = CachingAllocator::builder(&inner).spec(parsed);
    if let Some(n) = round {
        b = b.round_up(RoundUp::PowerOfTwoDivisions(n));
    }
    let c = b.build().unwrap();
    let mut m = Model::default();
    for p in c.pool_params() {
        m.pools.push(MPool {
            max_size: p.max_allocation_size,
            cap: p.max_allocation_capacity,
            count: u64::from(p.max_free_allocation_count),
            round,
            ..MPool::default()
        });
    }
    let mut live: BTreeMap<usize, Live> = BTreeMap::new();
    let mut tag: u8 = 0;
    let pick = |live: &BTreeMap<usize, Live>, idx: u8| -> Option<(usize, Live)> {
        if live.is_empty() {
            return None;
        }
        live.iter()
            .nth(idx as usize % live.len())
            .map(|(a, l)| (*a, *l))
    };

    for op in input.ops.iter().take(200) {
        tag = tag.wrapping_add(1);
        match *op {
            Op::Alloc {
                class,
                raw,
                align,
                zeroed,
            } => {
                let size = match class % 4 {
                    0 => 64,
                    1 => 4096,
                    2 => 24 * 1024,
                    _ => 1 + raw as usize % (300 * 1024),
                };
                let user = Layout::from_size_align(size, 1 << (align % 13)).unwrap();
                let want = m.alloc(user);
                let got = if zeroed {
                    c.allocate_zeroed(user)
                } else {
                    c.allocate(user)
                };
                match (want, got) {
                    (Err(()), Err(_)) => {}
                    (Ok((hit, mut l)), Ok(p)) => {
                        let addr = p.cast::<u8>().as_ptr() as usize;
                        if let Some(h) = hit {
                            assert_eq!(addr, h, "model predicts reuse of another block");
                        }
                        assert_eq!(p.len(), l.len);
                        assert_eq!(addr % user.align(), 0);
                        no_overlap(&live, addr, l.len);
                        if zeroed {
                            check(p.cast(), p.len(), 0);
                        }
                        l.tag = tag;
                        fill(p.cast(), l.len, tag);
                        live.insert(addr, l);
                    }
                    (w, g) => panic!("model {w:?} vs real {g:?}"),
                }
            }
            Op::Free { idx } => {
                if let Some((addr, l)) = pick(&live, idx) {
                    let p = NonNull::new(addr as *mut u8).unwrap();
                    check(p, l.len, l.tag);
                    live.remove(&addr);
                    m.release(addr, l);
                    unsafe { c.deallocate(p, l.user) };
                }
            }
            Op::Grow { idx, extra, zeroed } => {
                if let Some((addr, l)) = pick(&live, idx) {
                    let new =
                        Layout::from_size_align(l.len + extra as usize, l.user.align()).unwrap();
                    resize(&c, &mut m, &mut live, addr, l, new, zeroed, tag);
                }
            }
            Op::Shrink { idx, less } => {
                if let Some((addr, l)) = pick(&live, idx) {
                    let size = l.user.size().saturating_sub(less as usize).max(1);
                    let new = Layout::from_size_align(size, l.user.align()).unwrap();
                    resize(&c, &mut m, &mut live, addr, l, new, false, tag);
                }
            }
            Op::Trim => {
                m.trim_to(0);
                c.trim();
            }
            Op::TrimTo { kib } => {
                m.trim_to(u64::from(kib) * 1024);
                c.trim_to(u64::from(kib) * 1024);
            }
            Op::FailNext { n } => {
                m.fail = u32::from(n % 4);
                inner.fail.set(m.fail);
            }
        }
        assert_eq!(inner.fail.get(), m.fail, "inner call count differs");
        check_stats(&c, &m);
    }
    for (addr, l) in std::mem::take(&mut live) {
        let p = NonNull::new(addr as *mut u8).unwrap();
        check(p, l.len, l.tag);
        m.release(addr, l);
        unsafe { c.deallocate(p, l.user) };
    }
    check_stats(&c, &m);
    drop(c);
    assert!(inner.live.borrow().is_empty(), "blocks lost after drop");
    assert_eq!(inner.bytes.get(), 0, "inner byte count after drop");
});

#[allow(clippy::too_many_arguments)]
fn resize(
    c: &CachingAllocator<&Inner>,
    m: &mut Model,
    live: &mut BTreeMap<usize, Live>,
    addr: usize,
    l: Live,
    new: Layout,
    zeroed: bool,
    tag: u8,
) {
    let p = NonNull::new(addr as *mut u8).unwrap();
    check(p, l.len, l.tag);
    let grow = new.size() >= l.user.size();
    let in_place = m.fits_in_place(addr, &l, new);
    let want = if in_place {
        Ok((
            Some(addr),
            Live {
                user: new,
                tag,
                ..l
            },
        ))
    } else {
        m.alloc(new).map(|(h, nl)| (h, Live { tag, ..nl }))
    };
    let got = unsafe {
        if grow {
            if zeroed {
                c.grow_zeroed(p, l.user, new)
            } else {
                c.grow(p, l.user, new)
            }
        } else {
            c.shrink(p, l.user, new)
        }
    };
    match (want, got) {
        (Err(()), Err(_)) => {}
        (Ok((hit, nl)), Ok(q)) => {
            let qa = q.cast::<u8>().as_ptr() as usize;
            if let Some(h) = hit {
                assert_eq!(qa, h, "resize returned an unexpected block");
            }
            assert_eq!(q.len(), nl.len);
            let keep = l.user.size().min(new.size());
            check(q.cast(), keep, l.tag);
            if zeroed {
                check(
                    unsafe { q.cast::<u8>().add(l.user.size()) },
                    q.len() - l.user.size(),
                    0,
                );
            }
            live.remove(&addr);
            if !in_place {
                m.release(addr, l);
            }
            no_overlap(live, qa, nl.len);
            fill(q.cast(), nl.len, tag);
            live.insert(qa, nl);
        }
        (w, g) => panic!("resize: model {w:?} vs real {g:?}"),
    }
}
