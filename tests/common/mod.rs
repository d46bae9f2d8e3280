//! Helpers shared by the integration tests. A test binary that needs them
//! includes this module (`mod common;`, or `#[path = "../common/mod.rs"] mod
//! common;` from a binary in a directory of its own) and uses a subset of it.
#![allow(dead_code)]

pub mod caching;

/// The mappings of this process that overlap `start..start+len`, as
/// `/proc/self/maps` lines. Counting lines misses leaks (neighbouring
/// mappings merge), so tests check the exact address range instead.
pub fn mappings_overlapping(start: usize, len: usize) -> Vec<String> {
    let end = start + len;
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            a < end && b > start
        })
        .map(str::to_owned)
        .collect()
}

/// Whether this process runs under AddressSanitizer (x86_64 Linux). ASan
/// reserves its shadow gap, `[0x00008fff7000, 0x02008fff7000)`, as one
/// inaccessible (`---p`) mapping of 2 TiB that nothing ever touches, where
/// a normal process maps nothing. (The shadow itself is no reliable sign:
/// ASan remaps parts of it as it clears shadow for unmapped memory, which
/// splits its mapping.) Under ASan the sanitizer's own allocator maps and
/// splits address space at any time (and may reuse a range ckalloc just
/// unmapped), so `/proc/self/maps` checks for leaked ranges are meaningless
/// there, and its `mlock` interceptor locks nothing; the statistics checks
/// still run.
pub fn under_asan() -> bool {
    static ASAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ASAN.get_or_init(detect_asan)
}

fn detect_asan() -> bool {
    const SHADOW_GAP: usize = 0x0100_0000_0000;
    mappings_overlapping(SHADOW_GAP, 1).iter().any(|l| {
        let mut fields = l.split_whitespace();
        let range = fields.next().unwrap_or("");
        let inaccessible = fields.next() == Some("---p");
        let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
        let a = usize::from_str_radix(a, 16).unwrap_or(0);
        let b = usize::from_str_radix(b, 16).unwrap_or(0);
        inaccessible && b - a >= 1 << 40
    })
}

/// Assert nothing is mapped at `start..start+len` any more (not checked
/// under AddressSanitizer, see [`under_asan`]).
pub fn assert_unmapped(start: usize, len: usize) {
    if under_asan() {
        return;
    }
    let m = mappings_overlapping(start, len);
    assert!(m.is_empty(), "still mapped at {start:#x}+{len:#x}: {m:?}");
}

/// Free 2 MiB hugetlb pages right now.
pub fn free_hugetlb_2m() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Skip (return true, printing why) when fewer than `pages` 2 MiB hugetlb pages are free.
pub fn skip_without_hugetlb(test: &str, pages: u64) -> bool {
    let free = free_hugetlb_2m();
    if free < pages {
        eprintln!(
            "SKIP {test}: needs {pages} free 2 MiB hugetlb pages, {free} free \
             (reserve with `echo 512 > /proc/sys/vm/nr_hugepages`; .ci/run does)"
        );
        true
    } else {
        false
    }
}

/// A THP setting, `/sys/kernel/mm/transparent_hugepage/KNOB` (`enabled`,
/// `defrag`, ...) as the kernel prints it, the selected mode in brackets;
/// empty when it cannot be read.
pub fn thp_setting(knob: &str) -> String {
    std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{knob}"))
        .unwrap_or_default()
}

/// Whether THP can be used (mode is not `never`).
pub fn thp_available() -> bool {
    let mode = thp_setting("enabled");
    !mode.is_empty() && !mode.contains("[never]")
}

/// Touch one byte per 4 KiB page, and the last byte (the buffer need not be
/// page aligned).
pub fn touch(buf: &mut [u8]) {
    for i in (0..buf.len()).step_by(4096) {
        buf[i] = 1;
    }
    if let Some(last) = buf.last_mut() {
        *last = 1;
    }
}

