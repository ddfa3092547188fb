//! The end of what a command printed, kept for its run's history record (`--output-tail`): a
//! byte ring of the last N KiB of its stdout and stderr, interleaved as read, and the redaction
//! that takes passwords out before it is stored.
//!
//! What is redacted: every password of the store URL the run uses (its `user:password@` parts,
//! `password=` and `sentinel_password=` values, as written and percent-decoded), wherever it
//! appears, and the password of any `scheme://user:password@host` in the text. Each becomes
//! `***`. A password shorter than [`MIN_SECRET`] bytes is redacted only in those two shapes (as
//! free text it would blot out every occurrence of a common letter).

use std::collections::VecDeque;
use std::ops::Range;

/// What replaces a password.
const MASK: &str = "***";

/// The shortest password redacted wherever it appears.
const MIN_SECRET: usize = 4;

/// Bytes kept before the tail, so that a password or URL the tail's start cuts through is still
/// recognised whole (and a URL's password that begins before the tail is still found).
const LEAD: usize = 1024;

/// The last bytes of a command's output.
#[derive(Debug)]
pub struct Tail {
    bytes: VecDeque<u8>,
    /// The tail's length; [`LEAD`] more bytes are kept before it.
    keep: usize,
    /// Whether bytes before those kept were dropped.
    cut: bool,
}

impl Tail {
    /// A ring keeping the last `keep` bytes.
    pub fn new(keep: usize) -> Self {
        Self {
            bytes: VecDeque::with_capacity((keep + LEAD).min(64 * 1024)),
            keep,
            cut: false,
        }
    }

    /// Appends what was read; the oldest bytes go beyond the ring's size.
    pub fn push(&mut self, read: &[u8]) {
        let room = self.keep + LEAD;
        let read = if read.len() > room {
            self.cut = true;
            self.bytes.clear();
            &read[read.len() - room..]
        } else {
            read
        };
        let over = (self.bytes.len() + read.len()).saturating_sub(room);
        if over > 0 {
            self.cut = true;
            self.bytes.drain(..over);
        }
        self.bytes.extend(read);
    }

    /// The kept tail as text, redacted: at most `keep` bytes, from a character boundary (bytes
    /// that are not UTF-8 shown as U+FFFD). `None` when nothing was printed.
    pub fn text(&self, redact: &Redactor) -> Option<String> {
        if self.bytes.is_empty() || self.keep == 0 {
            return None;
        }
        let (a, b) = self.bytes.as_slices();
        let raw = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        let masks = redact.masks(&raw, self.cut);
        // The tail starts `keep` bytes before the end, or earlier, at the start of a mask that
        // reaches over it (so a password cut in two is shown as `***`, not as its end).
        let mut start = raw.len().saturating_sub(self.keep);
        while !raw.is_char_boundary(start) {
            start += 1;
        }
        if let Some(m) = masks.iter().find(|m| m.start < start && start < m.end) {
            start = m.start;
        }
        let mut out = String::with_capacity(raw.len() - start);
        let mut at = start;
        for m in masks.iter().filter(|m| m.end > start) {
            out.push_str(&raw[at..m.start]);
            out.push_str(MASK);
            at = m.end;
        }
        out.push_str(&raw[at..]);
        // A mask longer than what it hides (a password of one or two bytes) may overshoot.
        Some(leasehold::text::keep_end(out, self.keep))
    }
}

/// The passwords to take out of a command's output.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Long enough to redact wherever they appear; longest first.
    secrets: Vec<String>,
}

impl Redactor {
    /// Redacts the passwords of `store_url` (and of any URL in the text).
    pub fn for_store_url(store_url: &str) -> Self {
        let mut secrets = Vec::new();
        for (start, end) in url_passwords(store_url).chain(keyed_passwords(store_url)) {
            let written = &store_url[start..end];
            secrets.push(written.to_owned());
            secrets.push(percent_decoded(written));
        }
        secrets.retain(|s| s.len() >= MIN_SECRET);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { secrets }
    }

