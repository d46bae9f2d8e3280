//! Huge-page regions, `huge_alloc`/`huge_free`, coverage and probe, and
//! `CkHuge` values (this binary's global allocator is the system's) through
//! `allocator_api2` and through `GlobalAlloc`: the engine's retention,
//! shared by every value: reuse, lengths, alignment, zeroing, the cap,
//! decay, `release_retained`, statistics, threads and fork.

mod common;
use allocator_api2::alloc::{Allocator, Layout};
use allocator_api2::vec::Vec as AVec;
use ckalloc::*;
use common::*;
use std::ptr::NonNull;

const MIB: usize = 1 << 20;

#[test]
fn region_rounds_and_zero_fills() {
    let _serial = serial();
    let mut r = HugeRegion::new(1).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r.mapped_len(), 2 * MIB);
    assert_eq!(r.as_ptr() as usize % (2 * MIB), 0);
    assert_eq!(r.as_slice(), &[0]);
    r.as_mut_slice()[0] = 42;
    assert_eq!(r.as_slice()[0], 42);

    let r = HugeRegion::new(2 * MIB + 1).unwrap();
    assert_eq!(r.mapped_len(), 4 * MIB);
    assert!(r.as_slice().iter().all(|&b| b == 0));
}

#[test]
fn region_drop_unmaps_exact_range() {
    let _serial = serial();
    let r = HugeRegion::new(6 * MIB).unwrap();
    let (p, len) = (r.as_ptr() as usize, r.mapped_len());
    assert!(!mappings_overlapping(p, len).is_empty());
    drop(r);
    assert_unmapped(p, len);
}

#[test]
fn bad_sizes_are_typed_errors() {
    let _serial = serial();
    assert!(matches!(HugeRegion::new(0), Err(HugeError::ZeroSize)));
    for bad in [
        usize::MAX,
        isize::MAX as usize + 1,
        usize::MAX - 2 * MIB + 2,
    ] {
        match HugeRegion::new(bad) {
            Err(HugeError::TooLarge { requested }) => assert_eq!(requested, bad),
            other => panic!("{bad}: {other:?}"),
        }
        assert!(huge_alloc(bad).is_none());
    }
    assert!(huge_alloc(0).is_none());
    // A size the kernel cannot map is an error naming the request, not a panic.
    let huge = isize::MAX as usize & !(2 * MIB - 1);
    let err = HugeRegion::new(huge).unwrap_err();
    assert!(err.to_string().contains(&huge.to_string()), "{err}");
}

#[test]
fn huge_alloc_free_round_trip_gives_the_pages_back_and_reads_zero_again() {
    let _serial = serial();
    let live = huge_stats().live_bytes;
    for bytes in [1, 4096, 2 * MIB, 5 * MIB + 3] {
        let p = huge_alloc(bytes).unwrap();
        assert_eq!(p.as_ptr() as usize % (2 * MIB), 0);
        let purged = huge_stats().purged_bytes + huge_stats().unmapped_bytes;
        // SAFETY: the block is at least `bytes` long and ours.
        unsafe {
            assert!(std::slice::from_raw_parts(p.as_ptr(), bytes)
                .iter()
                .all(|&b| b == 0));
            p.as_ptr().write_bytes(0xAB, bytes);
            assert_eq!(*p.as_ptr().add(bytes - 1), 0xAB);
            huge_free(p, bytes);
        }
        let s = huge_stats();
        assert_eq!(s.live_bytes, live, "{bytes}: freed");
        let len = bytes.div_ceil(2 * MIB) * 2 * MIB;
        let back = s.purged_bytes + s.unmapped_bytes - purged;
        assert!(back >= len as u64, "{bytes}: given back at once");
    }
    // A pointer that is no block is ignored.
    let r = HugeRegion::new(2 * MIB).unwrap();
    // SAFETY: not a block of huge_alloc: nothing happens.
    unsafe { huge_free(NonNull::new(r.as_ptr().cast_mut()).unwrap(), 2 * MIB) };
    assert_eq!(r.as_slice()[0], 0);
}

#[test]
fn thp_region_is_covered_when_touched() {
    let _serial = serial();
    if !thp_available() {
        eprintln!("SKIP: THP is disabled on this machine");
        return;
    }
    let opts = HugeOptions::new().hugetlb(false);
    let mut r = HugeRegion::with_options(64 * MIB, &opts).unwrap();
    assert_eq!(r.backing(), Backing::TransparentHuge);
    touch(r.as_mut_slice());
    let cov = r.coverage().unwrap();
    assert!(cov.exact, "PAGEMAP_SCAN should be available on this kernel");
    assert_eq!(cov.mapped_bytes, 64 * MIB as u64);
    assert!(cov.fraction() >= 0.99, "coverage {cov}");
}

#[test]
fn coverage_of_untouched_and_4k_memory() {
    let _serial = serial();
    let opts = HugeOptions::new().hugetlb(false);
    let r = HugeRegion::with_options(8 * MIB, &opts).unwrap();
    let cov = r.coverage().unwrap();
    assert_eq!(cov.mapped_bytes, 0, "nothing touched yet: {cov}");
    assert_eq!(cov.fraction(), 0.0);

    // A plain Vec touched page by page: resident, and small pages unless the
    // allocator happened to get THP (madvise mode: it does not advise).
    let mut v = vec![0u8; 4 * MIB];
    touch(&mut v);
    let cov = huge_page_coverage(v.as_ptr(), v.len()).unwrap();
    assert_eq!(cov.mapped_bytes, 4 * MIB as u64);
}

#[test]
fn populate_threads_turns_prefault_on_and_populate_false_turns_it_off() {
    let o = HugeOptions::new();
    assert!(!o.populates());
    assert_eq!(o.populate_thread_limit(), 1);
    let o = o.populate_threads(3);
    assert!(o.populates());
    assert_eq!(o.populate_thread_limit(), 3);
    assert!(!o.populate(false).populates());
}

#[test]
fn require_tiers() {
    let _serial = serial();
    // THP required: met on this machine kind (madvise mode), else a typed error.
    let opts = HugeOptions::new()
        .hugetlb(false)
        .require(Backing::TransparentHuge);
    match HugeRegion::with_options(2 * MIB, &opts) {
        Ok(r) => assert_eq!(r.backing(), Backing::TransparentHuge),
        Err(e) => assert!(!thp_available(), "{e}"),
    }
    let opts = HugeOptions::new().require(Backing::Hugetlb);
    if free_hugetlb_2m() == 0 {
        let err = HugeRegion::with_options(2 * MIB, &opts).unwrap_err();
        assert!(matches!(
            err,
            HugeError::TierUnavailable {
                required: Backing::Hugetlb,
                ..
            }
        ));
        assert!(err.to_string().contains("nr_hugepages"), "{err}");
    } else {
        let r = HugeRegion::with_options(2 * MIB, &opts).unwrap();
        assert_eq!(r.backing(), Backing::Hugetlb);
    }
}

