//! The demo's real work: matrix-vector products over F32 weights read in
//! place (from `&[u8]`, as they lie in the arena), with a checksum of the
//! outputs that must be identical whichever way the weights were loaded.
//! [`compute_all`] runs them for every 2-D F32 weight of one arena, the
//! outputs allocated in the arena and the scratch buffers from a
//! `CachingAllocator<CkHuge>`.

use crate::error::{err, CliError};
use allocator_api2::alloc::Allocator;
use allocator_api2::vec::Vec as AVec;
use ckalloc::caching::CachingAllocator;
use ckalloc::weights::{Dtype, Manifest};
use ckalloc::{BumpArena, CkHuge};

/// Element `j` of the deterministic input vector: values in `[-1, 1]` that
/// do not repeat with a short period.
pub fn input(j: usize) -> f32 {
    ((j.wrapping_mul(2_654_435_761) % 2001) as f32 - 1000.0) / 1000.0
}

/// Why a matrix-vector product could not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// `rows * cols * 4` overflows or differs from the tensor's byte length.
    Size {
        rows: usize,
        cols: usize,
        bytes: usize,
    },
    /// A buffer could not be allocated.
    Alloc(&'static str),
}

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeError::Size { rows, cols, bytes } => write!(
                f,
                "shape [{rows}, {cols}] of F32 needs {} bytes but the tensor has {bytes}",
                rows.checked_mul(*cols)
                    .and_then(|n| n.checked_mul(4))
                    .map_or("more than usize::MAX".to_string(), |n| n.to_string())
            ),
            ShapeError::Alloc(what) => write!(f, "out of memory allocating the {what}"),
        }
    }
}

/// `y = W x` for a row-major F32 matrix `w` (`rows x cols`, little-endian
/// bytes, any alignment) and the deterministic input of length `cols`.
///
/// `scratch` serves the per-layer scratch buffers: the input vector and the
/// f64 accumulators (freed when this returns, so the next matrix of the same
/// shape reuses them). The output is allocated from `out_alloc` (the arena)
/// and returned.
pub fn matvec<'o, S: Allocator, O: Allocator + 'o>(
    w: &[u8],
    rows: usize,
    cols: usize,
    scratch: S,
    out_alloc: O,
) -> Result<AVec<f32, O>, ShapeError> {
    let size_err = ShapeError::Size {
        rows,
        cols,
        bytes: w.len(),
    };
    let need = rows
        .checked_mul(cols)
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(|| size_err.clone())?;
    if need != w.len() {
        return Err(size_err);
    }
    let mut x: AVec<f32, &S> = AVec::new_in(&scratch);
    x.try_reserve_exact(cols)
        .map_err(|_| ShapeError::Alloc("input vector"))?;
    x.extend((0..cols).map(input));
    let mut acc: AVec<f64, &S> = AVec::new_in(&scratch);
    acc.try_reserve_exact(rows)
        .map_err(|_| ShapeError::Alloc("accumulators"))?;
    if cols == 0 {
        acc.resize(rows, 0.0);
    } else {
        for row in w.chunks_exact(cols * 4) {
            let dot: f64 = row
                .chunks_exact(4)
                .zip(x.iter())
                .map(|(b, &xj)| {
                    f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])) * f64::from(xj)
                })
                .sum();
            acc.push(dot);
        }
    }
    let mut y = AVec::new_in(out_alloc);
    y.try_reserve_exact(rows)
        .map_err(|_| ShapeError::Alloc("output vector"))?;
    y.extend(acc.iter().map(|&a| a as f32));
    Ok(y)
}

/// FNV-1a over the bit patterns of every output, in order: equal only when
/// every product came out bit-for-bit the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checksum(pub u64);

impl Default for Checksum {
    fn default() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }
}

