//! This process and its kernel interfaces: the environment, small sysfs and
//! procfs files, `RLIMIT_MEMLOCK`, the monotonic clock and the page map.

use super::cvt;
#[cfg(target_os = "linux")]
use super::files::open_readonly;
use super::files::Fd;
use crate::units;
use std::io;

/// `getenv` without allocating (std::env::var allocates, which the global
/// allocator's paths must not), and `None` in secure-execution mode
/// ([`secure_execution`]), as glibc's `secure_getenv(3)`: a set-user-ID
/// program reads none of the variables ckalloc reads on its own, so the
/// user who starts it cannot turn them on for the program's owner (a file
/// path in `CKALLOC_STATS_FILE` written with the owner's rights), as glibc
/// ignores its own `MALLOC_*` variables there and jemalloc its
/// `MALLOC_CONF`. Returns the value's bytes; the environment is not
/// modified by this crate, so the slice stays valid while nobody calls
/// `setenv`.
pub(crate) fn getenv(name: &std::ffi::CStr) -> Option<&'static [u8]> {
    if secure_execution() {
        return None;
    }
    // SAFETY: `name` is NUL-terminated; the returned pointer, if any, points
    // into the environment block.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
}

extern "C" {
    /// The C library's environment: a null-terminated array of pointers to
    /// `NAME=value` strings, null until the C library has set it up.
    /// Mutable: the C library sets it after this library may already run
    /// (a preloaded allocator is called by the dynamic loader), and
    /// `setenv`, `putenv` and `clearenv` replace it.
    static mut environ: *const *const libc::c_char;
}

/// The C library's `environ` pointer, read once.
fn environ_now() -> *const *const libc::c_char {
    // SAFETY: a read through a raw pointer (no reference to the mutable
    // static) of a pointer-sized word the C library writes at start-up and
    // in `setenv`/`putenv`/`clearenv`; this crate never changes the
    // environment, and a program that does so on another thread races with
    // every `getenv` as well.
    unsafe { std::ptr::addr_of!(environ).read_volatile() }
}

/// Whether the C library has set up the environment (`environ` is not
/// null). A preloaded allocator is called by the dynamic loader before
/// that, when `getenv` finds nothing whatever the environment holds.
pub(crate) fn environment_ready() -> bool {
    !environ_now().is_null()
}

/// The program break (`sbrk(0)`, `brk(2)`): the end of glibc's main
/// heap while it grows with `brk`, so a fall shows that glibc trimmed the
/// heap's top and a rise that it grew again. glibc answers from its cached
/// break (a system call only on the first use). Never allocates.
#[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
pub(crate) fn program_break() -> usize {
    // SAFETY: `sbrk(0)` changes nothing; it returns the break or
    // `(void *)-1`, both only compared as numbers.
    unsafe { libc::sbrk(0) as usize }
}

/// Whether the program runs in secure-execution mode (`AT_SECURE`:
/// set-user-ID, set-group-ID or with capabilities; `getauxval(3)`,
/// `ld.so(8)`), in which glibc ignores the environment's tunables marked
/// `SXID_IGNORE` and [`getenv`] reads no variable. Never allocates.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn secure_execution() -> bool {
    // SAFETY: reads the auxiliary vector the kernel passed at `execve`; no
    // side effect.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Secure-execution mode is Linux's `AT_SECURE`; elsewhere, and under Miri
/// (which has no `getauxval` and runs no set-user-ID program), the
/// environment is read as it is.
#[cfg(any(not(target_os = "linux"), miri))]
pub(crate) fn secure_execution() -> bool {
    false
}

