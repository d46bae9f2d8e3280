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
        // sha2's digest type prints as lowercase hex and honours a precision
        // as a number of digits.
        let digest = sha2::digest::Output::<sha2::Sha256>::from_slice(self.0);
        fmt::LowerHex::fmt(digest, f)
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
        let all: [u8; 32] = std::array::from_fn(|i| (i * 37 + 5) as u8);
        let hex: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(DigestHex(&all).to_string(), hex);
        assert_eq!(format!("{:.15}", DigestHex(&all)), &hex[..15]);
    }
}
