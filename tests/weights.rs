//! Tests for `ckalloc::weights`: round trips, byte layout, every error path.
#![cfg(feature = "weights")]

mod common;
use common::u32_at;

use ckalloc::weights::*;
use sha2::{Digest, Sha256};
use std::path::Path;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn dims() -> ModelDims {
    let mut d = ModelDims::default();
    d.model_type = 1;
    d.num_layers = 2;
    d.vocab_size = 30522;
    d.embed_dim = 384;
    d.intermediate_size = 1536;
    d.context_len = 512;
    d.num_heads = 12;
    d.num_kv_heads = 12;
    d.head_dim = 32;
    d.aligned_embed_dim = 384;
    d.aligned_head_dim = 32;
    d.aligned_intermediate = 1536;
    d.aligned_context = 512;
    d.num_merges = 7;
    d.total_vocab_bytes = 0x0102_0304;
    d
}

/// Tensors of assorted dtypes and awkward sizes.
fn sample_tensors() -> Vec<(&'static str, Dtype, Vec<u64>, Vec<u8>)> {
    let ids: Vec<u8> = (0..5i64).flat_map(|i| i.to_le_bytes()).collect();
    vec![
        (
            "embeddings.word_embeddings.weight",
            Dtype::F32,
            vec![3, 4],
            f32_bytes(&[1.5; 12]),
        ),
        ("embeddings.position_ids", Dtype::I64, vec![1, 5], ids),
        ("odd.u8", Dtype::U8, vec![7], vec![1, 2, 3, 4, 5, 6, 7]),
        ("empty", Dtype::BF16, vec![0], vec![]),
        ("layer.0.wq", Dtype::Q4_K, vec![256], vec![0xAB; 144]),
        ("mask", Dtype::Bool, vec![3], vec![1, 0, 1]),
    ]
}

fn write_sample(dir: &Path, version: Version, align: u64) -> WriteReport {
    let tensors = sample_tensors();
    let mut w = WeightsWriter::new(version);
    w.alignment(align).unwrap().dims(dims());
    w.metadata_entry("note", serde_json::json!("caf\u{e9}"));
    for (name, dt, shape, data) in &tensors {
        w.add_tensor_with_shape(*name, *dt, shape, &data[..])
            .unwrap();
    }
    w.write_dir(dir).unwrap()
}

/// Opens a `weights.bump`.
type Opener = fn(&Path) -> Result<WeightsFile, WeightsError>;

/// Both ways to open a file: read with pread, and mapped.
const OPENERS: [Opener; 2] = [|p| WeightsFile::open(p), |p| WeightsFile::open_mapped(p)];

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn round_trip(version: Version) {
    for align in [1u64, 64, 4096] {
        let dir = tempfile::tempdir().unwrap();
        let rep = write_sample(dir.path(), version, align);
        // `open` reads with pread, `open_mapped` maps: the same file either way.
        let f = WeightsFile::open(&rep.weights_path).unwrap();
        assert!(!f.is_mapped());
        assert_eq!(f.as_bytes(), None);
        let mapped = WeightsFile::open_mapped(&rep.weights_path).unwrap();
        assert!(mapped.is_mapped());
        assert_eq!(mapped.header(), f.header());
        assert_eq!(
            mapped.as_bytes().map(|b| b.len() as u64),
            Some(rep.file_len)
        );
        assert_eq!(f.version(), version);
        assert_eq!(*f.dims(), HeaderDims::from(dims()));
        assert_eq!(f.checksum(), &rep.checksum);
        f.verify_checksum().unwrap();
        assert_eq!(f.len(), rep.file_len);
        assert_eq!(f.data_end(), rep.data_end);
        assert_eq!(rep.data_end % align, 0);
        assert_eq!(rep.weights_base % align, 0);
        assert_eq!(f.tensor_data_start(), 156 + 6);
        assert!(!f.header().reserved_nonzero);

        let m = Manifest::load_sidecars(dir.path()).unwrap();
        assert_eq!(m, rep.manifest);
        // Every rule at once (inside the tensor data, no overlaps, known
        // dtypes, shapes, runtime offsets, and the dtype table of a ckalloc
        // file), strictly: nothing to warn about either.
        let checked = f
            .check_manifest(m.clone(), CheckOptions::new().strict(true))
            .unwrap();
        assert_eq!(checked.dtype_table(), &DtypeTableCheck::Checked);
        assert!(checked.warnings().is_empty());
        assert_eq!(
            checked.binding() == ManifestBinding::ManifestHash,
            version == Version::V5
        );
        assert_eq!(checked.weights_region(), (rep.weights_base, rep.data_end));
        assert!(checked.layout().is_clean());
        assert_eq!(m.iter().next().unwrap().file_offset, rep.weights_base);
        let tensors = sample_tensors();
        assert_eq!(m.len(), tensors.len());
        for ((name, dt, shape, data), e) in tensors.iter().zip(m.iter()) {
            assert_eq!(e.name, *name, "file order = insertion order");
            assert_eq!(e.parsed_dtype().unwrap(), *dt);
            assert_eq!(e.dtype, dt.name());
            assert_eq!(e.shape.as_deref(), Some(&shape[..]));
            assert_eq!(e.file_offset % align, 0);
            assert_eq!(&*f.tensor(e).unwrap(), &data[..]);
            assert_eq!(&*mapped.tensor(e).unwrap(), &data[..]);
        }
        let codes: Vec<u8> = tensors.iter().map(|t| t.1.code()).collect();
        assert_eq!(f.dtype_table(), &codes[..]);
        assert_eq!(
            f.dtypes().collect::<Vec<_>>(),
            tensors.iter().map(|t| Some(t.1)).collect::<Vec<_>>()
        );

        // The map and JSON sidecars each parse alone to the same entries (shapes aside).
        let map =
            Manifest::from_map(&std::fs::read_to_string(&rep.manifest_map_path).unwrap()).unwrap();
        let json = Manifest::from_json(&std::fs::read_to_string(&rep.manifest_json_path).unwrap())
            .unwrap();
        assert_eq!(json, m);
        for (a, b) in map.iter().zip(m.iter()) {
            assert_eq!(
                (&a.name, &a.dtype, a.file_offset, a.size),
                (&b.name, &b.dtype, b.file_offset, b.size)
            );
        }
        let map_text = std::fs::read_to_string(&rep.manifest_map_path).unwrap();
        assert_eq!(
            map_text.lines().next().unwrap(),
            format!("# ck-bumpwgt{}-manifest-map v1", version.number())
        );

        // Also parse from memory: same header.
        let bytes = std::fs::read(&rep.weights_path).unwrap();
        let g = WeightsFile::from_bytes(&bytes).unwrap();
        assert_eq!(g.header(), f.header());
        assert!(!g.is_mapped());
        assert_eq!(g.as_bytes(), Some(&bytes[..]));
        assert_eq!(mapped.as_bytes(), Some(&bytes[..]));

        match version {
            Version::V4 => {
                assert!(f.footer().is_none() && f.metadata_bytes().is_none());
                assert!(f.metadata_json().is_none() && f.created_by().is_none());
                assert_eq!(f.len(), f.data_end());
            }
            _ => {
                let foot = *f.footer().unwrap();
                assert_eq!(foot.offset, rep.data_end);
                assert_eq!(foot.offset + foot.len + 48, f.len());
                let meta = f.metadata_json().unwrap();
                assert_eq!(f.created_by(), Some(meta["created_by"].as_str().unwrap()));
                assert!(f.created_by().unwrap().starts_with("ckalloc "));
                assert_eq!(meta["format"], "BUMPWGT5");
                assert_eq!(meta["schema_version"], 1);
                assert_eq!(meta["note"], "caf\u{e9}");
                assert_eq!(meta["config"]["embed_dim"], 384);
                assert_eq!(meta["alignment"], align);
                // Canonical: re-serializing gives the same bytes, and non-ASCII is escaped.
                let raw = f.metadata_bytes().unwrap();
                assert_eq!(canonical_json(meta), raw);
                assert!(raw.is_ascii());
                assert!(std::str::from_utf8(raw).unwrap().contains("caf\\u00e9"));
                // manifest_hash binds the JSON sidecar.
                let mj: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(&rep.manifest_json_path).unwrap(),
                )
                .unwrap();
                let h = Sha256::digest(canonical_json(&mj));
                let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(meta["manifest_hash"], hex);
            }
        }
    }
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn round_trip_v4() {
    round_trip(Version::V4);
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn round_trip_v5() {
    round_trip(Version::V5);
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn writer_output_fixed_offsets() {
    for version in [Version::V4, Version::V5] {
        let dir = tempfile::tempdir().unwrap();
        let rep = write_sample(dir.path(), version, 64);
        let b = std::fs::read(&rep.weights_path).unwrap();
        assert_eq!(&b[0..8], &version.magic());
        assert_eq!(u32_at(&b, 8), version.number());
        assert_eq!(u32_at(&b, 12), 1);
        assert_eq!(u32_at(&b, 16), 2);
        assert_eq!(u32_at(&b, 20), 30522);
        assert_eq!(u32_at(&b, 24), 384);
        assert_eq!(u32_at(&b, 28), 1536);
        assert_eq!(u32_at(&b, 32), 512);
        assert_eq!(u32_at(&b, 36), 12);
        assert_eq!(u32_at(&b, 40), 12);
        assert_eq!(u32_at(&b, 44), 32);
        assert_eq!(u64_at(&b, 48), 384);
        assert_eq!(u64_at(&b, 56), 32);
        assert_eq!(u64_at(&b, 64), 1536);
        assert_eq!(u64_at(&b, 72), 512);
        assert_eq!(u32_at(&b, 80), 7);
        assert_eq!(u32_at(&b, 84), 0x0102_0304);
        let sha: [u8; 32] = Sha256::digest(&b[152..rep.data_end as usize]).into();
        assert_eq!(&b[88..120], &sha);
        assert!(b[120..152].iter().all(|&x| x == 0));
        assert_eq!(u32_at(&b, 152), 6);
        assert_eq!(b[156], 0); // F32
        assert_eq!(b[157], 0x80); // I64, extension range
        assert_eq!(b[160], 7); // Q4_K
                               // Padding between tensors is zero.
        let m = &rep.manifest;
        let e0 = m.get("embeddings.word_embeddings.weight").unwrap();
        assert!(b[162..e0.file_offset as usize].iter().all(|&x| x == 0));
        if version == Version::V5 {
            let n = b.len();
            assert_eq!(&b[n - 48..n - 40], b"BUMPV5MD");
            let len = u64_at(&b, n - 40) as usize;
            let meta = &b[n - 48 - len..n - 48];
            let h: [u8; 32] = Sha256::digest(meta).into();
            assert_eq!(&b[n - 32..], &h);
        }
    }
}

/// Build a file by hand, exactly as C-Kernel-Engine's v6.6 converter does: 128-byte
/// header (struct.pack '<'), 24 zero bytes, hashed [u32 len, table, data].
fn hand_built(version: u32, table: &[u8], data: &[u8], meta: Option<&[u8]>) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(table.len() as u32).to_le_bytes());
    body.extend_from_slice(table);
    body.extend_from_slice(data);
    let sha: [u8; 32] = Sha256::digest(&body).into();
    let mut f = Vec::new();
    f.extend_from_slice(if version == 5 {
        b"BUMPWGT5"
    } else {
        b"BUMPWGT4"
    });
    for v in [version, 1, 24, 151936, 896, 4864, 8192, 14, 2, 64] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    for v in [896u64, 64, 4864, 8192] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    f.extend_from_slice(&100u32.to_le_bytes());
    f.extend_from_slice(&200u32.to_le_bytes());
    f.extend_from_slice(&sha);
    assert_eq!(f.len(), 120);
    f.resize(152, 0);
    f.extend_from_slice(&body);
    if let Some(m) = meta {
        f.extend_from_slice(m);
        f.extend_from_slice(b"BUMPV5MD");
        f.extend_from_slice(&(m.len() as u64).to_le_bytes());
        f.extend_from_slice(&Sha256::digest(m));
    }
    f
}

