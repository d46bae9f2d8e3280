//! Fault injection into the OS layer: the N-th `mmap`, `munmap`, `madvise`,
//! `mremap`, `mprotect`, `mbind`, `mlock`, `munlock`, `open`, `fstat`, `pread`, `posix_fadvise`,
//! `open(O_TMPFILE)` or `linkat` fails with a chosen errno, and each module
//! checks what its subject makes of that: a typed error (or null,
//! `AllocError`, -1), no panic, nothing left mapped, statistics back where
//! they started.
//!
//! The whole binary needs the library built with
//! `--cfg ckalloc_fault_injection` (which provides `ckalloc::fault`); without
//! it the binary is empty. `scripts/test` runs it in a target directory of
//! its own, or by hand:
//!
//! ```sh
//! RUSTFLAGS="--cfg ckalloc_fault_injection" CARGO_TARGET_DIR=target/fault-injection \
//!   cargo test --all-features --test faults [FILTER]
//! ```
//!
//! The fault state (what is armed, the call counters) is process-global, and
//! an armed fault fires in whichever thread makes the call next: every test
//! here takes [`serial`] first, so no two tests of the binary ever run at the
//! same time, and the lock disarms every fault when it is released (also when
//! a test panics with a fault armed). One test also needs a process no
//! other test has run in, and runs its body (an ignored `child_*` test) in a
//! child process of this binary:
//! `huge::populate_threads_one_failed_chunk_fails_and_releases_all`.
#![cfg(ckalloc_fault_injection)]

#[path = "../common/mod.rs"]
mod common;

mod arena;
mod arena_requirements;
mod arena_zeroing;
mod caching;
#[cfg(feature = "capi")]
mod capi;
mod huge;
#[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
mod preload;
#[cfg(target_os = "linux")]
mod security;
#[cfg(feature = "weights")]
mod weights;

use ckalloc::fault::{self, Op};

/// The memory calls of the huge-page layer, each failed in turn by the
/// `huge` and `caching` modules.
pub const OPS: [Op; 8] = [
    Op::Mmap,
    Op::Munmap,
    Op::Madvise,
    Op::Mremap,
    Op::Mprotect,
    Op::Mbind,
    Op::Mlock,
    Op::Munlock,
];

/// The binary's lock, held for the whole of a test (see the module docs).
pub struct Serial {
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        // Runs before the mutex is released: the next test starts disarmed
        // even when this one panicked between arming a fault and its reset.
        fault::reset();
    }
}

/// Take the binary's lock; every fault is disarmed on entry and on release.
pub fn serial() -> Serial {
    let guard = common::serial();
    fault::reset();
    Serial { _guard: guard }
}
