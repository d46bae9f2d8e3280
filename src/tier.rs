//! The huge-page tiers: [`Backing`] (which tier backs a mapping) and the
//! kernel's THP mode, read from sysfs without allocating.

use crate::{env, sys};
use std::ffi::CStr;
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

/// The sysfs file holding the kernel's THP mode.
pub(crate) const THP_ENABLED: &CStr = c"/sys/kernel/mm/transparent_hugepage/enabled";
/// The sysfs file holding the kernel's THP defrag mode.
pub(crate) const THP_DEFRAG: &CStr = c"/sys/kernel/mm/transparent_hugepage/defrag";

/// The kernel's THP mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThpMode {
    Always,
    Madvise,
    Never,
    Unsupported,
}

/// The kernel's THP mode, read once from [`THP_ENABLED`] and cached. Never
/// allocates.
fn thp_mode() -> ThpMode {
    static MODE: AtomicU8 = AtomicU8::new(0);
    let m = MODE.load(Ordering::Relaxed);
    let decode = |m| match m {
        1 => ThpMode::Always,
        2 => ThpMode::Madvise,
        3 => ThpMode::Never,
        _ => ThpMode::Unsupported,
    };
    if m != 0 {
        return decode(m);
    }
    let mut buf = [0u8; 128];
    let m = match sysfs_choice(THP_ENABLED, &mut buf) {
        Some(b"always") => 1,
        Some(b"madvise") => 2,
        Some(b"never") => 3,
        _ => 4,
    };
    MODE.store(m, Ordering::Relaxed);
    decode(m)
}

/// THP is usable when `CKALLOC_THP` allows it ([`env::thp_allowed`]) and the
/// kernel's mode is not `never` (read once from sysfs). Never allocates.
pub(crate) fn thp_enabled() -> bool {
    if !env::thp_allowed() {
        return false;
    }
    !matches!(thp_mode(), ThpMode::Never | ThpMode::Unsupported)
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

/// The selected word of a sysfs choice file (`always [madvise] never`), read
/// into `buf` without allocating; `None` when the file cannot be read or has
/// no bracketed word.
pub(crate) fn sysfs_choice<'a>(path: &CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    selected_word(sys::read_small_file(path, buf)?)
}

/// The bracketed word of a sysfs choice file: `always [madvise] never`.
fn selected_word(text: &[u8]) -> Option<&[u8]> {
    let open = text.iter().position(|&b| b == b'[')?;
    let close = text[open..].iter().position(|&b| b == b']')? + open;
    Some(&text[open + 1..close])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_word_is_the_bracketed_one() {
        assert_eq!(
            selected_word(b"always [madvise] never\n"),
            Some(&b"madvise"[..])
        );
        assert_eq!(
            selected_word(b"[always] madvise never"),
            Some(&b"always"[..])
        );
        assert_eq!(selected_word(b"always madvise never"), None);
        assert_eq!(selected_word(b"always [madvise"), None);
    }
}
