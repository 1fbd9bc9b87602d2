//! Sliding window counter: the previous and the current epoch-aligned window, the previous
//! weighted by the part of it still inside the trailing window (the approximation popularised
//! by Cloudflare's 2017 write-up of their rate limiter):
//!
//! `estimate = prev · (window − elapsed) / window + curr`
//!
//! computed exactly in integer arithmetic (everything is multiplied by `window`, in 128 bits).
//! Two counters per key, no boundary burst of FIXED's size, and an estimate that assumes the
//! previous window's requests were spread evenly.

use crate::decision::{Decision, Outcome, Overflow, Verdict};
use crate::params::WindowParams;
use crate::time::{Instant, Span};

/// SlidingState is what a SLIDING key stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingState {
    /// The window length the counts were built under.
    pub window: Span,
    /// The limit of the last write.
    pub limit: u64,
    /// Start of the window `curr` counts (a multiple of `window` since the epoch).
    pub window_start: Instant,
    /// Requests admitted in the window before `window_start`.
    pub prev: u64,
    /// Requests admitted in the window starting at `window_start`.
    pub curr: u64,
    /// The instant of the last write.
    pub updated_at: Instant,
}

/// The counts of the previous and current window at some instant under some window length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Requests in the previous window.
    pub prev: u64,
    /// Requests in the current window.
    pub curr: u64,
}

/// Re-expresses the stored counts in the windows current at `now` under `window`.
///
/// Each stored bucket's requests happened in a known span: the stored current window's between
/// its start and the last write, the stored previous window's in the window before. A bucket
/// whose span reaches into the new current window counts there in full; one that reaches only
/// into the new previous window counts there; older ones are gone. With an unchanged window
/// length this is the usual shift (current becomes previous after one window, both vanish
/// after two); after a change it never under-counts a request that may lie in the new windows.
pub fn current_counts(stored: Option<&SlidingState>, now: Instant, window: Span) -> Counts {
    let Some(s) = stored else {
        return Counts { prev: 0, curr: 0 };
    };
    let start = now.floor_to(window);
    let prev_start = start.saturating_sub(window);
    let mut counts = Counts { prev: 0, curr: 0 };
    let mut place = |last_instant: Instant, n: u64| {
        if n == 0 {
        } else if last_instant >= start {
            counts.curr = counts.curr.saturating_add(n);
        } else if last_instant >= prev_start && start > Instant::EPOCH {
            counts.prev = counts.prev.saturating_add(n);
        }
    };
    place(s.updated_at.max(s.window_start), s.curr);
    if let Some(before_start) = s.window_start.checked_sub(Span::from_ns(1)) {
        place(before_start, s.prev);
    }
    counts
}

/// `estimate · window` for `counts` at `elapsed` into the current window.
fn scaled_estimate(counts: Counts, elapsed: Span, window: Span) -> u128 {
    u128::from(counts.prev) * u128::from(window.saturating_sub(elapsed).as_ns())
        + u128::from(counts.curr) * u128::from(window.as_ns())
}

/// The earliest offset into a window (≥ `from`) at which `prev · (W − e) ≤ room · W`, or
/// `None` if only the window's end (e = W) satisfies it.
fn earliest_offset(prev: u64, room: u128, from: Span, window: Span) -> Option<Span> {
    if prev == 0 {
        return Some(from);
    }
    let w = u128::from(window.as_ns());
    let k = room * w / u128::from(prev);
    if k >= w {
        return Some(from);
    }
    let e = Span::from_ns(window.as_ns() - k as u64); // k < window
    (e < window).then_some(e.max(from))
}

/// The instant a state is judged at: `now`, or the state's last write if that is later (a
/// clock that stepped back, a failover to a host whose clock is behind). A stored state is
/// never re-dated into an earlier window, so a step back never admits more than the limit.
pub fn judged_at(stored: Option<&SlidingState>, now: Instant) -> Instant {
    stored.map_or(now, |s| now.max(s.updated_at))
}