#[test]
fn hand_built_headers_parse() {
    let data = [9u8; 40];
    for (v, meta) in [(4u32, None), (5, Some(&br#"{"a":1}"#[..]))] {
        let b = hand_built(v, &[0, 7, 13], &data, meta);
        let f = WeightsFile::from_bytes(&b).unwrap();
        let d = f.dims();
        assert_eq!(f.version().number(), v);
        assert_eq!(
            (
                d.model_type,
                d.num_layers,
                d.vocab_size,
                d.embed_dim,
                d.intermediate_size
            ),
            (1, 24, 151936, 896, Some(4864))
        );
        assert_eq!(
            (d.context_len, d.num_heads, d.num_kv_heads, d.head_dim),
            (8192, 14, Some(2), 64)
        );
        assert_eq!(
            (
                d.aligned_embed_dim,
                d.aligned_head_dim,
                d.aligned_intermediate,
                d.aligned_context
            ),
            (896, 64, Some(4864), 8192)
        );
        assert_eq!((d.num_merges, d.total_vocab_bytes), (Some(100), Some(200)));
        assert_eq!(f.dtype_table(), &[0, 7, 13]);
        assert_eq!(
            f.dtypes().collect::<Vec<_>>(),
            vec![Some(Dtype::F32), Some(Dtype::Q4_K), Some(Dtype::Q5_K)]
        );
        assert_eq!(f.tensor_data_start(), 159);
        assert_eq!(f.data_end(), 159 + 40);
        f.verify_checksum().unwrap();
        assert_eq!(&*f.range(159, 40).unwrap(), &data[..]);
        if v == 5 {
            assert_eq!(f.metadata_bytes().unwrap(), br#"{"a":1}"#);
        }
        // A C-Kernel-Engine-style manifest (packed, unaligned offsets) validates.
        let m = Manifest::from_map(
            "# ck-bumpwgt5-manifest-map v1\na|fp32|0x9F|0x10|0x9F\nb|q4_k|175|24|175\n",
        )
        .unwrap();
        f.check_manifest(m.clone(), CheckOptions::new()).unwrap();
        assert!(f.layout_report(&m).gaps.is_empty());
    }
}

#[test]
fn truncated_at_every_header_length() {
    for v in [4u32, 5] {
        let b = hand_built(
            v,
            &[0],
            &[1, 2, 3, 4],
            if v == 5 { Some(b"{}") } else { None },
        );
        for len in 0..b.len() {
            let r = WeightsFile::from_bytes(&b[..len]);
            match (len, r) {
                (
                    _,
                    Err(WeightsError::TruncatedHeader {
                        len: l,
                        needed: 156,
                    }),
                ) => {
                    assert!(len < 156, "len {len}: truncated beyond the header");
                    assert_eq!(l, len as u64);
                }
                // v4 past the table: parses; the checksum or manifest catches the loss.
                (_, Ok(f)) => {
                    assert_eq!(v, 4, "v5 truncated at {len} parsed");
                    assert!(len >= 157);
                    assert!(matches!(
                        f.verify_checksum(),
                        Err(WeightsError::BadChecksum { .. })
                    ));
                    let m = Manifest::from_map("t|fp32|0x9D|4|0x9D").unwrap();
                    assert!(matches!(
                        f.check_manifest(m, CheckOptions::new()),
                        Err(WeightsError::EntryOutsideFile { .. })
                    ));
                }
                (_, Err(WeightsError::DtypeTableOutOfBounds { table_len: 1, .. })) => {
                    assert_eq!(len, 156)
                }
                (
                    _,
                    Err(WeightsError::BadFooter { .. } | WeightsError::BadMetadataChecksum { .. }),
                ) => {
                    assert_eq!(v, 5)
                }
                (_, Err(e)) => panic!("len {len}: unexpected {e}"),
            }
        }
        WeightsFile::from_bytes(&b)
            .unwrap()
            .verify_checksum()
            .unwrap();
    }
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn truncated_written_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let rep = write_sample(dir.path(), Version::V5, 64);
    let b = std::fs::read(&rep.weights_path).unwrap();
    for len in 0..b.len() {
        assert!(
            WeightsFile::from_bytes(&b[..len]).is_err(),
            "v5 truncated to {len} accepted"
        );
    }
    let p = dir.path().join("short.bump");
    std::fs::write(&p, &b[..100]).unwrap();
    for open in OPENERS {
        assert!(matches!(
            open(&p),
            Err(WeightsError::TruncatedHeader {
                len: 100,
                needed: 156
            })
        ));
    }
    // Read with pread, every cut of the file fails too.
    for len in [0, 155, 156, 200, b.len() - 49, b.len() - 1] {
        std::fs::write(&p, &b[..len]).unwrap();
        assert!(WeightsFile::open(&p).is_err(), "v5 cut to {len} opened");
    }
}

#[test]
fn wrong_magic_and_unknown_version() {
    let mut b = hand_built(4, &[], &[], None);
    b[0] = b'X';
    assert!(
        matches!(WeightsFile::from_bytes(&b), Err(WeightsError::WrongMagic { found }) if &found == b"XUMPWGT4")
    );
    assert!(matches!(
        WeightsFile::from_bytes(b"GGUF\x03\0\0\0"),
        Err(WeightsError::WrongMagic { .. })
    ));

    let mut b = hand_built(4, &[], &[], None);
    b[8] = 5; // magic says 4, field says 5
    let e = WeightsFile::from_bytes(&b).unwrap_err();
    assert!(
        matches!(e, WeightsError::UnknownVersion { version: 5, .. }),
        "{e}"
    );
    b[7] = b'6';
    b[8] = 6;
    let e = WeightsFile::from_bytes(&b).unwrap_err();
    assert!(
        matches!(e, WeightsError::UnknownVersion { version: 6, magic } if &magic == b"BUMPWGT6")
    );
    assert!(e.to_string().contains("BUMPWGT6"), "{e}");
}

#[test]
fn bad_checksum_footer_and_table() {
    let mut b = hand_built(5, &[0], &[1, 2, 3, 4], Some(b"{\"x\":2}"));
    WeightsFile::from_bytes(&b)
        .unwrap()
        .verify_checksum()
        .unwrap();
    // A flipped tensor byte.
    b[158] ^= 1;
    let f = WeightsFile::from_bytes(&b).unwrap();
    let e = f.verify_checksum().unwrap_err();
    assert!(matches!(e, WeightsError::BadChecksum { expected, actual, .. } if expected != actual));
    b[158] ^= 1;
    // A flipped checksum byte in the header.
    b[100] ^= 0xFF;
    assert!(matches!(
        WeightsFile::from_bytes(&b).unwrap().verify_checksum(),
        Err(WeightsError::BadChecksum { .. })
    ));
    b[100] ^= 0xFF;
    // Metadata byte.
    let n = b.len();
    b[n - 50] ^= 1;
    assert!(matches!(
        WeightsFile::from_bytes(&b),
        Err(WeightsError::BadMetadataChecksum { .. })
    ));
    b[n - 50] ^= 1;
    // Footer magic.
    b[n - 48] = b'X';
    assert!(matches!(
        WeightsFile::from_bytes(&b),
        Err(WeightsError::BadFooter { .. })
    ));
    b[n - 48] = b'B';
    // Metadata length larger than the file / u64::MAX.
    for len in [1000u64, u64::MAX] {
        let mut c = b.clone();
        c[n - 40..n - 32].copy_from_slice(&len.to_le_bytes());
        assert!(
            matches!(
                WeightsFile::from_bytes(&c),
                Err(WeightsError::BadFooter { .. })
            ),
            "{len}"
        );
    }
    // Dtype table longer than the file.
    let mut c = b.clone();
    c[152..156].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        WeightsFile::from_bytes(&c),
        Err(WeightsError::DtypeTableOutOfBounds {
            table_len: u32::MAX,
            ..
        })
    ));
    // Nonzero reserved bytes are accepted and reported.
    let mut c = b.clone();
    c[130] = 1;
    assert!(
        WeightsFile::from_bytes(&c)
            .unwrap()
            .header()
            .reserved_nonzero
    );
    assert!(WeightsFile::from_bytes(&b)
        .unwrap()
        .verify_checksum()
        .is_ok());
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.bump");
    let empty = dir.path().join("empty.bump");
    std::fs::write(&empty, b"").unwrap();
    // The same errors whether the file is read with pread or mapped.
    for open in OPENERS {
        let e = open(&missing).unwrap_err();
        assert!(matches!(&e, WeightsError::Io { op: "open", path, .. } if path == &missing));
        assert!(e.to_string().contains("nope.bump"));
        assert!(std::error::Error::source(&e).is_some());
        assert!(matches!(
            open(dir.path()),
            Err(WeightsError::NotARegularFile { .. })
        ));
        assert!(matches!(
            open(&empty),
            Err(WeightsError::TruncatedHeader { len: 0, .. })
        ));
    }
}

#[test]
fn tensor_and_range_bounds() {
    let b = hand_built(5, &[0], &[1, 2, 3, 4], Some(b"{}"));
    let f = WeightsFile::from_bytes(&b).unwrap();
    assert!(f.range(0, b.len() as u64).is_ok());
    assert!(f.range(1, b.len() as u64).is_err());
    assert!(f.range(u64::MAX, 2).is_err());
    // Inside the file but outside tensor data (header, metadata): rejected by tensor().
    for (off, size) in [
        (0u64, 4u64),
        (150, 4),
        (156, 4),
        (f.data_end(), 1),
        (u64::MAX - 1, 4),
    ] {
        let e = ManifestEntry::new("t", "fp32", off, size).unwrap();
        let err = f.tensor(&e).unwrap_err();
        assert!(
            matches!(err, WeightsError::EntryOutsideFile { ref name, .. } if name == "t"),
            "{err}"
        );
    }
    assert_eq!(
        &*f.tensor(&ManifestEntry::new("t", "fp32", 157, 4).unwrap())
            .unwrap(),
        &[1, 2, 3, 4]
    );
    assert_eq!(
        &*f.tensor(&ManifestEntry::new("z", "fp32", 161, 0).unwrap())
            .unwrap(),
        &[] as &[u8]
    );
    // read_at: the same bounds (the whole file), filling the caller's buffer.
    let mut buf = [0u8; 4];
    f.read_at(157, &mut buf).unwrap();
    assert_eq!(buf, [1, 2, 3, 4]);
    assert!(matches!(
        f.read_at(b.len() as u64 - 3, &mut buf),
        Err(WeightsError::EntryOutsideFile { .. })
    ));
    assert!(f.read_at(u64::MAX - 1, &mut buf).is_err());
}

/// A `BUMPWGT4` file (layout L1, fp32 table slots, zero data) whose tensor
/// data is `[start, end)`: a file to check a manifest against.
fn file_with_tensor_data(start: u64, end: u64) -> WeightsFile {
    let table = vec![0u8; (start - 156) as usize];
    let data = vec![0u8; (end - start) as usize];
    let f = WeightsFile::from_vec(hand_built(4, &table, &data, None)).unwrap();
    assert_eq!((f.tensor_data_start(), f.data_end()), (start, end));
    f
}

fn check(f: &WeightsFile, m: &Manifest) -> Result<CheckedManifest, WeightsError> {
    f.check_manifest(m.clone(), CheckOptions::new())
}

#[test]
fn manifest_validation_errors() {
    let m = Manifest::from_map("a|fp32|0x100|0x10|0x100\nb|fp32|0x108|0x10|0x108\n").unwrap();
    let e = check(&file_with_tensor_data(0x100, 0x1000), &m).unwrap_err();
    assert!(
        matches!(&e, WeightsError::OverlappingEntries { first, second, overlap_start: 0x108, overlap_end: 0x110 }
            if first == "a" && second == "b"),
        "{e}"
    );
    let rep = file_with_tensor_data(0x100, 0x200).layout_report(&m);
    assert_eq!(rep.region, (0x100, 0x200));
    assert_eq!(rep.overlaps.len(), 1);
    assert!(!rep.is_clean());
    assert_eq!(rep.covered_bytes, 0x18);
    assert_eq!(rep.gaps.len(), 1);
    assert_eq!(
        (
            rep.gaps[0].start,
            rep.gaps[0].end,
            rep.gaps[0].after.as_deref()
        ),
        (0x118, 0x200, Some("b"))
    );
    assert_eq!(rep.gap_bytes(), 0xE8);

    let m = Manifest::from_map("a|fp32|0x100|0x10|0x100\n").unwrap();
    let e = check(&file_with_tensor_data(0x100, 0x10F), &m).unwrap_err();
    assert!(matches!(
        e,
        WeightsError::EntryOutsideFile {
            file_offset: 0x100,
            size: 0x10,
            region_start: 0x100,
            region_end: 0x10F,
            ..
        }
    ));
    check(&file_with_tensor_data(0x100, 0x110), &m).unwrap();
    // An entry whose end overflows u64 is outside any region.
    let m = Manifest::from_map("a|fp32|0xFFFFFFFFFFFFFFF0|0x20|0\n").unwrap();
    let f = file_with_tensor_data(0x100, 0x200);
    assert!(matches!(
        check(&f, &m),
        Err(WeightsError::EntryOutsideFile { .. })
    ));
    assert_eq!(f.layout_report(&m).outside, vec!["a".to_string()]);

    // Zero-size entries never overlap; contained entries do.
    let m = Manifest::from_map("a|u8|266|0|266\nb|u8|266|5|266\nc|u8|256|100|256\n").unwrap();
    let e = check(&file_with_tensor_data(256, 1256), &m).unwrap_err();
    assert!(
        matches!(&e, WeightsError::OverlappingEntries { first, second, .. } if first == "c" && second == "b")
    );

    // Runtime offsets.
    let m = Manifest::from_map("a|fp32|0x100|0x10|0x100\nb|fp32|0x110|0x10|0x2000\n").unwrap();
    let e = check(&file_with_tensor_data(0x100, 0x120), &m).unwrap_err();
    assert!(
        matches!(&e, WeightsError::RuntimeOffsetMismatch { name, file_offset: 0x110, runtime_offset: 0x2000 } if name == "b")
    );
    assert!(e.to_string().contains("0x2000"));

    // Unknown dtype.
    let m = Manifest::from_map("a|float128|0x100|0|0x100\n").unwrap();
    assert!(
        matches!(check(&file_with_tensor_data(0x100, 0x110), &m), Err(WeightsError::UnknownDtype { name }) if name == "float128")
    );
    // Display escapes control characters; the field keeps the raw text.
    let m = Manifest::from_map("a|fp\u{1b}[31m32\t|0x100|0|0x100\n").unwrap();
    let e = check(&file_with_tensor_data(0x100, 0x110), &m).unwrap_err();
    assert!(
        matches!(&e, WeightsError::UnknownDtype { name } if name == "fp\u{1b}[31m32\t"),
        "{e:?}"
    );
    let shown = e.to_string();
    assert!(!shown.contains(char::is_control), "{shown:?}");
    assert!(shown.contains(r"fp\u{1b}[31m32\t"), "{shown}");
    assert!(matches!(
        Dtype::from_name("Q4_K_M"),
        Err(WeightsError::UnknownDtype { .. })
    ));
    assert_eq!(Dtype::from_name("F32").unwrap(), Dtype::F32);
    assert_eq!(Dtype::from_name("float32").unwrap(), Dtype::F32);
    assert_eq!("I64".parse::<Dtype>().unwrap(), Dtype::I64);

    // Duplicate names.
    assert!(matches!(
        Manifest::from_map("a|fp32|0|4|0\na|fp32|4|4|4\n"),
        Err(WeightsError::DuplicateTensor { name }) if name == "a"
    ));
}

#[test]
fn corrupt_map_manifests() {
    let cases: &[(&str, usize)] = &[
        ("a|fp32|0|4\n", 1),
        ("# c\n\na|fp32|0|4|0|extra\n", 3),
        ("a|fp32|0x|4|0\n", 1),
        ("a|fp32|0x10|4|zz\n", 1),
        ("a|fp32|010|4|10\n", 1),
        ("a|fp32|-1|4|0\n", 1),
        ("a|fp32|0x1FFFFFFFFFFFFFFFF|4|0\n", 1),
        ("|fp32|0|4|0\n", 1),
        ("a||0|4|0\n", 1),
        ("ok|fp32|0|4|0\r\nbad line\r\n", 2),
    ];
    for (text, line) in cases {
        match Manifest::from_map(text) {
            Err(WeightsError::ManifestSyntax {
                kind: ManifestKind::Map,
                line: l,
                message,
            }) => {
                assert_eq!(l, *line, "{text:?}: {message}")
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    // CRLF, comments, blank lines and decimal numbers are fine.
    let m =
        Manifest::from_map("# ck-bumpwgt4-manifest-map v1\r\n\r\na|fp32|16|4|0x10\r\n").unwrap();
    assert_eq!(m.get("a").unwrap().file_offset, 16);
    assert!(Manifest::from_map("").unwrap().is_empty());
}

#[test]
fn corrupt_json_manifests() {
    let cases = [
        "",
        "not json",
        "[]",
        "{}",
        r#"{"entries": {}}"#,
        r#"{"entries": [{"name": "a", "dtype": "fp32", "size": 4}]}"#,
        r#"{"entries": [{"name": "a", "dtype": "fp32", "file_offset": -1, "size": 4}]}"#,
        r#"{"entries": [{"name": "a", "dtype": "fp32", "file_offset": 1.5, "size": 4}]}"#,
        r#"{"entries": [{"name": "a", "dtype": "fp32", "file_offset": "0xZZ", "size": 4}]}"#,
        r#"{"entries": [{"name": "a", "dtype": 3, "file_offset": 0, "size": 4}]}"#,
        r#"{"entries": [{"name": "", "dtype": "fp32", "file_offset": 0, "size": 4}]}"#,
        r#"{"entries": [{"name": "a", "dtype": "fp32", "file_offset": 0, "size": 4, "shape": [-1]}]}"#,
    ];
    for text in cases {
        match Manifest::from_json(text) {
            Err(WeightsError::ManifestSyntax {
                kind: ManifestKind::Json,
                ..
            }) => {}
            other => panic!("{text:?}: {other:?}"),
        }
    }
    // A number of another type names its entry and field; a type error
    // elsewhere in an entry names the entry's index.
    for value in ["-1", "1.5", "true", "null", "[1]"] {
        let text = format!(
            r#"{{"entries": [{{"name": "a", "dtype": "fp32", "file_offset": {value}, "size": 4}}]}}"#
        );
        let e = Manifest::from_json(&text).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "entry \"a\" file_offset: {value} is neither an unsigned integer"
            )),
            "{e}"
        );
    }
    let e = Manifest::from_json(
        r#"{"entries": [{"name": "a", "dtype": "fp32", "file_offset": 0, "size": 4},
                        {"name": "b", "dtype": "fp32", "file_offset": 4, "size": 4, "shape": [-1]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("entry 1: "), "{e}");
    // C-Kernel-Engine style: extra keys, "offset" alias, hex strings, runtime_offset.
    let m = Manifest::from_json(
        r#"{"version": 5, "bump_layout": {"data_start": 152}, "template": {},
            "entries": [{"name": "token_emb", "dtype": "q4_k", "offset": 160, "size": "0x20"},
                        {"name": "x", "dtype": "fp32", "file_offset": "192", "size": 4, "runtime_offset": 4096}]}"#,
    )
    .unwrap();
    assert_eq!(m.get("token_emb").unwrap().size, 32);
    assert_eq!(m.get("token_emb").unwrap().runtime_offset, 160);
    assert_eq!(m.get("x").unwrap().runtime_offset, 4096);
    assert!(matches!(
        check(&file_with_tensor_data(160, 196), &m),
        Err(WeightsError::RuntimeOffsetMismatch { name, file_offset: 192, runtime_offset: 4096 }) if name == "x"
    ));
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn sidecar_loading() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Manifest::load_sidecars(dir.path()),
        Err(WeightsError::MissingSidecars { .. })
    ));
    let rep = write_sample(dir.path(), Version::V4, 64);
    // Only the map: no shapes.
    std::fs::rename(&rep.manifest_json_path, dir.path().join("j")).unwrap();
    let m = Manifest::load_sidecars(dir.path()).unwrap();
    assert!(m.iter().all(|e| e.shape.is_none()));
    std::fs::rename(dir.path().join("j"), &rep.manifest_json_path).unwrap();
    // Disagreeing sidecars.
    let text = std::fs::read_to_string(&rep.manifest_map_path).unwrap();
    let first = rep.manifest.iter().next().unwrap();
    let needle = format!("|0x{:016X}|", first.size);
    let bad = text.replacen(&needle, &format!("|0x{:016X}|", first.size + 1), 1);
    assert_ne!(bad, text);
    std::fs::write(&rep.manifest_map_path, &bad).unwrap();
    let e = Manifest::load_sidecars(dir.path()).unwrap_err();
    assert!(
        matches!(&e, WeightsError::SidecarMismatch { name, .. } if *name == first.name),
        "{e}"
    );
    // Every field must agree as written: a dtype spelled in another case
    // (the same dtype to `Dtype::from_name`) is a mismatch, and so is a
    // runtime offset the JSON does not have (it defaults to the file offset).
    let line = format!(
        "{}|{}|0x{:016X}|0x{:016X}|0x{:016X}",
        first.name, first.dtype, first.file_offset, first.size, first.runtime_offset
    );
    assert!(text.contains(&line), "{text}");
    assert_eq!(
        Dtype::from_name(&first.dtype.to_uppercase()).unwrap(),
        first.parsed_dtype().unwrap()
    );
    let upper = format!(
        "{}|{}|0x{:016X}|0x{:016X}|0x{:016X}",
        first.name,
        first.dtype.to_uppercase(),
        first.file_offset,
        first.size,
        first.runtime_offset
    );
    let moved = format!(
        "{}|{}|0x{:016X}|0x{:016X}|0x{:016X}",
        first.name,
        first.dtype,
        first.file_offset,
        first.size,
        first.runtime_offset + 0x1000
    );
    for (bad, field) in [(upper, "dtype"), (moved, "runtime_offset")] {
        std::fs::write(&rep.manifest_map_path, text.replacen(&line, &bad, 1)).unwrap();
        let e = Manifest::load_sidecars(dir.path()).unwrap_err();
        assert!(
            matches!(&e, WeightsError::SidecarMismatch { name, reason } if *name == first.name && reason.contains(field)),
            "{field}: {e}"
        );
    }
    std::fs::write(&rep.manifest_map_path, &text).unwrap();
    Manifest::load_sidecars(dir.path()).unwrap();
    let fewer: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    std::fs::write(&rep.manifest_map_path, fewer).unwrap();
    assert!(matches!(
        Manifest::load_sidecars(dir.path()),
        Err(WeightsError::SidecarMismatch { .. })
    ));
    std::fs::write(&rep.manifest_map_path, "garbage\n").unwrap();
    assert!(matches!(
        Manifest::load_sidecars(dir.path()),
        Err(WeightsError::ManifestSyntax { .. })
    ));
}

