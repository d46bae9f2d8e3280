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
//! Properties: nothing panics; every byte slice the reader hands out lies
//! inside the file's bytes (AddressSanitizer also catches any read past them);
//! a recognised file's regions are ordered (checksum range start <= table <=
//! tensor data <= data end <= file length) and sit at its layout's offsets.
#![no_main]

use arbitrary::Unstructured;
use ckalloc::weights::{Manifest, WeightsFile};
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

fn exercise(manifest: &Manifest, file: Option<&WeightsFile>) {
    let _ = manifest.check_runtime_offsets();
    let _ = manifest.check_dtypes();
    let _ = manifest.validate_against(u64::MAX);
    let _ = manifest.layout_report(0, u64::MAX);
    for e in manifest {
        assert!(std::ptr::eq(manifest.get(&e.name).unwrap(), e));
    }
    let Some(f) = file else { return };
    let bytes = f.as_bytes();
    let _ = f.validate_manifest(manifest);
    let _ = manifest.validate_against(f.len());
    let _ = f.check_dtype_table(manifest);
    let _ = f.check_manifest(manifest);
    if let Some(note) = f.dtype_table_note(manifest) {
        assert!(!note.contains('\n'));
    }
    assert_eq!(f.slot_dtypes(Some(manifest)).len(), f.dtype_table().len());
    let rep = f.layout_report(manifest);
    assert!(rep.covered_bytes <= f.data_end() - f.tensor_data_start());
    for e in manifest {
        if let Ok(t) = f.tensor(e) {
            assert!(inside(bytes, t));
            assert_eq!(t.len() as u64, e.size);
            assert!(
                e.file_offset >= f.tensor_data_start() && e.file_offset + e.size <= f.data_end()
            );
        }
        if let Ok(t) = f.range(e.file_offset, e.size) {
            assert!(inside(bytes, t));
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
            let _ = e.to_string();
            None
        }
    };
    if let Some(f) = &file {
        let h = f.header();
        assert_eq!(f.as_bytes(), file_bytes);
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
        assert!(inside(f.as_bytes(), f.dtype_table()));
        assert_eq!(f.dtype_table().len() as u64, u64::from(h.dtype_table_len));
        let _ = f.dtypes().count();
        if let Some(m) = f.metadata_bytes() {
            assert!(inside(f.as_bytes(), m));
            let _ = f.metadata_json();
        }
        if let Err(e) = f.verify_checksum() {
            assert!(
                matches!(e, ckalloc::weights::WeightsError::BadChecksum { container, .. } if container == f.container())
            );
        }
    }
    for manifest in [
        Manifest::from_map(&map_text),
        Manifest::from_json(&json_text),
    ]
    .into_iter()
    .flatten()
    {
        exercise(&manifest, file.as_ref());
        // The .map text we emit parses back to the same entries whenever the
        // names and dtypes can be written to a .map line at all.
        let clean = |s: &str| !s.contains(['|', '\n']);
        if manifest
            .iter()
            .all(|e| clean(&e.name) && clean(&e.dtype) && !e.name.starts_with('#'))
        {
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
