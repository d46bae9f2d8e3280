//! Reading the `weights.bump` layouts C-Kernel-Engine's converters write: the
//! files in `tests/data/cke/` (written by those converters), corrupted copies of
//! them, the reader's file-validity rules, and hand-built files of each layout.
#![cfg(feature = "weights")]

mod common;
use common::u32_at;

use ckalloc::weights::*;
use ckalloc::{BumpArena, ModePolicy};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// `(folder, layout, version, dtype-table slots, manifest entries)`; 0 entries: no manifest.
const FIXTURES: &[(&str, Container, Version, u32, usize)] = &[
    ("v8-gguf-v5", Container::V8Converters, Version::V5, 32, 36),
    ("v8-gguf-v4", Container::V8Converters, Version::V4, 32, 36),
    ("v8-gguf-q4k", Container::V8Converters, Version::V5, 32, 36),
    (
        "v8-safetensors",
        Container::V8Converters,
        Version::V5,
        34,
        34,
    ),
    (
        "root-gguf-l2",
        Container::V4HeaderConverters,
        Version::V4,
        32,
        32,
    ),
    (
        "v7-hf-v5",
        Container::V4HeaderConverters,
        Version::V5,
        30,
        25,
    ),
    (
        "v7-hf-v4",
        Container::V4HeaderConverters,
        Version::V4,
        30,
        25,
    ),
    (
        "v7-hf-q4k",
        Container::V4HeaderConverters,
        Version::V5,
        30,
        25,
    ),
    (
        "v66-gguf-l3",
        Container::V65GgufConverters,
        Version::V4,
        32,
        35,
    ),
    ("v7-hf-wgt3", Container::BareHfConverter, Version::V3, 32, 0),
];

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/cke")
        .join(name)
}

fn bytes(name: &str) -> Vec<u8> {
    std::fs::read(dir(name).join("weights.bump")).unwrap()
}

fn open(name: &str) -> WeightsFile {
    WeightsFile::open(dir(name).join("weights.bump")).unwrap()
}

/// `check_manifest` with the default options.
fn check(f: &WeightsFile, m: Manifest) -> Result<CheckedManifest, WeightsError> {
    f.check_manifest(m, CheckOptions::new())
}

/// A manifest entry (`runtime_offset == file_offset`, no shape).
fn entry(name: &str, dtype: &str, file_offset: u64, size: u64) -> ManifestEntry {
    ManifestEntry::new(name, dtype, file_offset, size).unwrap()
}

/// `head`'s first 128 bytes followed by `body` from byte 128.
fn swap_header(head: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = head[..128].to_vec();
    v.extend_from_slice(&body[128..]);
    v
}

#[test]
fn every_fixture_is_recognised_and_its_checksum_verifies() {
    for &(name, container, version, slots, _) in FIXTURES {
        let f = open(name);
        let b = bytes(name);
        assert_eq!(f.container(), container, "{name}");
        assert_eq!(f.version(), version, "{name}");
        assert_eq!(f.header().dtype_table_len, slots, "{name}");
        f.verify_checksum()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The stored digest is the SHA-256 of the layout's range, recomputed here
        // from the raw bytes at the layout's own offsets.
        let o = container.offsets();
        let (start, end) = f.checksum_range();
        assert_eq!(start, o.hash_start, "{name}");
        assert_eq!(end, f.data_end(), "{name}");
        let digest: [u8; 32] = Sha256::digest(&b[start as usize..end as usize]).into();
        assert_eq!(&b[o.checksum as usize..o.checksum as usize + 32], &digest);
        assert_eq!(f.checksum(), &digest);
        // The table sits where the layout says, and the tensor data follows it.
        assert_eq!(u32_at(&b, o.dtype_count as usize), slots, "{name}");
        assert_eq!(f.tensor_data_start(), o.dtype_table() + u64::from(slots));
        match (container, version) {
            (Container::V65GgufConverters | Container::BareHfConverter, _) | (_, Version::V4) => {
                assert_eq!(end, b.len() as u64, "{name}: no trailer");
                assert!(f.footer().is_none());
            }
            _ => assert!(f.footer().is_some() && end < b.len() as u64, "{name}"),
        }
        assert!(!f.header().reserved_nonzero, "{name}");
        let d = f.dims();
        assert_eq!(
            (
                d.model_type,
                d.num_layers,
                d.vocab_size,
                d.embed_dim,
                d.num_heads,
                d.head_dim
            ),
            (1, 2, 256, 64, 4, 16),
            "{name}"
        );
        assert_eq!(d.context_len, 128, "{name}");
    }
}

