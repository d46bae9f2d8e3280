//! How a `CKALLOC_*` variable is read, cached and reported: the switch
//! rule and the number rule of the [parent module](super)'s docs, each
//! variable read once with `getenv` and cached in atomics ([`Switch`],
//! [`Number`]), and the [`Setting`] that [`settings`](super::settings)
//! reports. Never allocates.

use crate::sys;
use crate::units::{self, ExactBytes};
use std::ffi::CStr;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The word rule of a [`Choice`] (for a switch, the `CKALLOC_*` switch
/// rule of the [parent module](super)): `default` when unset; else the
/// index of the list holding the value trimmed of ASCII white space (ASCII
/// case-insensitive); a value in no list is not taken: `default`, reported
/// as [`Source::Unparsed`].
fn choose(value: Option<&[u8]>, lists: &[&[&str]], default: u8) -> (u8, Source) {
    match value.map(<[u8]>::trim_ascii) {
        None => (default, Source::Default),
        // At most 31 lists: the index fits a `Choice`'s state.
        Some(v) => match word_index(v, lists) {
            Some(i) => (i as u8, Source::Environment),
            None => (default, Source::Unparsed),
        },
    }
}

/// The values that turn a `CKALLOC_*` switch off (with the empty value).
pub(super) const OFF_WORDS: &[&str] = &["", "0", "false", "no", "off"];
/// The values that turn a `CKALLOC_*` switch on.
pub(super) const ON_WORDS: &[&str] = &["1", "true", "yes", "on"];

/// The index of the first list in `lists` holding `v` (ASCII
/// case-insensitive), `None` when none does.
fn word_index(v: &[u8], lists: &[&[&str]]) -> Option<usize> {
    lists
        .iter()
        .position(|words| words.iter().any(|w| v.eq_ignore_ascii_case(w.as_bytes())))
}

/// A `CKALLOC_*` variable whose value is one of a few words, each list of
/// synonyms one choice ([`Choice::get`] answers its index), read once and
/// cached. The first list holds the off words and the second the on words,
/// so a switch word keeps its meaning; a value in no list is not taken (the
/// default, reported as [`Source::Unparsed`]). Never allocates.
pub(super) struct Choice {
    name: &'static CStr,
    /// The lists of synonyms, one per choice.
    lists: &'static [&'static [&'static str]],
    /// The name each choice prints as.
    names: &'static [&'static str],
    /// The choice when the variable is unset.
    default: u8,
    /// 0: not read yet; else 1 | source code << 1 | choice << 3.
    state: AtomicU8,
}

impl Choice {
    pub(super) const fn new(
        name: &'static CStr,
        lists: &'static [&'static [&'static str]],
        names: &'static [&'static str],
        default: u8,
    ) -> Choice {
        Choice {
            name,
            lists,
            names,
            default,
            state: AtomicU8::new(0),
        }
    }

    /// The choice in use and where it came from. Never allocates.
    pub(super) fn get(&self) -> (u8, Source) {
        let mut s = self.state.load(Ordering::Relaxed);
        if s == 0 {
            let (choice, source) = choose(sys::getenv(self.name), self.lists, self.default);
            s = 1 | (source.code() << 1) | (choice << 3);
            // Before the C library has set up the environment (an
            // allocation from the dynamic loader in a preloaded library),
            // every variable reads unset: answer, but read again later.
            if sys::environment_ready() {
                self.state.store(s, Ordering::Relaxed);
            }
        }
        (s >> 3, Source::from_code((s >> 1) & 3))
    }

    pub(super) fn setting(&self) -> Setting {
        let (choice, source) = self.get();
        Setting {
            name: self.name.to_str().unwrap_or(""),
            value: u64::from(choice),
            source,
            unit: Unit::Word(self.names),
            per_front: false,
        }
    }
}

/// A number of milliseconds: a decimal `u64` after trimming ASCII white
/// space (leading zeros allowed); any other text, or a value over 2^64 - 1,
/// is an error saying which. Never allocates.
pub(super) fn parse_millis(v: &[u8]) -> Result<u64, MillisError> {
    let v = v.trim_ascii();
    units::decimal(v).ok_or_else(|| match v {
        [] => MillisError::Empty,
        [b'+' | b'-', ..] => MillisError::Sign,
        [first, ..] if !first.is_ascii_digit() => MillisError::NoDigits,
        // Digits alone fail only by overflow.
        _ if v.iter().all(u8::is_ascii_digit) => MillisError::TooLarge,
        _ => MillisError::NotDigit,
    })
}

/// Why a text is not a number of milliseconds as the `CKALLOC_*_MS`
/// settings read them ([`env::millis_error`](super::millis_error)):
/// trimmed of ASCII white space, decimal digits only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MillisError {
    /// Empty, or ASCII white space only.
    Empty,
    /// A `+` or `-` first: no sign is taken.
    Sign,
    /// Another character first (a word, a decimal point).
    NoDigits,
    /// A character other than a decimal digit after the first digit: a
    /// unit (`250ms`, `2s`), a fraction (`1.5`), an exponent (`1e3`), white
    /// space between digits.
    NotDigit,
    /// Over 2^64 - 1 milliseconds.
    TooLarge,
}

