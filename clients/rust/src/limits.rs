//! Limits as validated values: [`Gcra`], [`Window`] and [`Lease`].
//!
//! Every limit is checked when it is built, with the module's rules and the module's error
//! texts (`burst must be a positive integer`, …), so a bad limit fails where it is written,
//! not on the first request. Durations (`period`, `window`, `lease`) accept a
//! [`std::time::Duration`], whole seconds as an integer, seconds as an `f64`, or a string in
//! the module's grammar (`"60"`, `"0.25"`): see [`IntoSeconds`]. They are kept exactly, in
//! nanoseconds, and sent to Redis as the module's plain decimal.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

const NANOS_PER_SEC: u64 = 1_000_000_000;
/// The longest `period`, `window` or `lease` the module accepts: ten 365-day years, in seconds.
pub const MAX_SECONDS: u64 = 315_360_000;
const MAX_NS: u64 = MAX_SECONDS * NANOS_PER_SEC;

/// A limit or a request argument breaks the module's rules.
///
/// Its message is the module's error text without the `ERR ` prefix, so
/// `Gcra::new(0, 1, 1)` fails with `burst must be a positive integer`, exactly as
/// `RL.GCRA key 0 1 1` would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLimit(String);

impl InvalidLimit {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        InvalidLimit(message.into())
    }

    /// The message (the module's error text without `ERR `).
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InvalidLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidLimit {}

fn seconds_message(name: &str) -> InvalidLimit {
    InvalidLimit(format!(
        "{name} must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 more \
         digits), > 0 and <= {MAX_SECONDS}"
    ))
}

/// What a duration argument (`period`, `window`, `lease`) accepts.
///
/// * a [`Duration`], exactly;
/// * integers (`u64`, `u32`, `i64`, `i32`, `usize`): whole seconds.
/// * `f64`: seconds, rounded to the nearest nanosecond from its shortest decimal form
///   (`0.1` is exactly 100 ms).
/// * `&str` / `String`: the module's grammar, exactly: digits, optionally `.` and 1 to 9 more
///   digits (`"60"`, `"0.25"`); anything else (`"1e3"`, `"-1"`, `".5"`) is an error.
///
/// The value must be > 0 and ≤ 315360000 s.
///
/// ```
/// use std::time::Duration;
/// use redis_rl_client::Gcra;
///
/// let a = Gcra::new(10, 5, Duration::from_millis(500)).unwrap();
/// let b = Gcra::new(10, 5, "0.5").unwrap();
/// let c = Gcra::new(10, 5, 0.5).unwrap();
/// assert!(a == b && b == c);
/// assert!(Gcra::new(10, 5, "1e3").is_err());
/// ```
pub trait IntoSeconds {
    /// Converts to whole nanoseconds, validating; `name` names the argument in the error.
    fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit>;
}

fn check_range(ns: u128, name: &str) -> Result<u64, InvalidLimit> {
    if ns == 0 || ns > u128::from(MAX_NS) {
        return Err(seconds_message(name));
    }
    Ok(ns as u64)
}

impl IntoSeconds for Duration {
    fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit> {
        check_range(self.as_nanos(), name)
    }
}

macro_rules! whole_seconds {
    ($($t:ty),*) => {$(
        impl IntoSeconds for $t {
            fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit> {
                let s = u128::try_from(self).map_err(|_| seconds_message(name))?;
                check_range(s.saturating_mul(u128::from(NANOS_PER_SEC)), name)
            }
        }
    )*};
}
whole_seconds!(u64, u32, i64, i32, usize);