#[test]
fn hugetlb_region_reports_hugetlb() {
    let _serial = serial();
    if skip_without_hugetlb("hugetlb_region_reports_hugetlb", 4) {
        return;
    }
    reset_hugetlb_backoff();
    let mut r = HugeRegion::new(3 * MIB).unwrap();
    assert_eq!(r.backing(), Backing::Hugetlb);
    assert_eq!(r.mapped_len(), 4 * MIB);
    assert_eq!(r.page_size(), 2 * MIB);
    r.as_mut_slice()[3 * MIB - 1] = 9;
    let cov = r.coverage().unwrap();
    assert!(cov.fraction() >= 0.99, "{cov}");
    let (p, len) = (r.as_ptr() as usize, r.mapped_len());
    drop(r);
    assert_unmapped(p, len);
    // huge_free releases hugetlb blocks too.
    let b = huge_alloc(5 * MIB).unwrap();
    let addr = b.as_ptr() as usize;
    // SAFETY: from huge_alloc(5 MiB).
    unsafe { huge_free(b, 5 * MIB) };
    assert_unmapped(addr, 6 * MIB);
}

#[test]
fn options_populate_mlock_dontdump() {
    let _serial = serial();
    let opts = HugeOptions::new()
        .hugetlb(false)
        .populate(true)
        .dont_dump(true);
    let r = HugeRegion::with_options(4 * MIB, &opts).unwrap();
    let cov = r.coverage().unwrap();
    assert_eq!(
        cov.mapped_bytes,
        4 * MIB as u64,
        "populate prefaults: {cov}"
    );
    // mlock as root succeeds; under a low RLIMIT_MEMLOCK the error names the remedy.
    match HugeRegion::with_options(2 * MIB, &HugeOptions::new().mlock(true)) {
        // AddressSanitizer intercepts mlock as a no-op.
        Ok(r) => assert!(r.coverage().unwrap().mapped_bytes > 0 || under_asan()),
        Err(e) => assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}"),
    }
}

#[test]
fn numa_binding_to_missing_node_fails_cleanly() {
    let _serial = serial();
    let opts = HugeOptions::new().numa_node(Some(1000));
    let err = HugeRegion::with_options(2 * MIB, &opts).unwrap_err();
    assert!(matches!(err, HugeError::Mbind { node: 1000, .. }), "{err}");
    // Node 0 always exists.
    let r = HugeRegion::with_options(2 * MIB, &HugeOptions::new().numa_node(Some(0))).unwrap();
    assert_eq!(r.len(), 2 * MIB);
}

#[test]
fn ckhuge_allocator_api_vec_and_zero_size() {
    let _serial = serial();
    let a = CkHuge::new();
    let z = a.allocate(Layout::from_size_align(0, 64).unwrap()).unwrap();
    assert_eq!(z.len(), 0);
    assert_eq!(z.cast::<u8>().as_ptr() as usize % 64, 0);
    // SAFETY: zero-size block from this allocator.
    unsafe { a.deallocate(z.cast(), Layout::from_size_align(0, 64).unwrap()) };

    let mut v: AVec<u64, CkHuge> = AVec::new_in(CkHuge::new());
    for i in 0..2_000_000u64 {
        v.push(i * 3);
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
    v.truncate(10);
    v.shrink_to_fit();
    assert_eq!(&v[..3], &[0, 3, 6]);
}

/// Write every 4093rd byte and the last of the `n`-byte block at `p`, which
/// the caller owns.
fn fill(p: NonNull<u8>, n: usize, seed: u8) {
    for i in (0..n).step_by(4093).chain(n.saturating_sub(1)..n) {
        // SAFETY: `i < n`, inside the caller's live block of `n` bytes.
        unsafe { *p.as_ptr().add(i) = seed.wrapping_add(i as u8) };
    }
}

/// Check the bytes [`fill`] wrote into the first `n` bytes of the block at
/// `p`.
fn check(p: NonNull<u8>, n: usize, seed: u8) {
    for i in (0..n).step_by(4093) {
        assert_eq!(
            // SAFETY: `i < n`, inside the caller's live block, at a byte
            // `fill` wrote (every 4093rd), so it is initialised.
            unsafe { *p.as_ptr().add(i) },
            seed.wrapping_add(i as u8),
            "byte {i}"
        );
    }
}

#[test]
fn grow_and_shrink_across_threshold_preserve_contents() {
    let _serial = serial();
    let a = CkHuge::new();
    let sizes = [
        100,
        MIB,
        2 * MIB,
        3 * MIB,
        9 * MIB,
        64 * MIB,
        4 * MIB,
        1000,
        5 * MIB,
        17,
    ];
    let mut layout = Layout::from_size_align(sizes[0], 8).unwrap();
    let mut p = a.allocate(layout).unwrap().cast::<u8>();
    fill(p, layout.size(), 1);
    for (step, &s) in sizes.iter().enumerate().skip(1) {
        let new = Layout::from_size_align(s, 8).unwrap();
        let keep = layout.size().min(s);
        // SAFETY: p was allocated by `a` with `layout`.
        let q = unsafe {
            if s >= layout.size() {
                a.grow(p, layout, new)
            } else {
                a.shrink(p, layout, new)
            }
        }
        .unwrap();
        assert!(q.len() >= s);
        let q = q.cast::<u8>();
        check(q, keep, step as u8);
        fill(q, s, step as u8 + 1);
        p = q;
        layout = new;
    }
    // SAFETY: allocated by `a` with `layout`.
    unsafe { a.deallocate(p, layout) };
}

#[test]
fn grow_zeroed_zeroes_the_tail_even_after_shrink() {
    let _serial = serial();
    let a = CkHuge::new();
    let l8 = Layout::from_size_align(8 * MIB, 8).unwrap();
    let p = a.allocate(l8).unwrap().cast::<u8>();
    // SAFETY: `p` is a fresh block of 8 MiB.
    unsafe { p.as_ptr().write_bytes(0xFF, 8 * MIB) };
    let l5 = Layout::from_size_align(5 * MIB + 1, 8).unwrap();
    // SAFETY: `p` is live with layout `l8`; `l5` is not larger.
    let p = unsafe { a.shrink(p, l8, l5) }.unwrap().cast::<u8>();
    let l20 = Layout::from_size_align(20 * MIB, 8).unwrap();
    // SAFETY: the shrunk `p` is live with layout `l5`; `l20` is not smaller.
    let q = unsafe { a.grow_zeroed(p, l5, l20) }.unwrap().cast::<u8>();
    // SAFETY: `q` is a live block of 20 MiB: the first `l5.size()` bytes
    // were written, the rest zeroed by `grow_zeroed`.
    let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), 20 * MIB) };
    assert!(s[..5 * MIB + 1].iter().all(|&b| b == 0xFF));
    assert!(s[5 * MIB + 1..].iter().all(|&b| b == 0), "tail not zeroed");
    // SAFETY: `q` is live with layout `l20`; `s` is not used after.
    unsafe { a.deallocate(q, l20) };

    // Small path too.
    let ls = Layout::from_size_align(100, 1).unwrap();
    let p = a.allocate(ls).unwrap().cast::<u8>();
    // SAFETY: `p` is a fresh block of 100 bytes.
    unsafe { p.as_ptr().write_bytes(7, 100) };
    let lb = Layout::from_size_align(1000, 1).unwrap();
    // SAFETY: `p` is live with layout `ls`; `lb` is not smaller.
    let q = unsafe { a.grow_zeroed(p, ls, lb) }.unwrap().cast::<u8>();
    // SAFETY: `q` is a live block of 1000 bytes: 100 written, 900 zeroed.
    let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), 1000) };
    assert!(s[..100].iter().all(|&b| b == 7) && s[100..].iter().all(|&b| b == 0));
    // SAFETY: `q` is live with layout `lb`; `s` is not used after.
    unsafe { a.deallocate(q, lb) };
}

