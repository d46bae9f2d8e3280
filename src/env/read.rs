//! How a `CKALLOC_*` variable is read, cached and reported: the switch
//! rule and the number rule of the [parent module](super)'s docs, each
//! variable read once with `getenv` and cached in atomics ([`Switch`],
//! [`Number`]), and the [`Setting`] that [`settings`](super::settings)
//! reports. Never allocates.

use crate::sys;
use crate::units::{self, ExactBytes, SuffixCase};
use std::ffi::CStr;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The `CKALLOC_*` switch rule (see the [parent module](super)): `default`
/// when unset, off when the trimmed value is empty, `0`, `false`, `no` or `off`
/// (ASCII case-insensitive), on otherwise; with where the answer came from:
/// `1`, `true`, `yes` and `on` are the values that say "on", any other is
/// taken as on and reported as [`Source::Unparsed`].
fn ckalloc_switch(value: Option<&[u8]>, default: bool) -> (bool, Source) {
    let Some(v) = value else {
        return (default, Source::Default);
    };
    let v = v.trim_ascii();
    let is = |word: &[u8]| v.eq_ignore_ascii_case(word);
    if v.is_empty() || is(b"0") || is(b"false") || is(b"no") || is(b"off") {
        (false, Source::Environment)
    } else if is(b"1") || is(b"true") || is(b"yes") || is(b"on") {
        (true, Source::Environment)
    } else {
        (true, Source::Unparsed)
    }
}

/// A decimal `u64` after trimming ASCII white space; `None` for anything
/// else (including overflow).
fn parse_u64(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// A `CKALLOC_*` switch, read once and cached. Never allocates.
pub(super) struct Switch {
    name: &'static CStr,
    /// The value when the variable is unset.
    default: bool,
    /// 0: not read yet; else 1 | on << 1 | source << 2.
    state: AtomicU8,
}

impl Switch {
    pub(super) const fn new(name: &'static CStr, default: bool) -> Switch {
        Switch {
            name,
            default,
            state: AtomicU8::new(0),
        }
    }

    #[inline]
    pub(super) fn get(&self) -> (bool, Source) {
        let mut s = self.state.load(Ordering::Relaxed);
        if s == 0 {
            let (on, source) = ckalloc_switch(sys::getenv(self.name), self.default);
            let code = match source {
                Source::Default => 0,
                Source::Environment => 1,
                Source::Unparsed => 2,
            };
            s = 1 | (u8::from(on) << 1) | (code << 2);
            // Before the C library has set up the environment (an
            // allocation from the dynamic loader in a preloaded library),
            // every variable reads unset: answer, but read again later.
            if sys::environment_ready() {
                self.state.store(s, Ordering::Relaxed);
            }
        }
        let source = match s >> 2 {
            1 => Source::Environment,
            2 => Source::Unparsed,
            _ => Source::Default,
        };
        (s & 2 != 0, source)
    }

    #[inline]
    pub(super) fn on(&self) -> bool {
        self.get().0
    }

    pub(super) fn setting(&self) -> Setting {
        let (on, source) = self.get();
        Setting {
            name: self.name.to_str().unwrap_or(""),
            value: u64::from(on),
            source,
            unit: Unit::Switch,
            per_front: false,
        }
    }
}

/// Where the value of a `CKALLOC_*` setting came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// The variable is unset: the default.
    #[default]
    Default,
    /// The variable is set and parsed.
    Environment,
    /// The variable is set but does not parse: it is taken as unset (for a
    /// switch: a value other than the on and off words, taken as on).
    Unparsed,
}

/// A `CKALLOC_*` setting as this process uses it ([`settings`](super::settings)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Setting {
    /// The variable's name.
    pub name: &'static str,
    /// The value in use, in the variable's unit ([`Setting::unit`]).
    pub value: u64,
    /// Where it came from.
    pub source: Source,
    /// The unit of `value`.
    pub unit: Unit,
    /// Whether each front has its own default (`value` then shows 0 while
    /// the variable is unset).
    pub(super) per_front: bool,
}

/// The unit of a [`Setting`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unit {
    /// Bytes.
    #[default]
    Bytes,
    /// Milliseconds.
    Milliseconds,
    /// A switch: 1 on, 0 off.
    Switch,
}

impl fmt::Display for Setting {
    /// Never allocates (the preload library prints settings at exit).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Value(Setting);
        impl fmt::Display for Value {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.0.unit {
                    Unit::Bytes => write!(f, "{}", ExactBytes(self.0.value)),
                    Unit::Milliseconds => write!(f, "{} ms", self.0.value),
                    Unit::Switch if self.0.value == 0 => f.write_str("off"),
                    Unit::Switch => f.write_str("on"),
                }
            }
        }
        let value = Value(*self);
        match self.source {
            Source::Default if self.per_front => write!(
                f,
                "{} unset (on under the preload library, off for CkHuge)",
                self.name
            ),
            Source::Default => write!(f, "{} {value} (default)", self.name),
            Source::Environment => write!(f, "{} {value}", self.name),
            // An odd switch value is taken as on, whatever the default.
            Source::Unparsed if self.unit == Unit::Switch => {
                write!(f, "{} does not parse: taken as {value}", self.name)
            }
            // Unset, not only the default value: while `CKALLOC_RETAIN_BYTES`
            // is unset the preload library's cap follows the live peak.
            Source::Unparsed => write!(
                f,
                "{} does not parse: taken as unset (default {value})",
                self.name
            ),
        }
    }
}