/// The sample's entries with "odd.u8" typed i8, which the table codes as u8.
fn retyped(entries: &[ManifestEntry]) -> Vec<ManifestEntry> {
    entries
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if e.name == "odd.u8" {
                e.dtype = "i8".into();
            }
            e
        })
        .collect()
}

/// Rule 9 of `check_manifest`: the dtype table of a file ckalloc wrote holds
/// one code per entry, in file order, each the code of the entry's dtype.
/// What names ckalloc as the writer is the v5 metadata's `created_by` or the
/// JSON manifest's `generator`.
#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn dtype_table_check() {
    let table_mismatch = |f: &WeightsFile, m: Manifest| {
        let r = f.check_manifest(m, CheckOptions::new());
        assert!(
            matches!(r, Err(WeightsError::DtypeTableMismatch { .. })),
            "{r:?}"
        );
    };
    // BUMPWGT5: the metadata's created_by names ckalloc.
    let dir = tempfile::tempdir().unwrap();
    let rep = write_sample(dir.path(), Version::V5, 64);
    let f = WeightsFile::open(&rep.weights_path).unwrap();
    assert!(f.created_by().unwrap().starts_with("ckalloc"));
    let entries = rep.manifest.entries();
    table_mismatch(&f, Manifest::from_entries(retyped(entries)).unwrap());
    table_mismatch(&f, Manifest::from_entries(entries[..2].to_vec()).unwrap());

    // BUMPWGT4: the JSON manifest's generator names ckalloc.
    let dir = tempfile::tempdir().unwrap();
    let rep = write_sample(dir.path(), Version::V4, 64);
    let f = WeightsFile::open(&rep.weights_path).unwrap();
    let json = |edit: &dyn Fn(&mut Vec<serde_json::Value>)| {
        let text = std::fs::read_to_string(&rep.manifest_json_path).unwrap();
        let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(doc["entries"].as_array_mut().unwrap());
        let m = Manifest::from_json(&doc.to_string()).unwrap();
        assert!(m.generator().unwrap().starts_with("ckalloc"));
        m
    };
    let checked = f
        .check_manifest(json(&|_| {}), CheckOptions::new())
        .unwrap();
    assert_eq!(checked.dtype_table(), &DtypeTableCheck::Checked);
    table_mismatch(
        &f,
        json(&|es| {
            for e in es.iter_mut().filter(|e| e["name"] == "odd.u8") {
                e["dtype"] = "i8".into();
            }
        }),
    );
    table_mismatch(&f, json(&|es| es.truncate(2)));

    // Nothing names the writer (a BUMPWGT4 file, entries built in memory):
    // the table is a hint, the difference a note, and a table with one slot
    // per entry that disagrees a warning, refused under `strict`.
    let entries = rep.manifest.entries();
    let m = Manifest::from_entries(retyped(entries)).unwrap();
    let checked = f.check_manifest(m.clone(), CheckOptions::new()).unwrap();
    let DtypeTableCheck::Hint { note: Some(note) } = checked.dtype_table() else {
        panic!("{:?}", checked.dtype_table());
    };
    assert!(
        note.contains("1 slot code(s) differ") && note.contains("odd.u8"),
        "{note}"
    );
    assert!(
        checked
            .warnings()
            .iter()
            .any(|w| matches!(w, ManifestWarning::UnprotectedDtypeTable { .. })),
        "{:?}",
        checked.warnings()
    );
    assert!(matches!(
        f.check_manifest(m, CheckOptions::new().strict(true)),
        Err(WeightsError::DtypeTableMismatch { .. })
    ));
    let m = Manifest::from_entries(entries[..2].to_vec()).unwrap();
    let checked = f.check_manifest(m, CheckOptions::new()).unwrap();
    assert!(
        matches!(checked.dtype_table(), DtypeTableCheck::Hint { note: Some(n) } if n.starts_with("table has 6 slots, manifest 2 entries")),
        "{:?}",
        checked.dtype_table()
    );
}

