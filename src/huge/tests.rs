//! The engine on private instances (no hugetlb blocks, so the spans' rules
//! show whatever pages are reserved): hits, carving, shrinking and growing
//! in place, moves, zeroing, the cap, decay, locked and read-only frees,
//! VMAs, threads' spans, alignment.

use super::engine::{Block, Engine, Fill};
use super::policy::Policy;
use super::retain;
use super::span;
use super::stats::HugeStats;
use crate::sys::HUGE_PAGE_2M;

const MIB: usize = 1 << 20;
const RUST: Policy = Policy::RUST_GLOBAL;
const C: Policy = Policy::C_MALLOC;

fn alloc(e: &Engine, size: usize, fill: Fill, policy: &Policy) -> Block {
    let b = e.alloc(size, 16, fill, policy).expect("alloc");
    assert!(b.len >= size && b.ptr.as_ptr() as usize % HUGE_PAGE_2M == 0);
    b
}

fn free(e: &Engine, p: *mut u8, policy: &Policy) {
    // SAFETY: an engine block of the test's, not used afterwards.
    assert!(unsafe { e.free(p, policy) }, "not a block: {p:p}");
}

fn fill(p: *mut u8, n: usize, seed: u8) {
    // SAFETY: the test owns `n` bytes at `p`.
    let s = unsafe { std::slice::from_raw_parts_mut(p, n) };
    for (i, b) in s.iter_mut().enumerate().step_by(4096) {
        *b = (i / 4096) as u8 ^ seed;
    }
}

fn holds(p: *const u8, n: usize, seed: u8) -> bool {
    // SAFETY: the test owns `n` bytes at `p`.
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    s.iter()
        .enumerate()
        .step_by(4096)
        .all(|(i, &b)| b == (i / 4096) as u8 ^ seed)
}

fn zero(p: *const u8, n: usize) -> bool {
    // SAFETY: the test owns `n` bytes at `p`.
    unsafe { std::slice::from_raw_parts(p, n) }
        .iter()
        .all(|&b| b == 0)
}

/// System calls that map or unmap.
fn maps(s: &HugeStats) -> u64 {
    s.syscalls.mmap + s.syscalls.munmap + s.syscalls.mremap
}