impl fmt::Display for MillisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MillisError::Empty => "empty",
            MillisError::Sign => "a sign before the digits (no sign is taken)",
            MillisError::NoDigits => "no decimal digits at the start",
            MillisError::NotDigit => {
                "not a digit after the digits (no unit, fraction or exponent is taken)"
            }
            MillisError::TooLarge => "too large (over 2^64 - 1 milliseconds)",
        })
    }
}

/// A `CKALLOC_*` switch (the switch rule), read once and cached. Never
/// allocates.
pub(super) struct Switch(Choice);

/// A switch's lists of words: off, then on.
const SWITCH_WORDS: &[&[&str]] = &[OFF_WORDS, ON_WORDS];

impl Switch {
    pub(super) const fn new(name: &'static CStr, default: bool) -> Switch {
        Switch(Choice::new(
            name,
            SWITCH_WORDS,
            &["off", "on"],
            default as u8,
        ))
    }

    #[inline]
    pub(super) fn get(&self) -> (bool, Source) {
        let (choice, source) = self.0.get();
        (choice == 1, source)
    }

    #[inline]
    pub(super) fn on(&self) -> bool {
        self.get().0
    }

    pub(super) fn setting(&self) -> Setting {
        Setting {
            unit: Unit::Switch,
            ..self.0.setting()
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
    /// The variable is set but does not parse (for a switch: a value other
    /// than the on and off words): it is not taken, the default applies.
    Unparsed,
}

impl Source {
    /// 0, 1, 2 in the order of the variants.
    const fn code(self) -> u8 {
        self as u8
    }

    const fn from_code(c: u8) -> Source {
        match c {
            1 => Source::Environment,
            2 => Source::Unparsed,
            _ => Source::Default,
        }
    }
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
    /// One of the named values: `value` is the index of its name.
    Word(&'static [&'static str]),
}

impl Setting {
    /// The value in use, or `None` for a setting each front defaults on its
    /// own (`CKALLOC_BACKGROUND_THREAD`: on under the preload library, off
    /// for `CkHuge`) while its variable is unset or does not parse.
    pub fn value_for_all_fronts(&self) -> Option<u64> {
        (!self.per_front || self.source == Source::Environment).then_some(self.value)
    }

    /// What the variable takes, in words for a message about a value that
    /// does not parse (`ckalloc probe`, `ckalloc run`).
    pub fn expected(&self) -> Expected {
        Expected(self.unit)
    }
}

/// What a setting's variable takes ([`Setting::expected`]); displays as a
/// phrase such as "a decimal number of milliseconds".
#[derive(Clone, Copy, Debug)]
pub struct Expected(Unit);

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Unit::Bytes => f.write_str("a number of bytes or a size such as 512mib, 512m or 1GiB"),
            Unit::Milliseconds => f.write_str("a decimal number of milliseconds"),
            Unit::Switch => f.write_str("1, true, yes or on; 0, false, no, off or empty"),
            Unit::Word(names) => {
                f.write_str("a switch word (1, true, yes, on; 0, false, no, off)")?;
                for n in names.iter().skip(2) {
                    write!(f, " or {n}")?;
                }
                Ok(())
            }
        }
    }
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
                    Unit::Word(names) => {
                        let i = usize::try_from(self.0.value).unwrap_or(usize::MAX);
                        f.write_str(names.get(i).copied().unwrap_or("?"))
                    }
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
            Source::Unparsed if self.per_front => write!(
                f,
                "{} does not parse: taken as unset (on under the preload library, off for CkHuge)",
                self.name
            ),
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

/// A numeric variable, read once and cached. Never allocates.
pub(super) struct Number {
    name: &'static CStr,
    default: u64,
    unit: Unit,
    /// The value, once `state` says it was read.
    value: AtomicU64,
    /// 0: not read yet; else 1 + the source's code, stored after `value`.
    state: AtomicU8,
}

impl Number {
    pub(super) const fn new(name: &'static CStr, default: u64, unit: Unit) -> Number {
        Number {
            name,
            default,
            unit,
            value: AtomicU64::new(0),
            state: AtomicU8::new(0),
        }
    }

    /// The value in use and where it came from, reading the variable the
    /// first time.
    #[inline]
    fn load(&self) -> (u64, Source) {
        match self.state.load(Ordering::Acquire) {
            0 => self.read(),
            s => (self.value.load(Ordering::Relaxed), Source::from_code(s - 1)),
        }
    }