/// Decides one SLIDING request of `quantity` at `now` (the SLIDING rules,
/// `docs/reference.md#r-sliding-1` to `docs/reference.md#r-sliding-3`): admitted iff
/// `estimate + quantity ≤ limit`;
/// `remaining = floor(limit − estimate)` after the request; the key is idle at the end of the
/// next window while `curr > 0`, at the end of the current one while only `prev > 0`;
/// `retry_after` is the earliest instant the estimate admits the request. A state written
/// later than `now` is judged at its last write ([`judged_at`]), and the durations still
/// count from `now`.
///
/// Errors: [`Overflow`] if a window end leaves 64-bit nanoseconds.
pub fn decide(
    params: &WindowParams,
    stored: Option<&SlidingState>,
    now: Instant,
    quantity: u64,
) -> Result<Outcome<SlidingState>, Overflow> {
    let w = params.window;
    let at = judged_at(stored, now);
    let start = at.floor_to(w);
    let elapsed = at.saturating_since(start);
    let end = start.checked_add(w).ok_or(Overflow)?;
    let next_end = end.checked_add(w).ok_or(Overflow)?;
    let counts = current_counts(stored, at, w);
    let w_ns = u128::from(w.as_ns());
    let limit_scaled = u128::from(params.limit) * w_ns;
    let report = |verdict: Verdict, c: Counts| {
        let estimate = scaled_estimate(c, elapsed, w);
        let remaining = limit_scaled.saturating_sub(estimate) / w_ns;
        let reset_after = if c.curr > 0 {
            next_end.saturating_since(now)
        } else if c.prev > 0 {
            end.saturating_since(now)
        } else {
            Span::ZERO
        };
        Decision {
            verdict,
            limit: params.limit,
            remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
            reset_after,
        }
    };
    if quantity == 0 {
        return Ok(Outcome {
            decision: report(Verdict::Allowed, counts),
            write: None,
        });
    }
    if quantity > params.limit {
        return Ok(Outcome {
            decision: report(Verdict::Never, counts),
            write: None,
        });
    }
    let n_scaled = u128::from(quantity) * w_ns;
    if scaled_estimate(counts, elapsed, w) + n_scaled <= limit_scaled {
        let after = Counts {
            prev: counts.prev,
            curr: counts.curr.checked_add(quantity).ok_or(Overflow)?,
        };
        let write = SlidingState {
            window: w,
            limit: params.limit,
            window_start: start,
            prev: after.prev,
            curr: after.curr,
            updated_at: at,
        };
        return Ok(Outcome {
            decision: report(Verdict::Allowed, after),
            write: Some(write),
        });
    }
    // Denied: the estimate only falls with time, so find the first instant it admits.
    let room_now =
        u128::from(params.limit).checked_sub(u128::from(counts.curr) + u128::from(quantity));
    let in_this_window = room_now.and_then(|room| earliest_offset(counts.prev, room, elapsed, w));
    let admits_at = match in_this_window {
        Some(offset) => start.saturating_add(offset),
        None => {
            // Next window: the current count becomes the previous one, nothing is current.
            let room = u128::from(params.limit - quantity);
            match earliest_offset(counts.curr, room, Span::ZERO, w) {
                Some(offset) => end.saturating_add(offset),
                None => next_end,
            }
        }
    };
    let verdict = Verdict::Denied {
        retry_after: admits_at.saturating_since(now).max(Span::from_ns(1)),
    };
    Ok(Outcome {
        decision: report(verdict, counts),
        write: None,
    })
}