#[test]
fn grow_zeroed_keeps_every_byte_of_the_slice_the_caller_names() {
    // `allocate(3 MiB)` hands out 4 MiB, all of it the caller's: a growth
    // from the slice's length keeps bytes past the request, in place and
    // when the block moves.
    let _serial = serial();
    let a = CkHuge::new();
    for (new, blocker) in [(6 * MIB, false), (30 * MIB, true)] {
        let l3 = Layout::from_size_align(3 * MIB, 64).unwrap();
        let b = a.allocate(l3).unwrap();
        let (p, len) = (b.cast::<u8>(), b.len());
        assert_eq!(len, 4 * MIB);
        // SAFETY: `p` is a live block of `len` bytes, all the caller's.
        unsafe { p.as_ptr().write_bytes(0x55, len) };
        // A block right after it makes the growth move.
        let after = blocker.then(|| a.allocate(Layout::from_size_align(MIB, 64).unwrap()));
        let old = Layout::from_size_align(len, 64).unwrap();
        let grown = Layout::from_size_align(new, 64).unwrap();
        // SAFETY: `p` is live and fits `old` (between the request and the
        // slice's length); `grown` is not smaller.
        let q = unsafe { a.grow_zeroed(p, old, grown) }
            .unwrap()
            .cast::<u8>();
        // SAFETY: `q` is a live block of at least `new` bytes.
        let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), new) };
        assert!(
            s[..len].iter().all(|&x| x == 0x55),
            "old bytes lost ({new})"
        );
        assert!(
            s[len..].iter().all(|&x| x == 0),
            "added bytes not zero ({new})"
        );
        // SAFETY: `q` is live with layout `grown`; `s` is not used after.
        unsafe { a.deallocate(q, grown) };
        if let Some(Ok(b)) = after {
            let l = Layout::from_size_align(MIB, 64).unwrap();
            // SAFETY: allocated by `a` with `l`.
            unsafe { a.deallocate(b.cast(), l) };
        }
    }
}

#[test]
fn a_request_the_kernel_will_not_commit_fails_without_mapping_for_it() {
    // Under heuristic or strict overcommit a 64 TiB private mapping cannot be
    // committed: the request fails before the extent map maps its leaves
    // (2,048 leaves of 32 KiB would cover 64 TiB).
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if mode.trim() == "1" {
        eprintln!("SKIP: vm.overcommit_memory = 1 commits any length");
        return;
    }
    let _serial = serial();
    let vm_size = || {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmSize:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
    };
    let a = CkHuge::new();
    let before = vm_size();
    for len in [1usize << 46, 1 << 45] {
        let l = Layout::from_size_align(len, 8).unwrap();
        assert!(a.allocate(l).is_err(), "{len} bytes served");
    }
    let grown = vm_size().saturating_sub(before);
    assert!(grown < 16 << 10, "VmSize grew by {grown} KiB");
    let peak = ckalloc::huge_stats().peak_span_bytes;
    assert!(peak < 1 << 44, "a span of {peak} bytes was counted");
}

#[test]
fn alignments_from_1_to_1gib() {
    let _serial = serial();
    let a = CkHuge::new();
    let mut align = 1usize;
    while align <= 1 << 30 {
        for size in [1usize, 3 * MIB] {
            let l = Layout::from_size_align(size, align).unwrap();
            let b = a.allocate(l).unwrap();
            let addr = b.cast::<u8>().as_ptr() as usize;
            assert_eq!(addr % align, 0, "size {size} align {align}");
            fill(b.cast(), size, 3);
            check(b.cast(), size, 3);
            // SAFETY: allocated above with `l`.
            unsafe { a.deallocate(b.cast(), l) };
        }
        align <<= 1;
    }
}

#[test]
fn realloc_moves_keep_alignment_above_huge_page() {
    let _serial = serial();
    let a = CkHuge::new();
    let l = Layout::from_size_align(4 * MIB, 64 * MIB).unwrap();
    let p = a.allocate(l).unwrap().cast::<u8>();
    fill(p, 4 * MIB, 5);
    // Block the in-place path so the move is forced.
    let _blocker = HugeRegion::new(2 * MIB);
    let l2 = Layout::from_size_align(300 * MIB, 64 * MIB).unwrap();
    // SAFETY: `p` is live with layout `l`; `l2` is not smaller.
    let q = unsafe { a.grow(p, l, l2) }.unwrap().cast::<u8>();
    assert_eq!(q.as_ptr() as usize % (64 * MIB), 0);
    check(q, 4 * MIB, 5);
    // SAFETY: `q` is the grown block, live with layout `l2`.
    unsafe { a.deallocate(q, l2) };
}

#[test]
fn threshold_routes_small_requests_to_system() {
    let _serial = serial();
    let a = CkHuge::with_threshold(64 * MIB);
    assert_eq!(a.threshold(), 64 * MIB);
    let before = huge_stats();
    let l = Layout::from_size_align(8 * MIB, 8).unwrap();
    let b = a.allocate(l).unwrap();
    assert_eq!(b.len(), 8 * MIB, "System gives exactly the size");
    // SAFETY: `b` is the live block allocated with `l` (8 MiB) above.
    unsafe { a.deallocate(b.cast(), l) };
    let l = Layout::from_size_align(64 * MIB, 8).unwrap();
    let b = a.allocate(l).unwrap();
    let after = huge_stats();
    let blocks = |s: &HugeStats| s.hugetlb.blocks + s.thp.blocks + s.normal.blocks;
    assert!(blocks(&after) > blocks(&before));
    // SAFETY: `b` is the live block allocated with `l` (64 MiB) above.
    unsafe { a.deallocate(b.cast(), l) };
}

