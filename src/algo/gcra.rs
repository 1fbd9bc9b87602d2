//! GCRA, the Generic Cell Rate Algorithm (ATM Forum Traffic Management Specification 4.0,
//! section 4.4.2, "virtual scheduling" form), used as a token bucket with one timestamp.
//!
//! In plain words: every request "costs" one emission interval `T = period / rate` of time.
//! The key stores the *theoretical arrival time* (TAT): the instant at which the key would be
//! idle again if no more requests came. A request of quantity `n` at `now` moves the TAT to
//! `max(TAT, now) + n·T`, and is admitted iff that is at most the *tolerance*
//! `τ = burst · T` ahead of `now`. An idle key therefore admits exactly `burst` requests at
//! once, then one more every `T`: the behaviour of a token bucket of capacity `burst` refilled
//! at `rate / period`, with a single integer of state instead of a counter and a timestamp.

use crate::decision::{Decision, Outcome, Overflow, Verdict};
use crate::params::GcraParams;
use crate::time::{Instant, Span};

/// GcraState is what one GCRA key stores: the TAT, the parameters it was built under and the
/// instant of the write that built it, so that a call with other parameters can convert it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Theoretical arrival time: when the key is idle again if no request comes.
    pub tat: Instant,
    /// The emission interval the TAT was built under (≥ 1 ns).
    pub emission_interval: Span,
    /// The burst the TAT was built under (≥ 1).
    pub burst: u64,
    /// The instant of the last write (≤ `tat`).
    pub updated_at: Instant,
}

/// GcraRequest is one call's request: `quantity` requests at once (0 = just report), and an
/// optional reservation horizon (`MAXWAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraRequest {
    /// Requests to admit together; 0 only reports the key's state.
    pub quantity: u64,
    /// With `Some(w)`, a denial that would clear within `w` becomes a reservation.
    pub max_wait: Option<Span>,
}

impl GcraRequest {
    /// Returns a plain request of `quantity` without a reservation horizon.
    pub fn of(quantity: u64) -> Self {
        Self {
            quantity,
            max_wait: None,
        }
    }
}

/// Returns the stored TAT under `params` (saturating at [`Instant::MAX`]), never earlier
/// than `now`.
///
/// A key idle under its own parameters (`tat ≤ now`) is idle. A key last written under
/// another emission interval keeps its *capacity in use at its last write*, measured in
/// requests: at the write's instant `w` it had `(tat − w) / T_old` requests in use; under the
/// new interval those requests end at `w + (tat − w) · T_new / T_old` (rounded up, so a
/// conversion never admits more) and drain at the new rate from `w` on. The result does not
/// depend on `now`, so repeated calls under the new parameters see one consistent key that
/// drains at the new rate: raising the rate or the burst takes effect at once and never locks
/// a key out, and waiting `retry_after` is honest. The stored burst plays no part: a lower
/// burst makes the key wait until its capacity in use drains below it.
#[inline(always)]
pub fn effective_tat(params: &GcraParams, stored: Option<&GcraState>, now: Instant) -> Instant {
    let Some(state) = stored else { return now };
    if state.tat <= now {
        return now;
    }
    if state.emission_interval == params.emission_interval {
        return state.tat;
    }
    let written = state.updated_at.min(state.tat);
    let in_use_ns = u128::from(state.tat.saturating_since(written).as_ns());
    let old_t = u128::from(state.emission_interval.as_ns().max(1));
    let converted = (in_use_ns * u128::from(params.emission_interval.as_ns())).div_ceil(old_t);
    let tat = u128::from(written.as_ns()) + converted;
    Instant::from_ns(u64::try_from(tat).unwrap_or(u64::MAX)).max(now)
}

/// Requests of quantity 1 still admitted at `now` by a key whose TAT is `tat`.
#[inline(always)]
fn remaining(params: &GcraParams, tat: Instant, now: Instant) -> u64 {
    let in_use = tat.saturating_since(now);
    params.tolerance.saturating_sub(in_use).as_ns() / params.emission_interval.as_ns()
}

