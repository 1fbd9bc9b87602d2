//! The outcome of one limiting request, shared by every algorithm.

use crate::time::Span;

/// Verdict says whether a request passes, and if not, when it could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted now.
    Allowed,
    /// Admitted as a reservation (`MAXWAIT`): the client may act after `delay`
    /// (0 when no wait is needed).
    Reserved {
        /// How long the client must wait before acting.
        delay: Span,
    },
    /// Denied; the same request would be admitted after `retry_after` (> 0).
    Denied {
        /// Time until this same request would be admitted.
        retry_after: Span,
    },
    /// Denied, and it can never be admitted (quantity above the limit).
    Never,
}

impl Verdict {
    /// Returns true for [`Verdict::Allowed`] and [`Verdict::Reserved`].
    pub fn is_allowed(self) -> bool {
        matches!(self, Self::Allowed | Self::Reserved { .. })
    }
}

/// Decision is everything a limiting command replies with; the Redis layer rounds durations
/// up to milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Allowed or not, and when to retry.
    pub verdict: Verdict,
    /// The most requests an idle key admits at once (burst / limit).
    pub limit: u64,
    /// Requests of quantity 1 still admitted right now, after this one; never negative.
    pub remaining: u64,
    /// Time until the key is back to its idle state; zero for an idle key.
    pub reset_after: Span,
}

/// Combines the decisions of several limits on one request (the RL.ALL combine rule,
/// `docs/reference.md#r-all-3`, with the binding limit of `docs/reference.md#r-cost-3` and the
/// reported-only limits of `docs/reference.md#r-cost-2`), each with the charge it was asked
/// (`QUANTITY`, or its `COST`).
///
/// Only charged limits (charge > 0) take part, unless none is charged (then all do): the
/// request is allowed only if every charged limit allows; `Never` if any can never pass;
/// otherwise, when denied, the longest `retry_after` among the denying limits; the longest
/// `reset_after`. The *binding* limit, whose `limit` and `remaining` the combined decision
/// reports, is the one that would admit the fewest further calls of this shape: the smallest
/// `remaining / charge`, ties to the smaller `remaining`, then to the first. With equal
/// charges this is the limit with the smallest `remaining`. An empty slice combines to an
/// allowed decision with limit 0.
pub fn combine(decisions: &[(Decision, u64)]) -> Decision {
    let any_charged = decisions.iter().any(|&(_, charge)| charge > 0);
    let taking_part = || {
        decisions
            .iter()
            .filter(move |&&(_, charge)| charge > 0 || !any_charged)
    };
    let binding = taking_part()
        .enumerate()
        .min_by_key(|&(i, &(d, charge))| {
            let calls_left = d.remaining.checked_div(charge).unwrap_or(d.remaining);
            (calls_left, d.remaining, i)
        })
        .map(|(_, &(d, _))| d);
    let verdict = if taking_part().all(|(d, _)| d.verdict.is_allowed()) {
        Verdict::Allowed
    } else if taking_part().any(|(d, _)| d.verdict == Verdict::Never) {
        Verdict::Never
    } else {
        let retry_after = taking_part()
            .filter_map(|(d, _)| match d.verdict {
                Verdict::Denied { retry_after } => Some(retry_after),
                _ => None,
            })
            .max()
            .unwrap_or(Span::from_ns(1));
        Verdict::Denied { retry_after }
    };
    Decision {
        verdict,
        limit: binding.map_or(0, |d| d.limit),
        remaining: binding.map_or(0, |d| d.remaining),
        reset_after: taking_part()
            .map(|(d, _)| d.reset_after)
            .max()
            .unwrap_or(Span::ZERO),
    }
}

/// Outcome pairs a [`Decision`] with the state to store; `write` is `None` for every request
/// that must not change the key (denied, `QUANTITY 0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<S> {
    /// What to reply.
    pub decision: Decision,
    /// The new state to store (absent: store nothing).
    pub write: Option<S>,
}

/// Overflow reports that a request's time arithmetic would leave 64-bit nanoseconds; the
/// request is rejected and nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "arithmetic overflow: QUANTITY, period and rate would move the key's time past \
             64-bit nanoseconds",
        )
    }
}

