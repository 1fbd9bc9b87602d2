//! timestamp converts the times logs carry to integer nanoseconds since the Unix epoch, with
//! no floats: the Common Log Format's `10/Oct/2000:13:55:36 -0700`, RFC 3339
//! (`2000-10-10T20:55:36.123Z`), and epoch numbers in seconds, ms, µs or ns with an exact
//! decimal fraction (`970001736.123456`).

use chrono::{DateTime, NaiveDate};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The unit of a numeric timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unit {
    /// Guess from the size of the integer part: up to 11 digits seconds, 12–14 ms,
    /// 15–17 µs, more ns.
    Auto,
    /// Seconds.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// Nanoseconds.
    Ns,
}

fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 {
        return None;
    }
    bytes.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0'))
    })
}

fn month(name: &[u8]) -> Option<u32> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    MONTHS
        .iter()
        .position(|m| m.eq_ignore_ascii_case(name))
        .map(|i| i as u32 + 1)
}

/// Seconds since the epoch of a civil date and time, minus a UTC offset in seconds.
fn epoch_seconds(y: u64, mo: u32, d: u64, h: u64, mi: u64, s: u64, offset_s: i64) -> Option<i64> {
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(i32::try_from(y).ok()?, mo, u32::try_from(d).ok()?)?;
    let days = date.signed_duration_since(NaiveDate::from_ymd_opt(1970, 1, 1)?);
    let local = days.num_days() * 86_400 + (h * 3600 + mi * 60 + s) as i64;
    Some(local - offset_s)
}

/// Parses the Common Log Format time (`%t` without the brackets):
/// `dd/Mon/yyyy:HH:MM:SS ±hhmm`. Returns ns since the epoch; None for anything else or a time
/// before the epoch.
pub fn parse_clf(text: &[u8]) -> Option<u64> {
    // 10/Oct/2000:13:55:36 -0700
    if text.len() != 26
        || text[2] != b'/'
        || text[6] != b'/'
        || text[11] != b':'
        || text[14] != b':'
        || text[17] != b':'
        || text[20] != b' '
    {
        return None;
    }
    let d = digits(&text[0..2])?;
    let mo = month(&text[3..6])?;
    let y = digits(&text[7..11])?;
    let h = digits(&text[12..14])?;
    let mi = digits(&text[15..17])?;
    let s = digits(&text[18..20])?;
    let sign = match text[21] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let oh = digits(&text[22..24])?;
    let om = digits(&text[24..26])?;
    if oh > 23 || om > 59 {
        return None;
    }
    let offset = sign * (oh * 3600 + om * 60) as i64;
    let secs = epoch_seconds(y, mo, d, h, mi, s, offset)?;
    u64::try_from(secs).ok()?.checked_mul(NANOS_PER_SEC)
}

/// Parses an RFC 3339 / ISO 8601 date-time with an offset (`2000-10-10T20:55:36Z`,
/// `…36.123456+02:00`, a space instead of `T` accepted). Nanosecond precision, exact.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let t = DateTime::parse_from_rfc3339(text).ok()?;
    let secs = u64::try_from(t.timestamp()).ok()?;
    secs.checked_mul(NANOS_PER_SEC)?
        .checked_add(u64::from(t.timestamp_subsec_nanos()))
}

/// Parses a non-negative decimal number of `unit`s (digits, optionally `.` and more digits)
/// into exact nanoseconds; fraction digits below a nanosecond are dropped.
pub fn parse_epoch(text: &[u8], unit: Unit) -> Option<u64> {
    let (int_part, frac) = match memchr::memchr(b'.', text) {
        Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
        None => (text, None),
    };
    let int = digits(int_part)?;
    let unit = match unit {
        Unit::Auto => match int_part.len() {
            0..=11 => Unit::S,
            12..=14 => Unit::Ms,
            15..=17 => Unit::Us,
            _ => Unit::Ns,
        },
        u => u,
    };
    let scale: u64 = match unit {
        Unit::S => NANOS_PER_SEC,
        Unit::Ms => 1_000_000,
        Unit::Us => 1_000,
        Unit::Ns | Unit::Auto => 1,
    };
    let mut ns = int.checked_mul(scale)?;
    if let Some(frac) = frac {
        if frac.is_empty() || !frac.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut place = scale;
        for &b in frac {
            place /= 10;
            if place == 0 {
                break;
            }
            ns = ns.checked_add(u64::from(b - b'0') * place)?;
        }
    }
    Some(ns)
}

/// Parses any of the formats above, by shape: digits → epoch number, `dd/Mon/…` → CLF,
/// else RFC 3339.
pub fn parse_any(text: &str, unit: Unit) -> Option<u64> {
    let b = text.as_bytes();
    if b.first().is_some_and(u8::is_ascii_digit)
        && b.iter().all(|c| c.is_ascii_digit() || *c == b'.')
    {
        return parse_epoch(b, unit);
    }
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    if inner.len() == 26 && inner.as_bytes()[2] == b'/' {
        return parse_clf(inner.as_bytes());
    }
    parse_rfc3339(text).or_else(|| {
        // "2000-10-10 20:55:36Z": RFC 3339 allows a space for T; chrono wants the T.
        let fixed = text.replacen(' ', "T", 1);
        parse_rfc3339(&fixed)
    })
}

/// ClfCache remembers the last few CLF times parsed: a log repeats the same second many times.
#[derive(Default)]
pub struct ClfCache {
    entries: [([u8; 26], u64); 2],
    valid: [bool; 2],
    next: usize,
}

