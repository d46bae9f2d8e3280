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

    /// The descriptor as a `std::fs::File`, which then owns and closes it.
    #[cfg_attr(not(feature = "weights"), allow(dead_code))]
    pub(crate) fn into_file(self) -> std::fs::File {
        use std::os::fd::FromRawFd as _;
        let fd = self.0;
        std::mem::forget(self);
        // SAFETY: `fd` is an open descriptor this `Fd` owned; forgetting the
        // `Fd` hands that ownership to the `File` alone.
        unsafe { std::fs::File::from_raw_fd(fd) }
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
    /// Device and inode: which file it is (the arena compares them with a
    /// checked manifest's file, feature `weights`).
    #[cfg_attr(not(feature = "weights"), allow(dead_code))]
    pub dev: u64,
    #[cfg_attr(not(feature = "weights"), allow(dead_code))]
    pub ino: u64,
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
        // Widening on every target (dev_t and ino_t are at most 64 bits).
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
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

/// Open an unnamed regular file in `dir` for writing (`open(2)` with
/// `O_TMPFILE | O_WRONLY | O_CLOEXEC`, mode `0o666` less the umask, as
/// `File::create`). The file has no name, so a process killed while writing
/// it leaves nothing behind; [`link_unnamed`] gives it a name once complete.
///
/// # Errors
/// The `open` error. `EOPNOTSUPP` (the filesystem has no `O_TMPFILE`),
/// `EISDIR` (a kernel before 3.11 that reads the flag as `O_DIRECTORY`) and
/// `EINVAL` mean "not supported here": see [`unnamed_unsupported`]. Outside
/// Linux: `ENOTSUP` always.
#[cfg(feature = "weights")]
pub(crate) fn open_unnamed_in(dir: &std::path::Path) -> io::Result<std::fs::File> {
    inject(Op::OpenUnnamed)?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        loop {
            // SAFETY: `c` is a valid NUL-terminated string; O_TMPFILE takes
            // the mode argument.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o666 as libc::c_uint,
                )
            };
            if fd >= 0 {
                // SAFETY: `fd` is a fresh descriptor nobody else owns.
                return Ok(unsafe { std::fs::File::from_raw_fd(fd) });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        Err(io::Error::from_raw_os_error(libc::ENOTSUP))
    }
}

/// Whether an [`open_unnamed_in`] error means the directory's filesystem (or
/// the kernel) cannot create unnamed files, so a named temporary file is the
/// way to go.
#[cfg(feature = "weights")]
pub(crate) fn unnamed_unsupported(e: &io::Error) -> bool {
    let n = e.raw_os_error();
    // ENOTSUP equals EOPNOTSUPP on Linux, not everywhere.
    n == Some(libc::ENOTSUP) || matches!(n, Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL))
}

/// Give the unnamed file `file` (from [`open_unnamed_in`]) the name `dest`:
/// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, dest, AT_SYMLINK_FOLLOW)`,
/// as `open(2)` describes for `O_TMPFILE`. Like `link(2)` it never replaces:
/// an existing `dest` is `EEXIST`.
///
/// # Errors
/// The `linkat` error (`EEXIST`, `ENOENT` when `/proc` is not mounted, ...).
#[cfg(feature = "weights")]
pub(crate) fn link_unnamed(file: &std::fs::File, dest: &std::path::Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    inject(Op::LinkUnnamed)?;
    let proc_path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let c = std::ffi::CString::new(dest.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both paths are valid NUL-terminated strings for the call.
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}
