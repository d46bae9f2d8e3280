//! The kernel's THP settings as one value, [`ThpSettings`]: what a THP fault
//! does when no free 2 MiB block is at hand (`defrag`), and how khugepaged
//! collapses base pages into huge pages later. The meanings follow Linux's
//! `Documentation/admin-guide/mm/transhuge.rst`. Reading them never
//! allocates (the preload library's summary reads them at exit).

use crate::sys;
use std::ffi::CStr;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The sysfs file holding the kernel's THP mode.
pub(crate) const THP_ENABLED: &CStr = c"/sys/kernel/mm/transparent_hugepage/enabled";
/// The sysfs file holding the kernel's THP defrag mode.
pub(crate) const THP_DEFRAG: &CStr = c"/sys/kernel/mm/transparent_hugepage/defrag";

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

/// The kernel's THP mode now (one sysfs read); `None` without THP.
pub(crate) fn enabled() -> Option<ThpEnabled> {
    let mut buf = [0u8; 128];
    sysfs_choice(THP_ENABLED, &mut buf).and_then(ThpEnabled::parse)
}

/// THP's mode (`/sys/kernel/mm/transparent_hugepage/enabled`): which
/// anonymous ranges may get huge pages at a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ThpEnabled {
    /// Every range that does not opt out (`MADV_NOHUGEPAGE`).
    Always,
    /// Ranges advised `MADV_HUGEPAGE`.
    Madvise,
    /// None (`MADV_COLLAPSE` still collapses ranges on request).
    Never,
}

impl ThpEnabled {
    fn parse(word: &[u8]) -> Option<ThpEnabled> {
        Some(match word {
            b"always" => ThpEnabled::Always,
            b"madvise" => ThpEnabled::Madvise,
            b"never" => ThpEnabled::Never,
            _ => return None,
        })
    }

    /// The word sysfs uses for this mode.
    pub fn name(self) -> &'static str {
        match self {
            ThpEnabled::Always => "always",
            ThpEnabled::Madvise => "madvise",
            ThpEnabled::Never => "never",
        }
    }
}

/// THP's `defrag` mode (`/sys/kernel/mm/transparent_hugepage/defrag`): what
/// a fault that wants a huge page does when no free 2 MiB block is at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ThpDefrag {
    /// Every THP fault reclaims and compacts memory synchronously.
    Always,
    /// No THP fault waits: kswapd and kcompactd are woken, the fault takes
    /// base pages, khugepaged collapses them later.
    Defer,
    /// Faults in `MADV_HUGEPAGE` ranges reclaim and compact synchronously,
    /// others act as `Defer`.
    DeferMadvise,
    /// Faults in `MADV_HUGEPAGE` ranges reclaim and compact synchronously,
    /// others take a huge page only when one is free.
    Madvise,
    /// No THP fault reclaims or compacts.
    Never,
}

impl ThpDefrag {
    fn parse(word: &[u8]) -> Option<ThpDefrag> {
        Some(match word {
            b"always" => ThpDefrag::Always,
            b"defer" => ThpDefrag::Defer,
            b"defer+madvise" => ThpDefrag::DeferMadvise,
            b"madvise" => ThpDefrag::Madvise,
            b"never" => ThpDefrag::Never,
            _ => return None,
        })
    }

    /// The word sysfs uses for this mode.
    pub fn name(self) -> &'static str {
        match self {
            ThpDefrag::Always => "always",
            ThpDefrag::Defer => "defer",
            ThpDefrag::DeferMadvise => "defer+madvise",
            ThpDefrag::Madvise => "madvise",
            ThpDefrag::Never => "never",
        }
    }

    /// Whether a fault in a range advised `MADV_HUGEPAGE` may wait on
    /// synchronous reclaim and compaction: `always`, `defer+madvise` and
    /// `madvise`.
    pub fn advised_fault_compacts(self) -> bool {
        matches!(
            self,
            ThpDefrag::Always | ThpDefrag::DeferMadvise | ThpDefrag::Madvise
        )
    }
}

