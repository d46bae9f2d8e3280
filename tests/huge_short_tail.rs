//! `CkHuge`'s short tails: through `GlobalAlloc`, a THP block's last 2 MiB
//! page that holds less than 1 MiB of the request faults in as 4 KiB pages,
//! so the block's resident set is the request, not its 2 MiB-rounded length;
//! longer tails, blocks served through `allocator_api2`, and blocks grown by
//! `realloc` to a longer tail stay huge. Measured page by page with
//! `huge_page_coverage` (`PAGEMAP_SCAN`), in a child process without hugetlb
//! pages (`CKALLOC_HUGETLB=0`), since hugetlb blocks have no THP advice,
//! and (but for one test) without the first-touch policy, which sends
//! blocks to base pages when THP faults are slow and so would decide the
//! head's page size by the machine's memory state.

mod common;

use allocator_api2::alloc::Allocator;
use ckalloc::{huge_page_coverage, CkHuge, HugeCoverage};
use common::{run_child, thp_available};
use std::alloc::{GlobalAlloc, Layout};

/// The child's environment entry that turns the first-touch probe off.
const NO_PROBE: (&str, &str) = ("CKALLOC_FIRST_TOUCH_PROBE", "off");

const MIB: usize = 1 << 20;
const KIB: usize = 1 << 10;

/// Write one byte per 4 KiB page of `p[from..to]`.
fn touch(p: *mut u8, from: usize, to: usize) {
    for i in (from..to).step_by(4096) {
        // SAFETY: the callers pass ranges inside blocks they own.
        unsafe { p.add(i).write_volatile(1) };
    }
}

fn coverage(p: *mut u8, from: usize, to: usize) -> HugeCoverage {
    // SAFETY: `from <= to`, inside the block's mapping.
    let cov = huge_page_coverage(unsafe { p.add(from) }, to - from).unwrap();
    assert!(cov.exact, "PAGEMAP_SCAN should be available on this kernel");
    cov
}

/// The child's preconditions; `false` (with the reason printed) skips it.
fn thp_blocks_possible() -> bool {
    if !thp_available() {
        println!("skipped: THP is off");
        return false;
    }
    if !huge_page_coverage(std::ptr::null(), 0).is_ok_and(|c| c.exact) {
        println!("skipped: no PAGEMAP_SCAN (Linux 6.7+) to measure page by page");
        return false;
    }
    true
}

#[test]
fn global_alloc_keeps_short_tails_in_base_pages() {
    run_child("child_short_tails", &[("CKALLOC_HUGETLB", "0"), NO_PROBE]);
}

