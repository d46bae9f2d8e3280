//! The environment variables ckalloc reads, all read here.
//!
//! | Variable | Values | Default | Read by | Rule |
//! |---|---|---|---|---|
//! | `CKALLOC_HUGETLB` | on / off switch | on | the tier ladder ([`HugeRegion`](crate::HugeRegion), [`CkHuge`](crate::CkHuge), [`huge_alloc`](crate::huge_alloc), the arena): off skips the hugetlb tier unless a caller requires it | `CKALLOC_*` switch, read once per process ([`hugetlb_allowed`]) |
//! | `CKALLOC_THP` | on / off switch | on | the tier ladder and the engine's spans: off skips `MADV_HUGEPAGE` | `CKALLOC_*` switch, read once per process ([`thp_allowed`]) |
//! | `CKALLOC_FIRST_TOUCH_PROBE` | on / off switch | on | [`CkHuge`](crate::CkHuge)'s fresh THP blocks: off skips the first-touch probe ([`FirstTouch::Probe`](crate::huge::FirstTouch::Probe)), so every THP block stays THP | `CKALLOC_*` switch, read once per process ([`first_touch_probe`]) |
//! | `CKALLOC_HUGETLB_BACKOFF_MS` | decimal milliseconds | 1000 | the tier ladder: how long hugetlb is skipped after a failed hugetlb `mmap` | trimmed decimal `u64`; read once per process ([`hugetlb_backoff_ms`]); a value that does not parse gives the default and is reported ([`settings`]) |
//! | `CKALLOC_RETAIN_BYTES` | a size: bytes, or with a unit (`512mib`, `512m`, `1GiB`, `2gb`) | 128 MiB | the huge-page engine's retention ([`CapRule`](crate::huge::CapRule)): the most bytes of freed blocks kept with their pages for reuse, process-wide; 0 turns retention off; unset, the preload library's cap is twice the high-water mark of live huge bytes, at least the default ([`preload`](crate::preload#huge-blocks-first-touch-and-retention)) | trimmed; the caching spec's size syntax with the unit in any case, and `k`/`m`/`g`/`t`; read once per process ([`retain_bytes`]); a value that does not parse gives the default and is reported ([`settings`]) |
//! | `CKALLOC_RETAIN_DECAY_MS` | decimal milliseconds | 2000 | the same retention: the decay window. Retained bytes beyond what the window's demand can take back (its peak, of live bytes or at a miss of the live bytes with the new block and the retained bytes freed within the window, less the live bytes now) are purged (`MADV_DONTNEED`, keeping the address space), oldest first (demand that comes back within 30 s of a release is held 30 s longer), and a span no block used for the window is unmapped; by the background thread every 100 ms, else by engine calls (every 256 calls of a thread, or a huge-path call an eighth of a window after the last step), so `0` gives memory back at the next step, not at once. The preload library also raises glibc's trim threshold when glibc's main heap grows again within this window into a top its `free` trimmed ([`preload`](crate::preload)); `0` turns that off | trimmed decimal `u64`; read once per process ([`retain_decay_ms`]); a value that does not parse gives the default and is reported ([`settings`]) |
//! | `CKALLOC_PRELOAD_THRESHOLD` | a size, as `CKALLOC_RETAIN_BYTES` | 2 MiB | the preload library (`libckalloc_preload.so`, [`preload`](crate::preload)): requests of at least this many bytes get huge-page blocks, smaller ones go to glibc; `0` is taken as 1; every request at or over it costs at least one 2 MiB mapping, so a threshold far below 2 MiB multiplies the memory mapped (and uses up a reserved hugetlb pool); `ckalloc run` and `ckalloc probe` warn of a value below 2 MiB ([`small_preload_threshold`]) | as `CKALLOC_RETAIN_BYTES` ([`preload_threshold`]) |
//! | `CKALLOC_BACKGROUND_THREAD` | on / off switch | unset: on for the preload library, off for [`CkHuge`](crate::CkHuge) | the huge-page engine's background thread (decay by the clock, promotion to huge pages with `MADV_COLLAPSE`; [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-background-thread)): on starts it in any program that uses the engine, off keeps it from starting (also when [`enable_background_thread`](crate::huge::enable_background_thread) is called) | `CKALLOC_*` switch, read once per process ([`background_thread`]) |
//! | `CKALLOC_SHOW_STATS` | on / off switch, or `all` | off (on while `CKALLOC_STATS_FILE` is set) | the preload library: on prints one summary of [`huge_stats`](crate::huge_stats) at `exit`, labelled with the PID, for a process that served at least one huge-page block; `all` for every process | `CKALLOC_*` switch with the word `all` added, read once per process ([`show_stats`]) |
//! | `CKALLOC_STATS_FILE` | path template | unset: standard error | the preload library: the summary is appended to this file instead (`%p` is replaced by the process ID, `%%` by `%`; a relative path is taken from the working directory at load); a template with another `%` sequence prints no summary | read once at load ([`stats_file`], [`stats_file_template`]) |
//! | `CK_BUMP_FORCE_MIXED` | flag | unset | [`ArenaBuilder::build`](crate::ArenaBuilder::build) under [`ModePolicy::Auto`](crate::ModePolicy::Auto): skip anonymous mode | C-Kernel-Engine's `env_flag_enabled`, read at every build ([`force_mixed`]) |
//! | `CK_BUMP_DISABLE_MIXED` | flag | unset | the same: no fallback to mixed mode | C-Kernel-Engine's `env_flag_enabled`, read at every build ([`disable_mixed`]) |
//! | `CKALLOC_PRELOAD_LIB` | path of a file | unset | `ckalloc run`: the preload library to put in `LD_PRELOAD` instead of searching for it | path, not parsed; empty is unset ([`preload_lib`]) |
//! | `CKALLOC_MODEL_CACHE` | directory | `.cache/models` in the crate's source directory | the `ckalloc` CLI's demo and `scripts/fetch-model`: where the downloaded model is cached | path, not parsed ([`model_cache_dir`]) |
//! | any name given to [`CachingAllocator::from_env`](crate::caching::CachingAllocator::from_env) | IREE caching-allocator spec | unbounded pools | `from_env` | the spec grammar of [`caching`](crate::caching); must be Unicode; a name no variable can have (empty, holding `=` or NUL) is an error, not "unset" |
//!
//! The parsing rules:
//!
//! - **`CKALLOC_*` switch**: unset means the default in the table. A set
//!   value is trimmed of ASCII white space (space, tab, line feed, form
//!   feed, carriage return; not the vertical tab, as Rust's
//!   `u8::is_ascii_whitespace`); it means off when it is then
//!   empty, `0`, `false`, `no` or `off`, and on when it is `1`, `true`,
//!   `yes` or `on` (ASCII case-insensitive). Any other value is not taken:
//!   the default applies, and [`settings`] (and so
//!   [`huge_stats`](crate::huge_stats), `ckalloc probe` and `ckalloc run`)
//!   reports it as [`Source::Unparsed`], so a typo such as `offf` or `nope`
//!   neither turns a feature on nor passes silently.
//! - **C-Kernel-Engine's `env_flag_enabled`** (for `CK_BUMP_*`, kept exactly
//!   as C-Kernel-Engine reads them): unset means not set. A value is set
//!   unless it is empty, `0`, `false` or `no` (ASCII case-insensitive), with
//!   no trimming; `off` and ` 0` therefore count as set.
//! - **Numbers** (`CKALLOC_RETAIN_BYTES`, `CKALLOC_*_MS`): trimmed of ASCII
//!   white space, then a decimal number, or for bytes the size syntax of
//!   the caching spec (`0` or digits without a leading zero, then an
//!   optional unit `b`, `kb`, `kib`, `mb`, `mib`, `gb`, `gib`, `tb`, `tib`)
//!   with the unit in any case, or the one-letter binary units `k`, `m`,
//!   `g`, `t` of the `ckalloc` command's SIZE arguments (`512m` is 512
//!   MiB; [`parse_size`] reads this syntax). A value that does not parse is never taken
//!   silently: it is taken as unset (the default applies), and [`settings`] (and so
//!   [`huge_stats`](crate::huge_stats) and `ckalloc probe`) reports it as
//!   [`Source::Unparsed`]; [`size_error`] and [`millis_error`] say why.
//!
//! The switches on the allocation paths are read with `getenv` without
//! allocating and cached in atomics, so changing them after the first
//! mapping of the process has no effect.
//!
//! **Secure-execution mode** (`AT_SECURE`: a set-user-ID or set-group-ID
//! program, or one with file capabilities; `getauxval(3)`, `ld.so(8)`):
//! every variable of the table read without allocating (`CKALLOC_*` but
//! `CKALLOC_PRELOAD_LIB` and `CKALLOC_MODEL_CACHE`, which are meant for the
//! `ckalloc` command and read as set, and `CK_BUMP_*`) reads as unset, as
//! glibc's `secure_getenv(3)` does: the defaults apply and [`settings`]
//! reports them as [`Source::Default`]. The variable named to
//! [`CachingAllocator::from_env`](crate::caching::CachingAllocator::from_env)
//! is read as set: the program chose it. The user who starts such a
//! program cannot set what the library does with its owner's rights:
//! `CKALLOC_STATS_FILE` would name a file for it to append to. glibc
//! ignores its own `MALLOC_*` variables in that mode (it keeps them for
//! the program's children) and jemalloc ignores `MALLOC_CONF`; a program
//! that gets the preload library there has it from `/etc/ld.so.preload`,
//! from `LD_PRELOAD` naming a set-user-ID library in a system directory,
//! or linked. The mode covers only the `execve` that changed the IDs: a
//! set-user-ID wrapper that takes the IDs for good and then starts
//! another program passes the variables on, so it clears them first, as
//! it does glibc's. Thread-safety: every function here
//! may be called from any thread; like every `getenv` reader, they race with
//! a concurrent `setenv` in another thread.