/// Serialise the tests of one binary that map memory: a test that checks a
/// freed range in `/proc/self/maps` fails falsely when a concurrent test maps
/// into that range meanwhile.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One `weights_reader` fuzz seed (format of fuzz/fuzz_targets/weights_reader.rs):
/// u32 LE file length, the file bytes, u32 LE map length, the map text, then
/// the JSON text to the end.
pub fn weights_reader_seed(file: &[u8], map: &str, json: &str) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&(file.len() as u32).to_le_bytes());
    s.extend_from_slice(file);
    s.extend_from_slice(&(map.len() as u32).to_le_bytes());
    s.extend_from_slice(map.as_bytes());
    s.extend_from_slice(json.as_bytes());
    s
}

/// Check that every seed stays under 4 KiB, and write them into
/// fuzz/seeds/weights_reader when `CKALLOC_WRITE_FUZZ_SEEDS` is set.
pub fn write_weights_reader_seeds(seeds: &[(String, Vec<u8>)]) {
    assert!(seeds.iter().all(|(_, s)| s.len() < 4096));
    if std::env::var_os("CKALLOC_WRITE_FUZZ_SEEDS").is_some() {
        let out =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/weights_reader");
        std::fs::create_dir_all(&out).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(out.join(name), bytes).unwrap();
        }
    }
}

/// The little-endian u32 at byte `o` of `b`.
pub fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

/// Allocates every free runtime byte of `arena` and fills it with `byte`.
pub fn fill_runtime(arena: &ckalloc::BumpArena, byte: u8) {
    use allocator_api2::alloc::{Allocator, Layout};
    let n = arena.remaining();
    let b = Allocator::allocate(&arena, Layout::from_size_align(n, 1).unwrap()).unwrap();
    // SAFETY: a fresh block of `n` bytes.
    unsafe { b.cast::<u8>().as_ptr().write_bytes(byte, n) };
}

/// Non-zero bytes of `arena`'s offsets `from..total_size`.
pub fn nonzero_from(arena: &ckalloc::BumpArena, from: usize) -> usize {
    let p = arena.ptr_at(from).unwrap();
    // SAFETY: the range lies inside the arena's mapping, readable in both
    // modes; nothing is allocated from it meanwhile.
    let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), arena.total_size() - from) };
    s.iter().filter(|&&b| b != 0).count()
}

/// Every file in `dir` with its bytes.
pub fn dir_contents(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Runs the ignored test `name` of the current test binary in a child
/// process with `envs` set, and asserts that it ran and passed.
pub fn run_child(name: &str, envs: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{name}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{name} did not run"
    );
}

/// Map one read-only 4 KiB page at `addr` (`MAP_FIXED_NOREPLACE`), so that a
/// block ending there cannot grow in place. `None` when something is mapped
/// there already (which blocks growth as well).
pub fn map_blocker_page(addr: *mut u8) -> Option<*mut libc::c_void> {
    // SAFETY: a fresh anonymous page; NOREPLACE never touches an existing
    // mapping.
    let p = unsafe {
        libc::mmap(
            addr.cast(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then(|| {
        assert_eq!(p.cast::<u8>(), addr, "blocker page placed elsewhere");
        p
    })
}

/// Unmap a page from [`map_blocker_page`].
pub fn unmap_blocker_page(p: *mut libc::c_void) {
    // SAFETY: our page from `map_blocker_page`.
    assert_eq!(unsafe { libc::munmap(p, 4096) }, 0);
}

/// `len` bytes of a pattern that differs with `salt`.
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// A 4 MiB arena over the weights file `path`, weights region `[0, ab)`.
pub fn weights_arena(
    policy: ckalloc::ModePolicy,
    path: &std::path::Path,
    ab: usize,
) -> ckalloc::BumpArena {
    ckalloc::BumpArena::builder(4 << 20)
        .weights_file(path)
        .weights_base(0)
        .activations_base(ab)
        .policy(policy)
        .build()
        .unwrap()
}
