//! The caching allocator (`ckalloc::caching`) over inner allocators that
//! need no real `mmap` (`allocator_api2`'s `Global`, or the counting
//! allocator of `common::caching` over it), so Miri runs the whole binary:
//!
//! - `spec`: the spec grammar, canonical `Display`, malformed specs with their
//!   error kinds, heap matching and `from_env`.
//! - `pool`: pool behaviour seen through the counting inner allocator.
//! - `threads`: two threads sharing one pool.
//!
//! The caching allocator over `CkHuge` is tested in `tests/huge.rs`,
//! `tests/stress.rs` and `tests/faults/caching.rs`.

#[path = "../common/mod.rs"]
mod common;

mod pool;
mod spec;
mod threads;

use allocator_api2::alloc::Allocator;
use common::caching::Counting;
use std::alloc::Layout;

/// The counting allocator itself: it tracks live blocks and fails on demand.
#[test]
fn counting_checks_layouts() {
    let c = Counting::new();
    let l = Layout::from_size_align(64, 8).unwrap();
    let p = c.allocate(l).unwrap();
    assert_eq!(c.live_blocks(), 1);
    // SAFETY: `p` is the live block allocated with `l` above.
    unsafe { c.deallocate(p.cast(), l) };
    assert_eq!(c.live_blocks(), 0);
    c.fail(1);
    assert!(c.allocate(l).is_err());
    assert!(c
        .allocate(l)
        // SAFETY: the block just allocated with `l`, freed at once.
        .map(|p| unsafe { c.deallocate(p.cast(), l) })
        .is_ok());
}