    /// The byte ranges of `text` to mask, in order and not overlapping. `cut`: `text` starts
    /// after bytes that were dropped, so it may start inside a password.
    fn masks(&self, text: &str, cut: bool) -> Vec<Range<usize>> {
        let mut masks: Vec<Range<usize>> = url_passwords(text).map(|(s, e)| s..e).collect();
        masks.extend(keyed_passwords(text).map(|(s, e)| s..e));
        for secret in &self.secrets {
            masks.extend(
                text.match_indices(secret.as_str())
                    .map(|(at, s)| at..at + s.len()),
            );
            if cut {
                // The end of a password whose start was dropped.
                let partial = (1..secret.len())
                    .filter(|&from| secret.is_char_boundary(from))
                    .map(|from| &secret[from..])
                    .find(|end| end.len() >= MIN_SECRET && text.starts_with(end));
                if let Some(end) = partial {
                    masks.push(0..end.len());
                }
            }
        }
        masks.retain(|m| !m.is_empty());
        masks.sort_by_key(|m| (m.start, std::cmp::Reverse(m.end)));
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(masks.len());
        for m in masks {
            match merged.last_mut() {
                Some(last) if m.start <= last.end => last.end = last.end.max(m.end),
                _ => merged.push(m),
            }
        }
        merged
    }

    /// `text` with its passwords masked (the whole of it, for tests and one-off texts).
    #[cfg(test)]
    fn redact(&self, text: &str) -> String {
        let mut out = String::new();
        let mut at = 0;
        for m in self.masks(text, false) {
            out.push_str(&text[at..m.start]);
            out.push_str(MASK);
            at = m.end;
        }
        out.push_str(&text[at..]);
        out
    }
}

/// The byte ranges of the passwords in `scheme://user:password@host` URLs in `text`: the
/// authority runs to the first `/ ? #`, whitespace or quote, the user part to its last `@`,
/// the password from the user part's first `:`.
fn url_passwords(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    text.match_indices("://").filter_map(move |(at, _)| {
        let scheme = text[..at]
            .bytes()
            .rev()
            .take_while(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b))
            .count();
        if scheme == 0 {
            return None;
        }
        let from = at + 3;
        let authority = text[from..]
            .find(|c: char| c.is_whitespace() || "/?#\"'<>`".contains(c))
            .map_or(&text[from..], |end| &text[from..from + end]);
        let user_part = &authority[..authority.rfind('@')?];
        let colon = user_part.find(':')?;
        Some((from + colon + 1, from + user_part.len()))
    })
}

/// The byte ranges of `password=VALUE` values (`sentinel_password=` too) in `text`: connection
/// strings and URL queries. A value runs to `&`, whitespace, or, quoted, to its closing quote.
fn keyed_passwords(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let lower = text.to_ascii_lowercase();
    let starts: Vec<usize> = lower
        .match_indices("password=")
        .map(|(at, key)| at + key.len())
        .collect();
    starts.into_iter().filter_map(move |from| {
        let rest = &text[from..];
        let (from, len) = match rest.chars().next() {
            Some(q @ ('\'' | '"')) => (from + 1, rest[1..].find(q).unwrap_or(rest.len() - 1)),
            _ => (
                from,
                rest.find(|c: char| c.is_whitespace() || c == '&' || c == '"')
                    .unwrap_or(rest.len()),
            ),
        };
        (len > 0).then_some((from, from + len))
    })
}

