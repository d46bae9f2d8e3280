//! Arbitrary sequences of allocate / grow / shrink / deallocate / checkpoint /
//! rewind / reset on a `BumpArena`, through `&BumpArena` and through
//! short-lived `LocalArena` handles, checked against a model: alignment,
//! bounds (inside the runtime region), no overlap between live blocks,
//! contents preserved, exhaustion only when the request cannot fit, and the
//! arena's counters consistent.
#![no_main]

use allocator_api2::alloc::{Allocator, Layout};
use arbitrary::Arbitrary;
use ckalloc::{ArenaError, BumpArena, Checkpoint, ModePolicy};
use libfuzzer_sys::fuzz_target;
use std::ptr::NonNull;

const TOTAL: usize = (1 << 20) + 12345;

#[derive(Arbitrary, Debug)]
struct Input {
    activations_base: u16,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { size: u16, align_pow: u8 },
    Dealloc { idx: u8 },
    Grow { idx: u8, extra: u16, align_pow: u8 },
    Shrink { idx: u8, by: u16 },
    Checkpoint,
    Rewind { idx: u8 },
    Reset,
    Local(Vec<LocalOp>),
}

#[derive(Arbitrary, Debug)]
enum LocalOp {
    Alloc { size: u16, align_pow: u8 },
    Dealloc { idx: u8 },
    Grow { idx: u8, extra: u16 },
    Shrink { idx: u8, by: u16 },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Owner {
    Shared,
    /// Allocated by the current `LocalArena` session.
    Local,
    /// Allocated by a `LocalArena` that is gone: still valid, no more ops.
    Frozen,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    addr: usize,
    size: usize,
    align: usize,
    fill: u8,
    owner: Owner,
}

struct Model {
    blocks: Vec<Block>,
    next_fill: u8,
    runtime_start: usize,
    end: usize,
}

fn layout(size: usize, align_pow: u8) -> Layout {
    Layout::from_size_align(size, 1 << (align_pow % 13)).unwrap()
}

fn fill(b: &Block) {
    // SAFETY: the block is live and `size` bytes long.
    unsafe { (b.addr as *mut u8).write_bytes(b.fill, b.size) };
}

fn check_contents(b: &Block, upto: usize) {
    // SAFETY: the block is live and at least `upto` bytes long.
    let s = unsafe { std::slice::from_raw_parts(b.addr as *const u8, upto) };
    // 4 KiB at a time with slice equality (a `memcmp`), not an instrumented
    // byte loop.
    let want = [b.fill; 4096];
    for chunk in s.chunks(want.len()) {
        assert!(chunk == &want[..chunk.len()], "contents of {b:?} lost");
    }
}

impl Model {
    fn fill_byte(&mut self) -> u8 {
        self.next_fill = self.next_fill.wrapping_add(1) | 1;
        self.next_fill
    }

    fn check(&self, arena: &BumpArena) {
        let used = arena.used();
        assert_eq!(used + arena.remaining(), self.end - self.runtime_start);
        assert!(arena.high_water_mark() >= used);
        let mut sorted: Vec<_> = self.blocks.iter().filter(|b| b.size > 0).collect();
        sorted.sort_by_key(|b| b.addr);
        for w in sorted.windows(2) {
            assert!(w[0].addr + w[0].size <= w[1].addr, "overlap {w:?}");
        }
        for b in &self.blocks {
            assert_eq!(b.addr % b.align, 0, "misaligned {b:?}");
            // Zero-size blocks own no memory: a fresh LocalArena returns its
            // empty chunk's end for them, and a request that does not fit
            // gets a dangling pointer (its alignment) outside the arena.
            if b.size > 0 {
                assert!(
                    b.addr >= self.runtime_start && b.addr + b.size <= self.end,
                    "{b:?}"
                );
                assert!(
                    b.addr + b.size <= self.runtime_start + used,
                    "{b:?} above used"
                );
            }
            check_contents(b, b.size);
        }
    }

    /// Whether `layout` cannot fit above the shared bump pointer.
    fn cannot_fit(&self, arena: &BumpArena, l: Layout) -> bool {
        let cur = self.runtime_start + arena.used();
        let start = (cur + l.align() - 1) & !(l.align() - 1);
        start + l.size() > self.end
    }

    fn pick(&self, idx: u8, owner: Owner) -> Option<usize> {
        let live: Vec<usize> = (0..self.blocks.len())
            .filter(|&i| self.blocks[i].owner == owner)
            .collect();
        (!live.is_empty()).then(|| live[idx as usize % live.len()])
    }

    fn alloc<A: Allocator>(&mut self, a: A, arena: &BumpArena, l: Layout, owner: Owner) {
        match a.allocate(l) {
            Ok(p) => {
                assert_eq!(p.len(), l.size());
                let b = Block {
                    addr: p.as_ptr().cast::<u8>() as usize,
                    size: l.size(),
                    align: l.align(),
                    fill: self.fill_byte(),
                    owner,
                };
                fill(&b);
                self.blocks.push(b);
            }
            Err(_) => {
                assert!(l.size() > 0, "a zero-size request failed");
                assert!(self.cannot_fit(arena, l), "spurious exhaustion {l:?}");
            }
        }
    }

