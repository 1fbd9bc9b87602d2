//! The limiting algorithms, each a pure function of (parameters, stored state, now, request).

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;

/// Test helpers shared by the algorithms' property tests.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    use crate::decision::{Outcome, Verdict};
    use crate::time::ceil_ms;

    /// One step of a timeline table: at `at` ns after the table's start, request `qty`;
    /// expect these reply fields (`retry_ms: None` is -1 in the reply).
    pub struct Step {
        pub at: u64,
        pub qty: u64,
        pub allowed: bool,
        pub remaining: u64,
        pub retry_ms: Option<u64>,
        pub reset_ms: u64,
    }

    /// Shorthand for a [`Step`].
    pub fn st(
        at: u64,
        qty: u64,
        allowed: bool,
        remaining: u64,
        retry_ms: Option<u64>,
        reset_ms: u64,
    ) -> Step {
        Step {
            at,
            qty,
            allowed,
            remaining,
            retry_ms,
            reset_ms,
        }
    }

    /// The retry field as a reply shows it in ms (reservations show their delay).
    pub fn retry_ms(verdict: Verdict) -> Option<u64> {
        match verdict {
            Verdict::Denied { retry_after_ns } => Some(ceil_ms(retry_after_ns)),
            Verdict::Reserved { delay_ns } => Some(ceil_ms(delay_ns)),
            Verdict::Allowed | Verdict::Never => None,
        }
    }

    /// Runs a timeline table through a decide function whose write is the next state,
    /// reporting the failing step's index. Only admitted requests of quantity > 0 write.
    pub fn run_table<S>(
        start: u64,
        limit: u64,
        steps: &[Step],
        decide: impl Fn(Option<&S>, u64, u64) -> Outcome<S>,
    ) {
        let mut stored = None;
        for (i, step) in steps.iter().enumerate() {
            let out = decide(stored.as_ref(), start + step.at, step.qty);
            let d = out.decision;
            assert_eq!(d.verdict.is_allowed(), step.allowed, "step {i}: allowed");
            assert_eq!(d.limit, limit, "step {i}: limit");
            assert_eq!(d.remaining, step.remaining, "step {i}: remaining");
            assert_eq!(
                retry_ms(d.verdict),
                step.retry_ms,
                "step {i}: retry_after_ms"
            );
            assert_eq!(
                ceil_ms(d.reset_after_ns),
                step.reset_ms,
                "step {i}: reset_after_ms"
            );
            assert_eq!(
                out.write.is_some(),
                step.allowed && step.qty > 0,
                "step {i}: write"
            );
            if out.write.is_some() {
                stored = out.write;
            }
        }
    }

    /// Random timelines: `(gap_ns, quantity)` steps.
    pub fn timeline(
        max_gap_ns: u64,
        max_qty: u64,
        max_len: usize,
    ) -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0..max_gap_ns, 0..max_qty), 1..max_len)
    }

    /// Replays `steps` from `start` through a decide function whose write is the next state;
    /// checks `remaining ≤ limit` on the way; returns the final state and instant.
    pub fn replay<S>(
        steps: &[(u64, u64)],
        start: u64,
        limit: u64,
        decide: impl Fn(Option<&S>, u64, u64) -> crate::decision::Outcome<S>,
    ) -> Result<(Option<S>, u64), TestCaseError> {
        let mut now = start;
        let mut stored = None;
        for &(gap, q) in steps {
            now += gap;
            let out = decide(stored.as_ref(), now, q);
            prop_assert!(out.decision.remaining <= limit);
            if out.write.is_some() {
                stored = out.write;
            }
        }
        Ok((stored, now))
    }

    /// Checks `retry_after` honesty for a request denied at `now`: at `now + retry_after` the
    /// same request passes, 1 ns earlier it does not. `verdict_at` decides the request at an
    /// instant against the same stored state.
    pub fn check_retry_honest(
        verdict: Verdict,
        now: u64,
        verdict_at: impl Fn(u64) -> Verdict,
    ) -> Result<(), TestCaseError> {
        if let Verdict::Denied { retry_after_ns } = verdict {
            prop_assert!(retry_after_ns > 0);
            prop_assert!(
                verdict_at(now + retry_after_ns).is_allowed(),
                "retry {} not enough",
                retry_after_ns
            );
            prop_assert!(
                !verdict_at(now + retry_after_ns - 1).is_allowed(),
                "retry {} too late",
                retry_after_ns
            );
        }
        Ok(())
    }
}
