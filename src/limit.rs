//! One limit (an algorithm and its validated parameters), the request a call makes of it, and
//! the one dispatch from a limit to its algorithm: [`Limit::decide`].
//!
//! Also the parser of the spec words RL.ALL takes (`GCRA burst rate period`, `WINDOW limit
//! window [FIXED|SLIDING|LOG]`), so every user of the core (the module, `rl-replay`) reads
//! limits the same way.

use std::fmt;

use crate::algo::gcra::{self, GcraRequest};
use crate::algo::lease::{self, LeaseParams, Token};
use crate::algo::{fixed_window, sliding_log, sliding_window};
use crate::decision::{Outcome, Overflow};
use crate::params::{self, GcraParams, ParamError, WindowParams};
use crate::state::{Algorithm, StateRef, Write};
use crate::time::{Instant, Span};

/// Limit is one validated limit: which algorithm, with which parameters.
///
/// A LEASE limit keeps its holder's token on the heap, so that the other limits (those on
/// every hot path) are small values to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// GCRA: `burst` at once, then one request per emission interval.
    Gcra(GcraParams),
    /// FIXED window counter.
    Fixed(WindowParams),
    /// SLIDING window counter.
    Sliding(WindowParams),
    /// Exact sliding LOG.
    Log(WindowParams),
    /// Concurrency leases, for the holder `Token`.
    Lease(LeaseParams, Box<Token>),
}

/// WindowKind is the algorithm keyword of RL.WINDOW and of `WINDOW` specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// `FIXED`
    Fixed,
    /// `SLIDING` (the default)
    Sliding,
    /// `LOG`
    Log,
}

impl WindowKind {
    /// Parses `FIXED` / `SLIDING` / `LOG`, case-insensitively.
    pub fn parse(word: &[u8]) -> Option<Self> {
        if word.eq_ignore_ascii_case(b"FIXED") {
            Some(Self::Fixed)
        } else if word.eq_ignore_ascii_case(b"SLIDING") {
            Some(Self::Sliding)
        } else if word.eq_ignore_ascii_case(b"LOG") {
            Some(Self::Log)
        } else {
            None
        }
    }

    /// The limit of this kind with `params`.
    pub fn with(self, params: WindowParams) -> Limit {
        match self {
            Self::Fixed => Limit::Fixed(params),
            Self::Sliding => Limit::Sliding(params),
            Self::Log => Limit::Log(params),
        }
    }
}

/// Request is what one call asks of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Requests to admit together (`QUANTITY`, default 1, or a spec's `COST`); 0 only
    /// reports.
    pub quantity: u64,
    /// `MAXWAIT` (GCRA only): a denial that clears within it becomes a reservation.
    pub max_wait: Option<Span>,
    /// `FORCE`: record usage that has already happened, past the limit if need be (GCRA,
    /// FIXED, SLIDING only).
    pub force: bool,
    /// `RENEW` (LEASE only; the other algorithms ignore it): renew the token's live lease,
    /// never take a new one.
    pub renew: bool,
}

impl Request {
    /// A plain request of `quantity`.
    pub fn of(quantity: u64) -> Self {
        Self {
            quantity,
            max_wait: None,
            force: false,
            renew: false,
        }
    }
}

/// LimitError is why a limit cannot decide on a stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitError {
    /// The key holds another algorithm.
    WrongAlgorithm {
        /// What the key holds.
        held: Algorithm,
        /// What the call asked for.
        asked: Algorithm,
    },
    /// The request's time arithmetic would leave 64-bit nanoseconds.
    Overflow(Overflow),
    /// `FORCE` on an algorithm that cannot record usage past its limit (LOG, LEASE).
    CannotForce(Algorithm),
    /// `RENEW` on a LEASE limit whose token holds no live lease.
    LeaseLost,
}

impl From<Overflow> for LimitError {
    fn from(e: Overflow) -> Self {
        Self::Overflow(e)
    }
}

impl From<lease::LeaseError> for LimitError {
    fn from(e: lease::LeaseError) -> Self {
        match e {
            lease::LeaseError::Overflow(o) => Self::Overflow(o),
            lease::LeaseError::Lost => Self::LeaseLost,
        }
    }
}

