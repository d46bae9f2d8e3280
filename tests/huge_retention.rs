//! `CkHuge`'s process-wide retention cache, through `GlobalAlloc`: reuse,
//! exact lengths, alignment, zeroing, the cap, decay, `release_retained`,
//! statistics, threads, fork, and the uncached and `allocator_api2` paths
//! that map per block.

mod common;

use ckalloc::caching::CachingAllocator;
use ckalloc::{env, huge_stats, release_retained, CkHuge, HugeStats};
use common::{run_child, serial};
use std::alloc::{GlobalAlloc, Layout};

const MIB: usize = 1 << 20;

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

fn mappings(s: &HugeStats) -> u64 {
    s.hugetlb.mappings + s.thp.mappings + s.normal.mappings
}

/// Allocates `size` bytes through `GlobalAlloc`, panicking on null.
fn alloc(a: &CkHuge, l: Layout) -> *mut u8 {
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null(), "{l:?}");
    p
}

fn free(a: &CkHuge, p: *mut u8, l: Layout) {
    // SAFETY: `p` came from `a` (or another CkHuge) with `l`.
    unsafe { a.dealloc(p, l) }
}

#[test]
fn freed_block_is_reused_by_another_value_without_mapping() {
    let _s = serial();
    release_retained();
    let (a, b) = (CkHuge::new(), CkHuge::with_threshold(MIB));
    let l = layout(4 * MIB, 8);
    let p = alloc(&a, l);
    free(&a, p, l);
    let before = huge_stats();
    let q = alloc(&b, l);
    let after = huge_stats();
    assert_eq!(q, p, "the retained block serves the next request");
    assert_eq!(mappings(&after), mappings(&before), "a hit maps nothing");
    assert_eq!(after.retention_hits, before.retention_hits + 1);
    free(&b, q, l);
    release_retained();
}

#[test]
fn only_blocks_of_the_exact_rounded_length_are_reused() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l4 = layout(4 * MIB, 8);
    let p = alloc(&a, l4);
    free(&a, p, l4);
    let before = huge_stats();
    let l6 = layout(6 * MIB, 8);
    let q = alloc(&a, l6);
    assert_ne!(q, p, "a 6 MiB request must not get a 4 MiB block");
    assert_eq!(huge_stats().retention_misses, before.retention_misses + 1);
    // 3 MiB + 1 rounds to the same 4 MiB.
    let l3 = layout(3 * MIB + 1, 8);
    let r = alloc(&a, l3);
    assert_eq!(r, p);
    // SAFETY: the whole 4 MiB mapping is ours; its last byte is writable.
    unsafe { *r.add(4 * MIB - 1) = 1 };
    free(&a, q, l6);
    free(&a, r, l3);
    release_retained();
}

#[test]
fn a_hit_meets_the_requested_alignment() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    // Retain blocks until one is not 64 MiB aligned.
    let mut kept = Vec::new();
    let p = loop {
        let p = alloc(&a, l);
        if !(p as usize).is_multiple_of(64 * MIB) {
            break p;
        }
        kept.push(p);
    };
    free(&a, p, l);
    let big = layout(4 * MIB, 64 * MIB);
    let q = alloc(&a, big);
    assert!((q as usize).is_multiple_of(64 * MIB), "alignment of a hit");
    assert_ne!(q, p);
    free(&a, q, big);
    for k in kept {
        free(&a, k, l);
    }
    release_retained();
}

#[test]
fn zeroed_hits_read_zero_below_and_above_the_memset_cutoff() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    for size in [4 * MIB, 32 * MIB] {
        let l = layout(size, 8);
        let p = alloc(&a, l);
        // SAFETY: `size` bytes are ours.
        unsafe { p.write_bytes(0xAB, size) };
        free(&a, p, l);
        let hits = huge_stats().retention_hits;
        // SAFETY: non-zero size.
        let z = unsafe { a.alloc_zeroed(l) };
        assert_eq!(z, p, "{size}: the dirty block comes back");
        assert_eq!(huge_stats().retention_hits, hits + 1);
        // SAFETY: `size` bytes are ours.
        let s = unsafe { std::slice::from_raw_parts(z, size) };
        assert!(s.iter().all(|&b| b == 0), "{size}: not zeroed");
        free(&a, z, l);
    }
    release_retained();
}