#[test]
fn header_fields_a_layout_lacks_are_none() {
    // L2 keeps checksum bytes at 80..88: no merge counts are read from them.
    for name in ["root-gguf-l2", "v7-hf-v4", "v7-hf-v5", "v7-hf-q4k"] {
        let d = *open(name).dims();
        assert_eq!((d.num_merges, d.total_vocab_bytes), (None, None), "{name}");
        assert_eq!(d.num_kv_heads, Some(2), "{name}");
        assert!(d.intermediate_size.is_some() && d.aligned_intermediate.is_some());
        assert_eq!(open(name).container().offsets().checksum, 80);
    }
    // L1 and L3 carry them (the safetensors converter writes 0 for both).
    for (name, merges) in [
        ("v8-gguf-v5", Some(157)),
        ("v66-gguf-l3", Some(157)),
        ("v8-safetensors", Some(0)),
    ] {
        assert_eq!(open(name).dims().num_merges, merges, "{name}");
    }
    // L4 has no intermediate size, kv heads or merge fields; its u64s start at 40.
    let d = *open("v7-hf-wgt3").dims();
    assert_eq!(
        (
            d.intermediate_size,
            d.num_kv_heads,
            d.aligned_intermediate,
            d.num_merges,
            d.total_vocab_bytes
        ),
        (None, None, None, None, None)
    );
    assert_eq!(
        (d.aligned_embed_dim, d.aligned_head_dim, d.aligned_context),
        (64, 16, 128)
    );
    let json = d.to_json();
    assert!(json.get("num_merges").is_none() && json.get("num_kv_heads").is_none());
    assert_eq!(json["context_length"], 128);
    // The padded HF file: aligned dims differ from the raw ones.
    let d = *open("v7-hf-q4k").dims();
    assert_eq!(
        (d.aligned_embed_dim, d.aligned_intermediate),
        (256, Some(256))
    );
}

