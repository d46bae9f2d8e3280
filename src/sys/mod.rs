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
//! The submodules follow memmap2's seams: [`mappings`] (`mmap`, `munmap`,
//! `madvise`, `mremap`, `mbind`, `mlock`), [`files`] (`open`, `fstat`,
//! `pread`, `posix_fadvise`, `O_TMPFILE` + `linkat`), [`process`] (environment, sysfs/procfs reads,
//! limits, clock, page map), [`thread`] (a detached helper thread, sleeping), [`fault`] (test-only fault injection, armed with
//! `--cfg ckalloc_fault_injection`), and `unsupported`, the non-Linux
//! fallbacks of the Linux-only calls.

pub(crate) mod fault;
mod files;
mod kept;
mod mappings;
mod process;
mod thread;
#[cfg(not(target_os = "linux"))]
mod unsupported;

pub(crate) use files::{fstat, open_readonly, pread_exact, Fd};
#[cfg(feature = "weights")]
pub(crate) use files::{link_unnamed, open_unnamed_in, unnamed_unsupported};
pub(crate) use kept::{KeptFile, KeptSlot};
pub(crate) use mappings::{
    commit_read_write, madvise, map_aligned, mlock, munlock, munmap, munmap_best_effort, purge,
    Advice, HugetlbSize, Prot, Source,
};
#[cfg(feature = "weights")]
pub(crate) use process::block_termination_signals;
pub(crate) use process::{
    address_space_limited, environment_ready, getenv, leading_u64, linux_at_least, memlock_limit,
    monotonic_ns, read_small_file, register_atfork, thread_cpu_ns, thread_minor_faults, SchedStat,
};
#[cfg(all(feature = "preload", target_os = "linux", target_env = "gnu"))]
pub(crate) use process::{coarse_monotonic_ns, env_entries, program_break, secure_execution};
pub(crate) use thread::{leave_real_time, name_this_thread, sleep_ns, spawn_detached};

#[cfg(target_os = "linux")]
use mappings::advice_raw;
#[cfg(not(target_os = "linux"))]
use unsupported::advice_raw;
#[cfg(not(target_os = "linux"))]
pub(crate) use unsupported::{
    fadvise_sequential, map_hugetlb, mbind, mremap_fixed, pagemap_scan, resident_pages,
};
#[cfg(target_os = "linux")]
pub(crate) use {
    files::fadvise_sequential,
    mappings::{
        map_file_fixed_readonly, map_hugetlb, map_hugetlb_fixed, mbind, mremap_fixed,
        probe_file_readonly, reserve_aligned, resident_pages,
    },
    process::pagemap_scan,
};

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A Linux release, as (major, minor): the first release with a kernel
/// feature the crate uses. The documentation cites these constants.
pub(crate) type Linux = (u32, u32);
/// `MREMAP_DONTUNMAP` for private anonymous mappings: a move that leaves
/// the source mapped and empty.
pub(crate) const LINUX_MREMAP_DONTUNMAP: Linux = (5, 7);
/// `mremap` moves a range of several VMAs (one by one): a move that fails
/// midway leaves the VMAs before the failing one moved.
pub(crate) const LINUX_MREMAP_MULTI_VMA: Linux = (6, 17);
/// `MADV_POPULATE_WRITE`: prefault writable pages, reporting failure.
pub(crate) const LINUX_MADV_POPULATE_WRITE: Linux = (5, 14);
/// `MADV_COLLAPSE`: collapse a range into huge pages on request.
pub(crate) const LINUX_MADV_COLLAPSE: Linux = (6, 1);
/// `mremap` moves hugetlb mappings (it refused them before).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) const LINUX_HUGETLB_MREMAP: Linux = (5, 16);
/// The `PAGEMAP_SCAN` ioctl on `/proc/self/pagemap`.
pub(crate) const LINUX_PAGEMAP_SCAN: Linux = (6, 7);

/// The huge page size the crate rounds to (2 MiB), in bytes.
pub(crate) const HUGE_PAGE_2M: usize = 2 << 20;
/// The gigantic page size (1 GiB), in bytes.
pub(crate) const HUGE_PAGE_1G: usize = 1 << 30;

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