/// Rule 10 of `check_manifest`: the header's model fields, which no
/// checksum covers, agree with themselves and with the v5 metadata's
/// `config`; a disagreement is a warning naming both values, refused under
/// `strict`.
#[test]
#[cfg_attr(miri, ignore)] // file system
fn header_fields_agree_with_the_metadata() {
    let header_dims = |w: &ManifestWarning| match w {
        ManifestWarning::HeaderDims { reason } => Some(reason.clone()),
        _ => None,
    };
    for version in [Version::V4, Version::V5] {
        let dir = tempfile::tempdir().unwrap();
        let rep = write_sample(dir.path(), version, 64);
        let bytes = std::fs::read(&rep.weights_path).unwrap();
        // The JSON sidecar's manifest, which the v5 metadata's hash binds.
        let json = std::fs::read_to_string(&rep.manifest_json_path).unwrap();
        let manifest = Manifest::from_json(&json).unwrap();
        let check = |b: &[u8], options| {
            WeightsFile::from_vec(b.to_vec())
                .unwrap()
                .check_manifest(manifest.clone(), options)
        };
        let reasons = |b: &[u8]| -> Vec<String> {
            let checked = check(b, CheckOptions::new()).unwrap();
            checked.warnings().iter().filter_map(header_dims).collect()
        };
        assert!(reasons(&bytes).is_empty(), "{version:?}");

        // aligned_embed_dim (offset 48, u64) below embed_dim (384).
        let mut b = bytes.clone();
        b[48..56].copy_from_slice(&383u64.to_le_bytes());
        let r = reasons(&b);
        assert!(
            r.len() == 1 && r[0].contains("aligned_embed_dim 383 is less than embed_dim 384"),
            "{version:?}: {r:?}"
        );

        // num_layers (offset 16): 2 in the metadata's config, 66 in the header.
        let mut b = bytes.clone();
        b[16..20].copy_from_slice(&66u32.to_le_bytes());
        let r = reasons(&b);
        if version == Version::V5 {
            assert_eq!(
                r,
                ["num_layers 66 in the header, 2 in the v5 metadata's config"],
                "{version:?}"
            );
            let e = check(&b, CheckOptions::new().strict(true)).unwrap_err();
            assert!(
                matches!(&e, WeightsError::HeaderDimsMismatch { reason } if reason.contains("num_layers 66")),
                "{e:?}"
            );
        } else {
            // A BUMPWGT4 file records its dims nowhere else.
            assert!(r.is_empty(), "{r:?}");
        }
    }
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = WeightsWriter::new(Version::V4);
    for a in [0u64, 3, 48, 1 << 31, u64::MAX] {
        assert!(
            matches!(w.alignment(a), Err(WeightsError::InvalidAlignment { alignment }) if alignment == a)
        );
    }
    w.alignment(1 << 30).unwrap();
    for name in ["", "a|b", "a\nb", "#x", "a\rb"] {
        assert!(
            matches!(
                w.add_tensor(name, Dtype::U8, vec![1]),
                Err(WeightsError::InvalidTensorName { .. })
            ),
            "{name:?}"
        );
    }
    assert!(matches!(
        w.add_tensor("n".repeat(MAX_NAME_LEN + 1), Dtype::U8, vec![1]),
        Err(WeightsError::InvalidTensorName { .. })
    ));
    w.add_tensor("x", Dtype::U8, vec![1]).unwrap();
    assert!(matches!(
        w.add_tensor("x", Dtype::U8, vec![1]),
        Err(WeightsError::DuplicateTensor { .. })
    ));
    let e = w
        .add_tensor_with_shape("y", Dtype::F32, &[2, 3], vec![0u8; 20])
        .unwrap_err();
    assert!(matches!(
        e,
        WeightsError::ShapeMismatch {
            expected_bytes: 24,
            actual_bytes: 20,
            ..
        }
    ));
    assert!(matches!(
        w.add_tensor_with_shape("y", Dtype::F32, &[u64::MAX, 2], vec![]),
        Err(WeightsError::SizeOverflow { .. })
    ));
    // Block and packed types: shape not checked against bytes.
    w.add_tensor_with_shape("q", Dtype::Q4_0, &[32], vec![0u8; 18])
        .unwrap();
    w.add_tensor_with_shape("f4", Dtype::F4, &[3], vec![0u8; 2])
        .unwrap();
    assert_eq!(w.tensor_count(), 3);
    // 1 GiB alignment: offsets are planned, not written.
    let plan = w.plan().unwrap();
    assert_eq!(plan.weights_base, 1 << 30);
    assert_eq!(plan.data_end, 4 << 30);
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn failed_write_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir");
    let mut w = WeightsWriter::new(Version::V5);
    w.add_tensor("a", Dtype::F32, vec![0u8; 4]).unwrap();
    let e = w.write_dir(&missing).unwrap_err();
    assert!(
        matches!(&e, WeightsError::Io { path, .. } if path.starts_with(&missing)),
        "{e}"
    );
    // A directory where the final file should go: the rename fails, temp files are removed.
    std::fs::create_dir(dir.path().join(WEIGHTS_FILE)).unwrap();
    let e = w.write_dir(dir.path()).unwrap_err();
    assert!(matches!(e, WeightsError::Io { op: "rename", .. }), "{e}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from(WEIGHTS_FILE)],
        "{left:?}"
    );
}

