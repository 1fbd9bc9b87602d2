//! The limiting algorithms, each a pure function of (parameters, stored state, now, request).

pub mod fixed_window;
pub mod gcra;
pub mod lease;
pub mod sliding_log;
pub mod sliding_window;

/// Test helpers shared by the algorithms' property tests.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    use crate::decision::{Outcome, Verdict};
    use crate::time::{Instant, Span, NANOS_PER_MILLI, NANOS_PER_SEC};

    /// One millisecond, in ns (for offsets in tables).
    pub const MS: u64 = NANOS_PER_MILLI;
    /// One second, in ns.
    pub const S: u64 = NANOS_PER_SEC;
    /// An arbitrary epoch instant for timelines (2026-11-30T00:00:00Z); a window boundary
    /// for every window length the tests use.
    pub const BASE: Instant = Instant::from_ns(1_795_996_800 * S);

    /// The instant `offset_ns` after [`BASE`].
    pub fn at(offset_ns: u64) -> Instant {
        BASE.saturating_add(Span::from_ns(offset_ns))
    }

    /// A span of `ns` nanoseconds.
    pub fn span(ns: u64) -> Span {
        Span::from_ns(ns)
    }

    /// A denial with `retry_after` of `ns` nanoseconds.
    pub fn denied(ns: u64) -> Verdict {
        Verdict::Denied {
            retry_after: Span::from_ns(ns),
        }
    }

    /// One step of a timeline table: at `at` ns after [`BASE`], request `qty`; expect these
    /// reply fields (`retry_ms: None` is -1 in the reply).
    pub struct Step {
        /// Offset from [`BASE`], ns.
        pub at: u64,
        /// QUANTITY of the request.
        pub qty: u64,
        /// Expected `allowed`.
        pub allowed: bool,
        /// Expected `remaining`.
        pub remaining: u64,
        /// Expected `retry_after_ms` (None: -1).
        pub retry_ms: Option<u64>,
        /// Expected `reset_after_ms`.
        pub reset_ms: u64,
    }

    /// Shorthand for a [`Step`]; tables that use it start with a header comment naming the
    /// columns: `at, qty, allowed, remaining, retry_ms, reset_ms`.
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
            Verdict::Denied { retry_after } => Some(retry_after.ceil_ms()),
            Verdict::Reserved { delay } => Some(delay.ceil_ms()),
            Verdict::Allowed | Verdict::Never => None,
        }
    }

    /// Runs a timeline table through a decide function whose write is the next state,
    /// reporting the failing step's index. Only admitted requests of quantity > 0 write.
    pub fn run_table<S>(
        limit: u64,
        steps: &[Step],
        decide: impl Fn(Option<&S>, Instant, u64) -> Outcome<S>,
    ) {
        let mut stored = None;
        for (i, step) in steps.iter().enumerate() {
            let out = decide(stored.as_ref(), at(step.at), step.qty);
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
                d.reset_after.ceil_ms(),
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

    /// Replays `steps` from [`BASE`] through a decide function whose write is the next
    /// state; checks `remaining ≤ limit` on the way; returns the final state and instant.
    pub fn replay<S>(
        steps: &[(u64, u64)],
        limit: u64,
        decide: impl Fn(Option<&S>, Instant, u64) -> Outcome<S>,
    ) -> Result<(Option<S>, Instant), TestCaseError> {
        let mut now = BASE;
        let mut stored = None;
        for &(gap, q) in steps {
            now = now.saturating_add(span(gap));
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
        now: Instant,
        verdict_at: impl Fn(Instant) -> Verdict,
    ) -> Result<(), TestCaseError> {
        if let Verdict::Denied { retry_after } = verdict {
            prop_assert!(!retry_after.is_zero());
            let then = now.saturating_add(retry_after);
            prop_assert!(
                verdict_at(then).is_allowed(),
                "retry {:?} not enough",
                retry_after
            );
            prop_assert!(
                !verdict_at(then.saturating_sub(span(1))).is_allowed(),
                "retry {:?} too late",
                retry_after
            );
        }
        Ok(())
    }
}