/// Records `quantity` requests that have already happened (`FORCE`), whether or not the limit
/// admits them: the current window's count grows past `limit` if need be, so later requests
/// are denied until the estimate has fallen back. The decision is allowed, `remaining` 0
/// while over, `reset_after` the end of the next window.
///
/// Errors: [`Overflow`] when the count would pass 2^64 − 1 or a window end 64-bit time.
pub fn force(
    params: &WindowParams,
    stored: Option<&SlidingState>,
    now: Instant,
    quantity: u64,
) -> Result<Outcome<SlidingState>, Overflow> {
    if quantity == 0 {
        return decide(params, stored, now, 0);
    }
    let w = params.window;
    let at = judged_at(stored, now);
    let start = at.floor_to(w);
    let next_end = start
        .checked_add(w)
        .and_then(|end| end.checked_add(w))
        .ok_or(Overflow)?;
    let counts = current_counts(stored, at, w);
    let curr = counts.curr.checked_add(quantity).ok_or(Overflow)?;
    let estimate = scaled_estimate(
        Counts {
            prev: counts.prev,
            curr,
        },
        at.saturating_since(start),
        w,
    );
    let remaining = (u128::from(params.limit) * u128::from(w.as_ns())).saturating_sub(estimate)
        / u128::from(w.as_ns());
    Ok(Outcome {
        decision: Decision {
            verdict: Verdict::Allowed,
            limit: params.limit,
            remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
            reset_after: next_end.saturating_since(now),
        },
        write: Some(SlidingState {
            window: w,
            limit: params.limit,
            window_start: start,
            prev: counts.prev,
            curr,
            updated_at: at,
        }),
    })
}