#[test]
#[ignore = "run by global_alloc_keeps_short_tails_in_base_pages in a child process"]
fn child_short_tails() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::uncached();

    // 2 MiB + 256 KiB: the head is one huge page, the 256 KiB tail is
    // 4 KiB pages, and nothing past the request is resident.
    let size = 2 * MIB + 256 * KIB;
    let l = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    touch(p, 0, size);
    let head = coverage(p, 0, 2 * MIB);
    assert_eq!(head.mapped_bytes, 2 * MIB as u64);
    assert_eq!(head.huge_bytes, 2 * MIB as u64, "head: {head}");
    let tail = coverage(p, 2 * MIB, 4 * MIB);
    assert_eq!(tail.mapped_bytes, 256 * KIB as u64, "tail: {tail}");
    assert_eq!(tail.huge_bytes, 0, "tail: {tail}");
    // SAFETY: allocated above with `l`.
    unsafe { a.dealloc(p, l) };

    // 3 MiB: a 1 MiB tail is not short, the whole last page is huge.
    let l3 = Layout::from_size_align(3 * MIB, 8).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(l3) };
    assert!(!p.is_null());
    touch(p, 0, 3 * MIB);
    let tail = coverage(p, 2 * MIB, 4 * MIB);
    assert_eq!(tail.huge_bytes, 2 * MIB as u64, "tail: {tail}");
    // SAFETY: allocated above with `l3`.
    unsafe { a.dealloc(p, l3) };

    // Through `Allocator` the slice covers the rounded length: all huge.
    let block = a.allocate(l).unwrap();
    assert_eq!(block.len(), 4 * MIB);
    let p = block.cast::<u8>().as_ptr();
    touch(p, 0, 4 * MIB);
    let tail = coverage(p, 2 * MIB, 4 * MIB);
    assert_eq!(
        tail.huge_bytes,
        2 * MIB as u64,
        "allocator_api2 tail: {tail}"
    );
    // SAFETY: allocated above with `l`.
    unsafe { a.deallocate(block.cast(), l) };

    // `realloc` from a short tail (2.25 MiB) to a long one (3.5 MiB): the
    // grown page is huge again.
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    touch(p, 0, 2 * MIB);
    let grown = 3 * MIB + 512 * KIB;
    // SAFETY: `p` came from `a` with `l`; the new size is valid.
    let q = unsafe { a.realloc(p, l, grown) };
    assert!(!q.is_null());
    touch(q, 2 * MIB, grown);
    let tail = coverage(q, 2 * MIB, 4 * MIB);
    assert_eq!(tail.huge_bytes, 2 * MIB as u64, "grown tail: {tail}");

    // ... and on to a short tail again (4.25 MiB in 6 MiB): the new last
    // page is 4 KiB pages.
    let lg = Layout::from_size_align(grown, 8).unwrap();
    let longer = 4 * MIB + 256 * KIB;
    // SAFETY: `q` came from `a` with `lg`; the new size is valid.
    let r = unsafe { a.realloc(q, lg, longer) };
    assert!(!r.is_null());
    touch(r, 0, longer);
    let tail = coverage(r, 4 * MIB, 6 * MIB);
    assert_eq!(
        tail.mapped_bytes,
        256 * KIB as u64,
        "grown short tail: {tail}"
    );
    assert_eq!(tail.huge_bytes, 0, "grown short tail: {tail}");
    // SAFETY: `r` came from `a` with this layout.
    unsafe { a.dealloc(r, Layout::from_size_align(longer, 8).unwrap()) };
}

/// `round_up(x, 4 KiB)`.
fn pages_4k(x: usize) -> u64 {
    x.div_ceil(4096) as u64 * 4096
}

fn fill(p: *mut u8, n: usize, seed: u8) {
    for i in (0..n).step_by(4096) {
        // SAFETY: the callers pass `n` bytes they own at `p`.
        unsafe { p.add(i).write_volatile(seed.wrapping_add((i >> 12) as u8)) };
    }
    // SAFETY: as above.
    unsafe { p.add(n - 1).write_volatile(seed) };
}

/// Check `n` bytes at `p` that [`fill`] wrote; `filled`: the length it was
/// given (its last byte is checked when `n` reaches it).
fn check_prefix(p: *const u8, n: usize, filled: usize, seed: u8) {
    for i in (0..n.min(filled)).step_by(4096) {
        // SAFETY: the callers pass `n` readable bytes at `p`.
        let b = unsafe { p.add(i).read_volatile() };
        assert_eq!(
            b,
            seed.wrapping_add((i >> 12) as u8),
            "byte {i:#x} of {n:#x}"
        );
    }
    if n >= filled {
        assert_eq!(
            // SAFETY: `filled - 1 < n`: inside the caller's `n` readable
            // bytes, the last byte `fill` wrote.
            unsafe { p.add(filled - 1).read_volatile() },
            seed,
            "last byte"
        );
    }
}

fn check(p: *const u8, n: usize, seed: u8) {
    check_prefix(p, n, n, seed);
}

/// Lines of `/proc/self/maps` (VMAs) overlapping `p..p+len`.
fn vmas(p: *const u8, len: usize) -> usize {
    common::mappings_overlapping(p as usize, len).len()
}

/// The last 2 MiB page of a block of `size` bytes at `p`, after touching all
/// `size` bytes: 4 KiB pages covering the tail for a short tail, one huge
/// page otherwise.
fn assert_tail_pages(p: *mut u8, size: usize, what: &str) {
    let len = size.next_multiple_of(2 * MIB);
    let tail = size - (len - 2 * MIB);
    let cov = coverage(p, len - 2 * MIB, len);
    if tail < MIB {
        assert_eq!(cov.mapped_bytes, pages_4k(tail), "{what}: {cov}");
        assert_eq!(cov.huge_bytes, 0, "{what}: {cov}");
    } else {
        assert_eq!(cov.huge_bytes, 2 * MIB as u64, "{what}: {cov}");
    }
}

