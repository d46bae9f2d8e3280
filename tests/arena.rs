//! `BumpArena`: layouts, both modes over raw weights files, protections,
//! fallback, materialization, allocation through `allocator_api2`, stress.
//!
//! Tests whose names start with `child_` are `#[ignore]`d: the parent tests
//! re-run this binary with `--exact --ignored child_...` and an environment
//! that says what to do, and check the child's exit status (a write that must
//! die with SIGSEGV, a lowered `RLIMIT_DATA`, `CK_BUMP_*` variables).

mod common;
use allocator_api2::alloc::{Allocator, Layout};
use allocator_api2::boxed::Box as ABox;
use allocator_api2::vec::Vec as AVec;
use ckalloc::*;
use common::*;
use std::io::Write;
#[cfg(target_os = "linux")]
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

/// Deterministic, position-dependent file content.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3] | 1)
        .collect()
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// What the weights region must read: file bytes `[wb, ab)`, zero past EOF.
fn expected_weights(file: &[u8], wb: usize, ab: usize) -> Vec<u8> {
    (wb..ab)
        .map(|i| file.get(i).copied().unwrap_or(0))
        .collect()
}

fn mixed_supported() -> bool {
    cfg!(target_os = "linux")
}

/// Run `child_test` of this binary in a child process with `envs`.
fn run_child(child_test: &str, envs: &[(&str, &str)]) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        child_test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd.env_remove("CK_BUMP_FORCE_MIXED")
        .env_remove("CK_BUMP_DISABLE_MIXED");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn check_layout_invariants(a: &BumpArena) {
    let base = a.as_ptr() as usize;
    assert_eq!(base % PAGE, 0, "base is page aligned");
    assert_eq!(
        (base + (a.activations_base() & !(PAGE - 1))) % (2 * MIB),
        0,
        "runtime region starts in an aligned 2 MiB extent"
    );
    assert!(a.mapped_len() >= a.total_size());
    let (mp, ml) = a.mapping();
    assert!(mp as usize <= base && base + a.mapped_len() == mp as usize + ml);
}

/// Weights files of every shape the arena must accept, as (name,
/// weights_base, activations_base, file length): `activations_base` on a
/// page boundary or not, the file longer than the weights (padding after
/// them), shorter (the rest reads zero) or all within one page, and
/// `weights_base` at 0, past a header, unaligned or on a page boundary. All
/// pass the size check.
fn file_cases() -> Vec<(&'static str, usize, usize, usize)> {
    vec![
        ("page-aligned", 0, 3 * PAGE, 3 * PAGE),
        ("unaligned", 0, 3 * PAGE + 100, 3 * PAGE + 100),
        ("padded", 0, 3 * PAGE + 100, 5 * PAGE + 7),
        ("sub-page", 0, 1000, 1000),
        ("short-in-last-page", 0, 3 * PAGE + 100, 3 * PAGE + 1),
        ("short-whole-page", 0, 3 * PAGE, 2 * PAGE + 1),
        ("header-below-weights", 152, 5 * PAGE + 9, 5 * PAGE + 9),
        ("weights-base-unaligned-one-page", 5000, 6000, 6000),
        ("weights-base-page", 2 * PAGE, 4 * PAGE + 1, 4 * PAGE + 1),
        ("weights-base-unaligned-to-next-page", 152, PAGE, PAGE),
        ("weights-base-unaligned-short-file", 152, 2 * PAGE, PAGE + 1),
        ("weights-base-unaligned-eof-in-page", 100, PAGE, 3000),
    ]
}

fn build(policy: ModePolicy, path: &Path, total: usize, wb: usize, ab: usize) -> BumpArena {
    BumpArena::builder(total)
        .weights_file(path)
        .weights_base(wb)
        .activations_base(ab)
        .policy(policy)
        .build()
        .unwrap_or_else(|e| panic!("{policy:?} wb {wb} ab {ab}: {e}"))
}

/// The prefix `[0, weights_base)` reads zero and is writable in both
/// modes (in mixed mode also in the page `weights_base` falls in, which
/// holds file bytes at and after it); writing it leaves the weights alone.
fn check_prefix(a: &BumpArena, file: &[u8], name: &str) {
    let (wb, ab) = (a.weights_base(), a.activations_base());
    let base = a.ptr_at(0).unwrap().as_ptr();
    // SAFETY: `[0, wb)` lies in the arena's mapping and nothing else
    // refers to it.
    let prefix = unsafe { std::slice::from_raw_parts_mut(base, wb) };
    assert!(prefix.iter().all(|&b| b == 0), "{name}: prefix reads zero");
    prefix.fill(0xab);
    assert!(prefix.iter().all(|&b| b == 0xab), "{name}: prefix writable");
    assert_eq!(a.weights(), &expected_weights(file, wb, ab)[..], "{name}");
}

fn exercise_runtime(a: &BumpArena) {
    let mut v: AVec<u64, _> = AVec::new_in(a);
    v.extend(0..10_000u64);
    assert_eq!(v.iter().sum::<u64>(), 10_000 * 9_999 / 2);
    let off = a.offset_of(v.as_ptr().cast()).unwrap();
    assert!(off >= a.activations_base() && off + 80_000 <= a.total_size());
}

#[test]
fn anon_mode_materializes_every_file_kind() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (name, wb, ab, flen) in file_cases() {
        let file = pattern(flen);
        let path = write_file(dir.path(), name, &file);
        let mut a = build(ModePolicy::AnonOnly, &path, 4 * MIB + 5, wb, ab);
        assert_eq!(a.mode(), ArenaMode::Anon, "{name}");
        assert!(a.fallback_reason().is_none());
        check_layout_invariants(&a);
        assert_eq!(a.weights_file_size(), Some(flen as u64));
        assert!(a.needs_weight_materialization(), "{name}");
        assert!(a.weights().iter().all(|&b| b == 0), "{name}: zero before");
        let mut calls = Vec::new();
        a.materialize_weights_with(|d, t| calls.push((d, t)))
            .unwrap();
        assert!(!a.needs_weight_materialization());
        let exp = expected_weights(&file, wb, ab);
        assert_eq!(a.weights(), &exp[..], "{name}");
        let read = (ab.min(flen) - wb) as u64;
        assert_eq!(calls.last(), Some(&(read, read)), "{name}");
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
        // The region is writable in anon mode and a retry restores it.
        a.weights_mut().unwrap()[0] ^= 0xff;
        a.materialize_weights().unwrap();
        assert_eq!(a.weights(), &exp[..], "{name} after retry");
        check_prefix(&a, &file, name);
        exercise_runtime(&a);
    }
}

