//! Byte counts for people: [`human_bytes`] writes them, `parse_size` reads
//! the size syntax of the caching spec and the `CKALLOC_*` size variables;
//! `plural` gives a counted noun its ending.

/// Format a byte count with a binary unit: whole bytes below 1 KiB
/// (`512 B`), else two decimals of the largest unit from KiB to EiB that
/// keeps the number at least 1 (`1.50 GiB`; units of 1024 bytes).
///
/// ```
/// assert_eq!(ckalloc::human_bytes(512).to_string(), "512 B");
/// assert_eq!(ckalloc::human_bytes(3 << 29).to_string(), "1.50 GiB");
/// assert_eq!(format!("[{:>10}]", ckalloc::human_bytes(1024)), "[  1.00 KiB]");
/// ```
pub fn human_bytes(bytes: u64) -> HumanBytes {
    HumanBytes(bytes)
}

/// A byte count shown in binary units ([`human_bytes`]): `{}` writes
/// `512 B`, `1.50 MiB`, `2.00 GiB`; width and alignment (`{:>10}`) apply
/// to the whole text. Formatting never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanBytes(pub u64);

impl std::fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        // The longest text, "18446744073709551615 B", is 22 bytes.
        let mut buf = [0u8; 32];
        let mut w = SliceWriter {
            buf: &mut buf,
            len: 0,
        };
        if u == 0 {
            write!(w, "{} B", self.0)?;
        } else {
            write!(w, "{v:.2} {}", UNITS[u])?;
        }
        let len = w.len;
        f.pad(std::str::from_utf8(&buf[..len]).map_err(|_| std::fmt::Error)?)
    }
}

/// The ending of a noun counted `n` times: `"s"`, or `""` for one
/// (`1 block`, `0 blocks`).
pub(crate) fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A byte count for a setting: [`HumanBytes`]'s text, followed by the exact
/// count when two decimals round it (`2.86 MiB (3000000 B)`; `2.00 MiB`,
/// `512 B`). Formatting never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExactBytes(pub(crate) u64);

impl std::fmt::Display for ExactBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", HumanBytes(self.0))?;
        // The unit HumanBytes picks; the text is exact when the count in
        // hundredths of that unit is whole.
        let mut unit: u128 = 1;
        while u128::from(self.0) >= unit * 1024 && unit < 1 << 50 {
            unit *= 1024;
        }
        if (u128::from(self.0) * 100) % unit != 0 {
            write!(f, " ({} B)", self.0)?;
        }
        Ok(())
    }
}

/// A `fmt::Write` into a fixed buffer; text past its end is an error.
pub(crate) struct SliceWriter<'a> {
    pub(crate) buf: &'a mut [u8],
    pub(crate) len: usize,
}

impl std::fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(std::fmt::Error)?;
        let dst = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// How the unit suffix of a size may be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SuffixCase {
    /// Lowercase only (`64mib`): the caching spec, which rejects what IREE
    /// silently misreads.
    Lower,
    /// ASCII case-insensitive (`64MiB`, `1GiB`), and the one-letter binary
    /// units `k`, `m`, `g` and `t` (`512m`, `1G`) that the `ckalloc`
    /// command's SIZE arguments take too: the `CKALLOC_*` variables.
    Any,
}

/// The value of `digits`, ASCII decimal digits only: `None` when it is
/// empty, holds any other byte, or overflows `u64`. Never allocates. The
/// one digit reader of the crate's settings, sizes and `/proc` numbers.
pub(crate) fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Why a text is not a size as the `CKALLOC_*` byte settings, the
/// `ckalloc` command's SIZE arguments and the caching spec read sizes
/// ([`env::parse_size`](crate::env::parse_size),
/// [`env::size_error`](crate::env::size_error)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// No decimal digits at the start (empty, a sign, white space, a unit
    /// alone).
    NoDigits,
    /// More than one digit, the first `0` (`00m`, `0128`): refused as in
    /// the caching spec, where such text may be meant as octal.
    LeadingZero,
    /// Text after the digits that is not a unit (`1.5g`, `1e9`, `2 m`).
    Unit,
    /// The value is over `u64::MAX` or `usize::MAX` bytes.
    TooLarge,
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SizeError::NoDigits => "no decimal digits at the start",
            SizeError::LeadingZero => "a leading zero (write 0, or digits without one)",
            SizeError::Unit => "not a unit after the digits",
            SizeError::TooLarge => "too large (over 2^64 - 1 bytes)",
        })
    }
}

