//! Spec grammar: example specs, canonical Display, malformed specs
//! with their error kinds, heap matching and `from_env`.

use allocator_api2::alloc::Global;
use ckalloc::caching::{
    BufferUsage, CachingAllocator, CachingSpec, Heap, MemoryType, PoolParams, SpecErrorKind,
    SpecField,
};

fn parse(s: &str) -> CachingSpec {
    s.parse()
        .unwrap_or_else(|e| panic!("`{s}` should parse: {e}"))
}

fn roundtrip(s: &str) -> String {
    let spec = parse(s);
    let shown = spec.to_string();
    assert_eq!(parse(&shown), spec, "`{s}` -> `{shown}` must round-trip");
    assert_eq!(
        parse(&shown).to_string(),
        shown,
        "canonical form is a fixed point"
    );
    shown
}

#[test]
fn example_specs_parse_and_build() {
    let cases = [
        ("device_local=1gib;1gib;8", "device_local=1gib;1gib;8"),
        ("host_local=*;*;32", "host_local=*;*;32"),
        (
            "device_local=1gib;1gib;8,host_local=*;*;32",
            "device_local=1gib;1gib;8,host_local=*;*;32",
        ),
        (
            "device_local;dispatch_storage=32mib;1gib",
            "device_local;dispatch_storage=32mib;1gib",
        ),
        ("host_local", "host_local"),
        ("*=64mib", "*=64mib"),
        ("", ""),
    ];
    for (spec, canonical) in cases {
        assert_eq!(roundtrip(spec), canonical);
        let cache = CachingAllocator::from_spec(Global, spec).unwrap();
        let n = parse(spec).pools.len().max(1);
        assert_eq!(cache.pool_params().len(), n, "{spec}");
    }
}

#[test]
fn example_values() {
    let s = parse("device_local=1gib;1gib;8,host_local=*;*;32");
    assert_eq!(s.pools[0].heap_key.memory_type, MemoryType::DEVICE_LOCAL);
    assert_eq!(s.pools[0].max_allocation_size, Some(1 << 30));
    assert_eq!(s.pools[0].max_allocation_capacity, Some(1 << 30));
    assert_eq!(s.pools[0].max_free_allocation_count, Some(8));
    assert_eq!(s.pools[1].max_allocation_size, None);
    assert_eq!(s.pools[1].max_free_allocation_count, Some(32));
    let c =
        CachingAllocator::from_spec(Global, "device_local=1gib;1gib;8,host_local=*;*;32").unwrap();
    let p = c.pool_params();
    assert_eq!(p[1].max_allocation_size, Heap::host().max_allocation_size);
    assert_eq!(p[1].max_allocation_capacity, u64::MAX);
    assert_eq!(p[1].max_free_allocation_count, 32);
    let u = parse("device_local;dispatch_storage=32mib;1gib");
    assert_eq!(
        u.pools[0].heap_key.buffer_usage,
        BufferUsage::DISPATCH_STORAGE
    );
    assert_eq!(u.pools[0].max_free_allocation_count, None);
    // Empty spec: one unbounded pool with IREE's defaults.
    let e = CachingAllocator::from_spec(Global, "").unwrap();
    assert_eq!(e.pool_params(), vec![PoolParams::new(Heap::host())]);
}