#[test]
fn retained_bytes_stay_under_the_cap() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let blocks: Vec<_> = (0..40).map(|_| alloc(&a, l)).collect();
    let before = huge_stats();
    for &p in &blocks {
        free(&a, p, l);
    }
    let after = huge_stats();
    let cap = env::retain_bytes() as u64;
    assert!(after.retained_bytes <= cap, "{after:?}");
    assert!(after.retained_bytes >= cap.min(64 * 4 * MIB as u64) - 4 * MIB as u64);
    // What the cache refused was unmapped.
    let refused = 160 * MIB as u64 - after.retained_bytes;
    assert_eq!(after.unmapped_bytes - before.unmapped_bytes, refused);
    release_retained();
}

#[test]
fn per_value_cap_and_uncached_map_per_block() {
    let _s = serial();
    release_retained();
    let l = layout(4 * MIB, 8);
    for a in [CkHuge::uncached(), CkHuge::new().retain_max_bytes(2 * MIB)] {
        let before = huge_stats();
        for _ in 0..2 {
            let p = alloc(&a, l);
            free(&a, p, l);
        }
        let after = huge_stats();
        assert_eq!(mappings(&after), mappings(&before) + 2, "{a:?}");
        assert_eq!(after.unmaps, before.unmaps + 2);
        assert_eq!(after.retained_bytes, 0);
        assert_eq!(after.retention_hits, before.retention_hits);
    }
    assert_eq!(CkHuge::uncached().retain_max(), 0);
    assert_ne!(CkHuge::uncached(), CkHuge::new());
}

#[test]
fn release_retained_unmaps_everything_and_stats_add_up() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let start = huge_stats();
    let l = layout(6 * MIB, 8);
    let p = alloc(&a, l);
    assert_eq!(
        huge_stats().live_bytes(),
        start.live_bytes() + 6 * MIB as u64
    );
    free(&a, p, l);
    let kept = huge_stats();
    assert_eq!(kept.retained_bytes, 6 * MIB as u64);
    assert_eq!(
        kept.live_bytes(),
        start.live_bytes(),
        "retained is not live"
    );
    assert!(kept.to_string().contains("retained: 6.00 MiB"), "{kept}");
    assert_eq!(release_retained(), 6 * MIB);
    let end = huge_stats();
    assert_eq!(end.retained_bytes, 0);
    assert_eq!(end.unmapped_bytes, kept.unmapped_bytes + 6 * MIB as u64);
    assert_eq!(end.live_bytes(), start.live_bytes());
    assert_eq!(release_retained(), 0);
}