/// Every entry of the environment as (name, value), in order, without
/// allocating; an entry without `=` is skipped, as glibc skips it. Unlike
/// `getenv`, which returns the first entry of a name, it shows every one: a
/// program started with a raw `execve` may carry a name twice, and glibc's
/// tunables read every `GLIBC_TUNABLES` entry (`elf/dl-tunables.c`, a later
/// entry setting over an earlier one).
///
/// The caller does not change the environment while it walks it, and
/// neither does another thread (the contract of `getenv` too): `setenv`
/// and `clearenv` may free the array, and `putenv` strings belong to the
/// program. Called from the preload library's constructor.
#[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
pub(crate) fn env_entries() -> impl Iterator<Item = (&'static [u8], &'static [u8])> {
    let mut at = environ_now();
    std::iter::from_fn(move || loop {
        if at.is_null() {
            return None;
        }
        // SAFETY: `at` points at an element of `environ`'s array: its
        // first, or one after an element that was not its terminating null
        // (the array is not changed meanwhile, as the caller ensures).
        let entry = unsafe { at.read() };
        if entry.is_null() {
            return None;
        }
        // SAFETY: `entry` is not the terminating null, so the element after
        // it is still inside the array (at most that null).
        at = unsafe { at.add(1) };
        // SAFETY: every element before the terminating null points at a
        // NUL-terminated `NAME=value` string that stays while the
        // environment is not changed (the caller's contract).
        let bytes = unsafe { std::ffi::CStr::from_ptr(entry) }.to_bytes();
        if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
            return Some((&bytes[..eq], &bytes[eq + 1..]));
        }
    })
}

/// Read a small file (a sysfs or procfs knob) into `buf` without allocating;
/// returns the bytes read.
pub(crate) fn read_small_file<'a>(path: &std::ffi::CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    if cfg!(miri) {
        // Miri's isolation refuses `open`: no sysfs or procfs there.
        return None;
    }
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let fd = Fd::from_raw(fd);
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: the slice tail is valid for writes.
        let n = unsafe { libc::read(fd.raw(), buf[len..].as_mut_ptr().cast(), buf.len() - len) };
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

/// The leading decimal number of `text` (ASCII whitespace before it
/// skipped), as sysfs and procfs print them; `None` when there is none or
/// it overflows.
pub(crate) fn leading_u64(text: &[u8]) -> Option<u64> {
    let start = text.iter().position(|b| !b.is_ascii_whitespace())?;
    let text = &text[start..];
    let end = text.iter().position(|b| !b.is_ascii_digit());
    units::decimal(&text[..end.unwrap_or(text.len())])
}

/// This thread's scheduler statistics, `/proc/thread-self/schedstat`
/// (Linux's `sched_info`; proc(5)), open to be read again and again: one
/// `pread` per reading, no allocation. Opened by the thread it describes.
pub(crate) struct SchedStat(Fd);

impl SchedStat {
    /// Open the calling thread's file; `None` when it cannot be opened.
    pub(crate) fn open() -> Option<SchedStat> {
        if cfg!(miri) {
            // Miri's isolation refuses `open`.
            return None;
        }
        // SAFETY: NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c"/proc/thread-self/schedstat".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        (fd >= 0).then(|| SchedStat(Fd::from_raw(fd)))
    }

    /// The thread's run-queue delay so far: nanoseconds it was runnable
    /// but waiting for a CPU. `None` when the file cannot be read or the
    /// kernel keeps no scheduler statistics ([`parse_run_delay`]).
    pub(crate) fn run_delay_ns(&self) -> Option<u64> {
        run_delay_of(self.0.raw())
    }
}

/// Up to `buf.len()` bytes of descriptor `fd` from its start (one `pread`
/// at offset 0, no allocation); `None` when the read fails.
pub(super) fn read_from_start(fd: libc::c_int, buf: &mut [u8]) -> Option<&[u8]> {
    // SAFETY: `buf` is valid for `buf.len()` writable bytes.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    buf.get(..usize::try_from(n).ok()?)
}

/// The run-queue delay read from `fd`, a `schedstat` file open for reading
/// ([`parse_run_delay`]).
pub(super) fn run_delay_of(fd: libc::c_int) -> Option<u64> {
    let mut buf = [0u8; 96];
    parse_run_delay(read_from_start(fd, &mut buf)?)
}

