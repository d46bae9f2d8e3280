//! Byte-level primitives of the reader: little-endian integers at an
//! offset, and where the bytes of a `weights.bump` come from: memory (a
//! `Vec` or a memory map) or an open file read with `pread`. The layout detection and
//! [`WeightsFile`](super::WeightsFile) read through [`Source`], so a file
//! read with `pread` that shrinks underneath gives a typed error
//! ([`WeightsError::FileChanged`]) where a mapping would raise `SIGBUS`.

use super::error::WeightsError;
use std::borrow::Cow;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// Open `path` read-only as a regular file and return it with its
/// metadata. The open is `O_CLOEXEC | O_NONBLOCK`, so that a FIFO without a
/// writer does not block it forever; `fstat` then refuses anything but a
/// regular file (a FIFO, a directory, a device such as `/dev/zero`).
///
/// # Errors
/// [`WeightsError::Io`] from `open` or `fstat` (`NotFound` for a missing
/// file), [`WeightsError::NotARegularFile`].
pub(crate) fn open_regular_file(path: &Path) -> Result<(File, Metadata), WeightsError> {
    let file = crate::sys::open_readonly(path)
        .map(crate::sys::Fd::into_file)
        .map_err(|e| WeightsError::io(path, "open", e))?;
    let meta = file
        .metadata()
        .map_err(|e| WeightsError::io(path, "fstat", e))?;
    if !meta.is_file() {
        return Err(WeightsError::NotARegularFile {
            path: path.to_path_buf(),
        });
    }
    Ok((file, meta))
}

/// Bytes of a file of a fixed length.
pub(crate) trait Source {
    /// The length fixed when the file was opened (bytes).
    fn len(&self) -> u64;

    /// Bytes `[offset, offset + len)`; the caller keeps the range inside
    /// [`len`](Self::len). Memory sources lend their bytes; a file is read
    /// into a new buffer.
    fn read(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>, WeightsError>;
}

/// Bytes in memory (a `Vec` or a memory map).
pub(crate) struct Memory<'a>(pub(crate) &'a [u8]);

impl Source for Memory<'_> {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>, WeightsError> {
        let range = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(o, n)| Some(o..o.checked_add(n)?));
        range
            .and_then(|r| self.0.get(r))
            .map(Cow::Borrowed)
            .ok_or_else(|| WeightsError::overflow(format!("bytes [{offset}, +{len}) of the file")))
    }
}

/// An open regular file of `len` bytes (as `fstat` said when it was opened),
/// read with `pread`.
pub(crate) struct Pread<'a> {
    pub(crate) file: &'a File,
    pub(crate) path: &'a Path,
    pub(crate) len: u64,
}

impl Pread<'_> {
    /// Fill `buf` from `offset`. A file that now ends before
    /// `offset + buf.len()` is [`WeightsError::FileChanged`].
    pub(crate) fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), WeightsError> {
        match self.file.read_exact_at(buf, offset) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                let now = self.file.metadata().map(|m| m.len()).ok();
                Err(WeightsError::FileChanged {
                    path: self.path.to_path_buf(),
                    opened_len: self.len,
                    now_len: now,
                    offset,
                })
            }
            Err(e) => Err(WeightsError::io(self.path, "pread", e)),
        }
    }

    /// [`WeightsError::FileChanged`] unless the file still has the length it
    /// had when it was opened.
    pub(crate) fn check_len(&self) -> Result<(), WeightsError> {
        let now = self
            .file
            .metadata()
            .map_err(|e| WeightsError::io(self.path, "fstat", e))?
            .len();
        if now != self.len {
            return Err(WeightsError::FileChanged {
                path: self.path.to_path_buf(),
                opened_len: self.len,
                now_len: Some(now),
                offset: now.min(self.len),
            });
        }
        Ok(())
    }
}

/// A zeroed buffer of `len` bytes, or an error (not an abort) when the
/// memory cannot be had.
pub(crate) fn buffer(len: u64, path: &Path) -> Result<Vec<u8>, WeightsError> {
    let n = usize::try_from(len)
        .map_err(|_| WeightsError::overflow(format!("a {len}-byte read buffer")))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| WeightsError::io(path, "allocate", io::ErrorKind::OutOfMemory.into()))?;
    v.resize(n, 0);
    Ok(v)
}

impl Source for Pread<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>, WeightsError> {
        let mut buf = buffer(len, self.path)?;
        self.read_into(offset, &mut buf)?;
        Ok(Cow::Owned(buf))
    }
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
