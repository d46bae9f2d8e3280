//! Files: the read-only descriptor [`Fd`], `open`, `fstat`, `pread`,
//! `posix_fadvise`.

use super::cvt;
use super::fault::{inject, Op};
use std::io;

/// A file descriptor opened read-only, closed on drop.
#[derive(Debug)]
pub(crate) struct Fd(libc::c_int);

impl Fd {
    pub(crate) fn raw(&self) -> libc::c_int {
        self.0
    }

    /// Take ownership of `fd` (an open descriptor nobody else closes).
    pub(super) fn from_raw(fd: libc::c_int) -> Fd {
        Fd(fd)
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor. close errors are ignored: the
        // descriptor is released either way on Linux, and a read-only file
        // has no buffered data to lose.
        unsafe { libc::close(self.0) };
    }
}

/// Open `path` read-only with `O_CLOEXEC | O_NONBLOCK`. `O_NONBLOCK` keeps
/// `open` of a FIFO without a writer from blocking forever (callers then reject
/// it with `fstat`); it has no effect on reads of regular files.
pub(crate) fn open_readonly(path: &std::path::Path) -> io::Result<Fd> {
    use std::os::unix::ffi::OsStrExt;
    inject(Op::Open)?;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    loop {
        // SAFETY: `c` is a valid NUL-terminated string for the call.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd >= 0 {
            return Ok(Fd(fd));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// What `fstat` says about an open file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileStat {
    pub size: u64,
    pub is_regular: bool,
}

/// `fstat` on the descriptor (not the path, so a swap of the path between the
/// check and the mapping cannot change what is mapped).
pub(crate) fn fstat(fd: &Fd) -> io::Result<FileStat> {
    inject(Op::Fstat)?;
    // SAFETY: `st` is plain old data that fstat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out pointer.
    cvt(unsafe { libc::fstat(fd.0, &mut st) })?;
    Ok(FileStat {
        size: st.st_size as u64,
        is_regular: (st.st_mode & libc::S_IFMT) == libc::S_IFREG,
    })
}

/// Read exactly `buf.len()` bytes at `offset`, retrying `EINTR` and short
/// reads. A read that hits end of file first is `UnexpectedEof`.
pub(crate) fn pread_exact(fd: &Fd, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        inject(Op::Pread)?;
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // Linux transfers at most 0x7ffff000 bytes per call.
        let chunk = buf.len().min(0x7fff_f000);
        // SAFETY: `buf` is valid for `chunk` writable bytes.
        let n = unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), chunk, off) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file ended before the expected length (truncated or changed while reading)",
            ));
        }
        let n = n as usize;
        buf = &mut buf[n..];
        offset += n as u64;
    }
    Ok(())
}

/// `posix_fadvise(POSIX_FADV_SEQUENTIAL)` over `offset..offset+len`.
#[cfg(target_os = "linux")]
pub(crate) fn fadvise_sequential(fd: &Fd, offset: u64, len: u64) -> io::Result<()> {
    inject(Op::Fadvise)?;
    // SAFETY: advice only. posix_fadvise returns the error number instead of
    // setting errno.
    let r = unsafe {
        libc::posix_fadvise(
            fd.0,
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_SEQUENTIAL,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}
