//! Canonical JSON: the bytes C-Kernel-Engine's converters hash for the v5
//! `manifest_hash` and `template_hash` ([`canonical_json`]).

/// Canonical JSON bytes, as C-Kernel-Engine's
/// `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`
/// (`_canonical_json_bytes` in its converters): object keys sorted by code
/// point at every level, no whitespace, every character outside
/// `0x20..=0x7E` escaped as `\uXXXX` (lowercase hex, surrogate pairs above
/// U+FFFF), integers as decimal, and floats spelled as Python's `repr`
/// spells them: the shortest digits that read back to the same `f64`, fixed
/// notation with at least one decimal (`10000.0`, `0.0001`) for decimal
/// exponents from -4 to 15, scientific with a signed two-digit exponent
/// otherwise (`1e-05`, `1e+16`). The v5 `manifest_hash` and `template_hash`
/// are SHA-256 digests of these bytes.
///
/// Where serde_json reads JSON differently from Python, the bytes differ and
/// a `manifest_hash` computed by Python does not verify (no converter
/// writes these): an integer beyond the 64-bit range and the integer `-0`
/// are read as floats (Python keeps integers exact and reads `-0` as `0`);
/// `NaN`, `Infinity`, lone UTF-16 surrogates and nesting deeper than 128
/// levels are refused (Python's `json` accepts them).
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    use serde::Serialize as _;
    let sorted = sort_keys(value);
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, AsciiFormatter);
    // Serializing a Value into a Vec cannot fail.
    let _ = sorted.serialize(&mut ser);
    out
}

/// Among the shortest digit strings that read back to `x` (positive), the
/// one nearest to `x`, ties to an even last digit, as Python's `repr` (David
/// Gay's `dtoa` mode 0) picks it. `digits` (exponent `exp`: the value is
/// `d.ddd x 10^exp`) is Rust's shortest, which can be the other neighbour of
/// an exact tie (Rust prints `570724280910275.3` where the double is
/// `...275.25` and Python prints `...275.2`); the neighbours one unit away in
/// the last digit are compared with the exact value.
fn nearest_shortest(x: f64, digits: String, exp: i32) -> String {
    let Some(last) = digits.bytes().last().map(|b| b - b'0') else {
        return digits;
    };
    let head = &digits[..digits.len() - 1];
    let reads_back = |d: &str| {
        let (first, rest) = d.split_at(1);
        format!("{first}.{rest}0e{exp}").parse::<f64>().ok() == Some(x)
    };
    // The exact decimal value of x: at most 767 significant digits.
    let exact = format!("{x:.800e}");
    let (em, ee) = exact.split_once('e').unwrap_or((&exact, "0"));
    let ee: i32 = ee.parse().unwrap_or(exp);
    let exact_digits: String = em.chars().filter(|c| *c != '.').collect();
    // Compare the exact value with `m` (digits at exponent `exp`).
    let cmp_exact = |m: &str| {
        if ee != exp {
            return ee.cmp(&exp);
        }
        let width = exact_digits.len().max(m.len());
        let a = format!("{exact_digits:0<width$}");
        let b = format!("{m:0<width$}");
        a.cmp(&b)
    };
    let mut best = digits.clone();
    for neighbour in [last.checked_sub(1), (last < 9).then_some(last + 1)]
        .into_iter()
        .flatten()
        .filter(|&d| d != 0 || !head.is_empty())
    {
        let cand = format!("{head}{neighbour}");
        if !reads_back(&cand) {
            continue;
        }
        let (lo, hi) = if neighbour < last {
            (cand.clone(), digits.clone())
        } else {
            (digits.clone(), cand.clone())
        };
        let mid = format!("{lo}5");
        best = match cmp_exact(&mid) {
            std::cmp::Ordering::Less => lo,
            std::cmp::Ordering::Greater => hi,
            std::cmp::Ordering::Equal => {
                if (lo.as_bytes()[lo.len() - 1] - b'0').is_multiple_of(2) {
                    lo
                } else {
                    hi
                }
            }
        };
        break;
    }
    best
}

/// `x` spelled as Python's `repr(float)` (finite values only; JSON has no
/// others): see [`canonical_json`].
pub(crate) fn python_float(x: f64) -> String {
    // `{:e}` gives the shortest round-trip digits: "1.2345e-5", "-0e0".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let digits = nearest_shortest(x.abs(), digits, exp);
    let n = digits.len() as i32;
    // Python's decimal point position: the value is 0.DIGITS x 10^decpt.
    let decpt = exp + 1;
    if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= n {
            format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.unsigned_abs())
    }
}

fn sort_keys(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), sort_keys(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

/// Compact formatter that escapes non-ASCII and DEL like Python's
/// `ensure_ascii` and spells floats like Python's `repr`.
struct AsciiFormatter;

impl serde_json::ser::Formatter for AsciiFormatter {
    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        value: f32,
    ) -> std::io::Result<()> {
        self.write_f64(w, f64::from(value))
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if (' '..='~').contains(&c) {
                continue;
            }
            w.write_all(&fragment.as_bytes()[start..i])?;
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                write!(w, "\\u{:04x}", u)?;
            }
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::python_float;

    #[test]
    fn floats_are_spelled_as_python_repr_spells_them() {
        // Each pair: Rust value, Python 3's repr() of the same double.
        let cases: [(f64, &str); 21] = [
            (1e-05, "1e-05"),
            (10000.0, "10000.0"),
            (1.0, "1.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1e22, "1e+22"),
            (9007199254740993.0, "9007199254740992.0"),
            (2.5e-5, "2.5e-05"),
            (-1e-12, "-1e-12"),
            (1.25e15, "1250000000000000.0"),
            // Exact ties between two shortest spellings: Python rounds half to even.
            (f64::from_bits(0x4300_3890_d03a_0e1a), "570724280910275.2"),
            (0.3, "0.3"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float(x), want, "{x:e}");
        }
    }
}
