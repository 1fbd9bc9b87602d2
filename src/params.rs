//! Validated parameters: every range check on client input happens here, once, before any
//! state is read or written.

use std::fmt;

use crate::time::{parse_count, parse_seconds, Span, MAX_PERIOD};

/// ParamError names the argument a client got wrong; its `Display` text is the reply after
/// `ERR ` (e.g. `burst must be a positive integer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamError {
    /// The named count (`burst`, `rate`, …) is not an integer in `1..=2^64-1`.
    NotPositiveInteger(&'static str),
    /// The named count (`QUANTITY`, `MAXWAIT`, …) is not an integer in `0..=2^64-1`.
    NotNonNegativeInteger(&'static str),
    /// The named duration (`period`, `window`) is not a plain decimal of seconds in range.
    NotSeconds(&'static str),
    /// `period / rate` rounds to less than one nanosecond.
    RateTooHigh,
    /// `burst × emission interval` does not fit in 64-bit nanoseconds.
    BurstTooLarge,
    /// A lease token that is empty or longer than 64 bytes.
    BadToken,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPositiveInteger(name) => write!(f, "{name} must be a positive integer"),
            Self::NotNonNegativeInteger(name) => {
                write!(f, "{name} must be a non-negative integer")
            }
            Self::NotSeconds(name) => write!(
                f,
                "{name} must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 \
                 more digits), > 0 and <= 315360000"
            ),
            Self::RateTooHigh => write!(
                f,
                "rate is too high for period: the emission interval period/rate is below 1 ns"
            ),
            Self::BurstTooLarge => write!(
                f,
                "burst is too large: burst * period / rate overflows 64-bit nanoseconds"
            ),
            Self::BadToken => write!(f, "token must be 1 to 64 bytes"),
        }
    }
}

impl std::error::Error for ParamError {}

/// Parses a count that must be ≥ 1, naming `name` in the error.
#[inline(always)]
pub fn positive(text: &[u8], name: &'static str) -> Result<u64, ParamError> {
    match parse_count(text) {
        Some(value) if value >= 1 => Ok(value),
        _ => Err(ParamError::NotPositiveInteger(name)),
    }
}

/// Parses a count that may be 0, naming `name` in the error.
#[inline(always)]
pub fn non_negative(text: &[u8], name: &'static str) -> Result<u64, ParamError> {
    parse_count(text).ok_or(ParamError::NotNonNegativeInteger(name))
}

/// Parses a duration in seconds (see [`crate::time::parse_seconds`]), naming `name` in the
/// error.
#[inline(always)]
pub fn seconds(text: &[u8], name: &'static str) -> Result<Span, ParamError> {
    parse_seconds(text).ok_or(ParamError::NotSeconds(name))
}

/// GcraParams are the validated parameters of one GCRA limit.
///
/// Terms (ATM Forum Traffic Management Specification 4.0, the Generic Cell Rate Algorithm):
/// the *emission interval* `T` is the time one request "costs" (`period / rate`); the
/// *tolerance* `τ = burst · T` is how far ahead of now the theoretical arrival time may run,
/// i.e. how much capacity an idle key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraParams {
    /// Requests an idle key admits at once; ≥ 1.
    pub burst: u64,
    /// `T = period / rate`, rounded to the nearest nanosecond; `1 ns..=MAX_PERIOD`.
    pub emission_interval: Span,
    /// `τ = burst · T`; fits in 64-bit nanoseconds.
    pub tolerance: Span,
}

impl GcraParams {
    /// Builds the parameters from `burst` requests, `rate` requests per `period`.
    ///
    /// Errors: [`ParamError::NotPositiveInteger`] for a zero `burst`/`rate`,
    /// [`ParamError::NotSeconds`] for a `period` outside `1 ns..=MAX_PERIOD`,
    /// [`ParamError::RateTooHigh`] when `T` rounds to 0, [`ParamError::BurstTooLarge`] when
    /// `burst · T` overflows.
    #[inline(always)]
    pub fn new(burst: u64, rate: u64, period: Span) -> Result<Self, ParamError> {
        if burst == 0 {
            return Err(ParamError::NotPositiveInteger("burst"));
        }
        if rate == 0 {
            return Err(ParamError::NotPositiveInteger("rate"));
        }
        if period.is_zero() || period > MAX_PERIOD {
            return Err(ParamError::NotSeconds("period"));
        }
        // Round half up. `period + rate / 2` fits in 64 bits: the period is at most
        // MAX_PERIOD (< 2^59) and `rate / 2` below 2^63.
        let interval_ns = period
            .as_ns()
            .checked_add(rate / 2)
            .ok_or(ParamError::RateTooHigh)?
            / rate;
        Self::from_interval(burst, Span::from_ns(interval_ns))
    }

    /// Parses the argument words `burst rate period` of RL.GCRA and of `GCRA` specs.
    ///
    /// Errors: the [`ParamError`] naming the first bad argument, in argument order.
    #[inline(always)]
    pub fn parse(burst: &[u8], rate: &[u8], period: &[u8]) -> Result<Self, ParamError> {
        let burst = positive(burst, "burst")?;
        let rate = positive(rate, "rate")?;
        let period = seconds(period, "period")?;
        Self::new(burst, rate, period)
    }