    fn dealloc<A: Allocator>(&mut self, a: A, i: usize) {
        let b = self.blocks.swap_remove(i);
        let l = Layout::from_size_align(b.size, b.align).unwrap();
        // SAFETY: the block is live and was allocated by `a`.
        unsafe { a.deallocate(NonNull::new(b.addr as *mut u8).unwrap(), l) };
    }

    fn resize<A: Allocator>(&mut self, a: A, i: usize, new_size: usize, new_align: usize) {
        let b = self.blocks[i];
        let old = Layout::from_size_align(b.size, b.align).unwrap();
        let Ok(new) = Layout::from_size_align(new_size, new_align) else {
            return;
        };
        let ptr = NonNull::new(b.addr as *mut u8).unwrap();
        // SAFETY: the block is live with layout `old`, allocated by `a`;
        // grow gets a size >= old, shrink a size <= old.
        let r = unsafe {
            if new_size >= b.size {
                a.grow(ptr, old, new)
            } else {
                a.shrink(ptr, old, new)
            }
        };
        if let Ok(p) = r {
            let nb = Block {
                addr: p.as_ptr().cast::<u8>() as usize,
                size: new_size,
                align: new_align,
                ..b
            };
            check_contents(&nb, b.size.min(new_size));
            fill(&nb);
            self.blocks[i] = nb;
        }
    }
}

fuzz_target!(|input: Input| {
    let ab = input.activations_base as usize;
    // Per-thread chunks (the default) and the shared pointer alone.
    let thread_chunks = input.ops.len() % 4 < 2;
    let mut arena = BumpArena::builder(TOTAL)
        .activations_base(ab)
        .policy(ModePolicy::AnonOnly)
        .release_on_reset(input.ops.len() % 2 == 1)
        .thread_chunks(thread_chunks)
        .build()
        .expect("1 MiB arena");
    let base = arena.as_ptr() as usize;
    let mut m = Model {
        blocks: Vec::new(),
        next_fill: 0,
        runtime_start: base + ab,
        end: base + TOTAL,
    };
    let mut checkpoints: Vec<Checkpoint> = Vec::new();
    for op in input.ops.iter().take(300) {
        match op {
            Op::Alloc { size, align_pow } => m.alloc(
                &arena,
                &arena,
                layout(*size as usize, *align_pow),
                Owner::Shared,
            ),
            Op::Dealloc { idx } => {
                if let Some(i) = m.pick(*idx, Owner::Shared) {
                    m.dealloc(&arena, i);
                }
            }
            Op::Grow {
                idx,
                extra,
                align_pow,
            } => {
                if let Some(i) = m.pick(*idx, Owner::Shared) {
                    let b = m.blocks[i];
                    let align = b.align.max(1 << (align_pow % 13));
                    m.resize(&arena, i, b.size + *extra as usize, align);
                }
            }
            Op::Shrink { idx, by } => {
                if let Some(i) = m.pick(*idx, Owner::Shared) {
                    let b = m.blocks[i];
                    m.resize(&arena, i, b.size.saturating_sub(*by as usize), b.align);
                }
            }
            Op::Checkpoint => {
                if checkpoints.len() < 16 {
                    checkpoints.push(arena.checkpoint());
                }
            }
            Op::Rewind { idx } => {
                if checkpoints.is_empty() {
                    continue;
                }
                let cp = checkpoints[*idx as usize % checkpoints.len()];
                let used = arena.used();
                match arena.rewind_to(cp) {
                    Ok(()) => {
                        // With thread chunks a checkpoint is checked against
                        // the shared pointer, which may sit up to a chunk tail
                        // above this thread's view (documented on rewind_to).
                        assert!(thread_chunks || cp.used() <= used);
                        assert_eq!(arena.used(), cp.used());
                        let top = m.runtime_start + cp.used();
                        // Everything that ends above the checkpoint is gone.
                        m.blocks.retain(|b| b.addr + b.size <= top);
                    }
                    Err(ArenaError::BadCheckpoint { .. }) => {
                        assert!(cp.used() > used);
                        assert_eq!(arena.used(), used);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            Op::Reset => {
                arena.reset();
                assert_eq!(arena.used(), 0);
                m.blocks.clear();
            }
            Op::Local(ops) => {
                let local = arena.local();
                for lop in ops.iter().take(100) {
                    match lop {
                        LocalOp::Alloc { size, align_pow } => m.alloc(
                            &local,
                            &arena,
                            layout(*size as usize, *align_pow),
                            Owner::Local,
                        ),
                        LocalOp::Dealloc { idx } => {
                            if let Some(i) = m.pick(*idx, Owner::Local) {
                                m.dealloc(&local, i);
                            }
                        }
                        LocalOp::Grow { idx, extra } => {
                            if let Some(i) = m.pick(*idx, Owner::Local) {
                                let b = m.blocks[i];
                                m.resize(&local, i, b.size + *extra as usize, b.align);
                            }
                        }
                        LocalOp::Shrink { idx, by } => {
                            if let Some(i) = m.pick(*idx, Owner::Local) {
                                let b = m.blocks[i];
                                m.resize(&local, i, b.size.saturating_sub(*by as usize), b.align);
                            }
                        }
                    }
                    m.check(&arena);
                }
                drop(local);
                for b in &mut m.blocks {
                    if b.owner == Owner::Local {
                        b.owner = Owner::Frozen;
                    }
                }
            }
        }
        m.check(&arena);
    }
    let (p, len) = arena.mapping();
    drop(arena);
    let _ = (p, len);
});