/// A numeric variable, read once and cached.
pub(super) struct Number {
    name: &'static CStr,
    default: u64,
    unit: Unit,
    /// The value; `u64::MAX`: not read yet.
    value: AtomicU64,
    source: AtomicU8,
}

impl Number {
    pub(super) const fn new(name: &'static CStr, default: u64, unit: Unit) -> Number {
        Number {
            name,
            default,
            unit,
            value: AtomicU64::new(u64::MAX),
            source: AtomicU8::new(0),
        }
    }

    /// The setting, reading the variable the first time. Never allocates.
    #[inline]
    pub(super) fn get(&self) -> Setting {
        let mut value = self.value.load(Ordering::Acquire);
        if value == u64::MAX {
            value = self.read();
        }
        let source = match self.source.load(Ordering::Relaxed) {
            1 => Source::Environment,
            2 => Source::Unparsed,
            _ => Source::Default,
        };
        Setting {
            name: self.name.to_str().unwrap_or(""),
            value,
            source,
            unit: self.unit,
            per_front: false,
        }
    }

    #[cold]
    fn read(&self) -> u64 {
        let (value, source) = match sys::getenv(self.name) {
            None => (self.default, 0),
            Some(text) => {
                let text = text.trim_ascii();
                let parsed = match self.unit {
                    Unit::Bytes => units::parse_size(text, SuffixCase::Any),
                    Unit::Milliseconds | Unit::Switch => parse_u64(text),
                };
                match parsed {
                    Some(v) => (v, 1),
                    None => (self.default, 2),
                }
            }
        };
        // `u64::MAX` marks "not read".
        let value = value.min(u64::MAX - 1);
        // Racing first readers store the same pair; before the environment
        // is set up nothing is stored (see `Switch::get`).
        if sys::environment_ready() {
            self.source.store(source, Ordering::Relaxed);
            self.value.store(value, Ordering::Release);
        }
        value
    }

    /// Whether the variable is set and parses (reading it the first time).
    pub(super) fn parsed(&self) -> bool {
        self.value();
        self.source.load(Ordering::Relaxed) == 1
    }

    #[inline]
    pub(super) fn value(&self) -> u64 {
        let v = self.value.load(Ordering::Acquire);
        if v != u64::MAX {
            v
        } else {
            self.read()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_whose_default_is_the_fronts_prints_both_defaults_while_unset() {
        let unset = Setting {
            name: "CKALLOC_BACKGROUND_THREAD",
            unit: Unit::Switch,
            per_front: true,
            ..Setting::default()
        };
        assert_eq!(
            unset.to_string(),
            "CKALLOC_BACKGROUND_THREAD unset (on under the preload library, off for CkHuge)"
        );
        let set = Setting {
            value: 0,
            source: Source::Environment,
            ..unset
        };
        assert_eq!(set.to_string(), "CKALLOC_BACKGROUND_THREAD off");
        let other = Setting {
            per_front: false,
            ..unset
        };
        assert_eq!(other.to_string(), "CKALLOC_BACKGROUND_THREAD off (default)");
    }

    #[test]
    fn ckalloc_switch_is_trimmed_and_knows_off() {
        let f = |v| ckalloc_switch(v, true).0;
        assert!(f(None), "unset means on");
        for off in [
            &b""[..],
            b"0",
            b" 0",
            b"0\n",
            b"\tfalse ",
            b"NO",
            b"off",
            b" Off ",
            b"  ",
        ] {
            assert!(!f(Some(off)), "{off:?}");
        }
        for on in [&b"1"[..], b"yes", b"on", b" 1 ", b"true", b"00", b"offf"] {
            assert!(f(Some(on)), "{on:?}");
        }
        // Only the on words are parsed; other values are on and reported.
        for on in [&b"1"[..], b"YES", b" on ", b"True"] {
            assert_eq!(
                ckalloc_switch(Some(on), true),
                (true, Source::Environment),
                "{on:?}"
            );
        }
        for odd in [&b"00"[..], b"offf", b"disable", "\u{ff11}".as_bytes()] {
            assert_eq!(
                ckalloc_switch(Some(odd), true),
                (true, Source::Unparsed),
                "{odd:?}"
            );
        }
        assert_eq!(ckalloc_switch(None, true), (true, Source::Default));
        assert_eq!(ckalloc_switch(None, false), (false, Source::Default));
        assert_eq!(
            ckalloc_switch(Some(b"1"), false),
            (true, Source::Environment)
        );
    }

    #[test]
    fn backoff_number_is_trimmed_decimal() {
        assert_eq!(parse_u64(b"250"), Some(250));
        assert_eq!(parse_u64(b" 250\n"), Some(250));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"2 5"), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"99999999999999999999"), None);
    }
}
