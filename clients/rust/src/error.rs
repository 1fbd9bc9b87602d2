//! The crate's error type.

use std::fmt;

use crate::decision::Decision;
use crate::lease::LeaseLost;
use crate::limits::InvalidLimit;

/// What a limiter call can fail with.
///
/// A Redis *outage* (connection refused or lost, timeout, failover, `OOM`, `LOADING`,
/// `CLUSTERDOWN`, …) is answered by the failure policy: it is an error only under
/// [`FailurePolicy::Error`](crate::FailurePolicy::Error), as [`Error::Unavailable`]. A
/// *misuse* (a wrong argument, `WRONGTYPE`, `CROSSSLOT`) is always an error,
/// [`Error::Redis`] or [`Error::InvalidLimit`], whatever the policy.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A limit or an argument breaks the module's rules (the module's message).
    InvalidLimit(InvalidLimit),
    /// A call the API does not allow (e.g. `check` with a [`Lease`](crate::Lease), an empty
    /// key, `max_wait` on a window).
    Usage(String),
    /// Redis did not answer and the failure policy is
    /// [`FailurePolicy::Error`](crate::FailurePolicy::Error). Holds the cause.
    Unavailable(redis::RedisError),
    /// Redis answered with an error that is not an outage: `WRONGTYPE`, a server-side
    /// validation (e.g. a LOG limit above `rl.log-max-limit`), `CROSSSLOT`.
    Redis(redis::RedisError),
    /// [`Limiter::acquire`](crate::Limiter::acquire) found no free slot; the decision says
    /// when one may be.
    RateLimited(Box<Decision>),
    /// The fallback library is not loaded on the server and loading it is not allowed
    /// (`load_library(false)`).
    Library(String),
    /// A lease was lost while held ([`LeaseGuard`](crate::LeaseGuard)): returned by
    /// [`LeaseGuard::release`](crate::LeaseGuard::release) and `renew`, so that work that
    /// ran without its slot is never reported as guarded.
    LeaseLost(LeaseLost),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidLimit(e) => write!(f, "invalid limit: {e}"),
            Error::Usage(m) => f.write_str(m),
            Error::Unavailable(e) => write!(f, "Redis unavailable: {e}"),
            Error::Redis(e) => write!(f, "Redis error: {e}"),
            Error::RateLimited(d) => match d.retry_after.duration() {
                Some(w) => write!(f, "rate limit exceeded (retry after {w:?})"),
                None => f.write_str("request can never pass: it asks for more than the limit"),
            },
            Error::Library(m) => f.write_str(m),
            Error::LeaseLost(l) => l.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidLimit(e) => Some(e),
            Error::Unavailable(e) | Error::Redis(e) => Some(e),
            Error::LeaseLost(l) => Some(l),
            _ => None,
        }
    }
}

impl From<InvalidLimit> for Error {
    fn from(e: InvalidLimit) -> Error {
        Error::InvalidLimit(e)
    }
}

/// Whether a Redis error is an outage (the failure policy answers it) rather than a misuse.
pub(crate) fn is_unavailable(e: &redis::RedisError) -> bool {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.kind(), redis::ErrorKind::ClusterConnectionNotFound)
    {
        return true;
    }
    matches!(
        e.code(),
        Some("OOM" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "READONLY")
    )
}
