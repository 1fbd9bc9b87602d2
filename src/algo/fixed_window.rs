//! Fixed window counter: one counter per window aligned to the Unix epoch
//! (`floor(now / window)`), so every client and replica agrees on the window without
//! key-naming tricks.
//!
//! Cheap and simple, with the classic weakness of the algorithm: a client may spend a full
//! quota at the end of one window and another full quota at the start of the next, i.e. up to
//! `2 · limit` requests within a span of a little more than no time at all around the boundary.
//! Choose SLIDING or LOG when that burst matters.

use crate::decision::{Decision, Outcome, Overflow, Verdict};
use crate::params::WindowParams;
use crate::time::{Instant, Span};

/// FixedState is what a FIXED key stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedState {
    /// The window length the count was built under.
    pub window: Span,
    /// The limit of the last write (reported by RL.REFUND).
    pub limit: u64,
    /// Start of the window the count belongs to (a multiple of `window` since the epoch).
    pub window_start: Instant,
    /// Requests admitted in that window.
    pub count: u64,
    /// The instant of the last write: the latest any counted request can have happened (used
    /// to carry the count across a change of window length).
    pub updated_at: Instant,
}

/// Returns the count of requests that may lie in the window starting at `window_start`.
///
/// With an unchanged window length this is the stored count when it belongs to the current
/// window, else 0. After a change of window length the stored count is kept, whole, while any
/// of its requests can lie in the new current window (i.e. its last write is not before the
/// new window's start), so a change never admits more than the new limit allows.
pub fn current_count(stored: Option<&FixedState>, window_start: Instant) -> u64 {
    match stored {
        Some(s) if s.updated_at >= window_start => s.count,
        _ => 0,
    }
}

/// The instant a state is judged at: `now`, or the state's last write if that is later (a
/// clock that stepped back, a failover to a host whose clock is behind). A stored state is
/// never re-dated into an earlier window, so a step back never admits more than the limit.
pub fn judged_at(stored: Option<&FixedState>, now: Instant) -> Instant {
    stored.map_or(now, |s| now.max(s.updated_at))
}

/// Decides one FIXED request of `quantity` at `now` (the FIXED rules,
/// `docs/reference.md#r-fixed-1` and `docs/reference.md#r-fixed-2`): admitted iff
/// `count + quantity ≤ limit`. `retry_after` and
/// `reset_after` run to the window's end. A state written later than `now` is judged at its
/// last write ([`judged_at`]), and the durations still count from `now`.
///
/// Errors: [`Overflow`] if the window's end leaves 64-bit nanoseconds.
pub fn decide(
    params: &WindowParams,
    stored: Option<&FixedState>,
    now: Instant,
    quantity: u64,
) -> Result<Outcome<FixedState>, Overflow> {
    let at = judged_at(stored, now);
    let window_start = at.floor_to(params.window);
    let window_end = window_start.checked_add(params.window).ok_or(Overflow)?;
    let to_end = window_end.saturating_since(now);
    let count = current_count(stored, window_start);
    let report = |verdict: Verdict, count_after: u64| Decision {
        verdict,
        limit: params.limit,
        remaining: params.limit.saturating_sub(count_after),
        reset_after: if count_after > 0 { to_end } else { Span::ZERO },
    };
    if quantity == 0 {
        return Ok(Outcome {
            decision: report(Verdict::Allowed, count),
            write: None,
        });
    }
    if quantity > params.limit {
        return Ok(Outcome {
            decision: report(Verdict::Never, count),
            write: None,
        });
    }
    // quantity ≤ limit here; compare without adding, so a count near 2^64 is a denial.
    if count > params.limit - quantity {
        let verdict = Verdict::Denied {
            retry_after: to_end,
        };
        return Ok(Outcome {
            decision: report(verdict, count),
            write: None,
        });
    }
    let count_after = count + quantity;
    let write = FixedState {
        window: params.window,
        limit: params.limit,
        window_start,
        count: count_after,
        updated_at: at,
    };
    Ok(Outcome {
        decision: report(Verdict::Allowed, count_after),
        write: Some(write),
    })
}

/// Records `quantity` requests that have already happened (`FORCE`), whether or not the limit
/// admits them: the current window's count grows past `limit` if need be, so later requests
/// are denied until the window ends. The decision is allowed, `remaining` 0 while over.
///
/// Errors: [`Overflow`] when the count would pass 2^64 − 1 or the window's end 64-bit time.
pub fn force(
    params: &WindowParams,
    stored: Option<&FixedState>,
    now: Instant,
    quantity: u64,
) -> Result<Outcome<FixedState>, Overflow> {
    if quantity == 0 {
        return decide(params, stored, now, 0);
    }
    let at = judged_at(stored, now);
    let window_start = at.floor_to(params.window);
    let window_end = window_start.checked_add(params.window).ok_or(Overflow)?;
    let count = current_count(stored, window_start)
        .checked_add(quantity)
        .ok_or(Overflow)?;
    Ok(Outcome {
        decision: Decision {
            verdict: Verdict::Allowed,
            limit: params.limit,
            remaining: params.limit.saturating_sub(count),
            reset_after: window_end.saturating_since(now),
        },
        write: Some(FixedState {
            window: params.window,
            limit: params.limit,
            window_start,
            count,
            updated_at: at,
        }),
    })
}