/// The lines of `/proc/self/maps` that overlap `start..start + len`.
fn vmas(start: usize, len: usize) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            a < start + len && b > start
        })
        .count()
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn a_freed_block_serves_the_next_request_of_its_length_without_a_system_call() {
    static E: Engine = Engine::new(false);
    let b = alloc(&E, 4 * MIB, Fill::Uninit, &RUST);
    fill(b.ptr.as_ptr(), b.len, 1);
    free(&E, b.ptr.as_ptr(), &RUST);
    let before = E.stats.snapshot();
    assert_eq!(before.retained_bytes, 4 * MIB as u64);
    assert_eq!(before.live_bytes, 0);
    let again = alloc(&E, 3 * MIB + 5, Fill::Uninit, &RUST);
    let after = E.stats.snapshot();
    assert_eq!(again.ptr, b.ptr, "the same block back");
    assert_eq!(after.syscalls, before.syscalls, "no system call at all");
    assert_eq!(after.retention_hits, before.retention_hits + 1);
    assert!(holds(again.ptr.as_ptr(), again.len, 1), "its pages stayed");
    assert_eq!(E.usable_size(again.ptr.as_ptr()), Some(4 * MIB));
    free(&E, again.ptr.as_ptr(), &RUST);
    // SAFETY: freed already: the second free finds nothing.
    assert!(!unsafe { E.free(again.ptr.as_ptr(), &RUST) });
    assert_eq!(E.usable_size(again.ptr.as_ptr()), None);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn a_freed_buffer_is_carved_for_shorter_requests_and_whole_again_when_they_come_back() {
    static E: Engine = Engine::new(false);
    let len = 90_000_000usize.next_multiple_of(HUGE_PAGE_2M);
    let big = alloc(&E, 90_000_000, Fill::Uninit, &C);
    fill(big.ptr.as_ptr(), big.len, 3);
    free(&E, big.ptr.as_ptr(), &C);
    let before = E.stats.snapshot();
    let sizes = [6 * MIB, 4 * MIB + 1, 2 * MIB, 12 * MIB - 3];
    let mut at = big.ptr.as_ptr();
    let mut pieces = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let b = alloc(&E, size, Fill::Uninit, &C);
        assert_eq!(b.ptr.as_ptr(), at, "piece {i} comes from the front");
        at = at.wrapping_add(b.len);
        fill(b.ptr.as_ptr(), size, i as u8);
        pieces.push(b);
    }
    for (i, b) in pieces.iter().enumerate() {
        assert!(holds(b.ptr.as_ptr(), sizes[i], i as u8));
    }
    for i in [2, 0, 3, 1] {
        free(&E, pieces[i].ptr.as_ptr(), &C);
    }
    assert_eq!(E.stats.snapshot().retained_bytes, len as u64);
    let whole = alloc(&E, 90_000_000, Fill::Uninit, &C);
    assert_eq!(whole.ptr, big.ptr, "one block again");
    let after = E.stats.snapshot();
    assert_eq!(maps(&after), maps(&before), "nothing mapped or unmapped");
    assert!(after.retention_carves >= before.retention_carves + 3);
    free(&E, whole.ptr.as_ptr(), &C);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn a_shrink_stays_in_place_and_a_growth_takes_the_free_units_after_it() {
    static E: Engine = Engine::new(false);
    let b = alloc(&E, 32 * MIB, Fill::Uninit, &C);
    fill(b.ptr.as_ptr(), 32 * MIB, 5);
    let before = E.stats.snapshot();
    // SAFETY: the test's block.
    let s = unsafe { E.resize(b.ptr.as_ptr(), 3 * MIB, 16, Fill::Uninit, &C) }.unwrap();
    assert_eq!((s.ptr, s.len), (b.ptr, 4 * MIB));
    let mid = E.stats.snapshot();
    assert_eq!(
        maps(&mid),
        maps(&before),
        "a shrink maps and unmaps nothing"
    );
    assert_eq!(mid.retained_bytes, before.retained_bytes + 28 * MIB as u64);
    assert!(holds(b.ptr.as_ptr(), 3 * MIB, 5));
    // The units after it are free again: it grows in place.
    // SAFETY: the test's block.
    let g = unsafe { E.resize(b.ptr.as_ptr(), 20 * MIB, 16, Fill::Uninit, &C) }.unwrap();
    assert_eq!((g.ptr, g.len), (b.ptr, 20 * MIB));
    assert!(holds(b.ptr.as_ptr(), 3 * MIB, 5));
    let after = E.stats.snapshot();
    assert_eq!(after.grown_in_place, before.grown_in_place + 1);
    assert_eq!(maps(&after), maps(&before));
    free(&E, b.ptr.as_ptr(), &C);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise, mremap")]
fn a_growth_that_cannot_stay_moves_the_pages_and_frees_the_old_units() {
    static E: Engine = Engine::new(false);
    let a = alloc(&E, 8 * MIB, Fill::Uninit, &C);
    let neighbour = alloc(&E, 2 * MIB, Fill::Uninit, &C);
    assert_eq!(neighbour.ptr.as_ptr(), a.ptr.as_ptr().wrapping_add(8 * MIB));
    fill(a.ptr.as_ptr(), 8 * MIB, 7);
    let before = E.stats.snapshot();
    // SAFETY: the test's block.
    let g = unsafe { E.resize(a.ptr.as_ptr(), 64 * MIB + 1, 16, Fill::Zeroed, &C) }.unwrap();
    assert_ne!(g.ptr, a.ptr);
    assert_eq!(g.len, 66 * MIB);
    assert!(holds(g.ptr.as_ptr(), 8 * MIB, 7), "the bytes moved");
    // SAFETY: inside the grown block.
    assert!(zero(unsafe { g.ptr.as_ptr().add(8 * MIB) }, 58 * MIB));
    let after = E.stats.snapshot();
    assert_eq!(after.moved + after.copied, before.moved + before.copied + 1);
    if cfg!(target_os = "linux") {
        assert_eq!(after.moved, before.moved + 1, "moved, not copied");
        assert_eq!(after.syscalls.mmap, before.syscalls.mmap);
    }
    assert_eq!(
        E.usable_size(a.ptr.as_ptr()),
        None,
        "the old place is no block"
    );
    // The old units are clean: a zeroed request there reads zero.
    let reuse = alloc(&E, 8 * MIB, Fill::Zeroed, &C);
    assert_eq!(reuse.ptr, a.ptr);
    assert!(zero(reuse.ptr.as_ptr(), 8 * MIB));
    for b in [reuse, neighbour, g] {
        free(&E, b.ptr.as_ptr(), &C);
    }
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn zeroed_requests_read_zero_after_dirty_frees_by_either_policy() {
    static E: Engine = Engine::new(false);
    for policy in [RUST, C] {
        // Below and above the memset cutoff.
        for size in [4 * MIB, 20 * MIB] {
            let b = alloc(&E, size, Fill::Uninit, &policy);
            fill(b.ptr.as_ptr(), b.len, 0xa5);
            free(&E, b.ptr.as_ptr(), &policy);
            let hits = E.stats.snapshot().retention_hits;
            let z = alloc(&E, size, Fill::Zeroed, &policy);
            assert_eq!(E.stats.snapshot().retention_hits, hits + 1, "a hit");
            assert!(zero(z.ptr.as_ptr(), size), "{size} bytes read zero");
            free(&E, z.ptr.as_ptr(), &policy);
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn retained_bytes_stay_under_the_cap_purging_the_freed_block_or_the_oldest() {
    static E: Engine = Engine::new(false);
    let cap = retain::cap(&E.stats, RUST.cap) as u64;
    let blocks: Vec<Block> = (0..3)
        .map(|_| alloc(&E, 64 * MIB, Fill::Uninit, &RUST))
        .collect();
    for b in &blocks {
        fill(b.ptr.as_ptr(), b.len, 9);
        free(&E, b.ptr.as_ptr(), &RUST);
        assert!(E.stats.snapshot().retained_bytes <= cap);
    }
    // The first two are retained, the third purged (Rust: the freed block).
    let s = E.stats.snapshot();
    assert_eq!(s.retained_bytes, 128 * MIB as u64);
    assert!(s.purged_bytes >= 64 * MIB as u64);
    assert!(retain::release_all(&E.stats, &E.spans) >= 128 * MIB);
    assert_eq!(E.stats.snapshot().retained_bytes, 0);
    // C: the newest block stays, the oldest is purged to make room (its
    // cap follows the live peak: here three blocks of 64 MiB).
    let blocks: Vec<Block> = (0..5)
        .map(|_| alloc(&E, 64 * MIB, Fill::Uninit, &C))
        .collect();
    let cap = retain::cap(&E.stats, C.cap);
    assert_eq!(cap, 2 * 320 * MIB);
    for b in &blocks {
        free(&E, b.ptr.as_ptr(), &C);
    }
    assert_eq!(E.stats.snapshot().retained_bytes, 320 * MIB as u64);
    retain::release_all(&E.stats, &E.spans);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn decay_purges_units_after_the_delay_and_gives_an_idle_span_back() {
    static E: Engine = Engine::new(false);
    let b = alloc(&E, 16 * MIB, Fill::Uninit, &RUST);
    fill(b.ptr.as_ptr(), b.len, 2);
    free(&E, b.ptr.as_ptr(), &RUST);
    let before = E.stats.snapshot();
    assert_eq!(before.spans, 1);
    let now = span::stamp_now();
    // Not yet expired.
    retain::decay(&E.stats, &E.spans, now, 1000);
    assert_eq!(E.stats.snapshot().retained_bytes, 16 * MIB as u64);
    // A block still in use keeps the span: expired units are purged, with
    // no unmap.
    let other = alloc(&E, 2 * MIB, Fill::Uninit, &Policy::CK_HUGE);
    let before = E.stats.snapshot();
    retain::decay(&E.stats, &E.spans, now + 2000, 1000);
    let mid = E.stats.snapshot();
    assert_eq!(mid.retained_bytes, 0);
    assert_eq!(mid.decayed_bytes, before.decayed_bytes + 16 * MIB as u64);
    assert_eq!(
        mid.syscalls.munmap, before.syscalls.munmap,
        "purged, not unmapped"
    );
    assert!(
        zero(b.ptr.as_ptr().wrapping_add(2 * MIB), 14 * MIB),
        "purged units read zero"
    );
    // Once no unit is in use and the last free is the delay old, the span
    // goes back whole.
    free(&E, other.ptr.as_ptr(), &Policy::CK_HUGE);
    retain::decay(&E.stats, &E.spans, now + 1000, 1000);
    assert_eq!(
        E.stats.snapshot().spans,
        1,
        "not yet: the last free is recent"
    );
    retain::decay(&E.stats, &E.spans, now + 5000, 1000);
    let after = E.stats.snapshot();
    assert_eq!(
        (after.spans, after.spans_released),
        (0, 1),
        "the idle span is given back"
    );
    assert_eq!(after.syscalls.munmap, before.syscalls.munmap + 1);
    assert_eq!(after.retained_bytes, 0);
}

#[test]
#[cfg_attr(miri, ignore = "mlock, mprotect")]
fn a_block_freed_locked_and_read_only_is_cleared_writable_and_unlocked_for_the_next_calloc() {
    static E: Engine = Engine::new(false);
    let b = alloc(&E, 16 * MIB, Fill::Uninit, &C);
    fill(b.ptr.as_ptr(), b.len, 4);
    // SAFETY: the test's block; locking and protecting change no byte.
    unsafe {
        let _ = libc::mlock(b.ptr.as_ptr().cast(), b.len);
        assert_eq!(
            libc::mprotect(b.ptr.as_ptr().cast(), b.len, libc::PROT_READ),
            0
        );
    }
    free(&E, b.ptr.as_ptr(), &C);
    let z = alloc(&E, 16 * MIB, Fill::Zeroed, &C);
    assert_eq!(z.ptr, b.ptr, "the block comes back");
    assert!(zero(z.ptr.as_ptr(), z.len));
    fill(z.ptr.as_ptr(), z.len, 8);
    assert!(holds(z.ptr.as_ptr(), z.len, 8), "writable again");
    // The Rust policy's memset path makes a read-only block writable too.
    // SAFETY: the test's block.
    unsafe {
        assert_eq!(
            libc::mprotect(z.ptr.as_ptr().cast(), z.len, libc::PROT_READ),
            0
        )
    };
    free(&E, z.ptr.as_ptr(), &RUST);
    let m = alloc(&E, 4 * MIB, Fill::Zeroed, &RUST);
    assert_eq!(m.ptr, z.ptr);
    assert!(zero(m.ptr.as_ptr(), 4 * MIB));
    free(&E, m.ptr.as_ptr(), &RUST);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, /proc")]
fn the_blocks_of_a_span_share_its_vmas() {
    static E: Engine = Engine::new(false);
    let blocks: Vec<Block> = (0..200)
        .map(|_| alloc(&E, 9 << 18, Fill::Uninit, &C))
        .collect();
    let lo = blocks
        .iter()
        .map(|b| b.ptr.as_ptr() as usize)
        .min()
        .unwrap();
    let hi = blocks
        .iter()
        .map(|b| b.ptr.as_ptr() as usize + b.len)
        .max()
        .unwrap();
    assert_eq!(hi - lo, 200 * 4 * MIB, "packed");
    assert!(vmas(lo, hi - lo) <= 2, "{} VMAs", vmas(lo, hi - lo));
    for b in blocks {
        free(&E, b.ptr.as_ptr(), &C);
    }
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn threads_take_their_fresh_blocks_from_spans_of_their_own() {
    static E: Engine = Engine::new(false);
    let both = std::sync::Barrier::new(2);
    let spans: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let b = alloc(&E, 8 * MIB, Fill::Uninit, &RUST);
                    let d = E.extents.lookup(b.ptr.as_ptr()).unwrap();
                    let group = span::home_group();
                    both.wait();
                    free(&E, b.ptr.as_ptr(), &RUST);
                    (d.span, group)
                })
            })
            .collect();
        let r: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_ne!(r[0].1, r[1].1, "two new threads, two groups");
        r.into_iter().map(|(s, _)| s).collect()
    });
    assert_ne!(spans[0], spans[1]);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn alignments_up_to_1_gib_are_met_from_spans() {
    static E: Engine = Engine::new(false);
    for align in [4 * MIB, 64 * MIB, 1 << 30] {
        let b = E.alloc(4 * MIB, align, Fill::Uninit, &RUST).unwrap();
        assert_eq!(b.ptr.as_ptr() as usize % align, 0, "{align}");
        free(&E, b.ptr.as_ptr(), &RUST);
        let again = E.alloc(4 * MIB, align, Fill::Uninit, &RUST).unwrap();
        assert_eq!(again.ptr, b.ptr, "{align}: the aligned block comes back");
        free(&E, again.ptr.as_ptr(), &RUST);
    }
    // A block longer than a span gets a span of its own, in longer units.
    let big = E.alloc(3 << 30, HUGE_PAGE_2M, Fill::Uninit, &RUST).unwrap();
    assert_eq!(big.len, 3 << 30);
    // SAFETY: the test's block.
    let small = unsafe { E.resize(big.ptr.as_ptr(), 6 * MIB, 16, Fill::Uninit, &RUST) }.unwrap();
    assert_eq!(small.ptr, big.ptr, "a shrink stays in place");
    free(&E, small.ptr.as_ptr(), &RUST);
    retain::release_all(&E.stats, &E.spans);
}

#[test]
#[cfg_attr(miri, ignore = "mmap with PROT_NONE, madvise")]
fn racing_threads_with_decay_and_release_never_share_a_unit() {
    static E: Engine = Engine::new(false);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                let mut live: Vec<(Block, u8)> = Vec::new();
                for i in 0..400usize {
                    let size = ((i * 7 + t as usize) % 9 + 1) * MIB + 3;
                    let policy = if i % 2 == 0 { &C } else { &RUST };
                    let b = alloc(&E, size, Fill::Uninit, policy);
                    let seed = (i as u8) ^ t;
                    fill(b.ptr.as_ptr(), size, seed);
                    live.push((b, seed));
                    if live.len() > 6 {
                        let (b, seed) = live.swap_remove(i % live.len());
                        assert!(holds(b.ptr.as_ptr(), b.len.min(MIB), seed), "thread {t}");
                        free(&E, b.ptr.as_ptr(), policy);
                    }
                    if i % 50 == 0 {
                        retain::decay(
                            &E.stats,
                            &E.spans,
                            span::stamp_now().wrapping_add(1 << 20),
                            0,
                        );
                        retain::release_all(&E.stats, &E.spans);
                    }
                }
                for (b, seed) in live {
                    assert!(holds(b.ptr.as_ptr(), b.len.min(MIB), seed));
                    free(&E, b.ptr.as_ptr(), &C);
                }
            });
        }
    });
    assert_eq!(E.stats.snapshot().live_bytes, 0);
}