#[test]
fn probe_and_stats_display() {
    let _serial = serial();
    let p = probe();
    assert!(p.base_page_size >= 4096);
    let text = p.to_string();
    assert!(text.contains("THP:"), "{text}");
    if std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").exists() {
        assert!(p.pool(2 * MIB as u64).is_some());
    }
    let r = HugeRegion::new(2 * MIB).unwrap();
    let s = huge_stats();
    assert!(s.hugetlb.blocks + s.thp.blocks + s.normal.blocks >= 1);
    let text = s.to_string();
    assert!(
        text.contains("THP") && text.contains("system calls: mmap"),
        "{text}"
    );
    drop(r);
}

#[test]
fn alignment_that_cannot_fit_is_too_large_not_an_mmap_error() {
    let _serial = serial();
    let opts = HugeOptions::new();
    let err = HugeRegion::with_alignment(1, 1 << 63, &opts).unwrap_err();
    assert!(matches!(err, HugeError::TooLarge { requested: 1 }), "{err}");
    let err = HugeRegion::with_alignment(1, 3 << 20, &opts).unwrap_err();
    assert!(
        matches!(err, HugeError::BadAlignment { align } if align == 3 << 20),
        "{err}"
    );
}

#[test]
fn gigantic_pages_when_reserved() {
    let _serial = serial();
    let free_1g: u64 =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
    let opts = HugeOptions::new().allow_1gib(true);
    if free_1g == 0 {
        eprintln!(
            "SKIP gigantic_pages_when_reserved: no free 1 GiB hugetlb page \
             (echo 1 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages; .ci/run tries)"
        );
        // Without 1 GiB pages the ladder still serves the request below.
        let r = HugeRegion::with_options(3 * MIB, &opts).unwrap();
        assert_ne!(r.page_size(), 1 << 30);
        return;
    }
    reset_hugetlb_backoff();
    let mut r = HugeRegion::with_options(3 * MIB, &opts).unwrap();
    assert_eq!(r.backing(), Backing::Hugetlb);
    assert_eq!(r.page_size(), 1 << 30);
    assert_eq!(r.mapped_len(), 1 << 30);
    assert_eq!(r.as_ptr() as usize % (1 << 30), 0);
    r.as_mut_slice()[3 * MIB - 1] = 1;
    let (p, len) = (r.as_ptr() as usize, r.mapped_len());
    drop(r);
    assert_unmapped(p, len);
}

#[test]
fn populate_threads_prefaults_every_page() {
    let _serial = serial();
    // Even, odd (an 8 MiB chunk and a 2 MiB tail), many chunks with a tail,
    // more threads than cores, and 0 = all cores; one byte past a 2 MiB
    // multiple is rounded up and covered too.
    for (bytes, threads) in [
        (16 * MIB, 2),
        (40 * MIB + 1, 2),
        (10 * MIB, 2),
        (8 * MIB + 1, 64),
        (6 * MIB, 0),
        (2 * MIB, 2),
    ] {
        let opts = HugeOptions::new().hugetlb(false).populate_threads(threads);
        assert!(opts.populates());
        let r = HugeRegion::with_options(bytes, &opts).unwrap();
        // The whole mapping (past `len` to the 2 MiB boundary), not only
        // the requested bytes, is resident.
        let cov = huge_page_coverage(r.as_ptr(), r.mapped_len()).unwrap();
        assert_eq!(
            cov.mapped_bytes,
            r.mapped_len() as u64,
            "{bytes} bytes on {threads} threads: every page resident: {cov}"
        );
        assert!(r.as_slice().iter().step_by(4096).all(|&b| b == 0));
        let (p, len) = (r.as_ptr() as usize, r.mapped_len());
        drop(r);
        assert_unmapped(p, len);
    }
}

// ---- retention through `GlobalAlloc`, called on `CkHuge` values (the
// ---- global allocator of this binary is the system's)

fn layout(size: usize, align: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(size, align).unwrap()
}

/// Allocates through `GlobalAlloc`, panicking on null.
fn galloc(a: &CkHuge, l: std::alloc::Layout) -> *mut u8 {
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::GlobalAlloc::alloc(a, l) };
    assert!(!p.is_null(), "{l:?}");
    p
}

fn gfree(a: &CkHuge, p: *mut u8, l: std::alloc::Layout) {
    // SAFETY: `p` came from a `CkHuge` with a layout of the same length.
    unsafe { std::alloc::GlobalAlloc::dealloc(a, p, l) }
}

/// System calls that map or unmap.
fn maps(s: &HugeStats) -> u64 {
    s.syscalls.mmap + s.syscalls.munmap + s.syscalls.mremap
}

/// Bytes given back to the kernel between two snapshots: purged units of
/// THP and normal-page spans, or hugetlb spans unmapped whole (their units
/// are never purged).
fn given_back(before: &HugeStats, after: &HugeStats) -> u64 {
    (after.purged_bytes - before.purged_bytes) + (after.unmapped_bytes - before.unmapped_bytes)
}

/// Whether the engine serves this process's fresh blocks from hugetlb
/// pages (reserved ones are free and `CKALLOC_HUGETLB` allows them).
fn hugetlb_blocks() -> bool {
    let before = huge_stats().hugetlb.blocks;
    let l = layout(2 * MIB, 8);
    let p = galloc(&CkHuge::uncached(), l);
    let hugetlb = huge_stats().hugetlb.blocks > before;
    gfree(&CkHuge::uncached(), p, l);
    hugetlb
}

#[test]
fn a_freed_block_is_reused_by_another_value_without_a_system_call() {
    let _s = serial();
    release_retained();
    let (a, b) = (CkHuge::new(), CkHuge::with_threshold(MIB));
    let l = layout(4 * MIB, 8);
    let p = galloc(&a, l);
    gfree(&a, p, l);
    let before = huge_stats();
    let q = galloc(&b, l);
    let after = huge_stats();
    assert_eq!(q, p, "the retained block serves the next request");
    assert_eq!(
        after.syscalls, before.syscalls,
        "a hit makes no system call"
    );
    assert_eq!(after.retention_hits, before.retention_hits + 1);
    gfree(&b, q, l);
    release_retained();
}