mod read;

pub use crate::units::SizeError;
pub use read::{Expected, MillisError, Setting, Source, Unit};

use crate::sys;
use crate::units::ExactBytes;
use read::{Choice, Number, Switch};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// C-Kernel-Engine's `env_flag_enabled` rule (see the [module docs](self)):
/// set and not empty, `0`, `false` or `no` (ASCII case-insensitive, no
/// trimming).
pub(crate) fn ck_flag_enabled(value: Option<&[u8]>) -> bool {
    match value {
        None => false,
        Some(v) => {
            !(v.is_empty()
                || v == b"0"
                || v.eq_ignore_ascii_case(b"false")
                || v.eq_ignore_ascii_case(b"no"))
        }
    }
}

static HUGETLB: Switch = Switch::new(c"CKALLOC_HUGETLB", true);
static THP: Switch = Switch::new(c"CKALLOC_THP", true);
static FIRST_TOUCH_PROBE: Switch = Switch::new(c"CKALLOC_FIRST_TOUCH_PROBE", true);
static SHOW_STATS: Choice = Choice::new(
    c"CKALLOC_SHOW_STATS",
    &[read::OFF_WORDS, read::ON_WORDS, &["all"]],
    &["off", "on", "all"],
    0,
);
static BACKGROUND_THREAD: Switch = Switch::new(c"CKALLOC_BACKGROUND_THREAD", false);