/// The run-queue delay of a `schedstat` line: its second field, of three
/// (time on a CPU and run-queue delay in nanoseconds, then the times the
/// thread got a CPU). `None` when the line does not parse, or when it reads
/// `0 0 0`, as a kernel that keeps no scheduler statistics prints it (a
/// thread that ran has got a CPU at least once).
pub(super) fn parse_run_delay(line: &[u8]) -> Option<u64> {
    let mut fields = line.split(|&b| b == b' ').map(leading_u64);
    let (_, delay, slices) = (fields.next()??, fields.next()??, fields.next()??);
    (slices > 0).then_some(delay)
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

/// Whether the running kernel is Linux `at_least` (major, minor) or
/// later, read once from `uname(2)` and cached; `false` on other systems
/// and when the release does not parse. Never allocates.
pub(crate) fn linux_at_least(at_least: super::Linux) -> bool {
    static RELEASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let mut r = RELEASE.load(std::sync::atomic::Ordering::Relaxed);
    if r == 0 {
        // Bit 0: read; bits 1..17: minor; bits 17..32: major.
        r = 1 | linux_release().map_or(0, |(major, minor)| {
            (major.min(0x7fff) << 17) | (minor.min(0xffff) << 1)
        });
        RELEASE.store(r, std::sync::atomic::Ordering::Relaxed);
    }
    let (major, minor) = (r >> 17, (r >> 1) & 0xffff);
    cfg!(target_os = "linux") && (major, minor) >= at_least
}

/// The (major, minor) of `uname(2)`'s release (`6.18.0-1-amd64`).
fn linux_release() -> Option<(u32, u32)> {
    // SAFETY: plain out-struct of byte arrays.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let release = u.release.map(|c| c as u8);
    let mut parts = release.split(|&b| !b.is_ascii_digit());
    let number = |p: Option<&[u8]>| -> Option<u32> {
        let p = p.filter(|p| !p.is_empty() && p.len() < 6)?;
        p.iter()
            .try_fold(0u32, |n, &d| Some(n * 10 + u32::from(d - b'0')))
    };
    Some((number(parts.next())?, number(parts.next())?))
}

/// Whether `RLIMIT_AS` (the address-space limit of `ulimit -v`) is finite
/// now. Never allocates.
pub(crate) fn address_space_limited() -> bool {
    // SAFETY: plain out-struct.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0;
    ok && rl.rlim_cur != libc::RLIM_INFINITY
}

/// Clock `id` (clock_gettime(2)) in nanoseconds, saturating; 0 where the
/// clock cannot be read. Never allocates.
fn clock_ns(id: libc::clockid_t) -> u64 {
    // SAFETY: plain out-struct.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer; an unknown clock returns -1, leaving zeros.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The calling thread's minor page faults so far (`getrusage` with
/// `RUSAGE_THREAD`, Linux 2.6.26); `None` where it cannot be read.
#[cfg(target_os = "linux")]
pub(crate) fn thread_minor_faults() -> Option<u64> {
    // SAFETY: `rusage` is plain data, which the call fills in.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to an `rusage` for the call to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    (rc == 0).then(|| u64::try_from(r.ru_minflt).unwrap_or(0))
}

/// No per-thread fault count outside Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn thread_minor_faults() -> Option<u64> {
    None
}

/// Monotonic clock in nanoseconds (`CLOCK_MONOTONIC`, which always
/// exists), without allocating.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The coarse monotonic clock in nanoseconds (`CLOCK_MONOTONIC_COARSE`:
/// read without a system call or a TSC read, at the kernel tick's
/// resolution, 1-10 ms), without allocating; 0 where it cannot be read.
#[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
pub(crate) fn coarse_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// CPU time of the calling thread in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`): time it ran, in user space or in the
/// kernel, not time it waited for a CPU or blocked. 0 where the clock
/// cannot be read. Never allocates.
pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
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
    // libc 0.2 lacks `struct pm_scan_arg`, `struct page_region`, the
    // `PAGE_IS_*` categories and `PAGEMAP_SCAN` (linux/fs.h, Linux 6.7).
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

/// Registers fork handlers with `pthread_atfork(3)`: `prepare` runs in the
/// forking thread just before `fork()`, `parent` in the parent and `child` in
/// the child just after it. POSIX runs the prepare handlers in the reverse
/// order of registration and the other two in the order of registration, so a
/// module that registers after another takes its locks first and releases
/// them last. Handlers stay registered for the life of the process; the
/// crate registers one set, once (`fork::ensure_registered`, an atomic state
/// rather than a `std::sync::Once`, which a `fork()` mid-registration would
/// leave running forever in the child). `fork()` runs the handlers;
/// `vfork()` and `clone()` without `SIGCHLD` semantics do not.
///
/// `pthread_atfork` itself may allocate through the C library's `malloc`
/// (never through Rust's global allocator). It returns `ENOMEM` when it
/// cannot.
pub(crate) fn register_atfork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> io::Result<()> {
    // SAFETY: the three handlers are `extern "C"` functions with the
    // signature pthread_atfork expects, valid for the life of the process.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// `SIGINT`, `SIGTERM`, `SIGHUP` and `SIGQUIT` blocked in the calling thread
/// (`pthread_sigmask(SIG_BLOCK)`) until the guard drops, which restores the
/// previous mask; a signal that arrived meanwhile is delivered then. Used
/// around short steps that must not be cut in half by Ctrl-C or `kill`
/// (a rename sequence). `SIGKILL` cannot be blocked.
#[cfg(feature = "weights")]
pub(crate) struct TerminationSignalsBlocked(libc::sigset_t);

/// Block the termination signals in this thread; see [`TerminationSignalsBlocked`].
///
/// # Errors
/// The `pthread_sigmask` error (only `EINVAL`, not expected).
#[cfg(feature = "weights")]
pub(crate) fn block_termination_signals() -> io::Result<TerminationSignalsBlocked> {
    // SAFETY: sigset_t is plain data that sigemptyset initialises.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::sigaddset(&mut set, s);
        }
    }
    // SAFETY: valid pointers to initialised sets; pthread_sigmask returns the
    // error number instead of setting errno.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(TerminationSignalsBlocked(old))
}

