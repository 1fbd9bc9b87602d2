//! engine is the only file that calls the module's pure core (`redis_rl`). Everything the
//! replay decides goes through the small interface below, so that a change of the core's API
//! changes this file alone.
//!
//! The interface:
//! * [`Limit::parse`] reads one spec in RL.ALL's grammar (`GCRA burst rate period`,
//!   `WINDOW limit window [FIXED|SLIDING|LOG]`) with the module's own parser
//!   ([`redis_rl::limit::parse_spec`]), argument rules and error texts;
//! * a [`Table`] holds one limit's per-key states (keys are dense `u32` ids);
//! * [`decide_all`] decides one request at an instant on one key of each applicable limit and
//!   commits it the way RL.ALL does: every limit evaluates (reads only); allowed only if every
//!   limit allows; then every limit writes, else none does;
//! * [`Decision`] is what the module would reply for it ([`Decision::reply`] gives the five
//!   integers).
//!
//! The decisions are the module's: [`redis_rl::limit::Limit::decide`] on the stored state,
//! then [`redis_rl::state::State::apply`] of its write, exactly what the module's glue does
//! around the same calls (`src/module/limits.rs`), minus Redis.

use std::fmt;

use redis_rl::decision::{self, Verdict};
use redis_rl::limit::{self, parse_spec, Request, SpecError as CoreSpecError, WindowKind};
use redis_rl::params::{GcraParams, ParamError, WindowParams};
use redis_rl::state::{State, Write};
use redis_rl::time::{Instant, Span, NANOS_PER_SEC};

/// The module's default `rl.log-max-limit`: the largest `limit` a LOG window accepts.
pub const LOG_MAX_LIMIT_DEFAULT: u64 = 100_000;

/// Limit is one validated spec, with the `rate` and `period` it was written with (GCRA's
/// parameters keep only the emission interval).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    core: limit::Limit,
    rate: u64,
    period_ns: u64,
}

/// SpecError is a spec the module would refuse; its text is the module's error without `ERR `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl From<ParamError> for SpecError {
    fn from(e: ParamError) -> Self {
        Self(e.to_string())
    }
}

impl From<CoreSpecError> for SpecError {
    fn from(e: CoreSpecError) -> Self {
        // The core's syntax errors carry the server's "syntax error: " prefix.
        let text = e.to_string();
        Self(
            text.strip_prefix("syntax error: ")
                .map(str::to_owned)
                .unwrap_or(text),
        )
    }
}

impl Limit {
    /// Parses one spec at the start of `words` (RL.ALL's grammar and checks: keywords
    /// case-insensitive, counts and seconds as the module reads them, LOG's `limit` at most
    /// `log_max_limit`). Returns the limit and how many words it took.
    pub fn parse(words: &[&str], log_max_limit: u64) -> Result<(Self, usize), SpecError> {
        let kind = words
            .first()
            .ok_or_else(|| SpecError("spec is missing its kind (GCRA or WINDOW)".into()))?;
        if !kind.eq_ignore_ascii_case("GCRA") && !kind.eq_ignore_ascii_case("WINDOW") {
            return Err(SpecError(format!("expected GCRA or WINDOW, got '{kind}'")));
        }
        let mut it = words.iter().map(|w| w.as_bytes());
        let spec = parse_spec(&mut it, 1, 1)?;
        if spec.cost.is_some() {
            // The module's RL.ALL accepts `COST n`; a replayed log line is one request,
            // charged 1 by every limit that applies to it.
            return Err(SpecError(
                "COST is not supported by rl-replay: each log line is one request, charged 1 \
                 by every limit"
                    .into(),
            ));
        }
        let used = words.len() - it.count();
        // GCRA's rate and period, as written (the core keeps only their ratio).
        let (rate, period_ns) = match spec.limit {
            limit::Limit::Gcra(_) => {
                let rate = redis_rl::params::positive(words[2].as_bytes(), "rate")?;
                let period = redis_rl::params::seconds(words[3].as_bytes(), "period")?;
                (rate, period.as_ns())
            }
            limit::Limit::Fixed(p) | limit::Limit::Sliding(p) | limit::Limit::Log(p) => {
                (p.limit, p.window.as_ns())
            }
            limit::Limit::Lease(..) => unreachable!("only GCRA and WINDOW specs reach here"),
        };
        let limit = Self {
            core: spec.limit,
            rate,
            period_ns,
        };
        limit.check_log_cap(log_max_limit)?;
        Ok((limit, used))
    }

