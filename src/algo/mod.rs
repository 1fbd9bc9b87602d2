//! The limiting algorithms, each a pure function of (parameters, stored state, now, request).

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;

/// Test helpers shared by the algorithms' property tests.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    use crate::decision::Verdict;

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
