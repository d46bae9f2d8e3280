//! Files kept open for the life of the process ([`KeptFile`]) and a
//! place to share one between threads ([`KeptSlot`]): procfs files the
//! background thread reads again and again without opening them then.

use super::process::{read_from_start, run_delay_of};
use std::sync::atomic::{
    AtomicI64, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// A procfs file the library keeps open for the life of the process and
/// reads with `pread` from its start, without allocating. Never closed: a
/// program may close the number (`closefrom`) and reuse it, and closing it
/// then would close the program's file. Each read first checks with
/// `fstat` that the number still names the file opened (device and inode),
/// so a program's file on that number is never read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeptFile {
    fd: libc::c_int,
    dev: u64,
    ino: u64,
}

/// The device and inode of descriptor `fd`; `None` when `fstat` fails.
fn identity(fd: libc::c_int) -> Option<(u64, u64)> {
    // SAFETY: `stat` is plain data, which the call fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a `stat` for the call to fill.
    let rc = unsafe { libc::fstat(fd, &mut st) };
    #[allow(clippy::unnecessary_cast)]
    (rc == 0).then_some((st.st_dev as u64, st.st_ino as u64))
}

impl KeptFile {
    /// Open `path` read-only (`O_CLOEXEC`); `None` when it cannot be.
    pub(crate) fn open(path: &std::ffi::CStr) -> Option<KeptFile> {
        if cfg!(miri) {
            return None;
        }
        // SAFETY: NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        let (dev, ino) = identity(fd)?;
        Some(KeptFile { fd, dev, ino })
    }

    /// The descriptor, while it still names the file opened.
    fn checked(&self) -> Option<libc::c_int> {
        (identity(self.fd)? == (self.dev, self.ino)).then_some(self.fd)
    }

    /// Up to `buf.len()` bytes from the file's start; `None` when the read
    /// fails or the descriptor names another file now.
    pub(crate) fn read<'a>(&self, buf: &'a mut [u8]) -> Option<&'a [u8]> {
        read_from_start(self.checked()?, buf)
    }

    /// The run-queue delay of a `schedstat` file kept open
    /// ([`SchedStat::run_delay_ns`](super::SchedStat::run_delay_ns)).
    pub(crate) fn run_delay_ns(&self) -> Option<u64> {
        run_delay_of(self.checked()?)
    }
}

/// A place for a [`KeptFile`] shared between threads: atomics, empty at
/// first, all zero until a file is kept (so a static holding one, as the
/// engine does, stays in zero-initialised memory, `.bss`, not `.data`).
pub(crate) struct KeptSlot {
    /// The descriptor plus one; 0: empty.
    fd_plus_one: AtomicI64,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl KeptSlot {
    pub(crate) const fn new() -> KeptSlot {
        KeptSlot {
            fd_plus_one: AtomicI64::new(0),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    /// Keep `f` here (`None`: empty); a file kept before is forgotten,
    /// not closed.
    pub(crate) fn keep(&self, f: Option<KeptFile>) {
        self.fd_plus_one.store(0, Release);
        if let Some(f) = f {
            self.dev.store(f.dev, Relaxed);
            self.ino.store(f.ino, Relaxed);
            self.fd_plus_one.store(i64::from(f.fd) + 1, Release);
        }
    }

    /// The file kept here, if any.
    pub(crate) fn get(&self) -> Option<KeptFile> {
        let fd = libc::c_int::try_from(self.fd_plus_one.load(Acquire) - 1).ok()?;
        (fd >= 0).then(|| KeptFile {
            fd,
            dev: self.dev.load(Relaxed),
            ino: self.ino.load(Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "procfs")]
    fn a_kept_file_reads_only_while_its_number_names_it() {
        let f = KeptFile::open(c"/proc/self/stat").expect("procfs");
        let mut buf = [0u8; 512];
        assert!(f.read(&mut buf).is_some_and(|t| !t.is_empty()));
        let slot = KeptSlot::new();
        assert_eq!(slot.get(), None);
        slot.keep(Some(f));
        assert_eq!(slot.get(), Some(f));
        // The program puts another file on the number (`dup2` closes the
        // kept one and reuses its number at once).
        // SAFETY: NUL-terminated path.
        let other = unsafe { libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY) };
        assert!(other >= 0);
        // SAFETY: both descriptors are the test's own.
        assert_eq!(unsafe { libc::dup2(other, f.fd) }, f.fd);
        assert_eq!(f.read(&mut buf), None, "another file's bytes are not read");
        // SAFETY: the test's own descriptors, each closed once.
        unsafe {
            libc::close(other);
            libc::close(f.fd);
        }
        slot.keep(None);
        assert_eq!(slot.get(), None);
    }
}