#[test]
fn a_longer_request_misses_a_shorter_retained_block_and_a_shorter_one_carves_it() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l4 = layout(4 * MIB, 8);
    let p = galloc(&a, l4);
    gfree(&a, p, l4);
    let before = huge_stats();
    let l6 = layout(6 * MIB, 8);
    let q = galloc(&a, l6);
    assert_ne!(q, p, "a 6 MiB request must not get a 4 MiB block");
    assert_eq!(huge_stats().retention_misses, before.retention_misses + 1);
    // 3 MiB + 1 rounds to the same 4 MiB.
    let l3 = layout(3 * MIB + 1, 8);
    let r = galloc(&a, l3);
    assert_eq!(r, p);
    // SAFETY: the whole 4 MiB block is ours; its last byte is writable.
    unsafe { *r.add(4 * MIB - 1) = 1 };
    gfree(&a, q, l6);
    gfree(&a, r, l3);
    release_retained();
}

#[test]
fn a_hit_meets_the_requested_alignment() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    // Retain a block that is not 64 MiB aligned.
    let mut kept = Vec::new();
    let p = loop {
        let p = galloc(&a, l);
        if !(p as usize).is_multiple_of(64 * MIB) {
            break p;
        }
        kept.push(p);
    };
    gfree(&a, p, l);
    let big = layout(4 * MIB, 64 * MIB);
    let q = galloc(&a, big);
    assert!((q as usize).is_multiple_of(64 * MIB), "alignment of a hit");
    assert_ne!(q, p);
    gfree(&a, q, big);
    for k in kept {
        gfree(&a, k, l);
    }
    release_retained();
}

#[test]
fn zeroed_hits_read_zero_below_and_above_the_memset_cutoff() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    for size in [4 * MIB, 32 * MIB] {
        // Nothing else retained: the block comes back whole.
        release_retained();
        let l = layout(size, 8);
        let p = galloc(&a, l);
        // SAFETY: `size` bytes are ours.
        unsafe { p.write_bytes(0xAB, size) };
        gfree(&a, p, l);
        let hits = huge_stats().retention_hits;
        // SAFETY: non-zero size.
        let z = unsafe { std::alloc::GlobalAlloc::alloc_zeroed(&a, l) };
        assert_eq!(z, p, "{size}: the dirty block comes back");
        assert_eq!(huge_stats().retention_hits, hits + 1);
        // SAFETY: `size` bytes are ours.
        let s = unsafe { std::slice::from_raw_parts(z, size) };
        assert!(s.iter().all(|&b| b == 0), "{size}: not zeroed");
        gfree(&a, z, l);
    }
    release_retained();
}

#[test]
fn retained_bytes_stay_under_the_cap_and_what_does_not_fit_is_purged() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let blocks: Vec<_> = (0..40).map(|_| galloc(&a, l)).collect();
    let before = huge_stats();
    for &p in &blocks {
        gfree(&a, p, l);
    }
    let after = huge_stats();
    let cap = env::retain_bytes() as u64;
    assert!(after.retained_bytes <= cap, "{after:?}");
    assert!(after.retained_bytes >= cap.min(160 * MIB as u64) - 4 * MIB as u64);
    let refused = 160 * MIB as u64 - after.retained_bytes;
    assert_eq!(given_back(&before, &after), refused);
    if !hugetlb_blocks() {
        assert_eq!(maps(&after), maps(&before), "purged, not unmapped");
    }
    release_retained();
}

#[test]
fn a_per_value_limit_and_uncached_purge_every_freed_block() {
    let _s = serial();
    release_retained();
    let l = layout(4 * MIB, 8);
    let hugetlb = hugetlb_blocks();
    for a in [CkHuge::uncached(), CkHuge::new().retain_max_bytes(2 * MIB)] {
        let p = galloc(&a, l);
        gfree(&a, p, l);
        let before = huge_stats();
        let q = galloc(&a, l);
        gfree(&a, q, l);
        let after = huge_stats();
        assert_eq!(after.retained_bytes, 0);
        assert_eq!(after.retention_hits, before.retention_hits);
        assert_eq!(given_back(&before, &after), 4 * MIB as u64, "{a:?}");
        if !hugetlb {
            // A hugetlb span holds one block and goes back with it.
            assert_eq!(q, p, "{a:?}: the purged units serve again");
            assert_eq!(maps(&after), maps(&before), "{a:?}: no mapping per block");
        }
    }
    assert_eq!(CkHuge::uncached().retain_max(), 0);
    assert_ne!(CkHuge::uncached(), CkHuge::new());
}

#[test]
fn release_retained_gives_everything_back_and_stats_add_up() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let start = huge_stats();
    let l = layout(6 * MIB, 8);
    let p = galloc(&a, l);
    assert_eq!(huge_stats().live_bytes, start.live_bytes + 6 * MIB as u64);
    gfree(&a, p, l);
    let kept = huge_stats();
    assert_eq!(kept.retained_bytes, 6 * MIB as u64);
    assert_eq!(kept.live_bytes, start.live_bytes, "retained is not live");
    assert!(kept.to_string().contains("retained: 6.00 MiB"), "{kept}");
    assert_eq!(release_retained(), 6 * MIB);
    let end = huge_stats();
    assert_eq!(end.retained_bytes, 0);
    assert_eq!(end.live_bytes, start.live_bytes);
    assert_eq!(end.spans, start.spans, "the span no block uses went back");
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
                    let p = galloc(&a, l);
                    // SAFETY: first and last byte of our block.
                    unsafe {
                        *p = t;
                        *p.add(size - 1) = t;
                        std::hint::black_box(p);
                        assert_eq!((*p, *p.add(size - 1)), (t, t));
                    }
                    gfree(&a, p, l);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let end = huge_stats();
    assert!(end.retention_hits - start.retention_hits > 5900, "{end:?}");
    if end.hugetlb.blocks == start.hugetlb.blocks {
        assert!(end.spans <= start.spans + 2, "one span per thread at most");
    }
    release_retained();
    assert_eq!(huge_stats().live_bytes, start.live_bytes);
}

#[test]
fn caching_allocator_over_ckhuge_trims_to_the_kernel() {
    let _s = serial();
    release_retained();
    let c = ckalloc::caching::CachingAllocator::unbounded(CkHuge::new());
    let l = Layout::from_size_align(8 * MIB, 8).unwrap();
    let b = c.allocate(l).unwrap();
    // SAFETY: allocated above with `l`.
    unsafe { c.deallocate(b.cast(), l) };
    let before = huge_stats();
    c.trim();
    let after = huge_stats();
    assert_eq!(given_back(&before, &after), 8 * MIB as u64);
    assert_eq!(after.retained_bytes, 0, "the cache is the only cache");
}

