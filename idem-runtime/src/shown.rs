//! How idem shows text it did not write: the one rule for the `idem`
//! command's output, its error messages, the console's pages and its log
//! lines.
//!
//! Names of accounts, namespaces and actions, and key parts, are chosen by
//! whoever makes a claim, which may be an attacker. Printed as they are, a
//! control character rewrites the operator's terminal (`ESC [2J` clears
//! it, a carriage return overwrites the line), a line break forges a line
//! of its own, and a bidirectional or invisible formatting character
//! (U+202E, U+061C, U+200B) reorders or hides what is shown, so that one
//! name passes for another. [`is_escaped`] says which characters those are;
//! [`escaped`] writes a name with each of them as a `\u{..}` escape (and a
//! backslash as `\\`, so that the escaping reads back unambiguously with
//! [`unescaped`]).
//!
//! A database URL may carry a password (`postgres://app:PASSWORD@db/app`,
//! `?password=...`), and a malformed one (a password holding `/` or a
//! space) too: [`redacted`] hides it in the URL, and [`redacted_in`] in a
//! message that may echo it.
//!
//! ```
//! use idem_runtime::shown::{escaped, redacted, unescaped};
//!
//! let account = "acme\u{202e}nimda\u{1b}[2J";
//! assert_eq!(escaped(account), r"acme\u{202e}nimda\u{1b}[2J");
//! assert_eq!(unescaped(&escaped(account)).unwrap(), account);
//! assert_eq!(
//!     redacted("postgres://app:s3cret@db/app?sslmode=require"),
//!     "postgres://app:***@db/app?sslmode=require"
//! );
//! ```

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::ops::Range;

/// Whether `c` is shown as a `\u{..}` escape rather than as itself: it
/// would not show as itself, or would change how the text around it shows.
///
/// - every control character (general category Cc): C0 (`\n`, `\r`, ESC,
///   ...), DEL and C1 (U+0080 to U+009F);
/// - every formatting character (general category Cf, as of Unicode 15.1,
///   listed in [`FORMATTING`]): the bidirectional marks, embeddings,
///   overrides and isolates (U+061C, U+200E, U+200F, U+202A to U+202E,
///   U+2066 to U+2069), the zero-width ones (U+200B to U+200D, U+2060,
///   U+FEFF), the invisible operators, the soft hyphen, the tag
///   characters, and the rest;
/// - the line and paragraph separators, U+2028 and U+2029.
///
/// ```
/// use idem_runtime::shown::is_escaped;
///
/// for c in ['\u{1b}', '\n', '\u{7f}', '\u{85}', '\u{202e}', '\u{61c}', '\u{200b}', '\u{2028}'] {
///     assert!(is_escaped(c), "{c:?}");
/// }
/// for c in ['a', ' ', '\\', 'é', '漢', '👩'] {
///     assert!(!is_escaped(c), "{c:?}");
/// }
/// ```
pub fn is_escaped(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}')
        || FORMATTING
            .iter()
            .any(|&(first, last)| (first..=last).contains(&c))
}

/// The formatting characters (general category Cf) of Unicode 15.1, as
/// ranges: no dependency knows them for us, so they are listed here. (One
/// unassigned code point, U+2065, is in a range too: escaping it hides
/// nothing.)
pub const FORMATTING: &[(char, char)] = &[
    ('\u{ad}', '\u{ad}'),       // soft hyphen
    ('\u{600}', '\u{605}'),     // Arabic number signs
    ('\u{61c}', '\u{61c}'),     // Arabic letter mark
    ('\u{6dd}', '\u{6dd}'),     // Arabic end of ayah
    ('\u{70f}', '\u{70f}'),     // Syriac abbreviation mark
    ('\u{890}', '\u{891}'),     // Arabic pound and piastre marks above
    ('\u{8e2}', '\u{8e2}'),     // Arabic disputed end of ayah
    ('\u{180e}', '\u{180e}'),   // Mongolian vowel separator
    ('\u{200b}', '\u{200f}'),   // zero width space, non-joiner, joiner; LRM, RLM
    ('\u{202a}', '\u{202e}'),   // embeddings, pop, overrides
    ('\u{2060}', '\u{206f}'),   // word joiner, invisible operators, isolates, deprecated
    ('\u{feff}', '\u{feff}'),   // zero width no-break space (byte order mark)
    ('\u{fff9}', '\u{fffb}'),   // interlinear annotation
    ('\u{110bd}', '\u{110bd}'), // Kaithi number sign
    ('\u{110cd}', '\u{110cd}'), // Kaithi number sign above
    ('\u{13430}', '\u{1343f}'), // Egyptian hieroglyph format controls
    ('\u{1bca0}', '\u{1bca3}'), // shorthand format controls
    ('\u{1d173}', '\u{1d17a}'), // musical symbol beams, ties, slurs, phrases
    ('\u{e0001}', '\u{e0001}'), // language tag
    ('\u{e0020}', '\u{e007f}'), // tag characters
];