/// Parses `digits[.digits]` (the integer part non-empty, 1 to `max_frac` decimals), giving
/// the value in nanoseconds, rounded half to even when more than 9 decimals are allowed.
fn parse_decimal(text: &str, max_frac: usize) -> Option<u128> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u128 = if int.len() > 30 {
        return None;
    } else {
        int.parse().ok()?
    };
    let mut ns = whole.checked_mul(u128::from(NANOS_PER_SEC))?;
    if let Some(f) = frac {
        if f.is_empty() || f.len() > max_frac || !f.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (head, tail) = f.split_at(f.len().min(9));
        let mut digits = head.to_owned();
        while digits.len() < 9 {
            digits.push('0');
        }
        let mut part: u128 = digits.parse().ok()?;
        if !tail.is_empty() {
            // Round half to even on the digits past the nanosecond.
            let first = tail.as_bytes()[0] - b'0';
            let rest_nonzero = tail.bytes().skip(1).any(|b| b != b'0');
            if first > 5 || (first == 5 && (rest_nonzero || part % 2 == 1)) {
                part += 1;
            }
        }
        ns += part;
    }
    Some(ns)
}

impl IntoSeconds for &str {
    fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit> {
        let ns = parse_decimal(self, 9).ok_or_else(|| seconds_message(name))?;
        check_range(ns, name)
    }
}

impl IntoSeconds for String {
    fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit> {
        self.as_str().into_nanos(name)
    }
}

impl IntoSeconds for &String {
    fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit> {
        self.as_str().into_nanos(name)
    }
}

impl IntoSeconds for f64 {
    fn into_nanos(self, name: &str) -> Result<u64, InvalidLimit> {
        if !self.is_finite() || self <= 0.0 || self > MAX_SECONDS as f64 {
            return Err(seconds_message(name));
        }
        // Rust prints an f64 as its shortest round-trip decimal, never with an exponent.
        let text = format!("{self}");
        let ns = parse_decimal(&text, usize::MAX).ok_or_else(|| seconds_message(name))?;
        check_range(ns, name)
    }
}

/// Writes nanoseconds as the module's plain decimal seconds (exact): `1500000000` → `"1.5"`.
pub fn format_seconds(ns: u64) -> String {
    let (whole, frac) = (ns / NANOS_PER_SEC, ns % NANOS_PER_SEC);
    if frac == 0 {
        return whole.to_string();
    }
    let text = format!("{whole}.{frac:09}");
    text.trim_end_matches('0').to_owned()
}

fn positive(value: u64, name: &str) -> Result<u64, InvalidLimit> {
    if value == 0 {
        return Err(InvalidLimit(format!("{name} must be a positive integer")));
    }
    Ok(value)
}

fn check_name(name: &str) -> Result<String, InvalidLimit> {
    if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(InvalidLimit::new(
            "name must be non-empty printable ASCII (it is sent in HTTP headers)",
        ));
    }
    Ok(name.to_owned())
}

/// Checks a lease token: 1 to 64 bytes.
pub(crate) fn check_token(token: &[u8]) -> Result<(), InvalidLimit> {
    if token.is_empty() || token.len() > 64 {
        return Err(InvalidLimit::new("token must be 1 to 64 bytes"));
    }
    Ok(())
}

/// A window algorithm of `RL.WINDOW`.
///
/// Parses case-insensitively from `"fixed"`, `"SLIDING"`, `"Log"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// One counter per window aligned to the Unix epoch.
    Fixed,
    /// The previous and current windows, the previous weighted (the module's default).
    #[default]
    Sliding,
    /// An exact log of the admitted requests in the trailing window.
    Log,
}

impl Algorithm {
    /// The module's keyword: `FIXED`, `SLIDING` or `LOG`.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Fixed => "FIXED",
            Algorithm::Sliding => "SLIDING",
            Algorithm::Log => "LOG",
        }
    }
}