#[test]
fn mixed_mode_maps_every_file_kind() {
    let _serial = serial();
    if !mixed_supported() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, wb, ab, flen) in file_cases() {
        let file = pattern(flen);
        let path = write_file(dir.path(), name, &file);
        let mut a = build(ModePolicy::MixedOnly, &path, 4 * MIB + 5, wb, ab);
        assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
        assert!(a.fallback_reason().is_none());
        check_layout_invariants(&a);
        assert!(!a.needs_weight_materialization());
        assert_eq!(a.weights(), &expected_weights(&file, wb, ab)[..], "{name}");
        assert!(a.weights_mut().is_none());
        // A no-op in mixed mode.
        a.materialize_weights().unwrap();
        // The boundary page is writable: runtime allocations start there.
        let first = (&a).allocate(Layout::new::<u8>()).unwrap();
        assert_eq!(a.offset_of(first.as_ptr().cast()), Some(ab), "{name}");
        // SAFETY: freshly allocated runtime byte.
        unsafe { first.as_ptr().cast::<u8>().write(9) };
        assert_eq!(a.weights(), &expected_weights(&file, wb, ab)[..], "{name}");
        check_prefix(&a, &file, name);
        exercise_runtime(&a);
    }
}

/// Runs its body, [`child_mixed_mode_within_an_address_space_limit`], in a
/// child process: `RLIMIT_AS` binds every thread of a process.
#[test]
fn mixed_mode_needs_no_address_space_beyond_its_mapping() {
    let _serial = serial();
    // AddressSanitizer reserves its shadow memory and maps more as it runs.
    if !mixed_supported() || under_asan() {
        return;
    }
    // Asserts that the child ran the test and passed.
    common::run_child("child_mixed_mode_within_an_address_space_limit", &[]);
}

#[test]
#[ignore = "run by mixed_mode_needs_no_address_space_beyond_its_mapping in a child process"]
fn child_mixed_mode_within_an_address_space_limit() {
    // 128 MiB of weights and 128 MiB of runtime region, with room in the
    // address space for the arena's mapping and 64 MiB more: neither part
    // may be mapped twice while the arena is built.
    let (weights, total) = (128 * MIB, 256 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let file = pattern(weights);
    let path = write_file(dir.path(), "weights", &file);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmSize in /proc/self/status");
    let limit = vm_kib * 1024 + (total + 64 * MIB) as u64;
    let rlimit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain struct for the process's own soft limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlimit) }, 0);
    let a = build(ModePolicy::MixedOnly, &path, total, 0, weights);
    assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
    assert_eq!(a.weights(), &file[..]);
    exercise_runtime(&a);
}

#[test]
fn undersized_and_bad_files_are_typed_errors_in_both_modes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let short = write_file(dir.path(), "short", &pattern(2 * PAGE));
    for policy in [
        ModePolicy::AnonOnly,
        ModePolicy::MixedOnly,
        ModePolicy::Auto,
    ] {
        for ab in [2 * PAGE + 1, 3 * PAGE] {
            let err = BumpArena::builder(4 * MIB)
                .weights_file(&short)
                .activations_base(ab)
                .policy(policy)
                .build()
                .unwrap_err();
            match &err {
                ArenaError::WeightsFileTooSmall {
                    file_size,
                    activations_base,
                    ..
                } => {
                    assert_eq!((*file_size, *activations_base), (2 * PAGE as u64, ab));
                }
                e => panic!("{e:?}"),
            }
            let msg = err.to_string();
            assert!(
                msg.contains(&ab.to_string()) && msg.contains("8192"),
                "{msg}"
            );
        }
        let missing = dir.path().join("missing");
        let err = BumpArena::new(Some(&missing), MIB, 0, 100).unwrap_err();
        assert!(matches!(err, ArenaError::OpenWeights { .. }), "{err:?}");
        assert!(err.to_string().contains("missing"));
        let err = BumpArena::builder(MIB)
            .weights_file(dir.path())
            .activations_base(100)
            .policy(policy)
            .build()
            .unwrap_err();
        assert!(matches!(err, ArenaError::NotRegularFile { .. }), "{err:?}");
    }
    // Mixed mode needs a file.
    let err = BumpArena::builder(MIB)
        .policy(ModePolicy::MixedOnly)
        .build()
        .unwrap_err();
    assert!(matches!(err, ArenaError::NoWeightsFile), "{err:?}");
}

#[test]
fn bad_layouts_and_sizes_are_typed_errors() {
    let _serial = serial();
    let cases = [(0, 0, 0), (10, 5, 100), (0, 101, 100), (7, 7, 6)];
    for (wb, ab, total) in cases {
        let err = BumpArena::builder(total)
            .weights_base(wb)
            .activations_base(ab)
            .build()
            .unwrap_err();
        if total == 0 {
            assert!(matches!(err, ArenaError::ZeroSize));
        } else {
            match err {
                ArenaError::BadLayout {
                    weights_base,
                    activations_base,
                    total_size,
                } => assert_eq!(
                    (weights_base, activations_base, total_size),
                    (wb, ab, total)
                ),
                e => panic!("{e:?}"),
            }
        }
    }
    let err = BumpArena::new(None, 100, 10, 5).unwrap_err();
    assert!(err.to_string().contains("weights_base 10"), "{err}");
    for total in [usize::MAX, usize::MAX - MIB, isize::MAX as usize] {
        let err = BumpArena::builder(total)
            .policy(ModePolicy::AnonOnly)
            .build()
            .unwrap_err();
        assert!(
            matches!(
                err,
                ArenaError::TooLarge { total_size } if total_size == total
            ),
            "{total}: {err:?}"
        );
        assert!(err.to_string().contains(&total.to_string()));
    }
    // Mappable in arithmetic but not by the kernel: an Anon error naming the size.
    let huge = 1usize << 62;
    let err = BumpArena::builder(huge)
        .policy(ModePolicy::AnonOnly)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ArenaError::Anon { total_size, .. } if total_size == huge),
        "{err:?}"
    );
}

#[test]
fn no_weights_region_needs_no_file_and_no_materialization() {
    let _serial = serial();
    let mut a = BumpArena::new(None, 3 * MIB, 0, 0).unwrap();
    assert_eq!(a.mode(), ArenaMode::Anon);
    assert!(!a.needs_weight_materialization());
    assert!(a.weights().is_empty());
    assert_eq!(a.remaining(), 3 * MIB);
    a.materialize_weights().unwrap();
    check_layout_invariants(&a);
    assert_eq!(a.as_ptr() as usize % (2 * MIB), 0);
    // With a weights region but no file, materialization names the problem.
    let mut b = BumpArena::new(None, 3 * MIB, 0, 100).unwrap();
    assert!(b.needs_weight_materialization());
    assert!(matches!(
        b.materialize_weights(),
        Err(ArenaError::NoWeightsFile)
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = pattern(100);
    let path = write_file(dir.path(), "w", &file);
    b.materialize_weights_from(&path).unwrap();
    assert_eq!(b.weights(), &file[..]);
    assert!(!b.needs_weight_materialization());
}

#[test]
fn drop_unmaps_exactly_the_mapping_in_both_modes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "w", &pattern(3 * PAGE + 5));
    let mut policies = vec![ModePolicy::AnonOnly];
    if mixed_supported() {
        policies.push(ModePolicy::MixedOnly);
    }
    for policy in policies {
        let a = build(policy, &path, 5 * MIB, 0, 3 * PAGE + 5);
        let (p, len) = a.mapping();
        assert!(!mappings_overlapping(p as usize, len).is_empty());
        // "Double drop": the arena moves through an Option taken twice.
        let mut slot = Some(a);
        drop(slot.take());
        drop(slot.take());
        assert_unmapped(p as usize, len);
    }
}