#[test]
fn canonical_display() {
    assert_eq!(
        roundtrip("  HOST_LOCAL = 1024 ; 2048kib ; 7 "),
        "host_local=1kib;2mib;7"
    );
    assert_eq!(roundtrip("host_local=;;"), "host_local");
    assert_eq!(roundtrip("*;*=*;*;*"), "*");
    assert_eq!(roundtrip("*;transfer=1000"), "*;transfer=1000");
    assert_eq!(
        roundtrip("host_visible|host_coherent|Device_Local"),
        "device_local|host_visible|host_coherent"
    );
    assert_eq!(
        roundtrip("host_visible|host_coherent|host_local"),
        "host_local"
    );
    assert_eq!(roundtrip("*;transfer_source|transfer_target"), "*;transfer");
    assert_eq!(roundtrip("*=1kb"), "*=1000");
    assert_eq!(roundtrip("*=1gb"), "*=1000000000");
    assert_eq!(roundtrip("*=3tib;0;0"), "*=3tib;0;0");
    assert_eq!(roundtrip("*=0b"), "*=0");
    assert_eq!(
        roundtrip("*=18446744073709551615"),
        "*=18446744073709551615"
    );
    assert_eq!(roundtrip("*=1536"), "*=1536");
    assert_eq!(
        roundtrip("optimal;mapping|dispatch"),
        "optimal;dispatch|mapping"
    );
    let sixteen = vec!["*=1mib"; 16].join(",");
    assert_eq!(roundtrip(&sixteen), sixteen);
}

#[test]
fn malformed_specs_have_their_kinds() {
    use SpecErrorKind::*;
    let cases: &[(&str, SpecErrorKind)] = &[
        ("=1gib", EmptyHeapKey),
        ("  =1gib", EmptyHeapKey),
        (",", EmptyHeapKey),
        ("host_local,", EmptyHeapKey),
        (",host_local", EmptyHeapKey),
        ("host_local,,device_local", EmptyHeapKey),
        ("=", EmptyHeapKey),
        ("host_local|", EmptyName),
        ("|host_local", EmptyName),
        ("host_local||device_local", EmptyName),
        (";transfer", EmptyName),
        ("host_local;", EmptyName),
        ("host_local; ", EmptyName),
        ("host_local;transfer|", EmptyName),
        ("hostlocal", UnknownName),
        ("host-local", UnknownName),
        ("device", UnknownName),
        ("*|host_local", WildcardWithNames),
        ("host_local;*|transfer", WildcardWithNames),
        ("host_local;transfer;mapping", UnknownName),
        ("host_local;dispatch_storagex", UnknownName),
        ("transient", UnknownName),
        ("host_local;host_local", UnknownName),
        ("transfer", UnknownName),
        ("host_local=1GiB", BadSize),
        ("host_local=1Gib", BadSize),
        ("host_local=1KB", BadSize),
        ("host_local=8x", BadSize),
        ("host_local=123fb", BadSize),
        ("host_local=1.5gib", BadSize),
        ("host_local=.5gib", BadSize),
        ("host_local=-1", BadSize),
        ("host_local=+1", BadSize),
        ("host_local=010", BadSize),
        ("host_local=00", BadSize),
        ("host_local=0x10", BadSize),
        ("host_local=1 gib", BadSize),
        ("host_local=gib", BadSize),
        ("host_local=1e6", BadSize),
        ("host_local=18446744073709551616", BadSize),
        ("host_local=16777216tib", BadSize),
        ("host_local=99999999999999999999999", BadSize),
        ("host_local=1_000", BadSize),
        ("host_local=**", BadSize),
        ("host_local=1=2", BadSize),
        ("host_local=*;1gi", BadSize),
        ("host_local=*;-5", BadSize),
        ("host_local=*;1,5", UnknownName), // "5" becomes a pair
        ("host_local=*;*;-1", BadCount),
        ("host_local=*;*;8x", BadCount),
        ("host_local=*;*;08", BadCount),
        ("host_local=*;*;1kib", BadCount),
        ("host_local=*;*;4294967296", BadCount),
        ("host_local=*;*;1.0", BadCount),
        ("host_local=*;*;+3", BadCount),
        ("host_local=*;*;0x8", BadCount),
        ("host_local=1;2;3;4", TooManyFields),
        ("host_local=;;;", TooManyFields),
        ("host_local=*;*;*;*", TooManyFields),
    ];
    let mut checked = 0;
    for &(spec, kind) in cases {
        let err = spec
            .parse::<CachingSpec>()
            .expect_err(&format!("`{spec}` must be rejected"));
        assert_eq!(err.kind(), kind, "`{spec}`: {err}");
        // Every error names the pair and the offending text.
        let msg = err.to_string();
        assert!(msg.contains(err.text()), "{msg}");
        assert!(err.pair_index().is_some(), "{msg}");
        checked += 1;
    }
    // A stray "5" after a comma is a pair with an unknown heap name.
    let err = "host_local=*;1,5".parse::<CachingSpec>().unwrap_err();
    assert_eq!(err.kind(), UnknownName);
    assert_eq!(err.pair_index(), Some(1));
    assert_eq!(err.text(), "5");
    let seventeen = vec!["host_local"; 17].join(",");
    let err = seventeen.parse::<CachingSpec>().unwrap_err();
    assert_eq!(err.kind(), TooManyPools);
    assert_eq!(err.pair_index(), Some(16));
    checked += 1;
    assert!(checked >= 50, "only {checked} malformed specs");
}

