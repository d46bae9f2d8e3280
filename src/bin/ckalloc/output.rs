//! Everything the tool writes for the user besides error lines: text
//! report lines (`out`, `outln!`) with their escaping, JSON documents with
//! a terminal-safe formatter, the closed-pipe handling both share, and the
//! progress bars on stderr.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fmt;
use std::io::Write;

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
        err_line(format!("ckalloc: error: writing to stdout: {e}"));
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

/// Write one line to stderr. A failed write (stderr a closed pipe or a
/// closed descriptor) is ignored: the line has nowhere else to go, and the
/// command goes on (where `eprintln!` would panic and abort).
pub fn err_line(line: impl fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `err_line(format!(...))`.
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => { $crate::output::err_line(format!($($t)*)) };
}

/// `out(format!(...))`.
#[macro_export]
macro_rules! outln {
    () => { $crate::output::out("") };
    ($($t:tt)*) => { $crate::output::out(format!($($t)*)) };
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