#[test]
fn the_first_touch_policy_leaves_a_short_tail_to_the_caller() {
    run_child("child_short_tail_first_touch", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by the_first_touch_policy_leaves_a_short_tail_to_the_caller in a child process"]
fn child_short_tail_first_touch() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::uncached();
    // 8 MiB + 256 KiB: the policy may fault in the four full pages at
    // allocation, never the tail page.
    let size = 8 * MIB + 256 * KIB;
    let l = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    let tail = coverage(p, 8 * MIB, 10 * MIB);
    assert_eq!(tail.mapped_bytes, 0, "tail before any write: {tail}");
    touch(p, 0, size);
    let tail = coverage(p, 8 * MIB, 10 * MIB);
    assert_eq!(tail.mapped_bytes, 256 * KIB as u64, "tail: {tail}");
    assert_eq!(tail.huge_bytes, 0, "tail: {tail}");
    // SAFETY: allocated above with `l`.
    unsafe { a.dealloc(p, l) };
}

#[test]
fn short_tails_at_size_boundaries_and_large_alignments() {
    run_child("child_boundaries", &[("CKALLOC_HUGETLB", "0"), NO_PROBE]);
}

#[test]
#[ignore = "run by short_tails_at_size_boundaries_and_large_alignments in a child process"]
fn child_boundaries() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::uncached();
    let sizes = [
        2 * MIB + 1,
        3 * MIB - 1,
        3 * MIB,
        2 * MIB,
        4 * MIB,
        6 * MIB + 4096,
    ];
    for align in [8, 4 * MIB, 64 * MIB] {
        for (k, &size) in sizes.iter().enumerate() {
            let l = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero size.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null(), "{size:#x} align {align:#x}");
            assert_eq!(p as usize % align.max(2 * MIB), 0);
            fill(p, size, k as u8);
            check(p, size, k as u8);
            assert_tail_pages(p, size, &format!("{size:#x} align {align:#x}"));
            let len = size.next_multiple_of(2 * MIB);
            // SAFETY: allocated above with `l`.
            unsafe { a.dealloc(p, l) };
            common::assert_unmapped(p as usize, len);
        }
    }
}

#[test]
fn realloc_grows_short_tail_blocks_in_place_or_copies_them() {
    run_child(
        "child_grow_short_tail",
        &[("CKALLOC_HUGETLB", "0"), NO_PROBE],
    );
}

#[test]
#[ignore = "run by realloc_grows_short_tail_blocks_in_place_or_copies_them in a child process"]
fn child_grow_short_tail() {
    if !thp_blocks_possible() {
        return;
    }
    for a in [CkHuge::uncached(), CkHuge::new()] {
        // A retained short-tail block (two VMAs) served to a long-tail
        // request of the same length, then grown.
        let warm = Layout::from_size_align(2 * MIB + 256 * KIB, 8).unwrap();
        // SAFETY: non-zero size.
        let w = unsafe { a.alloc(warm) };
        assert!(!w.is_null());
        // SAFETY: allocated above with `warm`.
        unsafe { a.dealloc(w, warm) };
        for size in [2 * MIB + 256 * KIB, 3 * MIB + 512 * KIB] {
            let l = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: non-zero size.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null());
            fill(p, size, 7);
            let before = ckalloc::huge_stats();
            let grown = 4 * MIB + 512 * KIB;
            // SAFETY: `p` came from `a` with `l`.
            let q = unsafe { a.realloc(p, l, grown) };
            assert!(!q.is_null());
            let after = ckalloc::huge_stats();
            if q == p {
                // Grown in place: the last page's VMA was resized.
                assert_eq!(after.remaps, before.remaps + 1, "{size:#x} -> {grown:#x}");
                assert_eq!(after.thp.mappings, before.thp.mappings);
            } else {
                // Something is mapped after the block: moved with `mremap`
                // (one VMA) or copied (two VMAs) into a fresh block or, for
                // `CkHuge::new()`, a retained one.
                let moved = after.remaps == before.remaps + 1;
                let copied = after.thp.mappings == before.thp.mappings + 1
                    || after.retention_hits == before.retention_hits + 1;
                assert!(moved != copied, "{size:#x} -> {grown:#x}");
                if a == CkHuge::uncached() {
                    // `CkHuge::new()` keeps a copied-from block for reuse.
                    common::assert_unmapped(p as usize, size.next_multiple_of(2 * MIB));
                }
            }
            check(q, size, 7);
            fill(q, grown, 9);
            assert_tail_pages(q, grown, "grown");
            // SAFETY: `q` came from `a` with this layout.
            unsafe { a.dealloc(q, Layout::from_size_align(grown, 8).unwrap()) };
        }
    }
}

