//! Percent-encoding of the parts of a store URL (a user name, a password, a database name, a
//! parameter value), for the store crates' URL parsers and the URLs they show: the
//! `percent-encoding` crate, with the strictness a store URL wants.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str};

/// What a URL part shows as it is: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-decodes a URL part; `None` if a `%` is not followed by two hex digits (the crate
/// would keep such a `%` as it is, a typo passed on as part of a password) or the bytes are not
/// UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let escapes_whole = text.split('%').skip(1).all(|after| {
        after
            .get(..2)
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if !escapes_whole {
        return None;
    }
    percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|decoded| decoded.into_owned())
}

/// Percent-encodes all but the unreserved characters (letters, digits, `-._~`), as a URL part
/// that reads back as `bytes`.
pub fn percent_encode(bytes: &[u8]) -> String {
    percent_encoding::percent_encode(bytes, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_refuses_what_the_crate_would_pass_on() {
        assert_eq!(
            percent_decode("s%40cr%2Ft:pw").as_deref(),
            Some("s@cr/t:pw")
        );
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        for bad in ["SE%ZZ", "x%4", "%", "%%41", "%C3"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode(b"a-b.c_d~e"), "a-b.c_d~e");
        assert_eq!(
            percent_encode("s@c/r t:é".as_bytes()),
            "s%40c%2Fr%20t%3A%C3%A9"
        );
        for text in ["s@c/r t:é", "100%", "a%2Fb"] {
            let encoded = percent_encode(text.as_bytes());
            assert_eq!(percent_decode(&encoded).as_deref(), Some(text));
        }
    }
}