/// A sidecar name held by a directory fails the write before any name is
/// placed: the previous `weights.bump` and map stay as they were.
#[test]
#[cfg_attr(miri, ignore)] // file system
fn a_directory_at_a_sidecar_name_fails_before_any_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    write_sample(dir.path(), Version::V5, 64);
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let (bump, map) = (read(WEIGHTS_FILE), read(MANIFEST_MAP));
    for name in [MANIFEST_JSON, MANIFEST_MAP] {
        let p = dir.path().join(name);
        let saved = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        let mut w = WeightsWriter::new(Version::V4);
        w.add_tensor("other", Dtype::U8, vec![9u8; 100]).unwrap();
        let e = w.write_dir(dir.path()).unwrap_err();
        assert!(
            matches!(&e, WeightsError::Io { path, op: "rename", .. } if *path == p),
            "{e}"
        );
        assert_eq!(read(WEIGHTS_FILE), bump, "{name}: weights.bump replaced");
        if name != MANIFEST_MAP {
            assert_eq!(read(MANIFEST_MAP), map, "{name}: map replaced");
        }
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|d| d.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [WEIGHTS_FILE, MANIFEST_JSON, MANIFEST_MAP], "{name}");
        std::fs::remove_dir(&p).unwrap();
        std::fs::write(&p, saved).unwrap();
    }
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn progress_is_monotonic_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![7u8; 9 << 20];
    let mut w = WeightsWriter::new(Version::V5);
    w.add_tensor("big", Dtype::U8, &big[..]).unwrap();
    w.add_tensor("small", Dtype::U8, &big[..3]).unwrap();
    let mut calls = Vec::new();
    let rep = w
        .write_dir_with_progress(dir.path(), |d, t| calls.push((d, t)))
        .unwrap();
    assert!(calls.len() >= 4, "{calls:?}");
    assert_eq!(calls[0], (0, rep.file_len));
    assert_eq!(*calls.last().unwrap(), (rep.file_len, rep.file_len));
    assert!(calls
        .windows(2)
        .all(|p| p[0].0 <= p[1].0 && p[0].1 == p[1].1));
    let f = WeightsFile::open(&rep.weights_path).unwrap();
    let mut vcalls = Vec::new();
    f.verify_checksum_with(|d, t| vcalls.push((d, t))).unwrap();
    assert_eq!(vcalls.last().unwrap().0, f.data_end() - 152);
}

