//! The operating-system layer: every `libc` call of the crate lives here.
//!
//! Above this module the crate is safe code over raw addresses. Each function
//! here is a thin wrapper that turns the C return convention into
//! `io::Result`, retries `EINTR` where the call may be interrupted, and states
//! the OS edge it handles next to the line that handles it (after memmap2's
//! `unix.rs`). Nothing here allocates: errors are `io::Error::from_raw_os_error`
//! / `last_os_error`, which are plain integers inside, so the global
//! allocator's mapping path may call any of these functions.
//!
//! With the `fault-injection` feature, [`fault`] can make the N-th call of an
//! operation fail with a chosen errno (test-only; compiled out otherwise).

// Several helpers are only used on Linux or by optional features.
#![allow(dead_code)]

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The huge page size the crate rounds to (2 MiB), in bytes.
pub(crate) const HUGE_PAGE_2M: usize = 2 << 20;
/// The gigantic page size (1 GiB), in bytes.
pub(crate) const HUGE_PAGE_1G: usize = 1 << 30;

/// Operations that can be made to fail under the `fault-injection` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
#[allow(missing_docs)]
pub enum Op {
    Mmap = 0,
    Munmap,
    Madvise,
    Mremap,
    Mbind,
    Mlock,
    Open,
    Fstat,
    Pread,
    Fadvise,
}

const OP_COUNT: usize = 10;

#[cfg(feature = "fault-injection")]
pub mod fault {
    //! Test-only fault injection: `fail_nth(Op::Mmap, 3, libc::ENOMEM)` makes
    //! the third `mmap` from now fail with `ENOMEM` (once). The state is
    //! process-global: tests that use it must not run concurrently.
    use super::{Op, OP_COUNT};
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: AtomicU64 = AtomicU64::new(0);
    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO32: AtomicI32 = AtomicI32::new(0);
    static COUNTDOWN: [AtomicU64; OP_COUNT] = [ZERO; OP_COUNT];
    static ERRNO: [AtomicI32; OP_COUNT] = [ZERO32; OP_COUNT];
    static CALLS: [AtomicU64; OP_COUNT] = [ZERO; OP_COUNT];
    #[allow(clippy::declare_interior_mutable_const)]
    const NO: AtomicBool = AtomicBool::new(false);
    static STICKY: [AtomicBool; OP_COUNT] = [NO; OP_COUNT];

    /// Make the `n`-th call (1-based, counted from now) of `op` fail with `errno`.
    /// `n == 0` disarms.
    pub fn fail_nth(op: Op, n: u64, errno: i32) {
        STICKY[op as usize].store(false, Ordering::SeqCst);
        ERRNO[op as usize].store(errno, Ordering::SeqCst);
        COUNTDOWN[op as usize].store(n, Ordering::SeqCst);
    }

    /// Make the `n`-th call of `op` from now and every later one fail with
    /// `errno`, until [`reset`].
    pub fn fail_from(op: Op, n: u64, errno: i32) {
        ERRNO[op as usize].store(errno, Ordering::SeqCst);
        COUNTDOWN[op as usize].store(n.max(1), Ordering::SeqCst);
        STICKY[op as usize].store(true, Ordering::SeqCst);
    }

    /// Disarm every operation.
    pub fn reset() {
        for c in &COUNTDOWN {
            c.store(0, Ordering::SeqCst);
        }
        for s in &STICKY {
            s.store(false, Ordering::SeqCst);
        }
    }

    /// How many calls of `op` were made since the process started.
    pub fn calls(op: Op) -> u64 {
        CALLS[op as usize].load(Ordering::SeqCst)
    }

    /// Whether an armed fault has not fired yet for `op`.
    pub fn pending(op: Op) -> bool {
        COUNTDOWN[op as usize].load(Ordering::SeqCst) != 0
    }

    pub(crate) fn check(op: Op) -> Result<(), i32> {
        let i = op as usize;
        CALLS[i].fetch_add(1, Ordering::SeqCst);
        let sticky = STICKY[i].load(Ordering::SeqCst);
        let prev = COUNTDOWN[i]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                // A sticky fault stays at 1 once it is due.
                if sticky && c == 1 {
                    Some(1)
                } else {
                    c.checked_sub(1)
                }
            })
            .unwrap_or(0);
        if prev == 1 {
            Err(ERRNO[i].load(Ordering::SeqCst))
        } else {
            Ok(())
        }
    }
}

