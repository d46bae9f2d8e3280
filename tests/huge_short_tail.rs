//! `CkHuge`'s short tails: through `GlobalAlloc`, a THP block's last 2 MiB
//! page that holds less than 1 MiB of the request faults in as 4 KiB pages,
//! so the block's resident set is the request, not its 2 MiB-rounded length;
//! longer tails, blocks served through `allocator_api2`, and blocks grown by
//! `realloc` to a longer tail stay huge. Measured page by page with
//! `huge_page_coverage` (`PAGEMAP_SCAN`), in a child process without hugetlb
//! pages (`CKALLOC_HUGETLB=0`), since hugetlb blocks have no THP advice.

mod common;

use allocator_api2::alloc::Allocator;
use ckalloc::{huge_page_coverage, CkHuge, HugeCoverage};
use common::{run_child, thp_available};
use std::alloc::{GlobalAlloc, Layout};

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
    run_child("child_short_tails", &[("CKALLOC_HUGETLB", "0")]);
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
