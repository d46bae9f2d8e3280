//! Unit tests of the retention cache: they map real blocks, so Miri
//! skips them (docs/reliability.md).

use super::*;
use crate::huge::{huge_stats, map_huge, HugeOptions};
use crate::sys::HUGE_PAGE_2M;

const MIB: usize = 1 << 20;

fn block(len: usize) -> NonNull<u8> {
    map_huge(len, HUGE_PAGE_2M, &HugeOptions::new())
        .expect("map a block")
        .ptr
}

/// The unit tests of the crate that use the process-wide cache hold
/// this lock; each starts with the cache empty.
fn only_user() -> std::sync::MutexGuard<'static, ()> {
    static CACHE_USERS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = CACHE_USERS.lock().unwrap_or_else(|e| e.into_inner());
    release_retained();
    guard
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn a_merged_block_keeps_the_age_of_its_oldest_part_when_asked() {
    let _only = only_user();
    let cap = 64 * MIB;
    for (age, decays) in [(MergedAge::Oldest, true), (MergedAge::Reset, false)] {
        // Two halves of one mapping: the second merges into the first.
        let whole = block(16 * MIB);
        let second = NonNull::new(whole.as_ptr().wrapping_add(8 * MIB)).unwrap();
        assert!(put(whole, 8 * MIB, cap, age));
        // The first half has been unused for longer than any delay.
        let slot = CACHE
            .iter()
            .flat_map(|shard| &shard.slots)
            .find(|s| s.word.load(Relaxed) == whole.as_ptr() as usize)
            .expect("the first half is retained");
        slot.stamp.store(1, Relaxed);
        assert!(put(second, 8 * MIB, cap, age));
        assert_eq!(RETAINED.load(Relaxed), 16 * MIB);
        decay_step();
        let left = RETAINED.load(Relaxed);
        assert_eq!(left == 0, decays, "{age:?}: {left} bytes left");
        release_retained();
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn the_newest_block_makes_room_by_giving_back_older_ones() {
    let _only = only_user();
    let cap = 32 * MIB;
    // Six blocks, every other one retained: no two retained blocks are
    // neighbours, so none merge.
    let blocks: Vec<NonNull<u8>> = (0..6).map(|_| block(8 * MIB)).collect();
    for p in blocks.iter().step_by(2) {
        assert!(put(*p, 8 * MIB, cap, MergedAge::Reset));
    }
    assert_eq!(RETAINED.load(Relaxed), 24 * MIB);
    let unmapped = huge_stats().unmapped_bytes;
    let newest = block(16 * MIB);
    assert!(
        !put(newest, 16 * MIB, cap, MergedAge::Reset),
        "24 + 16 MiB is over the cap"
    );
    assert!(make_room(16 * MIB, cap));
    let left = RETAINED.load(Relaxed);
    assert!(left + 16 * MIB <= cap, "{left}");
    assert!(left >= 8 * MIB, "gave back more than needed: {left}");
    assert!(huge_stats().unmapped_bytes >= unmapped + 8 * MIB as u64);
    assert!(put(newest, 16 * MIB, cap, MergedAge::Reset));
    assert!(!make_room(40 * MIB, cap), "a block over the cap never fits");
    assert!(release_retained() >= 24 * MIB);
    assert_eq!(RETAINED.load(Relaxed), 0);
    for p in blocks.iter().skip(1).step_by(2) {
        unmap(*p, 8 * MIB);
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn a_miss_takes_the_longest_shorter_block() {
    let _only = only_user();
    let cap = 64 * MIB;
    // 4, 8 and 16 MiB pieces of one mapping, with gaps between them: no
    // two are neighbours, so none merge.
    let whole = block(40 * MIB);
    let at = |off: usize| NonNull::new(whole.as_ptr().wrapping_add(off)).unwrap();
    for (off, len) in [(0, 4 * MIB), (8 * MIB, 8 * MIB), (20 * MIB, 16 * MIB)] {
        assert!(put(at(off), len, cap, MergedAge::Reset));
    }
    let block = |t: Option<Taken>| t.map(|t| (t.ptr, t.len));
    assert_eq!(
        block(take_longest(16 * MIB, HUGE_PAGE_2M)),
        Some((at(8 * MIB), 8 * MIB))
    );
    assert_eq!(RETAINED.load(Relaxed), 20 * MIB);
    let t = take_longest(64 * MIB, HUGE_PAGE_2M).unwrap();
    assert_eq!((t.ptr, t.len), (at(20 * MIB), 16 * MIB));
    assert_eq!(take_longest(4 * MIB, HUGE_PAGE_2M), None, "none is shorter");
    assert_eq!(RETAINED.load(Relaxed), 4 * MIB);
    // An alignment the last block's address does not meet.
    let addr = whole.as_ptr() as usize;
    let align = (addr & addr.wrapping_neg()) * 2;
    assert_eq!(take_longest(64 * MIB, align), None);
    assert_eq!(
        block(take_longest(64 * MIB, HUGE_PAGE_2M)),
        Some((at(0), 4 * MIB))
    );
    assert_eq!(RETAINED.load(Relaxed), 0);
    // A block put back unused goes on ageing: with a stamp older than
    // any delay, the next decay step gives it back.
    assert!(put(t.ptr, t.len, cap, MergedAge::Kept(1)));
    decay_step();
    assert_eq!(RETAINED.load(Relaxed), 0, "the kept stamp decayed");
    unmap(whole, 20 * MIB);
    unmap(at(36 * MIB), 4 * MIB);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn an_exact_hit_takes_the_most_recently_freed_block() {
    let _only = only_user();
    let cap = 64 * MIB;
    // Three 4 MiB pieces of one mapping with gaps between them: none merge.
    let whole = block(20 * MIB);
    let at = |off: usize| NonNull::new(whole.as_ptr().wrapping_add(off)).unwrap();
    // Freed in an order that is neither the slots' nor the addresses'.
    for off in [8 * MIB, 0, 16 * MIB] {
        assert!(put(at(off), 4 * MIB, cap, MergedAge::Reset));
    }
    let carves = COUNTERS.retain_carves.load(Relaxed);
    for expected in [16 * MIB, 0] {
        assert_eq!(take(4 * MIB, HUGE_PAGE_2M), Some(at(expected)));
        // Freed again, it is again the newest.
        assert!(put(at(expected), 4 * MIB, cap, MergedAge::Reset));
        assert_eq!(take(4 * MIB, HUGE_PAGE_2M), Some(at(expected)));
    }
    assert_eq!(take(4 * MIB, HUGE_PAGE_2M), Some(at(8 * MIB)));
    assert_eq!(take(4 * MIB, HUGE_PAGE_2M), None, "all three are taken");
    assert_eq!(COUNTERS.retain_carves.load(Relaxed), carves, "no carve");
    assert_eq!(RETAINED.load(Relaxed), 0);
    // A shorter request carves the newest of equally long blocks.
    assert!(put(at(0), 4 * MIB, cap, MergedAge::Reset));
    assert!(put(at(8 * MIB), 4 * MIB, cap, MergedAge::Reset));
    assert_eq!(take(2 * MIB, HUGE_PAGE_2M), Some(at(8 * MIB)));
    assert_eq!(RETAINED.load(Relaxed), 6 * MIB);
    // Retained: 0..4 and 10..12 MiB; the rest is taken or a gap.
    assert_eq!(release_retained(), 6 * MIB);
    unmap(at(4 * MIB), 6 * MIB);
    unmap(at(12 * MIB), 8 * MIB);
}

/// A thread of its own that runs the closures it is sent, one at a time,
/// until the value is dropped: the cache tells threads apart, so each step
/// of a test runs on a chosen thread.
struct Worker {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Worker {
    fn new() -> Worker {
        let (jobs, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::spawn(move || rx.iter().for_each(|job| job()));
        Worker { jobs }
    }

    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        let job = move || tx.send(f()).expect("the test waits for the result");
        self.jobs.send(Box::new(job)).expect("the worker runs");
        rx.recv().expect("the job ran")
    }
}

/// An address as a `Send` value.
fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

/// A step for a [`Worker`]: free the block at `at` into the cache.
fn give(at: usize, len: usize, cap: usize) -> impl FnOnce() -> bool + Send + 'static {
    move || {
        put(
            NonNull::new(at as *mut u8).unwrap(),
            len,
            cap,
            MergedAge::Reset,
        )
    }
}

/// A step for a [`Worker`]: take a block of `len` bytes from the cache.
fn take_at(len: usize) -> impl FnOnce() -> Option<usize> + Send + 'static {
    move || take(len, HUGE_PAGE_2M).map(addr)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn two_threads_carve_opposite_ends_of_one_block_and_get_it_whole_back() {
    let _only = only_user();
    let cap = 128 * MIB;
    let whole = addr(block(64 * MIB));
    let (a, b) = (Worker::new(), Worker::new());
    // Freed by the test thread: a whole block of another thread for both.
    assert!(put(
        NonNull::new(whole as *mut u8).unwrap(),
        64 * MIB,
        cap,
        MergedAge::Reset
    ));
    assert_eq!(a.run(take_at(4 * MIB)), Some(whole), "A carves the front");
    // A is carving the block: B carves its other end.
    assert_eq!(b.run(take_at(4 * MIB)), Some(whole + 60 * MIB));
    assert_eq!(
        a.run(take_at(8 * MIB)),
        Some(whole + 4 * MIB),
        "A goes on at the front"
    );
    assert!(b.run(give(whole + 60 * MIB, 4 * MIB, cap)));
    assert!(a.run(give(whole + 4 * MIB, 8 * MIB, cap)));
    assert!(a.run(give(whole, 4 * MIB, cap)));
    // Every piece merged back: one block, whole.
    assert_eq!(b.run(take_at(64 * MIB)), Some(whole));
    assert_eq!(RETAINED.load(Relaxed), 0);
    // Again, with the front piece back first: the block is then A's whole
    // block, and B's piece from its end still merges back.
    assert!(a.run(give(whole, 64 * MIB, cap)));
    assert_eq!(a.run(take_at(4 * MIB)), Some(whole));
    assert_eq!(b.run(take_at(8 * MIB)), Some(whole + 56 * MIB));
    assert!(a.run(give(whole, 4 * MIB, cap)));
    assert!(b.run(give(whole + 56 * MIB, 8 * MIB, cap)));
    assert_eq!(b.run(take_at(64 * MIB)), Some(whole));
    assert_eq!(RETAINED.load(Relaxed), 0);
    unmap(NonNull::new(whole as *mut u8).unwrap(), 64 * MIB);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn a_block_freed_next_to_one_another_thread_carves_comes_back_to_its_thread() {
    let _only = only_user();
    let cap = 128 * MIB;
    // X = whole .. +64 MiB, then Y = +64 .. +80 MiB right after it.
    let whole = addr(block(80 * MIB));
    let (x, y) = (whole, whole + 64 * MIB);
    let (a, b) = (Worker::new(), Worker::new());
    assert!(a.run(give(x, 64 * MIB, cap)));
    assert_eq!(a.run(take_at(4 * MIB)), Some(x));
    // B frees Y: it merges with the rest of X, which A still carves.
    assert!(b.run(give(y, 16 * MIB, cap)));
    assert_eq!(RETAINED.load(Relaxed), 76 * MIB);
    // B's request takes the merged block's end, its own Y, and A's piece
    // then merges back into the whole of X.
    assert_eq!(b.run(take_at(16 * MIB)), Some(y));
    assert!(a.run(give(x, 4 * MIB, cap)));
    assert_eq!(a.run(take_at(64 * MIB)), Some(x));
    assert_eq!(RETAINED.load(Relaxed), 0);
    unmap(NonNull::new(whole as *mut u8).unwrap(), 80 * MIB);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "maps real huge-page blocks (mmap flags Miri does not model)"
)]
fn whole_blocks_of_two_threads_side_by_side_stay_apart() {
    let _only = only_user();
    let cap = 64 * MIB;
    // Q = whole .. +8 MiB freed by B, P = +8 .. +16 MiB freed by A.
    let whole = addr(block(16 * MIB));
    let (q, p) = (whole, whole + 8 * MIB);
    let (a, b) = (Worker::new(), Worker::new());
    let carves = COUNTERS.retain_carves.load(Relaxed);
    for _ in 0..3 {
        assert!(a.run(give(p, 8 * MIB, cap)));
        assert!(b.run(give(q, 8 * MIB, cap)));
        assert_eq!(RETAINED.load(Relaxed), 16 * MIB);
        // Each thread gets its own block back whole, in either order.
        assert_eq!(a.run(take_at(8 * MIB)), Some(p));
        assert_eq!(b.run(take_at(8 * MIB)), Some(q));
    }
    assert_eq!(COUNTERS.retain_carves.load(Relaxed), carves, "no carve");
    // The same two pieces freed by one thread merge.
    assert!(a.run(give(p, 8 * MIB, cap)));
    assert!(a.run(give(q, 8 * MIB, cap)));
    assert_eq!(
        b.run(|| take(16 * MIB, HUGE_PAGE_2M).map(addr)),
        Some(whole)
    );
    unmap(NonNull::new(whole as *mut u8).unwrap(), 16 * MIB);
}