/// Returns `Err` when an injected fault is due for `op`.
#[inline(always)]
fn inject(op: Op) -> io::Result<()> {
    #[cfg(feature = "fault-injection")]
    if let Err(errno) = fault::check(op) {
        return Err(io::Error::from_raw_os_error(errno));
    }
    let _ = op;
    Ok(())
}

fn cvt(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The base page size in bytes (`sysconf(_SC_PAGESIZE)`), cached.
pub(crate) fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let cached = PAGE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    // SAFETY: sysconf has no preconditions.
    let raw = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = if raw > 0 { raw as usize } else { 4096 };
    PAGE.store(page, Ordering::Relaxed);
    page
}

/// Round `n` up to a multiple of `align` (a power of two); `None` on overflow.
#[inline]
pub(crate) fn round_up(n: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

/// Which hugetlb page size a `MAP_HUGETLB` mapping asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HugetlbSize {
    Size2M,
    Size1G,
}

impl HugetlbSize {
    pub(crate) fn bytes(self) -> usize {
        match self {
            HugetlbSize::Size2M => HUGE_PAGE_2M,
            HugetlbSize::Size1G => HUGE_PAGE_1G,
        }
    }
}

/// Protection of a new mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prot {
    None,
    Read,
    ReadWrite,
}

impl Prot {
    fn bits(self) -> libc::c_int {
        match self {
            Prot::None => libc::PROT_NONE,
            Prot::Read => libc::PROT_READ,
            Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

fn mmap_raw(
    addr: *mut u8,
    len: usize,
    prot: Prot,
    flags: libc::c_int,
    fd: libc::c_int,
    offset: u64,
) -> io::Result<NonNull<u8>> {
    inject(Op::Mmap)?;
    // POSIX: a zero-length mmap fails with EINVAL; callers never ask for one,
    // but say so here rather than let the kernel decide.
    if len == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: without MAP_FIXED the kernel picks an unused range, so no
    // existing memory is affected. With MAP_FIXED (callers below) `addr..+len`
    // lies inside a reservation that the caller owns, which the new mapping
    // replaces atomically.
    let p = unsafe { libc::mmap(addr.cast(), len, prot.bits(), flags, fd, offset) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // mmap never returns null on success unless asked for address 0 with
    // MAP_FIXED, which this crate never does.
    NonNull::new(p.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Anonymous private read-write memory, zero-filled, at an address the kernel
/// chooses (aligned to the base page size).
pub(crate) fn map_anon(len: usize) -> io::Result<NonNull<u8>> {
    mmap_raw(
        std::ptr::null_mut(),
        len,
        Prot::ReadWrite,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    )
}

/// Anonymous private hugetlb memory of `len` bytes (a multiple of the page
/// size `size`). Fails with `ENOMEM` when no pages of that size are free;
/// `MAP_NORESERVE` is deliberately not used, since it would turn that failure
/// into a SIGBUS at first touch.
#[cfg(target_os = "linux")]
pub(crate) fn map_hugetlb(len: usize, size: HugetlbSize) -> io::Result<NonNull<u8>> {
    let size_flag = match size {
        HugetlbSize::Size2M => 21 << libc::MAP_HUGE_SHIFT,
        HugetlbSize::Size1G => 30 << libc::MAP_HUGE_SHIFT,
    };
    mmap_raw(
        std::ptr::null_mut(),
        len,
        Prot::ReadWrite,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | size_flag,
        -1,
        0,
    )
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn map_hugetlb(_len: usize, _size: HugetlbSize) -> io::Result<NonNull<u8>> {
    Err(io::Error::from_raw_os_error(libc::ENOTSUP))
}

/// Reserve `len` bytes of address space aligned to `align` (a power of two, at
/// least the base page size) with no access and no commit charge
/// (`PROT_NONE`, `MAP_NORESERVE`). The caller later maps over parts of it with
/// the `*_fixed` functions. Over-reserves by `align` and trims both ends.
pub(crate) fn reserve_aligned(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    map_aligned(len, align, Prot::None)
}

/// Anonymous private read-write memory of `len` bytes whose start is aligned
/// to `align` (a power of two): over-reserve, then unmap the unaligned head
/// and the tail.
pub(crate) fn map_anon_aligned(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    map_aligned(len, align, Prot::ReadWrite)
}

fn map_aligned(len: usize, align: usize, prot: Prot) -> io::Result<NonNull<u8>> {
    let page = page_size();
    let align = align.max(page);
    let len = round_up(len, page).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let over = len
        .checked_add(align - page)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // A PROT_NONE reservation should not be charged against the commit
    // limit; Linux needs MAP_NORESERVE for that, other systems do not charge
    // inaccessible mappings.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let flags = if prot == Prot::None {
        flags | libc::MAP_NORESERVE
    } else {
        flags
    };
    let raw = mmap_raw(std::ptr::null_mut(), over, prot, flags, -1, 0)?;
    let start = raw.as_ptr() as usize;
    // The over-reservation ends inside the address space, so this cannot
    // overflow; still, never panic on an allocation path.
    let Some(aligned) = round_up(start, align) else {
        let _ = munmap_best_effort(raw.as_ptr(), over);
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    };
    let head = aligned - start;
    let tail = over - head - len;
    // Trimming cannot be undone halfway: if an unmap fails, release the whole
    // over-reservation and report the error, so the caller holds nothing.
    let trim = (|| {
        if head > 0 {
            munmap(raw.as_ptr(), head)?;
        }
        if tail > 0 {
            // SAFETY: aligned + len is inside the over-reserved mapping.
            munmap(unsafe { (aligned as *mut u8).add(len) }, tail)?;
        }
        Ok(())
    })();
    if let Err(e) = trim {
        let _ = munmap_best_effort(raw.as_ptr(), over);
        return Err(e);
    }
    // SAFETY: aligned >= start > 0.
    Ok(unsafe { NonNull::new_unchecked(aligned as *mut u8) })
}

/// Replace `addr..addr+len` (inside a reservation the caller owns) with
/// anonymous private read-write memory.
pub(crate) fn map_anon_fixed(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    mmap_raw(
        addr.as_ptr(),
        len,
        Prot::ReadWrite,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
        -1,
        0,
    )
    .map(|_| ())
}

/// Replace `addr..addr+len` (inside a reservation the caller owns) with a
/// private read-only view of `fd` starting at `offset` (page aligned). Pages
/// of the view past the end of the file raise SIGBUS when touched: callers map
/// only whole pages that the file covers.
pub(crate) fn map_file_fixed_readonly(
    addr: NonNull<u8>,
    len: usize,
    fd: libc::c_int,
    offset: u64,
) -> io::Result<()> {
    mmap_raw(
        addr.as_ptr(),
        len,
        Prot::Read,
        libc::MAP_PRIVATE | libc::MAP_FIXED,
        fd,
        offset,
    )
    .map(|_| ())
}

/// Unmap `addr..addr+len`.
pub(crate) fn munmap(addr: *mut u8, len: usize) -> io::Result<()> {
    inject(Op::Munmap)?;
    // SAFETY: the caller owns the range; munmap of unmapped pages is harmless
    // to other memory. hugetlb ranges need lengths in whole huge pages, which
    // callers guarantee (else EINVAL and the mapping stays).
    cvt(unsafe { libc::munmap(addr.cast(), len) })
}

/// Unmap without fault injection: for cleanup paths (Drop, error unwinding)
/// where an injected failure would only simulate a leak that cannot happen.
pub(crate) fn munmap_best_effort(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: as for `munmap`.
    cvt(unsafe { libc::munmap(addr.cast(), len) })
}

/// `madvise` advice used by the crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Advice {
    /// `MADV_HUGEPAGE`: back this range with THP when possible.
    HugePage,
    /// `MADV_NOHUGEPAGE`: never back this range with THP.
    NoHugePage,
    /// `MADV_POPULATE_WRITE` (Linux 5.14): prefault writable pages, reporting failure.
    PopulateWrite,
    /// `MADV_DONTNEED`: drop the pages; anonymous memory reads back as zero.
    DontNeed,
    /// `MADV_DONTDUMP`: leave the range out of core dumps.
    DontDump,
}

/// `madvise(addr, len, advice)`.
pub(crate) fn madvise(addr: *mut u8, len: usize, advice: Advice) -> io::Result<()> {
    inject(Op::Madvise)?;
    #[cfg(target_os = "linux")]
    let raw = match advice {
        Advice::HugePage => libc::MADV_HUGEPAGE,
        Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
        Advice::PopulateWrite => 23, // MADV_POPULATE_WRITE
        Advice::DontNeed => libc::MADV_DONTNEED,
        Advice::DontDump => libc::MADV_DONTDUMP,
    };
    #[cfg(not(target_os = "linux"))]
    let raw = match advice {
        Advice::DontNeed => libc::MADV_DONTNEED,
        _ => return Err(io::Error::from_raw_os_error(libc::ENOTSUP)),
    };
    loop {
        // SAFETY: advice about a range the caller owns; DONTNEED zeroes it,
        // which callers request only for memory no live reference points into.
        match cvt(unsafe { libc::madvise(addr.cast(), len, raw) }) {
            // POPULATE_WRITE may be interrupted by a signal.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            r => return r,
        }
    }
}

/// Resize the mapping at `old` in place (`new_addr == None`, no move), or
/// move it onto `new_addr` (`MREMAP_MAYMOVE | MREMAP_FIXED`), which atomically
/// replaces whatever was mapped there (a reservation of the caller's).
/// hugetlb mappings cannot grow (`EINVAL`).
#[cfg(target_os = "linux")]
pub(crate) fn mremap(
    old: NonNull<u8>,
    old_len: usize,
    new_len: usize,
    new_addr: Option<NonNull<u8>>,
) -> io::Result<NonNull<u8>> {
    inject(Op::Mremap)?;
    // SAFETY: the caller owns the old mapping and, when moving, the
    // destination reservation; no reference into the old range outlives this.
    let p = unsafe {
        match new_addr {
            None => libc::mremap(old.as_ptr().cast(), old_len, new_len, 0),
            Some(dst) => libc::mremap(
                old.as_ptr().cast(),
                old_len,
                new_len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dst.as_ptr().cast::<libc::c_void>(),
            ),
        }
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn mremap(
    _old: NonNull<u8>,
    _old_len: usize,
    _new_len: usize,
    _new_addr: Option<NonNull<u8>>,
) -> io::Result<NonNull<u8>> {
    inject(Op::Mremap)?;
    Err(io::Error::from_raw_os_error(libc::ENOTSUP))
}

/// Bind `addr..addr+len` to NUMA node `node` (`MPOL_BIND`, `MPOL_MF_MOVE`).
/// libc has no wrapper for `mbind`, so this is the raw system call.
#[cfg(target_os = "linux")]
pub(crate) fn mbind(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    inject(Op::Mbind)?;
    const MPOL_BIND: libc::c_long = 2;
    const MPOL_MF_MOVE: libc::c_ulong = 1 << 1;
    const BITS: usize = 1024;
    if node as usize >= BITS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut mask = [0 as libc::c_ulong; BITS / (8 * std::mem::size_of::<libc::c_ulong>())];
    let word_bits = 8 * std::mem::size_of::<libc::c_ulong>();
    mask[node as usize / word_bits] |= 1 << (node as usize % word_bits);
    // SAFETY: `mask` outlives the call and holds BITS bits; the range is owned
    // by the caller.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            BITS as libc::c_ulong + 1,
            MPOL_MF_MOVE,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn mbind(_addr: *mut u8, _len: usize, _node: u32) -> io::Result<()> {
    inject(Op::Mbind)?;
    Err(io::Error::from_raw_os_error(libc::ENOTSUP))
}

/// Lock `addr..addr+len` into RAM (`mlock`); counts against `RLIMIT_MEMLOCK`.
pub(crate) fn mlock(addr: *mut u8, len: usize) -> io::Result<()> {
    inject(Op::Mlock)?;
    // SAFETY: mlock only changes residency of a range the caller owns.
    cvt(unsafe { libc::mlock(addr.cast(), len) })
}

/// A file descriptor opened read-only, closed on drop.
#[derive(Debug)]
pub(crate) struct Fd(libc::c_int);

impl Fd {
    pub(crate) fn raw(&self) -> libc::c_int {
        self.0
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

#[cfg(not(target_os = "linux"))]
pub(crate) fn fadvise_sequential(_fd: &Fd, _offset: u64, _len: u64) -> io::Result<()> {
    inject(Op::Fadvise)?;
    Ok(())
}

/// `getenv` without allocating (std::env::var allocates, which the global
/// allocator's paths must not). Returns the value's bytes; the environment is
/// not modified by this crate, so the slice stays valid while nobody calls
/// `setenv`.
pub(crate) fn getenv(name: &std::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated; the returned pointer, if any, points
    // into the environment block.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
}

/// Read a small file (a sysfs or procfs knob) into `buf` without allocating;
/// returns the bytes read.
pub(crate) fn read_small_file<'a>(path: &std::ffi::CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let fd = Fd(fd);
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: the slice tail is valid for writes.
        let n = unsafe { libc::read(fd.0, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return None;
        }
        if n == 0 {
            break;
        }
        len += n as usize;
    }
    Some(&buf[..len])
}

/// `RLIMIT_MEMLOCK` as (soft, hard) in bytes; `None` stands for unlimited.
pub(crate) fn memlock_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    // SAFETY: plain out-struct.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) })?;
    let conv = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            None
        } else {
            #[allow(clippy::unnecessary_cast)]
            Some(v as u64)
        }
    };
    Ok((conv(rl.rlim_cur), conv(rl.rlim_max)))
}

/// Monotonic clock in nanoseconds (`CLOCK_MONOTONIC`), without allocating.
pub(crate) fn monotonic_ns() -> u64 {
    // SAFETY: plain out-struct.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// One run of pages reported by `PAGEMAP_SCAN`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PageRun {
    pub start: u64,
    pub end: u64,
    pub huge: bool,
}

/// Walk the present pages of `start..end` in this process with the
/// `PAGEMAP_SCAN` ioctl (Linux 6.7+) on `/proc/self/pagemap`, calling `f` for
/// each run of present pages with whether they are huge (THP or hugetlb).
/// `Err(ENOTTY / EINVAL)` means the kernel lacks the ioctl.
#[cfg(target_os = "linux")]
pub(crate) fn pagemap_scan(start: u64, end: u64, mut f: impl FnMut(PageRun)) -> io::Result<()> {
    #[repr(C)]
    struct PmScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct PageRegion {
        start: u64,
        end: u64,
        categories: u64,
    }
    const PAGE_IS_PRESENT: u64 = 1 << 3;
    const PAGE_IS_HUGE: u64 = 1 << 6;
    // _IOWR('f', 16, struct pm_scan_arg): dir 3 << 30 | size << 16 | 'f' << 8 | 16.
    const PAGEMAP_SCAN: libc::c_ulong =
        (3 << 30) | ((std::mem::size_of::<PmScanArg>() as libc::c_ulong) << 16) | (0x66 << 8) | 16;

    let fd = open_readonly(std::path::Path::new("/proc/self/pagemap"))?;
    let mut regions = [PageRegion {
        start: 0,
        end: 0,
        categories: 0,
    }; 128];
    let mut cursor = start;
    while cursor < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: cursor,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            category_inverted: 0,
            category_mask: 0,
            category_anyof_mask: PAGE_IS_PRESENT,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_HUGE,
        };
        // SAFETY: `arg` and `regions` are valid for the ioctl's reads/writes;
        // the kernel writes at most `vec_len` regions.
        let n = unsafe { libc::ioctl(fd.raw(), PAGEMAP_SCAN as _, &mut arg as *mut PmScanArg) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for r in &regions[..n as usize] {
            f(PageRun {
                start: r.start,
                end: r.end,
                huge: r.categories & PAGE_IS_HUGE != 0,
            });
        }
        if arg.walk_end <= cursor {
            break;
        }
        cursor = arg.walk_end;
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn pagemap_scan(_start: u64, _end: u64, _f: impl FnMut(PageRun)) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(libc::ENOTSUP))
}