#[test]
fn errors_name_pair_field_and_text() {
    let err = "host_local=1gib,device_local=*;*;8x"
        .parse::<CachingSpec>()
        .unwrap_err();
    assert_eq!(err.kind(), SpecErrorKind::BadCount);
    assert_eq!(err.pair_index(), Some(1));
    assert_eq!(err.pair(), "device_local=*;*;8x");
    assert_eq!(err.field(), SpecField::MaxFreeAllocationCount);
    assert_eq!(err.text(), "8x");
    let msg = err.to_string();
    assert!(
        msg.contains("device_local=*;*;8x")
            && msg.contains("max_free_allocation_count")
            && msg.contains("8x"),
        "{msg}"
    );

    let err = "host_local=1GiB".parse::<CachingSpec>().unwrap_err();
    assert_eq!(err.field(), SpecField::MaxAllocationSize);
    assert_eq!(err.text(), "1GiB");
    let err = "host_local=*; 2x ".parse::<CachingSpec>().unwrap_err();
    assert_eq!(err.field(), SpecField::MaxAllocationCapacity);
    assert_eq!(err.text(), "2x");
    let err = "host_local;bogus".parse::<CachingSpec>().unwrap_err();
    assert_eq!(err.field(), SpecField::BufferUsage);
    assert_eq!(err.text(), "bogus");
    let err = "bogus;transfer".parse::<CachingSpec>().unwrap_err();
    assert_eq!(err.field(), SpecField::MemoryType);
    assert_eq!(err.text(), "bogus");
}

#[test]
fn narrow_heap_rejects_unsatisfiable_keys() {
    let narrow = Heap {
        name: "staging",
        memory_type: MemoryType::HOST_LOCAL,
        allowed_usage: BufferUsage::TRANSFER | BufferUsage::MAPPING,
        max_allocation_size: 1 << 30,
    };
    let build = |s: &str| {
        CachingAllocator::builder(Global)
            .heap(narrow)
            .spec(s.parse().unwrap())
            .build()
    };
    assert!(build("host_local;transfer=1mib").is_ok());
    assert!(build("*;mapping").is_ok());
    assert!(
        build("optimal").is_ok(),
        "optimal is an allocation hint every heap satisfies"
    );
    for bad in [
        "device_local",
        "host_local;dispatch_storage",
        "host_cached",
        "*=1mib,device_visible",
    ] {
        let err = build(bad).unwrap_err();
        assert_eq!(err.kind(), SpecErrorKind::NoMatchingHeap, "{bad}");
        let msg = err.to_string();
        assert!(msg.contains("staging"), "names the heap: {msg}");
        assert!(msg.contains(err.text()), "names the key: {msg}");
    }
    // Default host heap satisfies both host and device types.
    for ok in [
        "device_local",
        "host_local|device_local|host_cached;dispatch|mapping|sharing_export",
    ] {
        assert!(CachingAllocator::from_spec(Global, ok).is_ok(), "{ok}");
    }
    // Pool size default comes from the heap.
    let c = build("host_local").unwrap();
    assert_eq!(c.pool_params()[0].max_allocation_size, 1 << 30);
    // with_pools checks the heap too.
    let mut p = PoolParams::new(narrow);
    p.heap.memory_type = MemoryType::DEVICE_LOCAL;
    let err = CachingAllocator::builder(Global)
        .heap(narrow)
        .pools([p])
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), SpecErrorKind::NoMatchingHeap);
    let err =
        CachingAllocator::with_pools(Global, vec![PoolParams::new(Heap::host()); 17]).unwrap_err();
    assert_eq!(err.kind(), SpecErrorKind::TooManyPools);
}

