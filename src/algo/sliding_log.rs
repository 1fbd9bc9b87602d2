//! Sliding window log: the exact algorithm. The key records the instants of the admitted
//! requests inside the trailing window (in a [`RequestLog`]); a request of quantity `n` at
//! `now` is admitted iff `requests in (now − window, now] + n ≤ limit`.
//!
//! Exact, at the price of memory per recorded request: about 4 bytes each in the compact log,
//! against about 100 for a sorted-set member. `limit` is capped by the module configuration
//! `rl.log-max-limit`, which bounds every key's memory.

use crate::decision::{Decision, Outcome, Overflow, Verdict};
use crate::params::WindowParams;
use crate::request_log::RequestLog;
use crate::time::{Instant, Span};

/// LogState is what a LOG key stores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogState {
    /// The window of the last write.
    pub window: Span,
    /// The limit of the last write; the log never holds more requests than this.
    pub limit: u64,
    /// The admitted requests inside the window of the last write.
    pub log: RequestLog,
}

/// LogWrite describes an admitted request: drop what left the window at `at`, record
/// `quantity` requests at `at`, adopt `window` and `limit`. It is deterministic, so it is
/// also what replicas and the AOF receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogWrite {
    /// The window to keep.
    pub window: Span,
    /// The limit to record.
    pub limit: u64,
    /// The request's instant.
    pub at: Instant,
    /// Requests admitted at that instant (≥ 1).
    pub quantity: u64,
}

impl LogState {
    /// An empty log under `params`.
    pub fn new(params: &WindowParams) -> Self {
        Self {
            window: params.window,
            limit: params.limit,
            log: RequestLog::default(),
        }
    }

    /// The first instant still inside the window at `now` is after this cutoff (None: the
    /// window reaches back past the epoch).
    fn cutoff(&self, now: Instant) -> Option<Instant> {
        now.checked_sub(self.window)
    }

    /// Applies an admitted request. O(entries dropped), amortised.
    pub fn apply(&mut self, write: &LogWrite) {
        self.window = write.window;
        self.limit = write.limit;
        if let Some(cutoff) = self.cutoff(write.at) {
            self.log.drop_until(cutoff);
        }
        self.log.push(write.at, write.quantity);
    }

    /// Requests recorded inside the window at `now`.
    pub fn in_window(&self, now: Instant) -> u64 {
        self.log.count_after(self.cutoff(now))
    }

    /// Gives back up to `quantity` of the most recent requests still inside the window at
    /// `now`; returns how many were given back.
    pub fn refund(&mut self, now: Instant, quantity: u64) -> u64 {
        if let Some(cutoff) = self.cutoff(now) {
            self.log.drop_until(cutoff);
        }
        self.log.pop_back(quantity)
    }
}