impl FromStr for Algorithm {
    type Err = InvalidLimit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "FIXED" => Ok(Algorithm::Fixed),
            "SLIDING" => Ok(Algorithm::Sliding),
            "LOG" => Ok(Algorithm::Log),
            _ => Err(InvalidLimit(format!(
                "algorithm must be FIXED, SLIDING or LOG, not '{s}'"
            ))),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token bucket (`RL.GCRA`): `burst` requests at once, refilled at `rate` per `period`.
///
/// The emission interval `T = period / rate` (rounded to the nearest nanosecond, ≥ 1 ns) is
/// the cost of one request; an idle key admits exactly `burst` requests at once, then one
/// more every `T`.
///
/// ```
/// use std::time::Duration;
/// use redis_rl_client::Gcra;
///
/// let api = Gcra::new(20, 10, 1)?.named("api")?; // 20 at once, then 10 per second
/// assert_eq!(api.emission_interval(), Duration::from_millis(100));
/// assert_eq!(Gcra::new(0, 1, 1).unwrap_err().to_string(), "burst must be a positive integer");
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gcra {
    burst: u64,
    rate: u64,
    period_ns: u64,
    interval_ns: u64,
    name: Option<String>,
}

impl Gcra {
    /// Builds a GCRA limit, with the module's validation and messages.
    pub fn new(burst: u64, rate: u64, period: impl IntoSeconds) -> Result<Gcra, InvalidLimit> {
        let burst = positive(burst, "burst")?;
        let rate = positive(rate, "rate")?;
        let period_ns = period.into_nanos("period")?;
        let interval = (u128::from(period_ns) + u128::from(rate / 2)) / u128::from(rate);
        if interval == 0 {
            return Err(InvalidLimit::new(
                "rate is too high for period: the emission interval period/rate is below 1 ns",
            ));
        }
        if u128::from(burst) * interval > u128::from(u64::MAX) {
            return Err(InvalidLimit::new(
                "burst is too large: burst * period / rate overflows 64-bit nanoseconds",
            ));
        }
        Ok(Gcra {
            burst,
            rate,
            period_ns,
            interval_ns: interval as u64,
            name: None,
        })
    }

    /// Names the limit in the HTTP `RateLimit-Policy` and `RateLimit` fields (printable
    /// ASCII).
    pub fn named(mut self, name: &str) -> Result<Gcra, InvalidLimit> {
        self.name = Some(check_name(name)?);
        Ok(self)
    }

    /// Requests an idle key admits at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Requests per `period`.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The span `rate` requests are spread over.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// `T = period / rate`: the time one request costs.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    /// The name given with [`Gcra::named`].
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    pub(crate) fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    fn args(&self) -> Vec<String> {
        vec![
            self.burst.to_string(),
            self.rate.to_string(),
            format_seconds(self.period_ns),
        ]
    }
}

/// At most `limit` requests in any `window` (`RL.WINDOW`: FIXED, SLIDING or LOG).
///
/// ```
/// use redis_rl_client::{Algorithm, Window};
///
/// let login = Window::new(5, 300, Algorithm::Log)?;
/// let per_minute = Window::sliding(600, 60)?;
/// assert_eq!(per_minute.algorithm(), Algorithm::Sliding);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Window {
    limit: u64,
    window_ns: u64,
    algorithm: Algorithm,
    name: Option<String>,
}

impl Window {
    /// Builds a window limit, with the module's validation and messages (the server's
    /// `rl.log-max-limit` cap on LOG is checked by the server).
    pub fn new(
        limit: u64,
        window: impl IntoSeconds,
        algorithm: Algorithm,
    ) -> Result<Window, InvalidLimit> {
        Ok(Window {
            limit: positive(limit, "limit")?,
            window_ns: window.into_nanos("window")?,
            algorithm,
            name: None,
        })
    }

    /// A SLIDING window (the module's default algorithm).
    pub fn sliding(limit: u64, window: impl IntoSeconds) -> Result<Window, InvalidLimit> {
        Window::new(limit, window, Algorithm::Sliding)
    }

    /// Names the limit in the HTTP fields (printable ASCII).
    pub fn named(mut self, name: &str) -> Result<Window, InvalidLimit> {
        self.name = Some(check_name(name)?);
        Ok(self)
    }

    /// Requests allowed per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// FIXED, SLIDING or LOG.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The name given with [`Window::named`].
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    fn args(&self) -> Vec<String> {
        vec![
            self.limit.to_string(),
            format_seconds(self.window_ns),
            self.algorithm.as_str().to_owned(),
        ]
    }
}