#[test]
fn decay_gives_blocks_back_after_the_delay_and_then_their_idle_span() {
    run_child(
        "child_decay",
        &[
            ("CKALLOC_RETAIN_DECAY_MS", "20"),
            ("CKALLOC_RETAIN_BYTES", "33554432"),
            ("CKALLOC_HUGETLB", "0"),
        ],
    );
}

#[test]
#[ignore = "run by decay_gives_blocks_back_after_the_delay_and_then_their_idle_span"]
fn child_decay() {
    assert_eq!(env::retain_decay_ms(), 20);
    assert_eq!(env::retain_bytes(), 32 * MIB);
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let keep = galloc(&a, layout(2 * MIB, 8));
    let p = galloc(&a, l);
    gfree(&a, p, l);
    assert_eq!(huge_stats().retained_bytes, 4 * MIB as u64);
    let steps = |done: &dyn Fn(&HugeStats) -> bool| {
        decay_steps(&a, 20, done);
    };
    let munmaps = huge_stats().syscalls.munmap;
    steps(&|s| s.retained_bytes == 0);
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    assert_eq!(s.decayed_bytes, 4 * MIB as u64);
    assert_eq!(s.spans, 1, "purged: the span another block uses stays");
    assert_eq!(s.syscalls.munmap, munmaps, "purged, not unmapped");
    // SAFETY: the purged units read zero, and are ours to read no more
    // than the span's: `keep` is live, so the span is mapped.
    let purged = unsafe { std::slice::from_raw_parts(p, 4 * MIB) };
    assert!(purged.iter().step_by(4096).all(|&b| b == 0));
    // Once no block uses the span and its last free is the delay old, the
    // span goes back whole.
    gfree(&a, keep, layout(2 * MIB, 8));
    steps(&|s| s.spans == 0);
    let s = huge_stats();
    assert_eq!((s.spans, s.spans_released), (0, 1), "{s:?}");
    assert_eq!(s.retained_bytes, 0);
    assert_eq!(s.syscalls.munmap, munmaps + 1, "one munmap: the span");
}

/// Small allocations of `a`, which drive the decay steps while a block is
/// retained: 1,024 every 25 ms, `rounds` times at most, until `done`.
fn decay_steps(a: &CkHuge, rounds: usize, done: &dyn Fn(&HugeStats) -> bool) {
    let small = layout(64, 8);
    for _ in 0..rounds {
        std::thread::sleep(std::time::Duration::from_millis(25));
        for _ in 0..1024 {
            gfree(a, galloc(a, small), small);
        }
        if done(&huge_stats()) {
            break;
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock of the decay window's slots.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable `timespec`.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    assert_eq!(r, 0);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Sleeps until 5 ms after a slot of a 2 s window starts (`WINDOW_2S`),
/// so that a peak noted now stays in the window for 2.24 s; returns the
/// moment.
fn at_a_slot_start() -> std::time::Instant {
    let slot = 2_000_000_000 / 8;
    std::thread::sleep(std::time::Duration::from_nanos(
        slot - monotonic_ns() % slot + 5_000_000,
    ));
    std::time::Instant::now()
}

/// A block of `size` bytes allocated and freed: retained.
fn retain_block(a: &CkHuge, size: usize) {
    let l = layout(size, 8);
    gfree(a, galloc(a, l), l);
}

/// A 2 s decay window (the default, set), a 64 MiB cap, no hugetlb.
const WINDOW_2S: &[(&str, &str)] = &[
    ("CKALLOC_RETAIN_DECAY_MS", "2000"),
    ("CKALLOC_RETAIN_BYTES", "67108864"),
    ("CKALLOC_HUGETLB", "0"),
];

#[test]
fn decay_keeps_a_miss_slack_for_a_window() {
    run_child("child_decay_footprint", WINDOW_2S);
}

#[test]
#[ignore = "run by decay_keeps_a_miss_slack_for_a_window"]
fn child_decay_footprint() {
    use std::time::{Duration, Instant};
    let a = CkHuge::new();
    let t0 = Instant::now();
    retain_block(&a, 4 * MIB);
    std::thread::sleep(Duration::from_millis(1000));
    // The retained 4 MiB, freed within the window, do not fit: a miss
    // whose slack they are, though no more than 6 MiB were ever live.
    let tq = Instant::now();
    retain_block(&a, 6 * MIB);
    assert_eq!(huge_stats().retained_bytes, 10 * MIB as u64);
    // Past the window for the 4 MiB block, within it for the miss: a peak
    // of live bytes would keep 6 MiB and give the 4 MiB back.
    decay_steps(&a, 200, &|_| t0.elapsed() >= Duration::from_millis(2200));
    let s = huge_stats();
    if tq.elapsed() >= Duration::from_millis(1950) {
        eprintln!("skipped: descheduled past the miss's window");
        return;
    }
    assert_eq!(s.retained_bytes, 10 * MIB as u64, "{s:?}");
    assert_eq!(s.decayed_bytes, 0);
    // One window after the miss, both go back: nothing was given back
    // before, so nothing is held longer.
    decay_steps(&a, 200, &|s| s.retained_bytes == 0);
    let s = huge_stats();
    assert_eq!(s.retained_bytes, 0, "{:?}: {s:?}", t0.elapsed());
    assert_eq!(s.decayed_bytes, 10 * MIB as u64);
}

#[test]
fn decay_gives_back_runs_older_than_the_window_though_a_miss_follows() {
    run_child("child_decay_old_runs", WINDOW_2S);
}

#[test]
#[ignore = "run by decay_gives_back_runs_older_than_the_window_though_a_miss_follows"]
fn child_decay_old_runs() {
    use std::time::{Duration, Instant};
    let a = CkHuge::new();
    // The block's peak stays in the window for 2.24 s, past the 2 s after
    // which its run is old.
    let t0 = at_a_slot_start();
    retain_block(&a, 4 * MIB);
    // No call meanwhile: no decay step; the run is older than the window,
    // its peak still in it, so the step this call runs first keeps it.
    std::thread::sleep(Duration::from_millis(2100));
    // A miss: the old run, which does not fit, is no slack. Counted as
    // slack, it would stay until a window after the miss.
    let tq = Instant::now();
    retain_block(&a, 6 * MIB);
    if huge_stats().decayed_bytes != 0 || t0.elapsed() >= Duration::from_millis(2240) {
        eprintln!("skipped: the old run's peak left the window before the miss");
        return;
    }
    // Once the 4 MiB block's own peak leaves the window (about 150 ms
    // after the miss), the old run goes; as slack it would stay until a
    // window after the miss.
    let within = Duration::from_millis(1900);
    decay_steps(&a, 200, &|s| {
        s.decayed_bytes >= 4 * MIB as u64 || tq.elapsed() >= within
    });
    let s = huge_stats();
    if tq.elapsed() >= Duration::from_millis(1950) {
        eprintln!("skipped: descheduled past the miss's window");
        return;
    }
    assert_eq!(
        s.retained_bytes,
        6 * MIB as u64,
        "the fresh run stays: {s:?}"
    );
    assert_eq!(s.decayed_bytes, 4 * MIB as u64, "the old one went");
}

#[test]
fn a_move_that_misses_notes_its_new_block_without_the_one_it_replaces() {
    run_child("child_decay_move", WINDOW_2S);
}

#[test]
#[ignore = "run by a_move_that_misses_notes_its_new_block_without_the_one_it_replaces"]
fn child_decay_move() {
    use std::time::{Duration, Instant};
    let a = CkHuge::new();
    // The first peak keeps the old runs past 2 s.
    let t0 = at_a_slot_start();
    let (r1, r2, c, b) = (
        layout(4 * MIB, 8),
        layout(4 * MIB, 8),
        layout(6 * MIB, 8),
        layout(4 * MIB, 8),
    );
    let (pr1, pr2, pc, pa) = (galloc(&a, r1), galloc(&a, r2), galloc(&a, c), galloc(&a, b));
    let pb = galloc(&a, b);
    // Two runs of 4 MiB with stamps of their own, old at the miss.
    gfree(&a, pr1, r1);
    std::thread::sleep(Duration::from_millis(50));
    gfree(&a, pr2, r2);
    std::thread::sleep(Duration::from_millis(2100));
    // 6 MiB freed within the window: the miss's slack.
    gfree(&a, pc, c);
    let s = huge_stats();
    if s.decayed_bytes != 0 || t0.elapsed() >= Duration::from_millis(2240) {
        eprintln!("skipped: the first peak left the window before the miss");
        return;
    }
    assert_eq!(s.retained_bytes, 14 * MIB as u64, "{s:?}");
    // The 4 MiB block at `pa` cannot grow in place (the one at `pb`
    // follows it), and no retained run fits 40 MiB: a move that misses.
    // Its demand is 4 MiB live plus the 40 MiB block plus 6 MiB of slack,
    // 50 MiB; counting the block it replaces would make it 54.
    let tq = Instant::now();
    // SAFETY: `pa` is live with layout `b`; 40 MiB is not zero.
    let pa = unsafe { std::alloc::GlobalAlloc::realloc(&a, pa, b, 40 * MIB) };
    assert!(!pa.is_null());
    let s = huge_stats();
    assert_eq!(s.moved, 1, "{s:?}");
    gfree(&a, pa, layout(40 * MIB, 8));
    gfree(&a, pb, b);
    assert_eq!(huge_stats().retained_bytes, 58 * MIB as u64);
    // Decay keeps the 50 MiB of demand: both old runs go (as 54 MiB, one).
    decay_steps(&a, 200, &|s| {
        s.decayed_bytes >= 8 * MIB as u64 || tq.elapsed() >= Duration::from_millis(1900)
    });
    let s = huge_stats();
    if tq.elapsed() >= Duration::from_millis(1950) {
        eprintln!("skipped: descheduled past the miss's window");
        return;
    }
    assert_eq!(s.decayed_bytes, 8 * MIB as u64, "{s:?}");
    assert_eq!(s.retained_bytes, 50 * MIB as u64, "{s:?}");
}

#[test]
fn retention_off_by_environment_purges_every_freed_block() {
    run_child("child_retention_off", &[("CKALLOC_RETAIN_BYTES", " 0 ")]);
}

#[test]
#[ignore = "run by retention_off_by_environment_purges_every_freed_block"]
fn child_retention_off() {
    assert_eq!(env::retain_bytes(), 0);
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let before = huge_stats();
    for _ in 0..3 {
        let p = galloc(&a, l);
        gfree(&a, p, l);
    }
    let after = huge_stats();
    assert_eq!(after.retained_bytes, 0);
    assert_eq!(after.retention_hits, before.retention_hits);
    assert_eq!(given_back(&before, &after), 12 * MIB as u64);
}

#[cfg(target_os = "linux")]
#[test]
fn a_fork_child_recounts_what_a_thread_of_the_parent_had_half_retained() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    // As a thread caught between admitting a freed block under the cap and
    // retaining it: the count says a terabyte is retained, so nothing fits
    // until the child recounts.
    ckalloc::huge::hold_retained_bytes(true);
    // SAFETY: the child only allocates, frees and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let q = galloc(&a, l);
            // SAFETY: our block.
            unsafe { q.write_bytes(1, 4 * MIB) };
            gfree(&a, q, l);
            let hits = huge_stats().retention_hits;
            let r = galloc(&a, l);
            gfree(&a, r, l);
            r == q && huge_stats().retention_hits == hits + 1
        });
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    ckalloc::huge::hold_retained_bytes(false);
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    release_retained();
}