#[cfg(target_os = "linux")]
fn maps_line_perms(addr: usize) -> (String, String) {
    let line = mappings_overlapping(addr, 1).pop().expect("mapped");
    let mut parts = line.split_whitespace();
    let _range = parts.next();
    let perms = parts.next().unwrap().to_owned();
    let path = line.split_whitespace().nth(5).unwrap_or("").to_owned();
    (perms, path)
}

#[cfg(target_os = "linux")]
#[test]
fn mixed_mode_protections_in_proc_maps() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ab = 6 * PAGE + 123;
    let path = write_file(dir.path(), "weights.bump", &pattern(ab));
    let a = build(ModePolicy::MixedOnly, &path, 4 * MIB, 2 * PAGE, ab);
    let base = a.as_ptr() as usize;
    let name = path.file_name().unwrap().to_str().unwrap().to_owned();
    // Whole weights pages: private read-only file mapping.
    for page in 2..6 {
        let (perms, p) = maps_line_perms(base + page * PAGE);
        assert_eq!(perms, "r--p", "page {page}");
        assert!(p.ends_with(&name), "page {page}: {p}");
    }
    // Prefix below the weights and the boundary page: private anonymous RW.
    for addr in [base, base + PAGE, base + 6 * PAGE, base + 3 * MIB] {
        let (perms, p) = maps_line_perms(addr);
        assert_eq!(perms, "rw-p", "{:#x}", addr - base);
        assert!(!p.ends_with(&name), "{:#x}: {p}", addr - base);
    }
    // The reservation's slack before base stays inaccessible.
    let (mp, _) = a.mapping();
    if (mp as usize) < base {
        assert_eq!(maps_line_perms(mp as usize).0, "---p");
    }
    // `weights_base` inside a page: that page is the prefix's (anonymous,
    // read-write), the next whole pages the file's.
    let b = build(ModePolicy::MixedOnly, &path, 4 * MIB, PAGE + 152, ab);
    let base = b.as_ptr() as usize;
    let (perms, p) = maps_line_perms(base + PAGE);
    assert_eq!(perms, "rw-p");
    assert!(!p.ends_with(&name), "{p}");
    for page in 2..6 {
        let (perms, p) = maps_line_perms(base + page * PAGE);
        assert_eq!(perms, "r--p", "page {page}");
        assert!(p.ends_with(&name), "page {page}: {p}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn mixed_mode_leaves_file_bytes_and_mtime_unchanged() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ab = 5 * PAGE + 77;
    let file = pattern(ab + 10);
    let path = write_file(dir.path(), "w", &file);
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    {
        let mut a = build(ModePolicy::MixedOnly, &path, 4 * MIB, 0, ab);
        let local = a.local();
        let mut v: AVec<u8, _> = AVec::new_in(&local);
        v.resize(MIB, 0xAA);
        drop(v);
        drop(local);
        a.reset();
        assert_eq!(a.weights(), &file[..ab]);
    }
    assert_eq!(std::fs::read(&path).unwrap(), file);
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
}

#[cfg(target_os = "linux")]
#[test]
fn mixed_mode_weights_write_dies_with_sigsegv_in_child() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "w", &pattern(4 * PAGE + 9));
    let p = path.to_str().unwrap();
    let out = run_child("child_write_weights", &[("ARENA_CHILD_FILE", p)]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "child: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("about to write"));
    // The boundary page is private anonymous: writing it is fine.
    let out = run_child(
        "child_write_weights",
        &[("ARENA_CHILD_FILE", p), ("ARENA_CHILD_BOUNDARY", "1")],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(&path).unwrap(), pattern(4 * PAGE + 9));
}

#[test]
#[ignore = "run by mixed_mode_weights_write_dies_with_sigsegv_in_child"]
fn child_write_weights() {
    let _serial = serial();
    let Ok(p) = std::env::var("ARENA_CHILD_FILE") else {
        return;
    };
    let a = build(
        ModePolicy::MixedOnly,
        Path::new(&p),
        4 * MIB,
        0,
        4 * PAGE + 9,
    );
    let off = if std::env::var_os("ARENA_CHILD_BOUNDARY").is_some() {
        4 * PAGE + 3
    } else {
        PAGE + 3
    };
    let ptr = a.ptr_at(off).unwrap();
    println!("about to write");
    std::io::stdout().flush().unwrap();
    // SAFETY: deliberately writes into the arena; for the read-only pages
    // this must raise SIGSEGV, which the parent checks.
    unsafe { ptr.as_ptr().write_volatile(1) };
    assert_eq!(a.weights()[off], 1);
}

#[cfg(target_os = "linux")]
#[test]
fn rlimit_data_forces_fallback_to_mixed_in_child() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    // 256 MiB of weights (sparse: reads as zero) with a marker.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(256 * MIB as u64).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"marker", 100 * MIB as u64).unwrap();
    drop(f);
    let out = run_child(
        "child_rlimit_data",
        &[("ARENA_CHILD_FILE", path.to_str().unwrap())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("CHILD OK mixed"), "{stdout}");
}

#[test]
#[ignore = "run by rlimit_data_forces_fallback_to_mixed_in_child"]
fn child_rlimit_data() {
    let _serial = serial();
    let Ok(p) = std::env::var("ARENA_CHILD_FILE") else {
        return;
    };
    // Data mappings in use now (VmData), plus room for the 16 MiB runtime
    // region and slack, but far below the 272 MiB total.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vmdata_kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmData:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let limit = (vmdata_kb * KIB + 64 * MIB) as libc::rlim_t;
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: plain setrlimit on this (child) process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_DATA, &rl) }, 0);
    let total = 256 * MIB + 16 * MIB;
    let a = BumpArena::new(Some(Path::new(&p)), total, 0, 256 * MIB).unwrap();
    assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
    match a.fallback_reason() {
        Some(FallbackReason::AnonFailed(ArenaError::Anon { total_size, .. })) => {
            assert_eq!(*total_size, total)
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(&a.weights()[100 * MIB..100 * MIB + 6], b"marker");
    let mut v: AVec<u8, _> = AVec::new_in(&a);
    v.resize(8 * MIB, 1);
    println!("CHILD OK mixed ({})", a.fallback_reason().unwrap());
}

#[test]
fn env_vars_steer_auto_mode_in_child() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "w", &pattern(2 * PAGE + 1));
    let p = path.to_str().unwrap();
    let mut cases = vec![
        // (FORCE, DISABLE, with file, expected)
        ("", "", "1", "anon"),
        ("0", "", "1", "anon"),
        ("false", "", "1", "anon"),
        ("NO", "", "1", "anon"),
        ("1", "1", "1", "disabled"),
        ("yes", "", "", "nofile"),
    ];
    if mixed_supported() {
        cases.push(("1", "", "1", "forced"));
        cases.push(("off", "", "1", "forced")); // C-Kernel-Engine treats "off" as set
        cases.push(("TRUE", "no", "1", "forced"));
    }
    for (force, disable, with_file, expect) in cases {
        let out = run_child(
            "child_env_mode",
            &[
                ("ARENA_CHILD_FILE", if with_file == "1" { p } else { "" }),
                ("ARENA_CHILD_EXPECT", expect),
                ("CK_BUMP_FORCE_MIXED", force),
                ("CK_BUMP_DISABLE_MIXED", disable),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CHILD OK"),
            "{force:?}/{disable:?} -> {expect}: {out:?}"
        );
    }
}

