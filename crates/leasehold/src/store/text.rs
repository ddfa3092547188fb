//! Free text the store keeps and operators read back: who paused a task or asked for a run
//! (`by`), why it was paused (`reason`), what went wrong in a run (its failure text). It
//! reaches a terminal (`leasehold status`, `history`), the sidecar's page and the timeline SVG,
//! and anyone who can reach a door (the library, the CLI, the sidecar's API) can write it. So
//! one rule, the same at every door:
//!
//! - A field a person writes on one line ([`BY`], [`REASON`]) is refused, with a [`TextError`]
//!   naming it, when it is longer than its limit or holds a character [`is_hidden`] names.
//! - A field a program writes ([`FAILURE`]: a job's error, a command's stderr) is kept as
//!   written, newlines and all, cut to its limit ([`Field::cut`]).
//! - Wherever text from the store is shown, [`visible`] renders the hidden characters as escapes
//!   (`\x1b`, `\n`, `\u{202e}`): an older release or a hand-written row may hold anything.
//!
//! Names and holder ids have rules of their own ([`LeaseName`](crate::LeaseName): ASCII letters,
//! digits and `- _ . : /`; [`HolderId`](crate::HolderId): no whitespace, nothing hidden).

use std::borrow::Cow;
use std::fmt::Write;

/// A free-text field: its name (as the API's JSON and the CLI's flag call it) and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Field {
    /// The field's name in messages: `by`, `reason`, `error`.
    pub name: &'static str,
    /// The longest accepted text, in bytes (UTF-8).
    pub max: usize,
}

/// Who paused a task or asked for a run: at most 200 bytes, one line.
pub const BY: Field = Field {
    name: "by",
    max: 200,
};

/// Why a task was paused: at most 2,000 bytes, one line. Every slot that falls in the pause
/// carries a copy in the history.
pub const REASON: Field = Field {
    name: "reason",
    max: 2000,
};

/// What went wrong in a run (a job's error, a command's stderr) or why it was told to stop:
/// any text, cut to 2,000 bytes when recorded.
pub const FAILURE: Field = Field {
    name: "error",
    max: 2000,
};

/// What a run printed (a command's stdout and stderr, a job's kept output): any text, cut to
/// its last 64 KiB when recorded ([`Field::cut_tail`]), so the end of a long log, where the
/// failure usually is, survives.
pub const OUTPUT: Field = Field {
    name: "output",
    max: 64 * 1024,
};

/// An application instance that a sidecar speaks for (a tick's or lease request's `instance`):
/// at most 100 bytes, one line; it becomes a catalog instance and the start of a holder id, so
/// it also holds no whitespace ([`HolderId`](crate::HolderId)'s rule).
pub const INSTANCE: Field = Field {
    name: "instance",
    max: 100,
};

/// Why a text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// Longer than the field's limit.
    #[error("{field} is {len} bytes long, the limit is {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// The text's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Holds a control or bidi character.
    #[error(
        "{field} holds the character {shown} at byte {at}; control and bidi characters are refused (write plain text on one line)",
        shown = visible(&ch.to_string())
    )]
    Hidden {
        /// The field.
        field: &'static str,
        /// The first such character.
        ch: char,
        /// Its byte offset in the text.
        at: usize,
    },
}

impl TextError {
    /// The field at fault (`by`, `reason`).
    pub fn field(&self) -> &'static str {
        match self {
            Self::TooLong { field, .. } | Self::Hidden { field, .. } => field,
        }
    }
}

impl Field {
    /// Refuses `text` if it is longer than the limit or holds a character [`is_hidden`] names.
    pub fn check(&self, text: &str) -> Result<(), TextError> {
        if text.len() > self.max {
            return Err(TextError::TooLong {
                field: self.name,
                len: text.len(),
                max: self.max,
            });
        }
        match text.char_indices().find(|&(_, c)| is_hidden(c)) {
            Some((at, ch)) => Err(TextError::Hidden {
                field: self.name,
                ch,
                at,
            }),
            None => Ok(()),
        }
    }

    /// `text` cut to the limit (at a character boundary), ending `… [N bytes cut]` when cut.
    pub fn cut(&self, mut text: String) -> String {
        if text.len() <= self.max {
            return text;
        }
        let len = text.len();
        // The note is at most 36 bytes (a 20-digit count); the cut leaves room for it.
        let mut end = self.max.saturating_sub(36);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        let _ = write!(text, "… [{} bytes cut]", len - end);
        text
    }
}

impl Field {
    /// The end of `text`: its last bytes up to the limit, from a character boundary (so at
    /// most the limit, never a broken character).
    pub fn cut_tail(&self, text: String) -> String {
        keep_end(text, self.max)
    }
}

/// The last bytes of `text`, at most `max` of them, from a character boundary.
pub fn keep_end(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text.drain(..start);
    text
}

