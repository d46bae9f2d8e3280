//! The preload engine's huge blocks, called from Rust in a process of their
//! own (`ckalloc::preload::malloc`, `calloc` and `free`, the functions the
//! library exports): they fault in lazily as THP, a zeroed retained block
//! commits nothing, the retention cap follows the high-water mark of live
//! bytes unless `CKALLOC_RETAIN_BYTES` is set, and a miss grows the longest
//! retained block.

use ckalloc::preload::{calloc, free, malloc, realloc};
use ckalloc::{env, huge_stats, HugeStats};
use std::ffi::c_void;

#[path = "../common/mod.rs"]
mod common;

const MIB: usize = 1 << 20;

fn mappings(s: &HugeStats) -> u64 {
    s.hugetlb.mappings + s.thp.mappings + s.normal.mappings
}

fn alloc(size: usize) -> *mut c_void {
    let p = malloc(size);
    assert!(!p.is_null(), "malloc({size})");
    p
}

/// This process's resident set, in KiB.
fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// The mapping (VMA) that holds an address, from `/proc/self/smaps`.
struct Vma {
    range: std::ops::Range<usize>,
    /// The `VmFlags` line.
    flags: String,
    /// Its `AnonHugePages` in KiB.
    anon_huge_kib: u64,
}

fn vma(p: *mut c_void) -> Vma {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let addr = p as usize;
    let mut inside = None;
    let mut anon_huge_kib = 0;
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr).then_some(lo..hi);
                continue;
            }
        }
        let Some(r) = &inside else { continue };
        if let Some(v) = line.strip_prefix("AnonHugePages:") {
            anon_huge_kib = v.trim().trim_end_matches("kB").trim().parse().unwrap();
        }
        if line.starts_with("VmFlags:") {
            return Vma {
                range: r.clone(),
                flags: line.to_owned(),
                anon_huge_kib,
            };
        }
    }
    panic!("no mapping holds {p:?}");
}

/// Write one byte per 4 KiB page of the block `p` of `size` bytes (a live
/// block of the API) and check that each reads back.
fn writes_and_reads_back(p: *mut c_void, size: usize) {
    // SAFETY: the caller's block holds `size` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), size) };
    for (i, b) in bytes.iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
    assert!(bytes
        .iter()
        .enumerate()
        .step_by(4096)
        .all(|(i, &b)| b == i as u8));
}

fn vm_flags(p: *mut c_void) -> String {
    vma(p).flags
}

#[test]
fn the_c_api_retains_up_to_twice_the_live_peak() {
    common::run_child("engine::child_live_peak", &[]);
}

#[test]
#[ignore = "run in a child process by the_c_api_retains_up_to_twice_the_live_peak"]
fn child_live_peak() {
    assert!(!env::retain_bytes_set(), "CKALLOC_RETAIN_BYTES is set");
    let size = 300 * MIB;
    assert!(size > env::DEFAULT_RETAIN_BYTES);
    let p = alloc(size);
    let s = huge_stats();
    assert_eq!(s.first_touch_probes, 0, "the C API's blocks stay lazy");
    if common::thp_available() && s.thp.mappings > 0 {
        assert!(vm_flags(p).contains(" hg"), "{}", vm_flags(p));
    }
    assert_eq!(s.peak_live_bytes, size as u64);
    // SAFETY: `p` came from `malloc` and is not used again.
    unsafe { free(p) };
    assert_eq!(
        huge_stats().retained_bytes,
        size as u64,
        "a block over the default cap but within the live peak is kept"
    );
    let before = huge_stats();
    let q = alloc(size);
    let after = huge_stats();
    assert_eq!(
        mappings(&after),
        mappings(&before),
        "served without mapping"
    );
    assert_eq!(after.retention_hits, before.retention_hits + 1);
    // SAFETY: as above.
    unsafe { free(q) };
    // A zeroed block carved from the retained one (never written) reads zero
    // without committing its pages, as a fresh mapping would.
    let rss = vm_rss_kib();
    let z = calloc(1, 16 * MIB);
    assert!(!z.is_null());
    let grown = vm_rss_kib().saturating_sub(rss);
    assert!(grown < 4096, "calloc committed {grown} KiB");
    // SAFETY: `z` holds 16 MiB.
    assert_eq!(unsafe { *z.cast::<u8>().add(5 * MIB) }, 0);
    // SAFETY: as above.
    unsafe { free(z) };
    // Retained bytes never pass twice the live peak: three blocks live at
    // once set the peak, and all of them fit once freed.
    let live: Vec<*mut c_void> = (0..3).map(|_| alloc(size)).collect();
    assert_eq!(huge_stats().peak_live_bytes, 3 * size as u64);
    for p in live {
        // SAFETY: as above.
        unsafe { free(p) };
    }
    let s = huge_stats();
    assert!(s.retained_bytes <= 6 * size as u64, "{s:?}");
    assert!(s.retained_bytes >= 3 * size as u64, "{s:?}");
    assert!(ckalloc::release_retained() >= 3 * size);
}