impl Limit {
    /// The algorithm this limit uses.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Self::Gcra(_) => Algorithm::Gcra,
            Self::Fixed(_) => Algorithm::Fixed,
            Self::Sliding(_) => Algorithm::Sliding,
            Self::Log(_) => Algorithm::Log,
            Self::Lease(..) => Algorithm::Lease,
        }
    }

    /// The limit's size: the burst, the window's limit, or the slots.
    pub fn size(&self) -> u64 {
        match self {
            Self::Gcra(p) => p.burst,
            Self::Fixed(p) | Self::Sliding(p) | Self::Log(p) => p.limit,
            Self::Lease(p, _) => p.limit,
        }
    }

    /// Whether `FORCE` can record usage on this limit (GCRA, FIXED, SLIDING).
    pub fn can_force(&self) -> bool {
        matches!(self, Self::Gcra(_) | Self::Fixed(_) | Self::Sliding(_))
    }

    /// Decides `request` at `now` against the key's `stored` value (None: missing key). Pure:
    /// the returned write is the caller's to store (None for denials, peeks of nothing,
    /// `QUANTITY 0` and requests that can never pass).
    ///
    /// Errors: [`LimitError::WrongAlgorithm`] when the key holds another algorithm;
    /// [`LimitError::Overflow`] when the arithmetic would leave 64-bit nanoseconds;
    /// [`LimitError::LeaseLost`] for a `RENEW` whose token holds no live lease.
    #[inline(always)]
    pub fn decide(
        &self,
        stored: Option<StateRef<'_>>,
        now: Instant,
        request: Request,
    ) -> Result<Outcome<Write>, LimitError> {
        let wrong = |held: StateRef<'_>| LimitError::WrongAlgorithm {
            held: held.algorithm(),
            asked: self.algorithm(),
        };
        let n = request.quantity;
        if request.force && !self.can_force() {
            return Err(LimitError::CannotForce(self.algorithm()));
        }
        Ok(match (self, stored) {
            (Self::Gcra(p), None | Some(StateRef::Gcra(_))) => {
                let stored = match stored {
                    Some(StateRef::Gcra(g)) => Some(g),
                    _ => None,
                };
                let outcome = if request.force {
                    gcra::force(p, stored.as_ref(), now, n)?
                } else {
                    let request = GcraRequest {
                        quantity: n,
                        max_wait: request.max_wait,
                    };
                    gcra::decide(p, stored.as_ref(), now, request)?
                };
                outcome.map_write(Write::Gcra)
            }
            (Self::Fixed(p), None | Some(StateRef::Fixed(_))) => {
                let stored = match stored {
                    Some(StateRef::Fixed(s)) => Some(s),
                    _ => None,
                };
                let outcome = if request.force {
                    fixed_window::force(p, stored, now, n)?
                } else {
                    fixed_window::decide(p, stored, now, n)?
                };
                outcome.map_write(Write::Fixed)
            }
            (Self::Sliding(p), None | Some(StateRef::Sliding(_))) => {
                let stored = match stored {
                    Some(StateRef::Sliding(s)) => Some(s),
                    _ => None,
                };
                let outcome = if request.force {
                    sliding_window::force(p, stored, now, n)?
                } else {
                    sliding_window::decide(p, stored, now, n)?
                };
                outcome.map_write(Write::Sliding)
            }
            (Self::Lease(p, token), None | Some(StateRef::Lease(_))) => {
                let stored = match stored {
                    Some(StateRef::Lease(s)) => Some(s),
                    _ => None,
                };
                let outcome = if request.renew {
                    lease::renew(p, stored, now, token, n)?
                } else {
                    lease::decide(p, stored, now, token, n)?
                };
                outcome.map_write(|w| Write::Lease(Box::new(w)))
            }
            (Self::Log(p), None) => sliding_log::decide(p, None, now, n)?.map_write(Write::Log),
            (Self::Log(p), Some(StateRef::Log(s))) => {
                sliding_log::decide(p, Some(s), now, n)?.map_write(Write::Log)
            }
            (_, Some(held)) => return Err(wrong(held)),
        })
    }
}

impl<S> Outcome<S> {
    /// Maps the write, keeping the decision.
    pub fn map_write<T>(self, f: impl FnOnce(S) -> T) -> Outcome<T> {
        Outcome {
            decision: self.decision,
            write: self.write.map(f),
        }
    }
}

/// SpecError says why RL.ALL's spec words do not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecError {
    /// A bad argument value; names the argument.
    Param(ParamError),
    /// A spec ended early; names what is missing (`GCRA period`).
    Missing(&'static str),
    /// A word where `GCRA` or `WINDOW` was expected.
    UnknownKind {
        /// 1-based index of the key whose spec this is.
        index: usize,
        /// Number of keys.
        of: usize,
        /// The word found (lossy UTF-8, at most 64 characters).
        found: String,
    },
}

impl From<ParamError> for SpecError {
    fn from(e: ParamError) -> Self {
        Self::Param(e)
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Param(e) => e.fmt(f),
            Self::Missing(what) => write!(f, "syntax error: spec is missing its {what}"),
            Self::UnknownKind { index, of, found } => write!(
                f,
                "syntax error: expected GCRA or WINDOW or LEASE for key {index} of {of}, got \
                 '{found}'"
            ),
        }
    }
}

impl std::error::Error for SpecError {}

/// Client bytes as they appear in an error: lossy UTF-8, at most 64 characters.
pub fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).chars().take(64).collect()
}

/// Spec is one limit of RL.ALL and what it is charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The limit.
    pub limit: Limit,
    /// `COST n`: charge this limit `n` instead of the request's `QUANTITY`.
    pub cost: Option<u64>,
}

