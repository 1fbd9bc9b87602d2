//! Time in nanoseconds: the [`Instant`] and [`Span`] types, the exact decimal-seconds parser,
//! and rounding to the milliseconds and seconds that replies carry.
//!
//! Every instant in the core is an [`Instant`]: a `u64` count of nanoseconds since the Unix
//! epoch (enough until the year 2554). Every duration is a [`Span`]: a `u64` count of
//! nanoseconds. They are distinct types, so an instant cannot be passed where a duration or a
//! count is expected, and all their arithmetic is checked or saturating. No floats are used
//! for time: `0.1` seconds is exactly 100 000 000 ns.

use std::fmt;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Nanoseconds in one millisecond.
pub const NANOS_PER_MILLI: u64 = 1_000_000;
/// Nanoseconds in one microsecond.
pub const NANOS_PER_MICRO: u64 = 1_000;
/// The longest `period` / `window` / `lease` accepted: 315 360 000 s (ten 365-day years).
pub const MAX_PERIOD: Span = Span(315_360_000 * NANOS_PER_SEC);

/// Instant is a point in time: nanoseconds since the Unix epoch, `0..=u64::MAX` (the year
/// 1970 to the year 2554).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

/// Span is a duration: a non-negative number of nanoseconds, `0..=u64::MAX` (about 584
/// years).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Span(u64);

impl Instant {
    /// The Unix epoch.
    pub const EPOCH: Instant = Instant(0);
    /// The last representable instant (in the year 2554).
    pub const MAX: Instant = Instant(u64::MAX);

    /// Returns the instant `ns` nanoseconds after the Unix epoch.
    pub const fn from_ns(ns: u64) -> Self {
        Self(ns)
    }

    /// Returns the nanoseconds since the Unix epoch.
    pub const fn as_ns(self) -> u64 {
        self.0
    }

    /// Returns `self + span`, or `None` past [`Instant::MAX`].
    pub fn checked_add(self, span: Span) -> Option<Instant> {
        self.0.checked_add(span.0).map(Instant)
    }

    /// Returns `self + span`, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, span: Span) -> Instant {
        Instant(self.0.saturating_add(span.0))
    }

    /// Returns `self − span`, or `None` before the epoch.
    pub fn checked_sub(self, span: Span) -> Option<Instant> {
        self.0.checked_sub(span.0).map(Instant)
    }

    /// Returns `self − span`, saturating at the epoch.
    pub fn saturating_sub(self, span: Span) -> Instant {
        Instant(self.0.saturating_sub(span.0))
    }

    /// Returns the time from `earlier` to `self`, or [`Span::ZERO`] if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Span {
        Span(self.0.saturating_sub(earlier.0))
    }

    /// Returns the time from `earlier` to `self`, or `None` if `earlier` is later.
    pub fn checked_since(self, earlier: Instant) -> Option<Span> {
        self.0.checked_sub(earlier.0).map(Span)
    }

    /// Returns the start of the `span`-long window that holds `self`, windows being aligned
    /// to the Unix epoch (`self − self mod span`). A zero `span` returns `self`.
    pub fn floor_to(self, span: Span) -> Instant {
        match self.0.checked_rem(span.0) {
            Some(rem) => Instant(self.0 - rem),
            None => self,
        }
    }

    /// Whether this instant lies within 20 years (twice the longest period) of the end of
    /// 64-bit nanosecond time, in the year 2554: a server clock this late, not the request,
    /// is what makes time arithmetic overflow.
    pub fn is_near_the_end_of_time(self) -> bool {
        self.0 > u64::MAX - 2 * MAX_PERIOD.0
    }

    /// Returns the milliseconds since the epoch, rounded up (an absolute expiry is never
    /// early), saturating at `i64::MAX`.
    pub fn ceil_unix_ms(self) -> i64 {
        i64::try_from(Span(self.0).ceil_ms()).unwrap_or(i64::MAX)
    }
}

impl Span {
    /// No time.
    pub const ZERO: Span = Span(0);
    /// The longest representable span.
    pub const MAX: Span = Span(u64::MAX);

    /// Returns a span of `ns` nanoseconds.
    pub const fn from_ns(ns: u64) -> Self {
        Self(ns)
    }

