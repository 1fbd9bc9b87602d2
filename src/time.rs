//! Time in nanoseconds: the exact decimal-seconds parser and millisecond rounding.
//!
//! Every instant in the core is a `u64` count of nanoseconds since the Unix epoch and every
//! duration a `u64` count of nanoseconds (enough until the year 2554). No floats are used for
//! time: `0.1` seconds is exactly 100 000 000 ns.

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Nanoseconds in one millisecond.
pub const NANOS_PER_MILLI: u64 = 1_000_000;
/// Nanoseconds in one microsecond.
pub const NANOS_PER_MICRO: u64 = 1_000;
/// The longest `period` / `window` accepted: 315 360 000 s (ten 365-day years), in ns.
pub const MAX_PERIOD_NS: u64 = 315_360_000 * NANOS_PER_SEC;

/// Parses a `period` / `window` argument: seconds written as a plain decimal.
///
/// Accepts ASCII digits, optionally followed by `.` and 1 to 9 more digits (`1`, `60`, `0.25`,
/// `0.000001`), and returns the exact value in nanoseconds. Returns `None` for anything else:
/// signs, exponents, hex, `inf`/`nan`, `,` separators, `.5`, `5.`, empty input, whitespace,
/// more than 9 decimals, zero, and values above [`MAX_PERIOD_NS`].
pub fn parse_seconds_ns(text: &[u8]) -> Option<u64> {
    let (int_part, frac_part) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (text.get(..dot)?, Some(text.get(dot + 1..)?)),
        None => (text, None),
    };
    if int_part.is_empty() || !int_part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut seconds: u64 = 0;
    for &digit in int_part {
        seconds = seconds
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    let mut frac_ns: u64 = 0;
    if let Some(frac) = frac_part {
        if frac.is_empty() || frac.len() > 9 || !frac.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut scale = NANOS_PER_SEC;
        for &digit in frac {
            scale /= 10;
            frac_ns += u64::from(digit - b'0') * scale;
        }
    }
    let total = seconds.checked_mul(NANOS_PER_SEC)?.checked_add(frac_ns)?;
    (total > 0 && total <= MAX_PERIOD_NS).then_some(total)
}

/// Parses a count (`burst`, `rate`, `limit`, `QUANTITY`, …): ASCII digits only, no sign, no
/// exponent, no whitespace, at most `u64::MAX`. Leading zeros are accepted (`007` is 7).
/// Returns `None` for anything else, including the empty string.
pub fn parse_count(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &byte in text {
        if !byte.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
    }
    Some(value)
}

/// Converts a duration in nanoseconds to whole milliseconds, rounding **up** (SPEC: a client
/// that waits the reported time is never early).
pub fn ceil_ms(duration_ns: u64) -> u64 {
    duration_ns / NANOS_PER_MILLI + u64::from(duration_ns % NANOS_PER_MILLI != 0)
}

/// Converts a duration in nanoseconds to whole seconds, rounding up.
pub fn ceil_s(duration_ns: u64) -> u64 {
    duration_ns / NANOS_PER_SEC + u64::from(duration_ns % NANOS_PER_SEC != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_accepts_plain_decimals_exactly() {
        let table: &[(&str, u64)] = &[
            ("1", NANOS_PER_SEC),
            ("60", 60 * NANOS_PER_SEC),
            ("0.25", 250_000_000),
            ("86400", 86_400 * NANOS_PER_SEC),
            ("0.000001", 1_000),
            ("0.000000001", 1),
            ("1.5", 1_500_000_000),
            ("0.1", 100_000_000),
            ("007", 7 * NANOS_PER_SEC),
            ("315360000", MAX_PERIOD_NS),
            ("315360000.000000000", MAX_PERIOD_NS),
        ];
        for (text, expected) in table {
            assert_eq!(parse_seconds_ns(text.as_bytes()), Some(*expected), "{text}");
        }
    }

    #[test]
    fn seconds_rejects_everything_else() {
        let table = [
            "",
            "1e3",
            "-1",
            "+1",
            "0x10",
            "inf",
            "nan",
            "1,5",
            ".5",
            "5.",
            "0",
            "0.0",
            "0.0000000001",
            "1.0000000000",
            " 1",
            "1 ",
            "315360000.000000001",
            "315360001",
            "99999999999999999999999",
            "1..5",
            "1.5.",
            "١",
            "1_000",
        ];
        for text in table {
            assert_eq!(parse_seconds_ns(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn counts_are_digits_only() {
        assert_eq!(parse_count(b"0"), Some(0));
        assert_eq!(parse_count(b"18446744073709551615"), Some(u64::MAX));
        for text in [
            "",
            "-1",
            "+1",
            "1e3",
            " 1",
            "1 ",
            "18446744073709551616",
            "1.0",
            "0x1",
        ] {
            assert_eq!(parse_count(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(ceil_ms(0), 0);
        assert_eq!(ceil_ms(1), 1);
        assert_eq!(ceil_ms(NANOS_PER_MILLI), 1);
        assert_eq!(ceil_ms(NANOS_PER_MILLI + 1), 2);
        assert_eq!(ceil_ms(u64::MAX), u64::MAX / NANOS_PER_MILLI + 1);
        assert_eq!(ceil_s(1), 1);
        assert_eq!(ceil_s(NANOS_PER_SEC), 1);
    }
}