/// Decides one GCRA request at `now` against the `stored` state (None: missing key).
///
/// Follows the RL.GCRA rule `docs/reference.md#r-gcra-2` exactly: `tat = max(stored_tat, now)`,
/// `new_tat = tat + n·T`, admitted iff `new_tat − now ≤ τ`. Admitted requests return the new
/// state in `write` (to be stored with an absolute expiry at `new_tat`); denials, `quantity`
/// 0 and `quantity > burst` (a [`Verdict::Never`]) return no write. With `max_wait`, a
/// denial that clears within it is admitted as [`Verdict::Reserved`] and writes the state it
/// would have written at the later instant (which is the same `new_tat`).
///
/// Errors: [`Overflow`] only when an admitted request's `new_tat` would not fit in 64-bit
/// nanoseconds (a burst whose tolerance reaches past the year 2554); reports and denials
/// saturate instead.
#[inline(always)]
pub fn decide(
    params: &GcraParams,
    stored: Option<&GcraState>,
    now: Instant,
    request: GcraRequest,
) -> Result<Outcome<GcraState>, Overflow> {
    let tat = effective_tat(params, stored, now);
    let n = request.quantity;
    let admitted = match request.max_wait {
        Some(_) => Verdict::Reserved { delay: Span::ZERO },
        None => Verdict::Allowed,
    };
    if n == 0 {
        return Ok(Outcome {
            decision: report(params, admitted, tat, now),
            write: None,
        });
    }
    if n > params.burst {
        return Ok(Outcome {
            decision: report(params, Verdict::Never, tat, now),
            write: None,
        });
    }
    // In 128 bits: n·T ≤ τ < 2^64 and tat < 2^64, so nothing here can overflow.
    let new_tat =
        u128::from(tat.as_ns()) + u128::from(n) * u128::from(params.emission_interval.as_ns());
    let ahead_ns = new_tat - u128::from(now.as_ns());
    let tolerance_ns = u128::from(params.tolerance.as_ns());
    if ahead_ns <= tolerance_ns {
        return admit(params, new_tat, now, admitted);
    }
    // Admitted at the first instant t with new_tat − t ≤ τ. That instant is not after `tat`
    // (because n·T ≤ τ), so max(stored_tat, t) is still `tat` and new_tat is unchanged.
    let wait = Span::from_ns(u64::try_from(ahead_ns - tolerance_ns).unwrap_or(u64::MAX));
    match request.max_wait {
        Some(max_wait) if wait <= max_wait => {
            admit(params, new_tat, now, Verdict::Reserved { delay: wait })
        }
        _ => Ok(Outcome {
            decision: report(params, Verdict::Denied { retry_after: wait }, tat, now),
            write: None,
        }),
    }
}

/// The outcome of an admitted request (`verdict` allowed or reserved) whose TAT becomes
/// `new_tat`: the state to write and its report.
///
/// Errors: [`Overflow`] when `new_tat` does not fit in 64-bit nanoseconds.
#[inline(always)]
fn admit(
    params: &GcraParams,
    new_tat: u128,
    now: Instant,
    verdict: Verdict,
) -> Result<Outcome<GcraState>, Overflow> {
    let tat = Instant::from_ns(u64::try_from(new_tat).map_err(|_| Overflow)?);
    // A reservation is written as if it arrived when allowed: at now + delay.
    let arrives = match verdict {
        Verdict::Reserved { delay } => now.saturating_add(delay).min(tat),
        _ => now,
    };
    Ok(Outcome {
        decision: report(params, verdict, tat, now),
        write: Some(GcraState {
            tat,
            emission_interval: params.emission_interval,
            burst: params.burst,
            updated_at: arrives,
        }),
    })
}

/// The decision `verdict` for a key whose TAT is `tat_after` at `now`.
#[inline(always)]
fn report(params: &GcraParams, verdict: Verdict, tat_after: Instant, now: Instant) -> Decision {
    Decision {
        verdict,
        limit: params.burst,
        remaining: remaining(params, tat_after, now),
        reset_after: tat_after.saturating_since(now),
    }
}