    fn check_log_cap(&self, log_max_limit: u64) -> Result<(), SpecError> {
        match self.core {
            limit::Limit::Log(p) if p.limit > log_max_limit => Err(SpecError(format!(
                // The module's text.
                "limit {} is above rl.log-max-limit ({log_max_limit}) for LOG, which stores \
                 every request: use SLIDING for large limits, or raise rl.log-max-limit",
                p.limit
            ))),
            _ => Ok(()),
        }
    }

    /// The most requests an idle key admits at once (`burst` / `limit`).
    pub fn capacity(&self) -> u64 {
        self.core.size()
    }

    /// The sustained allowance: `rate` requests per `period` (GCRA) or `limit` per `window`.
    pub fn per_period(&self) -> u64 {
        self.rate
    }

    /// The limit's period (GCRA) or window, in ns.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// Whether this is a GCRA limit.
    pub fn is_gcra(&self) -> bool {
        matches!(self.core, limit::Limit::Gcra(_))
    }

    /// The same limit with other counts: `burst` and `rate` for GCRA; for a window, `burst`
    /// is the new `limit` and `rate` is ignored. Errors as the module's would.
    pub fn resized(&self, burst: u64, rate: u64, log_max_limit: u64) -> Result<Self, SpecError> {
        let window = |kind: WindowKind| -> Result<Self, SpecError> {
            let params = WindowParams::new(burst, Span::from_ns(self.period_ns))?;
            Ok(Self {
                core: kind.with(params),
                rate: burst,
                period_ns: self.period_ns,
            })
        };
        let resized = match self.core {
            limit::Limit::Gcra(_) => Self {
                core: limit::Limit::Gcra(GcraParams::new(
                    burst,
                    rate,
                    Span::from_ns(self.period_ns),
                )?),
                rate,
                period_ns: self.period_ns,
            },
            limit::Limit::Fixed(_) => window(WindowKind::Fixed)?,
            limit::Limit::Sliding(_) => window(WindowKind::Sliding)?,
            limit::Limit::Log(_) => window(WindowKind::Log)?,
            limit::Limit::Lease(..) => self.clone(),
        };
        resized.check_log_cap(log_max_limit)?;
        Ok(resized)
    }
}

/// Writes seconds in nanoseconds as the module's decimal grammar (`1`, `0.25`).
fn seconds_text(ns: u64) -> String {
    let (s, frac) = (ns / NANOS_PER_SEC, ns % NANOS_PER_SEC);
    if frac == 0 {
        return s.to_string();
    }
    let digits = format!("{frac:09}");
    format!("{s}.{}", digits.trim_end_matches('0'))
}

impl fmt::Display for Limit {
    /// Writes the spec in the module's grammar (e.g. `GCRA 20 10 1`, `WINDOW 100 60 LOG`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = seconds_text(self.period_ns);
        match self.core {
            limit::Limit::Gcra(p) => write!(f, "GCRA {} {} {period}", p.burst, self.rate),
            limit::Limit::Fixed(p) => write!(f, "WINDOW {} {period} FIXED", p.limit),
            limit::Limit::Sliding(p) => write!(f, "WINDOW {} {period} SLIDING", p.limit),
            limit::Limit::Log(p) => write!(f, "WINDOW {} {period} LOG", p.limit),
            limit::Limit::Lease(p, _) => write!(f, "LEASE {} {period}", p.limit),
        }
    }
}

/// Decision is what the module replies for one limit or for the whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision(decision::Decision);

impl Decision {
    /// Allowed (1 in the reply) or not.
    pub fn allowed(&self) -> bool {
        self.0.verdict.is_allowed()
    }

    /// `remaining` in the reply.
    pub fn remaining(&self) -> u64 {
        self.0.remaining
    }

    /// Nanoseconds until this same request would pass; None when allowed or never.
    pub fn retry_after_ns(&self) -> Option<u64> {
        match self.0.verdict {
            Verdict::Denied { retry_after } => Some(retry_after.as_ns()),
            _ => None,
        }
    }

    /// The module's five-integer reply: allowed, limit, remaining, retry_after_ms (≥ 1 when
    /// denied, -1 when allowed or never), reset_after_ms (both rounded up).
    pub fn reply(&self) -> [i64; 5] {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let retry = match self.0.verdict {
            Verdict::Denied { retry_after } => int(retry_after.ceil_ms().max(1)),
            Verdict::Reserved { delay } => int(delay.ceil_ms()),
            Verdict::Allowed | Verdict::Never => -1,
        };
        [
            i64::from(self.allowed()),
            int(self.0.limit),
            int(self.0.remaining),
            retry,
            int(self.0.reset_after.ceil_ms()),
        ]
    }
}

