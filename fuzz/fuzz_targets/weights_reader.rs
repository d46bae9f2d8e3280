//! Fuzz the `weights.bump` reader and both manifest parsers.
//!
//! Input layout (decoded with `arbitrary::Unstructured`, so the committed seeds
//! in `fuzz/seeds/weights_reader/` are easy to build; see the `seeds` test in
//! `tests/weights.rs`):
//!   u32 LE n, n bytes of weights.bump, u32 LE m, m bytes of .map text,
//!   rest = .json text.
//! Lengths are clamped to what remains, so every input decodes.
//!
//! Seeds cover every layout (L1-L4, hand-built and the first bytes of files
//! C-Kernel-Engine's converters wrote; see `fuzz_seeds_cover_every_layout` in
//! `tests/weights_layouts.rs`).
//!
//! Properties: nothing panics; every byte slice the reader lends lies
//! inside the file's bytes (AddressSanitizer also catches any read past them),
//! and every copy it makes (the dtype table, the v5 metadata, `read_at`) equals
//! the file's bytes where the layout puts them; a recognised file's regions are
//! ordered (checksum range start <= table <= tensor data <= data end <= file
//! length) and sit at its layout's offsets; a manifest `check_manifest`
//! accepts keeps its rules (every entry inside the tensor data and readable
//! with `tensor`, no overlaps, runtime offset == file offset, no warning under
//! `strict`); every parsed manifest keeps the tensor-name rule; every error
//! and warning message is one line.
#![no_main]

use std::borrow::Cow;

use arbitrary::Unstructured;
use ckalloc::weights::{
    check_name, CheckOptions, DtypeTableCheck, Manifest, WeightsError, WeightsFile,
};
use libfuzzer_sys::fuzz_target;

fn take<'a>(u: &mut Unstructured<'a>) -> &'a [u8] {
    let n = u.arbitrary::<u32>().unwrap_or(0) as usize;
    let n = n.min(u.len());
    u.bytes(n).unwrap_or(&[])
}

fn inside(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    inner.is_empty() || (i >= o && i + inner.len() <= o + outer.len())
}

/// `Display` escapes control characters: a message is one line.
fn one_line(message: String) {
    assert!(!message.contains(['\n', '\r']), "{message:?}");
}

/// `check_manifest` with `options`, and what an accepted manifest keeps.
fn check(f: &WeightsFile, manifest: &Manifest, options: CheckOptions, strict: bool) {
    let checked = match f.check_manifest(manifest.clone(), options) {
        Ok(c) => c,
        Err(e) => return one_line(e.to_string()),
    };
    assert_eq!(checked.manifest(), manifest);
    let (start, end) = (f.tensor_data_start(), f.data_end());
    assert_eq!(checked.tensor_data(), (start, end));
    let (wb, ab) = checked.weights_region();
    assert!(start <= wb && wb <= ab && ab == end);
    assert!(checked.layout().is_clean());
    for e in manifest {
        assert!(e.file_offset >= start && e.end().is_some_and(|x| x <= end));
        assert_eq!(e.runtime_offset, e.file_offset);
        let t = f.tensor(e).expect("an entry check_manifest accepted reads");
        assert_eq!(t.len() as u64, e.size);
    }
    if let DtypeTableCheck::Hint { note: Some(n) } = checked.dtype_table() {
        one_line(n.clone());
    }
    for w in checked.warnings() {
        one_line(w.to_string());
        one_line(w.to_error().to_string());
    }
    if strict {
        assert!(checked.warnings().is_empty());
    }
}