#[test]
fn a_set_retain_bytes_is_the_exact_cap_of_the_c_api() {
    common::run_child(
        "engine::child_exact_cap",
        &[("CKALLOC_RETAIN_BYTES", "64MiB")],
    );
}

#[test]
#[ignore = "run in a child process by a_set_retain_bytes_is_the_exact_cap_of_the_c_api"]
fn child_exact_cap() {
    assert!(env::retain_bytes_set());
    let p = alloc(100 * MIB);
    let unmapped = huge_stats().unmapped_bytes;
    // SAFETY: `p` came from `malloc` and is not used again.
    unsafe { free(p) };
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    assert_eq!(s.unmapped_bytes, unmapped + 100 * MIB as u64);
    let p = alloc(32 * MIB);
    // SAFETY: as above.
    unsafe { free(p) };
    assert_eq!(huge_stats().retained_bytes, 32 * MIB as u64);
}

#[test]
fn a_miss_grows_the_longest_retained_block() {
    // THP blocks: hugetlb ones cannot grow (the next test).
    common::run_child("engine::child_grow_on_miss", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_miss_grows_the_longest_retained_block"]
fn child_grow_on_miss() {
    let small = 32 * MIB;
    let p = alloc(small);
    // SAFETY: `p` holds `small` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, small) };
    let huge_before = vma(p).anon_huge_kib;
    // SAFETY: `p` came from `malloc` and is not used again.
    unsafe { free(p) };
    let before = huge_stats();
    assert_eq!(before.retained_bytes, small as u64);
    // No retained block is long enough: the 32 MiB one grows to 96 MiB.
    let size = 96 * MIB;
    let q = alloc(size);
    let after = huge_stats();
    assert_eq!(
        after.retention_grows,
        before.retention_grows + 1,
        "{after:?}"
    );
    assert_eq!(mappings(&after), mappings(&before), "no fresh mapping");
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(after.peak_mapped_bytes, size as u64, "only 64 MiB added");
    assert_eq!(after.peak_live_bytes, size as u64);
    let grown = vma(q);
    assert!(
        grown.range.start <= q as usize && q as usize + size <= grown.range.end,
        "the grown block is one VMA: {:x?} for {q:?}",
        grown.range
    );
    if common::thp_available() && after.thp.bytes > 0 {
        assert!(grown.flags.contains(" hg"), "{}", grown.flags);
    }
    // The moved pages are still huge pages (before anything writes the
    // added bytes).
    assert!(
        grown.anon_huge_kib >= huge_before,
        "{} KiB in huge pages, {huge_before} before the growth",
        grown.anon_huge_kib
    );
    assert_eq!(q as usize % (2 * MIB), 0);
    // Every byte of the grown block is the caller's.
    writes_and_reads_back(q, size);
    // SAFETY: as above.
    unsafe { free(q) };
    // A zeroed request never gets moved pages: it maps afresh and reads 0.
    let before = huge_stats();
    let z = calloc(1, 2 * size);
    assert!(!z.is_null());
    let after = huge_stats();
    assert_eq!(after.retention_grows, before.retention_grows);
    assert_eq!(mappings(&after), mappings(&before) + 1);
    // SAFETY: `z` holds `2 * size` bytes.
    let zeros = unsafe { std::slice::from_raw_parts(z.cast::<u8>(), 2 * size) };
    assert!(zeros.iter().step_by(4096).all(|&b| b == 0));
    // SAFETY: as above.
    unsafe { free(z) };
    assert!(ckalloc::release_retained() >= size);
    assert_eq!(huge_stats().live_bytes(), 0);
}

#[test]
fn a_retained_block_of_two_vmas_moves_vma_by_vma_to_grow() {
    common::run_child("engine::child_grow_two_vmas", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_retained_block_of_two_vmas_moves_vma_by_vma_to_grow"]
fn child_grow_two_vmas() {
    if !common::thp_available() {
        return;
    }
    // 32 MiB + 16 bytes: the last 2 MiB page holds a short tail and is
    // advised apart, a VMA of its own.
    let small = 32 * MIB + 16;
    let len = 34 * MIB;
    let p = alloc(small);
    assert!(
        vma(p).range.end < p as usize + len,
        "one VMA: {:x?}",
        vma(p).range
    );
    // SAFETY: `p` holds `small` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, 32 * MIB) };
    let huge_before = vma(p).anon_huge_kib;
    // Something mapped right after the block: it cannot grow in place.
    let blocker = common::map_blocker_page(p.cast::<u8>().wrapping_add(len));
    // SAFETY: `p` came from `malloc` and is not used again.
    unsafe { free(p) };
    let before = huge_stats();
    let size = 96 * MIB;
    let q = alloc(size);
    let after = huge_stats();
    assert_eq!(q as usize % (2 * MIB), 0);
    if common::blocks_move_vma_by_vma() {
        // Moved VMA by VMA onto a fresh mapping of 96 MiB: no block mapped.
        assert_ne!(q, p, "grew in place past a mapped page");
        assert_eq!(
            after.retention_grows,
            before.retention_grows + 1,
            "{after:?}"
        );
        assert_eq!(mappings(&after), mappings(&before), "no fresh block");
        assert_eq!(after.retained_bytes, 0);
        common::assert_unmapped(p as usize, len);
        let moved = vma(q);
        assert!(moved.range.start <= q as usize, "{:x?}", moved.range);
        assert!(
            moved.anon_huge_kib >= huge_before,
            "{} KiB in huge pages, {huge_before} before the move",
            moved.anon_huge_kib
        );
    } else {
        // Linux before 6.11 has no PROCMAP_QUERY to find the VMAs: a fresh
        // mapping.
        assert_eq!(after.retention_grows, before.retention_grows);
        assert_eq!(mappings(&after), mappings(&before) + 1);
        assert_eq!(after.retained_bytes, len as u64, "the block went back");
    }
    writes_and_reads_back(q, size);
    if let Some(b) = blocker {
        common::unmap_blocker_page(b);
    }
    // SAFETY: as above.
    unsafe { free(q) };
    ckalloc::release_retained();
    assert_eq!(huge_stats().live_bytes(), 0);
}

#[test]
fn a_block_with_a_vma_that_cannot_move_grows_with_every_byte() {
    common::run_child("engine::child_sealed_vma", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_block_with_a_vma_that_cannot_move_grows_with_every_byte"]
fn child_sealed_vma() {
    const SYS_MSEAL: libc::c_long = 462;
    let size = 64 * MIB + 100;
    let len = 66 * MIB;
    let p = alloc(size);
    let byte = |i: usize| (i / 4096) as u8 ^ 0x5a;
    for i in (0..size).step_by(4096) {
        // SAFETY: `i < size`, inside the block.
        unsafe { p.cast::<u8>().add(i).write(byte(i)) };
    }
    // One sealed page (mseal(2), Linux 6.10) in the middle of the block: a
    // VMA that `mremap` may not move (`EPERM`), between two that it may. The
    // first moves, the rest is copied.
    let sealed = p.cast::<u8>().wrapping_add(8 * MIB);
    // SAFETY: 4 KiB inside the block; sealing changes no byte.
    if unsafe { libc::syscall(SYS_MSEAL, sealed, 4096usize, 0usize) } != 0 {
        eprintln!(
            "child_sealed_vma: skipped, mseal: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let blocker = common::map_blocker_page(p.cast::<u8>().wrapping_add(len));
    let grown = 128 * MIB;
    // SAFETY: `p` came from `malloc`.
    let q = unsafe { realloc(p, grown) };
    assert!(!q.is_null());
    let holds = |q: *mut c_void| {
        (0..size)
            .step_by(4096)
            // SAFETY: `i < size <= grown`, inside the grown block.
            .all(|i| unsafe { q.cast::<u8>().add(i).read() } == byte(i))
    };
    assert!(holds(q), "the grown block lost the old bytes");
    // The next block never overlaps the grown one, and writing it leaves
    // the grown one as it was.
    let r = alloc(60 * MIB);
    let (q0, r0) = (q as usize, r as usize);
    assert!(
        r0 + 60 * MIB <= q0 || q0 + grown <= r0,
        "{r:?} inside {q:?}"
    );
    // SAFETY: `r` holds 60 MiB.
    unsafe { std::ptr::write_bytes(r.cast::<u8>(), 0xaa, 60 * MIB) };
    assert!(holds(q), "writing the next block changed the grown one");
    writes_and_reads_back(q, grown);
    if let Some(b) = blocker {
        common::unmap_blocker_page(b);
    }
    // A page the program made read-only (outside `malloc`'s contract) does
    // not move either: it is copied, and the grown block is writable
    // throughout, as glibc's copy is.
    let p = alloc(size);
    let read_only = p.cast::<u8>().wrapping_add(8 * MIB);
    // SAFETY: 4 KiB inside the block, made read-only and nothing else.
    let protected = unsafe { libc::mprotect(read_only.cast(), 4096, libc::PROT_READ) };
    assert_eq!(protected, 0);
    let blocker = common::map_blocker_page(p.cast::<u8>().wrapping_add(len));
    // SAFETY: `p` came from `malloc`.
    let q = unsafe { realloc(p, grown) };
    assert!(!q.is_null());
    writes_and_reads_back(q, grown);
    if let Some(b) = blocker {
        common::unmap_blocker_page(b);
    }
}

#[test]
fn a_block_whose_last_page_the_program_changed_grows_with_writable_added_bytes() {
    common::run_child(
        "engine::child_changed_last_page",
        &[("CKALLOC_HUGETLB", "0")],
    );
}

#[test]
#[ignore = "run in a child process by a_block_whose_last_page_the_program_changed_grows_with_writable_added_bytes"]
fn child_changed_last_page() {
    let (size, len, grown) = (32 * MIB, 32 * MIB, 128 * MIB);
    // Whether the address space right after a block is free: NOREPLACE maps
    // only where nothing is mapped, and the probe is unmapped again.
    let room_after = |p: *mut c_void| {
        let after = p.cast::<u8>().wrapping_add(len);
        // SAFETY: a fresh mapping of ours or none.
        let probe = unsafe {
            libc::mmap(
                after.cast(),
                grown - len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if probe == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: the probe just mapped (at `after`, or elsewhere on a
        // kernel without NOREPLACE).
        assert_eq!(unsafe { libc::munmap(probe, grown - len) }, 0);
        probe == after.cast()
    };
    // A block with free address space after it, so that growing where it
    // is would be possible: mapped top-down, a block lands below the
    // mapping made just before it, which is then unmapped. A block that
    // landed in a higher hole instead stays to fill it, and the next try
    // goes lower.
    let mut held = Vec::new();
    let p = loop {
        // SAFETY: a fresh anonymous mapping of ours, unmapped below.
        let above = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                grown,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(above, libc::MAP_FAILED);
        let p = alloc(size);
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { libc::munmap(above, grown) }, 0);
        if room_after(p) {
            break p;
        }
        assert!(held.len() < 32, "no block with free address space after it");
        held.push(p);
    };
    for h in held {
        // SAFETY: blocks from `malloc`, unused.
        unsafe { free(h) };
    }
    // SAFETY: `p` holds `size` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x3c, size) };
    // The block's last 2 MiB made read-only: a VMA of its own, whose flags
    // the added bytes must not get.
    let last = p.cast::<u8>().wrapping_add(len - 2 * MIB);
    // SAFETY: 2 MiB inside the block, made read-only and nothing else.
    let protected = unsafe { libc::mprotect(last.cast(), 2 * MIB, libc::PROT_READ) };
    assert_eq!(protected, 0);
    // SAFETY: `p` came from `malloc`.
    let q = unsafe { realloc(p, grown) };
    assert!(!q.is_null());
    // SAFETY: `size` bytes of the grown block are the old ones.
    let old = unsafe { std::slice::from_raw_parts(q.cast::<u8>(), size) };
    assert!(
        old.iter().all(|&b| b == 0x3c),
        "the grown block lost old bytes"
    );
    assert_ne!(q, p, "grew where it was: the added bytes are read-only");
    common::assert_unmapped(p as usize, len);
    writes_and_reads_back(q, grown);
    // SAFETY: `q` came from `realloc`.
    unsafe { free(q) };
}

#[test]
fn a_short_tail_block_grown_again_and_again_stays_two_vmas() {
    common::run_child("engine::child_grown_again", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_short_tail_block_grown_again_and_again_stays_two_vmas"]
fn child_grown_again() {
    // 8 MiB + 4 KiB grown by 2 MiB at a time: a short tail every time, its
    // last 2 MiB page a VMA of its own. The crate's own advice merges back
    // before each growth, so the block is never more than two VMAs.
    let mut size = 8 * MIB + 4096;
    let mut p = alloc(size);
    // SAFETY: `p` holds `size` bytes.
    unsafe { p.cast::<u8>().write(0x11) };
    for _ in 0..64 {
        let grown = size + 2 * MIB;
        // SAFETY: `p` came from `malloc`.
        let q = unsafe { realloc(p, grown) };
        assert!(!q.is_null());
        // SAFETY: the last byte of the grown block, and its first.
        unsafe {
            q.cast::<u8>().add(grown - 1).write(0x22);
            assert_eq!(q.cast::<u8>().read(), 0x11);
        }
        let vmas = common::mappings_overlapping(q as usize, grown.next_multiple_of(2 * MIB));
        assert!(vmas.len() <= 2, "{grown:#x}: {vmas:?}");
        (p, size) = (q, grown);
    }
    // SAFETY: `p` came from `realloc`.
    unsafe { free(p) };
}

#[test]
fn a_hugetlb_block_is_not_grown_and_a_fresh_mapping_serves() {
    if common::skip_without_hugetlb(
        "a_hugetlb_block_is_not_grown_and_a_fresh_mapping_serves",
        80,
    ) {
        return;
    }
    common::run_child("engine::child_hugetlb_not_grown", &[]);
}

#[test]
#[ignore = "run in a child process by a_hugetlb_block_is_not_grown_and_a_fresh_mapping_serves"]
fn child_hugetlb_not_grown() {
    let small = 32 * MIB;
    let p = alloc(small);
    assert_eq!(huge_stats().hugetlb.mappings, 1, "{:?}", huge_stats());
    // SAFETY: `p` holds `small` bytes, and came from `malloc`.
    unsafe {
        std::ptr::write_bytes(p.cast::<u8>(), 7, small);
        free(p);
    }
    let before = huge_stats();
    let size = 96 * MIB;
    let q = alloc(size);
    let after = huge_stats();
    assert_eq!(after.retention_grows, before.retention_grows, "{after:?}");
    assert_eq!(mappings(&after), mappings(&before) + 1, "a fresh mapping");
    assert_eq!(after.retained_bytes, small as u64, "the block went back");
    writes_and_reads_back(q, size);
    // SAFETY: as above.
    unsafe { free(q) };
    assert!(ckalloc::release_retained() >= small + size);
    assert_eq!(huge_stats().live_bytes(), 0);
}