/// What `CKALLOC_BACKGROUND_THREAD` says of the huge-page engine's
/// background thread: `None` when it is unset or its value is not taken (each front's default
/// applies: the preload library starts the thread, `CkHuge` does not),
/// else whether it is on by the `CKALLOC_*` switch rule. Read once per
/// process, then cached; never allocates.
pub fn background_thread() -> Option<bool> {
    match BACKGROUND_THREAD.get() {
        (_, Source::Default | Source::Unparsed) => None,
        (on, _) => Some(on),
    }
}

/// Whether `CKALLOC_HUGETLB` lets the tier ladder try hugetlb pages: `true`
/// unless it is set to an off value by the `CKALLOC_*` switch rule (trimmed;
/// empty, `0`, `false`, `no`, `off`). Read once per process, then cached;
/// never allocates.
pub fn hugetlb_allowed() -> bool {
    HUGETLB.on()
}

/// Whether `CKALLOC_THP` lets ckalloc advise `MADV_HUGEPAGE`: `true` unless
/// it is set to an off value by the `CKALLOC_*` switch rule (trimmed; empty,
/// `0`, `false`, `no`, `off`). Read once per process, then cached; never
/// allocates. THP is used only when this is `true` and the kernel's THP
/// mode is not `never`.
pub fn thp_allowed() -> bool {
    THP.on()
}