fn exercise(manifest: &Manifest, file: Option<&WeightsFile>) {
    for e in manifest {
        assert!(std::ptr::eq(manifest.get(&e.name).unwrap(), e));
        assert!(check_name(&e.name).is_ok() && !e.dtype.is_empty());
    }
    let Some(f) = file else { return };
    let bytes = f.as_bytes().expect("a file in memory lends its bytes");
    check(f, manifest, CheckOptions::new(), false);
    check(f, manifest, CheckOptions::new().strict(true), true);
    check(
        f,
        manifest,
        CheckOptions::new().require_manifest_hash(true),
        false,
    );
    assert_eq!(f.slot_dtypes(Some(manifest)).len(), f.dtype_table().len());
    let rep = f.layout_report(manifest);
    assert!(rep.covered_bytes <= f.data_end() - f.tensor_data_start());
    for e in manifest {
        match f.tensor(e) {
            Ok(t) => {
                assert!(matches!(t, Cow::Borrowed(_)));
                assert!(inside(bytes, &t));
                assert_eq!(t.len() as u64, e.size);
                assert!(
                    e.file_offset >= f.tensor_data_start()
                        && e.file_offset + e.size <= f.data_end()
                );
            }
            Err(err) => one_line(err.to_string()),
        }
        if let Ok(t) = f.range(e.file_offset, e.size) {
            assert!(inside(bytes, &t));
            // read_at copies the same bytes.
            if t.len() <= 1 << 16 {
                let mut buf = vec![0u8; t.len()];
                f.read_at(e.file_offset, &mut buf).unwrap();
                assert_eq!(&buf[..], &t[..]);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let file_bytes = take(&mut u);
    let map_text = String::from_utf8_lossy(take(&mut u)).into_owned();
    let json_text = String::from_utf8_lossy(u.take_rest()).into_owned();

    let file = match WeightsFile::from_bytes(file_bytes) {
        Ok(f) => Some(f),
        Err(e) => {
            one_line(e.to_string());
            None
        }
    };
    if let Some(f) = &file {
        let h = f.header();
        assert_eq!(f.as_bytes(), Some(file_bytes));
        assert!(!f.is_mapped());
        assert!(h.tensor_data_start <= h.data_end && h.data_end <= h.file_len);
        let o = f.container().offsets();
        assert!(f.container().versions().contains(&f.version()));
        assert_eq!(&file_bytes[..8], &f.version().magic());
        let (start, end) = f.checksum_range();
        assert!(start == o.hash_start && start <= o.dtype_count);
        assert_eq!(end, h.data_end);
        assert_eq!(h.dtype_table_offset(), o.dtype_table());
        assert_eq!(
            &file_bytes[o.checksum as usize..o.checksum as usize + 32],
            f.checksum()
        );
        let _ = f.dims().to_json();
        let _ = f.slot_dtypes(None);
        // The table is a copy of the file's bytes at the layout's offset.
        assert_eq!(f.dtype_table().len() as u64, u64::from(h.dtype_table_len));
        let t0 = h.dtype_table_offset() as usize;
        assert_eq!(f.dtype_table(), &file_bytes[t0..t0 + f.dtype_table().len()]);
        assert_eq!(h.tensor_data_start, (t0 + f.dtype_table().len()) as u64);
        let _ = f.dtypes().count();
        // The v5 metadata: a copy of the bytes the footer points to, parsed
        // at open into a JSON object.
        match (f.metadata_bytes(), f.footer()) {
            (Some(m), Some(foot)) => {
                let (a, b) = (foot.offset as usize, (foot.offset + foot.len) as usize);
                assert_eq!(m, &file_bytes[a..b]);
                assert_eq!(foot.offset, h.data_end);
                assert!(f.metadata_json().is_some_and(|v| v.is_object()));
                let _ = f.created_by();
            }
            (None, None) => assert!(f.metadata_json().is_none()),
            _ => panic!("metadata without a footer, or a footer without metadata"),
        }
        match f.verify_checksum() {
            Ok(()) => assert_eq!(f.compute_checksum().unwrap(), *f.checksum()),
            Err(e) => {
                assert!(
                    matches!(e, WeightsError::BadChecksum { container, .. } if container == f.container())
                );
                one_line(e.to_string());
            }
        }
    }
    for parsed in [
        Manifest::from_map(&map_text),
        Manifest::from_json(&json_text),
    ] {
        let manifest = match parsed {
            Ok(m) => m,
            Err(e) => {
                one_line(e.to_string());
                continue;
            }
        };
        exercise(&manifest, file.as_ref());
        // The .map text we emit parses back to the same entries whenever the
        // dtypes can be written to a .map line at all (names always can: every
        // manifest keeps the name rule).
        if manifest.iter().all(|e| !e.dtype.contains(['|', '\n'])) {
            let text = manifest.to_map_string(ckalloc::weights::Version::V5);
            let again = Manifest::from_map(&text).expect("emitted .map must parse");
            assert_eq!(again.len(), manifest.len());
            for (a, b) in again.iter().zip(manifest.iter()) {
                assert_eq!(
                    (&a.name, &a.dtype, a.file_offset, a.size, a.runtime_offset),
                    (&b.name, &b.dtype, b.file_offset, b.size, b.runtime_offset)
                );
            }
        }
    }
});