#[test]
fn every_manifest_passes_the_validity_rules() {
    for &(name, _, _, _, entries) in FIXTURES.iter().filter(|f| f.4 > 0) {
        let f = open(name);
        let m = f
            .load_manifest(dir(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.len(), entries, "{name}");
        // Every rule, runtime_offset == file_offset among them.
        let checked = check(&f, m.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The v5 files' metadata records the JSON sidecar's manifest_hash.
        let binding = checked.binding();
        assert_eq!(
            binding == ManifestBinding::ManifestHash,
            f.version() == Version::V5,
            "{name}: {binding}"
        );
        assert!(
            checked.warnings().is_empty(),
            "{name}: {:?}",
            checked.warnings()
        );
        // The converters pack tensors: the first starts right after the table,
        // the last ends at the data end, nothing in between is uncovered.
        let rep = f.layout_report(&m);
        assert!(rep.is_clean() && rep.gaps.is_empty(), "{name}: {rep:?}");
        assert_eq!(
            m.sorted_by_offset()[0].file_offset,
            f.tensor_data_start(),
            "{name}"
        );
    }
}

#[test]
fn the_json_manifest_version_is_not_compared_with_the_magic() {
    // These manifests say 5 for BUMPWGT4 files.
    for name in ["v8-gguf-v4", "root-gguf-l2", "v66-gguf-l3"] {
        let text = std::fs::read_to_string(dir(name).join(MANIFEST_JSON)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["version"], 5, "{name}");
        let f = open(name);
        assert_eq!(f.version(), Version::V4);
        check(&f, f.load_manifest(dir(name)).unwrap()).unwrap();
    }
}

/// Build the arena as `ckalloc load` does and compare every manifest entry's
/// bytes in the arena with the file's bytes at that entry.
fn load_and_compare(name: &str, policy: ModePolicy) {
    let path = dir(name).join("weights.bump");
    let f = open(name);
    let raw = bytes(name);
    let m = f.load_manifest(dir(name)).unwrap();
    let checked = check(&f, m.clone()).unwrap();
    let wb = m.iter().map(|e| e.file_offset).min().unwrap() as usize;
    let ab = f.data_end() as usize;
    assert_eq!(checked.weights_region(), (wb as u64, ab as u64));
    let mut arena = BumpArena::builder(ab + (1 << 20))
        .weights_file(&path)
        .weights_base(wb)
        .activations_base(ab)
        .manifest(checked)
        .policy(policy)
        .build()
        .unwrap_or_else(|e| panic!("{name} {policy:?}: {e}"));
    if arena.needs_weight_materialization() {
        arena.materialize_weights().unwrap();
    }
    assert_eq!(arena.manifest().map(CheckedManifest::manifest), Some(&m));
    for e in &m {
        let want = &raw[e.file_offset as usize..(e.file_offset + e.size) as usize];
        assert_eq!(
            arena.tensor(&e.name),
            Some(want),
            "{name} {policy:?}: {}",
            e.name
        );
        assert_eq!(&*f.tensor(e).unwrap(), want);
    }
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap
fn l1_to_l3_fixtures_load_in_anon_mode_with_every_entry_equal() {
    for &(name, ..) in FIXTURES.iter().filter(|f| f.4 > 0) {
        load_and_compare(name, ModePolicy::AnonOnly);
    }
}

#[test]
#[cfg(target_os = "linux")]
#[cfg_attr(miri, ignore)] // file-backed mmap
fn l1_to_l3_fixtures_load_in_mixed_mode_with_every_entry_equal() {
    for &(name, ..) in FIXTURES.iter().filter(|f| f.4 > 0) {
        load_and_compare(name, ModePolicy::MixedOnly);
    }
}

#[test]
fn l4_is_named_and_refused_for_loading_for_want_of_a_manifest() {
    let f = open("v7-hf-wgt3");
    assert_eq!(f.container(), Container::BareHfConverter);
    assert_eq!(f.container().label(), "L4");
    assert_eq!(f.checksum_range(), (128, f.len()));
    f.verify_checksum().unwrap();
    let e = f.load_manifest(dir("v7-hf-wgt3")).unwrap_err();
    assert!(
        matches!(&e, WeightsError::ManifestRequired { container: Container::BareHfConverter, magic, .. } if magic == b"BUMPWGT3"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("BUMPWGT3") && msg.contains("weights_manifest.map"),
        "{msg}"
    );
    // Its table slots are read (all fp32), with no manifest to name them.
    assert_eq!(f.slot_dtypes(None), vec![SlotDtype::Known(Dtype::F32); 32]);
}

#[test]
fn a_file_without_sidecars_is_refused_for_loading_naming_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir("v8-gguf-v4").join("weights.bump"),
        tmp.path().join("weights.bump"),
    )
    .unwrap();
    let f = WeightsFile::open(tmp.path().join("weights.bump")).unwrap();
    f.verify_checksum().unwrap();
    let e = f.load_manifest(tmp.path()).unwrap_err();
    assert!(
        matches!(&e, WeightsError::ManifestRequired { container: Container::V8Converters, dir, .. } if dir == tmp.path()),
        "{e}"
    );
    assert!(e.to_string().contains("weights_manifest.json"), "{e}");
}

#[test]
fn a_flipped_data_byte_is_a_checksum_mismatch_naming_the_layout_and_range() {
    for &(name, container, ..) in FIXTURES {
        let f = open(name);
        let mut b = bytes(name);
        let at = ((f.tensor_data_start() + f.data_end()) / 2) as usize;
        b[at] ^= 0x10;
        let g = WeightsFile::from_vec(b).unwrap();
        assert_eq!(g.container(), container, "{name}");
        let e = g.verify_checksum().unwrap_err();
        assert!(
            matches!(&e, WeightsError::BadChecksum { container: c, range, expected, actual }
                if *c == container && *range == f.checksum_range() && expected != actual),
            "{name}: {e}"
        );
        let msg = e.to_string();
        let (start, end) = f.checksum_range();
        assert!(msg.contains(container.label()), "{msg}");
        assert!(msg.contains(&format!("[{start}, {end})")), "{msg}");
    }
}

#[test]
fn a_flipped_checksum_byte_is_a_checksum_mismatch() {
    for &(name, container, ..) in FIXTURES {
        let mut b = bytes(name);
        let at = container.offsets().checksum as usize + 5;
        b[at] ^= 0xFF;
        let g = WeightsFile::from_vec(b).unwrap();
        assert_eq!(g.container(), container, "{name}");
        assert!(
            matches!(g.verify_checksum(), Err(WeightsError::BadChecksum { container: c, .. }) if c == container),
            "{name}"
        );
    }
}

#[test]
fn truncated_fixtures_fail_with_the_layouts_own_errors() {
    for &(name, container, version, _, entries) in FIXTURES {
        let b = bytes(name);
        // One byte short: a v5 file loses its footer; others lose tensor data,
        // which the checksum and the manifest both catch.
        let short = &b[..b.len() - 1];
        match version {
            Version::V5 => assert!(
                matches!(
                    WeightsFile::from_bytes(short),
                    Err(WeightsError::BadFooter { .. })
                ),
                "{name}"
            ),
            _ => {
                let g = WeightsFile::from_bytes(short).unwrap();
                assert_eq!(g.container(), container, "{name}");
                assert!(matches!(
                    g.verify_checksum(),
                    Err(WeightsError::BadChecksum { .. })
                ));
                if entries > 0 {
                    let m = open(name).load_manifest(dir(name)).unwrap();
                    assert!(
                        matches!(check(&g, m), Err(WeightsError::EntryOutsideFile { .. })),
                        "{name}"
                    );
                }
            }
        }
        // Cut inside the header: too short for the longest layout the magic
        // allows (156 bytes before the magic is known).
        for len in [0usize, 7, 11, 100, 127] {
            let needed = if len >= 8 && version == Version::V3 {
                132
            } else {
                156
            };
            let e = WeightsFile::from_bytes(&b[..len]).unwrap_err();
            assert!(
                matches!(e, WeightsError::TruncatedHeader { len: l, needed: n } if l == len as u64 && n == needed),
                "{name} cut to {len}: {e}"
            );
        }
    }
}

#[test]
fn a_header_on_another_layouts_body_is_rejected_or_fails_that_layouts_checksum() {
    let l1 = bytes("v8-gguf-v4");
    let l1v5 = bytes("v8-gguf-v5");
    let l2 = bytes("root-gguf-l2");
    let l2v5 = bytes("v7-hf-v5");
    let l3 = bytes("v66-gguf-l3");
    let l4 = bytes("v7-hf-wgt3");

    // No layout's structure fits: "not a known weights.bump layout", listing
    // every layout the magic allows and the rule each one breaks.
    for (what, file, tried) in [
        (
            "L2 header on L1 body",
            swap_header(&l2, &l1),
            &[
                Container::V8Converters,
                Container::V4HeaderConverters,
                Container::V65GgufConverters,
            ][..],
        ),
        (
            "L2 v5 header on L1 v5 body",
            swap_header(&l2v5, &l1v5),
            &[Container::V8Converters, Container::V4HeaderConverters][..],
        ),
        (
            "L4 header on L1 body",
            swap_header(&l4, &l1),
            &[Container::BareHfConverter][..],
        ),
    ] {
        let e = WeightsFile::from_bytes(&file).unwrap_err();
        let WeightsError::NotAKnownLayout { tried: got, .. } = &e else {
            panic!("{what}: {e}");
        };
        assert_eq!(
            got.iter().map(|r| r.container).collect::<Vec<_>>(),
            tried,
            "{what}"
        );
        assert!(got.iter().all(|r| !r.reason.is_empty()));
        let msg = e.to_string();
        assert!(msg.starts_with("not a known weights.bump layout"), "{msg}");
        for c in tried {
            assert!(msg.contains(&format!("{}: ", c.label())), "{msg}");
        }
    }

    // The structure fits one layout: that layout's checksum fails.
    for (what, file, read_as) in [
        (
            "L1 header on L2 body",
            swap_header(&l1, &l2),
            Container::V65GgufConverters,
        ),
        (
            "L1 header on L3 body",
            swap_header(&l1, &l3),
            Container::V65GgufConverters,
        ),
        (
            "L3 header on L1 body",
            swap_header(&l3, &l1),
            Container::V8Converters,
        ),
        (
            "L2 header on L4 body",
            swap_header(&l2, &l4),
            Container::V4HeaderConverters,
        ),
        (
            "L4 header on L2 body",
            swap_header(&l4, &l2),
            Container::BareHfConverter,
        ),
    ] {
        let f = WeightsFile::from_bytes(&file).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(f.container(), read_as, "{what}");
        assert!(
            matches!(f.verify_checksum(), Err(WeightsError::BadChecksum { container, .. }) if container == read_as),
            "{what}"
        );
    }
}

#[test]
fn dtype_table_differences_are_one_informational_line() {
    // Files other writers wrote: the table is a hint, and `check_manifest`
    // (rule 9) says how it differs from the manifest.
    let note = |name: &str| {
        let f = open(name);
        let checked = check(&f, f.load_manifest(dir(name)).unwrap()).unwrap();
        match checked.dtype_table() {
            DtypeTableCheck::Hint { note } => note.clone(),
            other => panic!("{name}: {other:?}"),
        }
    };
    // One slot per entry with matching codes: nothing to say.
    assert_eq!(note("root-gguf-l2"), None);
    let n = note("v8-gguf-v5").unwrap();
    assert!(
        n.starts_with("table has 32 slots, manifest 36 entries: ") && !n.contains('\n'),
        "{n}"
    );
    assert!(note("v7-hf-v4")
        .unwrap()
        .starts_with("table has 30 slots, manifest 25 entries: "));
    // 1:1 but the tokenizer's i32/u8 entries are coded 0.
    let n = note("v8-safetensors").unwrap();
    assert!(
        n.contains("34 slots, manifest 34 entries: 3 slot code(s) differ"),
        "{n}"
    );
    assert!(n.contains("\"vocab_offsets\" i32 coded 0"), "{n}");
    // ckalloc's own files (the JSON's generator says so): the table is
    // checked, not a hint, and it agrees.
    let tmp = tempfile::tempdir().unwrap();
    let mut w = WeightsWriter::new(Version::V4);
    w.add_tensor("a", Dtype::Q4_1, vec![0u8; 20]).unwrap();
    w.add_tensor("b", Dtype::I32, vec![0u8; 8]).unwrap();
    w.write_dir(tmp.path()).unwrap();
    let f = WeightsFile::open(tmp.path().join(WEIGHTS_FILE)).unwrap();
    let m = f.load_manifest(tmp.path()).unwrap();
    let checked = check(&f, m.clone()).unwrap();
    assert_eq!(checked.dtype_table(), &DtypeTableCheck::Checked);
    assert_eq!(f.producer(Some(&m)), Producer::CkernelDtypeCodes);
    assert_eq!(f.slot_dtypes(Some(&m))[0], SlotDtype::Known(Dtype::Q4_1));
}

#[test]
fn code_6_is_read_by_producer_and_ambiguous_without_one() {
    // The HF converter's Q4_K file: its metadata names the converter.
    let f = open("v7-hf-q4k");
    assert_eq!(f.producer(None), Producer::HfConverter);
    let slots = f.slot_dtypes(None);
    assert_eq!(
        slots
            .iter()
            .filter(|s| **s == SlotDtype::Known(Dtype::Q4_K))
            .count(),
        13
    );
    // The same bytes as BUMPWGT4 (cut at the data end, as the converter's
    // `--bump-version 4` writes): no metadata, and without the manifest
    // nothing says who wrote it.
    let mut b = bytes("v7-hf-q4k")[..f.data_end() as usize].to_vec();
    b[7] = b'4';
    b[8] = 4;
    let g = WeightsFile::from_vec(b).unwrap();
    assert_eq!(g.container(), Container::V4HeaderConverters);
    g.verify_checksum().unwrap(); // the checksum does not cover the magic
    assert_eq!(g.producer(None), Producer::Unknown);
    let slots = g.slot_dtypes(None);
    assert_eq!(
        slots
            .iter()
            .filter(|s| **s == SlotDtype::Q4_1OrQ4_K)
            .count(),
        13
    );
    assert_eq!(
        SlotDtype::Q4_1OrQ4_K.to_string(),
        "q4_1 or q4_k (ambiguous)"
    );
    // The manifest's `format` says HF converter; its dtype names win anyway.
    let m = f.load_manifest(dir("v7-hf-q4k")).unwrap();
    assert_eq!(m.format(), Some("ck-bumpwgt5-manifest-v1"));
    assert_eq!(g.producer(Some(&m)), Producer::HfConverter);
    assert!(m.iter().any(|e| e.dtype == "q4_k"));
    // GGUF converters write 7 for Q4_K, and say so in their metadata.
    let q = open("v8-gguf-q4k");
    assert_eq!(q.producer(None), Producer::CkernelDtypeCodes);
    assert_eq!(
        q.slot_dtypes(None)
            .iter()
            .filter(|s| **s == SlotDtype::Known(Dtype::Q4_K))
            .count(),
        2
    );
    // Classification rules.
    assert_eq!(
        Producer::from_info(Some("convert_hf_to_bump_v7.py v5"), None, None),
        Producer::HfConverter
    );
    assert_eq!(
        Producer::from_info(Some("convert_safetensors_to_bump_v8.py"), None, None),
        Producer::CkernelDtypeCodes
    );
    assert_eq!(
        Producer::from_info(None, Some("ck-bumpwgt4-manifest-v1"), Some("ckalloc 0.1.0")),
        Producer::CkernelDtypeCodes
    );
    assert_eq!(Producer::from_info(None, None, None), Producer::Unknown);
    assert_eq!(
        Producer::Unknown.slot_dtype(7),
        SlotDtype::Known(Dtype::Q4_K)
    );
    assert_eq!(Producer::Unknown.slot_dtype(0x7F), SlotDtype::Unknown(0x7F));
}

// ---- file-validity rules, one test each, against a real L2 file ----

fn l2_with(entries: Vec<ManifestEntry>) -> (WeightsFile, Result<Manifest, WeightsError>) {
    (open("root-gguf-l2"), Manifest::from_entries(entries))
}

#[test]
fn rule_entries_lie_inside_the_tensor_data() {
    let f = open("root-gguf-l2");
    let (start, end) = (f.tensor_data_start(), f.data_end());
    for (off, size) in [(start - 1, 4), (end - 3, 4), (128, 4), (u64::MAX, 2)] {
        let (f, m) = l2_with(vec![entry("t", "fp32", off, size)]);
        let e = check(&f, m.unwrap()).unwrap_err();
        assert!(
            matches!(&e, WeightsError::EntryOutsideFile { name, region_start, region_end, .. }
                if name == "t" && *region_start == start && *region_end == end),
            "{off}: {e}"
        );
    }
    let (f, m) = l2_with(vec![entry("t", "fp32", end - 4, 4)]);
    check(&f, m.unwrap()).unwrap();
}

#[test]
fn rule_no_overlaps_except_zero_size_entries() {
    let f = open("root-gguf-l2");
    let s = f.tensor_data_start();
    let (f, m) = l2_with(vec![entry("a", "fp32", s, 8), entry("b", "fp32", s + 4, 8)]);
    assert!(matches!(
        check(&f, m.unwrap()),
        Err(WeightsError::OverlappingEntries { .. })
    ));
    // A zero-size entry (the GGUF converters' empty `vocab_merges`) shares the
    // next tensor's offset.
    let (f, m) = l2_with(vec![
        entry("vocab_merges", "i32", s, 0),
        entry("a", "fp32", s, 8),
    ]);
    check(&f, m.unwrap()).unwrap();
}

#[test]
fn rule_names_are_present_and_unique() {
    let s = open("root-gguf-l2").tensor_data_start();
    // Names keep the writer's rule by construction (rule 8): an entry without
    // a name is refused where it is built, so no manifest reaching
    // `check_manifest` has one.
    assert!(matches!(
        ManifestEntry::new("", "fp32", s, 4),
        Err(WeightsError::InvalidTensorName {
            reason: "empty",
            ..
        })
    ));
    let mut nameless = entry("t", "fp32", s, 4);
    nameless.name.clear();
    let (_, m) = l2_with(vec![nameless]);
    assert!(matches!(
        m,
        Err(WeightsError::InvalidTensorName {
            reason: "empty",
            ..
        })
    ));
    let (_, m) = l2_with(vec![entry("a", "fp32", s, 4), entry("a", "fp32", s + 4, 4)]);
    assert!(matches!(m, Err(WeightsError::DuplicateTensor { name }) if name == "a"));
    let json = format!(
        r#"{{"entries":[{{"name":"a","dtype":"fp32","file_offset":{s},"size":4}},{{"name":"a","dtype":"fp32","file_offset":{},"size":4}}]}}"#,
        s + 4
    );
    assert!(matches!(
        Manifest::from_json(&json),
        Err(WeightsError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        Manifest::from_json(
            r#"{"entries":[{"name":"","dtype":"fp32","file_offset":200,"size":4}]}"#
        ),
        Err(WeightsError::ManifestSyntax { .. })
    ));
}

#[test]
fn rule_dtypes_are_known() {
    let s = open("root-gguf-l2").tensor_data_start();
    let (f, m) = l2_with(vec![entry("a", "q9_z", s, 4)]);
    assert!(matches!(
        check(&f, m.unwrap()),
        Err(WeightsError::UnknownDtype { name }) if name == "q9_z"
    ));
}

#[test]
fn rule_shape_times_dtype_fits_the_stored_size() {
    let s = open("root-gguf-l2").tensor_data_start();
    let shaped = |dtype: &str, shape: Vec<u64>, size: u64| {
        let mut e = entry("t", dtype, s, size);
        e.shape = Some(shape);
        l2_with(vec![e])
    };
    // Exactly the size, or less (converters pad rows): accepted.
    for (dtype, shape, size) in [
        ("fp32", vec![4, 4], 64),
        ("fp32", vec![64], 1024), // v7-hf-q4k pads 64-wide norms to 256
        ("q8_0", vec![2, 64], 136),
        ("q4_k", vec![256], 144),
        ("bf16", vec![0], 0),
    ] {
        let (f, m) = shaped(dtype, shape.clone(), size);
        check(&f, m.unwrap()).unwrap_or_else(|e| panic!("{dtype} {shape:?}: {e}"));
    }
    for (dtype, shape, size, needed) in [
        ("fp32", vec![4, 4], 63, 64),
        ("q8_0", vec![2, 64], 135, 136),
        ("q4_k", vec![512], 144, 288),
        ("int4", vec![3], 1, 2),
    ] {
        let (f, m) = shaped(dtype, shape.clone(), size);
        let m = m.unwrap();
        let e = check(&f, m.clone()).unwrap_err();
        assert!(
            matches!(&e, WeightsError::ShapeMismatch { expected_bytes, actual_bytes, .. }
                if *expected_bytes == needed && *actual_bytes == size),
            "{dtype} {shape:?}: {e}"
        );
        // `tensor` refuses such an entry too.
        assert!(matches!(
            f.tensor(m.get("t").unwrap()),
            Err(WeightsError::ShapeMismatch { .. })
        ));
    }
    let (f, m) = shaped("fp32", vec![u64::MAX, 2], 4);
    assert!(matches!(
        check(&f, m.unwrap()),
        Err(WeightsError::SizeOverflow { .. })
    ));
    // The safetensors converter's manifest carries shapes; they all fit.
    let f = open("v8-safetensors");
    let m = f.load_manifest(dir("v8-safetensors")).unwrap();
    assert!(m.iter().all(|e| e.shape.is_some()));
    check(&f, m.clone()).unwrap();
    for e in &m {
        assert_eq!(f.tensor(e).unwrap().len() as u64, e.size, "{}", e.name);
    }
}

#[test]
fn writer_alignment_is_not_a_reader_rule() {
    // The converters pack tensors at odd offsets; the reader accepts them.
    let f = open("v7-hf-v4");
    let m = f.load_manifest(dir("v7-hf-v4")).unwrap();
    assert!(m
        .iter()
        .any(|e| e.file_offset % 2 == 1 || e.file_offset % 64 != 0));
    assert_eq!(f.tensor_data_start(), 162);
    check(&f, m).unwrap();
}

// ---- hand-built files of each layout ----

/// A file of `container`'s layout as its converters write it: header fields at
/// the layout's offsets, the dtype table, `data`, then for `BUMPWGT5` the
/// metadata and footer.
fn build(container: Container, version: Version, table: &[u8], data: &[u8]) -> Vec<u8> {
    let o = container.offsets();
    // The hashed bytes: table count, table, tensor data (L1's zero block is not hashed).
    let mut body = Vec::new();
    body.extend_from_slice(&(table.len() as u32).to_le_bytes());
    body.extend_from_slice(table);
    body.extend_from_slice(data);
    let sha: [u8; 32] = Sha256::digest(&body).into();
    let mut f = vec![0u8; 128];
    f[..8].copy_from_slice(&version.magic());
    f[8..12].copy_from_slice(&version.number().to_le_bytes());
    let u32s: &[u32] = if container == Container::BareHfConverter {
        &[1, 2, 256, 64, 128, 4, 16]
    } else {
        &[1, 2, 256, 64, 128, 128, 4, 2, 16]
    };
    for (i, v) in u32s.iter().enumerate() {
        f[12 + 4 * i..16 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    let u64_at = 12 + 4 * u32s.len();
    let u64s: &[u64] = if container == Container::BareHfConverter {
        &[64, 16, 128]
    } else {
        &[64, 16, 128, 128]
    };
    for (i, v) in u64s.iter().enumerate() {
        f[u64_at + 8 * i..u64_at + 8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    if matches!(
        container,
        Container::V8Converters | Container::V65GgufConverters
    ) {
        f[80..84].copy_from_slice(&157u32.to_le_bytes());
        f[84..88].copy_from_slice(&706u32.to_le_bytes());
    }
    f[o.checksum as usize..o.checksum as usize + 32].copy_from_slice(&sha);
    if container == Container::V8Converters {
        f.resize(o.hash_start as usize, 0);
    }
    f.extend_from_slice(&body);
    if version == Version::V5 {
        let meta = br#"{"created_by":"hand-built"}"#;
        f.extend_from_slice(meta);
        f.extend_from_slice(&FOOTER_MAGIC);
        f.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        f.extend_from_slice(&Sha256::digest(meta));
    }
    f
}

/// Every (layout, version) pair a converter writes, hand-built.
fn hand_built_layouts() -> Vec<(Container, Version, Vec<u8>)> {
    let mut v = Vec::new();
    for c in Container::ALL {
        for &ver in c.versions() {
            v.push((c, ver, build(c, ver, &[0, 9], &[7u8; 40])));
        }
    }
    v
}

#[test]
fn hand_built_files_of_every_layout_are_recognised() {
    for (c, ver, b) in hand_built_layouts() {
        let f = WeightsFile::from_bytes(&b).unwrap_or_else(|e| panic!("{c} {ver:?}: {e}"));
        assert_eq!((f.container(), f.version()), (c, ver));
        f.verify_checksum().unwrap();
        assert_eq!(f.dtype_table(), &[0, 9]);
        assert_eq!(f.tensor_data_start(), c.offsets().dtype_table() + 2);
        assert_eq!(f.data_end() - f.tensor_data_start(), 40);
        assert_eq!(f.dims().num_layers, 2);
        assert_eq!(
            f.dims().num_merges.is_some(),
            matches!(c, Container::V8Converters | Container::V65GgufConverters)
        );
    }
}

#[test]
fn when_two_layouts_fit_the_one_breaking_fewer_soft_rules_wins() {
    // An L3 file whose table bytes read as an in-bounds L1 count of 0 at 152:
    // L1 also fits structurally, but its zero block (128..152) is not zero.
    let b = build(
        Container::V65GgufConverters,
        Version::V4,
        &[0; 24],
        &[5u8; 64],
    );
    assert_eq!(u32_at(&b, 152), 0);
    let f = WeightsFile::from_bytes(&b).unwrap();
    assert_eq!(f.container(), Container::V65GgufConverters);
    assert!(!f.header().reserved_nonzero);
    f.verify_checksum().unwrap();
    // An L1 file with a nonzero byte in its zero block still reads as L1 when
    // no other layout fits, and the byte is reported.
    let mut b = build(Container::V8Converters, Version::V4, &[0], &[1; 4]);
    b[130] = 1;
    let f = WeightsFile::from_bytes(&b).unwrap();
    assert_eq!(f.container(), Container::V8Converters);
    assert!(f.header().reserved_nonzero);
}

#[test]
fn version_3_reads_but_is_not_written() {
    assert_eq!(Version::from_number(3), Some(Version::V3));
    assert_eq!(Version::V3.magic(), *b"BUMPWGT3");
    assert_eq!(Version::V3.number(), 3);
    let tmp = tempfile::tempdir().unwrap();
    let mut w = WeightsWriter::new(Version::V3);
    w.add_tensor("a", Dtype::F32, vec![0u8; 4]).unwrap();
    assert!(matches!(
        w.write_dir(tmp.path()),
        Err(WeightsError::UnsupportedWriteVersion { version: 3 })
    ));
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    // BUMPWGT3 with a version field other than 3 is not a known version.
    let mut b = bytes("v7-hf-wgt3");
    b[8] = 4;
    assert!(matches!(
        WeightsFile::from_bytes(&b),
        Err(WeightsError::UnknownVersion { version: 4, .. })
    ));
}

#[test]
fn every_truncation_of_every_hand_built_layout_fails_cleanly() {
    for (c, ver, b) in hand_built_layouts() {
        for len in 0..b.len() {
            match WeightsFile::from_bytes(&b[..len]) {
                Err(_) => {}
                // Without a trailer, a cut inside the tensor data still parses;
                // the checksum catches it.
                Ok(f) => {
                    assert_ne!(ver, Version::V5, "{c} cut to {len}");
                    assert!(len as u64 >= f.tensor_data_start());
                    assert!(f.verify_checksum().is_err(), "{c} cut to {len}");
                }
            }
        }
    }
}

/// The `weights_reader` fuzz seeds for the four layouts. Regenerate with
/// `CKALLOC_WRITE_FUZZ_SEEDS=1 cargo test --test weights_layouts fuzz_seeds`.
/// Seed format (see fuzz/fuzz_targets/weights_reader.rs): u32 LE file length,
/// file bytes, u32 LE map length, map text, then the JSON text to the end.
#[test]
fn fuzz_seeds_cover_every_layout() {
    use common::weights_reader_seed as seed;
    let mut seeds = Vec::new();
    for (c, ver, b) in hand_built_layouts() {
        let start = c.offsets().dtype_table() + 2;
        let map = format!(
            "a|fp32|{start:#x}|0x8|{start:#x}\nb|q8_0|{:#x}|0x20|{:#x}\n",
            start + 8,
            start + 8
        );
        let name = format!("seed-{}-v{}", c.label().to_lowercase(), ver.number());
        let f = WeightsFile::from_bytes(&b).unwrap();
        check(&f, Manifest::from_map(&map).unwrap()).unwrap();
        seeds.push((name, seed(&b, &map, "")));
    }
    // The first 512 bytes of each converter-written file (header, table, some
    // tensor data) with its real JSON manifest.
    for &(name, ..) in FIXTURES {
        let b = bytes(name);
        let json = std::fs::read_to_string(dir(name).join(MANIFEST_JSON)).unwrap_or_default();
        let json: String = json.chars().take(1500).collect();
        seeds.push((
            format!("seed-cke-{name}-prefix"),
            seed(&b[..512], "", &json),
        ));
    }
    common::write_weights_reader_seeds(&seeds);
}