impl Checksum {
    pub fn update(&mut self, values: &[f32]) {
        for v in values {
            for b in v.to_bits().to_le_bytes() {
                self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The outcome of the compute step in one arena.
pub struct Work {
    pub matrices: usize,
    pub outputs: u64,
    pub checksum: Checksum,
    /// Runtime-region bytes the outputs took (bump high-water mark).
    pub arena_bytes: usize,
}

/// The 2-D F32 weights with at least one element, in file order: (entry
/// name, rows, cols). Empty matrices are skipped: a shape such as
/// `[1 << 40, 0]` has no bytes in the file but would need `rows` outputs.
pub fn matrices(manifest: &Manifest) -> Vec<(String, usize, usize)> {
    manifest
        .sorted_by_offset()
        .into_iter()
        .filter(|e| e.size > 0)
        .filter(|e| e.parsed_dtype().is_ok_and(|d| d == Dtype::F32))
        .filter_map(|e| match e.shape.as_deref() {
            Some(&[r, c]) => Some((
                e.name.clone(),
                usize::try_from(r).ok()?,
                usize::try_from(c).ok()?,
            )),
            _ => None,
        })
        .collect()
}

/// Runtime bytes the outputs need: every output vector plus alignment slack.
pub fn output_bytes(mats: &[(String, usize, usize)]) -> Option<u64> {
    mats.iter().try_fold(0u64, |acc, (_, rows, _)| {
        acc.checked_add((*rows as u64).checked_mul(4)?.checked_add(64)?)
    })
}

/// `y = W x` for every matrix, weights read in place from the arena, outputs
/// allocated in the arena, scratch from the cache.
pub fn compute_all(
    arena: &BumpArena,
    mats: &[(String, usize, usize)],
    cache: &CachingAllocator<CkHuge>,
) -> Result<Work, CliError> {
    let mut outputs: Vec<AVec<f32, &BumpArena>> = Vec::with_capacity(mats.len());
    let mut ck = Checksum::default();
    let mut n = 0u64;
    for (name, rows, cols) in mats {
        let w = arena
            .tensor(name)
            .ok_or_else(|| err(format!("tensor '{name}' is not in the arena")))?;
        let y = matvec(w, *rows, *cols, cache, arena)
            .map_err(|e| err(format!("tensor '{name}': {e}")))?;
        ck.update(&y);
        n += y.len() as u64;
        outputs.push(y);
    }
    let arena_bytes = arena.used();
    drop(outputs);
    Ok(Work {
        matrices: mats.len(),
        outputs: n,
        checksum: ck,
        arena_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocator_api2::alloc::Global;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn matvec_matches_naive() {
        let (rows, cols) = (3, 5);
        let w: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 2.0).collect();
        let y = matvec(&bytes(&w), rows, cols, Global, Global).unwrap();
        for r in 0..rows {
            let want: f64 = (0..cols)
                .map(|c| f64::from(w[r * cols + c]) * f64::from(input(c)))
                .sum();
            assert_eq!(y[r], want as f32);
        }
    }

    #[test]
    fn unaligned_bytes_and_bad_shapes() {
        let w = bytes(&[1.0, 2.0, 3.0, 4.0]);
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&w);
        let a = matvec(&w, 2, 2, Global, Global).unwrap();
        let b = matvec(&shifted[1..], 2, 2, Global, Global).unwrap();
        assert_eq!(&a[..], &b[..]);
        assert!(matches!(
            matvec(&w, 3, 2, Global, Global),
            Err(ShapeError::Size { .. })
        ));
        assert!(matches!(
            matvec(&w, usize::MAX, 2, Global, Global),
            Err(ShapeError::Size { .. })
        ));
    }

    #[test]
    fn checksum_sees_every_bit() {
        let mut a = Checksum::default();
        let mut b = Checksum::default();
        a.update(&[1.0, 2.0]);
        b.update(&[1.0, f32::from_bits(2.0f32.to_bits() ^ 1)]);
        assert_ne!(a, b);
    }
}