/// Records `quantity` requests that have already happened (`FORCE`), whether or not the limit
/// admits them: the TAT advances by `quantity · T` from `max(TAT, now)`, past `now + τ` if
/// need be, so later requests wait until the excess has drained. The decision is allowed,
/// `remaining` 0 while the key is over its burst, `reset_after` covering the whole excess.
///
/// Errors: [`Overflow`] when the new TAT would leave 64-bit nanoseconds.
pub fn force(
    params: &GcraParams,
    stored: Option<&GcraState>,
    now: Instant,
    quantity: u64,
) -> Result<Outcome<GcraState>, Overflow> {
    if quantity == 0 {
        return decide(params, stored, now, GcraRequest::of(0));
    }
    let tat = effective_tat(params, stored, now);
    let cost = params
        .emission_interval
        .checked_mul(quantity)
        .ok_or(Overflow)?;
    let tat = tat.checked_add(cost).ok_or(Overflow)?;
    Ok(Outcome {
        decision: Decision {
            verdict: Verdict::Allowed,
            limit: params.burst,
            remaining: remaining(params, tat, now),
            reset_after: tat.saturating_since(now),
        },
        write: Some(GcraState {
            tat,
            emission_interval: params.emission_interval,
            burst: params.burst,
            updated_at: now,
        }),
    })
}

