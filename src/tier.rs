//! The huge-page tiers: [`Backing`] (which tier backs a mapping) and the
//! kernel's THP mode, read from sysfs without allocating.

use crate::env;
use crate::thp::{self, ThpEnabled};
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// What kind of pages back a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backing {
    /// Base pages (4 KiB on x86-64): no huge-page backing was asked for or
    /// available.
    Normal,
    /// Anonymous memory, 2 MiB aligned, advised with `MADV_HUGEPAGE`: the
    /// kernel backs aligned 2 MiB extents with transparent huge pages when it
    /// can (at fault time or later by khugepaged).
    TransparentHuge,
    /// Explicit hugetlb pages (`MAP_HUGETLB`), reserved up front; never split
    /// or swapped.
    Hugetlb,
}

impl Backing {
    /// The tiers, indexed by [`code`](Self::code).
    pub(crate) const ALL: [Backing; 3] =
        [Backing::Normal, Backing::TransparentHuge, Backing::Hugetlb];

    /// A two-bit code of the tier (0, 1, 2), for packed words.
    pub(crate) const fn code(self) -> u64 {
        self as u64
    }

    /// The tier of a [`code`](Self::code); `None` for 3.
    pub(crate) fn from_code(code: u64) -> Option<Backing> {
        Backing::ALL.get(code as usize).copied()
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backing::Normal => "normal pages",
            Backing::TransparentHuge => "THP",
            Backing::Hugetlb => "hugetlb",
        })
    }
}

/// The kernel's THP mode, read once from sysfs and cached. Never
/// allocates.
fn thp_mode() -> Option<ThpEnabled> {
    static MODE: AtomicU8 = AtomicU8::new(0);
    // 0: not read; 1: unsupported; 2 + index in `thp::ENABLED`.
    let m = match MODE.load(Ordering::Relaxed) {
        0 => {
            let mode = thp::enabled();
            let code = mode.and_then(|e| thp::ENABLED.iter().position(|&x| x == e));
            let m = code.map_or(1, |i| i as u8 + 2);
            MODE.store(m, Ordering::Relaxed);
            m
        }
        m => m,
    };
    thp::ENABLED.get(usize::from(m).checked_sub(2)?).copied()
}

/// THP is usable when `CKALLOC_THP` allows it ([`env::thp_allowed`]) and the
/// kernel's mode is not `never` (read once from sysfs). Never allocates.
pub(crate) fn thp_enabled() -> bool {
    if !env::thp_allowed() {
        return false;
    }
    !matches!(thp_mode(), Some(ThpEnabled::Never) | None)
}

/// The tier a mapping made of anonymous memory without hugetlb has: THP when
/// [`thp_enabled`], else normal pages.
pub(crate) fn anon_tier() -> Backing {
    if thp_enabled() {
        Backing::TransparentHuge
    } else {
        Backing::Normal
    }
}
