//! Text a peer chose (a `REFUSE` or `BUSY` reason, a symbol, a message type, a decoder's quote
//! of a frame), made safe to print in a log line, a report or an error.
//!
//! Such text is untrusted: a newline in it would start a forged log line, a carriage return
//! would overwrite the line on a terminal, and ANSI escapes would move the cursor, clear the
//! screen or retitle the window. Every place peer text reaches a person goes through
//! [`escape`] (or [`from_bytes`] for raw bytes), which keeps printable text as it is and writes
//! every control character as a visible escape:
//!
//! - `\n`, `\r` and `\t` as themselves (`\n`, two characters), a backslash as `\\`, so the escaped
//!   text reads back unambiguously;
//! - other C0 and C1 controls and DEL as `\u{1b}` (Rust's notation);
//! - the characters that reorder or end lines on some terminals and editors (bidirectional
//!   overrides and isolates, the line and paragraph separators) the same way.
//!
//! Bytes that are not UTF-8 become U+FFFD, as a lenient decoder does.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not be printed as it is.
fn unsafe_char(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}')
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// `text` with every control character written as a visible escape (see the module's
/// documentation); borrowed when there is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(unsafe_char) else { return Cow::Borrowed(text) };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Bytes a peer sent as text, decoded leniently (U+FFFD for what is not UTF-8) and escaped.
pub fn from_bytes(bytes: &[u8]) -> String {
    escape(&String::from_utf8_lossy(bytes)).into_owned()
}

/// The longest start of `bytes` of at most `max` bytes that does not end inside a UTF-8
/// character: what a sender keeps of a text it must cut.
pub fn cut_at_char(bytes: &[u8], max: usize) -> &[u8] {
    if bytes.len() <= max {
        return bytes;
    }
    // A UTF-8 character's continuation bytes are 0b10xxxxxx: back up over them (at most 3) to
    // the start of the character that crosses the cut.
    let mut end = max;
    while end > 0 && end > max.saturating_sub(3) && bytes[end] & 0xc0 == 0x80 {
        end -= 1;
    }
    if bytes[end] & 0xc0 == 0x80 {
        // Not UTF-8 there anyway: cut at the limit.
        end = max;
    }
    &bytes[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_is_kept_as_it_is_and_borrowed() {
        for text in ["", "at the limit of 64 connections; retry later", "Zürich · 東京 🙂"] {
            assert!(matches!(escape(text), Cow::Borrowed(t) if t == text), "{text}");
        }
    }

    #[test]
    fn control_characters_become_visible_escapes_that_read_back_unambiguously() {
        let forged = "busy\n2025-01-01T00:00:00Z ERROR forged\r\x1b[2J\x1b]0;title\x07\t\\x\u{7f}\u{85}";
        let shown = escape(forged);
        assert_eq!(
            shown,
            "busy\\n2025-01-01T00:00:00Z ERROR forged\\r\\u{1b}[2J\\u{1b}]0;title\\u{7}\\t\\\\x\\u{7f}\\u{85}"
        );
        assert!(!shown.chars().any(|c| c.is_control()), "{shown}");
        // Text that looks like an escape is not one: its backslash is doubled.
        assert_eq!(escape("\\u{1b}"), "\\\\u{1b}");
        assert_eq!(escape("a\u{202e}b\u{2066}c\u{2028}d"), "a\\u{202e}b\\u{2066}c\\u{2028}d");
    }

    #[test]
    fn bytes_that_are_not_utf8_become_replacement_characters() {
        assert_eq!(from_bytes(b"ok \xff\xfe\x1b[0m"), "ok \u{fffd}\u{fffd}\\u{1b}[0m");
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let text = "ab€cd".as_bytes(); // € is 3 bytes, at 2..5
        assert_eq!(cut_at_char(text, 10), text);
        assert_eq!(cut_at_char(text, 5), "ab€".as_bytes());
        for max in 2..5 {
            assert_eq!(cut_at_char(text, max), b"ab", "cut at {max}");
        }
        assert_eq!(cut_at_char(b"\x80\x80\x80\x80\x80", 3), b"\x80\x80\x80", "not UTF-8: cut at the limit");
        assert_eq!(cut_at_char(b"", 0), b"");
    }
}