/// A block of two VMAs (its short tail) that could not grow in place was
/// moved VMA by VMA with `mremap` onto a fresh mapping (Linux 6.11 and later:
/// one more remap, no new block mapped) or, on earlier kernels, copied into
/// a new block (one more mapping, no remap).
fn assert_moved_or_copied(before: &ckalloc::HugeStats, after: &ckalloc::HugeStats, what: &str) {
    if common::blocks_move_vma_by_vma() {
        assert_eq!(
            after.remaps,
            before.remaps + 1,
            "{what}: not moved with mremap"
        );
        assert_eq!(after.thp.mappings, before.thp.mappings, "{what}: copied");
    } else {
        assert_eq!(
            after.remaps, before.remaps,
            "{what}: two VMAs moved with mremap"
        );
        assert_eq!(
            after.thp.mappings,
            before.thp.mappings + 1,
            "{what}: not copied"
        );
    }
}

#[test]
fn realloc_moves_short_tail_blocks_that_cannot_grow_in_place() {
    run_child(
        "child_move_short_tail",
        &[("CKALLOC_HUGETLB", "0"), NO_PROBE],
    );
}

#[test]
#[ignore = "run by realloc_moves_short_tail_blocks_that_cannot_grow_in_place in a child process"]
fn child_move_short_tail() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::uncached();
    for (size, align) in [(2 * MIB + 256 * KIB, 8), (4 * MIB + KIB, 4 * MIB)] {
        let l = Layout::from_size_align(size, align).unwrap();
        let len = size.next_multiple_of(2 * MIB);
        // SAFETY: non-zero size.
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        fill(p, size, 4);
        // A page right after the block (or whatever is mapped there
        // already): it cannot grow in place.
        let blocker = common::map_blocker_page(p.wrapping_add(len));
        let before = ckalloc::huge_stats();
        let grown = len + 2 * MIB + 512 * KIB;
        // SAFETY: `p` came from `a` with `l`.
        let q = unsafe { a.realloc(p, l, grown) };
        assert!(!q.is_null());
        assert_ne!(q, p, "grew in place past a mapped page");
        assert_eq!(q as usize % align.max(2 * MIB), 0);
        let after = ckalloc::huge_stats();
        assert_moved_or_copied(&before, &after, "");
        common::assert_unmapped(p as usize, len);
        check(q, size, 4);
        fill(q, grown, 6);
        assert_tail_pages(q, grown, "grown");
        if let Some(b) = blocker {
            common::unmap_blocker_page(b);
        }
        // SAFETY: `q` came from `a` with this layout.
        unsafe { a.dealloc(q, Layout::from_size_align(grown, align).unwrap()) };
        common::assert_unmapped(q as usize, grown.next_multiple_of(2 * MIB));
    }
}

#[test]
fn realloc_moves_grown_short_tail_blocks_that_cannot_grow_in_place() {
    run_child(
        "child_move_grown_short_tail",
        &[("CKALLOC_HUGETLB", "0"), NO_PROBE],
    );
}

