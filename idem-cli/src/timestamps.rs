//! Instants and durations on the command line and in the output.
//!
//! `--settled-before` is parsed here rather than handed to PostgreSQL as
//! `$1::timestamptz`: PostgreSQL would also accept `now`, `yesterday`,
//! `epoch` and `infinity`, and would read a bare date in the session's time
//! zone, which differs between servers. Here exactly two forms are accepted,
//! the instant is fixed before anything is deleted, and the confirmation
//! prints it in UTC.

use std::time::Duration;

use jiff::Timestamp;
use jiff::civil::{Date, Time};
use jiff::tz::Offset;

/// Parses `--settled-before`: `YYYY-MM-DD` (midnight UTC), or an RFC 3339
/// instant with an offset (`2024-05-01T12:00:00Z`, `...+02:00`).
pub fn parse_instant(text: &str) -> Result<Timestamp, String> {
    const FORMS: &str = "write YYYY-MM-DD (midnight UTC) or an RFC 3339 instant with an offset, \
                         such as 2024-05-01T12:00:00Z";
    if let Ok(instant) = text.parse::<Timestamp>() {
        return Ok(instant);
    }
    // Exactly a date: a longer text is a date-time that lacked an offset.
    if text.len() == "YYYY-MM-DD".len() {
        let date: Date = text
            .parse()
            .map_err(|e| format!("{text:?} is not a valid date ({e}); {FORMS}"))?;
        return Offset::UTC
            .to_timestamp(date.to_datetime(Time::midnight()))
            .map_err(|e| format!("{text:?} is out of range ({e}); {FORMS}"));
    }
    Err(format!("{text:?} is not a date or an instant; {FORMS}"))
}

/// Parses `--older-than`: a duration such as `10m`, `2h`, `3days`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 90s, 10m, 2h or 3days"))
}

/// Microseconds since the Unix epoch as RFC 3339 in UTC, full precision.
pub fn instant(micros: i64) -> String {
    Timestamp::from_microsecond(micros)
        .map_or_else(|_| format!("{micros} µs since 1970"), |t| t.to_string())
}

/// Microseconds since the Unix epoch as RFC 3339 in UTC, to the second.
pub fn instant_to_second(micros: i64) -> String {
    Timestamp::from_second(micros.div_euclid(1_000_000))
        .map_or_else(|_| format!("{micros} µs since 1970"), |t| t.to_string())
}

/// An age in at most two units: `45s`, `3m12s`, `5h03m`, `2d04h`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m{:02}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h{:02}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3_600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_midnight_utc_and_instants_keep_their_offset() {
        assert_eq!(
            parse_instant("2024-05-01").map(|t| t.to_string()),
            Ok("2024-05-01T00:00:00Z".to_owned())
        );
        assert_eq!(
            parse_instant("2024-05-01T12:00:00+02:00").map(|t| t.to_string()),
            Ok("2024-05-01T10:00:00Z".to_owned())
        );
        assert_eq!(
            parse_instant("2024-05-01T12:00:00.5Z").map(|t| t.to_string()),
            Ok("2024-05-01T12:00:00.5Z".to_owned())
        );
    }

    #[test]
    fn ambiguous_or_relative_instants_are_refused_with_the_forms() {
        for bad in [
            "2024-05-01T12:00:00",
            "now",
            "yesterday",
            "2024-02-30",
            "01/05/2024",
            "",
        ] {
            let error = parse_instant(bad).expect_err(bad);
            assert!(error.contains("YYYY-MM-DD"), "{bad}: {error}");
        }
    }

    #[test]
    fn durations_are_humantime() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert!(parse_duration("ten minutes").is_err_and(|e| e.contains("10m")));
    }

    #[test]
    fn instants_print_in_utc() {
        assert_eq!(
            instant(1_714_564_800_123_456),
            "2024-05-01T12:00:00.123456Z"
        );
        assert_eq!(
            instant_to_second(1_714_564_800_923_456),
            "2024-05-01T12:00:00Z"
        );
        assert_eq!(instant_to_second(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn ages_use_two_units_at_most() {
        assert_eq!(age(-3), "0s");
        assert_eq!(age(45), "45s");
        assert_eq!(age(192), "3m12s");
        assert_eq!(age(5 * 3_600 + 3 * 60 + 9), "5h03m");
        assert_eq!(age(2 * 86_400 + 4 * 3_600), "2d04h");
    }
}