#[cfg(feature = "weights")]
impl Drop for TerminationSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `block_termination_signals`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
    #[cfg_attr(miri, ignore = "the C library's environ")]
    fn env_entries_name_every_variable_as_getenv_reads_it() {
        let vars: Vec<_> = std::env::vars_os().collect();
        assert!(!vars.is_empty(), "the test runs with an environment");
        let entries: Vec<_> = env_entries().collect();
        for (name, value) in &vars {
            let (name, value) = (name.as_encoded_bytes(), value.as_encoded_bytes());
            let first = entries.iter().find(|(n, _)| *n == name).map(|&(_, v)| v);
            assert_eq!(first, Some(value), "{name:?}");
            // A name cut short is not the variable (no entry's name is
            // matched by its start).
            let short = &name[..name.len() - 1];
            let c = std::ffi::CString::new(short).unwrap();
            let found = entries.iter().find(|(n, _)| *n == short).map(|&(_, v)| v);
            assert_eq!(found, getenv(&c), "{short:?}");
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore = "CLOCK_THREAD_CPUTIME_ID")]
    fn the_thread_cpu_clock_counts_running_not_sleeping() {
        let start = thread_cpu_ns();
        assert!(start > 0, "the thread has run");
        // Run until the clock shows 5 ms: it advances while the thread runs.
        let wall = monotonic_ns();
        while thread_cpu_ns() - start < 5_000_000 {
            assert!(
                monotonic_ns() - wall < 60_000_000_000,
                "no CPU time in 60 s"
            );
        }
        let before = thread_cpu_ns();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_cpu_ns() - before;
        assert!(slept < 25_000_000, "{slept} ns of CPU over a 50 ms sleep");
    }

    #[test]
    fn a_schedstat_line_gives_its_run_queue_delay() {
        assert_eq!(parse_run_delay(b"335463375 894817 24\n"), Some(894_817));
        // No scheduler statistics kept.
        assert_eq!(parse_run_delay(b"0 0 0\n"), None);
        // Kept, for a thread whose time on a CPU is not yet accounted.
        assert_eq!(parse_run_delay(b"0 0 1\n"), Some(0));
        assert_eq!(parse_run_delay(b"12 x 3"), None);
        assert_eq!(parse_run_delay(b""), None);
        assert_eq!(parse_run_delay(b"1 99999999999999999999999 1"), None);
        assert_eq!(leading_u64(b"  42 kB"), Some(42));
        assert_eq!(leading_u64(b"kB"), None);
    }
}