#[test]
#[ignore = "run by env_vars_steer_auto_mode_in_child"]
fn child_env_mode() {
    let _serial = serial();
    let Ok(expect) = std::env::var("ARENA_CHILD_EXPECT") else {
        return;
    };
    let file = std::env::var("ARENA_CHILD_FILE").unwrap();
    let path = (!file.is_empty()).then(|| PathBuf::from(file));
    let r = BumpArena::new(path.as_deref(), 4 * MIB, 0, 2 * PAGE + 1);
    match (expect.as_str(), r) {
        ("anon", Ok(a)) => assert_eq!(a.mode(), ArenaMode::Anon),
        ("forced", Ok(a)) => {
            assert_eq!(a.mode(), ArenaMode::MixedFileBacked);
            assert!(matches!(
                a.fallback_reason(),
                Some(FallbackReason::ForcedByEnv)
            ));
        }
        ("disabled", Err(ArenaError::ModesDisabledByEnv)) => {}
        ("nofile", Err(ArenaError::ForcedMixedWithoutFile)) => {}
        (e, r) => panic!("expected {e}, got {r:?}"),
    }
    // An explicit policy ignores the environment.
    let a = BumpArena::builder(4 * MIB)
        .policy(ModePolicy::AnonOnly)
        .build()
        .unwrap();
    assert_eq!(a.mode(), ArenaMode::Anon);
    println!("CHILD OK");
}

#[test]
fn materialize_detects_changed_file_and_can_retry() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ab = 3 * PAGE + 50;
    let file = pattern(ab);
    let path = write_file(dir.path(), "w", &file);
    let mut a = build(ModePolicy::AnonOnly, &path, 4 * MIB, 0, ab);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"more")
        .unwrap();
    match a.materialize_weights() {
        Err(ArenaError::WeightsFileChanged { expected, found }) => {
            assert_eq!((expected, found), (ab as u64, ab as u64 + 4))
        }
        r => panic!("{r:?}"),
    }
    assert!(a.needs_weight_materialization());
    // Still usable.
    exercise_runtime(&a);
    // Same size again: the retry succeeds.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(ab as u64)
        .unwrap();
    a.materialize_weights().unwrap();
    assert_eq!(a.weights(), &file[..]);
}

#[test]
fn materialize_big_region_on_several_threads() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    let len = 80 * MIB + 12345;
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(len as u64).unwrap();
    use std::os::unix::fs::FileExt;
    let marks = [0, 16 * MIB - 3, 40 * MIB, len - 8];
    for &m in &marks {
        f.write_all_at(&(m as u64).to_le_bytes(), m as u64).unwrap();
    }
    drop(f);
    let file = std::fs::read(&path).unwrap();
    let mut a = build(ModePolicy::AnonOnly, &path, len + 4 * MIB, 0, len);
    let mut last = 0;
    let mut calls = 0;
    a.materialize_weights_with(|d, t| {
        assert!(d >= last && t == len as u64);
        last = d;
        calls += 1;
    })
    .unwrap();
    assert_eq!(last, len as u64);
    assert!(calls >= 2);
    assert!(a.weights() == &file[..]);
}

#[test]
fn allocator_api_collections_work() {
    let _serial = serial();
    let arena = BumpArena::new(None, 16 * MIB, 0, 0).unwrap();
    let mut v: AVec<u32, _> = AVec::new_in(&arena);
    v.extend(0..100_000);
    assert_eq!(v[99_999], 99_999);
    let b = ABox::new_in([3u64; 16], &arena);
    assert_eq!(b.iter().sum::<u64>(), 48);
    let mut m = hashbrown::HashMap::new_in(&arena);
    for i in 0..10_000u32 {
        m.insert(i, i * 2);
    }
    assert_eq!(m[&777], 1554);
    let local = arena.local();
    let mut lm = hashbrown::HashMap::new_in(&local);
    for i in 0..1000u64 {
        lm.insert(i, [i; 4]);
    }
    assert_eq!(lm[&5][3], 5);
    let mut lv: AVec<u16, _> = AVec::new_in(&local);
    lv.extend(0..5000u16);
    assert_eq!(lv[4999], 4999);
    for p in [
        v.as_ptr() as *const u8,
        b.as_ptr().cast(),
        lv.as_ptr().cast(),
    ] {
        assert!(arena.offset_of(p).is_some());
    }
}

#[test]
fn local_arena_gives_back_its_tail_and_reuses_freed_last_block() {
    let _serial = serial();
    let mut arena = BumpArena::new(None, 4 * MIB, 0, 0).unwrap();
    {
        let local = arena.local();
        let l = Layout::from_size_align(10, 1).unwrap();
        let p = (&local).allocate(l).unwrap();
        assert!(arena.used() >= 16 * KIB, "a chunk was taken");
        // SAFETY: most recent block.
        unsafe { (&local).deallocate(p.cast(), l) };
        let q = (&local).allocate(l).unwrap();
        assert_eq!(p.cast::<u8>(), q.cast::<u8>());
    }
    assert_eq!(arena.used(), 10, "unused tail returned on drop");
    arena.reset();
    assert_eq!(arena.used(), 0);
    assert!(arena.high_water_mark() >= 16 * KIB);
}