/// A concurrency limit (`RL.LEASE`): at most `limit` slots held at once, each for `lease`.
///
/// A holder renews before `lease` runs out ([`Limiter::acquire`](crate::Limiter::acquire)'s
/// guard does it in the background); a crashed holder's slots come back when its lease ends.
///
/// ```
/// use redis_rl_client::Lease;
///
/// let reports = Lease::new(4, 30)?; // 4 at once; a crashed holder frees its slot in 30 s
/// assert_eq!(reports.limit(), 4);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    limit: u64,
    lease_ns: u64,
    name: Option<String>,
}

impl Lease {
    /// Builds a lease limit (the server's `rl.lease-max-limit` cap is checked by the server).
    pub fn new(limit: u64, lease: impl IntoSeconds) -> Result<Lease, InvalidLimit> {
        Ok(Lease {
            limit: positive(limit, "limit")?,
            lease_ns: lease.into_nanos("lease")?,
            name: None,
        })
    }

    /// Names the limit in the HTTP fields (printable ASCII).
    pub fn named(mut self, name: &str) -> Result<Lease, InvalidLimit> {
        self.name = Some(check_name(name)?);
        Ok(self)
    }

    /// Slots that may be held at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The longest a holder keeps its slots without renewing.
    pub fn lease(&self) -> Duration {
        Duration::from_nanos(self.lease_ns)
    }

    /// The name given with [`Lease::named`].
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    fn args(&self) -> Vec<String> {
        vec![self.limit.to_string(), format_seconds(self.lease_ns)]
    }
}

/// Any limit: what [`Limiter::check`](crate::Limiter::check) and the layer's rules take.
///
/// Built from a [`Gcra`], [`Window`] or [`Lease`] with `.into()`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Limit {
    /// A token bucket.
    Gcra(Gcra),
    /// A window limit.
    Window(Window),
    /// A concurrency limit.
    Lease(Lease),
}

impl From<Gcra> for Limit {
    fn from(g: Gcra) -> Limit {
        Limit::Gcra(g)
    }
}

impl From<Window> for Limit {
    fn from(w: Window) -> Limit {
        Limit::Window(w)
    }
}

impl From<Lease> for Limit {
    fn from(l: Lease) -> Limit {
        Limit::Lease(l)
    }
}

impl From<&Gcra> for Limit {
    fn from(g: &Gcra) -> Limit {
        Limit::Gcra(g.clone())
    }
}

impl From<&Window> for Limit {
    fn from(w: &Window) -> Limit {
        Limit::Window(w.clone())
    }
}

impl From<&Lease> for Limit {
    fn from(l: &Lease) -> Limit {
        Limit::Lease(l.clone())
    }
}

impl From<&Limit> for Limit {
    fn from(l: &Limit) -> Limit {
        l.clone()
    }
}

impl Limit {
    /// The most requests an idle key admits at once (burst / limit / slots).
    pub fn capacity(&self) -> u64 {
        match self {
            Limit::Gcra(g) => g.burst,
            Limit::Window(w) => w.limit,
            Limit::Lease(l) => l.limit,
        }
    }

    /// The `w` of the IETF `RateLimit-Policy` field: the span `capacity` is for. For a
    /// window, the window; for GCRA, the time an empty bucket takes to fill
    /// (`burst · period / rate`); none for a lease.
    pub fn policy_window(&self) -> Option<Duration> {
        match self {
            Limit::Gcra(g) => Some(Duration::from_nanos(g.burst * g.interval_ns)),
            Limit::Window(w) => Some(Duration::from_nanos(w.window_ns)),
            Limit::Lease(_) => None,
        }
    }

