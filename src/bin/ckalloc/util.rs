//! Errors, output and small parsers shared by the subcommands.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fmt;
use std::io::Write;
use std::process::ExitCode;

/// A failed command: one line for the user. Exit status 1.
#[derive(Debug)]
pub struct CliError {
    msg: String,
    /// The command already printed its JSON document (which carries the failure).
    json_done: bool,
}

impl CliError {
    /// Print the error as one line on stderr (and as `{"error": ...}` on
    /// stdout under `--json`) and return exit status 1.
    pub fn report(self, json: bool) -> ExitCode {
        let line = ckalloc::Escaped::new(&one_line(&self.msg)).to_string();
        if json && !self.json_done {
            emit_json_line(&serde_json::json!({ "error": line, "exit_code": 1 }));
        }
        eprintln!("ckalloc: error: {line}");
        ExitCode::from(1)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

/// A `CliError` from anything printable.
pub fn err(msg: impl fmt::Display) -> CliError {
    CliError {
        msg: msg.to_string(),
        json_done: false,
    }
}

/// A failure whose JSON report was already printed: under `--json` only the
/// stderr line follows.
pub fn err_reported(msg: impl fmt::Display) -> CliError {
    CliError {
        msg: msg.to_string(),
        json_done: true,
    }
}

/// `Err(CliError)` from a format string.
#[macro_export]
macro_rules! fail {
    ($($t:tt)*) => { return Err($crate::util::err(format!($($t)*))) };
}

/// Join the lines of a message (errors from libraries may carry line
/// breaks) with single spaces; spaces inside a line are kept.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Report a command-line parsing error: `--help` and `--version` print and
/// exit 0; anything else is one line and exit status 2.
pub fn usage_error(e: clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    // clap renders "error: ...", optional detail lines, "tip: ...", then
    // "Usage: ..."; keep the message and its detail, joined on one line.
    let text = e.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("Usage:") || t.starts_with("For more information") {
            break;
        }
        if t.is_empty() || t.starts_with("tip:") {
            continue;
        }
        parts.push(t.strip_prefix("error:").unwrap_or(t).trim().to_string());
    }
    let line = format!(
        "{} (see `ckalloc --help`)",
        ckalloc::Escaped::new(&parts.join(" "))
    );
    if json {
        let _ = writeln!(
            std::io::stdout(),
            "{}",
            serde_json::json!({ "error": line, "exit_code": 2 })
        );
    }
    eprintln!("ckalloc: error: {line}");
    ExitCode::from(2)
}

/// Replace the panic message (and backtrace hint) with one line. A panic is
/// a bug in ckalloc; the exit status stays 101.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "ckalloc: internal error: {}{at} (please report this)",
            ckalloc::Escaped::new(&one_line(&msg))
        );
    }));
}

/// Set when stdout turned out to be a closed pipe: the report stops there.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Write `text` to stdout. A closed pipe (`ckalloc ... | head`) stops the
/// report quietly: later writes are skipped and the command runs on, so its
/// exit status still says whether it succeeded (a failure still prints its
/// line on stderr). Any other write failure (disk full, closed descriptor)
/// is one error line on stderr and exit status 1, so a lost report is never
/// a success.
fn write_stdout(text: &str) {
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            return;
        }
        eprintln!("ckalloc: error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// Write one line (or several, split at `\n`) of a text report to stdout,
/// every control or formatting character escaped ([`ckalloc::Escaped`]),
/// whatever file or argument the text came from.
pub fn out(line: impl fmt::Display) {
    let mut text = String::new();
    for l in line.to_string().split('\n') {
        text.push_str(&ckalloc::Escaped::new(l).to_string());
        text.push('\n');
    }
    write_stdout(&text);
}

/// `out(format!(...))`.
#[macro_export]
macro_rules! outln {
    () => { $crate::util::out("") };
    ($($t:tt)*) => { $crate::util::out(format!($($t)*)) };
}

/// JSON text with every character that [`ckalloc::Escaped`] would escape
/// written as a JSON `\uXXXX` escape: valid JSON that, printed on a
/// terminal, can neither break a line nor steer the terminal.
fn json_text(v: &serde_json::Value, pretty: bool) -> String {
    struct Safe<F>(F);
    impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for Safe<F> {
        fn write_string_fragment<W: ?Sized + Write>(
            &mut self,
            w: &mut W,
            fragment: &str,
        ) -> std::io::Result<()> {
            let mut start = 0;
            for (i, c) in fragment.char_indices() {
                if ckalloc::Escaped::keeps(c) {
                    continue;
                }
                w.write_all(&fragment.as_bytes()[start..i])?;
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
                start = i + c.len_utf8();
            }
            w.write_all(&fragment.as_bytes()[start..])
        }
        fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.begin_array(w)
        }
        fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.end_array(w)
        }
        fn begin_array_value<W: ?Sized + Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            self.0.begin_array_value(w, first)
        }
        fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.end_array_value(w)
        }
        fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.begin_object(w)
        }
        fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.end_object(w)
        }
        fn begin_object_key<W: ?Sized + Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            self.0.begin_object_key(w, first)
        }
        fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.begin_object_value(w)
        }
        fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            self.0.end_object_value(w)
        }
    }
    use serde::Serialize as _;
    let mut out = Vec::new();
    // Serializing a Value into a Vec cannot fail.
    let _ = if pretty {
        v.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            Safe(serde_json::ser::PrettyFormatter::new()),
        ))
    } else {
        v.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            Safe(serde_json::ser::CompactFormatter),
        ))
    };
    // Valid UTF-8: serde_json writes UTF-8 and the escapes are ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// Print a JSON document (pretty) on stdout.