/// Decides one LOG request of `quantity` at `now` (the LOG rules, `docs/reference.md#r-log-1`
/// to `docs/reference.md#r-log-3`).
///
/// Errors: [`Overflow`] if the window's arithmetic leaves 64-bit nanoseconds.
pub fn decide(
    params: &WindowParams,
    stored: Option<&LogState>,
    now: Instant,
    quantity: u64,
) -> Result<Outcome<LogWrite>, Overflow> {
    let cutoff = now.checked_sub(params.window);
    let log = stored.map(|s| &s.log);
    let in_window = log.map_or(0, |l| l.count_after(cutoff));
    let newest = log
        .and_then(RequestLog::last)
        .filter(|&t| cutoff.is_none_or(|c| t > c));
    let reset_for = |newest: Option<Instant>| -> Result<Span, Overflow> {
        match newest {
            Some(t) => Ok(t
                .checked_add(params.window)
                .ok_or(Overflow)?
                .saturating_since(now)),
            None => Ok(Span::ZERO),
        }
    };
    let report =
        |verdict: Verdict, count: u64, newest: Option<Instant>| -> Result<Decision, Overflow> {
            Ok(Decision {
                verdict,
                limit: params.limit,
                remaining: params.limit.saturating_sub(count),
                reset_after: reset_for(newest)?,
            })
        };
    if quantity == 0 {
        return Ok(Outcome {
            decision: report(Verdict::Allowed, in_window, newest)?,
            write: None,
        });
    }
    if quantity > params.limit {
        return Ok(Outcome {
            decision: report(Verdict::Never, in_window, newest)?,
            write: None,
        });
    }
    let after = in_window.checked_add(quantity).ok_or(Overflow)?;
    if after <= params.limit {
        let write = LogWrite {
            window: params.window,
            limit: params.limit,
            at: now,
            quantity,
        };
        let newest_after = Some(newest.map_or(now, |t| t.max(now)));
        return Ok(Outcome {
            decision: report(Verdict::Allowed, after, newest_after)?,
            write: Some(write),
        });
    }
    // Denied: wait until `need` of the oldest requests in the window have left it, i.e. the
    // `need`-th of them. Found through the log's index: bounded work whatever the log holds
    // (even when a lowered limit leaves almost the whole log to wait for).
    let need = after - params.limit;
    let leaves_at = match log.and_then(|l| l.nth_after(cutoff, need)) {
        Some(at) => Some(at.checked_add(params.window).ok_or(Overflow)?),
        None => None,
    };
    // `need` ≤ in_window, so the log holds that request; the fallback is only defensive.
    let at = leaves_at.unwrap_or_else(|| now.saturating_add(params.window));
    let verdict = Verdict::Denied {
        retry_after: at.saturating_since(now).max(Span::from_ns(1)),
    };
    Ok(Outcome {
        decision: report(verdict, in_window, newest)?,
        write: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{at, check_retry_honest, denied, span, timeline, BASE, MS, S};
    use proptest::prelude::*;

    fn run_log(p: &WindowParams, state: &mut Option<LogState>, now: Instant, q: u64) -> Decision {
        let out = decide(p, state.as_ref(), now, q).unwrap();
        if let Some(w) = out.write {
            state.get_or_insert_with(|| LogState::new(p)).apply(&w);
        }
        out.decision
    }

    #[test]
    fn exact_trailing_window_timeline() {
        let p = WindowParams::new(3, span(10 * S)).unwrap();
        let mut s = None;
        let d = run_log(&p, &mut s, BASE, 1);
        assert_eq!(
            (d.verdict, d.remaining, d.reset_after),
            (Verdict::Allowed, 2, span(10 * S))
        );
        run_log(&p, &mut s, at(4 * S), 1);
        run_log(&p, &mut s, at(8 * S), 1);
        let d = run_log(&p, &mut s, at(9 * S), 1);
        assert_eq!(d.verdict, denied(S));
        assert_eq!(d.reset_after, span(9 * S));
        // At exactly BASE + 10 s the first request is at the window's open end: it left.
        let d = run_log(&p, &mut s, at(10 * S), 1);
        assert_eq!((d.verdict, d.remaining), (Verdict::Allowed, 0));
        // Needing two to leave: the ones at 4 s and 8 s → retry at 18 s.
        let d = run_log(&p, &mut s, at(10 * S), 2);
        assert_eq!(d.verdict, denied(8 * S));
        assert_eq!(s.as_ref().unwrap().log.total(), 3);
    }

    #[test]
    fn same_instant_requests_are_counted_each() {
        let p = WindowParams::new(5, span(S)).unwrap();
        let mut s = None;
        run_log(&p, &mut s, BASE, 2);
        run_log(&p, &mut s, BASE, 1);
        run_log(&p, &mut s, BASE, 1);
        let log = &s.as_ref().unwrap().log;
        assert_eq!((log.total(), log.entries()), (4, 1));
        assert_eq!(run_log(&p, &mut s, BASE, 2).verdict, denied(S));
    }

    #[test]
    fn quantity_zero_and_oversize_do_not_write() {
        let p = WindowParams::new(2, span(S)).unwrap();
        assert!(decide(&p, None, BASE, 0).unwrap().write.is_none());
        let out = decide(&p, None, BASE, 3).unwrap();
        assert_eq!((out.decision.verdict, out.write), (Verdict::Never, None));
    }

    proptest! {
        #[test]
        fn never_more_than_limit_in_any_trailing_window(
            limit in 1u64..12, window_ms in 1u64..3000,
            steps in prop::collection::vec((0u64..1_000_000_000, 0u64..5), 1..80),
        ) {
            let p = WindowParams::new(limit, span(window_ms * MS)).unwrap();
            let mut s = None;
            let mut now = BASE;
            let mut admitted: Vec<Instant> = Vec::new(); // brute force: one instant per request
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let d = run_log(&p, &mut s, now, q);
                let brute_in_window = admitted.iter().filter(|&&t| t.saturating_add(p.window) > now).count() as u64;
                let brute_allowed = q == 0 || (q <= limit && brute_in_window + q <= limit);
                prop_assert_eq!(d.verdict.is_allowed(), brute_allowed);
                if d.verdict.is_allowed() {
                    for _ in 0..q { admitted.push(now); }
                }
                prop_assert_eq!(d.remaining, limit - (brute_in_window + if d.verdict.is_allowed() { q } else { 0 }).min(limit));
            }
            // Every trailing window (ending at any admitted instant) holds ≤ limit.
            for &end in &admitted {
                let n = admitted.iter().filter(|&&t| t <= end && t.saturating_add(p.window) > end).count() as u64;
                prop_assert!(n <= limit);
            }
        }

        #[test]
        fn retry_after_is_honest(limit in 1u64..12, window_ms in 1u64..3000,
                                 steps in timeline(1_000_000_000, 5, 60), qty in 1u64..5) {
            let p = WindowParams::new(limit, span(window_ms * MS)).unwrap();
            let mut s = None;
            let mut now = BASE;
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                run_log(&p, &mut s, now, q);
            }
            let out = decide(&p, s.as_ref(), now, qty).unwrap();
            check_retry_honest(out.decision.verdict, now, |t| decide(&p, s.as_ref(), t, qty).unwrap().decision.verdict)?;
        }
    }
}