/// A name (of an account, a namespace, an action; a key part) as idem shows
/// it: each character [`is_escaped`] as `\u{hex}` (lowercase, no leading
/// zeros), each backslash as `\\`, everything else as it is. Borrowed when
/// nothing changes, as for every ordinary name. [`unescaped`] reads it back.
///
/// ```
/// use idem_runtime::shown::escaped;
///
/// assert_eq!(escaped("acme"), "acme");
/// assert_eq!(escaped("a\u{202e}b\nc"), r"a\u{202e}b\u{a}c");
/// // The backslash doubled: a name that looks like an escape stays apart
/// // from the name it looks like.
/// assert_eq!(escaped(r"a\u{202e}b"), r"a\\u{202e}b");
/// ```
pub fn escaped(text: &str) -> Cow<'_, str> {
    escape(text, |c| is_escaped(c) || c == '\\')
}

/// Text idem rendered in a notation of its own (a `Debug` rendering such
/// as an identity's `["ord\"1", 7]`, a stored JSON value), or composed of
/// names already [`escaped`]: each character [`is_escaped`] as `\u{hex}`,
/// and backslashes left alone, since they are that notation's (doubling
/// them would show `"ord\\"1"`, which reads as another value). Not
/// reversible: for text shown, never for a name typed back.
///
/// ```
/// use idem_runtime::shown::escaped_rendering;
///
/// assert_eq!(escaped_rendering(r#"["ord\"1", 7]"#), r#"["ord\"1", 7]"#);
/// assert_eq!(escaped_rendering("[7\u{1b}[2J]"), r"[7\u{1b}[2J]");
/// ```
pub fn escaped_rendering(text: &str) -> Cow<'_, str> {
    escape(text, is_escaped)
}

/// [`escaped_rendering`] for text of several lines (a message, a report):
/// its line breaks (`\n`) kept, every other character [`is_escaped`]
/// escaped, `\r` included.
///
/// ```
/// use idem_runtime::shown::escaped_lines;
///
/// assert_eq!(escaped_lines("one\ntwo\u{1b}[2J\r\n"), "one\ntwo\\u{1b}[2J\\u{d}\n");
/// ```
pub fn escaped_lines(text: &str) -> Cow<'_, str> {
    escape(text, |c| c != '\n' && is_escaped(c))
}

fn escape(text: &str, escapes: impl Fn(char) -> bool) -> Cow<'_, str> {
    let Some(first) = text.find(&escapes) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if !escapes(c) {
            out.push(c);
        } else if c == '\\' {
            out.push_str(r"\\");
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Cow::Owned(out)
}

/// Text as it was before [`escaped`]: `\\` read as a backslash, `\u{hex}`
/// (1 to 6 hex digits, a Unicode scalar value) as its character, anything
/// else as itself (a hidden character written as it is, too). Borrowed
/// when there is no backslash.
///
/// For a name typed back in the form idem showed it (the console's filter
/// boxes and links).
///
/// ```
/// use idem_runtime::shown::{escaped, unescaped};
///
/// assert_eq!(unescaped(r"a\u{202e}b\\c").unwrap(), "a\u{202e}b\\c");
/// assert_eq!(unescaped("plain").unwrap(), "plain");
/// let name = "C:\\temp\u{1b}";
/// assert_eq!(unescaped(&escaped(name)).unwrap(), name);
/// // A backslash that starts no escape: not text idem wrote.
/// assert!(unescaped(r"C:\temp").is_err());
/// ```
///
/// # Errors
///
/// [`NotEscaped`] when a backslash starts neither `\\` nor a valid
/// `\u{hex}`.
pub fn unescaped(text: &str) -> Result<Cow<'_, str>, NotEscaped> {
    if !text.contains('\\') {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(next) = after.strip_prefix('\\') {
            out.push('\\');
            rest = next;
            continue;
        }
        let escape = after.strip_prefix("u{").and_then(|digits| {
            let end = digits.find('}')?;
            let hex = &digits[..end];
            let valid = (1..=6).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit());
            let c = u32::from_str_radix(hex, 16)
                .ok()
                .filter(|_| valid)
                .and_then(char::from_u32)?;
            Some((c, &digits[end + 1..]))
        });
        match escape {
            Some((c, next)) => {
                out.push(c);
                rest = next;
            }
            None => {
                return Err(NotEscaped {
                    at: text.len() - rest.len() + at,
                });
            }
        }
    }
    out.push_str(rest);
    Ok(Cow::Owned(out))
}

