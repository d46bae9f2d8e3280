//! End-to-end tests of the `ckalloc` binary (`CARGO_BIN_EXE_ckalloc`, built
//! with `--features cli`): every test runs the tool as a child process and
//! checks its output, its exit status and the files it leaves.
//!
//! - `commands`: each subcommand's text and `--json` output, the synth ->
//!   pack -> inspect -> load round trip, and the demo.
//! - `errors`: missing, wrong, corrupt and hostile inputs, bad arguments and
//!   a failing stdout: one error line, a non-zero exit status, no panic.
//! - `layouts`: `inspect` and `load` on the `weights.bump` files
//!   C-Kernel-Engine's converters write (`tests/data/cke/`).
//! - `load`: what `load` says about the arena it built.
//! - `pack`: `pack` interrupted by a signal leaves no temporary file.
//! - `truncation`: a `weights.bump` truncated while the tool reads it (an
//!   `LD_PRELOAD` shim, `tests/c/truncate_shim.c`).
//!
//! `support` runs the binary and builds the inputs the modules share.
#![cfg(feature = "cli")]

#[path = "../common/mod.rs"]
mod common;
mod support;

mod commands;
mod errors;
mod layouts;
mod load;
#[cfg(target_os = "linux")]
mod pack;
mod truncation;