#[test]
#[ignore = "run by realloc_moves_grown_short_tail_blocks_that_cannot_grow_in_place in a child process"]
fn child_move_grown_short_tail() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::uncached();
    let mut size = 2 * MIB + 256 * KIB;
    let mut l = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: non-zero size.
    let mut p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    fill(p, size, 8);
    // Each step grows a short tail into another one (2.25, 4.25, 6.25,
    // 8.25 MiB) with a page mapped right after the block, so it cannot grow
    // in place and, being two VMAs, moves whole onto a fresh mapping (or is
    // copied into a new block before Linux 6.11).
    for _ in 0..3 {
        let len = size.next_multiple_of(2 * MIB);
        // Something mapped there already blocks growth as well.
        let blocker = common::map_blocker_page(p.wrapping_add(len));
        let before = ckalloc::huge_stats();
        let grown = size + 2 * MIB;
        // SAFETY: `p` came from `a` with `l`.
        let q = unsafe { a.realloc(p, l, grown) };
        assert!(!q.is_null());
        let after = ckalloc::huge_stats();
        assert_moved_or_copied(&before, &after, &format!("{size:#x} -> {grown:#x}"));
        common::assert_unmapped(p as usize, len);
        check(q, size, 8);
        fill(q, grown, 8);
        assert_tail_pages(q, grown, "grown");
        if let Some(b) = blocker {
            common::unmap_blocker_page(b);
        }
        (p, size) = (q, grown);
        l = Layout::from_size_align(size, 8).unwrap();
    }
    // SAFETY: `p` came from `a` with `l`.
    unsafe { a.dealloc(p, l) };
    common::assert_unmapped(p as usize, size.next_multiple_of(2 * MIB));
}

#[test]
fn realloc_to_a_short_tail_advises_the_new_last_page() {
    run_child(
        "child_shrink_short_tail",
        &[("CKALLOC_HUGETLB", "0"), NO_PROBE],
    );
}

#[test]
#[ignore = "run by realloc_to_a_short_tail_advises_the_new_last_page in a child process"]
fn child_shrink_short_tail() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::uncached();
    let short = 2 * MIB + 256 * KIB;
    // Within the same rounded length (3.5 MiB -> 2.25 MiB, 4 MiB) and across
    // lengths (5.5 MiB, 6 MiB -> 2.25 MiB, 4 MiB); only the head was touched.
    for old in [3 * MIB + 512 * KIB, 5 * MIB + 512 * KIB] {
        let l = Layout::from_size_align(old, 8).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        fill(p, 2 * MIB, 3);
        // SAFETY: `p` came from `a` with `l`.
        let q = unsafe { a.realloc(p, l, short) };
        assert!(!q.is_null());
        check(q, 2 * MIB, 3);
        touch(q, 2 * MIB, short);
        assert_tail_pages(q, short, &format!("{old:#x} -> {short:#x}"));
        // SAFETY: `q` came from `a` with this layout.
        unsafe { a.dealloc(q, Layout::from_size_align(short, 8).unwrap()) };
        common::assert_unmapped(q as usize, 4 * MIB);
    }
}

#[test]
fn retained_short_tail_blocks_serve_long_tails_and_zeroed_requests() {
    run_child(
        "child_retained_short_tail",
        &[("CKALLOC_HUGETLB", "0"), NO_PROBE],
    );
}