/// Whether `c` is refused in one-line fields and escaped wherever text is shown: the C0
/// controls (NUL to US, with tab, CR and LF), DEL, the C1 controls (U+0080 to U+009F, which
/// some terminals obey as ESC sequences), the Unicode bidi controls that reorder what follows
/// (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069), the line and paragraph
/// separators (U+2028, U+2029), and U+FFFE and U+FFFF (which XML forbids).
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{fffe}'
                | '\u{ffff}'
        )
}

/// `text` with every character [`is_hidden`] names written as an escape: `\n`, `\r`, `\t`,
/// `\0`, `\x1b` for the other C0 controls and DEL, `\u{202e}` for the rest. Everything else
/// (backslashes included) is as written. Borrowed when there is nothing to escape.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if is_hidden(c) && u32::from(c) <= 0x7f => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if is_hidden(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character the rule names, for the tests here and their neighbours'.
    fn all_hidden() -> String {
        (0u32..=0x10ffff)
            .filter_map(char::from_u32)
            .filter(|&c| is_hidden(c))
            .collect()
    }

    #[test]
    fn the_hidden_set_is_c0_del_c1_bidi_separators_and_what_xml_forbids() {
        let hidden = all_hidden();
        assert_eq!(hidden.chars().count(), 32 + 1 + 32 + 12 + 2 + 2);
        for c in [
            '\u{1b}', '\u{7}', '\r', '\n', '\0', '\u{7f}', '\u{9b}', '\u{202e}',
        ] {
            assert!(hidden.contains(c), "{c:?}");
        }
        for c in ['a', ' ', 'é', '→', '\u{200b}', '😀', '\\'] {
            assert!(!is_hidden(c), "{c:?}");
        }
    }

    #[test]
    fn visible_text_holds_no_hidden_character_and_names_each() {
        assert!(matches!(visible("plain · text"), Cow::Borrowed(_)));
        assert_eq!(
            visible("\u{1b}]0;x\u{7}a\r\nb\t\0\u{7f}\u{9b}\u{202e}z"),
            "\\x1b]0;x\\x07a\\r\\nb\\t\\0\\x7f\\u{9b}\\u{202e}z"
        );
        let shown = visible(&all_hidden()).into_owned();
        assert!(!shown.chars().any(is_hidden), "{shown}");
        assert!(shown.is_ascii(), "{shown}");
    }

    #[test]
    fn one_line_fields_refuse_hidden_characters_and_long_text() {
        assert_eq!(BY.check("ops@host"), Ok(()));
        assert_eq!(REASON.check("vendor API down → retry at 9"), Ok(()));
        assert_eq!(REASON.check(""), Ok(()));
        let escape = REASON.check("ok\u{1b}]0;x\u{7}").unwrap_err();
        assert_eq!(
            escape,
            TextError::Hidden {
                field: "reason",
                ch: '\u{1b}',
                at: 2
            }
        );
        assert_eq!(
            escape.to_string(),
            "reason holds the character \\x1b at byte 2; control and bidi characters are refused (write plain text on one line)"
        );
        assert_eq!(BY.check("ops\nfake").unwrap_err().field(), "by");
        assert!(matches!(
            BY.check("a\u{202e}b"),
            Err(TextError::Hidden { ch: '\u{202e}', .. })
        ));
        assert_eq!(BY.check(&"x".repeat(200)), Ok(()));
        assert_eq!(
            BY.check(&"x".repeat(201)).unwrap_err().to_string(),
            "by is 201 bytes long, the limit is 200"
        );
    }

    #[test]
    fn output_keeps_its_end_within_the_limit_at_a_character_boundary() {
        let short = "line\n".repeat(10);
        assert_eq!(OUTPUT.cut_tail(short.clone()), short);
        let exact = "o".repeat(OUTPUT.max);
        assert_eq!(OUTPUT.cut_tail(exact.clone()), exact);
        // 3-byte characters: the limit falls inside one, which is left out whole.
        for long in [
            format!("{}THE END", "x".repeat(200_000)),
            format!("{}THE END", "€".repeat(30_000)),
        ] {
            let cut = OUTPUT.cut_tail(long.clone());
            assert!(cut.len() <= OUTPUT.max, "{}", cut.len());
            assert!(cut.len() > OUTPUT.max - 4, "{}", cut.len());
            assert!(long.ends_with(&cut));
            assert!(cut.ends_with("THE END"));
        }
    }

    #[test]
    fn program_text_is_cut_to_its_limit_at_a_character_boundary() {
        let short = "exit status 3\nline two".to_owned();
        assert_eq!(FAILURE.cut(short.clone()), short);
        let exact = "e".repeat(FAILURE.max);
        assert_eq!(FAILURE.cut(exact.clone()), exact);
        for long in ["e".repeat(120_000), "é".repeat(5_000)] {
            let cut = FAILURE.cut(long.clone());
            assert!(cut.len() <= FAILURE.max, "{}", cut.len());
            assert!(long.starts_with(cut.split('…').next().unwrap()));
            let kept = cut.split('…').next().unwrap().len();
            assert!(
                cut.ends_with(&format!("… [{} bytes cut]", long.len() - kept)),
                "{cut}"
            );
        }
    }
}