    /// The name given with `named`, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Limit::Gcra(g) => g.name(),
            Limit::Window(w) => w.name(),
            Limit::Lease(l) => l.name(),
        }
    }

    /// The command arguments after the key (module command form).
    pub fn args(&self) -> Vec<String> {
        match self {
            Limit::Gcra(g) => g.args(),
            Limit::Window(w) => w.args(),
            Limit::Lease(l) => l.args(),
        }
    }

    /// This limit as an `RL.ALL` spec (`GCRA …`, `WINDOW …`, `LEASE …` without the token).
    pub fn spec(&self) -> Vec<String> {
        let head = match self {
            Limit::Gcra(_) => "GCRA",
            Limit::Window(_) => "WINDOW",
            Limit::Lease(_) => "LEASE",
        };
        let mut out = vec![head.to_owned()];
        out.extend(self.args());
        out
    }

    /// Writes a text that identifies this limit (kind, parameters, name) to `out`.
    pub(crate) fn write_ident(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            Limit::Gcra(g) => write!(out, "G{} {} {}", g.burst, g.rate, g.period_ns),
            Limit::Window(w) => write!(out, "W{} {} {}", w.limit, w.window_ns, w.algorithm),
            Limit::Lease(l) => write!(out, "E{} {}", l.limit, l.lease_ns),
        };
        if let Some(n) = self.name() {
            out.push('\0');
            out.push_str(n);
        }
    }

    /// Whether batching may take units of this limit ahead (GCRA, FIXED and SLIDING: LOG
    /// refunds the newest entries, not ours, and leases are not counted requests).
    pub(crate) fn batchable(&self) -> bool {
        match self {
            Limit::Gcra(_) => true,
            Limit::Window(w) => w.algorithm != Algorithm::Log,
            Limit::Lease(_) => false,
        }
    }
}

/// The algorithm [`parse_limits_with`] gives each limit of a string.
///
/// A window algorithm ([`Algorithm`] converts into this), or GCRA: `"10/minute"` as GCRA is
/// `Gcra::new(10, 10, 60)` (10 at once, refilled at 10 per minute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LimitAlgorithm {
    /// `Window::new(count, window, Algorithm::Sliding)` (the module's default window).
    #[default]
    Sliding,
    /// `Window::new(count, window, Algorithm::Fixed)`.
    Fixed,
    /// `Window::new(count, window, Algorithm::Log)`.
    Log,
    /// `Gcra::new(count, count, window)`.
    Gcra,
}

impl From<Algorithm> for LimitAlgorithm {
    fn from(a: Algorithm) -> LimitAlgorithm {
        match a {
            Algorithm::Fixed => LimitAlgorithm::Fixed,
            Algorithm::Sliding => LimitAlgorithm::Sliding,
            Algorithm::Log => LimitAlgorithm::Log,
        }
    }
}

/// Seconds of a unit word of the limit grammar, or `None`.
fn unit_seconds(word: &str) -> Option<u64> {
    Some(match word {
        "s" | "sec" | "second" | "seconds" => 1,
        "m" | "min" | "minute" | "minutes" => 60,
        "h" | "hr" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86_400,
        _ => return None,
    })
}

fn bad_part(part: &str, why: impl fmt::Display) -> InvalidLimit {
    InvalidLimit(format!("limit '{part}': {why}"))
}

/// Splits the leading ASCII digits off `text`.
fn leading_digits(text: &str) -> (&str, &str) {
    let end = text.bytes().take_while(u8::is_ascii_digit).count();
    text.split_at(end)
}