    /// The setting, reading the variable the first time.
    pub(super) fn get(&self) -> Setting {
        let (value, source) = self.load();
        Setting {
            name: self.name.to_str().unwrap_or(""),
            value,
            source,
            unit: self.unit,
            per_front: false,
        }
    }

    #[cold]
    fn read(&self) -> (u64, Source) {
        let (value, source) = match sys::getenv(self.name) {
            None => (self.default, Source::Default),
            Some(text) => {
                let parsed = match self.unit {
                    Unit::Bytes => units::parse_setting_size(text).ok(),
                    _ => parse_millis(text.trim_ascii()).ok(),
                };
                match parsed {
                    Some(v) => (v, Source::Environment),
                    None => (self.default, Source::Unparsed),
                }
            }
        };
        // Racing first readers store the same pair; before the environment
        // is set up nothing is stored (see `Choice::get`).
        if sys::environment_ready() {
            self.value.store(value, Ordering::Relaxed);
            self.state.store(1 + source.code(), Ordering::Release);
        }
        (value, source)
    }

    /// Whether the variable is set and parses (reading it the first time).
    pub(super) fn parsed(&self) -> bool {
        self.load().1 == Source::Environment
    }

    #[inline]
    pub(super) fn value(&self) -> u64 {
        self.load().0
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
        // The value every front takes: none while unset or unparsed.
        assert_eq!(unset.value_for_all_fronts(), None);
        let unparsed = Setting {
            source: Source::Unparsed,
            ..unset
        };
        assert_eq!(unparsed.value_for_all_fronts(), None);
        assert_eq!(set.value_for_all_fronts(), Some(0));
        assert_eq!(other.value_for_all_fronts(), Some(0));
    }

    #[test]
    fn a_switch_takes_only_the_on_and_off_words() {
        let f = |v: Option<&[u8]>, default: bool| {
            let (choice, source) = choose(v, SWITCH_WORDS, u8::from(default));
            (choice == 1, source)
        };
        assert_eq!(f(None, true), (true, Source::Default));
        assert_eq!(f(None, false), (false, Source::Default));
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
            assert_eq!(f(Some(off), true), (false, Source::Environment), "{off:?}");
        }
        for on in [&b"1"[..], b"YES", b" on ", b"True", b"1\n"] {
            assert_eq!(f(Some(on), false), (true, Source::Environment), "{on:?}");
        }
        // Any other value is not taken: the default, reported.
        for odd in [
            &b"00"[..],
            b"offf",
            b"nope",
            b"disable",
            "\u{ff11}".as_bytes(),
        ] {
            assert_eq!(f(Some(odd), true), (true, Source::Unparsed), "{odd:?}");
            assert_eq!(f(Some(odd), false), (false, Source::Unparsed), "{odd:?}");
        }
    }

    #[test]
    fn a_choice_answers_the_index_of_its_word_list() {
        let lists: &[&[&str]] = &[OFF_WORDS, ON_WORDS, &["all"]];
        assert_eq!(choose(Some(b" ALL"), lists, 0), (2, Source::Environment));
        assert_eq!(choose(Some(b"yes"), lists, 0), (1, Source::Environment));
        assert_eq!(choose(Some(b"al"), lists, 0), (0, Source::Unparsed));
        let s = Setting {
            name: "CKALLOC_SHOW_STATS",
            value: 2,
            source: Source::Environment,
            unit: Unit::Word(&["off", "on", "all"]),
            per_front: false,
        };
        assert_eq!(s.to_string(), "CKALLOC_SHOW_STATS all");
    }

    #[test]
    fn milliseconds_are_a_trimmed_decimal_and_say_why_not() {
        assert_eq!(parse_millis(b"250"), Ok(250));
        assert_eq!(parse_millis(b" 250\n"), Ok(250));
        assert_eq!(parse_millis(b"0250"), Ok(250));
        assert_eq!(parse_millis(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_millis(b""), Err(MillisError::Empty));
        assert_eq!(parse_millis(b" \t"), Err(MillisError::Empty));
        assert_eq!(parse_millis(b"-1"), Err(MillisError::Sign));
        assert_eq!(parse_millis(b"+5"), Err(MillisError::Sign));
        assert_eq!(parse_millis(b"ms"), Err(MillisError::NoDigits));
        assert_eq!(parse_millis(b".5"), Err(MillisError::NoDigits));
        assert_eq!(parse_millis(b"2 5"), Err(MillisError::NotDigit));
        assert_eq!(parse_millis(b"250ms"), Err(MillisError::NotDigit));
        assert_eq!(parse_millis(b"1.5"), Err(MillisError::NotDigit));
        assert_eq!(
            parse_millis(b"18446744073709551616"),
            Err(MillisError::TooLarge)
        );
        assert_eq!(
            MillisError::Sign.to_string(),
            "a sign before the digits (no sign is taken)"
        );
    }
}
