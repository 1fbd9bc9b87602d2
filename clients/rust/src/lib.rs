//! Fleet-wide rate limiting in Redis for Rust services: a client for the redis-rl module's
//! commands (with the project's Lua fallback where the module cannot be loaded), a failure
//! policy for when Redis does not answer, a local fast path, and a tower [`RateLimitLayer`]
//! for axum, hyper and any tower HTTP service.
//!
//! An in-process limiter (`governor`, `tower-governor`) behind a load balancer with N
//! replicas gives every client N times its quota. Here the state lives in Redis, where every
//! replica decides against the same counter, in one atomic command per decision.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use redis_rl_client::{FailurePolicy, Gcra, Limiter};
//!
//! let limiter = Limiter::builder("redis://127.0.0.1:6379/")
//!     .on_error(FailurePolicy::Open)
//!     .build()
//!     .await?;
//! let d = limiter.check("user:42", Gcra::new(10, 5, 1)?).await?;
//! if !d.allowed {
//!     let status = if d.never() { 413 } else { 429 };
//!     let headers = d.headers(Some("api")); // Retry-After, RateLimit-Policy, RateLimit
//!     # let _ = (status, headers);
//! }
//! # Ok(()) }
//! ```
//!
//! The crate implements the project's client contract (`docs/clients.md` in the repository): the same limits,
//! decisions, failure policy, fast path and HTTP answers as the Python package
//! (`clients/python`), so services in both languages can share keys. See the crate's
//! README for the decisions, the measured figures, and the comparison with
//! `tower-governor`.
//!
//! Features: `axum` (default) reads axum's `ConnectInfo<SocketAddr>` and `MatchedPath` in
//! the layer. Without it the layer works with any tower HTTP service (plain hyper included).
#![warn(missing_docs)]

mod decision;
mod error;
pub mod http;
mod layer;
mod lease;
mod limiter;
mod limits;
mod local;
mod memory;
mod policy;
mod protocol;

pub use decision::{Decision, HeaderOptions, RetryAfter, Source};
pub use error::Error;
pub use layer::{request_info, Denial, RateLimit, RateLimitLayer, ReportedCost};
pub use lease::{Acquire, LeaseGuard, LeaseLost, LostReason};
pub use limiter::{Check, CheckAll, Entry, Limiter, LimiterBuilder, Refund, Release};
pub use limits::{
    format_seconds, parse_limits, parse_limits_with, Algorithm, Gcra, IntoSeconds, InvalidLimit,
    Lease, Limit, LimitAlgorithm, Window, MAX_SECONDS,
};
pub use policy::{CounterSnapshot, Counters, FailurePolicy, Hook, COUNTER_NAMES};
pub use protocol::{Connection, Mode, LIBRARY_NAME, LUA_LIBRARY};

// The README's snippets are compiled as doc tests (`cargo test --doc`), so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Builds a cluster-safe key: `tag("user42", &["rpm"]) == "{user42}:rpm"`.
///
/// Keys built with one hash tag live in one Redis Cluster slot, as
/// [`Limiter::check_all`] and a lease used with other limits need. The tag may not be empty
/// or hold braces.
///
/// ```
/// assert_eq!(redis_rl_client::tag("user42", &["rpm"]).unwrap(), "{user42}:rpm");
/// assert!(redis_rl_client::tag("a{b", &[]).is_err());
/// ```
pub fn tag(hash_tag: &str, parts: &[&str]) -> Result<String, Error> {
    if hash_tag.is_empty() || hash_tag.contains('{') || hash_tag.contains('}') {
        return Err(Error::Usage(
            "hash tag must be non-empty and hold no braces".into(),
        ));
    }
    let mut out = format!("{{{hash_tag}}}");
    for p in parts {
        out.push(':');
        out.push_str(p);
    }
    Ok(out)
}
