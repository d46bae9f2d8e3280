//! Row 5: loading a weights file with a warm page cache.

use crate::{fmt_dur, median, time, Row};
use ckalloc::{BumpArena, ModePolicy};
use std::hint::black_box;
use std::io::Write;
use std::path::Path;

const MIB: usize = 1 << 20;

fn write_file(path: &Path, size: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk: Vec<u8> = (0..16 * MIB).map(|i| (i * 31 % 251) as u8).collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    f.sync_all().unwrap();
}

fn arena(path: &Path, size: usize, policy: ModePolicy) -> BumpArena {
    BumpArena::builder(size + 64 * MIB)
        .weights_file(path)
        .activations_base(size)
        .policy(policy)
        .build()
        .unwrap()
}

/// `mmap` of the file, copy into fresh THP memory (the hand-written peer).
fn mmap_copy(path: &Path, size: usize) -> crate::pages::Raw {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: the file is not modified while mapped (bench-owned temp file).
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    let mut dst = crate::pages::Raw::new(size, true);
    dst.slice().copy_from_slice(&map[..size]);
    dst
}

fn plain_mmap(path: &Path) -> memmap2::Mmap {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: as above.
    unsafe { memmap2::Mmap::map(&f).unwrap() }
}

pub fn weights(full: bool) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    // build() at both sizes always (it must not depend on the size); the
    // copies of 1 GiB only with --full.
    let sizes: &[usize] = &[256 * MIB, 1024 * MIB];
    let reps = 5;
    let mut rows = vec![];
    for &size in sizes {
        let path = dir.path().join(format!("w{size}.bin"));
        write_file(&path, size);
        // Warm the page cache.
        black_box(std::fs::read(&path).unwrap().len());
        let mib = size / MIB;

        // Mixed-mode build vs a plain mmap.
        let (mut b, mut m) = (vec![], vec![]);
        for _ in 0..reps * 3 {
            let (t, a) = time(|| arena(&path, size, ModePolicy::MixedOnly));
            drop(a);
            b.push(t.as_nanos() as f64);
            let (t, mp) = time(|| plain_mmap(&path));
            drop(mp);
            m.push(t.as_nanos() as f64);
        }
        let bm = median(b);
        rows.push(Row {
            name: format!("5. weights {mib} MiB: mixed-mode build() (absolute) vs plain mmap"),
            ours: fmt_dur(bm),
            peer: fmt_dur(median(m)),
            ratio: 0.5e6 / bm,
            target: "<= 0.5 ms (ratio = 0.5 ms / ours >= 1)".into(),
            met: bm <= 0.5e6,
        });

        if size > 256 * MIB && !full {
            continue;
        }
        // Anon materialize vs mmap + copy into THP memory vs std::fs::read.
        let (mut o, mut c, mut r) = (vec![], vec![], vec![]);
        for _ in 0..reps {
            let (t, a) = time(|| {
                let mut a = arena(&path, size, ModePolicy::AnonOnly);
                a.materialize_weights().unwrap();
                a
            });
            drop(a);
            o.push(t.as_nanos() as f64);
            let (t, d) = time(|| mmap_copy(&path, size));
            drop(d);
            c.push(t.as_nanos() as f64);
            let (t, v) = time(|| std::fs::read(&path).unwrap());
            drop(v);
            r.push(t.as_nanos() as f64);
        }
        let rc = median(c.iter().zip(&o).map(|(p, o)| p / o).collect());
        let rr = median(r.iter().zip(&o).map(|(p, o)| p / o).collect());
        let om = fmt_dur(median(o));
        rows.push(Row {
            name: format!(
                "5. weights {mib} MiB: anon build+materialize_weights() vs mmap + copy to THP"
            ),
            ours: om.clone(),
            peer: fmt_dur(median(c)),
            ratio: rc,
            target: ">= 1.0x".into(),
            met: rc >= 1.0,
        });
        rows.push(Row {
            name: format!(
                "5. weights {mib} MiB: anon build+materialize_weights() vs std::fs::read"
            ),
            ours: om,
            peer: fmt_dur(median(r)),
            ratio: rr,
            target: ">= 3.0x".into(),
            met: rr >= 3.0,
        });
    }
    rows
}