pub fn emit_json(v: &serde_json::Value) {
    write_stdout(&format!("{}\n", json_text(v, true)));
}

/// Print a JSON document on one line of stdout.
pub fn emit_json_line(v: &serde_json::Value) {
    write_stdout(&format!("{}\n", json_text(v, false)));
}

/// A path as a JSON string (a path that is not UTF-8 is shown with
/// U+FFFD in place of the bytes it cannot show).
pub fn path_json(p: &std::path::Path) -> serde_json::Value {
    p.to_string_lossy().into_owned().into()
}

/// A SHA-256 checksum as sha2's digest type, which prints as lowercase hex
/// with `{:x}` (and its first `N` hex digits with `{:.N$x}`, e.g. `{:.16x}`).
pub fn sha256(checksum: &[u8; 32]) -> sha2::digest::Output<sha2::Sha256> {
    (*checksum).into()
}

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
    match s.trim().parse::<u64>() {
        Ok(a) if a.is_power_of_two() && a <= max => Ok(a),
        _ => Err(format!(
            "'{}': expected a power of two from 1 to {max} (bytes)",
            ckalloc::Escaped::capped(s, 40)
        )),
    }
}

/// Parse a size in bytes: a decimal integer with an optional suffix, ASCII
/// case-insensitive: `k`/`kib` (1024), `m`/`mib`, `g`/`gib`, `kb`/`mb`/`gb`
/// (powers of 1000), `b`. `64MiB`, `512m`, `1000000`.
///
/// # Errors
/// Empty, junk, fractions, signs or overflow, naming the input.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid size '{s}': expected a number of bytes such as 4096, 64MiB or 1g"
        ));
    }
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "invalid size '{s}': unknown suffix '{suffix}' (use k, m, g, t, KiB, MiB, GiB, kb, mb, gb)"
            ))
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size '{s}': does not fit in 64 bits"))
}

/// A byte-progress bar on stderr, hidden under `--json` or when stderr is not
/// a terminal (indicatif's own check). Nothing is drawn before the first
/// [`update`](Progress::update), which brings the total: no frame shows a
/// full bar over `0 B/0 B`.
pub struct Progress {
    bar: ProgressBar,
    json: bool,
    drawn: std::cell::Cell<bool>,
}

impl Progress {
    /// `done` of `total` bytes.
    pub fn update(&self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
        if !self.drawn.replace(true) && !self.json {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Remove the bar.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// A [`Progress`] bar labelled `what`.
pub fn progress(what: &str, json: bool) -> Progress {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template(
        "{msg:>12} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_string());
    Progress {
        bar,
        json,
        drawn: std::cell::Cell::new(false),
    }
}

/// Milliseconds of a duration, for reports.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::BinaryBytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1kb"), Ok(1000));
        for bad in [
            "",
            "x",
            "1.5g",
            "-1",
            "12q",
            "99999999999999999999",
            "20000000t",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    /// The byte sizes in reports (and docs/cli.md) use indicatif's binary units.
    #[test]
    fn binary_bytes_print_two_decimals_and_iec_units() {
        assert_eq!(BinaryBytes(512).to_string(), "512 B");
        assert_eq!(BinaryBytes(3 << 19).to_string(), "1.50 MiB");
    }

    #[test]
    fn sha256_prints_as_lowercase_hex() {
        let mut c = [0u8; 32];
        c[0] = 0xab;
        c[31] = 0x0f;
        let hex = format!("{:x}", sha256(&c));
        assert_eq!(hex.len(), 64);
        assert!(hex.starts_with("ab00"), "{hex}");
        assert!(hex.ends_with("000f"), "{hex}");
        assert_eq!(format!("{:.16x}", sha256(&c)), "ab00000000000000");
    }

    #[test]
    fn joins_lines_and_keeps_spaces_inside_them() {
        assert_eq!(one_line("a\n  b\tc \r\n\n d  e"), "a b\tc d  e");
    }
}