#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn no_tensors() {
    for v in [Version::V4, Version::V5] {
        let dir = tempfile::tempdir().unwrap();
        let rep = WeightsWriter::new(v).write_dir(dir.path()).unwrap();
        assert_eq!(rep.weights_base, rep.data_end);
        assert_eq!(rep.data_end, 192);
        let f = WeightsFile::open(&rep.weights_path).unwrap();
        f.verify_checksum().unwrap();
        assert!(Manifest::load_sidecars(dir.path()).unwrap().is_empty());
    }
}

#[test]
fn config_json_dims() {
    // all-MiniLM-L6-v2's config.json (abridged).
    let cfg = r#"{"architectures": ["BertModel"], "hidden_size": 384, "intermediate_size": 1536,
        "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
        "num_hidden_layers": 6, "vocab_size": 30522, "layer_norm_eps": 1e-12}"#;
    let d = ModelDims::from_config_json(cfg).unwrap();
    assert_eq!(
        (
            d.num_layers,
            d.embed_dim,
            d.intermediate_size,
            d.context_len
        ),
        (6, 384, 1536, 512)
    );
    assert_eq!(
        (
            d.num_heads,
            d.num_kv_heads,
            d.head_dim,
            d.vocab_size,
            d.model_type
        ),
        (12, 12, 32, 30522, 1)
    );
    assert_eq!(
        (d.aligned_embed_dim, d.aligned_head_dim, d.aligned_context),
        (384, 32, 512)
    );
    let d = ModelDims::from_config_json(
        r#"{"hidden_size": 10, "num_attention_heads": 2, "head_dim": 5}"#,
    )
    .unwrap();
    assert_eq!(
        (d.aligned_embed_dim, d.head_dim, d.aligned_head_dim),
        (16, 5, 16)
    );
    assert!(matches!(
        ModelDims::from_config_json(r#"{"hidden_size": -3}"#),
        Err(WeightsError::ConfigField { field, .. }) if field == "hidden_size"
    ));
    assert!(matches!(
        ModelDims::from_config_json(r#"{"vocab_size": 5000000000}"#),
        Err(WeightsError::ConfigField { .. })
    ));
    assert!(matches!(
        ModelDims::from_config_json("[1]"),
        Err(WeightsError::ConfigField { .. })
    ));
    assert!(matches!(
        ModelDims::from_config_json("{"),
        Err(WeightsError::Json { .. })
    ));
}

#[test]
fn canonical_json_matches_python() {
    // json.dumps({"b": [1, {"z": null, "a": "\u00e9\U0001F600\x7f"}], "a": true},
    //            sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    let v = serde_json::json!({"b": [1, {"z": null, "a": "\u{e9}\u{1F600}\u{7f}\n\""}], "a": true});
    assert_eq!(
        String::from_utf8(canonical_json(&v)).unwrap(),
        r#"{"a":true,"b":[1,{"a":"\u00e9\ud83d\ude00\u007f\n\"","z":null}]}"#
    );
    // Floats as Python's repr spells them (json.dumps of the same values).
    let v: serde_json::Value = serde_json::from_str(
        r#"{"t": 10000.0, "eps": 1e-5, "p": 0.0001, "big": 1e16,
            "x": [0.1, 1.5e300, -2.5e-7, 123456789012345.6]}"#,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(canonical_json(&v)).unwrap(),
        r#"{"big":1e+16,"eps":1e-05,"p":0.0001,"t":10000.0,"x":[0.1,1.5e+300,-2.5e-07,123456789012345.6]}"#
    );
}

