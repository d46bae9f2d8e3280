//! A failed command as one line on stderr: [`CliError`] and its exit
//! status, usage errors (exit 2), and the panic hook (exit 101).

use crate::output::emit_json_line;
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
        crate::errln!("ckalloc: error: {line}");
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
    ($($t:tt)*) => { return Err($crate::error::err(format!($($t)*))) };
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
        // `print` writes help and version to stdout: a write that fails
        // (a full disk, a closed descriptor) is exit status 1, as every
        // report's.
        if let Err(err) = e.print() {
            if err.kind() != std::io::ErrorKind::BrokenPipe {
                crate::errln!("ckalloc: error: writing to stdout: {err}");
                return ExitCode::from(1);
            }
        }
        return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let line = format!(
        "{} (see `ckalloc --help`)",
        ckalloc::Escaped::new(&usage_line(&e.render().to_string()))
    );
    if json {
        let _ = writeln!(
            std::io::stdout(),
            "{}",
            serde_json::json!({ "error": line, "exit_code": 2 })
        );
    }
    crate::errln!("ckalloc: error: {line}");
    ExitCode::from(2)
}

/// clap's rendering of a usage error on one line: "error: ...", the
/// detail lines after it, then each "tip: ..." after a semicolon (a
/// similar option's name, how to pass a value that starts with `-`); the
/// "Usage:" block and what follows it are left out.
fn usage_line(rendered: &str) -> String {
    let mut parts = Vec::new();
    let mut tips = Vec::new();
    for line in rendered.lines() {
        let t = line.trim();
        if t.starts_with("Usage:") || t.starts_with("For more information") {
            break;
        }
        if t.is_empty() {
            continue;
        }
        if t.starts_with("tip:") {
            tips.push(t);
        } else {
            parts.push(t.strip_prefix("error:").unwrap_or(t).trim());
        }
    }
    let mut line = parts.join(" ");
    for tip in tips {
        line.push_str("; ");
        line.push_str(tip);
    }
    line
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
        crate::errln!(
            "ckalloc: internal error: {}{at} (please report this)",
            ckalloc::Escaped::new(&one_line(&msg))
        );
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_error_keeps_its_detail_and_tips_on_one_line() {
        let rendered = "error: unexpected argument '--jsn' found\n\n  \
                        tip: a similar argument exists: '--json'\n  \
                        tip: to pass '--jsn' as a value, use '-- --jsn'\n\n\
                        Usage: ckalloc run [OPTIONS] <CMD>...\n\n\
                        For more information, try '--help'.\n";
        assert_eq!(
            usage_line(rendered),
            "unexpected argument '--jsn' found; tip: a similar argument exists: '--json'; \
             tip: to pass '--jsn' as a value, use '-- --jsn'"
        );
        let rendered = "error: invalid value 'x' for '--mode <MODE>'\n  \
                        [possible values: auto, anon, mixed]\n\n\
                        For more information, try '--help'.\n";
        assert_eq!(
            usage_line(rendered),
            "invalid value 'x' for '--mode <MODE>' [possible values: auto, anon, mixed]"
        );
    }

    #[test]
    fn joins_lines_and_keeps_spaces_inside_them() {
        assert_eq!(one_line("a\n  b\tc \r\n\n d  e"), "a b\tc d  e");
    }
}
