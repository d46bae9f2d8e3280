//! The preload library's C front of the huge-page engine, called from Rust
//! in a process of its own (`ckalloc::preload::malloc`, `calloc`,
//! `realloc` and `free`, the functions the library exports): blocks fault
//! in lazily as THP, a zeroed retained block commits nothing, the retention
//! cap follows the high-water mark of live bytes unless
//! `CKALLOC_RETAIN_BYTES` is set, a miss extends the longest retained run,
//! a steady loop makes no mapping call, and growth moves a block the
//! program split, copies what the kernel will not move, and never gives
//! the added bytes the program's flags.

use ckalloc::preload::{calloc, free, malloc, realloc};
use ckalloc::{env, huge_stats, HugeStats};
use std::ffi::c_void;

use super::common;

/// `common::run_child` while no other program of this binary uses the
/// hugetlb pool ([`super::hugetlb_pool`]): the children take hugetlb blocks.
fn run_child(name: &str, env: &[(&str, &str)]) {
    let _pool = super::hugetlb_pool();
    common::run_child(name, env);
}

const MIB: usize = 1 << 20;

/// The engine's system calls that map or unmap.
fn maps(s: &HugeStats) -> u64 {
    s.syscalls.mmap + s.syscalls.munmap + s.syscalls.mremap
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

/// A pattern byte for offset `i`.
fn byte(i: usize) -> u8 {
    (i / 4096) as u8 ^ 0x5a
}

fn write_pattern(p: *mut c_void, size: usize) {
    for i in (0..size).step_by(4096) {
        // SAFETY: `i < size`, inside the caller's block.
        unsafe { p.cast::<u8>().add(i).write(byte(i)) };
    }
}

fn holds_pattern(p: *mut c_void, size: usize) -> bool {
    (0..size)
        .step_by(4096)
        // SAFETY: `i < size`, inside the caller's block.
        .all(|i| unsafe { p.cast::<u8>().add(i).read() } == byte(i))
}

#[test]
fn the_c_api_retains_up_to_twice_the_live_peak() {
    run_child("engine::child_live_peak", &[]);
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
    if common::thp_available() && s.thp.blocks > 0 {
        assert!(vma(p).flags.contains(" hg"), "{}", vma(p).flags);
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
        after.syscalls, before.syscalls,
        "served without a system call"
    );
    assert_eq!(after.retention_hits, before.retention_hits + 1);
    // SAFETY: as above.
    unsafe { free(q) };
    // A zeroed block carved from the retained one (never written) reads zero
    // without committing its pages.
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
    run_child(
        "engine::child_exact_cap",
        &[("CKALLOC_RETAIN_BYTES", "64MiB")],
    );
}

#[test]
#[ignore = "run in a child process by a_set_retain_bytes_is_the_exact_cap_of_the_c_api"]
fn child_exact_cap() {
    assert!(env::retain_bytes_set());
    let p = alloc(100 * MIB);
    let purged = huge_stats().purged_bytes;
    let hugetlb = huge_stats().hugetlb.blocks > 0;
    // SAFETY: `p` came from `malloc` and is not used again.
    unsafe { free(p) };
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    // hugetlb units are never purged: their span goes back whole.
    assert!(
        hugetlb || s.purged_bytes == purged + 100 * MIB as u64,
        "{s:?}"
    );
    let p = alloc(32 * MIB);
    // SAFETY: as above.
    unsafe { free(p) };
    assert_eq!(huge_stats().retained_bytes, 32 * MIB as u64);
}

#[test]
fn a_full_cache_purges_the_block_freed_longest_ago() {
    // THP blocks: hugetlb units are not purged but given back whole.
    run_child(
        "engine::child_purge_oldest",
        &[("CKALLOC_RETAIN_BYTES", "64MiB"), ("CKALLOC_HUGETLB", "0")],
    );
}

/// How many of the 4 KiB pages of `[p, p + len)` are resident (`mincore(2)`).
fn resident_pages(p: *mut c_void, len: usize) -> usize {
    let mut vec = vec![0u8; len / 4096];
    // SAFETY: `p` is page-aligned (a huge block) and `[p, p + len)` is
    // mapped (retained units of a span); `vec` holds one byte per page.
    let r = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore");
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

#[test]
#[ignore = "run in a child process by a_full_cache_purges_the_block_freed_longest_ago"]
fn child_purge_oldest() {
    let len = 32 * MIB;
    let blocks = [alloc(len), alloc(len), alloc(len)];
    for &p in &blocks {
        write_pattern(p, len);
    }
    let purged = huge_stats().purged_bytes;
    for &p in &blocks {
        // SAFETY: `p` came from `malloc` and is not used again.
        unsafe { free(p) };
        // Stamps count milliseconds: each block is freed at a stamp of its own.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 2 * len as u64, "{s:?}");
    assert_eq!(s.purged_bytes, purged + len as u64, "{s:?}");
    assert_eq!(
        resident_pages(blocks[0], len),
        0,
        "the oldest block is purged"
    );
    for &p in &blocks[1..] {
        assert_eq!(resident_pages(p, len), len / 4096, "the newer blocks stay");
    }
}

#[test]
fn a_miss_extends_the_longest_retained_run() {
    // THP blocks: a hugetlb span holds one block's length (the last test).
    run_child("engine::child_extend_on_miss", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_miss_extends_the_longest_retained_run"]
fn child_extend_on_miss() {
    let small = 32 * MIB;
    let p = alloc(small);
    // SAFETY: `p` holds `small` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, small) };
    let huge_before = vma(p).anon_huge_kib;
    // SAFETY: `p` came from `malloc` and is not used again.
    unsafe { free(p) };
    let before = huge_stats();
    assert_eq!(before.retained_bytes, small as u64);
    // No retained run is long enough: the 32 MiB one is extended to 96 MiB
    // over the free units after it.
    let size = 96 * MIB;
    let q = alloc(size);
    let after = huge_stats();
    assert_eq!(q, p, "the retained run's start");
    assert_eq!(
        after.retention_extends,
        before.retention_extends + 1,
        "{after:?}"
    );
    assert_eq!(maps(&after), maps(&before), "nothing mapped");
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(after.peak_live_bytes, size as u64);
    let v = vma(q);
    assert!(
        v.range.start <= q as usize && q as usize + size <= v.range.end,
        "one VMA: {:x?} for {q:?}",
        v.range
    );
    if common::thp_available() && after.thp.bytes > 0 {
        assert!(v.flags.contains(" hg"), "{}", v.flags);
    }
    // The retained pages stayed where they were, huge pages and all.
    assert!(v.anon_huge_kib >= huge_before, "{} KiB", v.anon_huge_kib);
    // Every byte of the block is the caller's.
    writes_and_reads_back(q, size);
    // SAFETY: as above.
    unsafe { free(q) };
    // A zeroed request never gets retained pages: fresh units, reading 0.
    let before = huge_stats();
    let z = calloc(1, 2 * size);
    assert!(!z.is_null());
    let after = huge_stats();
    assert_eq!(after.retention_extends, before.retention_extends);
    // SAFETY: `z` holds `2 * size` bytes.
    let zeros = unsafe { std::slice::from_raw_parts(z.cast::<u8>(), 2 * size) };
    assert!(zeros.iter().step_by(4096).all(|&b| b == 0));
    // SAFETY: as above.
    unsafe { free(z) };
    assert!(ckalloc::release_retained() >= size);
    assert_eq!(huge_stats().live_bytes, 0);
}

#[test]
fn a_steady_loop_makes_no_mapping_call() {
    run_child("engine::child_steady", &[]);
}

#[test]
#[ignore = "run in a child process by a_steady_loop_makes_no_mapping_call"]
fn child_steady() {
    // A forward pass's pattern: blocks of a few lengths, live together,
    // freed in another order, one of them shrunk.
    let round = || {
        let a = alloc(12 * MIB);
        let b = alloc(7 * MIB);
        let c = calloc(1, 12 * MIB);
        assert!(!c.is_null());
        // SAFETY: blocks of this API, freed once.
        unsafe {
            let b = realloc(b, 3 * MIB + 5);
            assert!(!b.is_null());
            free(a);
            let d = alloc(24 * MIB);
            free(c);
            free(b);
            free(d);
        }
    };
    round();
    round();
    let before = huge_stats();
    for _ in 0..200 {
        round();
    }
    let after = huge_stats();
    assert_eq!(
        maps(&after),
        maps(&before),
        "{:?} -> {:?}",
        before.syscalls,
        after.syscalls
    );
    assert!(after.retention_hits >= before.retention_hits + 800);
}

#[test]
fn a_block_the_program_split_moves_piece_by_piece() {
    run_child("engine::child_split_block", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_block_the_program_split_moves_piece_by_piece"]
fn child_split_block() {
    let size = 32 * MIB + 100;
    let p = alloc(size);
    write_pattern(p, size);
    // The program makes 2 MiB in the middle read-only: three VMAs.
    let ro = p.cast::<u8>().wrapping_add(8 * MIB);
    // SAFETY: 2 MiB inside the block, made read-only and nothing else.
    let rc = unsafe { libc::mprotect(ro.cast(), 2 * MIB, libc::PROT_READ) };
    assert_eq!(rc, 0);
    // A block right after it: the growth cannot stay in place.
    let next = alloc(2 * MIB);
    assert_eq!(next as usize, p as usize + 34 * MIB);
    let before = huge_stats();
    let grown = 128 * MIB;
    // SAFETY: `p` came from `malloc`.
    let q = unsafe { realloc(p, grown) };
    assert!(!q.is_null());
    let after = huge_stats();
    assert_ne!(q, p);
    assert!(holds_pattern(q, size), "the grown block lost old bytes");
    assert_eq!(
        after.moved,
        before.moved + 1,
        "moved, not copied: {after:?}"
    );
    assert_eq!(after.copied, before.copied);
    // The added bytes are the engine's, read-write; the moved read-only
    // piece keeps the program's protection (as `mremap` keeps it).
    writes_and_reads_back(
        q.cast::<u8>().wrapping_add(34 * MIB).cast(),
        grown - 34 * MIB,
    );
    // The old place is plain memory again for the next block.
    // SAFETY: blocks of this API.
    unsafe { free(next) };
    let z = calloc(1, 34 * MIB);
    assert_eq!(z, p, "the old units serve again");
    writes_and_reads_back(z, 34 * MIB);
    // SAFETY: as above.
    unsafe {
        free(z);
        let w = q.cast::<u8>().wrapping_add(8 * MIB);
        assert_eq!(
            libc::mprotect(w.cast(), 2 * MIB, libc::PROT_READ | libc::PROT_WRITE),
            0
        );
        free(q);
    }
}

#[test]
fn a_block_with_a_sealed_page_grows_with_every_byte() {
    run_child("engine::child_sealed_page", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_block_with_a_sealed_page_grows_with_every_byte"]
fn child_sealed_page() {
    const SYS_MSEAL: libc::c_long = 462;
    let size = 64 * MIB + 100;
    let p = alloc(size);
    write_pattern(p, size);
    // One sealed page (mseal(2), Linux 6.10) in the middle of the block: a
    // range `mremap` may not move (`EPERM`). Its piece is copied, the rest
    // moves.
    let sealed = p.cast::<u8>().wrapping_add(8 * MIB);
    // SAFETY: 4 KiB inside the block; sealing changes no byte.
    if unsafe { libc::syscall(SYS_MSEAL, sealed, 4096usize, 0usize) } != 0 {
        eprintln!("skipped, mseal: {}", std::io::Error::last_os_error());
        return;
    }
    let next = alloc(2 * MIB);
    let grown = 128 * MIB;
    // SAFETY: `p` came from `malloc`.
    let q = unsafe { realloc(p, grown) };
    assert!(!q.is_null());
    assert!(holds_pattern(q, size), "the grown block lost the old bytes");
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
    assert!(
        holds_pattern(q, size),
        "writing the next block changed the grown one"
    );
    writes_and_reads_back(q, grown);
    // SAFETY: blocks of this API.
    unsafe {
        free(next);
        free(r);
        free(q);
    }
}

#[test]
fn a_block_whose_last_page_the_program_changed_grows_with_writable_added_bytes() {
    run_child(
        "engine::child_changed_last_page",
        &[("CKALLOC_HUGETLB", "0")],
    );
}

#[test]
#[ignore = "run in a child process by a_block_whose_last_page_the_program_changed_grows_with_writable_added_bytes"]
fn child_changed_last_page() {
    let (size, grown) = (32 * MIB, 128 * MIB);
    let p = alloc(size);
    // SAFETY: `p` holds `size` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x3c, size) };
    // The block's last 2 MiB made read-only: a VMA of its own.
    let last = p.cast::<u8>().wrapping_add(size - 2 * MIB);
    // SAFETY: 2 MiB inside the block, made read-only and nothing else.
    let rc = unsafe { libc::mprotect(last.cast(), 2 * MIB, libc::PROT_READ) };
    assert_eq!(rc, 0);
    // SAFETY: `p` came from `malloc`.
    let q = unsafe { realloc(p, grown) };
    assert_eq!(q, p, "grown in place over the span's free units");
    // SAFETY: `size` bytes of the grown block are the old ones.
    let old = unsafe { std::slice::from_raw_parts(q.cast::<u8>(), size) };
    assert!(
        old.iter().all(|&b| b == 0x3c),
        "the grown block lost old bytes"
    );
    // The added bytes are the span's own: read-write.
    writes_and_reads_back(q.cast::<u8>().wrapping_add(size).cast(), grown - size);
    // SAFETY: the program restores what it changed, then frees.
    unsafe {
        assert_eq!(
            libc::mprotect(last.cast(), 2 * MIB, libc::PROT_READ | libc::PROT_WRITE),
            0
        );
        free(q);
    }
}

#[test]
fn a_block_grown_again_and_again_stays_in_its_spans_vma() {
    run_child("engine::child_grown_again", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run in a child process by a_block_grown_again_and_again_stays_in_its_spans_vma"]
fn child_grown_again() {
    let mut size = 8 * MIB + 4096;
    let mut p = alloc(size);
    // SAFETY: `p` holds `size` bytes.
    unsafe { p.cast::<u8>().write(0x11) };
    for _ in 0..64 {
        let grown = size + 2 * MIB;
        // SAFETY: `p` came from `malloc`.
        let q = unsafe { realloc(p, grown) };
        assert_eq!(q, p, "in place");
        // SAFETY: the last byte of the grown block, and its first.
        unsafe {
            q.cast::<u8>().add(grown - 1).write(0x22);
            assert_eq!(q.cast::<u8>().read(), 0x11);
        }
        // The block, and its short tail's 2 MiB advised base pages.
        let vmas = common::mappings_overlapping(q as usize, grown.next_multiple_of(2 * MIB));
        assert_eq!(vmas.len(), 2, "{grown:#x}: {vmas:?}");
        assert_eq!(
            huge_stats().short_tails,
            1,
            "the old tail is advised for THP again"
        );
        (p, size) = (q, grown);
    }
    // SAFETY: `p` came from `realloc`.
    unsafe { free(p) };
}

#[test]
fn a_hugetlb_block_grows_within_its_span_or_is_copied() {
    if common::skip_without_hugetlb("a_hugetlb_block_grows_within_its_span_or_is_copied", 80) {
        return;
    }
    run_child("engine::child_hugetlb_grow", &[]);
}

#[test]
#[ignore = "run in a child process by a_hugetlb_block_grows_within_its_span_or_is_copied"]
fn child_hugetlb_grow() {
    let small = 32 * MIB;
    let p = alloc(small);
    assert_eq!(huge_stats().hugetlb.blocks, 1, "{:?}", huge_stats());
    write_pattern(p, small);
    // A shorter block from its span's front, grown back within it.
    // SAFETY: blocks of this API.
    let q = unsafe { realloc(p, 10 * MIB) };
    assert_eq!(q, p);
    // SAFETY: as above.
    let q = unsafe { realloc(q, small) };
    assert_eq!(q, p, "grown in place within the span");
    assert!(holds_pattern(q, 10 * MIB));
    // Past the span's end: hugetlb pages do not move, the block is copied.
    let before = huge_stats();
    // SAFETY: as above.
    let r = unsafe { realloc(q, 96 * MIB) };
    assert!(!r.is_null());
    let after = huge_stats();
    assert_eq!(after.copied, before.copied + 1, "{after:?}");
    assert!(holds_pattern(r, 10 * MIB));
    writes_and_reads_back(r, 96 * MIB);
    // SAFETY: as above.
    unsafe { free(r) };
    ckalloc::release_retained();
    assert_eq!(huge_stats().live_bytes, 0);
}
