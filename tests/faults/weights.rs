//! The weights writer's file placement (feature `weights`): with no
//! `O_TMPFILE` (a filesystem without it) the writer falls back to named
//! temporary files and still leaves exactly the three outputs; a failing
//! `linkat` or `open` is a typed error that leaves the directory as it was.

use crate::common::dir_contents;
use crate::serial;
use ckalloc::fault::{self, Op};
use ckalloc::weights::*;

fn writer(fill: u8) -> WeightsWriter<'static> {
    let mut w = WeightsWriter::new(Version::V5);
    w.add_tensor("a", Dtype::F32, vec![fill; 64]).unwrap();
    w
}

#[test]
fn file_placement_faults() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let names = [WEIGHTS_FILE, MANIFEST_JSON, MANIFEST_MAP];

    // No O_TMPFILE: named temporary files, renamed into place, none left.
    fault::fail_from(Op::OpenUnnamed, 1, libc::EOPNOTSUPP);
    let report = writer(1).write_dir(dir.path()).unwrap();
    fault::reset();
    let first = dir_contents(dir.path());
    assert_eq!(first.keys().map(String::as_str).collect::<Vec<_>>(), {
        let mut n = names.to_vec();
        n.sort();
        n
    });
    WeightsFile::open(&report.weights_path)
        .unwrap()
        .verify_checksum()
        .unwrap();

    // The fallback replaces existing files too.
    fault::fail_from(Op::OpenUnnamed, 1, libc::EOPNOTSUPP);
    writer(2).write_dir(dir.path()).unwrap();
    fault::reset();
    let second = dir_contents(dir.path());
    assert_eq!(
        second.keys().collect::<Vec<_>>(),
        first.keys().collect::<Vec<_>>()
    );
    assert_ne!(second[WEIGHTS_FILE], first[WEIGHTS_FILE]);

    // A failing O_TMPFILE open that is not "unsupported": a typed I/O error
    // naming the directory, nothing written.
    fault::fail_nth(Op::OpenUnnamed, 2, libc::ENOSPC);
    let e = writer(3).write_dir(dir.path()).unwrap_err();
    fault::reset();
    assert!(
        matches!(&e, WeightsError::Io { path, .. } if path == dir.path()),
        "{e}"
    );
    assert!(
        dir_contents(dir.path()) == second,
        "a failed write changed the directory"
    );

    // A failing linkat when the names are placed: an error naming the file,
    // no stray name, and the previous files still complete.
    for nth in 1..=3 {
        fault::fail_nth(Op::LinkUnnamed, nth, libc::EIO);
        let e = writer(4).write_dir(dir.path()).unwrap_err();
        fault::reset();
        assert!(matches!(&e, WeightsError::Io { op: "link", .. }), "{e}");
        let now = dir_contents(dir.path());
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            second.keys().collect::<Vec<_>>()
        );
    }
    // With O_TMPFILE working again, a write succeeds.
    writer(5).write_dir(dir.path()).unwrap();
    assert!(fault::calls(Op::LinkUnnamed) > 0);
}