#[test]
fn a_fork_child_gives_back_the_retained_blocks_it_inherits() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(8 * MIB, 8);
    let p = galloc(&a, l);
    // SAFETY: our block.
    unsafe { p.write_bytes(1, 8 * MIB) };
    gfree(&a, p, l);
    let before = huge_stats();
    assert_eq!(before.retained_bytes, 8 * MIB as u64);
    // SAFETY: the child only reads statistics, allocates, frees and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let s = huge_stats();
            // Nothing retained: the copy-on-write pages went back at the fork.
            // Purged, or unmapped with the span no block uses.
            let gone = s.retained_bytes == 0 && given_back(&before, &s) >= 8 * MIB as u64;
            let q = galloc(&a, l);
            gfree(&a, q, l);
            gone && huge_stats().retention_hits == s.retention_hits
        });
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    // The parent keeps its block, pages and all.
    assert_eq!(huge_stats().retained_bytes, 8 * MIB as u64);
    let q = galloc(&a, l);
    assert_eq!(q, p);
    // SAFETY: the block the parent wrote before the fork, retained.
    assert_eq!(unsafe { *q.add(4 * MIB) }, 1);
    gfree(&a, q, l);
    release_retained();
}

/// A small allocator that counts its calls and forwards them to `System`.
struct Counting(std::sync::atomic::AtomicUsize);

// SAFETY: forwards to `System`, which upholds the contract.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { std::alloc::GlobalAlloc::alloc(&std::alloc::System, l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { std::alloc::GlobalAlloc::dealloc(&std::alloc::System, p, l) }
    }
}

static WITH_SMALL: CkHuge<Counting> =
    CkHuge::with_small_allocator(Counting(std::sync::atomic::AtomicUsize::new(0)))
        .threshold_bytes(4 * MIB)
        .retain_max_bytes(8 * MIB);