/// Whether `CKALLOC_FIRST_TOUCH_PROBE` lets [`CkHuge`](crate::CkHuge) probe
/// how fast a fresh THP block faults in and send slow ones to base pages:
/// `true` unless it is set to an off value by the `CKALLOC_*` switch rule.
/// Read once per process, then cached; never allocates.
pub fn first_touch_probe() -> bool {
    FIRST_TOUCH_PROBE.on()
}

static HUGETLB_BACKOFF_MS: Number =
    Number::new(c"CKALLOC_HUGETLB_BACKOFF_MS", 1000, Unit::Milliseconds);
static RETAIN_BYTES: Number = Number::new(
    c"CKALLOC_RETAIN_BYTES",
    DEFAULT_RETAIN_BYTES as u64,
    Unit::Bytes,
);
static RETAIN_DECAY_MS: Number = Number::new(
    c"CKALLOC_RETAIN_DECAY_MS",
    DEFAULT_RETAIN_DECAY_MS,
    Unit::Milliseconds,
);
static PRELOAD_THRESHOLD: Number = Number::new(
    c"CKALLOC_PRELOAD_THRESHOLD",
    DEFAULT_PRELOAD_THRESHOLD as u64,
    Unit::Bytes,
);

/// How many `CKALLOC_*` settings [`settings`] reports.
pub const SETTINGS: usize = 9;

/// The `CKALLOC_*` settings of the huge-page engine and the preload
/// library, each with its value and where it came from, in this order:
/// `CKALLOC_RETAIN_BYTES`, `CKALLOC_RETAIN_DECAY_MS`,
/// `CKALLOC_HUGETLB_BACKOFF_MS`, `CKALLOC_HUGETLB`, `CKALLOC_THP`,
/// `CKALLOC_FIRST_TOUCH_PROBE`, `CKALLOC_PRELOAD_THRESHOLD`,
/// `CKALLOC_SHOW_STATS`, `CKALLOC_BACKGROUND_THREAD` (unset: the value is
/// 0, the front's default applies, and the setting prints as unset with
/// both fronts' defaults). A variable that does not parse shows as
/// [`Source::Unparsed`]. Reads each variable the first time; never
/// allocates.
pub fn settings() -> [Setting; SETTINGS] {
    [
        RETAIN_BYTES.get(),
        RETAIN_DECAY_MS.get(),
        HUGETLB_BACKOFF_MS.get(),
        HUGETLB.setting(),
        THP.setting(),
        FIRST_TOUCH_PROBE.setting(),
        // The value in use: `0` is taken as 1 (`preload_threshold`).
        Setting {
            value: PRELOAD_THRESHOLD.get().value.max(1),
            ..PRELOAD_THRESHOLD.get()
        },
        SHOW_STATS.setting(),
        Setting {
            per_front: true,
            ..BACKGROUND_THREAD.setting()
        },
    ]
}

/// The default of [`preload_threshold`]: 2 MiB.
pub const DEFAULT_PRELOAD_THRESHOLD: usize = 2 << 20;

/// The smallest request the preload library (`libckalloc_preload.so`)
/// serves from huge-page blocks: `CKALLOC_PRELOAD_THRESHOLD` as a size
/// (`2097152`, `4mib`; the [rules](self)), else
/// [`DEFAULT_PRELOAD_THRESHOLD`]; `0` is taken as 1 (requests of 0 bytes
/// always go to glibc). Read once per process, then cached; never
/// allocates.
#[inline]
pub fn preload_threshold() -> usize {
    usize::try_from(PRELOAD_THRESHOLD.value())
        .unwrap_or(usize::MAX)
        .max(1)
}