fn parse_one(part: &str, algorithm: LimitAlgorithm) -> Result<Limit, InvalidLimit> {
    let lower = part.to_ascii_lowercase();
    let (count, rest) = leading_digits(lower.trim());
    if count.is_empty() {
        return Err(bad_part(
            part,
            "expected '<count>/<unit>' or '<count> per <unit>', starting with the count",
        ));
    }
    let count: u64 = count
        .parse()
        .map_err(|_| bad_part(part, "the count does not fit in 64 bits"))?;
    let rest = rest.trim_start();
    let rest = if let Some(r) = rest.strip_prefix('/') {
        r
    } else if let Some(r) = rest.strip_prefix("per") {
        r
    } else {
        return Err(bad_part(
            part,
            "expected '/' or 'per' after the count, as in '10/minute' or '10 per minute'",
        ));
    };
    let (multiplier, unit) = leading_digits(rest.trim_start());
    let multiplier: u64 = if multiplier.is_empty() {
        1
    } else {
        match multiplier.parse() {
            Ok(0) | Err(_) => {
                return Err(bad_part(
                    part,
                    "the number of units must be a positive integer",
                ))
            }
            Ok(n) => n,
        }
    };
    let unit = unit.trim();
    let Some(seconds) = unit_seconds(unit) else {
        return Err(bad_part(
            part,
            format!(
                "unknown unit '{unit}' (s, sec, second(s), m, min, minute(s), h, hr, hour(s), \
                 d, day(s))"
            ),
        ));
    };
    let window = multiplier
        .checked_mul(seconds)
        .filter(|w| *w <= MAX_SECONDS)
        .ok_or_else(|| bad_part(part, format!("the window must be at most {MAX_SECONDS} s")))?;
    let built = match algorithm {
        LimitAlgorithm::Sliding => Window::new(count, window, Algorithm::Sliding).map(Limit::from),
        LimitAlgorithm::Fixed => Window::new(count, window, Algorithm::Fixed).map(Limit::from),
        LimitAlgorithm::Log => Window::new(count, window, Algorithm::Log).map(Limit::from),
        LimitAlgorithm::Gcra => Gcra::new(count, count, window).map(Limit::from),
    };
    built.map_err(|e| bad_part(part, e))
}

/// Parses limits written as users write them: `"10/minute"`, `"100 per hour"`, `"5/10s"`,
/// `"5 per 10 seconds"`, several joined by `;` or `,` (`"20/minute; 200 per hour"`).
///
/// Grammar, case-insensitive, spaces optional around the separators:
/// `<count> ("/" | "per") [<multiplier>] <unit>`, units `s`, `sec`, `second(s)`, `m`, `min`,
/// `minute(s)`, `h`, `hr`, `hour(s)`, `d`, `day(s)`. Each part is a SLIDING
/// [`Window`]`(count, multiplier × unit)` (the module's default window; see
/// [`parse_limits_with`] for another algorithm), in the order written.
///
/// Errors: [`InvalidLimit`] naming the bad part (`limit '10/fortnight': unknown unit …`): a
/// count or multiplier that is not a positive integer, an unknown unit, a window over
/// [`MAX_SECONDS`], an empty part.
///
/// ```
/// use redis_rl_client::{parse_limits, Algorithm, Window};
///
/// let limits = parse_limits("100 per hour; 1000/day")?;
/// assert_eq!(limits, [Window::new(100, 3600, Algorithm::Sliding)?.into(),
///                     Window::new(1000, 86_400, Algorithm::Sliding)?.into()]);
/// assert_eq!(parse_limits("5/10s")?, [Window::sliding(5, 10)?.into()]);
/// let e = parse_limits("10/minute; 3/fortnight").unwrap_err();
/// assert!(e.message().starts_with("limit '3/fortnight': unknown unit 'fortnight'"), "{e}");
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
pub fn parse_limits(text: &str) -> Result<Vec<Limit>, InvalidLimit> {
    parse_limits_with(text, LimitAlgorithm::Sliding)
}