#[test]
fn round_up_options_are_checked() {
    use ckalloc::caching::RoundUp;
    let err = CachingAllocator::builder(Global)
        .round_up(RoundUp::PowerOfTwoDivisions(3))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), SpecErrorKind::BadRoundUp);
    let err = CachingAllocator::builder(Global)
        .pool_round_up(1, RoundUp::PowerOfTwoDivisions(4))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), SpecErrorKind::NoSuchPool);
    assert_eq!(RoundUp::PowerOfTwoDivisions(4).apply(1200), 1280);
    assert_eq!(RoundUp::PowerOfTwoDivisions(4).apply(1024), 1024);
    assert_eq!(RoundUp::PowerOfTwoDivisions(4).apply(1025), 1280);
    assert_eq!(RoundUp::PowerOfTwoDivisions(1).apply(1025), 2048);
    assert_eq!(
        RoundUp::PowerOfTwoDivisions(8).apply(5),
        8,
        "PyTorch: too fine a step rounds to the next power of two"
    );
    assert_eq!(RoundUp::PowerOfTwoDivisions(65536).apply(1025), 2048);
    assert_eq!(RoundUp::PowerOfTwoDivisions(65536).apply(131_073), 131_074);
    assert_eq!(
        RoundUp::PowerOfTwoDivisions(2).apply(usize::MAX),
        usize::MAX
    );
    assert_eq!(RoundUp::None.apply(1234), 1234);
}

#[test]
fn from_env_reads_the_variable() {
    // Unique variable names: tests run in parallel threads.
    let var = "CKALLOC_TEST_CACHING_SPEC_A";
    std::env::remove_var(var);
    assert_eq!(
        CachingAllocator::from_env(Global, var)
            .unwrap()
            .pool_params()
            .len(),
        1
    );
    std::env::set_var(var, "*=1mib;*;4,*");
    let c = CachingAllocator::from_env(Global, var).unwrap();
    assert_eq!(c.pool_params().len(), 2);
    assert_eq!(c.pool_params()[0].max_allocation_size, 1 << 20);
    std::env::set_var(var, "*=1MiB");
    assert_eq!(
        CachingAllocator::from_env(Global, var).unwrap_err().kind(),
        SpecErrorKind::BadSize
    );
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        std::env::set_var(var, std::ffi::OsStr::from_bytes(b"*=\xff"));
        assert_eq!(
            CachingAllocator::from_env(Global, var).unwrap_err().kind(),
            SpecErrorKind::NotUnicode
        );
    }
    std::env::remove_var(var);
}