/// Gives back up to `quantity` requests from the current window's count at `now`; returns the
/// new state (None when both counts are gone) and how many were given back.
pub fn refund(state: &SlidingState, now: Instant, quantity: u64) -> (Option<SlidingState>, u64) {
    let w = state.window;
    // Judged at the last write if that is later than now: the state stays in its windows.
    let at = judged_at(Some(state), now);
    let start = at.floor_to(w);
    let counts = current_counts(Some(state), at, w);
    let refunded = quantity.min(counts.curr);
    let curr = counts.curr - refunded;
    if curr == 0 && counts.prev == 0 {
        return (None, refunded);
    }
    let updated_at = if curr > 0 {
        state.updated_at.max(start)
    } else {
        start
    };
    (
        Some(SlidingState {
            window_start: start,
            prev: counts.prev,
            curr,
            updated_at,
            ..*state
        }),
        refunded,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{
        at, check_retry_honest, denied, replay, span, timeline, BASE, MS, S,
    };
    use proptest::prelude::*;

    fn state(prev: u64, curr: u64) -> SlidingState {
        SlidingState {
            window: span(10 * S),
            limit: 10,
            window_start: BASE,
            prev,
            curr,
            updated_at: BASE,
        }
    }

    #[test]
    fn weighted_estimate_at_several_points() {
        // prev 10, curr 0, limit 10, window 10 s. The estimate is 10·(10−e)/10.
        let p = WindowParams::new(10, span(10 * S)).unwrap();
        let s = state(10, 0);
        for (elapsed_ms, remaining) in [(0, 0), (1_000, 1), (2_500, 2), (5_000, 5), (9_999, 9)] {
            let out = decide(&p, Some(&s), at(elapsed_ms * MS), 0).unwrap();
            assert_eq!(out.decision.remaining, remaining, "at {elapsed_ms} ms");
        }
        // At 2.5 s the estimate is 7.5: 2 requests pass (9.5 ≤ 10), a third does not.
        let out = decide(&p, Some(&s), at(2_500 * MS), 2).unwrap();
        assert!(out.decision.verdict.is_allowed());
        assert_eq!(out.decision.remaining, 0);
        let out = decide(&p, Some(&s), at(2_500 * MS), 3).unwrap();
        // 3 pass once 10·(10−e)/10 ≤ 7, i.e. at e = 3 s.
        assert_eq!(out.decision.verdict, denied(500 * MS));
    }

    #[test]
    fn timeline_shifts_current_into_previous() {
        let p = WindowParams::new(4, span(10 * S)).unwrap();
        let a = decide(&p, None, at(5 * S), 4).unwrap();
        assert_eq!(a.decision.reset_after.ceil_ms(), 15_000); // end of the next window
        let s = a.write.unwrap();
        // Half-way into the next window: estimate 4 · 0.5 = 2 → 2 remain.
        let b = decide(&p, Some(&s), at(15 * S), 0).unwrap();
        assert_eq!(b.decision.remaining, 2);
        assert_eq!(b.decision.reset_after.ceil_ms(), 5_000); // only prev left
                                                             // Two windows later: idle.
        let c = decide(&p, Some(&s), at(20 * S), 0).unwrap();
        assert_eq!(
            (c.decision.remaining, c.decision.reset_after),
            (4, Span::ZERO)
        );
    }

    #[test]
    fn denied_retry_can_fall_in_the_next_window() {
        // curr 4 of 4 at 5 s into a window: the next request passes when prev·(W−e)/W ≤ 3 in
        // the next window, i.e. e ≥ 2.5 s: 7.5 s from now.
        let p = WindowParams::new(4, span(10 * S)).unwrap();
        let s = decide(&p, None, at(5 * S), 4).unwrap().write.unwrap();
        let out = decide(&p, Some(&s), at(5 * S), 1).unwrap();
        assert_eq!(out.decision.verdict, denied(7_500 * MS));
        let out = decide(&p, Some(&s), at(5 * S), 4).unwrap();
        assert_eq!(out.decision.verdict, denied(15 * S));
    }

    #[test]
    fn window_change_counts_conservatively() {
        let minute = WindowParams::new(10, span(60 * S)).unwrap();
        let ten_s = WindowParams::new(10, span(10 * S)).unwrap();
        let s = decide(&minute, None, at(5 * S), 6).unwrap().write.unwrap();
        // Last write at 5 s lies in the 10 s window [0, 10): counted as current.
        let c = current_counts(Some(&s), at(7 * S), ten_s.window);
        assert_eq!(c, Counts { prev: 0, curr: 6 });
        // At 12 s it lies in the previous 10 s window.
        let c = current_counts(Some(&s), at(12 * S), ten_s.window);
        assert_eq!(c, Counts { prev: 6, curr: 0 });
        // At 25 s it is gone.
        let c = current_counts(Some(&s), at(25 * S), ten_s.window);
        assert_eq!(c, Counts { prev: 0, curr: 0 });
    }

    #[test]
    fn force_counts_past_the_limit_and_the_estimate_drains_it() {
        let p = WindowParams::new(4, span(10 * S)).unwrap();
        let out = force(&p, None, at(5 * S), 8).unwrap();
        assert_eq!(out.decision.verdict, Verdict::Allowed);
        assert_eq!(
            (out.decision.remaining, out.decision.reset_after),
            (0, span(15 * S))
        );
        let s = out.write.unwrap();
        // Next window: 8 · (10 − e)/10 + 1 ≤ 4 once e ≥ 6.25 s, i.e. 11.25 s from now.
        assert_eq!(
            decide(&p, Some(&s), at(5 * S), 1).unwrap().decision.verdict,
            denied(11_250 * MS)
        );
    }

    #[test]
    fn refund_lowers_current_count() {
        let p = WindowParams::new(10, span(10 * S)).unwrap();
        let s = decide(&p, None, at(S), 5).unwrap().write.unwrap();
        let (after, n) = refund(&s, at(2 * S), 3);
        assert_eq!(n, 3);
        assert_eq!(after.unwrap().curr, 2);
        let (after, n) = refund(&s, at(2 * S), 30);
        assert_eq!((after, n), (None, 5));
    }

    #[test]
    fn clock_stepping_back_never_admits_more_than_the_limit() {
        // Limit 5 per 60 s: 3 requests; the clock steps back an hour; 2 more, then denied;
        // the clock is corrected: still denied. 5 in all, not 10.
        let p = WindowParams::new(5, span(60 * S)).unwrap();
        let mut stored = None;
        let mut admitted = 0;
        let mut ask = |now: Instant| {
            let out = decide(&p, stored.as_ref(), now, 1).unwrap();
            if let Some(w) = out.write {
                stored = Some(w);
                admitted += 1;
            }
            out.decision
        };
        let t0 = at(10 * S);
        for _ in 0..3 {
            assert!(ask(t0).verdict.is_allowed());
        }
        let back = t0.saturating_sub(span(3600 * S));
        assert!(ask(back).verdict.is_allowed());
        assert!(ask(back).verdict.is_allowed());
        let denied_back = ask(back);
        assert!(!denied_back.verdict.is_allowed());
        for i in 0..5 {
            assert!(!ask(t0.saturating_add(span(100 * MS + i)))
                .verdict
                .is_allowed());
        }
        assert_eq!(admitted, 5);
    }

    #[test]
    fn a_key_exhausted_before_a_step_back_reports_an_honest_retry() {
        let p = WindowParams::new(5, span(60 * S)).unwrap();
        let s = decide(&p, None, at(4 * S), 5).unwrap().write.unwrap();
        let back = at(4 * S).saturating_sub(span(3600 * S));
        let out = decide(&p, Some(&s), back, 1).unwrap();
        let Verdict::Denied { retry_after } = out.decision.verdict else {
            panic!("expected a denial, got {:?}", out.decision.verdict)
        };
        // Denied until the stored window has passed in real time: about an hour, not 56 s.
        assert!(retry_after > span(3600 * S), "{retry_after:?}");
        let then = back.saturating_add(retry_after);
        assert!(!decide(&p, Some(&s), then.saturating_sub(span(1)), 1)
            .unwrap()
            .decision
            .verdict
            .is_allowed());
        assert!(decide(&p, Some(&s), then, 1)
            .unwrap()
            .decision
            .verdict
            .is_allowed());
        assert_eq!(
            out.decision.reset_after,
            retry_after.max(out.decision.reset_after)
        );
    }

    proptest! {
        #[test]
        fn retry_after_is_honest(limit in 1u64..20, window_ms in 1u64..5000,
                                 steps in timeline(3_000_000_000, 6, 40), qty in 1u64..6) {
            let p = WindowParams::new(limit, span(window_ms * MS)).unwrap();
            let (stored, now) = replay(&steps, limit, |s, t, q| decide(&p, s, t, q).unwrap())?;
            let out = decide(&p, stored.as_ref(), now, qty).unwrap();
            check_retry_honest(out.decision.verdict, now, |t| decide(&p, stored.as_ref(), t, qty).unwrap().decision.verdict)?;
        }

        #[test]
        fn key_is_idle_after_reset_after(limit in 1u64..20, window_ms in 1u64..5000,
                                 steps in prop::collection::vec((0u64..3_000_000_000, 1u64..6), 1..40)) {
            let p = WindowParams::new(limit, span(window_ms * MS)).unwrap();
            let mut now = BASE;
            let mut stored = None;
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let out = decide(&p, stored.as_ref(), now, q).unwrap();
                if let Some(w) = out.write {
                    stored = Some(w);
                    let idle_at = now.saturating_add(out.decision.reset_after);
                    let idle = decide(&p, stored.as_ref(), idle_at, 0).unwrap();
                    prop_assert_eq!(idle.decision.remaining, limit);
                    prop_assert_eq!(idle.decision.reset_after, Span::ZERO);
                }
            }
        }

        #[test]
        fn retry_after_is_honest_under_clock_steps(limit in 1u64..20, window_ms in 1u64..5000,
                                 steps in prop::collection::vec((0u64..3_000_000_000, 0u64..6, any::<bool>()), 1..40),
                                 qty in 1u64..6) {
            // The clock moves forward, or steps back by up to two windows.
            let p = WindowParams::new(limit, span(window_ms * MS)).unwrap();
            let mut now = at(3600 * S);
            let mut stored = None;
            for (gap, q, back) in steps {
                now = if back { now.saturating_sub(span(gap % (2 * window_ms * MS))) } else { now.saturating_add(span(gap)) };
                if let Some(w) = decide(&p, stored.as_ref(), now, q).unwrap().write {
                    stored = Some(w);
                }
            }
            let out = decide(&p, stored.as_ref(), now, qty).unwrap();
            prop_assert!(out.decision.remaining <= limit);
            check_retry_honest(out.decision.verdict, now, |t| decide(&p, stored.as_ref(), t, qty).unwrap().decision.verdict)?;
        }
    }
}
