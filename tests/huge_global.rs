//! `CkHuge` as the `#[global_allocator]` of this test binary: a real
//! workload, threads, and the engine's retention under load: `realloc` of
//! retained blocks across 2 MiB boundaries, alignments above 2 MiB, frees
//! with a different size of the same 2 MiB-rounded length, carving,
//! `alloc_zeroed` around the memset cutoff, first touch, the cap and decay
//! read from the environment, statistics, thread exit, `fork` while threads
//! churn, hugetlb blocks, VMAs, and a small allocator that fails.

mod common;

use ckalloc::{env, huge_stats, release_retained, CkHuge};
use common::{run_child, serial};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[global_allocator]
static A: CkHuge = CkHuge::new();

const MIB: usize = 1 << 20;

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

fn alloc(l: Layout) -> *mut u8 {
    // SAFETY: non-zero size.
    let p = unsafe { A.alloc(l) };
    assert!(!p.is_null(), "{l:?}");
    p
}

fn free(p: *mut u8, l: Layout) {
    // SAFETY: `p` came from `A` with a layout of the same rounded length.
    unsafe { A.dealloc(p, l) }
}

/// A byte pattern that differs at every offset of a 2 MiB page pair.
fn pattern(i: usize, seed: u8) -> u8 {
    (i / 4096) as u8 ^ (i as u8) ^ seed
}

/// Writes the pattern over `p[..n]`.
fn fill(p: *mut u8, n: usize, seed: u8) {
    // SAFETY: the caller owns `n` bytes at `p`.
    let s = unsafe { std::slice::from_raw_parts_mut(p, n) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = pattern(i, seed);
    }
}

/// Whether `p[..n]` holds the pattern.
fn holds(p: *const u8, n: usize, seed: u8) -> bool {
    // SAFETY: the caller owns `n` bytes at `p`.
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    s.iter().enumerate().all(|(i, &b)| b == pattern(i, seed))
}

/// Fork a child that runs `body` and `_exit`s with the code it returns (an
/// `alarm` kills it after 10 s); the child's wait status unless it exited
/// with 0. `body` makes only allocator calls, reads statistics and calls
/// what is async-signal-safe: the parent may have other threads.
fn fork_child(body: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child runs `body` (see above) and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: `alarm` kills a child that hangs.
        unsafe { libc::alarm(10) };
        let code = body();
        // SAFETY: ends the child without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    (!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0)).then_some(status)
}

#[test]
fn real_workload_runs_on_ckhuge() {
    let _s = serial();
    let before = huge_stats();
    // A large Vec: 64 MiB goes through the mapping path, growth through mremap.
    let mut v: Vec<u64> = Vec::new();
    for i in 0..8_000_000u64 {
        v.push(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7);
    }
    let sum_before: u128 = v.iter().map(|&x| x as u128).sum();
    v.sort_unstable();
    assert!(v.windows(2).all(|w| w[0] <= w[1]));
    let sum_after: u128 = v.iter().map(|&x| x as u128).sum();
    assert_eq!(sum_before, sum_after, "sorting lost or changed elements");

    // HashMap with many small allocations (System path) and a big table.
    let mut m: HashMap<String, usize> = HashMap::new();
    for i in 0..200_000 {
        m.insert(format!("key-{i}"), i * 2);
    }
    assert_eq!(m.len(), 200_000);
    assert!((0..200_000)
        .step_by(997)
        .all(|i| m[&format!("key-{i}")] == i * 2));

    // String building past the threshold.
    let mut s = String::new();
    for i in 0..400_000 {
        s.push_str(&i.to_string());
        s.push(',');
    }
    let parsed: Vec<usize> = s
        .trim_end_matches(',')
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(parsed.len(), 400_000);
    assert_eq!(parsed[123_456], 123_456);

    let after = huge_stats();
    let blocks = |s: &ckalloc::HugeStats| s.hugetlb.blocks + s.thp.blocks + s.normal.blocks;
    assert!(
        blocks(&after) > blocks(&before),
        "large blocks are the engine's"
    );
    // Vec growth resizes in place or moves pages; it copies only hugetlb
    // blocks that outgrow their span.
    let resized = |s: &ckalloc::HugeStats| s.grown_in_place + s.moved + s.copied;
    assert!(resized(&after) > resized(&before));
    if after.hugetlb.blocks == before.hugetlb.blocks {
        assert_eq!(after.copied, before.copied, "nothing copied");
    }
}

#[test]
fn threads_allocate_concurrently() {
    let _s = serial();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut total = 0usize;
                for round in 0..20 {
                    let n = (1 << 20) * (1 + (round + t) % 5);
                    let mut b = vec![t as u8; n];
                    b[n - 1] = round as u8;
                    total += b.iter().map(|&x| x as usize).sum::<usize>();
                }
                total
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap();
        let expect: usize = (0..20)
            .map(|round| {
                let n = (1usize << 20) * (1 + (round + t) % 5);
                (n - 1) * t + round
            })
            .sum();
        assert_eq!(got, expect);
    }
}

#[test]
fn realloc_of_retained_blocks_keeps_contents_across_2mib_boundaries() {
    let _s = serial();
    release_retained();
    // Sizes on, just under and just over 2 MiB multiples, growing and
    // shrinking, in place or moved (a neighbour blocks in-place growth).
    let steps = [
        4 * MIB,
        4 * MIB - 1,
        4 * MIB + 1,
        8 * MIB,
        6 * MIB - 7,
        2 * MIB,
        2 * MIB - 1,
        MIB,
        10 * MIB + 3,
        4 * MIB,
    ];
    for round in 0..3u8 {
        let neighbour = layout(2 * MIB, 8);
        let mut held = Vec::new();
        let mut size = steps[0];
        let mut p = alloc(layout(size, 8));
        fill(p, size, round);
        for &next in &steps[1..] {
            // A block right after `p` (often the next free range) makes
            // some growths move.
            held.push(alloc(neighbour));
            // SAFETY: `p` came from `A` with `layout(size, 8)`; `next > 0`.
            let q = unsafe { A.realloc(p, layout(size, 8), next) };
            assert!(!q.is_null(), "{size} -> {next}");
            let kept = size.min(next);
            assert!(holds(q, kept, round), "{size} -> {next}: contents");
            // The whole new size is writable.
            fill(q, next, round);
            p = q;
            size = next;
        }
        free(p, layout(size, 8));
        for h in held {
            free(h, neighbour);
        }
    }
    release_retained();
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0);
}