/// Why the variable of a byte setting that [`settings`] reports as
/// [`Source::Unparsed`] is not a size as [the rules](self) take it (a
/// leading zero, too large, ...); `None` for any other setting. Reads the
/// variable again, and allocates: for messages (`ckalloc run`, `ckalloc
/// probe`), not for allocation paths.
pub fn size_error(s: &Setting) -> Option<SizeError> {
    if s.unit != Unit::Bytes || s.source != Source::Unparsed {
        return None;
    }
    let value = std::env::var_os(s.name)?;
    crate::units::parse_setting_size(value.as_encoded_bytes()).err()
}

/// Parses `text` as the byte settings read their variables ([the
/// rules](self)): ASCII white space around it ignored, then `0` or decimal
/// digits without a leading zero, then an optional unit, ASCII
/// case-insensitive: `b`; `kb`, `mb`, `gb`, `tb` (powers of 1000); `k` or
/// `kib`, `m` or `mib`, `g` or `gib`, `t` or `tib` (powers of 1024). The
/// `ckalloc` command's SIZE arguments (`--activations`) take the same text.
/// Never allocates.
///
/// ```
/// assert_eq!(ckalloc::env::parse_size(" 64MiB"), Ok(64 << 20));
/// assert_eq!(ckalloc::env::parse_size("1kb"), Ok(1000));
/// assert_eq!(
///     ckalloc::env::parse_size("064m"),
///     Err(ckalloc::env::SizeError::LeadingZero)
/// );
/// ```
///
/// # Errors
/// [`SizeError`] says why `text` is not a size: no digits, a leading
/// zero, an unknown unit, or a value over 2^64 - 1 (or `usize::MAX`)
/// bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    crate::units::parse_setting_size(text.as_bytes())
}

/// Why the variable of a millisecond setting that [`settings`] reports as
/// [`Source::Unparsed`] is not a number as [the rules](self) take it
/// (empty, a sign, a unit after the digits, too large, ...); `None` for any
/// other setting. Reads the variable again, and allocates: for messages
/// (`ckalloc run`, `ckalloc probe`), not for allocation paths.
pub fn millis_error(s: &Setting) -> Option<MillisError> {
    if s.unit != Unit::Milliseconds || s.source != Source::Unparsed {
        return None;
    }
    let value = std::env::var_os(s.name)?;
    read::parse_millis(value.as_encoded_bytes()).err()
}

/// `CKALLOC_PRELOAD_THRESHOLD` when it is set below
/// [`DEFAULT_PRELOAD_THRESHOLD`] (2 MiB), where every request at or over it
/// costs at least one 2 MiB mapping; `None` otherwise. Displays as one
/// sentence (`ckalloc run` and `ckalloc probe` print it as a warning).
pub fn small_preload_threshold() -> Option<SmallThreshold> {
    let s = PRELOAD_THRESHOLD.get();
    (s.source == Source::Environment && s.value < DEFAULT_PRELOAD_THRESHOLD as u64)
        .then_some(SmallThreshold(s.value))
}

/// A `CKALLOC_PRELOAD_THRESHOLD` below 2 MiB, in bytes as written
/// ([`small_preload_threshold`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmallThreshold(pub u64);

impl std::fmt::Display for SmallThreshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let taken = self.0.max(1);
        if self.0 == 0 {
            f.write_str("CKALLOC_PRELOAD_THRESHOLD is 0, taken as 1 byte")?;
        } else {
            write!(f, "CKALLOC_PRELOAD_THRESHOLD is {}", ExactBytes(taken))?;
        }
        write!(
            f,
            ", below 2 MiB: every request of at least {} gets a huge-page block of at least \
             2 MiB, so the memory mapped grows with the number of such blocks live (up to \
             {}x the bytes requested); the default, 2 MiB, keeps requests below one huge page \
             in glibc",
            ExactBytes(taken),
            (DEFAULT_PRELOAD_THRESHOLD as u64).div_ceil(taken)
        )
    }
}

/// Which processes the preload library prints a summary of its statistics
/// for at `exit` ([`show_stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShowStats {
    /// None (`CKALLOC_SHOW_STATS` unset, an off word, or a value not taken,
    /// while `CKALLOC_STATS_FILE` is unset).
    Off,
    /// Those that served at least one huge-page block (an on word, or
    /// `CKALLOC_STATS_FILE` set while `CKALLOC_SHOW_STATS` is unset).
    Huge,
    /// Every process (`all`).
    All,
}

