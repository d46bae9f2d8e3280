//! The preload library at a process's limits, in a C program under
//! `LD_PRELOAD` and, for reference, under glibc (`tests/c/preload_limits.c`):
//! the VMAs of 40,000 live blocks, the resident set of short tails, a
//! shrink at `vm.max_map_count`, a block freed locked and read-only, one
//! freed with protected pages, requests under an address-space limit, and
//! the library's own initialised data.

use super::run_c;

/// Run a mode of `preload_limits` with the library or without; its stdout.
fn limits(args: &[&str], preload: bool) -> String {
    limits_env(args, preload, &[])
}

/// [`limits`] with environment variables set.
fn limits_env(args: &[&str], preload: bool, env: &[(&str, &str)]) -> String {
    run_c("preload_limits.c", args, preload, &[], env)
}

/// The number after `label` in `out`.
fn number(out: &str, label: &str) -> u64 {
    super::number(out, label)
}

#[test]
fn forty_thousand_live_blocks_of_2_25_mib_add_few_vmas() {
    let args = ["vmas", "40000", "2359296"];
    let ckalloc = number(&limits(&args, true), "added VMAs: ");
    let glibc = number(&limits(&args, false), "added VMAs: ");
    eprintln!("VMAs added by 40,000 live malloc(9 << 18): ckalloc {ckalloc}, glibc {glibc}");
    assert!(ckalloc <= 1000, "{ckalloc} VMAs");
}

#[test]
fn short_tails_fault_in_no_huge_page() {
    // 200 live blocks of 2.25 MiB, every byte written: within the 256 short
    // tails kept off huge pages, so resident as asked (4 MiB each if the
    // last 2 MiB were a huge page: 800 MiB).
    // THP blocks (hugetlb pages are not in the resident set).
    let args = ["rss", "200", "2359296"];
    let thp = [("CKALLOC_HUGETLB", "0")];
    let ckalloc = number(&limits_env(&args, true, &thp), "added RSS: ");
    let glibc = number(&limits(&args, false), "added RSS: ");
    eprintln!("RSS added by 200 written malloc(9 << 18): ckalloc {ckalloc} MiB, glibc {glibc} MiB");
    assert!(
        ckalloc <= 450 + 32,
        "{ckalloc} MiB resident for 450 MiB asked"
    );
}

#[test]
fn at_the_vma_limit_a_shrink_stays_in_place_and_no_freed_block_stays_mapped() {
    // The program fails (exit 1) if memory stays mapped once everything is
    // freed and trimmed.
    let out = limits(&["map-count"], true);
    assert!(out.contains("ok: shrunk at the VMA limit"), "{out}");
    assert!(out.contains("in place"), "{out}");
    assert!(limits(&["map-count"], false).contains("ok: shrunk"));
}

#[test]
fn a_block_freed_locked_and_read_only_serves_calloc_zeroed_and_writable() {
    let out = limits(&["locked-calloc"], true);
    if out.contains("SKIP") {
        eprintln!("{out}");
        return;
    }
    assert!(out.contains("ok: calloc"), "{out}");
    assert!(out.contains("locked after malloc_trim: 0 kB"), "{out}");
    // The same program under glibc, which unmaps on free.
    assert!(limits(&["locked-calloc"], false).contains("ok: calloc"));
}

#[test]
fn a_block_freed_with_protected_pages_is_writable_once_purged() {
    // THP blocks: a purge (MADV_DONTNEED) is what calloc and malloc_trim do
    // to them (hugetlb blocks are cleared with memset). No background
    // thread: its fault check may send the next block to a span advised
    // otherwise than the freed one's, which the program would then not
    // reuse.
    let thp = [("CKALLOC_HUGETLB", "0"), ("CKALLOC_BACKGROUND_THREAD", "0")];
    let out = limits_env(&["protected-reuse"], true, &thp);
    assert!(out.contains("ok: calloc reused the block"), "{out}");
    assert!(
        out.contains("ok: malloc after malloc_trim reused the block"),
        "{out}"
    );
    // No run under glibc for reference: once its mmap threshold has risen
    // past 6 MiB the second block comes from its heap, which keeps the
    // protection, and the program's malloc after malloc_trim faults there.
}

#[test]
fn under_an_address_space_limit_every_request_glibc_serves_is_served() {
    for preload in [false, true] {
        let out = limits(&["as-promise", "256"], preload);
        assert!(
            out.contains("ok: every request served"),
            "preload {preload}: {out}"
        );
    }
    // Whole 2 MiB pages cost address space: 3 MiB requests take 4 MiB.
    let glibc = number(&limits(&["as-3mib", "2048"], false), "3 MiB blocks: ");
    let ckalloc = number(&limits(&["as-3mib", "2048"], true), "3 MiB blocks: ");
    eprintln!(
        "live malloc(3 MiB) under RLIMIT_AS of VmSize + 2 GiB: ckalloc {ckalloc}, glibc {glibc}"
    );
    assert!(ckalloc * 100 >= glibc * 70, "{ckalloc} against {glibc}");
}

/// The size in bytes of each section named in `names` of a 64-bit
/// little-endian ELF file (`elf(5)`: the section header table at
/// `e_shoff`, names in the section `e_shstrndx`).
fn elf_section_sizes(elf: &[u8], names: &[&str]) -> Vec<Option<u64>> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(
        &elf[..6],
        b"\x7fELF\x02\x01",
        "a 64-bit little-endian ELF file"
    );
    let (shoff, shentsize) = (u64_at(0x28) as usize, u16_at(0x3a));
    let (shnum, shstrndx) = (u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18) as usize;
    let name_of = |i: usize| {
        let start = strtab + u32_at(header(i));
        let end = start + elf[start..].iter().position(|&b| b == 0).unwrap();
        std::str::from_utf8(&elf[start..end]).unwrap().to_owned()
    };
    names
        .iter()
        .map(|n| {
            (0..shnum)
                .find(|&i| name_of(i) == *n)
                .map(|i| u64_at(header(i) + 0x20))
        })
        .collect()
}

#[test]
fn the_engines_tables_take_no_initialised_data_in_the_library() {
    // The engine's tables (tens of MiB) are zero at start: in `.bss`, which
    // takes no room in the file and no memory until touched. One field
    // with a non-zero start value would move all of them into `.data`,
    // read from the file at load.
    let elf = std::fs::read(super::library()).expect("the preload library");
    let sizes = elf_section_sizes(&elf, &[".data", ".bss"]);
    let (data, bss) = (sizes[0].unwrap_or(0), sizes[1].expect("a .bss section"));
    eprintln!("libckalloc_preload.so: .data {data} B, .bss {bss} B");
    assert!(data < 1 << 20, ".data holds {data} bytes");
    assert!(
        bss > 16 << 20,
        "the engine's tables are in .bss ({bss} bytes)"
    );
}