#[test]
fn grow_and_shrink_in_place_for_the_last_block() {
    let _serial = serial();
    let arena = BumpArena::new(None, 4 * MIB, 0, 0).unwrap();
    let a = &arena;
    let l = |s| Layout::from_size_align(s, 8).unwrap();
    let p = a.allocate(l(64)).unwrap().cast::<u8>();
    // SAFETY: fresh 64-byte block.
    unsafe { p.as_ptr().write_bytes(7, 64) };
    // SAFETY: `p` is live with layout `l(64)`; 4096 is not smaller.
    let g = unsafe { a.grow(p, l(64), l(4096)) }.unwrap();
    assert_eq!(g.cast::<u8>(), p);
    assert_eq!(arena.used(), 4096);
    // SAFETY: the grow kept the block at `p` (asserted), now with layout
    // `l(4096)`; 100 is not larger.
    let s = unsafe { a.shrink(p, l(4096), l(100)) }.unwrap();
    assert_eq!(s.cast::<u8>(), p);
    assert_eq!(arena.used(), 100);
    let other = a.allocate(l(8)).unwrap().cast::<u8>();
    // No longer the last block: growing moves and copies.
    // SAFETY: `p` is live with layout `l(100)` after the shrink.
    let moved = unsafe { a.grow(p, l(100), l(200)) }.unwrap().cast::<u8>();
    assert_ne!(moved, p);
    // SAFETY: `moved` is a live block of 200 bytes; the arena's memory is a
    // zero-filled mapping, so every byte is initialised.
    assert!(unsafe { std::slice::from_raw_parts(moved.as_ptr(), 64) }
        .iter()
        .all(|&b| b == 7));
    // SAFETY: `moved` is live with layout `l(200)`; 300 is not smaller.
    let z = unsafe { a.grow_zeroed(moved, l(200), l(300)) }.unwrap();
    assert!(
        // SAFETY: `z` is a live block of at least 300 bytes in the arena's
        // zero-filled mapping.
        unsafe { std::slice::from_raw_parts(z.cast::<u8>().as_ptr(), 300) }[200..]
            .iter()
            .all(|&b| b == 0)
    );
    assert!(arena.offset_of(other.as_ptr()).is_some());
}

#[test]
fn exhaustion_never_passes_total_size() {
    let _serial = serial();
    let total = 3 * MIB + 17;
    let ab = 1000;
    let arena = BumpArena::new(None, total, 0, ab).unwrap();
    let mut blocks = Vec::new();
    let mut sizes = [1usize, 4095, 65536, 7, 300_000].iter().cycle();
    let mut failures = 0;
    while failures < 20 {
        let s = *sizes.next().unwrap();
        match (&arena).allocate(Layout::from_size_align(s, 16).unwrap()) {
            Ok(p) => blocks.push((arena.offset_of(p.as_ptr().cast()).unwrap(), s)),
            Err(_) => failures += 1,
        }
    }
    for &(off, s) in &blocks {
        assert!(off >= ab && off + s <= total, "{off}+{s}");
    }
    assert!(arena.remaining() < 300_000);
    let local = arena.local();
    assert!((&local)
        .allocate(Layout::from_size_align(arena.remaining() + 1, 1).unwrap())
        .is_err());
}

#[test]
fn checkpoints_rewind_and_reject_stale_or_foreign() {
    let _serial = serial();
    let mut arena = BumpArena::new(None, 4 * MIB, 0, 0).unwrap();
    let other = BumpArena::new(None, 4 * MIB, 0, 0).unwrap();
    (&arena).allocate(Layout::new::<[u8; 100]>()).unwrap();
    let cp = arena.checkpoint();
    (&arena).allocate(Layout::new::<[u8; 5000]>()).unwrap();
    let later = arena.checkpoint();
    arena.rewind_to(cp).unwrap();
    assert_eq!(arena.used(), 100);
    match arena.rewind_to(later) {
        Err(ArenaError::BadCheckpoint {
            checkpoint_used,
            used,
            same_arena: true,
        }) => assert_eq!((checkpoint_used, used), (5100, 100)),
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        arena.rewind_to(other.checkpoint()),
        Err(ArenaError::BadCheckpoint {
            same_arena: false,
            ..
        })
    ));
    assert_eq!(arena.used(), 100);
    assert_eq!(arena.high_water_mark(), 5100);
}

#[test]
fn release_on_reset_zeroes_runtime_pages() {
    let _serial = serial();
    for release in [false, true] {
        let mut arena = BumpArena::builder(6 * MIB)
            .release_on_reset(release)
            .build()
            .unwrap();
        let p = (&arena)
            .allocate(Layout::from_size_align(3 * MIB, 64).unwrap())
            .unwrap()
            .cast::<u8>();
        // SAFETY: fresh block of 3 MiB.
        unsafe { p.as_ptr().write_bytes(0x5a, 3 * MIB) };
        let before = arena.coverage().unwrap().runtime.mapped_bytes;
        assert!(before >= 3 * MIB as u64);
        arena.reset();
        let q = (&arena)
            .allocate(Layout::from_size_align(3 * MIB, 64).unwrap())
            .unwrap()
            .cast::<u8>();
        assert_eq!(p, q);
        // SAFETY: the same range, allocated again.
        let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), 3 * MIB) };
        if release {
            assert!(s.iter().all(|&b| b == 0));
        } else {
            assert!(s.iter().all(|&b| b == 0x5a));
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn dont_dump_marks_the_weights_pages() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ab = 8 * PAGE;
    let path = write_file(dir.path(), "w", &pattern(ab));
    let a = BumpArena::builder(4 * MIB)
        .weights_file(&path)
        .activations_base(ab)
        .policy(ModePolicy::AnonOnly)
        .dont_dump(true)
        .build()
        .unwrap();
    let base = a.as_ptr() as usize;
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_range = false;
    let mut found = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((s, e)) = range.split_once('-') {
                if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16))
                {
                    in_range = s <= base && base < e;
                    continue;
                }
            }
        }
        if in_range && line.starts_with("VmFlags:") {
            assert!(line.contains(" dd"), "{line}");
            found = true;
        }
    }
    assert!(found);
}

#[test]
fn ptr_at_and_offset_of_round_trip() {
    let _serial = serial();
    let a = BumpArena::new(None, MIB, 0, 0).unwrap();
    for off in [0, 1, 4095, MIB - 1] {
        let p = a.ptr_at(off).unwrap();
        assert_eq!(a.offset_of(p.as_ptr()), Some(off));
    }
    assert!(a.ptr_at(MIB).is_some());
    assert!(a.ptr_at(MIB + 1).is_none());
    assert_eq!(a.offset_of(a.ptr_at(MIB).unwrap().as_ptr()), None);
    assert_eq!(a.offset_of(std::ptr::null()), None);
}

#[test]
fn coverage_reports_both_regions() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ab = 2 * MIB;
    let path = write_file(dir.path(), "w", &pattern(ab));
    let mut a = build(ModePolicy::AnonOnly, &path, 8 * MIB, 0, ab);
    a.materialize_weights().unwrap();
    let mut v: AVec<u8, _> = AVec::new_in(&a);
    v.resize(4 * MIB, 1);
    let c = a.coverage().unwrap();
    assert!(c.weights.mapped_bytes >= (ab as u64) / 2, "{c:?}");
    assert!(c.runtime.mapped_bytes >= 4 * MIB as u64, "{c:?}");
    assert!(c.weights.mapped_bytes <= ab as u64);
    if thp_available() && a.backing() == Backing::TransparentHuge {
        eprintln!("runtime coverage: {}", c.runtime);
    }
}