#[test]
fn alignments_of_4mib_and_1gib_are_met_by_retained_blocks() {
    let _s = serial();
    release_retained();
    let plain = layout(4 * MIB, 8);
    // Fill the cache with 4 MiB blocks of all kinds of alignment.
    let blocks: Vec<_> = (0..8).map(|_| alloc(plain)).collect();
    for &b in &blocks {
        free(b, plain);
    }
    for align in [4 * MIB, 64 * MIB, 1 << 30] {
        let l = layout(4 * MIB, align);
        let p = alloc(l);
        assert!((p as usize).is_multiple_of(align), "{align}: {p:p}");
        fill(p, 4 * MIB, 1);
        free(p, l);
        // Retained units meet the alignment again.
        let hits = huge_stats().retention_hits;
        let q = alloc(l);
        assert!((q as usize).is_multiple_of(align), "{align}: {q:p}");
        assert_eq!(huge_stats().retention_hits, hits + 1);
        // SAFETY: `q..q+4 MiB` is `l`'s block; realloc keeps the alignment.
        let r = unsafe { A.realloc(q, l, 12 * MIB) };
        assert!((r as usize).is_multiple_of(align), "{align}: grown {r:p}");
        free(r, layout(12 * MIB, align));
    }
    release_retained();
}

#[test]
fn a_free_with_another_size_of_the_same_rounded_length_is_retained_whole() {
    let _s = serial();
    release_retained();
    let before = huge_stats();
    let p = alloc(layout(3 * MIB + 1, 8));
    fill(p, 4 * MIB, 3);
    free(p, layout(4 * MIB, 8));
    assert_eq!(huge_stats().retained_bytes, 4 * MIB as u64);
    let q = alloc(layout(2 * MIB + 1, 8));
    assert_eq!(q, p);
    // The last byte of the 4 MiB mapping is still mapped.
    // SAFETY: the mapping is 4 MiB long.
    unsafe { *q.add(4 * MIB - 1) = 9 };
    free(q, layout(4 * MIB - 1, 8));
    release_retained();
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(
        after.live_bytes, before.live_bytes,
        "everything mapped here was unmapped"
    );
}

/// The engine's system calls that map or unmap, so far.
fn mappings() -> u64 {
    let s = huge_stats().syscalls;
    s.mmap + s.munmap + s.mremap
}

#[test]
fn a_freed_buffer_is_carved_for_shorter_requests_and_merged_back_whole() {
    let _s = serial();
    release_retained();
    let before = huge_stats();
    // A buffer read whole and freed (a model file, say): 90 MB, more than a
    // quarter of the default cap, is retained.
    let big = layout(90_000_000, 8);
    let p = alloc(big);
    fill(p, 90_000_000, 31);
    free(p, big);
    let len = 90_000_000usize.next_multiple_of(2 * MIB);
    assert_eq!(huge_stats().retained_bytes, len as u64);
    let maps = mappings();
    let carves = huge_stats().retention_carves;
    // Shorter requests take consecutive pieces from its front, and what
    // they hold is theirs to write.
    let sizes = [6 * MIB, 4 * MIB + 1, 2 * MIB, 12 * MIB - 3];
    let mut at = p;
    let mut pieces = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let q = alloc(layout(size, 8));
        assert_eq!(q, at, "piece {i} is carved from the front");
        fill(q, size, i as u8);
        at = at.wrapping_add(size.next_multiple_of(2 * MIB));
        pieces.push((q, size));
    }
    assert_eq!(mappings(), maps, "no mapping was made");
    let taken: usize = sizes.iter().map(|s| s.next_multiple_of(2 * MIB)).sum();
    assert_eq!(huge_stats().retained_bytes, (len - taken) as u64);
    for (i, &(q, size)) in pieces.iter().enumerate() {
        assert!(holds(q, size, i as u8), "piece {i} kept its bytes");
    }
    // Freed in a scattered order, the pieces merge with each other and the
    // rest into the one block again, which serves the whole length.
    for &i in &[2, 0, 3, 1] {
        let (q, size) = pieces[i];
        free(q, layout(size, 8));
    }
    assert_eq!(huge_stats().retained_bytes, len as u64);
    let whole = alloc(big);
    assert_eq!(whole, p, "one block again");
    assert_eq!(mappings(), maps, "no mapping was made");
    free(whole, big);
    release_retained();
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(after.live_bytes, before.live_bytes);
    assert!(after.retention_carves >= carves + sizes.len() as u64 - 1);
}

/// Whether this process maps `CkHuge` blocks as THP (no hugetlb pages
/// reserved, or `CKALLOC_HUGETLB=0`, and THP not off).
fn maps_thp() -> bool {
    let before = huge_stats().thp.blocks;
    let l = layout(2 * MIB, 8);
    let p = alloc(l);
    let thp = huge_stats().thp.blocks > before;
    free(p, l);
    release_retained();
    thp
}

