//! A whole test binary running on `CkHuge` as its global allocator.

use ckalloc::{huge_stats, CkHuge};
use std::collections::HashMap;

#[global_allocator]
static A: CkHuge = CkHuge::new();

#[test]
fn real_workload_runs_on_ckhuge() {
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
    let maps = |s: &ckalloc::HugeStats| s.hugetlb.mappings + s.thp.mappings + s.normal.mappings;
    assert!(
        maps(&after) > maps(&before),
        "large blocks must use the mapping path"
    );
    if after.hugetlb.mappings == before.hugetlb.mappings {
        // THP / plain mappings grow with mremap; hugetlb ones are copied.
        assert!(after.remaps > before.remaps, "Vec growth should use mremap");
    }
}

#[test]
fn threads_allocate_concurrently() {
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
