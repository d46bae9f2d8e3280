//! Memory that reads zero when the kernel refuses the purge: with
//! `madvise(MADV_DONTNEED)` failing, `reset()` and `rewind_to()` of an arena
//! built with `release_on_reset(true)` clear the freed runtime bytes with a
//! memset, in both modes.
//! (Every backing without injected faults: `tests/arena_zeroing.rs`.)

use crate::common::{fill_runtime, nonzero_from};
use crate::serial;
use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::fault::{self, Op};
use ckalloc::*;
use std::io::Write;

const MIB: usize = 1 << 20;
const TOTAL: usize = 16 * MIB;
const AB: usize = 4 * MIB + 100;

/// Reset and rewind with the next `madvise` failing (`EINVAL`, as a kernel
/// that cannot purge hugetlb pages answers; `EAGAIN`).
fn check(mut arena: BumpArena, what: &str) {
    for errno in [libc::EINVAL, libc::EAGAIN] {
        fill_runtime(&arena, 0xAB);
        fault::fail_nth(Op::Madvise, 1, errno);
        arena.reset();
        assert!(!fault::pending(Op::Madvise), "{what}: the purge was tried");
        assert_eq!(nonzero_from(&arena, AB), 0, "{what}: reset, errno {errno}");

        let first = Allocator::allocate(&&arena, Layout::from_size_align(777, 1).unwrap()).unwrap();
        // SAFETY: a fresh block of 777 bytes.
        unsafe { first.cast::<u8>().as_ptr().write_bytes(0x11, 777) };
        let cp = arena.checkpoint();
        fill_runtime(&arena, 0xCD);
        fault::fail_nth(Op::Madvise, 1, errno);
        arena.rewind_to(cp).unwrap();
        assert!(!fault::pending(Op::Madvise), "{what}: the purge was tried");
        assert_eq!(
            nonzero_from(&arena, AB + cp.used()),
            0,
            "{what}: rewind, errno {errno}"
        );
        arena.reset();
    }
    fault::reset();
}

#[test]
fn reset_and_rewind_clear_by_hand_when_madvise_fails() {
    let _g = serial();
    let anon = BumpArena::builder(TOTAL)
        .activations_base(AB)
        .policy(ModePolicy::AnonOnly)
        .release_on_reset(true)
        .build()
        .unwrap();
    check(anon, "anon");

    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&vec![3u8; AB]).unwrap();
    f.flush().unwrap();
    let mixed = BumpArena::builder(TOTAL)
        .weights_file(f.path())
        .activations_base(AB)
        .policy(ModePolicy::MixedOnly)
        .release_on_reset(true)
        .build()
        .unwrap();
    check(mixed, "mixed");
}