/// Threads allocate from `&arena` and from their own `LocalArena`, fill each
/// block with a thread/sequence pattern, and check every block at the end: no
/// overlap, no lost block, contents intact.
#[test]
fn multithreaded_stress_has_no_overlaps() {
    let _serial = serial();
    let arena = BumpArena::new(None, 256 * MIB, 0, 4096).unwrap();
    let threads = 8;
    let per_thread = 20_000;
    let all: Vec<Vec<(usize, usize, u8)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let arena = &arena;
                s.spawn(move || {
                    let local = arena.local();
                    let mut mine = Vec::with_capacity(per_thread);
                    let mut x = 0x9e3779b97f4a7c15u64 ^ t as u64;
                    for i in 0..per_thread {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let size = (x % 600) as usize + 1;
                        let align = 1usize << ((x >> 60) % 7);
                        let layout = Layout::from_size_align(size, align).unwrap();
                        let p = if i % 2 == 0 {
                            arena.allocate(layout)
                        } else {
                            (&local).allocate(layout)
                        }
                        .unwrap()
                        .cast::<u8>();
                        assert_eq!(p.as_ptr() as usize % align, 0);
                        let tag = (t * 31 + i) as u8;
                        // SAFETY: fresh block of `size` bytes.
                        unsafe { p.as_ptr().write_bytes(tag, size) };
                        mine.push((p.as_ptr() as usize, size, tag));
                    }
                    // Keep the local handle alive until all blocks are recorded.
                    drop(local);
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut blocks: Vec<_> = all.into_iter().flatten().collect();
    assert_eq!(blocks.len(), threads * per_thread);
    blocks.sort_unstable();
    let start = arena.as_ptr() as usize + 4096;
    let end = arena.as_ptr() as usize + arena.total_size();
    for w in blocks.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:x?}", w);
    }
    for &(p, size, tag) in &blocks {
        assert!(p >= start && p + size <= end);
        // SAFETY: the block is still allocated (nothing was reset).
        let s = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
        assert!(s.iter().all(|&b| b == tag));
    }
    assert!(arena.used() >= blocks.iter().map(|b| b.1).sum::<usize>());
}

#[test]
fn arena_is_send_and_sync_local_is_send() {
    let _serial = serial();
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<BumpArena>();
    send::<LocalArena<'static>>();
}