    /// Builds the parameters from `burst` and an emission interval already in nanoseconds
    /// (as stored in a key), with the same checks as [`GcraParams::new`].
    #[inline(always)]
    pub fn from_interval(burst: u64, emission_interval: Span) -> Result<Self, ParamError> {
        if burst == 0 {
            return Err(ParamError::NotPositiveInteger("burst"));
        }
        if emission_interval.is_zero() {
            return Err(ParamError::RateTooHigh);
        }
        if emission_interval > MAX_PERIOD {
            return Err(ParamError::NotSeconds("period"));
        }
        let tolerance = emission_interval
            .checked_mul(burst)
            .ok_or(ParamError::BurstTooLarge)?;
        Ok(Self {
            burst,
            emission_interval,
            tolerance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NANOS_PER_SEC;

    const SECOND: Span = Span::from_ns(NANOS_PER_SEC);

    #[test]
    fn emission_interval_rounds_to_nearest_ns() {
        let p = GcraParams::new(1, 3, SECOND).unwrap();
        assert_eq!(p.emission_interval, Span::from_ns(333_333_333));
        let p = GcraParams::new(1, 3, SECOND.saturating_mul(2)).unwrap();
        assert_eq!(p.emission_interval, Span::from_ns(666_666_667));
        let p = GcraParams::new(1, 2, Span::from_ns(1)).unwrap(); // 0.5 ns rounds half up to 1
        assert_eq!(p.emission_interval, Span::from_ns(1));
    }

    #[test]
    fn rate_above_one_per_ns_is_rejected() {
        assert_eq!(
            GcraParams::new(1, 3, Span::from_ns(1)),
            Err(ParamError::RateTooHigh)
        );
        assert_eq!(
            GcraParams::new(1, u64::MAX, SECOND),
            Err(ParamError::RateTooHigh)
        );
        assert!(GcraParams::new(1, 1_000_000_000, SECOND).is_ok());
    }

    #[test]
    fn tolerance_overflow_is_rejected() {
        assert_eq!(
            GcraParams::new(u64::MAX, 1, SECOND),
            Err(ParamError::BurstTooLarge)
        );
        assert!(GcraParams::new(u64::MAX, 1_000_000_000, SECOND).is_ok());
    }

    #[test]
    fn errors_name_the_argument() {
        assert_eq!(
            positive(b"0", "burst").unwrap_err().to_string(),
            "burst must be a positive integer"
        );
        assert_eq!(
            non_negative(b"-1", "QUANTITY").unwrap_err().to_string(),
            "QUANTITY must be a non-negative integer"
        );
        assert!(seconds(b"1e3", "period")
            .unwrap_err()
            .to_string()
            .starts_with("period "));
    }
}

/// WindowParams are the validated parameters of one window limit: at most `limit` requests in
/// any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowParams {
    /// Requests allowed per window; ≥ 1.
    pub limit: u64,
    /// The window's length; `1 ns..=MAX_PERIOD`.
    pub window: Span,
}

impl WindowParams {
    /// Parses the argument words `limit window` of RL.WINDOW and of `WINDOW` specs.
    ///
    /// Errors: the [`ParamError`] naming the first bad argument, in argument order.
    #[inline(always)]
    pub fn parse(limit: &[u8], window: &[u8]) -> Result<Self, ParamError> {
        let limit = positive(limit, "limit")?;
        let window = seconds(window, "window")?;
        Self::new(limit, window)
    }

    /// Builds window parameters. Errors: [`ParamError::NotPositiveInteger`] for `limit` 0,
    /// [`ParamError::NotSeconds`] for a window outside `1 ns..=MAX_PERIOD`.
    pub fn new(limit: u64, window: Span) -> Result<Self, ParamError> {
        if limit == 0 {
            return Err(ParamError::NotPositiveInteger("limit"));
        }
        if window.is_zero() || window > MAX_PERIOD {
            return Err(ParamError::NotSeconds("window"));
        }
        Ok(Self { limit, window })
    }
}

impl crate::algo::lease::LeaseParams {
    /// Parses the argument words `limit lease` of RL.LEASE and of `LEASE` specs.
    ///
    /// Errors: the [`ParamError`] naming the first bad argument, in argument order.
    pub fn parse(limit: &[u8], lease: &[u8]) -> Result<Self, ParamError> {
        Ok(Self {
            limit: positive(limit, "limit")?,
            lease: seconds(lease, "lease")?,
        })
    }
}

/// Parses a lease `token`: 1 to 64 bytes, any bytes.
///
/// Errors: [`ParamError::BadToken`].
pub fn token(bytes: &[u8]) -> Result<crate::algo::lease::Token, ParamError> {
    crate::algo::lease::Token::new(bytes).ok_or(ParamError::BadToken)
}