/// Gives back up to `quantity` requests at `now`: the TAT moves back by `quantity · T`, but
/// not before `now`. Returns the new state (None when the key is idle again) and how many
/// requests were given back (the capacity in use, rounded up, if that is less).
pub fn refund(state: &GcraState, now: Instant, quantity: u64) -> (Option<GcraState>, u64) {
    let t_ns = state.emission_interval.as_ns().max(1);
    let in_use = state.tat.saturating_since(now);
    let refunded = quantity.min(in_use.as_ns().div_ceil(t_ns));
    let back_ns = u128::from(quantity) * u128::from(t_ns);
    let tat = match u64::try_from(back_ns) {
        Ok(back) if back < in_use.as_ns() => state.tat.saturating_sub(Span::from_ns(back)),
        _ => now,
    };
    if tat <= now {
        return (None, refunded);
    }
    (
        Some(GcraState {
            tat,
            updated_at: state.updated_at.min(tat),
            ..*state
        }),
        refunded,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{at, check_retry_honest, denied, run_table, span, st, BASE, MS, S};
    use crate::time::MAX_PERIOD;
    use proptest::prelude::*;

    fn run(params: GcraParams, steps: &[crate::algo::testing::Step]) {
        run_table(params.burst, steps, |stored, now, qty| {
            decide(&params, stored, now, GcraRequest::of(qty)).expect("no overflow")
        });
    }

    #[test]
    fn idle_key_admits_exactly_burst_then_one_per_interval() {
        // burst 3, 1 per second.
        let p = GcraParams::new(3, 1, span(S)).unwrap();
        run(
            p,
            &[
                // at, qty, allowed, remaining, retry_ms, reset_ms
                st(0, 1, true, 2, None, 1000),
                st(0, 1, true, 1, None, 2000),
                st(0, 1, true, 0, None, 3000),
                st(0, 1, false, 0, Some(1000), 3000),
                st(999 * MS, 1, false, 0, Some(1), 2001),
                st(1000 * MS, 1, true, 0, None, 3000),
                st(1500 * MS, 1, false, 0, Some(500), 2500),
                st(5000 * MS, 1, true, 2, None, 1000),
            ],
        );
    }

    #[test]
    fn quantity_zero_reports_without_writing() {
        let p = GcraParams::new(5, 10, span(S)).unwrap();
        run(
            p,
            &[
                // at, qty, allowed, remaining, retry_ms, reset_ms
                st(0, 0, true, 5, None, 0),
                st(0, 2, true, 3, None, 200),
                st(50 * MS, 0, true, 3, None, 150),
                st(100 * MS, 0, true, 4, None, 100),
            ],
        );
    }

    #[test]
    fn quantity_above_burst_is_never_allowed() {
        let p = GcraParams::new(5, 10, span(S)).unwrap();
        run(
            p,
            &[
                // at, qty, allowed, remaining, retry_ms, reset_ms
                st(0, 1, true, 4, None, 100),
                st(0, 6, false, 4, None, 100),
                st(0, 5, false, 4, Some(100), 100),
                st(0, 4, true, 0, None, 500),
            ],
        );
    }

    #[test]
    fn quantity_n_costs_n_intervals() {
        let p = GcraParams::new(10, 1, span(S)).unwrap();
        run(
            p,
            &[
                // at, qty, allowed, remaining, retry_ms, reset_ms
                st(0, 7, true, 3, None, 7000),
                st(0, 4, false, 3, Some(1000), 7000),
                st(1000 * MS, 4, true, 0, None, 10000),
            ],
        );
    }

    #[test]
    fn denied_request_leaves_state_untouched() {
        let p = GcraParams::new(1, 1, span(S)).unwrap();
        let first = decide(&p, None, BASE, GcraRequest::of(1)).unwrap();
        let stored = first.write.unwrap();
        let denied = decide(&p, Some(&stored), at(10), GcraRequest::of(1)).unwrap();
        assert!(denied.write.is_none());
        assert!(!denied.decision.verdict.is_allowed());
    }

    #[test]
    fn clock_stepping_back_never_admits_extra() {
        let p = GcraParams::new(2, 1, span(S)).unwrap();
        let a = decide(&p, None, BASE, GcraRequest::of(2))
            .unwrap()
            .write
            .unwrap();
        // The clock steps back one hour: the stored TAT is far ahead of now.
        let back = BASE.saturating_sub(span(3600 * S));
        let out = decide(&p, Some(&a), back, GcraRequest::of(1)).unwrap();
        assert!(!out.decision.verdict.is_allowed());
        assert_eq!(out.decision.remaining, 0);
        assert_eq!(out.decision.verdict, denied(3601 * S));
    }

    #[test]
    fn raising_the_rate_never_locks_out() {
        // One request per hour, used; the rate becomes one per second: the key is denied for
        // one second (its one request re-expressed), then admits, whatever the old TTL says.
        let hourly = GcraParams::new(1, 1, span(3600 * S)).unwrap();
        let per_second = GcraParams::new(1, 1, span(S)).unwrap();
        let s = decide(&hourly, None, BASE, GcraRequest::of(1))
            .unwrap()
            .write
            .unwrap();
        let out = decide(&per_second, Some(&s), at(10 * MS), GcraRequest::of(1)).unwrap();
        assert_eq!(out.decision.verdict, denied(990 * MS));
        // Denials write nothing, and the conversion does not drift with time.
        let out = decide(&per_second, Some(&s), at(500 * MS), GcraRequest::of(1)).unwrap();
        assert_eq!(out.decision.verdict, denied(500 * MS));
        let out = decide(&per_second, Some(&s), at(S), GcraRequest::of(1)).unwrap();
        assert!(out.decision.verdict.is_allowed());
    }

    #[test]
    fn raising_the_rate_takes_effect_at_once() {
        // 2 of burst 4 used at 1/s → capacity in use 2 requests. At 10/s those 2 requests are
        // 200 ms of TAT, so 2 remain and the key resets in 200 ms.
        let slow = GcraParams::new(4, 1, span(S)).unwrap();
        let fast = GcraParams::new(4, 10, span(S)).unwrap();
        let s = decide(&slow, None, BASE, GcraRequest::of(2))
            .unwrap()
            .write
            .unwrap();
        let out = decide(&fast, Some(&s), BASE, GcraRequest::of(0)).unwrap();
        assert_eq!(out.decision.remaining, 2);
        assert_eq!(out.decision.reset_after, span(200 * MS));
        let out = decide(&fast, Some(&s), BASE, GcraRequest::of(2)).unwrap();
        assert!(out.decision.verdict.is_allowed());
        assert_eq!(out.write.unwrap().emission_interval, span(100 * MS));
    }

    #[test]
    fn lowering_the_burst_keeps_capacity_in_use() {
        let big = GcraParams::new(10, 1, span(S)).unwrap();
        let small = GcraParams::new(3, 1, span(S)).unwrap();
        let s = decide(&big, None, BASE, GcraRequest::of(8))
            .unwrap()
            .write
            .unwrap();
        // 8 in use, capacity now 3: wait until 2 are in use, i.e. 6 s.
        let out = decide(&small, Some(&s), BASE, GcraRequest::of(1)).unwrap();
        assert_eq!(out.decision.verdict, denied(6 * S));
        assert_eq!(out.decision.remaining, 0);
        // Raising the burst again admits at once.
        let out = decide(&big, Some(&s), BASE, GcraRequest::of(2)).unwrap();
        assert!(out.decision.verdict.is_allowed());
    }

    #[test]
    fn reservation_within_max_wait_advances_state() {
        let p = GcraParams::new(1, 1, span(S)).unwrap();
        let s = decide(&p, None, BASE, GcraRequest::of(1))
            .unwrap()
            .write
            .unwrap();
        let req = GcraRequest {
            quantity: 1,
            max_wait: Some(span(1000 * MS)),
        };
        let out = decide(&p, Some(&s), BASE, req).unwrap();
        assert_eq!(out.decision.verdict, Verdict::Reserved { delay: span(S) });
        assert_eq!(out.write.unwrap().tat, at(2 * S));
        let short = GcraRequest {
            quantity: 1,
            max_wait: Some(span(999 * MS)),
        };
        let out = decide(&p, Some(&s), BASE, short).unwrap();
        assert_eq!(out.decision.verdict, denied(S));
        assert!(out.write.is_none());
    }

    #[test]
    fn regression_a_reservation_converts_as_if_it_arrived_when_allowed() {
        // Found by attack testing: a reservation recorded its write at `now`, so a rate
        // change afterwards drained it from `now` and let requests in before the reserved
        // one had acted.
        let p = GcraParams::new(1, 1, span(10 * S)).unwrap();
        let s = decide(&p, None, BASE, GcraRequest::of(1))
            .unwrap()
            .write
            .unwrap();
        let req = GcraRequest {
            quantity: 1,
            max_wait: Some(span(20 * S)),
        };
        let r = decide(&p, Some(&s), BASE, req).unwrap();
        assert_eq!(
            r.decision.verdict,
            Verdict::Reserved {
                delay: span(10 * S)
            }
        );
        let reserved = r.write.unwrap();
        assert_eq!(reserved.updated_at, at(10 * S));
        // At one per second, the reserved request (acting at +10 s) holds the key until +11 s.
        let fast = GcraParams::new(1, 1, span(S)).unwrap();
        let out = decide(&fast, Some(&reserved), BASE, GcraRequest::of(1)).unwrap();
        assert_eq!(out.decision.verdict, denied(11 * S));
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        let p = GcraParams::new(2, 1, span(S)).unwrap();
        // A TAT near the end of time: reports and denials saturate, they never fail.
        let s = GcraState {
            tat: Instant::from_ns(u64::MAX - 1),
            emission_interval: span(S),
            burst: 2,
            updated_at: Instant::EPOCH,
        };
        let out = decide(&p, Some(&s), Instant::EPOCH, GcraRequest::of(1)).unwrap();
        assert!(matches!(out.decision.verdict, Verdict::Denied { .. }));
        let slow = GcraParams::new(2, 1, MAX_PERIOD).unwrap();
        let s = GcraState {
            tat: Instant::MAX,
            emission_interval: span(1),
            burst: 2,
            updated_at: Instant::EPOCH,
        };
        let out = decide(&slow, Some(&s), Instant::EPOCH, GcraRequest::of(0)).unwrap();
        assert_eq!(
            (out.decision.remaining, out.decision.reset_after),
            (0, Span::MAX)
        );
        // Only an admitted request whose TAT leaves 64-bit time is an error.
        let huge = GcraParams::new(u64::MAX, 1_000_000_000, span(S)).unwrap();
        assert_eq!(
            decide(&huge, None, BASE, GcraRequest::of(u64::MAX)),
            Err(Overflow)
        );
    }

    #[test]
    fn force_records_usage_past_the_burst_and_later_requests_wait_for_it() {
        // Burst 5, 1 per second: 12 requests already happened (an estimate of 1 was 13 low).
        let p = GcraParams::new(5, 1, span(S)).unwrap();
        let s = decide(&p, None, BASE, GcraRequest::of(1))
            .unwrap()
            .write
            .unwrap();
        let out = force(&p, Some(&s), BASE, 12).unwrap();
        assert_eq!(out.decision.verdict, Verdict::Allowed);
        assert_eq!(out.decision.remaining, 0);
        assert_eq!(out.decision.reset_after, span(13 * S));
        let forced = out.write.unwrap();
        // 13 s of capacity in use against a 5 s tolerance: the next request waits 9 s.
        let next = decide(&p, Some(&forced), BASE, GcraRequest::of(1)).unwrap();
        assert_eq!(next.decision.verdict, denied(9 * S));
        assert!(decide(&p, Some(&forced), at(9 * S), GcraRequest::of(1))
            .unwrap()
            .decision
            .verdict
            .is_allowed());
        // Past 64-bit time: an error, nothing written.
        assert_eq!(force(&p, None, BASE, u64::MAX), Err(Overflow));
    }

    #[test]
    fn refund_moves_the_tat_back_but_not_before_now() {
        let p = GcraParams::new(5, 1, span(S)).unwrap();
        let s = decide(&p, None, BASE, GcraRequest::of(3))
            .unwrap()
            .write
            .unwrap();
        let (after, n) = refund(&s, BASE, 1);
        assert_eq!((after.unwrap().tat, n), (at(2 * S), 1));
        // 2.5 s in use: a refund of 5 gives back 3 (rounded up) and leaves the key idle.
        let (after, n) = refund(&s, at(500 * MS), 5);
        assert_eq!((after, n), (None, 3));
    }

    #[test]
    fn refund_of_everything_restores_the_state_before_the_requests() {
        let p = GcraParams::new(5, 1, span(S)).unwrap();
        let before = decide(&p, None, BASE, GcraRequest::of(1))
            .unwrap()
            .write
            .unwrap();
        let after = decide(&p, Some(&before), BASE, GcraRequest::of(3))
            .unwrap()
            .write
            .unwrap();
        let (refunded, n) = refund(&after, BASE, 3);
        assert_eq!(n, 3);
        assert_eq!(refunded.unwrap().tat, before.tat);
    }

    fn params_strategy() -> impl Strategy<Value = GcraParams> {
        (1u64..50, 1u64..1000, 1u64..5_000).prop_map(|(burst, rate, period_ms)| {
            GcraParams::new(burst, rate, span(period_ms * MS)).unwrap()
        })
    }

    /// Random timelines: (gap ns, quantity) pairs.
    fn timeline() -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0u64..3 * S, 0u64..6), 1..60)
    }

    proptest! {
        #[test]
        fn waiting_exactly_retry_after_admits_and_1ns_less_does_not(
            p in params_strategy(), steps in timeline(), qty in 1u64..6,
        ) {
            let mut now = BASE;
            let mut stored = None;
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                if let Some(w) = decide(&p, stored.as_ref(), now, GcraRequest::of(q)).unwrap().write {
                    stored = Some(w);
                }
            }
            let out = decide(&p, stored.as_ref(), now, GcraRequest::of(qty)).unwrap();
            check_retry_honest(out.decision.verdict, now, |t| {
                decide(&p, stored.as_ref(), t, GcraRequest::of(qty)).unwrap().decision.verdict
            })?;
        }

        #[test]
        fn after_a_parameter_change_waiting_retry_after_admits(
            p1 in params_strategy(), p2 in params_strategy(), steps in timeline(),
            gap in 0u64..3 * S, qty in 1u64..6,
        ) {
            let mut now = BASE;
            let mut stored = None;
            for (g, q) in steps {
                now = now.saturating_add(span(g));
                if let Some(w) = decide(&p1, stored.as_ref(), now, GcraRequest::of(q)).unwrap().write {
                    stored = Some(w);
                }
            }
            now = now.saturating_add(span(gap));
            let out = decide(&p2, stored.as_ref(), now, GcraRequest::of(qty)).unwrap();
            prop_assert!(out.decision.remaining <= p2.burst);
            if let Verdict::Denied { retry_after } = out.decision.verdict {
                let later = decide(&p2, stored.as_ref(), now.saturating_add(retry_after), GcraRequest::of(qty)).unwrap();
                prop_assert!(later.decision.verdict.is_allowed());
            }
        }

        #[test]
        fn remaining_never_exceeds_burst_and_denials_never_write(
            p in params_strategy(), steps in timeline(),
        ) {
            let mut now = BASE;
            let mut stored = None;
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let out = decide(&p, stored.as_ref(), now, GcraRequest::of(q)).unwrap();
                prop_assert!(out.decision.remaining <= p.burst);
                prop_assert_eq!(out.decision.limit, p.burst);
                if !out.decision.verdict.is_allowed() || q == 0 {
                    prop_assert!(out.write.is_none());
                } else {
                    prop_assert!(out.write.is_some());
                    stored = out.write;
                }
            }
        }

        #[test]
        fn admitted_never_exceeds_burst_plus_rate_times_elapsed(
            p in params_strategy(), steps in timeline(),
        ) {
            // Over any interval [a, b] of request instants, admitted ≤ burst + (b − a) / T.
            let mut now = BASE;
            let mut stored = None;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let out = decide(&p, stored.as_ref(), now, GcraRequest::of(q)).unwrap();
                if out.write.is_some() {
                    stored = out.write;
                    admitted.push((now.as_ns(), q));
                }
            }
            for i in 0..admitted.len() {
                let mut total = 0u128;
                for j in i..admitted.len() {
                    total += u128::from(admitted[j].1);
                    let elapsed = u128::from(admitted[j].0 - admitted[i].0);
                    let bound = u128::from(p.burst) + elapsed / u128::from(p.emission_interval.as_ns());
                    prop_assert!(total <= bound, "{} admitted in {} ns", total, elapsed);
                }
            }
        }

        #[test]
        fn reservations_executed_at_their_delay_respect_the_rate(
            p in params_strategy(), steps in timeline(), max_wait_ms in 0u64..5_000,
        ) {
            let mut now = BASE;
            let mut stored = None;
            let mut executions: Vec<(u64, u64)> = Vec::new();
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let req = GcraRequest { quantity: q, max_wait: Some(span(max_wait_ms * MS)) };
                let out = decide(&p, stored.as_ref(), now, req).unwrap();
                if let (Some(w), Verdict::Reserved { delay }) = (out.write, out.decision.verdict) {
                    prop_assert!(delay <= span(max_wait_ms * MS));
                    stored = Some(w);
                    executions.push((now.as_ns() + delay.as_ns(), q));
                }
            }
            executions.sort_unstable();
            for i in 0..executions.len() {
                let mut total = 0u128;
                for j in i..executions.len() {
                    total += u128::from(executions[j].1);
                    let elapsed = u128::from(executions[j].0 - executions[i].0);
                    let bound = u128::from(p.burst) + elapsed / u128::from(p.emission_interval.as_ns());
                    prop_assert!(total <= bound);
                }
            }
        }
    }
}