    /// Returns a span of `ms` milliseconds, saturating at [`Span::MAX`].
    pub const fn from_ms_saturating(ms: u64) -> Self {
        Self(ms.saturating_mul(NANOS_PER_MILLI))
    }

    /// Returns the length in nanoseconds.
    pub const fn as_ns(self) -> u64 {
        self.0
    }

    /// Returns true for a zero span.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Returns `self + other`, or `None` on overflow.
    pub fn checked_add(self, other: Span) -> Option<Span> {
        self.0.checked_add(other.0).map(Span)
    }

    /// Returns `self + other`, saturating at [`Span::MAX`].
    pub fn saturating_add(self, other: Span) -> Span {
        Span(self.0.saturating_add(other.0))
    }

    /// Returns `self − other`, or `None` if `other` is longer.
    pub fn checked_sub(self, other: Span) -> Option<Span> {
        self.0.checked_sub(other.0).map(Span)
    }

    /// Returns `self − other`, saturating at zero.
    pub fn saturating_sub(self, other: Span) -> Span {
        Span(self.0.saturating_sub(other.0))
    }

    /// Returns `self · n`, or `None` on overflow.
    pub fn checked_mul(self, n: u64) -> Option<Span> {
        self.0.checked_mul(n).map(Span)
    }

    /// Returns `self · n`, saturating at [`Span::MAX`].
    pub fn saturating_mul(self, n: u64) -> Span {
        Span(self.0.saturating_mul(n))
    }

    /// Returns the length in whole milliseconds, rounded **up** (`docs/reference.md#r-time-4`:
    /// a client that waits the reported time is never early).
    pub const fn ceil_ms(self) -> u64 {
        // One addition and one division on every span below `u64::MAX − 999,999` ns (584
        // years); the remainder only for the spans above.
        match self.0.checked_add(NANOS_PER_MILLI - 1) {
            Some(rounded_up) => rounded_up / NANOS_PER_MILLI,
            None => self.0 / NANOS_PER_MILLI + (self.0 % NANOS_PER_MILLI != 0) as u64,
        }
    }

    /// Returns the length in whole seconds, rounded up.
    pub const fn ceil_s(self) -> u64 {
        self.0 / NANOS_PER_SEC + (self.0 % NANOS_PER_SEC != 0) as u64
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Instant({}.{:09})",
            self.0 / NANOS_PER_SEC,
            self.0 % NANOS_PER_SEC
        )
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Span({}.{:09}s)",
            self.0 / NANOS_PER_SEC,
            self.0 % NANOS_PER_SEC
        )
    }
}

/// Parses a `period` / `window` / `lease` argument: seconds written as a plain decimal.
///
/// Accepts ASCII digits, optionally followed by `.` and 1 to 9 more digits (`1`, `60`, `0.25`,
/// `0.000001`), and returns the exact span. Returns `None` for anything else: signs,
/// exponents, hex, `inf`/`nan`, `,` separators, `.5`, `5.`, empty input, whitespace, more than
/// 9 decimals, zero, and values above [`MAX_PERIOD`].
#[inline(always)]
pub fn parse_seconds(text: &[u8]) -> Option<Span> {
    // The integer digits, then nothing or a dot and 1 to 9 digits.
    let int_len = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let (int_part, rest) = text.split_at(int_len);
    let seconds = parse_count(int_part)?;
    let mut frac_ns: u64 = 0;
    match rest {
        [] => {}
        [b'.', frac @ ..] if !frac.is_empty() && frac.len() <= 9 => {
            let mut scale = NANOS_PER_SEC;
            for &digit in frac {
                if !digit.is_ascii_digit() {
                    return None;
                }
                scale /= 10;
                frac_ns += u64::from(digit - b'0') * scale;
            }
        }
        _ => return None,
    }
    let total = seconds.checked_mul(NANOS_PER_SEC)?.checked_add(frac_ns)?;
    (total > 0 && total <= MAX_PERIOD.0).then_some(Span(total))
}