/// Parses a size: `0` or decimal digits without a leading zero, then an
/// optional unit suffix `b`, `kb`, `kib`, `mb`, `mib`, `gb`, `gib`, `tb` or
/// `tib` (decimal units of 1000, binary units of 1024; with
/// [`SuffixCase::Any`] also `k`, `m`, `g` and `t`, binary). An error on any
/// other text (white space included), or when the value overflows `u64` or
/// `usize`. Never allocates.
pub(crate) fn parse_size(s: &[u8], case: SuffixCase) -> Result<u64, SizeError> {
    let digits_end = s
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    if digits.is_empty() {
        return Err(SizeError::NoDigits);
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return Err(SizeError::LeadingZero);
    }
    const UNITS: [(&[u8], u64); 9] = [
        (b"b", 1),
        (b"kb", 1000),
        (b"kib", 1 << 10),
        (b"mb", 1000 * 1000),
        (b"mib", 1 << 20),
        (b"gb", 1000 * 1000 * 1000),
        (b"gib", 1 << 30),
        (b"tb", 1000 * 1000 * 1000 * 1000),
        (b"tib", 1 << 40),
    ];
    const LETTERS: [(&[u8], u64); 4] = [
        (b"k", 1 << 10),
        (b"m", 1 << 20),
        (b"g", 1 << 30),
        (b"t", 1 << 40),
    ];
    let mult = if suffix.is_empty() {
        1
    } else {
        match case {
            SuffixCase::Lower => UNITS.iter().find(|(name, _)| *name == suffix),
            SuffixCase::Any => UNITS
                .iter()
                .chain(&LETTERS)
                .find(|(name, _)| name.eq_ignore_ascii_case(suffix)),
        }
        .ok_or(SizeError::Unit)?
        .1
    };
    // Only digits are left, so `decimal` fails only by overflow.
    let value = decimal(digits)
        .and_then(|d| d.checked_mul(mult))
        .filter(|&v| usize::try_from(v).is_ok())
        .ok_or(SizeError::TooLarge)?;
    Ok(value)
}

/// Parses a size as the `CKALLOC_*` byte settings and the `ckalloc`
/// command's SIZE arguments take it: ASCII white space around it ignored,
/// then [`parse_size`]'s syntax with [`SuffixCase::Any`]. Never allocates.
pub(crate) fn parse_setting_size(text: &[u8]) -> Result<u64, SizeError> {
    parse_size(text.trim_ascii(), SuffixCase::Any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_s_bytes_show_the_exact_count_when_rounded() {
        let t = |n: u64| ExactBytes(n).to_string();
        assert_eq!(t(512), "512 B");
        assert_eq!(t(1536), "1.50 KiB");
        assert_eq!(t(2 << 20), "2.00 MiB");
        assert_eq!(t(4095), "4.00 KiB (4095 B)");
        assert_eq!(t(3_000_000), "2.86 MiB (3000000 B)");
        assert_eq!(t(1 << 50), "1.00 PiB");
        assert_eq!(t(1 << 60), "1.00 EiB");
        assert_eq!(t(u64::MAX), "16.00 EiB (18446744073709551615 B)");
    }

    #[test]
    fn decimals_are_digits_only_and_checked() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(decimal(b"18446744073709551616"), None);
        for bad in [&b""[..], b" 1", b"1 ", b"+1", b"-1", b"1.5", b"1k"] {
            assert_eq!(decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sizes_in_lowercase() {
        let p = |s: &str| parse_size(s.as_bytes(), SuffixCase::Lower).ok();
        assert_eq!(p("0"), Some(0));
        assert_eq!(p("1gib"), Some(1 << 30));
        assert_eq!(p("2kb"), Some(2000));
        assert_eq!(p("7b"), Some(7));
        assert_eq!(p("010"), None);
        assert_eq!(p("1GiB"), None);
        assert_eq!(p("1g"), None, "no one-letter units in the spec");
        assert_eq!(p(""), None);
        assert_eq!(p("gib"), None);
        assert_eq!(p(" 1"), None);
        assert_eq!(p("1 gib"), None);
        assert_eq!(p("1.5gib"), None);
        assert_eq!(p("-1"), None);
        assert_eq!(p("18446744073709551615"), Some(u64::MAX));
        assert_eq!(p("18446744073709551616"), None);
        assert_eq!(p("16777216tib"), None);
    }

    #[test]
    fn a_size_that_does_not_parse_says_why() {
        let e = |s: &str| parse_size(s.as_bytes(), SuffixCase::Any).err();
        assert_eq!(e("00m"), Some(SizeError::LeadingZero));
        assert_eq!(e("0128"), Some(SizeError::LeadingZero));
        assert_eq!(e("99999999999999999999"), Some(SizeError::TooLarge));
        assert_eq!(e("16777216t"), Some(SizeError::TooLarge));
        assert_eq!(e("1.5g"), Some(SizeError::Unit));
        assert_eq!(e("1e99"), Some(SizeError::Unit));
        assert_eq!(e("m"), Some(SizeError::NoDigits));
        assert_eq!(e(""), Some(SizeError::NoDigits));
        assert_eq!(e("0"), None);
    }

    #[test]
    fn sizes_in_any_case() {
        let p = |s: &str| parse_size(s.as_bytes(), SuffixCase::Any).ok();
        assert_eq!(p("1GiB"), Some(1 << 30));
        assert_eq!(p("1gib"), Some(1 << 30));
        assert_eq!(p("64MB"), Some(64_000_000));
        assert_eq!(p("512KiB"), Some(512 << 10));
        assert_eq!(p("1G"), Some(1 << 30));
        assert_eq!(p("512m"), Some(512 << 20));
        assert_eq!(p("4k"), Some(4096));
        assert_eq!(p("2T"), Some(2 << 40));
        assert_eq!(p("1GiBs"), None);
        assert_eq!(p("1gg"), None);
        assert_eq!(p("m"), None);
    }
}
