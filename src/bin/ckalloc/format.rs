//! How values appear in reports: paths in text and in JSON, durations in
//! milliseconds, SHA-256 digests in hex. (Byte sizes use indicatif's
//! `BinaryBytes` directly.)

use std::fmt;
use std::path::Path;

/// A path for a message, control characters escaped.
pub fn shown(path: &Path) -> String {
    ckalloc::Escaped::new(&path.to_string_lossy()).to_string()
}

/// A path as a JSON string (a path that is not UTF-8 is shown with
/// U+FFFD in place of the bytes it cannot show).
pub fn path_json(p: &Path) -> serde_json::Value {
    p.to_string_lossy().into_owned().into()
}

/// Milliseconds of a duration, for reports.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A stored SHA-256 digest (it hashes nothing) shown as 64 lowercase hex
/// digits; a precision shows only the first digits (`{:.16}`: 16).
#[derive(Clone, Copy)]
pub struct DigestHex<'a>(pub &'a [u8; 32]);

impl fmt::Display for DigestHex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 64];
        for (pair, b) in hex.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        let n = f.precision().unwrap_or(hex.len()).min(hex.len());
        // Only ASCII hex digits were written.
        f.write_str(std::str::from_utf8(&hex[..n]).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::BinaryBytes;

    /// The byte sizes in reports (and docs/cli.md) use indicatif's binary units.
    #[test]
    fn binary_bytes_print_two_decimals_and_iec_units() {
        assert_eq!(BinaryBytes(512).to_string(), "512 B");
        assert_eq!(BinaryBytes(3 << 19).to_string(), "1.50 MiB");
    }

    #[test]
    fn digest_prints_as_lowercase_hex() {
        let mut c = [0u8; 32];
        c[0] = 0xab;
        c[31] = 0x0f;
        let hex = DigestHex(&c).to_string();
        assert_eq!(hex.len(), 64);
        assert!(hex.starts_with("ab00"), "{hex}");
        assert!(hex.ends_with("000f"), "{hex}");
        assert_eq!(format!("{:.16}", DigestHex(&c)), "ab00000000000000");
        // The same text as sha2's digest type printed with `{:x}`.
        let all: [u8; 32] = std::array::from_fn(|i| (i * 37 + 5) as u8);
        let sha2_hex = format!("{:x}", sha2::digest::Output::<sha2::Sha256>::from(all));
        assert_eq!(DigestHex(&all).to_string(), sha2_hex);
        assert_eq!(format!("{:.16}", DigestHex(&all)), &sha2_hex[..16]);
    }
}