/// Table holds one limit's state for every key it has seen, by dense key id. A key that
/// never wrote holds nothing (the module's missing key); states are kept after they go idle,
/// which decides exactly as a key the server expired (the module expires a key exactly when
/// its state becomes indistinguishable from a missing one).
pub struct Table {
    states: Vec<Option<State>>,
}

impl Table {
    /// An empty table for `limit`.
    pub fn new(_limit: &Limit) -> Self {
        Self { states: Vec::new() }
    }

    /// Makes a decided write (what the module stores for it).
    fn commit(&mut self, key: u32, write: &Write) {
        let i = key as usize;
        if self.states.len() <= i {
            self.states.resize_with(i + 1, || None);
        }
        let slot = &mut self.states[i];
        match slot {
            Some(state) => {
                state.apply(write);
                if state.is_emptied() {
                    *slot = None;
                }
            }
            None => *slot = State::from_write(write),
        }
    }
}

/// Outcome of one request over all its limits, in the shape of RL.ALL's reply.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The combined decision (None: no limit applied, or the module would answer an error).
    pub combined: Option<Decision>,
    /// Each applicable limit's own decision, in limit order (None where the limit does not
    /// apply to this request); when the request is denied, each is what that limit alone
    /// answers without consuming.
    pub each: Vec<Option<Decision>>,
    /// The request's arithmetic overflowed: the module answers an error, nothing is written.
    pub overflow: bool,
    scratch: Vec<(decision::Decision, u64)>,
    writes: Vec<(usize, Write)>,
}