/// khugepaged's settings (`/sys/kernel/mm/transparent_hugepage/khugepaged/`):
/// the kernel thread that collapses base pages of THP-eligible ranges into
/// huge pages in the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Khugepaged {
    /// Whether khugepaged may reclaim and compact to get a huge page
    /// (`defrag`).
    pub defrag: bool,
    /// Base pages scanned per pass (`pages_to_scan`).
    pub pages_to_scan: u64,
    /// Milliseconds between passes (`scan_sleep_millisecs`).
    pub scan_sleep_ms: u64,
    /// Milliseconds to wait after a failed huge-page allocation
    /// (`alloc_sleep_millisecs`).
    pub alloc_sleep_ms: u64,
    /// How many of a 2 MiB range's 512 base pages may be absent for it to
    /// be collapsed (`max_ptes_none`; 511: any range with one present page).
    pub max_ptes_none: u64,
}

/// The kernel's THP settings now ([`thp_settings`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThpSettings {
    /// The THP mode; `None` when the kernel has no THP or prints a mode
    /// this crate does not know.
    pub enabled: Option<ThpEnabled>,
    /// The `defrag` mode; `None` when the kernel has no THP or prints a
    /// mode this crate does not know.
    pub defrag: Option<ThpDefrag>,
    /// khugepaged's settings; `None` when they cannot be read.
    pub khugepaged: Option<Khugepaged>,
}

const KHUGEPAGED: &[&CStr; 5] = &[
    c"/sys/kernel/mm/transparent_hugepage/khugepaged/defrag",
    c"/sys/kernel/mm/transparent_hugepage/khugepaged/pages_to_scan",
    c"/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
    c"/sys/kernel/mm/transparent_hugepage/khugepaged/alloc_sleep_millisecs",
    c"/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none",
];

/// Read the kernel's THP mode, `defrag` mode and khugepaged's settings from
/// sysfs. Reads seven small files each call (about 40 µs); never allocates.
pub fn thp_settings() -> ThpSettings {
    let mut buf = [0u8; 128];
    let enabled = enabled();
    let defrag = sysfs_choice(THP_DEFRAG, &mut buf).and_then(ThpDefrag::parse);
    let mut v = [0u64; 5];
    let mut read_all = true;
    for (path, slot) in KHUGEPAGED.iter().zip(&mut v) {
        match sys::read_small_file(path, &mut buf).and_then(sys::leading_u64) {
            Some(n) => *slot = n,
            None => read_all = false,
        }
    }
    let khugepaged = read_all.then_some(Khugepaged {
        defrag: v[0] != 0,
        pages_to_scan: v[1],
        scan_sleep_ms: v[2],
        alloc_sleep_ms: v[3],
        max_ptes_none: v[4],
    });
    ThpSettings {
        enabled,
        defrag,
        khugepaged,
    }
}

/// [`thp_settings`] as the process first read them, kept in atomics (no
/// lock, so a `fork` child never waits on one): the preload library's
/// summary and every `huge_stats()` after the first read no file.
pub(crate) fn settings_once() -> ThpSettings {
    static READY: AtomicBool = AtomicBool::new(false);
    static WORDS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
    if READY.load(Ordering::Acquire) {
        return decode(&WORDS.each_ref().map(|w| w.load(Ordering::Relaxed)));
    }
    let s = thp_settings();
    // Threads that race here store the same words.
    for (w, v) in WORDS.iter().zip(encode(&s)) {
        w.store(v, Ordering::Relaxed);
    }
    READY.store(true, Ordering::Release);
    s
}

/// Every THP mode, in a fixed order (indices stored in atomics).
pub(crate) const ENABLED: [ThpEnabled; 3] =
    [ThpEnabled::Always, ThpEnabled::Madvise, ThpEnabled::Never];
const DEFRAG: [ThpDefrag; 5] = [
    ThpDefrag::Always,
    ThpDefrag::Defer,
    ThpDefrag::DeferMadvise,
    ThpDefrag::Madvise,
    ThpDefrag::Never,
];

/// Word 0: the modes' indices + 1 (0: `None`) in bits 0-3 and 4-7, whether
/// khugepaged's settings were read (bit 8) and its `defrag` (bit 9); words
/// 1-4: its numbers.
fn encode(s: &ThpSettings) -> [u64; 5] {
    let code = |i: Option<usize>| i.map_or(0, |i| i as u64 + 1);
    let e = code(s.enabled.and_then(|e| ENABLED.iter().position(|&x| x == e)));
    let d = code(s.defrag.and_then(|d| DEFRAG.iter().position(|&x| x == d)));
    let k = s.khugepaged;
    let flags = k.map_or(0, |k| 1 << 8 | u64::from(k.defrag) << 9);
    [
        e | d << 4 | flags,
        k.map_or(0, |k| k.pages_to_scan),
        k.map_or(0, |k| k.scan_sleep_ms),
        k.map_or(0, |k| k.alloc_sleep_ms),
        k.map_or(0, |k| k.max_ptes_none),
    ]
}