impl std::error::Error for Overflow {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::gcra::{self, GcraRequest};
    use crate::algo::sliding_log::{self, LogState};
    use crate::algo::testing::{span, BASE, S};
    use crate::params::{GcraParams, WindowParams};
    use crate::time::Instant;
    use proptest::prelude::*;

    fn d(verdict: Verdict, limit: u64, remaining: u64, reset_after_ns: u64) -> Decision {
        Decision {
            verdict,
            limit,
            remaining,
            reset_after: Span::from_ns(reset_after_ns),
        }
    }

    fn denied(retry_after_ns: u64) -> Verdict {
        Verdict::Denied {
            retry_after: Span::from_ns(retry_after_ns),
        }
    }

    #[test]
    fn combine_follows_the_binding_limit() {
        let a = d(Verdict::Allowed, 10, 4, 100);
        let b = d(denied(50), 3, 0, 300);
        let c = d(denied(70), 5, 1, 200);
        assert_eq!(combine(&[(a, 1), (b, 1), (c, 1)]), d(denied(70), 3, 0, 300));
        assert_eq!(combine(&[(a, 1), (a, 1)]), d(Verdict::Allowed, 10, 4, 100));
        let never = d(Verdict::Never, 2, 2, 0);
        assert_eq!(
            combine(&[(a, 1), (b, 1), (never, 1)]).verdict,
            Verdict::Never
        );
    }

    #[test]
    fn the_binding_limit_is_the_one_that_admits_the_fewest_further_calls() {
        // 599 requests and 1,000 tokens left: a 1,200-token call is bound by tokens.
        let rpm = d(Verdict::Allowed, 600, 599, 100);
        let tpm = d(denied(30), 90_000, 1_000, 200);
        let both = combine(&[(rpm, 1), (tpm, 1200)]);
        assert_eq!((both.limit, both.remaining), (90_000, 1_000));
        assert_eq!(both.verdict, denied(30));
        // A COST 0 limit is only reported: it never denies, nor binds.
        let spent = d(denied(5), 10, 0, 900);
        let reported = combine(&[(rpm, 1), (spent, 0)]);
        assert_eq!(reported, d(Verdict::Allowed, 600, 599, 100));
        // Every limit at COST 0 (or QUANTITY 0): all take part, the smallest remaining binds.
        assert_eq!(combine(&[(rpm, 0), (spent, 0)]).remaining, 0);
    }

    proptest! {
        /// Per-user GCRA and per-IP LOG together, all-or-nothing: a denial consumes from
        /// neither, and each limit on its own never admits more than it allows.
        #[test]
        fn all_or_nothing_never_consumes_when_one_denies(
            steps in prop::collection::vec((0u64..400_000_000, 1u64..4), 1..80),
        ) {
            let user = GcraParams::new(5, 2, span(S)).unwrap();
            let ip = WindowParams::new(4, span(S)).unwrap();
            let mut now = BASE;
            let mut user_state = None;
            let mut ip_state: Option<LogState> = None;
            let mut admitted: Vec<(Instant, u64)> = Vec::new();
            for (gap, q) in steps {
                now = now.saturating_add(span(gap));
                let u = gcra::decide(&user, user_state.as_ref(), now, GcraRequest::of(q)).unwrap();
                let i = sliding_log::decide(&ip, ip_state.as_ref(), now, q).unwrap();
                let both = combine(&[(u.decision, q), (i.decision, q)]);
                prop_assert_eq!(both.verdict.is_allowed(), u.decision.verdict.is_allowed() && i.decision.verdict.is_allowed());
                if both.verdict.is_allowed() {
                    user_state = u.write;
                    ip_state.get_or_insert_with(|| LogState::new(&ip)).apply(&i.write.unwrap());
                    admitted.push((now, q));
                }
            }
            // The LOG limit holds in every trailing window of admitted requests.
            for &(end, _) in &admitted {
                let n: u64 = admitted.iter().filter(|(t, _)| *t <= end && t.saturating_add(ip.window) > end).map(|x| x.1).sum();
                prop_assert!(n <= ip.limit);
            }
        }
    }
}
