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
//! limits, clock, page map), [`fault`] (test-only fault injection, armed with
//! `--cfg ckalloc_fault_injection`), and `unsupported`, the non-Linux
//! fallbacks of the Linux-only calls.

pub(crate) mod fault;
mod files;
mod mappings;
mod process;
#[cfg(not(target_os = "linux"))]
mod unsupported;

pub(crate) use files::{fstat, open_readonly, pread_exact, Fd};
#[cfg(feature = "weights")]
pub(crate) use files::{link_unnamed, open_unnamed_in, unnamed_unsupported};
pub(crate) use mappings::{
    commit_read_write, is_mapped, madvise, map_anon_aligned, mlock, munmap, munmap_best_effort,
    reserve_aligned, Advice, HugetlbSize, VmaQuery,
};
#[cfg(feature = "weights")]
pub(crate) use process::block_termination_signals;
pub(crate) use process::{
    environment_ready, getenv, memlock_limit, monotonic_ns, read_small_file, register_atfork,
};

#[cfg(target_os = "linux")]
use mappings::advice_raw;
#[cfg(not(target_os = "linux"))]
use unsupported::advice_raw;
#[cfg(not(target_os = "linux"))]
pub(crate) use unsupported::{fadvise_sequential, map_hugetlb, mbind, mremap, pagemap_scan};
#[cfg(target_os = "linux")]
pub(crate) use {
    files::fadvise_sequential,
    mappings::{
        map_file_fixed_readonly, map_hugetlb, map_hugetlb_fixed, mbind, mremap, probe_file_readonly,
    },
    process::pagemap_scan,
};

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

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
