//! [`ManifestEntry`]: one tensor of a manifest, and the rules an entry
//! keeps on its own (the name rule, a dtype a `.map` line can hold, a size
//! its shape fits in).

use super::dtype::Dtype;
use super::error::{ManifestKind, WeightsError};

/// Longest accepted tensor name (bytes), so a `.map` line stays under the 4096-byte
/// line buffer of C-Kernel-Engine's C loader.
pub const MAX_NAME_LEN: usize = 1024;

/// One tensor: where its bytes are in the file and where they go at run time.
/// Offsets and sizes are bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManifestEntry {
    /// Tensor name: 1 to [`MAX_NAME_LEN`] bytes, no `|`, line break or NUL,
    /// not starting with `#` ([`check_name`]; checked by every constructor
    /// of a [`Manifest`](super::Manifest)).
    pub name: String,
    /// Dtype name as written in the manifest (the authority; see [`Dtype::from_name`]).
    pub dtype: String,
    /// Offset of the first byte in `weights.bump`.
    pub file_offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// Destination offset in the runtime buffer (equals `file_offset` unless a
    /// layout tool relocated it; the JSON sidecar has none and uses `file_offset`).
    pub runtime_offset: u64,
    /// Shape, outermost first, when known (JSON sidecar only).
    pub shape: Option<Vec<u64>>,
}

/// The tensor-name rule of the `.map` sidecar, which every reader and
/// writer of ckalloc applies: 1 to [`MAX_NAME_LEN`] bytes (so a `.map` line
/// fits C-Kernel-Engine's 4096-byte line buffer), no `|` (the field
/// separator), no line break or NUL, and no leading `#` (a comment line).
///
/// # Errors
/// [`WeightsError::InvalidTensorName`] with the reason (the name in the
/// error is cut to 80 characters).
pub fn check_name(name: &str) -> Result<(), WeightsError> {
    let bad = |reason| WeightsError::InvalidTensorName {
        name: name.chars().take(80).collect(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(bad("longer than 1024 bytes"));
    }
    if name.contains(['|', '\n', '\r', '\0']) {
        return Err(bad(
            "contains '|', a line break or NUL (the .map sidecar cannot hold it)",
        ));
    }
    if name.starts_with('#') {
        return Err(bad("starts with '#' (a comment in the .map sidecar)"));
    }
    Ok(())
}

impl ManifestEntry {
    /// An entry with `runtime_offset == file_offset` and no shape.
    ///
    /// # Errors
    /// [`WeightsError::InvalidTensorName`] when `name` breaks [`check_name`];
    /// [`WeightsError::ManifestSyntax`] for a dtype a `.map` line cannot
    /// hold (empty, over 64 bytes, `|`, a line break or NUL).
    pub fn new(
        name: impl Into<String>,
        dtype: impl Into<String>,
        file_offset: u64,
        size: u64,
    ) -> Result<Self, WeightsError> {
        let e = ManifestEntry {
            name: name.into(),
            dtype: dtype.into(),
            file_offset,
            size,
            runtime_offset: file_offset,
            shape: None,
        };
        e.check()?;
        Ok(e)
    }

    /// The name rule and a non-empty dtype.
    /// The name rule, and a dtype a `.map` line can hold: 1 to 64 bytes,
    /// no `|`, line break or NUL.
    pub(super) fn check(&self) -> Result<(), WeightsError> {
        check_name(&self.name)?;
        let d = &self.dtype;
        if d.is_empty() || d.len() > 64 || d.contains(['|', '\n', '\r', '\0']) {
            return Err(WeightsError::ManifestSyntax {
                kind: ManifestKind::Entries,
                line: 0,
                message: format!(
                    "entry \"{}\": dtype \"{}\" is empty, longer than 64 bytes, or holds '|', a line break or NUL",
                    self.name,
                    crate::Escaped::capped(d, 40)
                ),
            });
        }
        Ok(())
    }

    /// `file_offset + size`, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.file_offset.checked_add(self.size)
    }

    /// The shape as `[d0, d1, ...]` for a report or a message: at most 16
    /// dimensions, then `... (N dims)`. `None` without a shape.
    pub fn shape_text(&self) -> Option<String> {
        self.shape.as_deref().map(super::error::shape_text)
    }

    /// The parsed dtype.
    ///
    /// # Errors
    /// [`WeightsError::UnknownDtype`] naming the manifest's spelling.
    pub fn parsed_dtype(&self) -> Result<Dtype, WeightsError> {
        Dtype::from_name(&self.dtype)
    }
}

/// The bytes `entry`'s shape and dtype need, `None` without a shape or with
/// an unknown dtype.
///
/// # Errors
/// [`WeightsError::SizeOverflow`].
fn shape_bytes(entry: &ManifestEntry) -> Result<Option<u64>, WeightsError> {
    let (Some(shape), Ok(dtype)) = (&entry.shape, entry.parsed_dtype()) else {
        return Ok(None);
    };
    shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| dtype.min_bytes(n))
        .map(Some)
        .ok_or_else(|| {
            WeightsError::overflow(format!(
                "byte size of \"{}\" shape {}",
                entry.name,
                super::error::shape_text(shape)
            ))
        })
}

/// Rule 5: an entry stores at least the bytes its shape and dtype need. An
/// entry with a shape and an unknown dtype cannot be checked and is
/// refused.
///
/// # Errors
/// [`WeightsError::ShapeMismatch`], [`WeightsError::UnknownDtype`],
/// [`WeightsError::SizeOverflow`].
pub(crate) fn check_shape(entry: &ManifestEntry) -> Result<(), WeightsError> {
    if entry.shape.is_some() {
        entry.parsed_dtype()?;
    }
    match (shape_bytes(entry)?, &entry.shape) {
        (Some(needed), Some(shape)) if needed > entry.size => Err(WeightsError::ShapeMismatch {
            name: entry.name.clone(),
            shape: shape.clone(),
            expected_bytes: needed,
            actual_bytes: entry.size,
        }),
        _ => Ok(()),
    }
}