#[test]
fn a_fresh_thp_block_is_faulted_in_while_its_pages_come_in_fast() {
    run_child("child_first_touch_probe", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by a_fresh_thp_block_is_faulted_in_while_its_pages_come_in_fast"]
fn child_first_touch_probe() {
    if !maps_thp() {
        eprintln!("no THP here: skipped");
        return;
    }
    let before = huge_stats();
    let l = layout(16 * MIB, 8);
    let p = alloc(l);
    let after = huge_stats();
    assert_eq!(after.first_touch_probes, before.first_touch_probes + 1);
    assert!(after.first_touch_probe_ns > before.first_touch_probe_ns);
    // The pages faulted in are resident before the caller writes a byte:
    // all 16 MiB when every page came in fast, the pages up to the first
    // slow one otherwise, with the rest sent to base pages.
    let populated = after.first_touch_populated_bytes - before.first_touch_populated_bytes;
    let based = after.first_touch_base_bytes - before.first_touch_base_bytes;
    assert!(populated >= 2 * MIB as u64, "{after:?}");
    let c = ckalloc::huge_page_coverage(p, populated as usize).unwrap();
    assert_eq!(c.mapped_bytes, populated, "{c:?}");
    let slow = after.first_touch_slow_probes > before.first_touch_slow_probes;
    if slow {
        assert_eq!(populated + based, 16 * MIB as u64, "{after:?}");
    } else {
        assert_eq!((populated, based), (16 * MIB as u64, 0), "{after:?}");
    }
    fill(p, 16 * MIB, 3);
    assert!(holds(p, 16 * MIB, 3));
    free(p, l);
    release_retained();
    // A block of one 2 MiB page is not probed.
    let before = huge_stats();
    let l = layout(2 * MIB, 8);
    let p = alloc(l);
    assert_eq!(huge_stats().first_touch_probes, before.first_touch_probes);
    free(p, l);
    release_retained();
}

#[test]
fn the_probe_takes_the_wait_for_a_cpu_out_of_a_page_s_cost() {
    run_child("child_first_touch_contended", &[("CKALLOC_HUGETLB", "0")]);
}

/// The first CPU this thread may run on.
fn first_allowed_cpu() -> Option<usize> {
    // SAFETY: a zeroed `cpu_set_t` is the empty set; sched_getaffinity fills
    // it; CPU_ISSET reads inside it (indices below CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set))
    }
}

/// Pin the calling thread to `cpu` alone; `false` when the kernel refuses.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed `cpu_set_t` is the empty set; CPU_SET writes inside it
    // (`cpu` comes from `first_allowed_cpu`, below CPU_SETSIZE);
    // sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[test]
#[ignore = "run by the_probe_takes_the_wait_for_a_cpu_out_of_a_page_s_cost"]
fn child_first_touch_contended() {
    if !maps_thp() {
        eprintln!("no THP here: skipped");
        return;
    }
    if std::fs::read("/proc/thread-self/schedstat").is_err() {
        eprintln!("no /proc/thread-self/schedstat: skipped");
        return;
    }
    let Some(cpu) = first_allowed_cpu().filter(|&c| pin_to(c)) else {
        eprintln!("cannot pin a thread to a CPU here: skipped");
        return;
    };
    // Two CPU-bound threads share that CPU with the probing thread, so it
    // waits for the CPU while it faults pages in.
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let pinned = pin_to(cpu);
                while pinned && !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let before = huge_stats();
    let mut after = before;
    // Until the probe has waited for the CPU: each try probes a fresh 64 MiB
    // block (32 pages) with the window after a slow page closed, so slow
    // memory cannot keep the probe from running.
    for _ in 0..200 {
        ckalloc::huge::hold_first_touch_base_pages(false);
        let l = layout(64 * MIB, 8);
        let p = alloc(l);
        free(p, l);
        release_retained();
        after = huge_stats();
        if after.first_touch_cpu_wait_ns > before.first_touch_cpu_wait_ns {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    assert!(
        after.first_touch_probes > before.first_touch_probes,
        "{after:?}"
    );
    let waited = after.first_touch_cpu_wait_ns - before.first_touch_cpu_wait_ns;
    let took = after.first_touch_probe_ns - before.first_touch_probe_ns;
    assert!(waited > 0, "no wait for a CPU was seen: {after:?}");
    assert!(waited <= took, "waited {waited} ns of {took} ns");
}

#[test]
fn after_a_slow_probe_fresh_blocks_fault_in_as_base_pages() {
    run_child("child_first_touch_window", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by after_a_slow_probe_fresh_blocks_fault_in_as_base_pages"]
fn child_first_touch_window() {
    if !maps_thp() {
        eprintln!("no THP here: skipped");
        return;
    }
    ckalloc::huge::hold_first_touch_base_pages(true);
    let before = huge_stats();
    let l = layout(16 * MIB, 8);
    let p = alloc(l);
    fill(p, 16 * MIB, 5);
    let after = huge_stats();
    assert_eq!(
        after.first_touch_probes, before.first_touch_probes,
        "no probe in the window"
    );
    assert_eq!(
        after.first_touch_base_blocks,
        before.first_touch_base_blocks + 1
    );
    assert_eq!(
        after.first_touch_base_bytes,
        before.first_touch_base_bytes + 16 * MIB as u64
    );
    let c = ckalloc::huge_page_coverage(p, 16 * MIB).unwrap();
    assert_eq!(c.mapped_bytes, 16 * MIB as u64);
    assert_eq!(c.huge_bytes, 0, "base pages only: {c:?}");
    assert!(holds(p, 16 * MIB, 5));
    // Grown inside the window, the block stays in base pages.
    // SAFETY: `p` came from `A` with `l`.
    let p = unsafe { A.realloc(p, l, 48 * MIB) };
    assert!(!p.is_null());
    let l = layout(48 * MIB, 8);
    assert!(holds(p, 16 * MIB, 5), "contents kept");
    fill(p, 48 * MIB, 6);
    let c = ckalloc::huge_page_coverage(p, 48 * MIB).unwrap();
    assert_eq!(c.huge_bytes, 0, "grown block in base pages: {c:?}");
    free(p, l);
    release_retained();
    ckalloc::huge::hold_first_touch_base_pages(false);
    let p = alloc(l);
    assert_eq!(
        huge_stats().first_touch_probes,
        after.first_touch_probes + 1,
        "probed again"
    );
    free(p, l);
    release_retained();
}

#[test]
fn the_first_touch_probe_switch_turns_the_policy_off() {
    run_child(
        "child_first_touch_off",
        &[
            ("CKALLOC_HUGETLB", "0"),
            ("CKALLOC_FIRST_TOUCH_PROBE", "off"),
        ],
    );
}

#[test]
#[ignore = "run by the_first_touch_probe_switch_turns_the_policy_off"]
fn child_first_touch_off() {
    ckalloc::huge::hold_first_touch_base_pages(true);
    let before = huge_stats();
    let l = layout(16 * MIB, 8);
    let p = alloc(l);
    let after = huge_stats();
    assert_eq!(after.first_touch_probes, before.first_touch_probes);
    assert_eq!(
        after.first_touch_base_blocks,
        before.first_touch_base_blocks
    );
    let c = ckalloc::huge_page_coverage(p, 16 * MIB).unwrap();
    assert_eq!(c.mapped_bytes, 0, "nothing faulted in by the allocator");
    free(p, l);
    release_retained();
}

#[test]
fn a_block_longer_than_the_cap_is_purged_on_free() {
    let _s = serial();
    release_retained();
    let before = huge_stats();
    let l = layout(env::retain_bytes() + 1, 8);
    let p = alloc(l);
    free(p, l);
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    let hugetlb = after.hugetlb.blocks > before.hugetlb.blocks;
    // hugetlb units are never purged: their span goes back whole.
    assert!(
        after.purged_bytes > before.purged_bytes || hugetlb,
        "{after:?}"
    );
    assert_eq!(after.live_bytes, before.live_bytes);
}

#[test]
fn alloc_zeroed_after_a_dirty_free_reads_zero_around_16_mib() {
    let _s = serial();
    release_retained();
    for size in [16 * MIB - 1, 16 * MIB, 16 * MIB + 1, 18 * MIB, 2 * MIB + 1] {
        let l = layout(size, 8);
        let p = alloc(l);
        let len = size.next_multiple_of(2 * MIB);
        // Dirty the whole mapping, beyond the requested size as well.
        // SAFETY: the mapping is `len` bytes.
        unsafe { p.write_bytes(0xCD, len) };
        free(p, l);
        // SAFETY: non-zero size.
        let z = unsafe { A.alloc_zeroed(l) };
        assert!(!z.is_null());
        // SAFETY: `size` bytes are ours.
        let s = unsafe { std::slice::from_raw_parts(z, size) };
        assert!(s.iter().all(|&b| b == 0), "{size}: not zeroed");
        // A zeroed vector through the global allocator of the same length.
        free(z, l);
        let v = vec![0u8; size];
        assert!(v.iter().all(|&b| b == 0), "{size}: vec! not zeroed");
        drop(v);
    }
    release_retained();
}

#[test]
fn stats_stay_consistent_and_release_empties_the_cache() {
    let _s = serial();
    release_retained();
    let before = huge_stats();
    let sizes = [2 * MIB, 3 * MIB, 4 * MIB, 8 * MIB, 30 * MIB, 64 * MIB];
    for round in 0..4 {
        let ps: Vec<_> = sizes.iter().map(|&s| (alloc(layout(s, 8)), s)).collect();
        for (p, s) in ps {
            free(p, layout(s, 8));
        }
        let s = huge_stats();
        assert!(
            s.retained_bytes <= env::retain_bytes() as u64,
            "{round}: {s:?}"
        );
        assert!(s.retained_bytes < 1 << 40, "{round}: wrapped {s:?}");
        assert!(s.live_bytes < 1 << 40, "{round}: wrapped {s:?}");
    }
    let released = release_retained();
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    assert!(released > 0);
    assert_eq!(after.live_bytes, before.live_bytes);
}

#[test]
fn eight_threads_churning_the_same_sizes_never_share_a_block() {
    let _s = serial();
    release_retained();
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..300usize {
                    let size = [2 * MIB, 4 * MIB, 3 * MIB + 5][i % 3];
                    let l = layout(size, 8);
                    let p = alloc(l);
                    // A stamp at each 4 KiB page of the first 2 MiB, checked
                    // after a yield: a block handed out twice is caught.
                    for off in (0..2 * MIB).step_by(4096) {
                        // SAFETY: within the block.
                        unsafe { *p.add(off) = t };
                    }
                    std::thread::yield_now();
                    for off in (0..2 * MIB).step_by(4096) {
                        // SAFETY: within the block.
                        assert_eq!(unsafe { *p.add(off) }, t, "block shared");
                    }
                    free(p, l);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = huge_stats();
    assert!(s.retained_bytes <= env::retain_bytes() as u64, "{s:?}");
    release_retained();
    assert_eq!(huge_stats().retained_bytes, 0);
}

/// Eight threads allocate, stamp every 4 KiB page, check and free blocks
/// of mixed lengths (so longer blocks are trimmed) for `rounds` rounds.
fn churn_mixed_lengths(rounds: usize) {
    let threads: Vec<_> = (1..=8u8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..rounds {
                    let size =
                        [8 * MIB, 2 * MIB, 6 * MIB - 1, 4 * MIB + 1, MIB][(i + t as usize) % 5];
                    let l = layout(size, 8);
                    let p = alloc(l);
                    for off in (0..size).step_by(4096) {
                        // SAFETY: within the block.
                        unsafe { *p.add(off) = t };
                    }
                    std::thread::yield_now();
                    for off in (0..size).step_by(4096) {
                        // SAFETY: within the block.
                        assert_eq!(unsafe { *p.add(off) }, t, "block shared");
                    }
                    free(p, l);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn churn_with_immediate_decay_and_a_small_cap_never_shares_or_loses_a_block() {
    run_child(
        "child_churn_decay",
        &[
            ("CKALLOC_RETAIN_DECAY_MS", "0"),
            ("CKALLOC_RETAIN_BYTES", "33554432"),
        ],
    );
}

#[test]
#[ignore = "run by churn_with_immediate_decay_and_a_small_cap_never_shares_or_loses_a_block"]
fn child_churn_decay() {
    let before = huge_stats();
    churn_mixed_lengths(400);
    let s = huge_stats();
    assert!(s.retained_bytes <= 32 * MIB as u64, "{s:?}");
    assert!(s.decayed_bytes > 0, "decay ran: {s:?}");
    release_retained();
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(after.live_bytes, before.live_bytes, "{after:?}");
}

#[test]
fn a_thread_exiting_while_its_blocks_are_retained_loses_none() {
    let _s = serial();
    release_retained();
    let before = huge_stats();
    let addrs = std::thread::spawn(|| {
        let l = layout(4 * MIB, 8);
        let ps: Vec<_> = (0..4).map(|_| alloc(l)).collect();
        let addrs: Vec<usize> = ps.iter().map(|&p| p as usize).collect();
        for p in ps {
            free(p, l);
        }
        addrs
    })
    .join()
    .unwrap();
    assert_eq!(huge_stats().retained_bytes, 16 * MIB as u64);
    let l = layout(4 * MIB, 8);
    let mut back: Vec<usize> = (0..4).map(|_| alloc(l) as usize).collect();
    let mut want = addrs.clone();
    back.sort_unstable();
    want.sort_unstable();
    assert_eq!(back, want, "the exited thread's blocks serve this one");
    for p in back {
        free(p as *mut u8, l);
    }
    release_retained();
    assert_eq!(huge_stats().live_bytes, before.live_bytes);
}

#[test]
fn fork_while_threads_churn_gives_a_child_that_allocates_and_counts_right() {
    let _s = serial();
    release_retained();
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let l = layout([4 * MIB, 6 * MIB][t % 2], 8);
                while !stop.load(Ordering::Relaxed) {
                    let p = alloc(l);
                    free(p, l);
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for round in 0..200 {
        let child = fork_child(|| {
            let l = layout(4 * MIB, 8);
            let mut code = 0;
            for _ in 0..4 {
                let v = vec![7u8; 5 * MIB];
                if v[5 * MIB - 1] != 7 {
                    code = 2;
                }
                drop(v);
                let p = alloc(l);
                free(p, l);
            }
            release_retained();
            if huge_stats().retained_bytes != 0 {
                code = 3;
            }
            code
        });
        if let Some(status) = child {
            failures.push((round, status));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in churn {
        t.join().unwrap();
    }
    release_retained();
    assert!(
        failures.is_empty(),
        "children that failed (round, wait status; exit 3: retained bytes \
         left after release_retained): {failures:?}"
    );
}

/// A small allocator whose every call fails.
struct Failing;

// SAFETY: returns null for every request, which the contract allows.
unsafe impl GlobalAlloc for Failing {
    unsafe fn alloc(&self, _: Layout) -> *mut u8 {
        std::ptr::null_mut()
    }
    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
}

#[test]
fn a_failing_small_allocator_leaves_mapped_blocks_intact() {
    let _s = serial();
    release_retained();
    let a = CkHuge::with_small_allocator(Failing);
    let small = layout(64, 8);
    // SAFETY: non-zero size.
    assert!(unsafe { a.alloc(small) }.is_null());
    // SAFETY: non-zero size.
    assert!(unsafe { a.alloc_zeroed(small) }.is_null());
    let l = layout(4 * MIB, 8);
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    fill(p, 4 * MIB, 5);
    // Shrinking below the threshold needs the small allocator: it fails and
    // the mapped block stays as it was.
    // SAFETY: `p` came from `a` with `l`.
    let q = unsafe { a.realloc(p, l, MIB) };
    assert!(q.is_null());
    assert!(holds(p, 4 * MIB, 5), "the old block is intact");
    // Mapped-to-mapped resizes do not need it.
    // SAFETY: as above.
    let r = unsafe { a.realloc(p, l, 9 * MIB) };
    assert!(!r.is_null());
    assert!(holds(r, 4 * MIB, 5));
    // SAFETY: `r` came from `a` with 9 MiB.
    unsafe { a.dealloc(r, layout(9 * MIB, 8)) };
    // Through `System` the same shrink works.
    let b = CkHuge::with_small_allocator(System);
    // SAFETY: non-zero size.
    let p = unsafe { b.alloc(l) };
    fill(p, 4 * MIB, 6);
    // SAFETY: `p` came from `b` with `l`.
    let q = unsafe { b.realloc(p, l, MIB) };
    assert!(!q.is_null() && holds(q, MIB, 6));
    // SAFETY: `q` came from `b` with 1 MiB.
    unsafe { b.dealloc(q, layout(MIB, 8)) };
    release_retained();
}

#[test]
fn retain_bytes_from_the_environment_follow_the_parsing_rule() {
    for (value, want) in [
        ("0", 0),
        ("1", 1),
        (" 8388608\n", 8 * MIB),
        ("garbage", env::DEFAULT_RETAIN_BYTES),
        ("8 MiB", env::DEFAULT_RETAIN_BYTES),
        ("8mib", 8 * MIB),
        (" 40MiB ", 40 * MIB),
        ("1GiB", 1 << 30),
        ("1.5GiB", env::DEFAULT_RETAIN_BYTES),
        ("08mib", env::DEFAULT_RETAIN_BYTES),
        ("-1", env::DEFAULT_RETAIN_BYTES),
        ("99999999999999999999999", env::DEFAULT_RETAIN_BYTES),
        ("18446744073709551615", usize::MAX),
        ("", env::DEFAULT_RETAIN_BYTES),
    ] {
        run_child(
            "child_cap",
            &[
                ("CKALLOC_RETAIN_BYTES", value),
                ("WANT_RETAIN_BYTES", &want.to_string()),
            ],
        );
    }
}

#[test]
#[ignore = "run by retain_bytes_from_the_environment_follow_the_parsing_rule"]
fn child_cap() {
    let want: usize = std::env::var("WANT_RETAIN_BYTES").unwrap().parse().unwrap();
    assert_eq!(env::retain_bytes(), want);
    let set = std::env::var("CKALLOC_RETAIN_BYTES").unwrap();
    let setting = huge_stats().settings[0];
    assert_eq!(setting.name, "CKALLOC_RETAIN_BYTES");
    assert_eq!(setting.value, want as u64);
    let unparsed = want == env::DEFAULT_RETAIN_BYTES && set.trim() != "134217728";
    assert_eq!(
        setting.source,
        if unparsed {
            env::Source::Unparsed
        } else {
            env::Source::Environment
        },
        "{set:?}"
    );
    assert_eq!(
        huge_stats()
            .to_string()
            .contains("CKALLOC_RETAIN_BYTES does not parse"),
        unparsed,
        "{set:?}"
    );
    let before = huge_stats();
    for size in [2 * MIB, 4 * MIB, 40 * MIB] {
        let l = layout(size, 8);
        let p = alloc(l);
        free(p, l);
        let retained = huge_stats().retained_bytes as usize;
        assert!(retained <= want, "{size}: {retained} > {want}");
        let kept = want != 0 && size <= want;
        assert_eq!(retained == size, kept, "{size} under a cap of {want}");
        release_retained();
    }
    assert_eq!(huge_stats().live_bytes, before.live_bytes);
}

#[test]
fn decay_of_zero_gives_blocks_back_at_the_next_step() {
    run_child("child_decay_zero", &[("CKALLOC_RETAIN_DECAY_MS", "0")]);
}

#[test]
#[ignore = "run by decay_of_zero_gives_blocks_back_at_the_next_step"]
fn child_decay_zero() {
    assert_eq!(env::retain_decay_ms(), 0);
    let l = layout(4 * MIB, 8);
    let ps: Vec<_> = (0..6).map(|_| alloc(l)).collect();
    for p in ps {
        free(p, l);
    }
    // A window of 0: every huge-path call runs a step first, so each free
    // gave back the blocks freed before it; the last one is retained.
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 4 * MIB as u64, "{s:?}");
    assert_eq!(s.decayed_bytes, 20 * MIB as u64);
    // Small allocations drive the steps too.
    for _ in 0..256 + 8 {
        drop(std::hint::black_box(vec![1u8; 32]));
    }
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    assert_eq!(s.decayed_bytes, 24 * MIB as u64);
}

#[test]
fn a_huge_decay_delay_keeps_blocks_until_released() {
    run_child(
        "child_decay_huge",
        &[("CKALLOC_RETAIN_DECAY_MS", "18446744073709551615")],
    );
}

#[test]
#[ignore = "run by a_huge_decay_delay_keeps_blocks_until_released"]
fn child_decay_huge() {
    assert_eq!(env::retain_decay_ms(), u64::MAX);
    let l = layout(4 * MIB, 8);
    let p = alloc(l);
    free(p, l);
    std::thread::sleep(std::time::Duration::from_millis(50));
    for _ in 0..4 * 256 {
        drop(std::hint::black_box(vec![1u8; 32]));
    }
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 4 * MIB as u64, "{s:?}");
    assert_eq!(s.decayed_bytes, 0);
    assert_eq!(release_retained(), 4 * MIB);
    assert_eq!(huge_stats().retained_bytes, 0);
}

/// hugetlb pages free in the system's default pool.
fn hugetlb_pages_free() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0))
}

#[test]
fn hugetlb_blocks_are_retained_trimmed_zeroed_and_grown() {
    let _s = serial();
    release_retained();
    let before = huge_stats();
    let l = layout(20 * MIB, 8);
    let p = alloc(l);
    if huge_stats().hugetlb.blocks == before.hugetlb.blocks {
        // No reserved hugetlb pages (the usual case): nothing to check here.
        // As root: `echo 32 > /proc/sys/vm/nr_hugepages` before the run.
        free(p, l);
        release_retained();
        eprintln!("no hugetlb pages ({} free): skipped", hugetlb_pages_free());
        return;
    }
    fill(p, 20 * MIB, 11);
    free(p, l);
    assert_eq!(huge_stats().retained_bytes, 20 * MIB as u64);
    // A zeroed hit of hugetlb units is cleared with a memset (they are
    // never purged).
    // SAFETY: non-zero size.
    let z = unsafe { A.alloc_zeroed(l) };
    assert_eq!(z, p);
    // SAFETY: 20 MiB are ours.
    let s = unsafe { std::slice::from_raw_parts(z, 20 * MIB) };
    assert!(s.iter().all(|&b| b == 0), "hugetlb hit not zeroed");
    fill(z, 20 * MIB, 12);
    free(z, l);
    // A shorter request carves the retained hugetlb units.
    let l6 = layout(6 * MIB, 8);
    let q = alloc(l6);
    assert_eq!(q, p, "carved from the front of the hugetlb span");
    assert!(holds(q, 6 * MIB, 12));
    // It grows in place over the span's free units.
    let grown = huge_stats().grown_in_place;
    // SAFETY: `q` came from `A` with `l6`.
    let r = unsafe { A.realloc(q, l6, 10 * MIB) };
    assert_eq!(r, q);
    assert_eq!(huge_stats().grown_in_place, grown + 1);
    assert!(
        holds(r, 6 * MIB, 12),
        "contents after growing a hugetlb block"
    );
    fill(r, 10 * MIB, 13);
    // Past the span's end it is copied into a new block (hugetlb pages do
    // not move with mremap).
    let copied = huge_stats().copied;
    // SAFETY: `r` came from `A` with 10 MiB.
    let t = unsafe { A.realloc(r, layout(10 * MIB, 8), 30 * MIB) };
    assert!(!t.is_null() && holds(t, 10 * MIB, 13));
    assert_eq!(huge_stats().copied, copied + 1);
    free(t, layout(30 * MIB, 8));
    release_retained();
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(after.live_bytes, before.live_bytes);
}

#[test]
fn a_failed_huge_realloc_or_alloc_leaves_the_cache_and_block_intact() {
    let _s = serial();
    release_retained();
    let l = layout(4 * MIB, 8);
    let spare = alloc(l);
    free(spare, l);
    let p = alloc(l);
    assert_eq!(p, spare);
    fill(p, 4 * MIB, 21);
    let before = huge_stats();
    let too_big = isize::MAX as usize - 4095;
    // SAFETY: `p` came from `A` with `l`; `too_big` is a valid size for
    // alignment 8.
    let q = unsafe { A.realloc(p, l, too_big) };
    assert!(q.is_null(), "no address space for {too_big} bytes");
    assert!(holds(p, 4 * MIB, 21), "the old block is intact");
    // SAFETY: non-zero size, valid layout.
    let r = unsafe { A.alloc(layout((isize::MAX as usize + 1) - (1 << 30), 1 << 30)) };
    assert!(r.is_null());
    let after = huge_stats();
    assert_eq!(after.retained_bytes, before.retained_bytes);
    assert_eq!(after.live_bytes, before.live_bytes);
    free(p, l);
    release_retained();
}

#[test]
fn caching_allocator_over_ckhuge_trim_gives_the_pages_back() {
    use allocator_api2::alloc::Allocator;
    let _s = serial();
    release_retained();
    let c = ckalloc::caching::CachingAllocator::unbounded(CkHuge::new());
    let l = Layout::from_size_align(6 * MIB, 8).unwrap();
    let b = c.allocate(l).unwrap();
    // SAFETY: allocated above with `l`.
    unsafe { c.deallocate(b.cast(), l) };
    let before = huge_stats();
    assert_eq!(
        before.live_bytes,
        6 * MIB as u64,
        "the pool keeps the block"
    );
    c.trim();
    let after = huge_stats();
    assert_eq!(after.live_bytes, 0);
    assert_eq!(after.retained_bytes, 0, "not cached twice");
    let hugetlb = after.hugetlb.blocks > 0;
    assert!(after.purged_bytes >= before.purged_bytes + 6 * MIB as u64 || hugetlb);
}

/// The block the fork prepare handler of `child_free_in_prepare` frees.
static STASHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A `pthread_atfork` prepare handler that frees a huge-page block through
/// the global allocator, as a library's handler dropping a buffer would.
unsafe extern "C" fn free_stashed_block() {
    let p = STASHED.swap(0, Ordering::Relaxed) as *mut u8;
    if !p.is_null() {
        free(p, layout(4 * MIB, 8));
    }
}

#[test]
fn freeing_the_first_retained_block_inside_a_fork_handler_does_not_hang() {
    run_child("child_free_in_prepare", &[]);
}

#[test]
#[ignore = "run by freeing_the_first_retained_block_inside_a_fork_handler_does_not_hang"]
fn child_free_in_prepare() {
    // Nothing retained yet in this process: the free below is the first.
    assert_eq!(huge_stats().retained_bytes, 0);
    STASHED.store(alloc(layout(4 * MIB, 8)) as usize, Ordering::Relaxed);
    // SAFETY: registers a handler valid for the life of the process.
    let rc = unsafe { libc::pthread_atfork(Some(free_stashed_block), None, None) };
    assert_eq!(rc, 0);
    // A second thread: glibc's `fork` takes its handler lock (and runs the
    // prepare handlers under it) only in multi-threaded processes.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || rx.recv());
    // SAFETY: `alarm` ends this process if the fork hangs.
    unsafe { libc::alarm(5) };
    // SAFETY: the child only `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0);
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    // SAFETY: cancels the alarm.
    unsafe { libc::alarm(0) };
    tx.send(()).unwrap();
    other.join().unwrap().unwrap();
    assert_eq!(huge_stats().retained_bytes, 4 * MIB as u64);
}

#[test]
fn the_first_touch_policy_leaves_a_short_tail_to_the_callers_writes() {
    run_child("child_short_tail_first_touch", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by the_first_touch_policy_leaves_a_short_tail_to_the_callers_writes"]
fn child_short_tail_first_touch() {
    if !maps_thp() {
        eprintln!("no THP here: skipped");
        return;
    }
    // 8 MiB + 256 KiB: the policy may fault in the four full 2 MiB pages at
    // allocation, never the last one, which holds less than 1 MiB of the
    // request.
    let size = 8 * MIB + 256 * 1024;
    let l = layout(size, 8);
    let before = huge_stats();
    let p = alloc(l);
    let after = huge_stats();
    let populated = after.first_touch_populated_bytes - before.first_touch_populated_bytes;
    assert!(populated <= 8 * MIB as u64, "{after:?}");
    let c = ckalloc::huge_page_coverage(p.wrapping_add(8 * MIB), 2 * MIB).unwrap();
    assert_eq!(c.mapped_bytes, 0, "the last 2 MiB before any write: {c}");
    fill(p, size, 4);
    assert!(holds(p, size, 4));
    free(p, l);
    release_retained();
}

#[test]
fn live_blocks_of_one_span_share_its_vma_and_short_tails_fault_in_no_huge_page() {
    // No probe: a slow page would send whole blocks to base pages.
    run_child(
        "child_span_vmas",
        &[("CKALLOC_HUGETLB", "0"), ("CKALLOC_FIRST_TOUCH_PROBE", "0")],
    );
}

#[test]
#[ignore = "run by live_blocks_of_one_span_share_its_vma_and_short_tails_fault_in_no_huge_page"]
fn child_span_vmas() {
    let span = |blocks: &[*mut u8]| {
        let lo = blocks.iter().map(|&p| p as usize).min().unwrap();
        let hi = blocks.iter().map(|&p| p as usize + 4 * MIB).max().unwrap();
        common::mappings_overlapping(lo, hi - lo).len()
    };
    // 3 MiB requests: the last 2 MiB holds 1 MiB of each; no VMA of their own.
    let l = layout(3 * MIB, 8);
    let blocks: Vec<*mut u8> = (0..100).map(|_| alloc(l)).collect();
    assert!(span(&blocks) <= 3, "{} VMAs", span(&blocks));
    for p in blocks {
        free(p, l);
    }
    release_retained();
    assert_eq!(huge_stats().short_tails, 0);
    // 2.25 MiB requests: each last 2 MiB holds a short tail, advised base
    // pages (a VMA of its own) for the first 256 live ones, then left to
    // huge pages.
    let l = layout(9 << 18, 8);
    let before = huge_stats().short_tails_over_budget;
    let blocks: Vec<*mut u8> = (0..300).map(|_| alloc(l)).collect();
    let s = huge_stats();
    assert_eq!(s.short_tails, 256, "{s:?}");
    assert_eq!(s.short_tails_over_budget, before + 44, "{s:?}");
    assert!(span(&blocks) <= 2 * 256 + 3, "{} VMAs", span(&blocks));
    if maps_thp() {
        let p = blocks[0];
        fill(p, 9 << 18, 1);
        let tail = ckalloc::huge_page_coverage(p.wrapping_add(2 * MIB), 2 * MIB).unwrap();
        assert_eq!(tail.huge_bytes, 0, "the short tail's 2 MiB: {tail}");
        let head = ckalloc::huge_page_coverage(p, 2 * MIB).unwrap();
        eprintln!("head {head}, tail {tail}");
    }
    for p in blocks {
        free(p, l);
    }
    release_retained();
    assert_eq!(
        huge_stats().short_tails,
        0,
        "purged tails are advised for THP again"
    );
}

#[test]
fn blocks_at_2mib_boundaries_and_large_alignments_keep_their_bytes_through_realloc() {
    let _s = serial();
    release_retained();
    let sizes = [
        2 * MIB + 1,
        3 * MIB - 1,
        3 * MIB,
        2 * MIB,
        4 * MIB,
        6 * MIB + 4096,
        9 << 18,
    ];
    for align in [8, 4 * MIB, 64 * MIB] {
        for (k, &size) in sizes.iter().enumerate() {
            let l = layout(size, align);
            let p = alloc(l);
            assert_eq!(
                p as usize % align.max(2 * MIB),
                0,
                "{size:#x} align {align:#x}"
            );
            fill(p, size, k as u8);
            // A neighbour makes some growths move; each keeps the bytes and
            // the alignment.
            let next = alloc(layout(2 * MIB, 8));
            let grown = size * 3 + 5;
            // SAFETY: `p` came from `A` with `l`.
            let q = unsafe { A.realloc(p, l, grown) };
            assert!(!q.is_null());
            assert_eq!(
                q as usize % align.max(2 * MIB),
                0,
                "{size:#x} align {align:#x}"
            );
            assert!(holds(q, size, k as u8), "{size:#x} align {align:#x}: grown");
            // SAFETY: `q` came from `A` with `grown` bytes.
            let r = unsafe { A.realloc(q, layout(grown, align), size / 2 + 1) };
            assert!(!r.is_null());
            assert!(
                holds(r, size / 2 + 1, k as u8),
                "{size:#x} align {align:#x}: shrunk"
            );
            free(r, layout(size / 2 + 1, align));
            free(next, layout(2 * MIB, 8));
        }
    }
    release_retained();
}

#[test]
fn with_the_background_thread_asked_for_a_written_vec_becomes_huge_pages() {
    run_child("child_background_promotion", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by with_the_background_thread_asked_for_a_written_vec_becomes_huge_pages"]
fn child_background_promotion() {
    use ckalloc::huge::{enable_background_thread, BackgroundThread};
    assert_eq!(huge_stats().background_thread, BackgroundThread::Off);
    let state = enable_background_thread();
    if state == BackgroundThread::Disabled {
        eprintln!("SKIP: CKALLOC_BACKGROUND_THREAD is off");
        return;
    }
    assert_eq!(state, BackgroundThread::Wanted);
    // The thread whose allocation starts the background thread runs at
    // nice 3, which the background thread keeps.
    // SAFETY: setpriority with who 0 takes no pointer and changes only the
    // calling thread's nice value (this child process's test thread).
    assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) }, 0);
    let len = 64 * MIB;
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate() {
        *b = i as u8;
    }
    let s = huge_stats();
    assert_eq!(s.background_thread, BackgroundThread::Running, "{s}");
    // CkHuge's thread keeps the priority of the thread that started it.
    // proc(5): nice is field 19 of a task's stat; the fields after the ")"
    // that ends the name start at field 3.
    let nice = |task: &std::path::Path| -> Option<i64> {
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(16)?.parse().ok()
    };
    // The thread names itself once it runs: a short wait for it.
    let named = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .map(|t| t.path())
            .find(|t| {
                std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim() == "ckalloc-bg")
            })
    };
    let background = (0..200)
        .find_map(|_| {
            named().or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            })
        })
        .expect("a thread named ckalloc-bg");
    assert_eq!(nice(std::path::Path::new("/proc/thread-self")), Some(3));
    assert_eq!(nice(&background), Some(3));
    if !ckalloc::thp_settings()
        .enabled
        .is_some_and(|e| e != ckalloc::ThpEnabled::Never)
    {
        eprintln!("SKIP: no THP");
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let cov = loop {
        let c = ckalloc::huge_page_coverage(v.as_ptr(), len).unwrap();
        if c.huge_bytes >= len as u64 * 95 / 100 || std::time::Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let s = huge_stats();
    assert!(cov.huge_bytes >= len as u64 * 95 / 100, "{cov:?}\n{s}");
    assert!(
        s.collapsed_live_bytes > 0 || s.base_page_first_bytes == 0,
        "{s}"
    );
    assert!(
        v.iter().enumerate().all(|(i, &b)| b == i as u8),
        "bytes kept"
    );
}

#[test]
fn a_fork_while_the_background_thread_works_loses_no_unit_in_the_child() {
    run_child("child_background_fork", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by a_fork_while_the_background_thread_works_loses_no_unit_in_the_child"]
fn child_background_fork() {
    use ckalloc::huge::{enable_background_thread, BackgroundThread};
    if enable_background_thread() == BackgroundThread::Disabled {
        eprintln!("SKIP: CKALLOC_BACKGROUND_THREAD is off");
        return;
    }
    let l = layout(4 * MIB, 8);
    let mut failures = Vec::new();
    for round in 0..40 {
        // Retained units for the thread to claim and collapse (it does so
        // once no block was allocated for a tick), and a decay to run.
        let ps: Vec<_> = (0..12).map(|_| alloc(l)).collect();
        for &p in &ps {
            fill(p, 4 * MIB, round as u8);
        }
        for p in ps {
            free(p, l);
        }
        std::thread::sleep(std::time::Duration::from_millis(90 + (round % 7) * 10));
        let child = fork_child(|| {
            let mut code = 0;
            if huge_stats().background_thread != BackgroundThread::Wanted {
                code = 2;
            }
            // Every unit free again: all spans go back.
            release_retained();
            let s = huge_stats();
            if s.retained_bytes != 0 || s.spans != 0 || s.live_bytes != 0 {
                code = 3;
            }
            let p = alloc(l);
            fill(p, 4 * MIB, 9);
            if !holds(p, 4 * MIB, 9) {
                code = 4;
            }
            free(p, l);
            if huge_stats().background_thread != BackgroundThread::Running {
                code = 5;
            }
            code
        });
        if let Some(status) = child {
            failures.push((round, status));
        }
    }
    assert!(
        failures.is_empty(),
        "children that failed (round, wait status; exit 2: a thread in the child, \
         3: units left claimed or counted, 4: bytes wrong, 5: no thread started): {failures:?}"
    );
}