/// [`parse_limits`] with another algorithm for every limit: FIXED, LOG or GCRA
/// (`GCRA(count, count, window)`).
///
/// ```
/// use redis_rl_client::{parse_limits_with, Algorithm, Gcra, LimitAlgorithm, Window};
///
/// assert_eq!(parse_limits_with("10/minute", LimitAlgorithm::Gcra)?, [Gcra::new(10, 10, 60)?.into()]);
/// assert_eq!(parse_limits_with("5 per 300 s", Algorithm::Log)?,
///            [Window::new(5, 300, Algorithm::Log)?.into()]);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
pub fn parse_limits_with(
    text: &str,
    algorithm: impl Into<LimitAlgorithm>,
) -> Result<Vec<Limit>, InvalidLimit> {
    let algorithm = algorithm.into();
    if text.trim().is_empty() {
        return Err(InvalidLimit(format!("no limit in '{text}'")));
    }
    text.split([';', ','])
        .map(|part| {
            let part = part.trim();
            if part.is_empty() {
                return Err(InvalidLimit(format!(
                    "empty limit in '{text}' (limits are separated by ';' or ',')"
                )));
            }
            parse_one(part, algorithm)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_exact() {
        let cases: Vec<(u64, &str)> = vec![
            (Gcra::new(1, 1, 60).unwrap().period_ns, "60"),
            (Gcra::new(1, 1, "0.25").unwrap().period_ns, "0.25"),
            (Gcra::new(1, 1, 0.1).unwrap().period_ns, "0.1"),
            (
                Gcra::new(1, 1, Duration::from_millis(1500))
                    .unwrap()
                    .period_ns,
                "1.5",
            ),
            (
                Gcra::new(1, 1, "0.000000001").unwrap().period_ns,
                "0.000000001",
            ),
            (Gcra::new(1, 1, "315360000").unwrap().period_ns, "315360000"),
            (Gcra::new(1, 1, "007").unwrap().period_ns, "7"),
        ];
        for (ns, wire) in cases {
            assert_eq!(format_seconds(ns), wire);
        }
    }

    #[test]
    fn float_rounds_half_even_at_the_nanosecond() {
        assert_eq!(
            0.000_000_000_5f64.into_nanos("p"),
            Err(seconds_message("p"))
        );
        assert_eq!(0.000_000_001_5f64.into_nanos("p").unwrap(), 2);
        assert_eq!(0.000_000_002_5f64.into_nanos("p").unwrap(), 2);
        assert_eq!(1e-7f64.into_nanos("p").unwrap(), 100);
    }

    #[test]
    fn limit_strings() {
        let w = |n, s| Limit::from(Window::sliding(n, s).unwrap());
        for (text, want) in [
            ("10/minute", vec![w(10, 60)]),
            ("10 / Minute", vec![w(10, 60)]),
            ("100 per hour", vec![w(100, 3600)]),
            ("100PER HOUR", vec![w(100, 3600)]),
            ("5/10s", vec![w(5, 10)]),
            ("5 per 10 seconds", vec![w(5, 10)]),
            ("1/d", vec![w(1, 86_400)]),
            ("3/2hr", vec![w(3, 7200)]),
            ("20/minute; 200 per hour", vec![w(20, 60), w(200, 3600)]),
            ("20/m,200/h", vec![w(20, 60), w(200, 3600)]),
            ("7/sec", vec![w(7, 1)]),
            ("7/mins", vec![]),
        ] {
            match parse_limits(text) {
                Ok(got) => assert_eq!(got, want, "{text}"),
                Err(e) => assert!(want.is_empty(), "{text}: {e}"),
            }
        }
        for (text, starts) in [
            ("", "no limit in ''"),
            ("10/minute;", "empty limit in '10/minute;'"),
            (
                "0/minute",
                "limit '0/minute': limit must be a positive integer",
            ),
            (
                "ten/minute",
                "limit 'ten/minute': expected '<count>/<unit>'",
            ),
            ("10 minute", "limit '10 minute': expected '/' or 'per'"),
            ("10/0s", "limit '10/0s': the number of units must be"),
            (
                "10/fortnight",
                "limit '10/fortnight': unknown unit 'fortnight'",
            ),
            (
                "1/3651d",
                "limit '1/3651d': the window must be at most 315360000 s",
            ),
            ("-1/s", "limit '-1/s': expected"),
            (
                "99999999999999999999/s",
                "limit '99999999999999999999/s': the count does not",
            ),
        ] {
            let e = parse_limits(text).unwrap_err();
            assert!(e.message().starts_with(starts), "{text}: {e}");
        }
        assert_eq!(
            parse_limits_with("4/s", LimitAlgorithm::Fixed).unwrap(),
            [Limit::from(Window::new(4, 1, Algorithm::Fixed).unwrap())]
        );
    }

    #[test]
    fn format_round_trips() {
        for ns in [1, 10, 999_999_999, 1_000_000_000, 1_500_000_000, MAX_NS] {
            assert_eq!(format_seconds(ns).as_str().into_nanos("p").unwrap(), ns);
        }
    }
}
