//! The outcome of one limiting request, shared by every algorithm.

/// Verdict says whether a request passes, and if not, when it could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted now.
    Allowed,
    /// Admitted as a reservation (`MAXWAIT`): the client may act after `delay_ns`
    /// (0 when no wait is needed).
    Reserved {
        /// Nanoseconds the client must wait before acting.
        delay_ns: u64,
    },
    /// Denied; the same request would be admitted after `retry_after_ns` (> 0).
    Denied {
        /// Nanoseconds until this same request would be admitted.
        retry_after_ns: u64,
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

/// Decision is everything a limiting command replies with, in nanoseconds; the Redis layer
/// rounds durations up to milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Allowed or not, and when to retry.
    pub verdict: Verdict,
    /// The most requests an idle key admits at once (burst / limit).
    pub limit: u64,
    /// Requests of quantity 1 still admitted right now, after this one; never negative.
    pub remaining: u64,
    /// Nanoseconds until the key is back to its idle state; 0 for an idle key.
    pub reset_after_ns: u64,
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