/// Which processes the preload library prints its summary for:
/// `CKALLOC_SHOW_STATS` by the `CKALLOC_*` switch rule, with one more word,
/// `all` ([`ShowStats`]); unset, [`ShowStats::Huge`] when
/// `CKALLOC_STATS_FILE` is set and [`ShowStats::Off`] otherwise. Read once
/// per process, then cached; never allocates.
pub fn show_stats() -> ShowStats {
    match SHOW_STATS.get() {
        (2, _) => ShowStats::All,
        (1, _) => ShowStats::Huge,
        (_, Source::Environment) => ShowStats::Off,
        _ if stats_file().is_some() => ShowStats::Huge,
        _ => ShowStats::Off,
    }
}

/// The file the preload library's summary goes to instead of standard
/// error: `CKALLOC_STATS_FILE` when set and not empty, as its bytes (a path
/// template: `%p` stands for the process ID, `%%` for `%`; see
/// [`stats_file_template`]). Read at every call, without allocating.
pub fn stats_file() -> Option<&'static [u8]> {
    sys::getenv(c"CKALLOC_STATS_FILE").filter(|v| !v.is_empty())
}

/// Why a `CKALLOC_STATS_FILE` template is not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateError {
    /// A `%` followed by a character other than `p` or `%`, or by nothing.
    Escape,
    /// The path with a process ID put in would exceed `PATH_MAX` (4096
    /// bytes with its NUL), or holds a NUL byte.
    TooLong,
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TemplateError::Escape => "a % not followed by p (the process ID) or % (a %)",
            TemplateError::TooLong => "longer than PATH_MAX with a process ID, or holds a NUL",
        })
    }
}

/// Linux's `PATH_MAX`: the most bytes of a path with its NUL, and so the
/// buffer [`stats_file_template`] needs at most.
pub const PATH_MAX: usize = 4096;

/// The most bytes a process ID takes in decimal (Linux's `pid_max` is at
/// most 2^22; a `pid_t` at most 10 digits).
const PID_DIGITS: usize = 10;

/// The path `template` names for process `pid`, written into `out` with a
/// NUL after it: `%p` becomes the decimal process ID, `%%` one `%`, every
/// other byte stays. Returns the path's length without the NUL. Never
/// allocates.
///
/// # Errors
/// [`TemplateError::Escape`] for any other `%` sequence,
/// [`TemplateError::TooLong`] when the path and its NUL do not fit in
/// `out` or `template` holds a NUL byte.
pub fn stats_file_template(
    template: &[u8],
    pid: u32,
    out: &mut [u8],
) -> Result<usize, TemplateError> {
    let mut len = 0;
    let mut push = |b: u8, len: &mut usize| -> Result<(), TemplateError> {
        *out.get_mut(*len).ok_or(TemplateError::TooLong)? = b;
        *len += 1;
        Ok(())
    };
    let mut bytes = template.iter().copied();
    while let Some(b) = bytes.next() {
        match b {
            0 => return Err(TemplateError::TooLong),
            b'%' => match bytes.next() {
                Some(b'%') => push(b'%', &mut len)?,
                Some(b'p') => {
                    let mut digits = [0u8; PID_DIGITS];
                    let mut n = pid;
                    let mut i = PID_DIGITS;
                    loop {
                        i -= 1;
                        digits[i] = b'0' + (n % 10) as u8;
                        n /= 10;
                        if n == 0 {
                            break;
                        }
                    }
                    for &d in &digits[i..] {
                        push(d, &mut len)?;
                    }
                }
                _ => return Err(TemplateError::Escape),
            },
            b => push(b, &mut len)?,
        }
    }
    push(0, &mut len)?;
    Ok(len - 1)
}

/// How long, in milliseconds, the tier ladder skips hugetlb after a failed
/// hugetlb `mmap`: `CKALLOC_HUGETLB_BACKOFF_MS` as a decimal number (ASCII
/// white space trimmed), else 1000. Read once per process, then cached;
/// never allocates.
pub fn hugetlb_backoff_ms() -> u64 {
    HUGETLB_BACKOFF_MS.value()
}