#[test]
#[ignore = "run by retained_short_tail_blocks_serve_long_tails_and_zeroed_requests in a child process"]
fn child_retained_short_tail() {
    if !thp_blocks_possible() {
        return;
    }
    let a = CkHuge::new();
    let short = Layout::from_size_align(2 * MIB + 256 * KIB, 8).unwrap();
    let long = Layout::from_size_align(3 * MIB + 512 * KIB, 8).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { a.alloc(short) };
    assert!(!p.is_null());
    // SAFETY: `short.size()` bytes are ours.
    unsafe { std::ptr::write_bytes(p, 0xab, short.size()) };
    // SAFETY: allocated above with `short`.
    unsafe { a.dealloc(p, short) };

    let hits = ckalloc::huge_stats().retention_hits;
    // SAFETY: non-zero size.
    let q = unsafe { a.alloc_zeroed(long) };
    assert_eq!(q, p, "the retained block serves the same rounded length");
    assert_eq!(ckalloc::huge_stats().retention_hits, hits + 1);
    // SAFETY: `long.size()` bytes are ours.
    let s = unsafe { std::slice::from_raw_parts(q, long.size()) };
    assert!(s.iter().all(|&b| b == 0), "retained block read non-zero");
    fill(q, long.size(), 5);
    check(q, long.size(), 5);
    let tail = coverage(q, 2 * MIB, 4 * MIB);
    println!("long tail in a block mapped for a short tail: {tail}");
    assert_eq!(tail.mapped_bytes, pages_4k(long.size() - 2 * MIB));
    // SAFETY: allocated above with `long`.
    unsafe { a.dealloc(q, long) };

    // SAFETY: non-zero size.
    let r = unsafe { a.alloc_zeroed(short) };
    assert_eq!(r, p);
    // SAFETY: `short.size()` bytes are ours.
    let s = unsafe { std::slice::from_raw_parts(r, short.size()) };
    assert!(s.iter().all(|&b| b == 0), "retained block read non-zero");
    // SAFETY: allocated above with `short`.
    unsafe { a.dealloc(r, short) };

    // Longer than the memset cutoff (16 MiB): cleared with MADV_DONTNEED
    // across both VMAs of the block.
    let big = Layout::from_size_align(20 * MIB + 256 * KIB, 8).unwrap();
    // SAFETY: non-zero size.
    let b = unsafe { a.alloc(big) };
    assert!(!b.is_null());
    // SAFETY: `big.size()` bytes are ours.
    unsafe { std::ptr::write_bytes(b, 0xcd, big.size()) };
    // SAFETY: allocated above with `big`.
    unsafe { a.dealloc(b, big) };
    // SAFETY: non-zero size.
    let c = unsafe { a.alloc_zeroed(big) };
    assert_eq!(c, b, "the retained block serves the same rounded length");
    // SAFETY: `big.size()` bytes are ours.
    let s = unsafe { std::slice::from_raw_parts(c, big.size()) };
    assert!(s.iter().all(|&x| x == 0), "retained block read non-zero");
    touch(c, 0, big.size());
    assert_tail_pages(c, big.size(), "cleared by MADV_DONTNEED");
    // SAFETY: allocated above with `big`.
    unsafe { a.dealloc(c, big) };

    ckalloc::release_retained();
    common::assert_unmapped(p as usize, 4 * MIB);
    common::assert_unmapped(b as usize, 22 * MIB);
}

#[test]
fn short_tail_blocks_split_one_vma_and_unmap_whole() {
    run_child("child_vmas", &[("CKALLOC_HUGETLB", "0"), NO_PROBE]);
    run_child(
        "child_vmas",
        &[("CKALLOC_HUGETLB", "0"), NO_PROBE, ("CKALLOC_THP", "0")],
    );
}

#[test]
#[ignore = "run by short_tail_blocks_split_one_vma_and_unmap_whole in a child process"]
fn child_vmas() {
    let thp = std::env::var("CKALLOC_THP").as_deref() != Ok("0") && thp_available();
    let a = CkHuge::uncached();
    let l = Layout::from_size_align(2 * MIB + 256 * KIB, 8).unwrap();
    let maps_before = vmas(std::ptr::null(), usize::MAX);
    let mut blocks = Vec::with_capacity(256);
    for i in 0..256 {
        // SAFETY: non-zero size.
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        fill(p, l.size(), i as u8);
        assert_eq!(vmas(p, 4 * MIB), if thp { 2 } else { 1 });
        blocks.push(p);
    }
    // AddressSanitizer maps shadow memory for the blocks as they are
    // written, which adds VMAs of its own: count the process's only without it.
    let whole_process = !common::under_asan();
    if !whole_process {
        println!("AddressSanitizer: VMAs counted per block only");
    }
    let maps_full = vmas(std::ptr::null(), usize::MAX);
    assert!(
        !whole_process || maps_full <= maps_before + 2 * 256 + 8,
        "{maps_before} -> {maps_full} VMAs"
    );
    for (i, &p) in blocks.iter().enumerate() {
        check(p, l.size(), i as u8);
        // SAFETY: allocated above with `l`.
        unsafe { a.dealloc(p, l) };
        common::assert_unmapped(p as usize, 4 * MIB);
    }
    let maps_after = vmas(std::ptr::null(), usize::MAX);
    assert!(
        !whole_process || maps_after <= maps_before + 8,
        "{maps_before} -> {maps_after}"
    );
}

#[test]
fn hugetlb_blocks_take_short_tail_sizes_and_realloc() {
    run_child("child_hugetlb", &[("CKALLOC_HUGETLB", "1")]);
}