/// Rule 1 of `check_manifest`: the v5 metadata's `manifest_hash` binds the
/// JSON sidecar (in canonical form) to the file.
#[test]
#[cfg_attr(miri, ignore)] // file system
fn manifest_hash_binds_the_json_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let rep = write_sample(dir.path(), Version::V5, 64);
    let f = WeightsFile::open(&rep.weights_path).unwrap();
    let bound = CheckOptions::new().require_manifest_hash(true);
    let checked = f
        .check_manifest(f.load_manifest(dir.path()).unwrap(), bound)
        .unwrap();
    assert_eq!(checked.binding(), ManifestBinding::ManifestHash);
    assert_eq!(checked.path(), Some(rep.weights_path.as_path()));

    // Whitespace and key order are not part of the canonical form.
    let text = std::fs::read_to_string(&rep.manifest_json_path).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    std::fs::write(&rep.manifest_json_path, doc.to_string()).unwrap();
    f.check_manifest(f.load_manifest(dir.path()).unwrap(), bound)
        .unwrap();

    // Any other edit (here the manifest's alignment, with the map agreeing
    // on every entry) breaks the binding.
    let mut edited = doc.clone();
    edited["alignment"] = 32.into();
    std::fs::write(&rep.manifest_json_path, edited.to_string()).unwrap();
    let m = f.load_manifest(dir.path()).unwrap();
    assert_eq!(m, rep.manifest);
    let e = f.check_manifest(m, CheckOptions::new()).unwrap_err();
    assert!(
        matches!(&e, WeightsError::ManifestHashMismatch { sidecar, recorded, computed }
            if *sidecar == rep.manifest_json_path
                && Some(recorded.as_str()) == f.metadata_json().unwrap()["manifest_hash"].as_str()
                && Sha256::digest(canonical_json(&edited))[..] == computed[..]),
        "{e}"
    );

    // The map alone: nothing to compare the hash with, a warning, refused
    // by `strict` and by `require_manifest_hash`.
    std::fs::remove_file(&rep.manifest_json_path).unwrap();
    let m = f.load_manifest(dir.path()).unwrap();
    let checked = f.check_manifest(m.clone(), CheckOptions::new()).unwrap();
    assert_eq!(checked.binding(), ManifestBinding::HashUnchecked);
    assert_eq!(
        checked.warnings(),
        &[ManifestWarning::ManifestHashUnchecked]
    );
    for options in [CheckOptions::new().strict(true), bound] {
        assert!(matches!(
            f.check_manifest(m.clone(), options),
            Err(WeightsError::ManifestNotBound {
                binding: ManifestBinding::HashUnchecked
            })
        ));
    }

    // BUMPWGT4 records no hash: never bound.
    let dir = tempfile::tempdir().unwrap();
    let rep = write_sample(dir.path(), Version::V4, 64);
    let f = WeightsFile::open(&rep.weights_path).unwrap();
    let m = f.load_manifest(dir.path()).unwrap();
    let checked = f.check_manifest(m.clone(), CheckOptions::new()).unwrap();
    assert!(matches!(checked.binding(), ManifestBinding::Unbound { .. }));
    assert!(matches!(
        f.check_manifest(m, bound),
        Err(WeightsError::ManifestNotBound {
            binding: ManifestBinding::Unbound { .. }
        })
    ));
}

/// Every hash the v5 metadata records is checked when the file is opened:
/// `template_hash` against the canonical `template`, and both hashes must be
/// 64 lowercase hex digits; the metadata must be a JSON object.
#[test]
fn metadata_hashes_are_verified_on_open() {
    let open = |meta: &serde_json::Value| {
        WeightsFile::from_vec(hand_built(5, &[], &[], Some(&canonical_json(meta))))
    };
    let template = serde_json::json!({"name": "llama", "eps": 1e-05, "rope": 10000.0});
    let hash = format!("{:x}", Sha256::digest(canonical_json(&template)));
    let good = serde_json::json!({"template": template, "template_hash": hash});
    let f = open(&good).unwrap();
    assert_eq!(f.metadata_json().unwrap()["template_hash"], hash);

    // The template edited, the metadata's own hash (the footer) recomputed.
    let mut edited = good.clone();
    edited["template"]["eps"] = 1e-6.into();
    assert!(matches!(
        open(&edited),
        Err(WeightsError::TemplateHashMismatch { recorded, .. }) if recorded == hash
    ));
    // A hash recorded for no template; hashes that are not 64 lowercase hex.
    for bad in [
        serde_json::json!({"template_hash": hash}),
        serde_json::json!({"template": template, "template_hash": hash.to_uppercase()}),
        serde_json::json!({"manifest_hash": "abc"}),
        serde_json::json!({"manifest_hash": 5}),
        serde_json::json!([1, 2]),
    ] {
        let e = open(&bad).unwrap_err();
        assert!(
            matches!(e, WeightsError::BadMetadata { .. }),
            "{bad}: {e:?}"
        );
    }
}

/// A file read with `pread` that another process truncates while it is
/// hashed gives `FileChanged` (where a mapping would raise `SIGBUS`). The
/// truncation happens from the progress hook, after the first 8 MiB chunk.
#[test]
#[cfg_attr(miri, ignore)] // file system
fn a_file_truncated_while_hashed_is_file_changed() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![7u8; 24 << 20];
    let mut w = WeightsWriter::new(Version::V4);
    w.add_tensor("big", Dtype::U8, &big[..]).unwrap();
    let report = w.write_dir(dir.path()).unwrap();
    let f = WeightsFile::open(&report.weights_path).unwrap();
    assert!(!f.is_mapped());
    f.verify_checksum().unwrap();
    let mut calls = 0;
    let e = f
        .verify_checksum_with(|done, _| {
            calls += 1;
            if done > 0 && calls == 2 {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&report.weights_path)
                    .unwrap();
                file.set_len(1 << 20).unwrap();
            }
        })
        .unwrap_err();
    assert!(
        matches!(&e, WeightsError::FileChanged { opened_len, now_len: Some(1048576), offset, .. }
            if *opened_len == report.file_len && *offset > 1 << 20),
        "{e:?}"
    );
    // Reads after the truncation fail the same way; nothing panics.
    let entry = report.manifest.get("big").unwrap();
    assert!(matches!(
        f.tensor(entry),
        Err(WeightsError::FileChanged { .. })
    ));
    let mut buf = [0u8; 16];
    assert!(matches!(
        f.read_at(report.file_len - 16, &mut buf),
        Err(WeightsError::FileChanged { .. })
    ));
    // A file that grows while hashed: the bytes hashed are intact, but the
    // length is not the one parsed.
    let f = WeightsFile::open(&report.weights_path).unwrap();
    let e = f
        .verify_checksum_with(|done, total| {
            if done == total {
                let file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&report.weights_path)
                    .unwrap();
                std::io::Write::write_all(&mut &file, b"more").unwrap();
            }
        })
        .unwrap_err();
    assert!(matches!(e, WeightsError::FileChanged { .. }), "{e:?}");
}

/// The writer's name rule holds for every reader and constructor, so a
/// manifest always survives a `.map` round trip unchanged.
#[test]
fn names_the_writer_forbids_are_refused_by_every_reader() {
    let j = r#"{"entries":[{"name":"evil|fp32|0x100|0x4|0x100\n#","dtype":"fp32","file_offset":512,"size":64}]}"#;
    assert!(matches!(
        Manifest::from_json(j),
        Err(WeightsError::InvalidTensorName { .. })
    ));
    for name in ["a|b", "a\nb", "a\rb", "a\0b", "#a", "", &"x".repeat(1025)] {
        assert!(
            matches!(
                ManifestEntry::new(name, "fp32", 256, 4),
                Err(WeightsError::InvalidTensorName { .. })
            ),
            "{name:?}"
        );
        let json = serde_json::json!({"entries": [{"name": name, "dtype": "fp32", "file_offset": 256, "size": 4}]});
        assert!(Manifest::from_json(&json.to_string()).is_err(), "{name:?}");
    }
    let mut e = ManifestEntry::new("ok", "fp32", 256, 4).unwrap();
    e.name = "x\n  sha256 0000 (verified)".into();
    assert!(matches!(
        Manifest::from_entries(vec![e]),
        Err(WeightsError::InvalidTensorName { .. })
    ));
    // A dtype a .map line cannot hold is refused too.
    let j = r#"{"entries":[{"name":"t","dtype":"fp32|0x0","file_offset":512,"size":64}]}"#;
    assert!(matches!(
        Manifest::from_json(j),
        Err(WeightsError::ManifestSyntax {
            kind: ManifestKind::Json,
            ..
        })
    ));
    // The longest allowed name round-trips.
    let long = "n".repeat(MAX_NAME_LEN);
    let m = Manifest::from_entries(vec![
        ManifestEntry::new(long.clone(), "fp32", 256, 4).unwrap()
    ])
    .unwrap();
    let back = Manifest::from_map(&m.to_map_string(Version::V5)).unwrap();
    assert_eq!(back, m);
}