/// The default of [`retain_bytes`]: 128 MiB.
pub const DEFAULT_RETAIN_BYTES: usize = 128 << 20;
/// The default of [`retain_decay_ms`]: 2000 ms.
pub const DEFAULT_RETAIN_DECAY_MS: u64 = 2000;

/// The most bytes of freed huge-page blocks [`CkHuge`](crate::CkHuge) keeps
/// mapped for reuse, process-wide: `CKALLOC_RETAIN_BYTES` as a size
/// (`134217728`, `512mib`, `1GiB`; the [rules](self)), else
/// [`DEFAULT_RETAIN_BYTES`]; `0` turns retention off. Read once per process,
/// then cached; never allocates.
#[inline]
pub fn retain_bytes() -> usize {
    usize::try_from(RETAIN_BYTES.value()).unwrap_or(usize::MAX)
}

/// Whether `CKALLOC_RETAIN_BYTES` is set and parses: the preload library's
/// retention cap then is exactly [`retain_bytes`], never the live peak it
/// follows by default. Read once per process, as [`retain_bytes`]; never
/// allocates.
pub fn retain_bytes_set() -> bool {
    RETAIN_BYTES.parsed()
}

/// How long, in milliseconds, a retained huge-page block of
/// [`CkHuge`](crate::CkHuge) stays unused before a later allocator call gives
/// it back to the kernel: `CKALLOC_RETAIN_DECAY_MS` as a decimal number
/// (ASCII white space trimmed), else [`DEFAULT_RETAIN_DECAY_MS`]. Read once
/// per process, then cached; never allocates.
pub fn retain_decay_ms() -> u64 {
    RETAIN_DECAY_MS.value()
}

/// Whether `CK_BUMP_FORCE_MIXED` is set by C-Kernel-Engine's
/// `env_flag_enabled` rule (not empty, `0`, `false` or `no`; no trimming):
/// [`ModePolicy::Auto`](crate::ModePolicy::Auto) then skips anonymous mode.
/// Read at every call; never allocates.
pub fn force_mixed() -> bool {
    ck_flag_enabled(sys::getenv(c"CK_BUMP_FORCE_MIXED"))
}

/// Whether `CK_BUMP_DISABLE_MIXED` is set by C-Kernel-Engine's
/// `env_flag_enabled` rule (not empty, `0`, `false` or `no`; no trimming):
/// [`ModePolicy::Auto`](crate::ModePolicy::Auto) then never falls back to
/// mixed mode. Read at every call; never allocates.
pub fn disable_mixed() -> bool {
    ck_flag_enabled(sys::getenv(c"CK_BUMP_DISABLE_MIXED"))
}

/// The preload library `ckalloc run` uses: `CKALLOC_PRELOAD_LIB` when set
/// and not empty (any value, taken as a path), else `None` (`ckalloc run`
/// searches). Allocates; not for allocator paths.
pub fn preload_lib() -> Option<PathBuf> {
    std::env::var_os("CKALLOC_PRELOAD_LIB")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The directory that caches downloaded models (the `ckalloc` CLI's demo,
/// `scripts/fetch-model`): `CKALLOC_MODEL_CACHE` when set (any value, taken
/// as a path), else `.cache/models` under the directory holding ckalloc's
/// `Cargo.toml` at build time. Allocates; not for allocator paths.
pub fn model_cache_dir() -> PathBuf {
    var_os("CKALLOC_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models"))
}

/// The value of the environment variable `name` as `std::env::var_os`
/// reads it (allocates; for constructors such as
/// [`CachingAllocator::from_env`](crate::caching::CachingAllocator::from_env)).
pub(crate) fn var_os(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ck_flag_rule_matches_c_kernel_engine() {
        let f = ck_flag_enabled;
        assert!(!f(None));
        for off in [&b""[..], b"0", b"false", b"FALSE", b"No", b"no"] {
            assert!(!f(Some(off)), "{off:?}");
        }
        // C-Kernel-Engine neither trims nor knows "off".
        for on in [&b"1"[..], b"yes", b"off", b" 0", b"true", b"2"] {
            assert!(f(Some(on)), "{on:?}");
        }
    }
}