/// Gives back up to `quantity` requests to the current window at `now`; returns the new
/// state (None when nothing is counted any more) and how many were given back.
pub fn refund(state: &FixedState, now: Instant, quantity: u64) -> (Option<FixedState>, u64) {
    let window_start = judged_at(Some(state), now).floor_to(state.window);
    let count = current_count(Some(state), window_start);
    let refunded = quantity.min(count);
    let left = count - refunded;
    if left == 0 {
        return (None, refunded);
    }
    (
        Some(FixedState {
            count: left,
            ..*state
        }),
        refunded,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{
        at, check_retry_honest, denied, replay, run_table, span, st, timeline, Step, BASE, MS, S,
    };
    use proptest::prelude::*;

    fn run(params: WindowParams, steps: &[Step]) {
        run_table(params.limit, steps, |stored, now, qty| {
            decide(&params, stored, now, qty).expect("no overflow")
        });
    }

    #[test]
    fn counts_per_epoch_aligned_window() {
        let p = WindowParams::new(3, span(10 * S)).unwrap();
        run(
            p,
            &[
                // at, qty, allowed, remaining, retry_ms, reset_ms
                st(0, 0, true, 3, None, 0),
                st(1000 * MS, 1, true, 2, None, 9000),
                st(2000 * MS, 2, true, 0, None, 8000),
                st(2500 * MS, 1, false, 0, Some(7500), 7500),
                st(2500 * MS, 4, false, 0, None, 7500),
                st(9999 * MS, 0, true, 0, None, 1),
                st(10_000 * MS, 1, true, 2, None, 10_000),
            ],
        );
    }

    #[test]
    fn boundary_burst_is_allowed_as_documented() {
        // A full quota at the very end of one window and another at the very start of the
        // next: 2 × limit within 2 ms. This is the known trade-off of FIXED.
        let p = WindowParams::new(5, span(10 * S)).unwrap();
        run(
            p,
            &[
                // at, qty, allowed, remaining, retry_ms, reset_ms
                st(9_999 * MS, 5, true, 0, None, 1),
                st(10_001 * MS, 5, true, 0, None, 9_999),
            ],
        );
    }

    #[test]
    fn windows_are_aligned_to_the_epoch_not_to_the_first_request() {
        let p = WindowParams::new(1, span(60 * S)).unwrap();
        let out = decide(&p, None, at(59 * S), 1).unwrap();
        assert_eq!(out.decision.reset_after, span(S));
        assert_eq!(out.write.unwrap().window_start, BASE);
    }

    #[test]
    fn window_change_keeps_counts_that_may_lie_in_the_new_window() {
        let hour = WindowParams::new(100, span(3600 * S)).unwrap();
        let minute = WindowParams::new(10, span(60 * S)).unwrap();
        let s = decide(&hour, None, at(30 * S), 8).unwrap().write.unwrap();
        // Same minute as the last write: the 8 requests may all be in it.
        let out = decide(&minute, Some(&s), at(40 * S), 3).unwrap();
        assert!(!out.decision.verdict.is_allowed());
        assert_eq!(out.decision.remaining, 2);
        // The next minute: none of them can be in it any more.
        let out = decide(&minute, Some(&s), at(61 * S), 10).unwrap();
        assert!(out.decision.verdict.is_allowed());
    }

    #[test]
    fn regression_a_count_near_u64_max_is_a_denial_not_an_overflow() {
        // Found by attack testing: limit 2^64-1 filled in one call, then a smaller limit.
        let huge = WindowParams::new(u64::MAX, span(100 * S)).unwrap();
        let s = decide(&huge, None, BASE, u64::MAX).unwrap().write.unwrap();
        let small = WindowParams::new(5, span(100 * S)).unwrap();
        let out = decide(&small, Some(&s), at(S), 1).unwrap();
        assert_eq!(out.decision.verdict, denied(99 * S));
        assert_eq!(out.decision.remaining, 0);
    }

    #[test]
    fn force_counts_past_the_limit_until_the_window_ends() {
        let p = WindowParams::new(5, span(10 * S)).unwrap();
        let out = force(&p, None, at(S), 8).unwrap();
        assert_eq!(
            (out.decision.remaining, out.decision.reset_after),
            (0, span(9 * S))
        );
        let s = out.write.unwrap();
        assert_eq!(s.count, 8);
        assert_eq!(
            decide(&p, Some(&s), at(2 * S), 1).unwrap().decision.verdict,
            denied(8 * S)
        );
        assert!(decide(&p, Some(&s), at(10 * S), 5)
            .unwrap()
            .decision
            .verdict
            .is_allowed());
        let full = force(&p, None, at(S), u64::MAX).unwrap().write.unwrap();
        assert_eq!(force(&p, Some(&full), at(S), 1), Err(Overflow));
    }

    #[test]
    fn refund_lowers_the_current_count_only() {
        let p = WindowParams::new(5, span(10 * S)).unwrap();
        let s = decide(&p, None, BASE, 4).unwrap().write.unwrap();
        assert_eq!(
            refund(&s, at(S), 3),
            (Some(FixedState { count: 1, ..s }), 3)
        );
        assert_eq!(refund(&s, at(S), 9), (None, 4));
        assert_eq!(refund(&s, at(10 * S), 1), (None, 0));
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
        fn never_more_than_limit_per_aligned_window(limit in 1u64..20, window_ms in 1u64..2000,
                                 steps in prop::collection::vec((0u64..500_000_000, 0u64..6), 1..80)) {
            let p = WindowParams::new(limit, span(window_ms * MS)).unwrap();
            let mut now = BASE;
            let mut stored = None;
            let mut per_window = std::collections::HashMap::<u64, u64>::new();
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let out = decide(&p, stored.as_ref(), now, q).unwrap();
                if let Some(w) = out.write {
                    *per_window.entry(now.as_ns() / p.window.as_ns()).or_default() += q;
                    stored = Some(w);
                } else {
                    prop_assert!(q == 0 || !out.decision.verdict.is_allowed());
                }
            }
            prop_assert!(per_window.values().all(|&c| c <= limit));
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
