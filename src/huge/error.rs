//! [`HugeError`]: why a huge-page mapping failed.

use crate::tier::Backing;
use std::fmt;
use std::io;

/// Why a huge-page mapping failed. Every variant names the request (bytes)
/// and, where the OS refused, the errno and a remedy.
#[derive(Debug)]
#[non_exhaustive]
pub enum HugeError {
    /// A zero-byte request.
    ZeroSize,
    /// `requested` bytes cannot be rounded up to the page size without
    /// overflowing, or exceed `isize::MAX`.
    TooLarge {
        /// Requested bytes.
        requested: usize,
    },
    /// The alignment is not a power of two.
    BadAlignment {
        /// Requested alignment in bytes.
        align: usize,
    },
    /// The kernel refused the mapping itself (`mmap`).
    Map {
        /// Requested bytes.
        requested: usize,
        /// Bytes the mapping would have covered.
        mapped_len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// [`HugeOptions::require`](super::HugeOptions::require) asked for a tier that is not available.
    TierUnavailable {
        /// Requested bytes.
        requested: usize,
        /// The tier that was required.
        required: Backing,
        /// The error of the last attempt at that tier, if one was made.
        source: Option<io::Error>,
    },
    /// NUMA binding failed.
    Mbind {
        /// The node asked for.
        node: u32,
        /// The OS error.
        source: io::Error,
    },
    /// Prefaulting (`MADV_POPULATE_WRITE`) failed.
    Populate {
        /// Bytes that were to be prefaulted.
        bytes: usize,
        /// The OS error.
        source: io::Error,
    },
    /// `mlock` failed.
    Mlock {
        /// Bytes that were to be locked.
        bytes: usize,
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for HugeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HugeError::ZeroSize => write!(f, "huge-page allocation of 0 bytes"),
            HugeError::TooLarge { requested } => write!(
                f,
                "huge-page allocation of {requested} bytes: rounding up to the page size overflows \
                 or exceeds isize::MAX"
            ),
            HugeError::BadAlignment { align } => {
                write!(f, "alignment {align} is not a power of two")
            }
            HugeError::Map {
                requested,
                mapped_len,
                source,
            } => write!(
                f,
                "mmap of {mapped_len} bytes (for {requested} requested) failed: {source}; \
                 check RLIMIT_AS, vm.overcommit_memory and the cgroup memory limit"
            ),
            HugeError::TierUnavailable {
                requested,
                required,
                source,
            } => {
                write!(
                    f,
                    "{required} pages required for {requested} bytes but not available"
                )?;
                if let Some(e) = source {
                    write!(f, " ({e})")?;
                }
                match required {
                    Backing::Hugetlb => write!(
                        f,
                        "; reserve pages, e.g. `echo 512 > /proc/sys/vm/nr_hugepages` \
                         (1 GiB pages: /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages)"
                    ),
                    Backing::TransparentHuge => write!(
                        f,
                        "; enable THP: `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` \
                         and unset CKALLOC_THP=0"
                    ),
                    Backing::Normal => Ok(()),
                }
            }
            HugeError::Mbind { node, source } => write!(
                f,
                "binding to NUMA node {node} failed: {source}; check the node exists \
                 (/sys/devices/system/node) and the cpuset allows it"
            ),
            HugeError::Populate { bytes, source } => write!(
                f,
                "prefaulting {bytes} bytes (MADV_POPULATE_WRITE) failed: {source}; \
                 the memory or cgroup limit is too low, or the kernel is older than 5.14"
            ),
            HugeError::Mlock { bytes, source } => write!(
                f,
                "mlock of {bytes} bytes failed: {source}; raise RLIMIT_MEMLOCK (`ulimit -l`) \
                 or run with CAP_IPC_LOCK"
            ),
        }
    }
}

impl std::error::Error for HugeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HugeError::Map { source, .. }
            | HugeError::Mbind { source, .. }
            | HugeError::Populate { source, .. }
            | HugeError::Mlock { source, .. } => Some(source),
            HugeError::TierUnavailable {
                source: Some(s), ..
            } => Some(s),
            _ => None,
        }
    }
}