#[test]
#[ignore = "run by hugetlb_blocks_take_short_tail_sizes_and_realloc in a child process"]
fn child_hugetlb() {
    if common::skip_without_hugetlb("child_hugetlb", 16) {
        return;
    }
    for a in [CkHuge::uncached(), CkHuge::new()] {
        let sizes = [
            2 * MIB + 256 * KIB,
            3 * MIB + 512 * KIB,
            2 * MIB + 1,
            6 * MIB + 256 * KIB,
            4 * MIB,
            2 * MIB + 256 * KIB,
        ];
        let before = ckalloc::huge_stats().hugetlb.mappings;
        let mut l = Layout::from_size_align(sizes[0], 8).unwrap();
        // SAFETY: non-zero size.
        let mut p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        assert!(
            ckalloc::huge_stats().hugetlb.mappings > before,
            "not hugetlb"
        );
        fill(p, l.size(), 1);
        for (k, &size) in sizes[1..].iter().enumerate() {
            // SAFETY: `p` came from `a` with `l`.
            let q = unsafe { a.realloc(p, l, size) };
            assert!(!q.is_null(), "{:#x} -> {size:#x}", l.size());
            check_prefix(q, size, l.size(), k as u8 + 1);
            fill(q, size, k as u8 + 2);
            p = q;
            l = Layout::from_size_align(size, 8).unwrap();
        }
        // SAFETY: `p` came from `a` with `l`.
        unsafe { a.dealloc(p, l) };
        ckalloc::release_retained();
        common::assert_unmapped(p as usize, l.size().next_multiple_of(2 * MIB));
    }
}

#[test]
fn fork_while_threads_churn_short_tails() {
    run_child("child_fork_churn", &[("CKALLOC_HUGETLB", "0"), NO_PROBE]);
}

#[test]
#[ignore = "run by fork_while_threads_churn_short_tails in a child process"]
fn child_fork_churn() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    static A: CkHuge = CkHuge::new();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let sizes = [2 * MIB + 4096, 3 * MIB - 1, 3 * MIB, 4 * MIB + KIB];
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let l = Layout::from_size_align(sizes[i % 4], 8).unwrap();
                    // SAFETY: non-zero size.
                    let p = unsafe { A.alloc(l) };
                    assert!(!p.is_null());
                    fill(p, l.size(), i as u8);
                    let n = sizes[(i + 1) % 4];
                    // SAFETY: `p` came from `A` with `l`.
                    let q = unsafe { A.realloc(p, l, n) };
                    assert!(!q.is_null());
                    check_prefix(q, n, l.size(), i as u8);
                    // SAFETY: `q` came from `A` with this layout.
                    unsafe { A.dealloc(q, Layout::from_size_align(n, 8).unwrap()) };
                    i += 1;
                }
            })
        })
        .collect();
    for _ in 0..20 {
        // SAFETY: the child only calls `A` (no locks of its own) and `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut ok = true;
            for size in [2 * MIB + 256 * KIB, 3 * MIB + 512 * KIB, 2 * MIB + 1] {
                let l = Layout::from_size_align(size, 8).unwrap();
                // SAFETY: non-zero size.
                let p = unsafe { A.alloc_zeroed(l) };
                if p.is_null() {
                    ok = false;
                    break;
                }
                // SAFETY: `size` bytes are ours.
                let s = unsafe { std::slice::from_raw_parts_mut(p, size) };
                ok &= s.iter().all(|&b| b == 0);
                s.fill(3);
                // SAFETY: `p` came from `A` with `l`.
                let q = unsafe { A.realloc(p, l, size + 2 * MIB) };
                // SAFETY: read only when `q` is not null: then it is a live
                // block of `size + 2 MiB` bytes whose first `size` bytes
                // `realloc` copied from `s` (all 3).
                ok &= !q.is_null() && unsafe { *q.add(size - 1) } == 3;
                if !q.is_null() {
                    // SAFETY: `q` came from `A` with this layout.
                    unsafe { A.dealloc(q, Layout::from_size_align(size + 2 * MIB, 8).unwrap()) };
                }
            }
            // SAFETY: ends the child without running the parent's state.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "fork child failed: {status:#x}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
}