/// Text [`unescaped`] cannot read: a backslash that starts neither `\\`
/// nor `\u{hex}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotEscaped {
    at: usize,
}

impl NotEscaped {
    /// Where the stray backslash is, in bytes from the start.
    pub fn position(&self) -> usize {
        self.at
    }
}

impl fmt::Display for NotEscaped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the backslash at byte {} starts no escape: a backslash is written \\\\, a hidden \
             character \\u{{hex}}",
            self.at
        )
    }
}

impl std::error::Error for NotEscaped {}

/// `url` with every password in it replaced by `***`, for a message:
///
/// - the password of its user information (`postgres://app:PASSWORD@db`),
///   up to the last `@` before the host. When the URL is malformed (a
///   password holding `/`, `?` or `#` ends the host part early), up to the
///   last `@` of the whole text: a URL with an `@` further on (in a query
///   value) may lose more than its password, never less. Text without
///   `://` is read the same way (`app:PASSWORD@db/app`);
/// - the value of every parameter whose name holds `pass` or `pwd` in any
///   case, percent-encoded or not (`?password=...`, which sqlx accepts;
///   `sslpassword`; a misspelt `passwd`), up to the next `&` or space;
///   also in text that is no URL (`host=db password=...`).
///
/// Borrowed when there is nothing to hide.
///
/// ```
/// use idem_runtime::shown::redacted;
///
/// assert_eq!(redacted("postgres://app@db/app"), "postgres://app@db/app");
/// assert_eq!(redacted("postgres://app:s3cret@db:5432/app"), "postgres://app:***@db:5432/app");
/// assert_eq!(redacted("postgres://app@db/app?password=s3cret&sslmode=require"),
///            "postgres://app@db/app?password=***&sslmode=require");
/// assert_eq!(redacted("postgres://app:s3/cr?et@db:notaport/app"), "postgres://app:***@db:notaport/app");
/// assert_eq!(redacted("app:s3cret@db/app"), "app:***@db/app");
/// ```
pub fn redacted(url: &str) -> Cow<'_, str> {
    let spans = secret_spans(url);
    if spans.is_empty() {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len());
    let mut last = 0;
    for span in spans {
        out.push_str(&url[last..span.start]);
        out.push_str("***");
        last = span.end;
    }
    out.push_str(&url[last..]);
    Cow::Owned(out)
}

/// `message` (an error that may echo the URL it is about, or parts of it)
/// with `url`'s passwords hidden: `url` itself, wherever it occurs, as
/// [`redacted`] writes it; and each password [`redacted`] finds in `url`,
/// as written there and percent-decoded, replaced by `***` wherever else it
/// occurs (outside the URL, so that a password that is also its user's
/// name, say, is not revealed by the gaps it leaves in the URL).
///
/// ```
/// use idem_runtime::shown::redacted_in;
///
/// let url = "postgres://app@db/app?password=s3cr%40t";
/// assert_eq!(
///     redacted_in(&format!("cannot connect to {url}: bad password s3cr@t"), url),
///     "cannot connect to postgres://app@db/app?password=***: bad password ***"
/// );
/// ```
pub fn redacted_in(message: &str, url: &str) -> String {
    let spans = secret_spans(url);
    if spans.is_empty() || url.is_empty() {
        return message.to_owned();
    }
    let shown = redacted(url);
    let mut secrets: Vec<String> = Vec::new();
    for span in spans {
        let raw = &url[span];
        for secret in [raw.to_owned(), percent_decoded(raw)] {
            if !secret.is_empty() && !secrets.contains(&secret) {
                secrets.push(secret);
            }
        }
    }
    // The longest first: a password that holds another is hidden whole.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    loop {
        // The next occurrence of the URL, as given or as shown: kept apart
        // from the scrubbing.
        let next = [url, shown.as_ref()]
            .into_iter()
            .filter_map(|whole| rest.find(whole).map(|at| (at, whole.len())))
            .min_by_key(|&(at, len)| (at, std::cmp::Reverse(len)));
        match next {
            Some((at, len)) => {
                out.push_str(&scrubbed(&rest[..at], &secrets));
                out.push_str(&shown);
                rest = &rest[at + len..];
            }
            None => {
                out.push_str(&scrubbed(rest, &secrets));
                return out;
            }
        }
    }
}

