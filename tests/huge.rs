//! Huge-page regions, `huge_alloc`/`huge_free`, `CkHuge` through
//! `allocator_api2`, coverage and probe.

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
fn huge_alloc_free_round_trip_leaves_nothing() {
    let _serial = serial();
    for bytes in [1, 4096, 2 * MIB, 5 * MIB + 3] {
        let p = huge_alloc(bytes).unwrap();
        let addr = p.as_ptr() as usize;
        assert_eq!(addr % (2 * MIB), 0);
        // SAFETY: the block is at least `bytes` long and ours.
        unsafe {
            p.as_ptr().write_bytes(0xAB, bytes);
            assert_eq!(*p.as_ptr().add(bytes - 1), 0xAB);
            huge_free(p, bytes);
        }
        assert_unmapped(addr, bytes.div_ceil(2 * MIB) * 2 * MIB);
    }
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
            if size >= 2 * MIB {
                assert_unmapped(addr, 4 * MIB);
            }
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
    let mapped = |s: &HugeStats| s.hugetlb.mappings + s.thp.mappings + s.normal.mappings;
    assert!(mapped(&after) > mapped(&before));
    // SAFETY: `b` is the live block allocated with `l` (64 MiB) above.
    unsafe { a.deallocate(b.cast(), l) };
}

#[test]
fn probe_and_stats_display() {
    let _serial = serial();
    let p = probe();
    assert!(p.base_page_size >= 4096);
    let text = p.to_string();
    assert!(text.contains("THP enabled"), "{text}");
    if std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").exists() {
        assert!(p.pool(2 * MIB as u64).is_some());
    }
    let r = HugeRegion::new(2 * MIB).unwrap();
    let s = huge_stats();
    assert!(s.hugetlb.mappings + s.thp.mappings + s.normal.mappings >= 1);
    assert!(s.to_string().contains("THP"));
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