/// Parses a count (`burst`, `rate`, `limit`, `QUANTITY`, …): ASCII digits only, no sign, no
/// exponent, no whitespace, at most `u64::MAX`. Leading zeros are accepted (`007` is 7).
/// Returns `None` for anything else, including the empty string.
pub fn parse_count(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    // Up to 19 digits cannot overflow (10^19 − 1 < 2^64): no overflow check per digit.
    if text.len() <= 19 {
        let mut value: u64 = 0;
        for &byte in text {
            let digit = byte.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit));
        }
        return Some(value);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_accepts_plain_decimals_exactly() {
        // (text, expected nanoseconds)
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
            ("0000000000000000000060", 60 * NANOS_PER_SEC),
            ("0000000000000000000000.5", 500_000_000),
            ("315360000", MAX_PERIOD.as_ns()),
            ("315360000.000000000", MAX_PERIOD.as_ns()),
        ];
        for (text, expected_ns) in table {
            assert_eq!(
                parse_seconds(text.as_bytes()),
                Some(Span::from_ns(*expected_ns)),
                "{text}"
            );
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
            assert_eq!(parse_seconds(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn counts_are_digits_only() {
        assert_eq!(parse_count(b"0"), Some(0));
        assert_eq!(parse_count(b"18446744073709551615"), Some(u64::MAX));
        // 19 digits (the longest read without overflow checks), 20 with leading zeros.
        assert_eq!(
            parse_count(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(parse_count(b"00000000000000000007"), Some(7));
        assert_eq!(parse_count(b"99999999999999999999"), None);
        assert_eq!(parse_count(b"12/4"), None);
        assert_eq!(parse_count(b"1:"), None);
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
    fn durations_round_up() {
        let ns = Span::from_ns;
        assert_eq!(ns(0).ceil_ms(), 0);
        assert_eq!(ns(1).ceil_ms(), 1);
        assert_eq!(ns(NANOS_PER_MILLI).ceil_ms(), 1);
        assert_eq!(ns(NANOS_PER_MILLI + 1).ceil_ms(), 2);
        assert_eq!(Span::MAX.ceil_ms(), u64::MAX / NANOS_PER_MILLI + 1);
        // Around the top of the range, where adding 999,999 ns would overflow: the same as
        // the exact ceiling computed in 128 bits.
        let top_multiple = u64::MAX / NANOS_PER_MILLI * NANOS_PER_MILLI;
        for ns_value in [
            top_multiple - 1,
            top_multiple,
            top_multiple + 1,
            u64::MAX - NANOS_PER_MILLI,
            u64::MAX - (NANOS_PER_MILLI - 1),
            u64::MAX - (NANOS_PER_MILLI - 2),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let exact = (u128::from(ns_value)).div_ceil(u128::from(NANOS_PER_MILLI));
            assert_eq!(u128::from(ns(ns_value).ceil_ms()), exact, "{ns_value}");
        }
        assert_eq!(ns(1).ceil_s(), 1);
        assert_eq!(ns(NANOS_PER_SEC).ceil_s(), 1);
        assert_eq!(Instant::from_ns(1).ceil_unix_ms(), 1);
        assert_eq!(
            Instant::MAX.ceil_unix_ms(),
            (u64::MAX / NANOS_PER_MILLI + 1) as i64
        );
    }

    #[test]
    fn instant_arithmetic_is_checked() {
        let t = Instant::from_ns(10);
        assert_eq!(t.checked_add(Span::from_ns(5)), Some(Instant::from_ns(15)));
        assert_eq!(Instant::MAX.checked_add(Span::from_ns(1)), None);
        assert_eq!(Instant::MAX.saturating_add(Span::from_ns(1)), Instant::MAX);
        assert_eq!(t.checked_sub(Span::from_ns(11)), None);
        assert_eq!(t.saturating_sub(Span::from_ns(11)), Instant::EPOCH);
        assert_eq!(t.saturating_since(Instant::from_ns(4)), Span::from_ns(6));
        assert_eq!(t.saturating_since(Instant::from_ns(40)), Span::ZERO);
        assert_eq!(t.checked_since(Instant::from_ns(40)), None);
        assert_eq!(
            Instant::from_ns(125).floor_to(Span::from_ns(50)),
            Instant::from_ns(100)
        );
        assert_eq!(t.floor_to(Span::ZERO), t);
    }
}
