//! The C ABI (`ckalloc::capi`, feature `capi`):
//!
//! - `programs` (needs `weights` too): builds `libckalloc.{a,so}` with
//!   `scripts/build-capi`, compiles the C programs in `tests/c/` with the
//!   system `cc`, runs them against both libraries, and under valgrind when
//!   it is installed (the fork storm natively only).
//! - `materialize`: `ck_bump_alloc_materialize_weights` called from Rust.
//!
//! The C entry points under injected OS failures are in `tests/faults/capi.rs`.
#![cfg(feature = "capi")]

mod materialize;
#[cfg(feature = "weights")]
mod programs;