/// `text` with every occurrence of each secret replaced by `***`.
fn scrubbed(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// Where the passwords are in `url`: byte ranges, in order, not
/// overlapping, none empty.
fn secret_spans(url: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    if let Some(span) = userinfo_password(url) {
        spans.push(span);
    }
    spans.extend(password_parameters(url));
    spans.sort_by_key(|span| span.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

/// The password of the user information: after the first `:` and before
/// the `@` that ends it (the last one of the host part, or of the whole
/// text when the host part has none).
fn userinfo_password(url: &str) -> Option<Range<usize>> {
    let start = url.find("://").map_or(0, |at| at + 3);
    let rest = &url[start..];
    let host_part = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = host_part.rfind('@').or_else(|| rest.rfind('@'))?;
    let colon = rest[..at].find(':')?;
    (colon + 1 < at).then(|| start + colon + 1..start + at)
}

/// The values of the parameters named like a password (`pass`, `pwd`),
/// wherever a parameter may start: at the start, after `?`, `&`, `;` or
/// white space; as a URL writes them (`password=...` up to the next `&` or
/// space) and as libpq's keyword form does (`password = 'two words'`,
/// white space around `=`, a quoted value whole).
fn password_parameters(url: &str) -> Vec<Range<usize>> {
    let ends_name = |c: char| matches!(c, '=' | '?' | '&' | ';') || c.is_whitespace();
    let mut spans = Vec::new();
    let mut at = 0;
    while at < url.len() {
        let rest = &url[at..];
        let name_len = rest.find(ends_name).unwrap_or(rest.len());
        let name = &rest[..name_len];
        let value = rest[name_len..]
            .trim_start()
            .strip_prefix('=')
            .filter(|_| !name.is_empty())
            .map(str::trim_start);
        let Some(value) = value else {
            // No parameter here: past the name and what ended it.
            at += name_len;
            at += url[at..].chars().next().map_or(0, char::len_utf8);
            continue;
        };
        let value_start = url.len() - value.len();
        let value_len = match value.strip_prefix('\'') {
            Some(quoted) => 1 + closing_quote(quoted).map_or(quoted.len(), |end| end + 1),
            None => value
                .find(|c: char| c == '&' || c.is_whitespace())
                .unwrap_or(value.len()),
        };
        if value_len > 0 && is_password_name(name) {
            spans.push(value_start..value_start + value_len);
        }
        // Past the value: an `=` or a quote inside it starts nothing.
        at = value_start + value_len;
    }
    spans
}

/// Where the `'` that closes a quoted keyword value is (a backslash
/// escapes the next character).
fn closing_quote(quoted: &str) -> Option<usize> {
    let mut escaped = false;
    for (at, c) in quoted.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' => return Some(at),
            _ => {}
        }
    }
    None
}

/// `password`, `sslpassword`, `passwd`, `pwd`, ...: in any case, and
/// percent-decoded as sqlx decodes parameter names.
fn is_password_name(name: &str) -> bool {
    let name = percent_decoded(name).to_ascii_lowercase();
    name.contains("pass") || name.contains("pwd")
}

/// `text` with its `%XX` escapes decoded (invalid UTF-8 replaced).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_of_hidden_character_is_escaped() {
        // C0, DEL, C1.
        for c in (0..0x20).chain(0x7f..0xa0).filter_map(char::from_u32) {
            assert!(is_escaped(c), "{c:?}");
            assert_eq!(
                escaped(&c.to_string()),
                format!("\\u{{{:x}}}", u32::from(c))
            );
        }
        // Bidirectional marks, embeddings, overrides, isolates; zero-width
        // and invisible ones; the separators; tags; the rest of Cf.
        for c in [
            '\u{61c}',
            '\u{200e}',
            '\u{200f}',
            '\u{202a}',
            '\u{202b}',
            '\u{202c}',
            '\u{202d}',
            '\u{202e}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{2060}',
            '\u{2061}',
            '\u{2062}',
            '\u{2063}',
            '\u{2064}',
            '\u{feff}',
            '\u{2028}',
            '\u{2029}',
            '\u{ad}',
            '\u{600}',
            '\u{180e}',
            '\u{fff9}',
            '\u{110bd}',
            '\u{1343f}',
            '\u{1bca0}',
            '\u{1d173}',
            '\u{e0001}',
            '\u{e0041}',
            '\u{e007f}',
        ] {
            assert!(is_escaped(c), "{c:?}");
            assert_eq!(
                escaped(&format!("a{c}b")),
                format!("a\\u{{{:x}}}b", u32::from(c))
            );
        }
        // What shows as itself stays itself: borrowed.
        for text in ["acme", "é漢👩", "<script>\"'", " \u{a0}x", "ord_1 4999"] {
            assert!(matches!(escaped(text), Cow::Borrowed(_)), "{text:?}");
        }
        assert_eq!(escaped("a\\b"), r"a\\b");
    }

    #[test]
    fn the_table_of_formatting_characters_is_sorted_and_disjoint() {
        for pair in FORMATTING.windows(2) {
            assert!(pair[0].0 <= pair[0].1 && pair[0].1 < pair[1].0, "{pair:?}");
        }
        // Rust's own escaping for `Debug` agrees that none of them shows.
        for &(first, last) in FORMATTING {
            for c in first..=last {
                assert_ne!(c.escape_debug().to_string(), c.to_string(), "{c:?}");
            }
        }
    }

    #[test]
    fn renderings_keep_their_backslashes_and_lines_keep_their_breaks() {
        assert_eq!(escaped_rendering(r#""a\"b""#), r#""a\"b""#);
        assert_eq!(escaped_rendering("a\nb\u{61c}"), r"a\u{a}b\u{61c}");
        assert_eq!(escaped_lines("a\nb\u{61c}\\"), "a\nb\\u{61c}\\");
    }

    #[test]
    fn every_character_reads_back() {
        for c in (0..=0x10_ffff).filter_map(char::from_u32) {
            let text = format!("{c}x{c}");
            let shown = escaped(&text);
            assert!(!shown.chars().any(is_escaped), "{c:?}");
            assert_eq!(unescaped(&shown).as_deref(), Ok(text.as_str()), "{c:?}");
        }
    }

    /// A small generator (xorshift), so that the round trip is tried on
    /// many strings made of what is tricky: backslashes, escapes that are
    /// and are not, hidden characters, multi-byte ones.
    #[test]
    fn any_text_reads_back() {
        const PIECES: &[&str] = &[
            "\\",
            "\\\\",
            "u",
            "{",
            "}",
            "\\u{",
            "\\u{41}",
            "\\u{110000}",
            "\\u{d800}",
            "1b",
            "a",
            "é",
            "👩",
            "\u{202e}",
            "\u{61c}",
            "\u{1b}",
            "\n",
            "\u{200b}",
            "\u{85}",
            "\0",
            "\u{e0041}",
            " ",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = next() % 12;
            let text: String = (0..len)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            let shown = escaped(&text);
            assert!(!shown.chars().any(is_escaped), "{text:?}");
            assert_eq!(unescaped(&shown).as_deref(), Ok(text.as_str()), "{text:?}");
            // Whatever unescapes, escapes back to a text that unescapes to
            // the same.
            if let Ok(read) = unescaped(&text) {
                assert_eq!(unescaped(&escaped(&read)).as_deref(), Ok(read.as_ref()));
            }
        }
    }

    #[test]
    fn unescaping_refuses_what_escaping_never_writes() {
        for bad in [
            r"\",
            r"a\b",
            r"\u",
            r"\u{",
            r"\u{}",
            r"\u{zz}",
            r"\u{1234567}",
            r"\u{d800}",
            r"\u{110000}",
            r"\x41",
            r"\n",
        ] {
            assert!(unescaped(bad).is_err(), "{bad}");
        }
        assert_eq!(unescaped(r"ab\q").unwrap_err().position(), 2);
        // Hidden characters written as they are read as themselves.
        assert_eq!(unescaped("a\u{202e}").unwrap(), "a\u{202e}");
        assert_eq!(unescaped(r"\u{41}\u{1F469}").unwrap(), "A👩");
    }

    #[test]
    fn passwords_are_hidden_wherever_a_url_holds_one() {
        for (url, shown) in [
            (
                "postgres://app:s3cr%40t@db:5432/app?sslmode=require",
                "postgres://app:***@db:5432/app?sslmode=require",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/postgres",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ),
            ("not a url", "not a url"),
            ("postgresql://u:p@h/db/x@y", "postgresql://u:***@h/db/x@y"),
            // The last @ of the host part: sqlx reads the password so.
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            (
                "postgres://postgres@127.0.0.1:1/x?password=s3cret",
                "postgres://postgres@127.0.0.1:1/x?password=***",
            ),
            (
                "postgres://h/x?sslmode=require&PassWord=s3cret&x=1",
                "postgres://h/x?sslmode=require&PassWord=***&x=1",
            ),
            (
                "postgres://h/x?p%61ssword=s3cret",
                "postgres://h/x?p%61ssword=***",
            ),
            (
                "postgres://h/x?sslpassword=s3cret",
                "postgres://h/x?sslpassword=***",
            ),
            ("postgres://h/x?pwd=s3cret", "postgres://h/x?pwd=***"),
            // Malformed: a port that is none, a password with a space, a
            // slash, a question mark, a hash; no scheme.
            (
                "postgres://u:s3cret@host:notaport/db",
                "postgres://u:***@host:notaport/db",
            ),
            ("postgres://u:sec ret@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:s3/cret@127.0.0.1:1/db",
                "postgres://u:***@127.0.0.1:1/db",
            ),
            ("postgres://u:s3?cret@h/db", "postgres://u:***@h/db"),
            ("postgres://u:s3#cret@h/db", "postgres://u:***@h/db"),
            ("u:s3cret@127.0.0.1:1/db", "u:***@127.0.0.1:1/db"),
            (
                "host=db password=s3cret user=u",
                "host=db password=*** user=u",
            ),
            // libpq's keyword form: spaces around `=`, a quoted value.
            (
                r"host=db password = 's3cret two\' words' user=u",
                "host=db password = *** user=u",
            ),
            ("host=db password='s3cret", "host=db password=***"),
            // Nothing after the colon: no password to hide.
            ("postgres://u:@h/db", "postgres://u:@h/db"),
            // Both.
            (
                "postgres://u:a@h/db?password=b",
                "postgres://u:***@h/db?password=***",
            ),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!redacted(url).contains("s3cret"), "{url}");
        }
    }

    #[test]
    fn a_message_loses_the_password_and_keeps_the_rest() {
        let url = "postgres://postgres:s3cret@127.0.0.1:1/x";
        assert_eq!(
            redacted_in(&format!("cannot reach {url}; password s3cret refused"), url),
            "cannot reach postgres://postgres:***@127.0.0.1:1/x; password *** refused"
        );
        // Already redacted: kept; and a password that is its user's name is
        // not revealed by the gaps it would leave in the URL.
        let url = "postgres://postgres:postgres@h/x";
        let message = "cannot connect to postgres://postgres:***@h/x: role \"postgres\"";
        assert_eq!(
            redacted_in(message, url),
            "cannot connect to postgres://postgres:***@h/x: role \"***\""
        );
        // Percent-decoded too.
        let url = "postgres://u@h/x?password=s3%20cret";
        assert_eq!(redacted_in("got s3 cret", url), "got ***");
        // No password: the message as it is.
        assert_eq!(redacted_in("a s3cret", "postgres://u@h/x"), "a s3cret");
        // sqlx's warning about a parameter it does not know, misspelt.
        let url = "postgres://u@h/x?passwd=s3cret";
        assert_eq!(
            redacted_in(
                "ignoring unrecognized connect parameter key=passwd value=s3cret",
                url
            ),
            "ignoring unrecognized connect parameter key=passwd value=***"
        );
    }
}
