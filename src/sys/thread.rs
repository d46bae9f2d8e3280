//! A detached helper thread made with `pthread_create` (not
//! `std::thread`, which allocates through the global allocator the thread
//! may be part of), and sleeping on the monotonic clock.

use super::fault::{inject, Op};
use std::ffi::CStr;
use std::io;

/// Stack of a helper thread (256 KiB): its code keeps small buffers on the
/// stack and calls nothing deep.
const STACK: usize = 256 << 10;

/// Start `entry(null)` on a detached thread, with every signal blocked in it (it inherits the mask, as
/// jemalloc's background threads do), so the program's signal handlers
/// never run on it. The caller's signal mask is as it was afterwards. The
/// thread names itself ([`name_this_thread`]): a detached thread may have
/// exited by the time `pthread_create` returns, and its `pthread_t` with it.
///
/// `pthread_create` allocates the thread's stack with `mmap` and its
/// thread-local blocks with the C library's `malloc`; a caller inside an
/// allocator must keep that `malloc` from coming back to it.
///
/// # Errors
/// `pthread_create`'s error (`EAGAIN` at a thread or process limit, `EPERM`
/// under a seccomp filter that refuses `clone`), or `pthread_attr_*`'s.
pub(crate) fn spawn_detached(
    entry: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
) -> io::Result<()> {
    inject(Op::Thread)?;
    let err = |rc: libc::c_int| io::Error::from_raw_os_error(rc);
    // SAFETY: pthread_attr_t is plain data that pthread_attr_init sets up.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to an attribute object.
    let rc = unsafe { libc::pthread_attr_init(&mut attr) };
    if rc != 0 {
        return Err(err(rc));
    }
    // SAFETY: sigset_t is plain data that sigfillset initialises.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `attr` was initialised above and is destroyed below; the sets
    // are valid; `entry` is an `extern "C"` function for the life of the
    // process; `thread` is a valid out pointer.
    let rc = unsafe {
        let mut rc = libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        if rc == 0 {
            rc = libc::pthread_attr_setstacksize(&mut attr, STACK);
        }
        if rc == 0 {
            libc::sigfillset(&mut all);
            rc = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            if rc == 0 {
                let mut thread: libc::pthread_t = std::mem::zeroed();
                rc = libc::pthread_create(&mut thread, &attr, entry, std::ptr::null_mut());
                libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
        }
        libc::pthread_attr_destroy(&mut attr);
        rc
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(err(rc))
    }
}

/// Name the calling thread `name` (at most 15 bytes; longer names are cut
/// by the kernel) for `top -H`, `ps -L` and debuggers
/// (`prctl(PR_SET_NAME)`, prctl(2)). A name changes nothing else, so a
/// failure is ignored; a no-op off Linux.
pub(crate) fn name_this_thread(name: &CStr) {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of which the kernel
    // copies at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
    }
    #[cfg(not(target_os = "linux"))]
    let _ = name;
}

/// Leave a real-time scheduling policy the calling thread inherited: a
/// thread started by a `SCHED_FIFO` or `SCHED_RR` thread goes to
/// `SCHED_OTHER`, keeping its nice value (pthread_setschedparam(3), which
/// glibc and musl both implement; a thread may always lower its own
/// policy). Any other policy, and its nice value, stay as they are. A
/// failure (a seccomp filter) leaves the policy as it was; a no-op off
/// Linux.
pub(crate) fn leave_real_time() {
    #[cfg(target_os = "linux")]
    // SAFETY: pthread_self() names the calling thread, alive for the
    // calls; `policy` and `param` are valid for writes and reads for each
    // call's duration.
    unsafe {
        let me = libc::pthread_self();
        let mut policy = 0;
        let mut param = libc::sched_param { sched_priority: 0 };
        if libc::pthread_getschedparam(me, &mut policy, &mut param) == 0
            && (policy == libc::SCHED_FIFO || policy == libc::SCHED_RR)
        {
            let normal = libc::sched_param { sched_priority: 0 };
            libc::pthread_setschedparam(me, libc::SCHED_OTHER, &normal);
        }
    }
}

/// Sleep `ns` nanoseconds on the monotonic clock; a signal cuts it short
/// (the caller's loop sleeps again).
pub(crate) fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec; no remainder wanted.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    static RAN: AtomicBool = AtomicBool::new(false);
    static NAMED: AtomicBool = AtomicBool::new(false);

    extern "C" fn mark(_: *mut libc::c_void) -> *mut libc::c_void {
        name_this_thread(c"ck-test");
        let mut name = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
        unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
        NAMED.store(name.starts_with(b"ck-test\0"), Ordering::Release);
        RAN.store(true, Ordering::Release);
        std::ptr::null_mut()
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri does not model pthread_create with attributes")]
    fn a_detached_thread_runs_and_the_caller_keeps_its_signal_mask() {
        // SAFETY: plain data initialised by pthread_sigmask.
        let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out pointer; a null set only reads the mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut before) };
        spawn_detached(mark).unwrap();
        // SAFETY: as above.
        let mut after: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut after) };
        for sig in 1..32 {
            // SAFETY: valid sets and signal numbers.
            let (b, a) = unsafe {
                (
                    libc::sigismember(&before, sig),
                    libc::sigismember(&after, sig),
                )
            };
            assert_eq!(b, a, "signal {sig}");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !RAN.load(Ordering::Acquire) {
            assert!(std::time::Instant::now() < deadline, "the thread never ran");
            sleep_ns(1_000_000);
        }
        assert!(NAMED.load(Ordering::Acquire), "the thread named itself");
    }
}