impl ClfCache {
    /// Parses `text` as [`parse_clf`] does, from the cache when it was seen recently.
    #[inline]
    pub fn parse(&mut self, text: &[u8]) -> Option<u64> {
        for i in 0..2 {
            if self.valid[i] && self.entries[i].0[..] == *text {
                return Some(self.entries[i].1);
            }
        }
        let ns = parse_clf(text)?;
        let mut key = [0u8; 26];
        key.copy_from_slice(text);
        self.entries[self.next] = (key, ns);
        self.valid[self.next] = true;
        self.next ^= 1;
        Some(ns)
    }
}

/// Formats ns since the epoch as RFC 3339 in UTC, to the millisecond (`2025-11-03T09:14:07.250Z`).
pub fn format_utc(ns: u64) -> String {
    let secs = (ns / NANOS_PER_SEC) as i64;
    let sub = (ns % NANOS_PER_SEC) as u32;
    match DateTime::from_timestamp(secs, sub) {
        Some(t) if sub == 0 => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => ns.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;

    #[test]
    fn clf_time_with_offsets() {
        // Apache's documentation example: 10/Oct/2000:13:55:36 -0700 is 20:55:36 UTC.
        assert_eq!(
            parse_clf(b"10/Oct/2000:13:55:36 -0700"),
            Some(971_211_336 * S)
        );
        assert_eq!(
            parse_clf(b"10/Oct/2000:20:55:36 +0000"),
            Some(971_211_336 * S)
        );
        assert_eq!(
            parse_clf(b"11/Oct/2000:02:25:36 +0530"),
            Some(971_211_336 * S)
        );
        assert_eq!(parse_clf(b"01/Jan/1970:00:00:00 +0000"), Some(0));
        assert_eq!(
            parse_clf(b"29/Feb/2024:12:00:00 +0000"),
            Some(1_709_208_000 * S)
        );
    }

    #[test]
    fn bad_clf_times_are_refused() {
        for bad in [
            "10/Oct/2000:13:55:36",
            "10/Foo/2000:13:55:36 -0700",
            "30/Feb/2023:00:00:00 +0000",
            "10/Oct/2000:24:00:00 +0000",
            "10/Oct/2000:13:60:00 +0000",
            "10/Oct/2000 13:55:36 -0700",
            "1x/Oct/2000:13:55:36 -0700",
            "10/Oct/2000:13:55:36 *0700",
            "10/Oct/2000:13:55:36 -07:0",
            "31/Dec/1969:23:59:59 +0000",
            "",
        ] {
            assert_eq!(parse_clf(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn epoch_numbers_are_exact() {
        assert_eq!(
            parse_epoch(b"1764567890", Unit::Auto),
            Some(1_764_567_890 * S)
        );
        assert_eq!(
            parse_epoch(b"1764567890.123456", Unit::Auto),
            Some(1_764_567_890 * S + 123_456_000)
        );
        // 0.1 is exactly 100 ms (a float would not be).
        assert_eq!(parse_epoch(b"0.1", Unit::S), Some(100_000_000));
        assert_eq!(
            parse_epoch(b"1764567890123", Unit::Auto),
            Some(1_764_567_890_123_000_000)
        );
        assert_eq!(
            parse_epoch(b"1764567890123.5", Unit::Ms),
            Some(1_764_567_890_123_500_000)
        );
        assert_eq!(
            parse_epoch(b"1764567890123456", Unit::Auto),
            Some(1_764_567_890_123_456_000)
        );
        assert_eq!(
            parse_epoch(b"1764567890123456789", Unit::Auto),
            Some(1_764_567_890_123_456_789)
        );
        assert_eq!(parse_epoch(b"1.0000000019", Unit::S), Some(S + 1));
        for bad in ["", ".5", "5.", "-1", "1e9", "1.2.3", "99999999999999999999"] {
            assert_eq!(parse_epoch(bad.as_bytes(), Unit::Auto), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_and_shapes() {
        assert_eq!(
            parse_any("2000-10-10T20:55:36Z", Unit::Auto),
            Some(971_211_336 * S)
        );
        assert_eq!(
            parse_any("2000-10-10T22:55:36.000000001+02:00", Unit::Auto),
            Some(971_211_336 * S + 1)
        );
        assert_eq!(
            parse_any("2000-10-10 20:55:36.5Z", Unit::Auto),
            Some(971_211_336 * S + S / 2)
        );
        assert_eq!(
            parse_any("[10/Oct/2000:13:55:36 -0700]", Unit::Auto),
            Some(971_211_336 * S)
        );
        assert_eq!(
            parse_any("971211336.25", Unit::Auto),
            Some(971_211_336 * S + S / 4)
        );
        assert_eq!(parse_any("yesterday", Unit::Auto), None);
        assert_eq!(parse_any("2000-10-10T20:55:36", Unit::Auto), None); // no offset
    }

    #[test]
    fn cache_returns_the_same_as_parsing() {
        let mut c = ClfCache::default();
        let a = b"10/Oct/2000:13:55:36 -0700";
        let b = b"10/Oct/2000:13:55:37 -0700";
        for t in [a, b, a, a, b, b, a] {
            assert_eq!(c.parse(t), parse_clf(t));
        }
        assert_eq!(c.parse(b"10/Oct/2000:13:55:3x -0700"), None);
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(971_211_336 * S), "2000-10-10T20:55:36Z");
        assert_eq!(
            format_utc(971_211_336 * S + S / 4),
            "2000-10-10T20:55:36.250Z"
        );
    }
}