/// Parses one spec from `words`: `GCRA burst rate period`, `WINDOW limit window
/// [FIXED|SLIDING|LOG]` (SLIDING by default) or `LEASE limit lease token`, each optionally
/// followed by `COST n`; keywords case-insensitive. `index` and `of` (the 1-based key number
/// and the number of keys) only shape the error text.
///
/// Errors: [`SpecError`], naming the bad or missing argument.
pub fn parse_spec<'a, I>(words: &mut I, index: usize, of: usize) -> Result<Spec, SpecError>
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    let mut next = |what: &'static str| words.next().ok_or(SpecError::Missing(what));
    let kind = next("kind")?;
    let limit = if kind.eq_ignore_ascii_case(b"GCRA") {
        let burst = params::positive(next("GCRA burst")?, "burst")?;
        let rate = params::positive(next("GCRA rate")?, "rate")?;
        let period = params::seconds(next("GCRA period")?, "period")?;
        Limit::Gcra(GcraParams::new(burst, rate, period)?)
    } else if kind.eq_ignore_ascii_case(b"WINDOW") {
        let limit = params::positive(next("WINDOW limit")?, "limit")?;
        let window = params::seconds(next("WINDOW window")?, "window")?;
        let params = WindowParams::new(limit, window)?;
        let kind = match words.clone().next().and_then(WindowKind::parse) {
            Some(kind) => {
                words.next();
                kind
            }
            None => WindowKind::Sliding,
        };
        kind.with(params)
    } else if kind.eq_ignore_ascii_case(b"LEASE") {
        let limit = next("LEASE limit")?;
        let lease = next("LEASE lease")?;
        let params = LeaseParams::parse(limit, lease)?;
        Limit::Lease(params, Box::new(params::token(next("LEASE token")?)?))
    } else {
        return Err(SpecError::UnknownKind {
            index,
            of,
            found: shown(kind),
        });
    };
    let cost = match words.clone().next() {
        Some(w) if w.eq_ignore_ascii_case(b"COST") => {
            words.next();
            let value = words.next().ok_or(SpecError::Missing("COST value"))?;
            Some(params::non_negative(value, "COST")?)
        }
        _ => None,
    };
    Ok(Spec { limit, cost })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{at, span, BASE, S};

    fn spec(words: &[&str]) -> Result<Limit, SpecError> {
        let mut it = words.iter().map(|w| w.as_bytes());
        parse_spec(&mut it, 1, 1).map(|s| s.limit)
    }

    #[test]
    fn specs_parse_like_the_commands() {
        assert_eq!(
            spec(&["gcra", "10", "5", "1"]),
            Ok(Limit::Gcra(GcraParams::new(10, 5, span(S)).unwrap()))
        );
        assert_eq!(
            spec(&["WINDOW", "3", "60", "log"]),
            Ok(Limit::Log(WindowParams::new(3, span(60 * S)).unwrap()))
        );
        assert_eq!(
            spec(&["WINDOW", "3", "60"]).map(|l| l.algorithm()),
            Ok(Algorithm::Sliding)
        );
        assert_eq!(
            spec(&["GCRA", "10", "5"]).unwrap_err().to_string(),
            "syntax error: spec is missing its GCRA period"
        );
        assert_eq!(
            spec(&["TOKEN"]).unwrap_err().to_string(),
            "syntax error: expected GCRA or WINDOW or LEASE for key 1 of 1, got 'TOKEN'"
        );
        assert_eq!(
            spec(&["LEASE", "3", "30", "job-7"]),
            Ok(Limit::Lease(
                LeaseParams {
                    limit: 3,
                    lease: span(30 * S)
                },
                Box::new(Token::new(b"job-7").unwrap())
            ))
        );
        assert_eq!(
            spec(&["LEASE", "3", "30", ""]).unwrap_err().to_string(),
            "token must be 1 to 64 bytes"
        );
        let mut it = ["WINDOW", "90000", "60", "cost", "1200", "GCRA"]
            .iter()
            .map(|w| w.as_bytes());
        let s = parse_spec(&mut it, 1, 1).unwrap();
        assert_eq!(s.cost, Some(1200));
        assert_eq!(it.next(), Some(&b"GCRA"[..]));
        let mut it = ["WINDOW", "9", "60", "COST"].iter().map(|w| w.as_bytes());
        assert_eq!(
            parse_spec(&mut it, 1, 1).unwrap_err().to_string(),
            "syntax error: spec is missing its COST value"
        );
        assert_eq!(
            spec(&["WINDOW", "0", "60"]).unwrap_err().to_string(),
            "limit must be a positive integer"
        );
    }

    #[test]
    fn a_key_of_another_algorithm_is_an_error_not_a_reset() {
        let params = WindowParams::parse(b"5", b"10").unwrap();
        let (fixed, sliding) = (Limit::Fixed(params), Limit::Sliding(params));
        let out = fixed.decide(None, BASE, Request::of(1)).unwrap();
        let Some(Write::Fixed(state)) = out.write else {
            panic!("expected a FIXED write")
        };
        assert_eq!(
            sliding.decide(Some(StateRef::Fixed(&state)), at(S), Request::of(1)),
            Err(LimitError::WrongAlgorithm {
                held: Algorithm::Fixed,
                asked: Algorithm::Sliding
            })
        );
    }
}