/// Rule 7 and the warnings: no entries over tensor data, and gaps wider than
/// the file's alignment (the alignment the JSON records, else 64 bytes).
#[test]
fn empty_manifests_and_wide_gaps() {
    let f = file_with_tensor_data(0x100, 0x200);
    assert!(matches!(
        check(&f, &Manifest::default()),
        Err(WeightsError::EmptyManifest {
            region: (0x100, 0x200),
            allowed: 64
        })
    ));
    // Within the allowed padding an empty manifest is fine.
    let small = file_with_tensor_data(0x100, 0x140);
    check(&small, &Manifest::default()).unwrap();

    // 0x40 bytes at the start (allowed), 0x60 between (too wide), none at the end.
    let m = Manifest::from_entries(vec![
        ManifestEntry::new("a", "u8", 0x140, 0x20).unwrap(),
        ManifestEntry::new("b", "u8", 0x1c0, 0x40).unwrap(),
    ])
    .unwrap();
    let c = check(&f, &m).unwrap();
    assert_eq!(c.warnings().len(), 1, "{:?}", c.warnings());
    assert!(matches!(
        &c.warnings()[0],
        ManifestWarning::WideGap { gap, allowed: 64 } if (gap.start, gap.end) == (0x160, 0x1c0)
            && gap.after.as_deref() == Some("a")
    ));
    let e = f
        .check_manifest(m.clone(), CheckOptions::new().strict(true))
        .unwrap_err();
    assert!(
        matches!(
            e,
            WeightsError::WideGap {
                range: (0x160, 0x1c0),
                allowed: 64,
                ..
            }
        ),
        "{e:?}"
    );
    // A JSON that records a 256-byte alignment the offsets keep allows a
    // 96-byte gap; a recorded alignment the offsets do not keep (here 1 GiB)
    // allows nothing beyond the default 64 bytes.
    let f3 = file_with_tensor_data(0x100, 0x300);
    let doc = |alignment: u64| {
        serde_json::json!({"alignment": alignment, "entries": [
            {"name": "a", "dtype": "u8", "file_offset": 0x100, "size": 0xa0},
            {"name": "b", "dtype": "u8", "file_offset": 0x200, "size": 0x100},
        ]})
        .to_string()
    };
    let m = Manifest::from_json(&doc(256)).unwrap();
    assert_eq!(m.alignment(), Some(256));
    let c = f3
        .check_manifest(m, CheckOptions::new().strict(true))
        .unwrap();
    assert!(c.warnings().is_empty());
    let m = Manifest::from_json(&doc(1 << 30)).unwrap();
    assert!(matches!(
        f3.check_manifest(m, CheckOptions::new().strict(true)),
        Err(WeightsError::WideGap {
            range: (0x1a0, 0x200),
            allowed: 64,
            ..
        })
    ));
    // A BUMPWGT4 file records no manifest hash: require_manifest_hash refuses it.
    let m =
        Manifest::from_entries(vec![ManifestEntry::new("a", "u8", 0x100, 0x100).unwrap()]).unwrap();
    assert!(matches!(
        check(&f, &m).unwrap().binding(),
        ManifestBinding::Unbound { .. }
    ));
    assert!(matches!(
        f.check_manifest(m, CheckOptions::new().require_manifest_hash(true)),
        Err(WeightsError::ManifestNotBound {
            binding: ManifestBinding::Unbound { .. }
        })
    ));
}

/// What the readers refuse beyond syntax: a JSON manifest that is not an
/// object, a sidecar too large to be a manifest, and a tensor whose shape
/// cannot be checked because its dtype is unknown.
#[test]
#[cfg_attr(miri, ignore)] // file system
fn readers_refuse_arrays_huge_sidecars_and_unchecked_shapes() {
    for doc in [
        "[]",
        r#"[[["a","fp32",256,4,null,null]],null,null,64]"#,
        "5",
        "null",
    ] {
        assert!(
            matches!(
                Manifest::from_json(doc),
                Err(WeightsError::ManifestSyntax {
                    kind: ManifestKind::Json,
                    ..
                })
            ),
            "{doc}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let big = std::fs::File::create(dir.path().join(MANIFEST_MAP)).unwrap();
    big.set_len(MAX_SIDECAR_BYTES + 1).unwrap(); // sparse: no disk space used
    assert!(matches!(
        Manifest::load_sidecars(dir.path()),
        Err(WeightsError::SidecarTooLarge { len, max: MAX_SIDECAR_BYTES, .. }) if len == MAX_SIDECAR_BYTES + 1
    ));
    let f = file_with_tensor_data(0x100, 0x200);
    let mut e = ManifestEntry::new("x", "nonsense", 0x100, 1).unwrap();
    e.shape = Some(vec![1_000_000]);
    assert!(matches!(
        f.tensor(&e),
        Err(WeightsError::UnknownDtype { .. })
    ));
    e.shape = None;
    assert_eq!(f.tensor(&e).unwrap().len(), 1);
}

#[test]
fn extension_codes_collide_with_nothing() {
    for d in Dtype::all() {
        let c = d.code();
        assert!(
            c <= 13 || (EXTENSION_CODE_BASE..0x90).contains(&c),
            "{d:?} = {c}"
        );
        assert_eq!(d.is_native(), c <= 13);
    }
    for c in 14..EXTENSION_CODE_BASE {
        assert_eq!(Dtype::from_code(c), None, "{c} is C-Kernel-Engine's range");
    }
    assert_eq!(Dtype::from_code(13), Some(Dtype::Q5_K));
}

/// Regenerate the fuzz seed corpus: `CKALLOC_WRITE_FUZZ_SEEDS=1 cargo test --test weights seeds`.
/// Seed format (see fuzz/fuzz_targets/weights_reader.rs): u32 LE file length, file
/// bytes, u32 LE map length, map text, then the JSON text to the end.
#[test]
#[cfg_attr(miri, ignore)] // file-backed mmap / file system
fn seeds() {
    use common::weights_reader_seed as seed;
    let mut seeds = Vec::new();
    for (v, name) in [(Version::V4, "v4"), (Version::V5, "v5")] {
        let dir = tempfile::tempdir().unwrap();
        let mut w = WeightsWriter::new(v);
        w.alignment(16).unwrap().dims(dims());
        w.add_tensor_with_shape("w", Dtype::F32, &[2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        w.add_tensor_with_shape(
            "ids",
            Dtype::I64,
            &[2],
            vec![1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
        )
        .unwrap();
        w.add_tensor("q", Dtype::Q8_0, vec![3u8; 34]).unwrap();
        let rep = w.write_dir(dir.path()).unwrap();
        let file = std::fs::read(&rep.weights_path).unwrap();
        let map = std::fs::read_to_string(&rep.manifest_map_path).unwrap();
        let json = std::fs::read_to_string(&rep.manifest_json_path).unwrap();
        // Sanity: each seed decodes back to a valid, consistent set.
        let f = WeightsFile::from_bytes(&file).unwrap();
        f.verify_checksum().unwrap();
        f.check_manifest(Manifest::from_map(&map).unwrap(), CheckOptions::new())
            .unwrap();
        seeds.push((format!("seed-{name}-valid"), seed(&file, &map, &json)));
        let overlapping = map.replacen("|0x00000000000000A0|", "|0x00000000000000A8|", 1);
        seeds.push((
            format!("seed-{name}-odd-map"),
            seed(&file, &overlapping, "{\"entries\":[]}"),
        ));
        seeds.push((
            format!("seed-{name}-header-only"),
            seed(&file[..156], "", ""),
        ));
    }
    seeds.push((
        "seed-hand-v5".into(),
        seed(
            &hand_built(5, &[0, 0x80], &[1; 24], Some(b"{}")),
            "a|fp32|158|8|158\n",
            "",
        ),
    ));
    common::write_weights_reader_seeds(&seeds);
}

/// Two writers writing into one folder at once (here two threads of one
/// process, replacing the same three files over and over) never share a
/// temporary name, so neither removes or renames the other's file: every
/// write succeeds, and whatever writer finished last, each file is whole.
#[test]
#[cfg_attr(miri, ignore)] // file system
fn two_writers_in_one_folder_keep_their_temporary_files_apart() {
    let dir = tempfile::tempdir().unwrap();
    let write = |fill: u8| {
        let data = vec![fill; 64 << 10];
        let mut w = WeightsWriter::new(Version::V5);
        w.add_tensor("t", Dtype::U8, &data[..]).unwrap();
        for _ in 0..40 {
            w.write_dir(dir.path()).unwrap();
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| write(1));
        s.spawn(|| write(2));
    });
    let f = WeightsFile::open(dir.path().join(WEIGHTS_FILE)).unwrap();
    f.verify_checksum().unwrap();
    Manifest::load_sidecars(dir.path()).unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}