fn decode(w: &[u64; 5]) -> ThpSettings {
    let pick = |code: u64| (code as usize).checked_sub(1);
    ThpSettings {
        enabled: pick(w[0] & 0xf).and_then(|i| ENABLED.get(i).copied()),
        defrag: pick(w[0] >> 4 & 0xf).and_then(|i| DEFRAG.get(i).copied()),
        khugepaged: (w[0] & 1 << 8 != 0).then_some(Khugepaged {
            defrag: w[0] & 1 << 9 != 0,
            pages_to_scan: w[1],
            scan_sleep_ms: w[2],
            alloc_sleep_ms: w[3],
            max_ptes_none: w[4],
        }),
    }
}

impl fmt::Display for ThpSettings {
    /// One line, for example `enabled madvise, defrag madvise (a
    /// MADV_HUGEPAGE fault may compact synchronously); khugepaged: defrag
    /// on, 4096 pages every 10000 ms, max_ptes_none 511`. Never allocates.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.enabled {
            Some(ThpEnabled::Never) => f.write_str("enabled never (no THP fault), ")?,
            Some(e) => write!(f, "enabled {}, ", e.name())?,
            None => f.write_str("enabled unknown, ")?,
        }
        match self.defrag {
            Some(d) if d.advised_fault_compacts() && self.enabled != Some(ThpEnabled::Never) => {
                write!(
                    f,
                    "defrag {} (a MADV_HUGEPAGE fault may compact synchronously)",
                    d.name()
                )?
            }
            Some(d) => write!(f, "defrag {} (no MADV_HUGEPAGE fault compacts)", d.name())?,
            None => f.write_str("defrag unknown")?,
        }
        match &self.khugepaged {
            Some(k) => write!(
                f,
                "; khugepaged: defrag {}, {} pages every {} ms, max_ptes_none {}",
                if k.defrag { "on" } else { "off" },
                k.pages_to_scan,
                k.scan_sleep_ms,
                k.max_ptes_none
            ),
            None => f.write_str("; khugepaged: unknown"),
        }
    }
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

    #[test]
    fn every_defrag_word_parses_and_names_itself() {
        for d in [
            ThpDefrag::Always,
            ThpDefrag::Defer,
            ThpDefrag::DeferMadvise,
            ThpDefrag::Madvise,
            ThpDefrag::Never,
        ] {
            assert_eq!(ThpDefrag::parse(d.name().as_bytes()), Some(d));
        }
        assert_eq!(ThpDefrag::parse(b"sometimes"), None);
        for e in [ThpEnabled::Always, ThpEnabled::Madvise, ThpEnabled::Never] {
            assert_eq!(ThpEnabled::parse(e.name().as_bytes()), Some(e));
        }
        assert!(ThpDefrag::Madvise.advised_fault_compacts());
        assert!(!ThpDefrag::Defer.advised_fault_compacts());
        assert!(!ThpDefrag::Never.advised_fault_compacts());
    }

    #[test]
    fn settings_survive_their_atomic_words() {
        let k = Khugepaged {
            defrag: true,
            pages_to_scan: 4096,
            scan_sleep_ms: 10_000,
            alloc_sleep_ms: 60_000,
            max_ptes_none: 511,
        };
        for enabled in [None, Some(ThpEnabled::Never), Some(ThpEnabled::Madvise)] {
            for defrag in [None, Some(ThpDefrag::DeferMadvise), Some(ThpDefrag::Never)] {
                for khugepaged in [None, Some(k), Some(Khugepaged { defrag: false, ..k })] {
                    let s = ThpSettings {
                        enabled,
                        defrag,
                        khugepaged,
                    };
                    assert_eq!(decode(&encode(&s)), s);
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads sysfs")]
    fn settings_of_this_kernel_read_when_it_has_thp() {
        let s = thp_settings();
        let has_thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/defrag").exists();
        assert_eq!(s.defrag.is_some(), has_thp);
        assert_eq!(s.enabled.is_some(), has_thp);
        let line = s.to_string();
        assert!(line.starts_with("enabled "), "{line}");
        assert_eq!(settings_once(), s);
        assert_eq!(settings_once(), s);
    }
}