/// True when `s` has no C0, DEL or C1 control character.
fn no_control(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

#[test]
fn spec_error_display_escapes_nul_and_terminal_escapes() {
    for (spec, kind, raw) in [
        (
            "host_local=\0\u{1b}[31m",
            SpecErrorKind::BadSize,
            "\0\u{1b}[31m",
        ),
        (
            "host\0local\u{1b}[2J",
            SpecErrorKind::UnknownName,
            "host\0local\u{1b}[2J",
        ),
        (
            "host_local=*;*;\u{1b}[1m\u{9b}2J\u{7}\0",
            SpecErrorKind::BadCount,
            "\u{1b}[1m\u{9b}2J\u{7}\0",
        ),
    ] {
        let err = spec.parse::<CachingSpec>().unwrap_err();
        assert_eq!(err.kind(), kind, "{spec:?}");
        // The accessors keep the raw text.
        assert_eq!(err.text(), raw);
        assert_eq!(err.pair(), spec);
        let msg = err.to_string();
        assert!(no_control(&msg), "{msg:?}");
        assert!(msg.contains("\\0") && msg.contains("\\u{1b}"), "{msg:?}");
        let dbg = format!("{err:?}");
        assert!(no_control(&dbg), "{dbg:?}");
    }
}

#[test]
fn huge_bad_spec_display_is_short_and_names_the_byte_length() {
    let mib = 1 << 20;
    let junk = "x".repeat(mib);
    let cases = [
        // 1 MiB bad size: pair and text are both about 1 MiB.
        (format!("host_local={junk}"), SpecErrorKind::BadSize),
        // 1 MiB unknown heap name: pair and text are the same 1 MiB.
        (junk.clone(), SpecErrorKind::UnknownName),
        // 1 MiB seventeenth pair.
        (
            format!("{}{junk}", "host_local,".repeat(16)),
            SpecErrorKind::TooManyPools,
        ),
    ];
    for (spec, kind) in cases {
        let err = spec.parse::<CachingSpec>().unwrap_err();
        assert_eq!(err.kind(), kind);
        assert!(err.text().len() >= mib, "text() is raw and complete");
        let msg = err.to_string();
        assert!(msg.len() < 1024, "{kind:?}: {} bytes", msg.len());
        assert!(
            msg.contains(&format!("({} bytes)", err.text().len())),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("({} bytes)", err.pair().len())),
            "{msg}"
        );
        // `unwrap()` prints `Debug`: short too.
        let dbg = format!("{err:?}");
        assert!(dbg.len() < 1024, "{kind:?}: Debug is {} bytes", dbg.len());
        assert!(dbg.contains(&format!("({} bytes)", err.text().len())));
    }
}

#[test]
fn from_env_rejects_names_no_variable_can_have_but_not_unset_ones() {
    for name in ["", "A=B", "A\0B", "=A", "CKALLOC_TEST_CACHING_SPEC=\0"] {
        let err = CachingAllocator::from_env(Global, name).unwrap_err();
        assert_eq!(err.kind(), SpecErrorKind::BadVariableName, "{name:?}");
        assert_eq!(err.field(), SpecField::Variable);
        assert_eq!(err.text(), name);
        let msg = err.to_string();
        assert!(no_control(&msg), "{msg:?}");
        assert!(
            msg.contains(&format!("`{}`", name.replace('\0', "\\0"))),
            "{msg}"
        );
    }
    // A valid name that is unset is still one unbounded pool.
    let var = "CKALLOC_TEST_CACHING_SPEC_UNSET_B";
    std::env::remove_var(var);
    let c = CachingAllocator::from_env(Global, var).unwrap();
    assert_eq!(c.pool_params(), vec![PoolParams::new(Heap::host())]);
}

#[cfg(unix)]
#[test]
fn from_env_not_unicode_error_escapes_the_variable_name() {
    use std::os::unix::ffi::OsStrExt;
    // A name with a terminal escape and a newline is legal in the environment.
    let var = "CKALLOC_TEST_CACHING_SPEC_\u{1b}[31m\n_C";
    std::env::set_var(var, std::ffi::OsStr::from_bytes(b"*=\xff"));
    let err = CachingAllocator::from_env(Global, var).unwrap_err();
    std::env::remove_var(var);
    assert_eq!(err.kind(), SpecErrorKind::NotUnicode);
    let msg = err.to_string();
    assert!(no_control(&msg), "{msg:?}");
    assert!(msg.contains("\\u{1b}[31m\\n_C"), "{msg}");
}
