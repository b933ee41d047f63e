//! How values read on a page: attacker-chosen names made visible and cut
//! to size, identities decoded, instants and ages, durations parsed.
//!
//! Nothing here escapes HTML: the pages interpolate these strings through
//! maud, which does. What is escaped must also be legible: a control or
//! bidirectional character, which HTML-escaping leaves in place, would hide
//! or reorder text. Which characters those are, and how they are written,
//! is [`idem_runtime::shown`]'s one rule, the `idem` command's too.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use idem_runtime::shown::{escaped, escaped_rendering};
use idem_runtime::{Identity, PartValue};

/// How many characters of a name a page shows before cutting it.
pub(super) const SHOWN_CHARS: usize = 80;

/// A name as a page shows it: [`escaped`] (every hidden character as a
/// `\u{..}` escape, a backslash doubled), cut after [`SHOWN_CHARS`]
/// characters, saying how long it was. Whole and uncut where it is typed
/// back (a filter box): [`escaped`] itself.
pub(super) fn shown(text: &str) -> String {
    cut(text, escaped)
}

/// Text rendered in a notation of its own (the parts of an identity as
/// `Debug` writes them) as a page shows it: [`escaped_rendering`], cut as
/// [`shown`] cuts.
pub(super) fn shown_rendering(text: &str) -> String {
    cut(text, escaped_rendering)
}

/// A stored value (JSON) whole, each hidden character as a `\u{..}` escape
/// ([`shown_rendering`] without the cut): for a value shown on asking.
pub(super) fn visible(text: &str) -> String {
    escaped_rendering(text).into_owned()
}

fn cut(text: &str, escape: fn(&str) -> Cow<'_, str>) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => escape(text).into_owned(),
        Some((at, _)) => format!(
            "{}… ({} characters)",
            escape(&text[..at]),
            text.chars().count()
        ),
    }
}

/// A claim's identity, decoded: its action and parts, or why it cannot be.
pub(super) struct Decoded {
    /// The action; `None` when the identity is not in idem's format.
    pub action: Option<String>,
    /// `["ord_1", 4999]`, or what is wrong with the bytes.
    pub parts: String,
    /// The address is the digest of the stored identity.
    pub address_matches: bool,
}

/// The parts of `identity` as a list: `["ord_1", 4999, true]`, text
/// quoted, bytes and UUIDs in hex, each cut after 64 bytes.
fn parts_listed(identity: &Identity) -> String {
    const SHOWN: usize = 64;
    fn cut(bytes: &[u8]) -> (&[u8], String) {
        let more = bytes.len().saturating_sub(SHOWN);
        let tail = if more > 0 {
            format!("…(+{more} bytes)")
        } else {
            String::new()
        };
        (&bytes[..bytes.len().min(SHOWN)], tail)
    }
    let parts: Vec<String> = identity
        .parts()
        .map(|part| match part {
            PartValue::Text(text) => {
                let (shown, tail) = cut(text.as_bytes());
                // Cut at a character boundary: what fits of the text.
                let shown = text
                    .char_indices()
                    .take_while(|(at, c)| at + c.len_utf8() <= shown.len())
                    .map(|(_, c)| c)
                    .collect::<String>();
                format!("{shown:?}{tail}")
            }
            PartValue::Integer(digits) => digits.to_owned(),
            PartValue::Boolean(value) => value.to_string(),
            PartValue::Uuid(bytes) => {
                format!(
                    "uuid:{}",
                    bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
                )
            }
            PartValue::Bytes(bytes) => {
                let (shown, tail) = cut(bytes);
                format!("bytes:{shown:02x?}{tail}")
            }
            other => format!("{other:?}"),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

pub(super) fn decode(identity: &[u8], address: &str) -> Decoded {
    match Identity::from_canonical(identity) {
        Ok(identity) => Decoded {
            action: Some(identity.action().to_owned()),
            parts: parts_listed(&identity),
            address_matches: identity.address() == address,
        },
        Err(error) => Decoded {
            action: None,
            parts: format!("<{error}; {} bytes>", identity.len()),
            address_matches: false,
        },
    }
}

/// `2h 03m`: an age in seconds, to the two largest units.
pub(super) fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s:02}s"),
        (0, _, _) => format!("{h}h {m:02}m"),
        _ => format!("{d}d {h:02}h"),
    }
}

/// `2026-12-04 21:07:09.123456 UTC`: microseconds since the Unix epoch.
pub(super) fn instant(micros: i64) -> String {
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{fraction:06} UTC",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A duration as the filters write it: `90s`, `5m`, `2h`, `7d`, `1w`, or
/// several (`1h30m`); a bare number is seconds.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || {
        format!(
            "\"{}\" is not a duration: write a number and a unit, s, m, h, d or w (90s, 5m, 2h, \
             7d), or several (1h30m)",
            shown(text)
        )
    };
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for ch in text.chars() {
        if ch.is_ascii_digit() {
            number.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(bad()),
        };
        let value: u64 = number.parse().map_err(|_| bad())?;
        number.clear();
        total = value
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    if !number.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

pub(super) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_show_as_escapes_and_long_names_are_cut() {
        assert_eq!(shown("acme"), "acme");
        assert_eq!(
            shown("a\u{202e}b\0c\n\u{61c}"),
            "a\\u{202e}b\\u{0}c\\u{a}\\u{61c}"
        );
        // A backslash doubled, so that the name reads back; a rendering's
        // backslashes are its own.
        assert_eq!(shown(r"a\b"), r"a\\b");
        assert_eq!(shown_rendering(r#"["a\"b"]"#), r#"["a\"b"]"#);
        assert_eq!(visible("\"\u{202e}\""), "\"\\u{202e}\"");
        let long = "x".repeat(1000);
        let cut = shown(&long);
        assert!(cut.starts_with(&"x".repeat(SHOWN_CHARS)));
        assert!(cut.ends_with("(1000 characters)"), "{cut}");
        // Not escaped here: maud escapes the markup.
        assert_eq!(shown("<script>"), "<script>");
    }

    #[test]
    fn instants_and_ages_read_as_people_write_them() {
        assert_eq!(instant(0), "1970-01-01 00:00:00.000000 UTC");
        assert_eq!(
            instant(1_796_425_629_123_456),
            "2026-12-04 23:07:09.123456 UTC"
        );
        assert_eq!(instant(-1), "1969-12-31 23:59:59.999999 UTC");
        assert_eq!(age(59), "59s");
        assert_eq!(age(61), "1m 01s");
        assert_eq!(age(7380), "2h 03m");
        assert_eq!(age(90_000), "1d 01h");
    }

    #[test]
    fn durations_parse_or_say_how_to_write_them() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        for bad in ["", "m", "5x", "1h30", "-5m", "99999999999999999999w"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(b"a\0\xff")), Some(b"a\0\xff".to_vec()));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
