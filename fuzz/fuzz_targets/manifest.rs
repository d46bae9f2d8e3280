//! Fuzz the sidecar manifests: the `.map` and JSON parsers, entries built
//! in memory, the writers of both sidecars, canonical JSON and error text.
//!
//! Input: the first byte picks what the rest is (seeds in `fuzz/seeds/manifest/`):
//!   0: `weights_manifest.map` text;
//!   1: `weights_manifest.json` text;
//!   2: entries decoded with `arbitrary` (name, dtype, offsets, size, shape);
//!   3: any JSON text, for `canonical_json`.
//!
//! Properties: nothing panics; every accepted manifest keeps the writer's
//! name rule (`check_name`) and a `.map`-safe dtype; a manifest written as
//! `.map` text and read back has the same entries (shapes aside, which the
//! `.map` does not hold), and written as JSON and read back is equal; a
//! JSON value's canonical form reads back to an equal value and is its own
//! canonical form; no error message holds a control character.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ckalloc::weights::{canonical_json, check_name, Manifest, ManifestEntry, Version};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct RawEntry {
    name: String,
    dtype: String,
    file_offset: u64,
    size: u64,
    runtime_offset: Option<u64>,
    shape: Option<Vec<u64>>,
}

fn no_control(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

/// Properties of every manifest a constructor accepted.
fn accepted(m: &Manifest) {
    for e in m {
        assert!(check_name(&e.name).is_ok(), "{:?}", e.name);
        assert!(!e.dtype.is_empty() && !e.dtype.contains(['|', '\n', '\r', '\0']));
        assert!(std::ptr::eq(m.get(&e.name).unwrap(), e));
    }
    // .map round trip: same entries, without shapes.
    let map = m.to_map_string(Version::V5);
    let back = Manifest::from_map(&map).expect("an emitted .map parses");
    assert_eq!(back.len(), m.len());
    for (a, b) in back.iter().zip(m.iter()) {
        assert_eq!(
            (&a.name, &a.dtype, a.file_offset, a.size, a.runtime_offset),
            (&b.name, &b.dtype, b.file_offset, b.size, b.runtime_offset)
        );
        assert_eq!(a.shape, None);
    }
    // JSON round trip: equal, shapes included.
    let doc = serde_json::json!({ "entries": m.entries_json() });
    let back = Manifest::from_json(&doc.to_string()).expect("emitted JSON parses");
    assert_eq!(&back, m);
    let digest = back.json_sha256().copied();
    assert!(digest.is_some());
    // The digest is over the canonical form, whatever the spelling.
    let pretty = serde_json::to_string_pretty(&doc).unwrap();
    assert_eq!(
        Manifest::from_json(&pretty).unwrap().json_sha256().copied(),
        digest
    );
}

fn refused(e: &ckalloc::weights::WeightsError) {
    let text = e.to_string();
    assert!(no_control(&text), "{text:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => match Manifest::from_map(&String::from_utf8_lossy(rest)) {
            Ok(m) => accepted(&m),
            Err(e) => refused(&e),
        },
        1 => match Manifest::from_json(&String::from_utf8_lossy(rest)) {
            Ok(m) => accepted(&m),
            Err(e) => refused(&e),
        },
        2 => {
            let mut u = Unstructured::new(rest);
            let Ok(raw) = Vec::<RawEntry>::arbitrary(&mut u) else {
                return;
            };
            let mut entries = Vec::new();
            for r in raw {
                match ManifestEntry::new(r.name, r.dtype, r.file_offset, r.size) {
                    Ok(mut e) => {
                        if let Some(ro) = r.runtime_offset {
                            e.runtime_offset = ro;
                        }
                        e.shape = r.shape;
                        entries.push(e);
                    }
                    Err(e) => refused(&e),
                }
            }
            match Manifest::from_entries(entries) {
                Ok(m) => accepted(&m),
                Err(e) => refused(&e),
            }
        }
        _ => {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(rest) else {
                return;
            };
            let c = canonical_json(&v);
            assert!(c.iter().all(|&b| (0x20..0x7f).contains(&b)));
            let back: serde_json::Value =
                serde_json::from_slice(&c).expect("canonical JSON parses");
            assert_eq!(back, v);
            assert_eq!(canonical_json(&back), c);
        }
    }
});