/// Decides one request of `quantity` at `now_ns` on `keys[i]` of each limit `i` (None: that
/// limit does not apply), all-or-nothing like RL.ALL: allowed only if every applicable limit
/// allows; then every one of them records it, otherwise none does. `tables[i]` must have been
/// built for `limits[i]`. The result is left in `out` (its buffers are reused).
pub fn decide_all(
    limits: &[Limit],
    tables: &mut [Table],
    keys: &[Option<u32>],
    now_ns: u64,
    quantity: u64,
    out: &mut Outcome,
) {
    out.each.clear();
    out.scratch.clear();
    out.writes.clear();
    out.combined = None;
    out.overflow = false;
    let now = Instant::from_ns(now_ns);
    for (i, ((limit, table), key)) in limits.iter().zip(tables.iter()).zip(keys).enumerate() {
        let Some(key) = *key else {
            out.each.push(None);
            continue;
        };
        let stored = table.states.get(key as usize).and_then(Option::as_ref);
        match limit
            .core
            .decide(stored.map(State::as_ref), now, Request::of(quantity))
        {
            Ok(o) => {
                out.each.push(Some(Decision(o.decision)));
                out.scratch.push((o.decision, quantity));
                if let Some(w) = o.write {
                    out.writes.push((i, w));
                }
            }
            Err(_) => {
                // The module replies an error for the whole call and writes nothing (an
                // overflow: a table only ever holds its own limit's algorithm).
                out.overflow = true;
                out.each.push(None);
            }
        }
    }
    if out.overflow || out.scratch.is_empty() {
        return;
    }
    let combined = decision::combine(&out.scratch);
    out.combined = Some(Decision(combined));
    if combined.verdict.is_allowed() {
        for (i, write) in out.writes.drain(..) {
            if let Some(key) = keys[i] {
                tables[i].commit(key, &write);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;
    const T0: u64 = 1_764_000_000 * S;

    fn limit(text: &str) -> Limit {
        let words: Vec<&str> = text.split_whitespace().collect();
        let (l, used) = Limit::parse(&words, LOG_MAX_LIMIT_DEFAULT).unwrap();
        assert_eq!(used, words.len(), "{text}");
        l
    }

    fn parse_err(text: &str) -> String {
        let words: Vec<&str> = text.split_whitespace().collect();
        Limit::parse(&words, LOG_MAX_LIMIT_DEFAULT)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn specs_parse_like_rl_all() {
        assert_eq!(limit("GCRA 20 10 1").to_string(), "GCRA 20 10 1");
        assert_eq!(limit("gcra 5 1 0.25").to_string(), "GCRA 5 1 0.25");
        assert_eq!(limit("WINDOW 100 60").to_string(), "WINDOW 100 60 SLIDING");
        assert_eq!(limit("window 3 1.5 log").to_string(), "WINDOW 3 1.5 LOG");
        assert_eq!(limit("WINDOW 3 1 Fixed").to_string(), "WINDOW 3 1 FIXED");
        // The algorithm is optional: a following word that is none is left to the caller.
        let (l, used) = Limit::parse(&["WINDOW", "3", "1", "per", "{ip}"], 10).unwrap();
        assert_eq!((l.to_string().as_str(), used), ("WINDOW 3 1 SLIDING", 3));
    }

    #[test]
    fn bad_specs_name_the_argument_as_the_module_does() {
        assert_eq!(parse_err("GCRA 0 1 1"), "burst must be a positive integer");
        assert_eq!(parse_err("GCRA 1 -1 1"), "rate must be a positive integer");
        assert!(parse_err("GCRA 1 1 1e3").starts_with("period must be seconds"));
        assert!(parse_err("WINDOW 1 .5").starts_with("window must be seconds"));
        assert_eq!(parse_err("WINDOW 0 1"), "limit must be a positive integer");
        assert_eq!(parse_err("GCRA 1 1"), "spec is missing its GCRA period");
        assert_eq!(
            parse_err("TOKEN 1 1 1"),
            "expected GCRA or WINDOW, got 'TOKEN'"
        );
        assert!(parse_err("GCRA 1 3 0.000000001").starts_with("rate is too high"));
        assert!(parse_err("WINDOW 100001 1 LOG").contains("rl.log-max-limit"));
        assert!(Limit::parse(&["WINDOW", "100001", "1", "SLIDING"], 100_000).is_ok());
    }

    fn run(limits: &[Limit], tables: &mut [Table], keys: &[Option<u32>], at: u64) -> Outcome {
        let mut out = Outcome::default();
        decide_all(limits, tables, keys, at, 1, &mut out);
        out
    }

    #[test]
    fn gcra_admits_burst_then_one_per_interval() {
        let l = [limit("GCRA 3 2 1")]; // T = 0.5 s
        let mut t = [Table::new(&l[0])];
        let allowed: Vec<bool> = [0, 0, 0, 0, S / 2, S / 2, S]
            .iter()
            .map(|&dt| {
                run(&l, &mut t, &[Some(0)], T0 + dt)
                    .combined
                    .unwrap()
                    .allowed()
            })
            .collect();
        assert_eq!(allowed, [true, true, true, false, true, false, true]);
        // Another key is untouched.
        assert!(run(&l, &mut t, &[Some(7)], T0).combined.unwrap().allowed());
    }

    #[test]
    fn denied_all_writes_nowhere_and_allowed_all_writes_everywhere() {
        let l = [limit("WINDOW 2 10 LOG"), limit("WINDOW 1 10 FIXED")];
        let mut t = [Table::new(&l[0]), Table::new(&l[1])];
        let keys = [Some(0), Some(0)];
        let a = run(&l, &mut t, &keys, T0 + 1);
        assert_eq!(a.combined.unwrap().reply(), [1, 1, 0, -1, 10_000]);
        // FIXED denies: the LOG limit must not consume.
        let b = run(&l, &mut t, &keys, T0 + 2);
        assert!(!b.combined.unwrap().allowed());
        assert!(b.each[0].unwrap().allowed() && !b.each[1].unwrap().allowed());
        assert_eq!(b.each[0].unwrap().remaining(), 0);
        // The LOG alone still has one left: the denial did not write it.
        let c = run(&l[..1], &mut t[..1], &keys[..1], T0 + 3);
        assert_eq!(c.combined.unwrap().reply()[..3], [1, 2, 0]);
    }

    #[test]
    fn a_limit_that_does_not_apply_takes_no_part() {
        let l = [limit("GCRA 1 1 1"), limit("WINDOW 1 1 SLIDING")];
        let mut t = [Table::new(&l[0]), Table::new(&l[1])];
        assert!(run(&l, &mut t, &[Some(0), None], T0)
            .combined
            .unwrap()
            .allowed());
        let out = run(&l, &mut t, &[None, Some(0)], T0);
        assert!(out.combined.unwrap().allowed());
        assert_eq!(out.each[0], None);
        let out = run(&l, &mut t, &[None, None], T0);
        assert_eq!(out.combined, None);
    }

    #[test]
    fn resized_keeps_the_algorithm_and_period() {
        let g = limit("GCRA 20 10 60");
        assert_eq!(g.resized(4, 2, 100).unwrap().to_string(), "GCRA 4 2 60");
        let w = limit("WINDOW 100 0.5 LOG");
        assert_eq!(
            w.resized(7, 0, 100).unwrap().to_string(),
            "WINDOW 7 0.5 LOG"
        );
        assert!(w.resized(101, 0, 100).is_err());
        assert_eq!(
            (g.capacity(), g.per_period(), g.period_ns()),
            (20, 10, 60 * S)
        );
    }
}
