//! Copying the weights file into an anonymous arena (`materialize_weights`).
//!
//! Large `pread`s straight into the arena (no bounce buffer), on several
//! threads when the region is big (`std::thread::scope`; each thread takes
//! the next 16 MiB block), after `posix_fadvise(SEQUENTIAL)`. The file's size
//! is compared with the size checked at build time before and after reading.

use super::builder::open_weights;
use super::{ArenaError, ArenaMode, BumpArena, Geometry};
use crate::par::{SendPtr, Workers};
use crate::sys;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes per `pread` / work item.
const BLOCK: usize = 16 << 20;
/// Regions at least this big are read by several threads.
const PARALLEL_MIN: usize = 64 << 20;
/// At most this many threads read.
const MAX_THREADS: usize = 8;

impl BumpArena {
    /// Copy the weights file's bytes `[weights_base, activations_base)` into
    /// the weights region (anon mode). A no-op in mixed mode and without a
    /// weights region. Bytes past the end of a file shorter than
    /// `activations_base` (allowed within the last page) are set to zero.
    ///
    /// # Errors
    /// [`ArenaError::NoWeightsFile`] when the arena was built without one
    /// (use [`materialize_weights_from`](Self::materialize_weights_from));
    /// [`ArenaError::WeightsFileChanged`] when the file's size differs from
    /// the size checked at build time; [`ArenaError::ReadWeights`] for a
    /// failed or short read. The arena stays usable and the call can be
    /// retried; [`needs_weight_materialization`](Self::needs_weight_materialization)
    /// stays true until one succeeds.
    pub fn materialize_weights(&mut self) -> Result<(), ArenaError> {
        self.materialize_weights_with(|_, _| {})
    }

    /// [`materialize_weights`](Self::materialize_weights) with a progress
    /// callback `progress(done_bytes, total_bytes)`, called on the calling
    /// thread after each block and once at the end with `done == total`.
    ///
    /// # Errors
    /// As [`materialize_weights`](Self::materialize_weights).
    pub fn materialize_weights_with(
        &mut self,
        progress: impl FnMut(u64, u64),
    ) -> Result<(), ArenaError> {
        if self.parts.mode != ArenaMode::Anon
            || self.parts.activations_base == self.parts.weights_base
        {
            return Ok(());
        }
        let src = self
            .parts
            .source
            .as_ref()
            .ok_or(ArenaError::NoWeightsFile)?;
        let expected = src.size;
        let check_size = || -> Result<(), ArenaError> {
            let found = sys::fstat(&src.fd)
                .map_err(|source| ArenaError::StatWeights {
                    path: src.path.clone(),
                    source,
                })?
                .size;
            if found != expected {
                return Err(ArenaError::WeightsFileChanged { expected, found });
            }
            Ok(())
        };
        check_size()?;
        let (wb, ab) = (self.parts.weights_base, self.parts.activations_base);
        let file_end = (ab as u64).min(expected) as usize;
        let read_len = file_end.saturating_sub(wb);
        // Advice only: the copy works without it.
        let _ = sys::fadvise_sequential(&src.fd, wb as u64, read_len as u64);
        // SAFETY: the weights region is read-write anonymous memory owned by
        // the arena, which `&mut self` keeps alive and unshared while the
        // readers run; each reader writes only the blocks it claimed.
        let dst = unsafe { SendPtr::new(self.ptr_at_unchecked(wb)) };
        read_parallel(&src.fd, dst, wb, read_len, progress)?;
        check_size()?;
        if ab > wb + read_len {
            // SAFETY: anonymous read-write memory of the weights region, and
            // `&mut self` excludes every other reference.
            unsafe { dst.at(read_len).write_bytes(0, ab - wb - read_len) };
        }
        self.parts.materialized = true;
        Ok(())
    }

    /// Open `path` (checked as at build time: regular file covering
    /// `activations_base`), make it the arena's weights file, and
    /// materialize from it. For arenas built without a file, as the C ABI's
    /// `ck_bump_alloc_materialize_weights(alloc, path)`. A no-op in mixed
    /// mode.
    ///
    /// # Errors
    /// The file errors of [`ArenaBuilder::build`](super::ArenaBuilder::build)
    /// and those of [`materialize_weights`](Self::materialize_weights).
    pub fn materialize_weights_from(&mut self, path: &Path) -> Result<(), ArenaError> {
        if self.parts.mode != ArenaMode::Anon
            || self.parts.activations_base == self.parts.weights_base
        {
            return Ok(());
        }
        let geometry = Geometry::new(
            self.parts.total_size,
            self.parts.weights_base,
            self.parts.activations_base,
        )?;
        let src = open_weights(path, &geometry)?;
        self.parts.weights_file_size = Some(src.size);
        self.parts.source = Some(src);
        self.materialize_weights()
    }
}

/// Read `len` bytes of `fd` at `offset` into `dst..dst+len`, in blocks of
/// [`BLOCK`] bytes, on several threads when the range is large.
fn read_parallel(
    fd: &sys::Fd,
    dst: SendPtr,
    offset: usize,
    len: usize,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), ArenaError> {
    let total = len as u64;
    let blocks = len.div_ceil(BLOCK);
    let done = AtomicU64::new(0);
    let threads = if len >= PARALLEL_MIN {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)
            .min(blocks)
    } else {
        1
    };
    let workers = Workers {
        threads,
        name: Some("ckalloc-materialize"),
        stack_size: None,
        start_wait: Duration::ZERO,
    };
    // (offset in the range, length) of block `i`.
    let block = |i: usize| {
        let start = i * BLOCK;
        (start, BLOCK.min(len - start))
    };
    let read_block = |i: usize| {
        let (start, n) = block(i);
        // SAFETY: block `i` is claimed by this thread alone (the workers'
        // shared counter); it lies inside the weights region, which is
        // read-write anonymous memory that outlives the threads.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst.at(start), n) };
        sys::pread_exact(fd, buf, (offset + start) as u64)?;
        done.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    };
    let mut report = || progress(done.load(Ordering::Relaxed), total);
    workers
        .run(blocks, read_block, Some(&mut report))
        .map_err(|(i, source)| {
            let (start, n) = if i < blocks { block(i) } else { (0, len) };
            ArenaError::ReadWeights {
                offset: (offset + start) as u64,
                len: n,
                source,
            }
        })?;
    progress(total, total);
    Ok(())
}