/// `%XX` escapes decoded (as a driver reads a URL's password); invalid ones kept as written.
fn percent_decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_bytes_as_text_from_a_character_boundary() {
        let none = Redactor::default();
        let mut tail = Tail::new(10);
        assert_eq!(tail.text(&none), None);
        tail.push(b"hello ");
        tail.push(b"world");
        assert_eq!(tail.text(&none).as_deref(), Some("ello world"));
        // Far more than the ring holds, in one read and in many.
        let mut one = Tail::new(1000);
        one.push(&b"x".repeat(100_000));
        one.push(b"END");
        let mut many = Tail::new(1000);
        for _ in 0..10_000 {
            many.push(b"xxxxxxxxxx");
        }
        many.push(b"END");
        for tail in [one, many] {
            let text = tail.text(&none).unwrap();
            assert_eq!(text.len(), 1000);
            assert!(text.ends_with("xxEND"));
            assert!(tail.bytes.len() <= 1000 + LEAD);
        }
        // Three-byte characters: the tail starts at the next whole one; invalid bytes shown.
        let mut euro = Tail::new(10);
        euro.push("€€€€€".as_bytes());
        assert_eq!(euro.text(&none).as_deref(), Some("€€€"));
        let mut bad = Tail::new(10);
        bad.push(b"ok \xff\xfe end");
        assert_eq!(bad.text(&none).as_deref(), Some("\u{fffd}\u{fffd} end"));
        assert_eq!(Tail::new(0).text(&none), None);
    }

    #[test]
    fn store_passwords_are_found_in_every_shape_of_url() {
        let secrets = |url: &str| Redactor::for_store_url(url).secrets;
        assert_eq!(secrets("postgres://app:s3cret!@db:5432/x"), ["s3cret!"]);
        assert_eq!(
            secrets("redis://:hunter2%40x@127.0.0.1:6379/0"),
            ["hunter2%40x", "hunter2@x"]
        );
        assert_eq!(
            secrets("redis+sentinel://:primary-pw@s1,s2/mymaster?sentinel_password=sent%2Fpw&db=1"),
            ["primary-pw", "sent%2Fpw", "sent/pw"]
        );
        assert_eq!(
            secrets("host=db user=app password='two words' dbname=app"),
            ["two words"]
        );
        assert!(secrets("sqlite:leasehold.db").is_empty());
        assert!(secrets("redis://127.0.0.1:6379").is_empty());
        // Too short to hunt for as free text.
        assert!(secrets("redis://:pw@h").is_empty());
    }

    #[test]
    fn passwords_are_masked_in_urls_and_wherever_the_stores_appear() {
        let r = Redactor::for_store_url("postgres://app:Tr0ub4dor@db/app");
        assert_eq!(
            r.redact("connecting to postgres://app:Tr0ub4dor@db/app\npw is Tr0ub4dor."),
            "connecting to postgres://app:***@db/app\npw is ***."
        );
        // Any URL's password, short ones too, and user parts holding `@` or `:`.
        let none = Redactor::default();
        assert_eq!(
            none.redact("a redis://:x@h:1 b https://u:p@ss:w@host/p?q c ftp://anon@h d"),
            "a redis://:***@h:1 b https://u:***@host/p?q c ftp://anon@h d"
        );
        assert_eq!(
            none.redact("dsn: \"mysql://root:pw@127.0.0.1:3306/t\" password=hunter2&x=1"),
            "dsn: \"mysql://root:***@127.0.0.1:3306/t\" password=***&x=1"
        );
        // Not URLs: left alone.
        assert_eq!(
            none.redact("a:b@c and x://@h and ://u:p@h"),
            "a:b@c and x://@h and ://u:p@h"
        );
    }

    #[test]
    fn a_password_the_tails_start_cuts_through_is_still_masked() {
        let r = Redactor::for_store_url("redis://:abcdefghij@127.0.0.1/0");
        // The ring dropped the start of the password: its end starts what is kept.
        let mut tail = Tail::new(8);
        tail.push(&vec![b'.'; LEAD + 100]);
        tail.push(b"abcdefghij end");
        assert_eq!(tail.text(&r).as_deref(), Some("*** end"));
        let mut tail = Tail::new(8);
        tail.push(&vec![b'.'; LEAD]);
        tail.push(b"x");
        tail.push(b"abcdefghij end");
        assert_eq!(tail.text(&r).as_deref(), Some("*** end"));
        // The tail's start falls inside a URL's password: masked whole.
        let mut tail = Tail::new(12);
        tail.push(b"see redis://u:longpassword@h/0 ok");
        assert_eq!(tail.text(&r).as_deref(), Some("***@h/0 ok"));
        // Only the end of the password is left after the drop (and it is long enough).
        let mut tail = Tail::new(20);
        tail.push(&vec![b'.'; 2000]);
        tail.push(b"abcdefghij tail");
        let mut cut = Tail::new(20);
        cut.push(&b"abcdefghij tail"[4..]);
        cut.cut = true;
        assert_eq!(cut.text(&r).as_deref(), Some("*** tail"));
        assert_eq!(tail.text(&r).as_deref(), Some(".....*** tail"));
    }
}
