//! The weights file is opened once and checked once through its
//! descriptor: one `open` and one `fstat` per arena build, in each mode (the
//! rest of these properties are in `tests/security.rs`).

use crate::common::{pattern, weights_arena as arena};
use crate::serial;
use ckalloc::fault::{self, Op};
use ckalloc::ModePolicy;

const PAGE: usize = 4096;

/// One `open` and one `fstat` per build: the file is checked once.
#[test]
fn the_weights_file_is_opened_and_checked_once() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w");
    let ab = 3 * PAGE + 5;
    std::fs::write(&path, pattern(ab, 2)).unwrap();
    for policy in [ModePolicy::AnonOnly, ModePolicy::MixedOnly] {
        let (o, f) = (fault::calls(Op::Open), fault::calls(Op::Fstat));
        let a = arena(policy, &path, ab);
        assert_eq!(fault::calls(Op::Open) - o, 1, "{policy:?}: opens");
        assert_eq!(fault::calls(Op::Fstat) - f, 1, "{policy:?}: fstats");
        drop(a);
    }
}