// A `LocalArena` bumps through `Cell`s: sharing one between threads must not
// compile.
static_assertions::assert_not_impl_any!(LocalArena<'static>: Sync);

#[cfg(feature = "weights")]
#[test]
fn writer_reader_arena_round_trip_for_both_versions() {
    let _serial = serial();
    use ckalloc::weights::{
        CheckOptions, CheckedManifest, Dtype, Manifest, Version, WeightsFile, WeightsWriter,
    };
    for version in [Version::V4, Version::V5] {
        let dir = tempfile::tempdir().unwrap();
        let a: Vec<u8> = (0..4000u32).flat_map(|i| i.to_le_bytes()).collect();
        let b: Vec<u8> = (0..333u16).flat_map(|i| i.to_le_bytes()).collect();
        let mut w = WeightsWriter::new(version);
        w.add_tensor("tok_embeddings", Dtype::F32, &a[..]).unwrap();
        w.add_tensor("norm", Dtype::BF16, &b[..]).unwrap();
        let report = w.write_dir(dir.path()).unwrap();
        let file = WeightsFile::open(&report.weights_path).unwrap();
        file.verify_checksum().unwrap();
        let manifest = Manifest::load_sidecars(dir.path()).unwrap();
        // The arena takes only a manifest checked against its file.
        let checked = file
            .check_manifest(manifest.clone(), CheckOptions::new())
            .unwrap();
        let (wb, ab) = (report.weights_base as usize, report.data_end as usize);
        assert_eq!(checked.weights_region(), (wb as u64, ab as u64));
        let mut policies = vec![ModePolicy::AnonOnly];
        if mixed_supported() {
            policies.push(ModePolicy::MixedOnly);
        }
        for policy in policies {
            let mut arena = BumpArena::builder(ab + 4 * MIB)
                .weights_file(&report.weights_path)
                .weights_base(wb)
                .activations_base(ab)
                .manifest(checked.clone())
                .policy(policy)
                .build()
                .unwrap();
            assert_eq!(
                arena.manifest().map(CheckedManifest::manifest),
                Some(&manifest)
            );
            if policy == ModePolicy::AnonOnly {
                assert_eq!(arena.tensor("norm"), None, "not materialized yet");
                arena.materialize_weights().unwrap();
            }
            assert_eq!(arena.tensor("tok_embeddings"), Some(&a[..]), "{version:?}");
            assert_eq!(arena.tensor("norm"), Some(&b[..]));
            assert_eq!(arena.tensor("missing"), None);
            // Arena offset == file offset, as generated code addresses it.
            let e = manifest.get("norm").unwrap();
            let p = arena.ptr_at(e.file_offset as usize).unwrap();
            // SAFETY: inside the weights region, readable in both modes.
            let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), b.len()) };
            assert_eq!(s, &b[..]);
        }
        // A manifest outside the weights region is rejected before mapping.
        let last_end = manifest.iter().filter_map(|e| e.end()).max().unwrap() as usize;
        let err = BumpArena::builder(ab + 4 * MIB)
            .weights_file(&report.weights_path)
            .weights_base(wb)
            .activations_base(last_end - 1)
            .manifest(checked.clone())
            .build()
            .unwrap_err();
        assert!(matches!(err, ArenaError::Manifest { .. }), "{err:?}");
        // A manifest checked against another file (here a copy: the same
        // bytes, another inode) is refused.
        let copy = dir.path().join("copy.bump");
        std::fs::copy(&report.weights_path, &copy).unwrap();
        let on_copy = || {
            BumpArena::builder(ab + 4 * MIB)
                .weights_file(&copy)
                .weights_base(wb)
                .activations_base(ab)
                .policy(ModePolicy::AnonOnly)
        };
        let err = on_copy().manifest(checked.clone()).build().unwrap_err();
        assert!(
            matches!(&err, ArenaError::ManifestOfAnotherFile { manifest_file, weights_file }
                if manifest_file.as_deref() == Some(report.weights_path.as_path())
                    && *weights_file == copy),
            "{err:?}"
        );
        // Checked against the copy, it is the copy's manifest.
        let checked_copy = WeightsFile::open(&copy)
            .unwrap()
            .check_manifest(manifest.clone(), CheckOptions::new())
            .unwrap();
        let mut arena = on_copy().manifest(checked_copy).build().unwrap();
        arena.materialize_weights().unwrap();
        assert_eq!(arena.tensor("norm"), Some(&b[..]));
        // A manifest checked against bytes in memory is tied to the file by
        // its length and header checksum: the same bytes are accepted, a
        // file whose checksum differs is refused.
        let bytes = std::fs::read(&copy).unwrap();
        let in_memory = || {
            WeightsFile::from_vec(bytes.clone())
                .unwrap()
                .check_manifest(manifest.clone(), CheckOptions::new())
                .unwrap()
        };
        on_copy().manifest(in_memory()).build().unwrap();
        let mut other = bytes.clone();
        let sum = WeightsFile::from_vec(bytes.clone())
            .unwrap()
            .container()
            .offsets()
            .checksum;
        other[sum as usize] ^= 1;
        std::fs::write(&copy, &other).unwrap();
        let err = on_copy().manifest(in_memory()).build().unwrap_err();
        assert!(
            matches!(
                &err,
                ArenaError::ManifestOfAnotherFile {
                    manifest_file: None,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

/// The arena holds every tensor at its file offset in both modes (mixed
/// maps the file in place, anon copies it verbatim), so `check_manifest`
/// refuses an entry whose runtime offset differs (rule 6) and no arena can
/// be given one, whatever its mode.
#[cfg(feature = "weights")]
#[test]
fn runtime_offsets_that_differ_are_refused_for_every_mode() {
    let _serial = serial();
    use ckalloc::weights::{
        CheckOptions, Dtype, Manifest, Version, WeightsError, WeightsFile, WeightsWriter,
    };
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64);
    let mut w = WeightsWriter::new(Version::V4);
    w.add_tensor("t", Dtype::F32, &data[..]).unwrap();
    let report = w.write_dir(dir.path()).unwrap();
    let file = WeightsFile::open(&report.weights_path).unwrap();
    let mut e = report.manifest.get("t").unwrap().clone();
    e.runtime_offset = 4096;
    let m = Manifest::from_entries(vec![e.clone()]).unwrap();
    let err = file.check_manifest(m, CheckOptions::new()).unwrap_err();
    assert!(
        matches!(&err, WeightsError::RuntimeOffsetMismatch { name, file_offset, runtime_offset: 4096 }
            if name == "t" && *file_offset == e.file_offset),
        "{err}"
    );
    assert!(err.to_string().contains("runtime offset"), "{err}");
    // The same entry at runtime_offset == file_offset: both modes take it.
    e.runtime_offset = e.file_offset;
    let checked = file
        .check_manifest(
            Manifest::from_entries(vec![e]).unwrap(),
            CheckOptions::new(),
        )
        .unwrap();
    let mut modes = vec![(ModePolicy::AnonOnly, ArenaMode::Anon)];
    if mixed_supported() {
        modes.push((ModePolicy::MixedOnly, ArenaMode::MixedFileBacked));
    }
    for (policy, mode) in modes {
        let mut a = BumpArena::builder(4 * MIB)
            .weights_file(&report.weights_path)
            .weights_base(report.weights_base as usize)
            .activations_base(report.data_end as usize)
            .manifest(checked.clone())
            .policy(policy)
            .build()
            .unwrap();
        assert_eq!(a.mode(), mode);
        if a.needs_weight_materialization() {
            a.materialize_weights().unwrap();
        }
        assert_eq!(a.tensor("t"), Some(&data[..]), "{policy:?}");
    }
}

// ---- per-thread chunks behind `&BumpArena` ---------------------------------

fn offset(arena: &BumpArena, p: std::ptr::NonNull<[u8]>) -> usize {
    arena.offset_of(p.as_ptr().cast::<u8>()).unwrap() - arena.activations_base()
}

const L64: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// One thread packs its blocks exactly across chunk refills (its chunk grows
/// in place), and sees exact `used()` / high-water mark figures.
#[test]
fn one_thread_packs_exactly_across_chunks() {
    let _serial = serial();
    let arena = BumpArena::builder(4 * MIB)
        .activations_base(PAGE)
        .build()
        .unwrap();
    let n = 2000; // 125 KiB: several refills of the 16 KiB-and-doubling chunk
    let mut last = None;
    for i in 0..n {
        let p = (&arena).allocate(L64).unwrap();
        assert_eq!(offset(&arena, p), i * 64, "block {i}");
        last = Some(p);
    }
    assert_eq!(arena.used(), n * 64);
    assert_eq!(arena.remaining(), 4 * MIB - PAGE - n * 64);
    // SAFETY: the most recent block, allocated with L64.
    unsafe { (&arena).deallocate(last.unwrap().cast(), L64) };
    assert_eq!(arena.used(), (n - 1) * 64, "the last block was given back");
    assert_eq!(arena.high_water_mark(), n * 64, "the peak stays");
    let again = (&arena).allocate(L64).unwrap();
    assert_eq!(offset(&arena, again), (n - 1) * 64, "its space is reused");
}

/// Each thread bumps in a chunk of its own: a second thread's first block
/// starts after the first thread's whole chunk, and the first thread keeps
/// bumping in its chunk afterwards.
#[test]
fn threads_get_chunks_of_their_own() {
    let _serial = serial();
    let arena = BumpArena::builder(4 * MIB).build().unwrap();
    let a = (&arena).allocate(L64).unwrap();
    assert_eq!(offset(&arena, a), 0);
    let b = std::thread::scope(|s| {
        s.spawn(|| offset(&arena, (&arena).allocate(L64).unwrap()))
            .join()
            .unwrap()
    });
    assert_eq!(
        b,
        16 * KIB,
        "the other thread starts after this thread's 16 KiB chunk"
    );
    let c = (&arena).allocate(L64).unwrap();
    assert_eq!(
        offset(&arena, c),
        64,
        "this thread goes on in its own chunk"
    );
    // Seen from here, the other thread's chunk counts as used.
    assert_eq!(arena.used(), 32 * KIB);
}

/// `thread_chunks(false)`: every allocation moves the shared pointer, so
/// blocks of different threads are packed exactly.
#[test]
fn thread_chunks_off_packs_all_threads_exactly() {
    let _serial = serial();
    let arena = BumpArena::builder(4 * MIB)
        .thread_chunks(false)
        .build()
        .unwrap();
    assert_eq!(offset(&arena, (&arena).allocate(L64).unwrap()), 0);
    let b = std::thread::scope(|s| {
        s.spawn(|| offset(&arena, (&arena).allocate(L64).unwrap()))
            .join()
            .unwrap()
    });
    assert_eq!(b, 64);
    assert_eq!(offset(&arena, (&arena).allocate(L64).unwrap()), 128);
    assert_eq!(arena.used(), 192);
}

/// A reset retires every thread's chunk: a chunk taken before the reset is
/// never bumped again, even where another thread now owns its range.
#[test]
fn reset_retires_every_threads_chunk() {
    let _serial = serial();
    let mut arena = BumpArena::builder(4 * MIB).build().unwrap();
    assert_eq!(offset(&arena, (&arena).allocate(L64).unwrap()), 0);
    arena.reset();
    // Another thread now takes [0, 16 KiB) as its chunk.
    let other = std::thread::scope(|s| {
        s.spawn(|| {
            let p = (&arena).allocate(L64).unwrap();
            // SAFETY: a fresh 64-byte block.
            unsafe { p.cast::<u8>().as_ptr().write_bytes(0xAB, 64) };
            p.cast::<u8>().as_ptr() as usize
        })
        .join()
        .unwrap()
    });
    assert_eq!(other - arena.as_ptr() as usize, 0);
    // This thread's old chunk ([0, 16 KiB), cursor at 64) must not be used.
    let mine = (&arena).allocate(L64).unwrap();
    assert_eq!(offset(&arena, mine), 16 * KIB);
    // SAFETY: both blocks are live; the other one is 64 bytes.
    let theirs = unsafe { std::slice::from_raw_parts(other as *const u8, 64) };
    assert!(theirs.iter().all(|&b| b == 0xAB));

    // Rewinding retires chunks the same way.
    let cp = arena.checkpoint();
    let before = offset(&arena, (&arena).allocate(L64).unwrap());
    arena.rewind_to(cp).unwrap();
    assert_eq!(offset(&arena, (&arena).allocate(L64).unwrap()), before);
}

/// Two arenas used alternately by one thread each keep their own chunk.
#[test]
fn alternating_arenas_keep_their_chunks() {
    let _serial = serial();
    let a = BumpArena::builder(4 * MIB).build().unwrap();
    let b = BumpArena::builder(4 * MIB).build().unwrap();
    for i in 0..1000 {
        assert_eq!(offset(&a, (&a).allocate(L64).unwrap()), i * 64);
        assert_eq!(offset(&b, (&b).allocate(L64).unwrap()), i * 64);
    }
    assert_eq!((a.used(), b.used()), (64_000, 64_000));
}

// ---- thread-chunk slots of several arenas --------------------------------------

/// Two live arenas must not share a thread-chunk slot just because their
/// ids are equal modulo 8 (here: seven arenas were built and dropped in
/// between). On a shared slot, one thread alternating between them abandons
/// a chunk tail at every slot take-over, and the arena refused requests with
/// 61 % of it free.
#[test]
fn two_live_arenas_one_thread_get_all_their_bytes() {
    let _serial = serial();
    let runtime = 256 * KIB;
    let a = BumpArena::builder(runtime).build().unwrap();
    for _ in 0..7 {
        drop(BumpArena::builder(runtime).build().unwrap());
    }
    let b = BumpArena::builder(runtime).build().unwrap();
    let l = Layout::from_size_align(16, 16).unwrap();
    let mut live = 0;
    while (&a).allocate(l).is_ok() {
        live += 16;
        (&b).allocate(l).unwrap();
    }
    assert_eq!(live, runtime, "a single thread wastes nothing");
    assert_eq!((a.used(), b.used()), (runtime, runtime));
}

/// Threads that exit keep their chunk's unused tail until `reset()`: each
/// short-lived thread that allocates once costs a whole first chunk
/// (16 KiB). Documented only as "each [thread] holds the unused tail of its
/// chunk"; this pins the cost (and that a reset gets it back).
#[test]
fn exited_threads_keep_their_chunk_tails_until_reset() {
    let _serial = serial();
    let mut arena = BumpArena::builder(MIB).build().unwrap();
    let mut threads = 0;
    loop {
        let ok = std::thread::scope(|s| s.spawn(|| (&arena).allocate(L64).is_ok()).join().unwrap());
        if !ok {
            break;
        }
        threads += 1;
    }
    // 64 bytes live per thread, 16 KiB taken per thread.
    assert_eq!(threads, MIB / (16 * KIB));
    assert_eq!(arena.used(), MIB);
    assert!(
        (&arena).allocate(L64).is_err(),
        "{} bytes live",
        threads * 64
    );
    arena.reset();
    assert_eq!(arena.used(), 0);
    // With thread chunks off the same threads pack exactly.
    let arena = BumpArena::builder(MIB)
        .thread_chunks(false)
        .build()
        .unwrap();
    for _ in 0..threads {
        std::thread::scope(|s| {
            s.spawn(|| assert!((&arena).allocate(L64).is_ok()));
        });
    }
    assert_eq!(arena.used(), threads * 64);
}

/// A long-lived worker keeps a chunk of an arena that is then dropped; a
/// new arena (often at the same address, on the same slot) is used by the
/// same worker: its blocks come from the new arena's own range, packed,
/// and none of them is the stale chunk's memory bumped again.
#[test]
fn worker_chunk_of_a_dropped_arena_is_never_bumped_again() {
    let _serial = serial();
    use std::sync::mpsc;
    let (job_tx, job_rx) = mpsc::channel::<(usize, usize, usize)>();
    let (res_tx, res_rx) = mpsc::channel::<Vec<usize>>();
    let worker = std::thread::spawn(move || {
        // (arena address, runtime start, count): allocate `count` blocks
        // of 64 bytes from the arena at that address.
        for (addr, start, count) in job_rx {
            // SAFETY: the main thread keeps the arena alive until it has
            // the answer.
            let arena = unsafe { &*(addr as *const BumpArena) };
            let offs = (0..count)
                .map(|_| {
                    let p = (&arena).allocate(L64).unwrap();
                    // SAFETY: a fresh 64-byte block.
                    unsafe { p.cast::<u8>().as_ptr().write_bytes(0x5A, 64) };
                    p.cast::<u8>().as_ptr() as usize - start
                })
                .collect();
            res_tx.send(offs).unwrap();
        }
    });
    for round in 0..10 {
        let arena = BumpArena::builder(4 * MIB).build().unwrap();
        let start = arena.as_ptr() as usize;
        let mine = (&arena).allocate(L64).unwrap();
        assert_eq!(offset(&arena, mine), 0);
        job_tx
            .send((&arena as *const BumpArena as usize, start, 300))
            .unwrap();
        let offs = res_rx.recv().unwrap();
        // The worker starts after this thread's first chunk, in the new
        // arena's range, and its blocks are disjoint.
        assert!(
            offs.iter().all(|&o| o >= 16 * KIB && o + 64 <= 4 * MIB),
            "round {round}"
        );
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), offs.len(), "round {round}: a block twice");
        assert_eq!(offset(&arena, (&arena).allocate(L64).unwrap()), 64);
        drop(arena);
    }
    drop(job_tx);
    worker.join().unwrap();
}

