//! [`Escaped`]: text from a file, the environment or a caller, made safe to
//! print on one line of a terminal or a report.

use std::fmt;

/// Prints a string with every control character (C0, DEL, C1) and every
/// invisible formatting character (bidirectional overrides, zero-width
/// characters, ...) written as a Rust escape (`\n`, `\0`, `\u{1b}`,
/// `\u{202e}`), so text read from a file or the environment can neither
/// start a new line of a report nor send a terminal escape sequence.
/// Everything else, quotes and backslashes included, prints as it is.
///
/// [`capped`](Self::capped) prints at most a given number of characters
/// and then `...` with the input's length in bytes, so an error message
/// that quotes its input stays short whatever the input.
///
/// ```
/// use ckalloc::Escaped;
/// assert_eq!(Escaped::new("a\nb\u{1b}[31m").to_string(), "a\\nb\\u{1b}[31m");
/// assert_eq!(Escaped::new("tok_emb \"x\"").to_string(), "tok_emb \"x\"");
/// assert_eq!(Escaped::capped("abcdef", 3).to_string(), "abc... (6 bytes)");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Escaped<'a> {
    text: &'a str,
    max_chars: usize,
}

impl<'a> Escaped<'a> {
    /// True when `c` is printed as itself, false when it is written as an
    /// escape: for writers of other formats (a JSON writer escapes the same
    /// characters with its own syntax).
    pub fn keeps(c: char) -> bool {
        plain(c)
    }

    /// All of `text`, escaped.
    pub fn new(text: &'a str) -> Self {
        Escaped {
            text,
            max_chars: usize::MAX,
        }
    }

    /// At most `max_chars` characters of `text` (counted before escaping),
    /// escaped, then `... (N bytes)` when `text` is longer.
    pub fn capped(text: &'a str, max_chars: usize) -> Self {
        Escaped { text, max_chars }
    }
}

/// True when `c` prints as itself: `char::escape_debug` leaves it alone, or
/// escapes it only because Rust string literals quote it (`"`, `'`, `\`),
/// or it is a space separator (Unicode `Zs`, such as the no-break space and
/// the ideographic space of CJK names), which moves the cursor like a space.
fn plain(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '\\' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    ) || c.escape_debug().len() == 1
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        let mut rest = self.text;
        let mut shown = 0usize;
        while let Some(c) = rest.chars().next() {
            if shown == self.max_chars {
                return write!(f, "... ({} bytes)", self.text.len());
            }
            if plain(c) {
                f.write_char(c)?;
            } else {
                write!(f, "{}", c.escape_debug())?;
            }
            shown += 1;
            rest = &rest[c.len_utf8()..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Escaped;

    #[test]
    fn controls_and_format_characters_are_escaped() {
        assert_eq!(Escaped::new("x\r\n\t\0").to_string(), "x\\r\\n\\t\\0");
        assert_eq!(Escaped::new("\u{7f}\u{85}").to_string(), "\\u{7f}\\u{85}");
        assert_eq!(Escaped::new("a\u{202e}b").to_string(), "a\\u{202e}b");
        assert_eq!(Escaped::new("\u{200b}").to_string(), "\\u{200b}");
        assert_eq!(Escaped::new("\u{2028}").to_string(), "\\u{2028}");
    }

    #[test]
    fn printable_text_is_unchanged() {
        for s in [
            "",
            "blk.0.attn_q.weight",
            "é ü 日本 😀",
            "a\\b'c\"d",
            "モデル\u{3000}v1\u{a0}x",
        ] {
            assert_eq!(Escaped::new(s).to_string(), s);
        }
    }

    #[test]
    fn capped_counts_characters_and_names_the_length() {
        assert_eq!(
            Escaped::capped("日本語", 2).to_string(),
            "日本... (9 bytes)"
        );
        assert_eq!(Escaped::capped("abc", 3).to_string(), "abc");
        assert_eq!(Escaped::capped("\n\n\n", 1).to_string(), "\\n... (3 bytes)");
    }
}
