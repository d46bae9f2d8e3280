//! Parsers for argument values the commands share (clap `value_parser`s):
//! sizes, alignments, the container version to write. A parser's error is
//! a usage error (exit status 2).

/// Parse a `--version` argument: the container versions ckalloc writes, 4
/// (`BUMPWGT4`) or 5 (`BUMPWGT5`). Version 3 is read but never written, so
/// it is refused here, as a usage error, before any work starts.
///
/// # Errors
/// Anything but `4` or `5`, naming the input.
pub fn parse_write_version(s: &str) -> Result<ckalloc::weights::Version, String> {
    use ckalloc::weights::Version;
    match s.trim() {
        "4" => Ok(Version::V4),
        "5" => Ok(Version::V5),
        "3" => Err("3 is not written (BUMPWGT3 is read only); expected 4 or 5".into()),
        _ => Err(format!("'{s}': expected 4 or 5")),
    }
}

/// Parse an `--align` argument: a power of two from 1 byte to
/// [`MAX_ALIGNMENT`](ckalloc::weights::MAX_ALIGNMENT) (1 GiB), in decimal.
///
/// # Errors
/// Anything else, naming the input.
pub fn parse_alignment(s: &str) -> Result<u64, String> {
    let max = ckalloc::weights::MAX_ALIGNMENT;
    let t = s.trim();
    let digits = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    match t.parse::<u64>() {
        Ok(a) if digits && a.is_power_of_two() && a <= max => Ok(a),
        _ => Err(format!(
            "'{}': expected a power of two from 1 to {max} (bytes)",
            ckalloc::Escaped::capped(s, 40)
        )),
    }
}

/// Parse a `SIZE` argument (`--activations`), bytes: the size syntax of
/// the `CKALLOC_*` byte settings ([`ckalloc::env::parse_size`]): a decimal
/// integer without a leading zero and an optional unit, ASCII
/// case-insensitive: `k`/`kib` (1024), `m`/`mib`, `g`/`gib`, `t`/`tib`,
/// `kb`/`mb`/`gb`/`tb` (powers of 1000), `b`. `64MiB`, `512m`, `1000000`.
/// (Not the caching allocator's spec syntax, whose units are lowercase.)
///
/// # Errors
/// Empty, junk, fractions, signs, a leading zero or overflow, naming the
/// input and the reason.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    ckalloc::env::parse_size(s).map_err(|e| {
        format!(
            "invalid size '{}': {e}; expected a number of bytes such as 4096, 64MiB or 1g",
            ckalloc::Escaped::capped(s, 40)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_arg("4096"), Ok(4096));
        assert_eq!(parse_size_arg("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size_arg("2g"), Ok(2 << 30));
        assert_eq!(parse_size_arg("1kb"), Ok(1000));
        assert_eq!(parse_size_arg("0"), Ok(0));
        assert_eq!(parse_size_arg(" 8MiB "), Ok(8 << 20));
        for bad in [
            "",
            "x",
            "1.5g",
            "-1",
            "12q",
            "99999999999999999999",
            "20000000t",
            "064m",
            "00",
        ] {
            assert!(parse_size_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn write_versions_and_alignments() {
        use ckalloc::weights::Version;
        assert_eq!(parse_write_version("4"), Ok(Version::V4));
        assert_eq!(parse_write_version("5"), Ok(Version::V5));
        assert!(parse_write_version("3").is_err());
        assert!(parse_write_version("6").is_err());
        assert_eq!(parse_alignment("1"), Ok(1));
        assert_eq!(parse_alignment("64"), Ok(64));
        assert_eq!(parse_alignment("1073741824"), Ok(1 << 30));
        for bad in ["0", "3", "2147483648", "64k", "-64", "+64", "", " "] {
            assert!(parse_alignment(bad).is_err(), "{bad}");
        }
    }
}