#[test]
fn small_requests_go_to_the_small_allocator() {
    use std::alloc::GlobalAlloc;
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
    let blocks = |s: &HugeStats| s.hugetlb.blocks + s.thp.blocks + s.normal.blocks;
    let n = blocks(&huge_stats());
    let big = layout(4 * MIB, 8);
    // SAFETY: as above.
    unsafe { a.dealloc(a.alloc(big), big) };
    assert_eq!(calls(), before + 2, "at the threshold: an engine block");
    assert_eq!(blocks(&huge_stats()), n + 1);
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
        let p = galloc(&a, l);
        gfree(&a, p, l);
        p as usize
    })
    .join()
    .unwrap();
    assert_eq!(huge_stats().retained_bytes, 6 * MIB as u64);
    let a = CkHuge::new();
    let q = galloc(&a, l);
    assert_eq!(q as usize, addr, "the exited thread's block is shared");
    gfree(&a, q, l);
    release_retained();
}

#[test]
fn a_shrink_stays_in_place_and_a_growth_takes_the_free_units_after_it() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(32 * MIB, 8);
    let p = galloc(&a, l);
    // SAFETY: 32 MiB of ours.
    unsafe { p.write_bytes(5, 32 * MIB) };
    let before = huge_stats();
    // SAFETY: `p` came from `a` with `l`.
    let s = unsafe { std::alloc::GlobalAlloc::realloc(&a, p, l, 3 * MIB) };
    let mid = huge_stats();
    assert_eq!(s, p);
    assert_eq!(
        maps(&mid),
        maps(&before),
        "a shrink maps and unmaps nothing"
    );
    // SAFETY: 3 MiB of ours.
    assert!(unsafe { std::slice::from_raw_parts(s, 3 * MIB) }
        .iter()
        .all(|&b| b == 5));
    // The units after it are free (retained): it grows in place.
    // SAFETY: `s` came from `a` with 3 MiB.
    let g = unsafe { std::alloc::GlobalAlloc::realloc(&a, s, layout(3 * MIB, 8), 20 * MIB) };
    let after = huge_stats();
    assert_eq!(g, p);
    assert_eq!(after.grown_in_place, before.grown_in_place + 1);
    assert_eq!(maps(&after), maps(&before));
    gfree(&a, g, layout(20 * MIB, 8));
    release_retained();
}

#[test]
fn a_block_freed_read_only_is_cleared_and_writable_for_the_next_zeroed_request() {
    let _s = serial();
    release_retained();
    let a = CkHuge::new();
    let l = layout(4 * MIB, 8);
    let p = galloc(&a, l);
    // SAFETY: our block; protecting it changes no byte.
    unsafe {
        p.write_bytes(7, 4 * MIB);
        assert_eq!(libc::mprotect(p.cast(), 4 * MIB, libc::PROT_READ), 0);
    }
    gfree(&a, p, l);
    // The memset that clears the hit is preceded by making it writable.
    // SAFETY: non-zero size.
    let z = unsafe { std::alloc::GlobalAlloc::alloc_zeroed(&a, l) };
    assert_eq!(z, p, "a hit");
    // SAFETY: 4 MiB of ours.
    let s = unsafe { std::slice::from_raw_parts_mut(z, 4 * MIB) };
    assert!(s.iter().all(|&b| b == 0));
    s.fill(9);
    gfree(&a, z, l);
    release_retained();
}

#[test]
fn threads_take_their_fresh_blocks_from_spans_of_their_own() {
    run_child("child_thread_spans", &[("CKALLOC_HUGETLB", "0")]);
}

#[test]
#[ignore = "run by threads_take_their_fresh_blocks_from_spans_of_their_own"]
fn child_thread_spans() {
    assert_eq!(huge_stats().spans, 0, "a fresh process");
    let both = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let a = CkHuge::new();
                let l = layout(8 * MIB, 8);
                let p = galloc(&a, l);
                both.wait();
                gfree(&a, p, l);
            });
        }
    });
    assert_eq!(huge_stats().spans, 2, "a span for each thread's group");
}

#[test]
fn a_block_longer_than_a_span_gets_one_of_its_own_and_shrinks_in_place() {
    let _s = serial();
    let a = CkHuge::new();
    let l = Layout::from_size_align(3 << 30, 8).unwrap();
    // `hugetlb_blocks` probes with an allocation of its own: ask before counting spans.
    let plain = !hugetlb_blocks();
    let spans = huge_stats().spans;
    let b = a.allocate(l).unwrap();
    assert_eq!(b.len(), 3 << 30);
    if plain {
        assert_eq!(huge_stats().spans, spans + 1);
    }
    let small = Layout::from_size_align(6 * MIB, 8).unwrap();
    // SAFETY: `b` is live with layout `l`; `small` is not larger.
    let s = unsafe { a.shrink(b.cast(), l, small) }.unwrap();
    assert_eq!(s.cast::<u8>(), b.cast::<u8>(), "in place");
    // SAFETY: the shrunk block, live with `small`.
    unsafe { a.deallocate(s.cast(), small) };
    release_retained();
}

#[test]
fn racing_threads_with_decay_and_release_never_share_a_block() {
    run_child(
        "child_racing",
        &[
            ("CKALLOC_RETAIN_DECAY_MS", "0"),
            ("CKALLOC_RETAIN_BYTES", "64MiB"),
        ],
    );
}

#[test]
#[ignore = "run by racing_threads_with_decay_and_release_never_share_a_block"]
fn child_racing() {
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                let a = CkHuge::new();
                let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
                for i in 0..400usize {
                    let size = ((i * 7 + t as usize) % 9 + 1) * MIB + 3;
                    let l = Layout::from_size_align(size, 8).unwrap();
                    // Retained (`GlobalAlloc`) and purged (`Allocator`) blocks.
                    let p = if i % 2 == 0 {
                        galloc(&a, l)
                    } else {
                        a.allocate(l).unwrap().cast::<u8>().as_ptr()
                    };
                    let seed = (i as u8) ^ t;
                    // SAFETY: `size` bytes of ours.
                    unsafe { p.write_bytes(seed, size) };
                    live.push((p, l, seed));
                    if live.len() > 6 {
                        let (p, l, seed) = live.swap_remove(i % live.len());
                        // SAFETY: a live block of ours, `l.size()` bytes.
                        let s = unsafe { std::slice::from_raw_parts(p, l.size()) };
                        assert!(s.iter().step_by(4096).all(|&b| b == seed), "thread {t}");
                        gfree(&a, p, l);
                    }
                    if i % 50 == 0 {
                        release_retained();
                    }
                }
                for (p, l, _) in live {
                    gfree(&a, p, l);
                }
            });
        }
    });
    release_retained();
    let s = huge_stats();
    assert_eq!((s.live_bytes, s.retained_bytes), (0, 0), "{s:?}");
}