#[test]
fn two_threads_share_the_cache_without_losing_blocks() {
    let _s = serial();
    release_retained();
    let start = huge_stats();
    let workers: Vec<_> = (0..2u8)
        .map(|t| {
            std::thread::spawn(move || {
                let a = CkHuge::new();
                for i in 0..3000usize {
                    let size = (2 + (i + t as usize) % 3 * 2) * MIB;
                    let l = layout(size, 8);
                    let p = alloc(&a, l);
                    // SAFETY: first and last byte of our block.
                    unsafe {
                        *p = t;
                        *p.add(size - 1) = t;
                        std::hint::black_box(p);
                        assert_eq!((*p, *p.add(size - 1)), (t, t));
                    }
                    free(&a, p, l);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let end = huge_stats();
    assert!(end.retention_hits - start.retention_hits > 3000, "{end:?}");
    release_retained();
    assert_eq!(huge_stats().live_bytes(), start.live_bytes());
}

#[test]
fn caching_allocator_over_ckhuge_trims_to_the_kernel() {
    let _s = serial();
    release_retained();
    let c = CachingAllocator::unbounded(CkHuge::new());
    let l = allocator_api2::alloc::Layout::from_size_align(8 * MIB, 8).unwrap();
    use allocator_api2::alloc::Allocator;
    let b = c.allocate(l).unwrap();
    // SAFETY: allocated above with `l`.
    unsafe { c.deallocate(b.cast(), l) };
    let before = huge_stats();
    c.trim();
    let after = huge_stats();
    assert_eq!(after.unmapped_bytes, before.unmapped_bytes + 8 * MIB as u64);
    assert_eq!(after.retained_bytes, 0, "the cache is the only cache");
}

#[test]
fn decay_gives_blocks_back_after_the_delay() {
    run_child(
        "child_decay",
        &[
            ("CKALLOC_RETAIN_DECAY_MS", "20"),
            ("CKALLOC_RETAIN_BYTES", "33554432"),
        ],
    );
}

#[test]
#[ignore = "run by decay_gives_blocks_back_after_the_delay"]
fn child_decay() {
    assert_eq!(env::retain_decay_ms(), 20);
    assert_eq!(env::retain_bytes(), 32 * MIB);
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let p = alloc(&a, l);
    free(&a, p, l);
    assert_eq!(huge_stats().retained_bytes, 4 * MIB as u64);
    let small = layout(64, 8);
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(25));
        // Small allocations while a block is retained drive the decay steps.
        for _ in 0..1024 {
            let q = alloc(&a, small);
            free(&a, q, small);
        }
        if huge_stats().retained_bytes == 0 {
            break;
        }
    }
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    assert_eq!(s.decayed_bytes, 4 * MIB as u64);
}

#[test]
fn retention_off_by_environment_maps_per_block() {
    run_child("child_retention_off", &[("CKALLOC_RETAIN_BYTES", " 0 ")]);
}

#[test]
#[ignore = "run by retention_off_by_environment_maps_per_block"]
fn child_retention_off() {
    assert_eq!(env::retain_bytes(), 0);
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let before = huge_stats();
    for _ in 0..3 {
        let p = alloc(&a, l);
        free(&a, p, l);
    }
    let after = huge_stats();
    assert_eq!(mappings(&after), mappings(&before) + 3);
    assert_eq!(after.retained_bytes, 0);
}

#[cfg(target_os = "linux")]
#[test]
fn fork_child_allocates_while_another_thread_holds_retention_slots() {
    use std::sync::mpsc;
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let (held_tx, held_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        // Every slot is claimed, as by threads caught mid operation; the
        // child can retain its block only once the fork handler frees them.
        ckalloc::huge::hold_retention_slots(true);
        held_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        ckalloc::huge::hold_retention_slots(false);
    });
    held_rx.recv().unwrap();
    // SAFETY: the child only maps, unmaps and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let q = alloc(&a, l);
            // SAFETY: our block.
            unsafe { q.write_bytes(1, 4 * MIB) };
            free(&a, q, l);
            let hits = huge_stats().retention_hits;
            let r = alloc(&a, l);
            free(&a, r, l);
            r == q && huge_stats().retention_hits == hits + 1
        });
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: waits for our child.
    let w = unsafe { libc::waitpid(pid, &mut status, 0) };
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(w, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    release_retained();
}

/// A small allocator that counts its calls and forwards them to `System`.
struct Counting(std::sync::atomic::AtomicUsize);

// SAFETY: forwards to `System`, which upholds the contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

static WITH_SMALL: CkHuge<Counting> =
    CkHuge::with_small_allocator(Counting(std::sync::atomic::AtomicUsize::new(0)))
        .threshold_bytes(4 * MIB)
        .retain_max_bytes(8 * MIB);

#[test]
fn small_requests_go_to_the_small_allocator() {
    let _s = serial();
    let a = &WITH_SMALL;
    assert_eq!((a.threshold(), a.retain_max()), (4 * MIB, 8 * MIB));
    let calls = || {
        a.small_allocator()
            .0
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = calls();
    let small = layout(3 * MIB, 8);
    // SAFETY: non-zero size; freed with its layout.
    unsafe { a.dealloc(a.alloc(small), small) };
    assert_eq!(
        calls(),
        before + 2,
        "below the threshold: the small allocator"
    );
    release_retained();
    let maps = mappings(&huge_stats());
    let big = layout(4 * MIB, 8);
    // SAFETY: as above.
    unsafe { a.dealloc(a.alloc(big), big) };
    assert_eq!(calls(), before + 2, "at the threshold: a mapping");
    assert_eq!(mappings(&huge_stats()), maps + 1);
    assert_eq!(huge_stats().retained_bytes, 4 * MIB as u64);
    release_retained();
}

#[test]
fn blocks_freed_by_an_exited_thread_serve_other_threads() {
    let _s = serial();
    release_retained();
    let l = layout(6 * MIB, 8);
    let addr = std::thread::spawn(move || {
        let a = CkHuge::new();
        let p = alloc(&a, l);
        free(&a, p, l);
        p as usize
    })
    .join()
    .unwrap();
    assert_eq!(huge_stats().retained_bytes, 6 * MIB as u64);
    let a = CkHuge::new();
    let q = alloc(&a, l);
    assert_eq!(q as usize, addr, "the exited thread's block is shared");
    free(&a, q, l);
    release_retained();
}