/// More arenas than slots, used by several threads at once: every block is
/// disjoint from every other (by content) and inside its own arena.
#[test]
fn more_arenas_than_slots_on_several_threads() {
    let _serial = serial();
    let arenas: Vec<BumpArena> = (0..12)
        .map(|_| BumpArena::builder(2 * MIB).build().unwrap())
        .collect();
    std::thread::scope(|s| {
        for t in 0..3u8 {
            let arenas = &arenas;
            s.spawn(move || {
                let mut blocks = Vec::new();
                for i in 0..3000usize {
                    let k = (i * 7 + t as usize) % arenas.len();
                    let size = 1 + (i * 13 + t as usize) % 200;
                    let l = Layout::from_size_align(size, 8).unwrap();
                    let p = (&arenas[k]).allocate(l).unwrap().cast::<u8>();
                    let tag = (i as u8).wrapping_mul(31) ^ t;
                    // SAFETY: a fresh block of `size` bytes.
                    unsafe { p.as_ptr().write_bytes(tag, size) };
                    assert!(arenas[k].offset_of(p.as_ptr()).is_some());
                    blocks.push((p.as_ptr() as usize, size, tag));
                }
                for (p, size, tag) in blocks {
                    // SAFETY: every block is live.
                    let b = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
                    assert!(b.iter().all(|&x| x == tag));
                }
            });
        }
    });
}
