//! Failure policy, counters, and the health state that logs once per burst of failures.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::decision::{Decision, RetryAfter, Source};
use crate::error::Error;
use crate::limits::Limit;

/// What a check answers when Redis does not.
///
/// Redis not answering means: connection refused or lost, a timeout, a failover in progress,
/// out of memory, cluster down. A wrong argument or `WRONGTYPE` is not an outage and is
/// returned as [`Error::Redis`] whatever the policy.
///
/// ```no_run
/// # async fn demo() -> Result<(), redis_rl_client::Error> {
/// use redis_rl_client::{FailurePolicy, Limiter};
///
/// // API quotas: serve everyone while Redis is down.
/// let quotas = Limiter::builder("redis://127.0.0.1:6379/").build().await?;
/// // Logins: deny (503 from the layer) while Redis is down.
/// let logins = Limiter::builder("redis://127.0.0.1:6379/")
///     .on_error(FailurePolicy::Closed)
///     .build()
///     .await?;
/// # let _ = (quotas, logins);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailurePolicy {
    /// Allow, with `degraded = true`. For limits that protect **cost or fairness** (API
    /// quotas, expensive endpoints): while Redis is down, serving everyone is better than
    /// serving no one.
    #[default]
    Open,
    /// Deny with a short `retry_after` (`closed_retry_after`, 1 s by default),
    /// `degraded = true`. For limits that protect **security** (logins, one-time codes,
    /// password resets): an outage must not open the door to brute force.
    Closed,
    /// Return [`Error::Unavailable`] and let the application decide.
    Error,
    /// Enforce the same limits in this process's memory, with the module's own algorithms,
    /// while Redis is unreachable (each limit divided by
    /// [`fleet_size`](crate::LimiterBuilder::fleet_size) if set, rounding down, at least 1):
    /// decisions are `degraded` with [`Source::Local`] (not [`Decision::blind`]), and
    /// their numbers (and HTTP fields) are the local limiter's real ones. The first call
    /// after Redis answers again is decided by Redis. For limits that must keep holding
    /// through an outage without denying everyone: each process admits at most its share.
    Local,
}

/// The counter names, in the order [`CounterSnapshot`] lists them.
pub const COUNTER_NAMES: [&str; 14] = [
    "allowed",
    "denied",
    "allowed_locally",
    "denied_locally",
    "degraded",
    "errors",
    "redis_calls",
    "refunded",
    "local",
    "skipped",
    "missing_denied",
    "leases_lost",
    "forwarded_unusable",
    "peer_unknown",
];

/// A hook called as `hook(counter_name, n)` on every counter increment (for a metrics
/// library); it must be cheap and must not panic.
pub type Hook = Arc<dyn Fn(&'static str, u64) + Send + Sync>;

/// Counts decisions and Redis calls; lock-free, readable at any time.
///
/// * `allowed` / `denied`: every decision returned (local and degraded ones included).
/// * `allowed_locally`: admitted from a batch credit, without a Redis call.
/// * `denied_locally`: denied by the deny cache, without a Redis call.
/// * `degraded`: answered by the failure policy.
/// * `errors`: Redis calls that failed (connect, timeout, OOM, failover), and reported costs
///   the layer could not record in full ([`ReportedCost`](crate::ReportedCost) beyond the
///   limit's arithmetic).
/// * `redis_calls`: Redis calls made (one per round trip).
/// * `refunded`: units given back (`refund`, batch leftovers, the layer's `deduct_when`
///   and reported costs), counted before the refund is sent.
/// * `skipped`: limits not applied to a request ([`Missing::Skip`](crate::http::Missing)).
/// * `missing_denied`: requests answered 401 for want of an identity
///   ([`Missing::Deny`](crate::http::Missing)).
/// * `local`: decisions made by the in-memory limiter of [`FailurePolicy::Local`].
/// * `leases_lost`: leases found lost (a `LEASELOST` renewal, or no renewal reaching Redis
///   for a whole lease time).
/// * `forwarded_unusable`: requests whose forwarding header was unusable (the peer was taken
///   as the client).
/// * `peer_unknown`: requests with no usable client address (no peer address, e.g. a Unix
///   socket, and no trusted forwarding header), whose IP limits counted in the one shared
///   bucket `ip:unknown`.
///
/// ```no_run
/// # async fn demo() -> Result<(), redis_rl_client::Error> {
/// use redis_rl_client::Limiter;
///
/// let limiter = Limiter::builder("redis://127.0.0.1:6379/")
///     .hook(|name, n| {
///         // e.g. increment a Prometheus counter labelled `name` by `n`
///         # let _ = (name, n);
///     })
///     .build()
///     .await?;
/// let c = limiter.counters().snapshot();
/// let hit_rate = c.denied_locally as f64 / c.denied.max(1) as f64;
/// # let _ = hit_rate;
/// # Ok(()) }
/// ```
pub struct Counters {
    values: [AtomicU64; 14],
    hook: Option<Hook>,
}

impl fmt::Debug for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// A copy of every counter (see [`Counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterSnapshot {
    /// Decisions that allowed.
    pub allowed: u64,
    /// Decisions that denied.
    pub denied: u64,
    /// Admitted from a batch credit, without a Redis call.
    pub allowed_locally: u64,
    /// Denied by the deny cache, without a Redis call.
    pub denied_locally: u64,
    /// Answered by the failure policy.
    pub degraded: u64,
    /// Redis calls that failed.
    pub errors: u64,
    /// Redis calls made.
    pub redis_calls: u64,
    /// Units given back.
    pub refunded: u64,
    /// Limits not applied ([`Missing::Skip`](crate::http::Missing)).
    pub skipped: u64,
    /// Requests answered 401 for want of an identity.
    pub missing_denied: u64,
    /// Decisions of the in-memory limiter ([`FailurePolicy::Local`]).
    pub local: u64,
    /// Leases found lost.
    pub leases_lost: u64,
    /// Requests whose forwarding header was unusable.
    pub forwarded_unusable: u64,
    /// Requests with no usable client address (keyed `ip:unknown`).
    pub peer_unknown: u64,
}

#[derive(Clone, Copy)]
pub(crate) enum Counter {
    Allowed = 0,
    Denied = 1,
    AllowedLocally = 2,
    DeniedLocally = 3,
    Degraded = 4,
    Errors = 5,
    RedisCalls = 6,
    Refunded = 7,
    Local = 8,
    Skipped = 9,
    MissingDenied = 10,
    LeasesLost = 11,
    ForwardedUnusable = 12,
    PeerUnknown = 13,
}

impl Counters {
    pub(crate) fn new(hook: Option<Hook>) -> Counters {
        Counters {
            values: Default::default(),
            hook,
        }
    }

    pub(crate) fn add(&self, c: Counter, n: u64) {
        self.values[c as usize].fetch_add(n, Ordering::Relaxed);
        if let Some(hook) = &self.hook {
            hook(COUNTER_NAMES[c as usize], n);
        }
    }

    /// One counter by name (see [`COUNTER_NAMES`]); `None` for an unknown name.
    pub fn get(&self, name: &str) -> Option<u64> {
        let i = COUNTER_NAMES.iter().position(|n| *n == name)?;
        Some(self.values[i].load(Ordering::Relaxed))
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> CounterSnapshot {
        let v = |c: Counter| self.values[c as usize].load(Ordering::Relaxed);
        CounterSnapshot {
            allowed: v(Counter::Allowed),
            denied: v(Counter::Denied),
            allowed_locally: v(Counter::AllowedLocally),
            denied_locally: v(Counter::DeniedLocally),
            degraded: v(Counter::Degraded),
            errors: v(Counter::Errors),
            redis_calls: v(Counter::RedisCalls),
            refunded: v(Counter::Refunded),
            skipped: v(Counter::Skipped),
            missing_denied: v(Counter::MissingDenied),
            local: v(Counter::Local),
            leases_lost: v(Counter::LeasesLost),
            forwarded_unusable: v(Counter::ForwardedUnusable),
            peer_unknown: v(Counter::PeerUnknown),
        }
    }

    pub(crate) fn count_decision(&self, d: &Decision) {
        self.add(
            if d.allowed {
                Counter::Allowed
            } else {
                Counter::Denied
            },
            1,
        );
        if d.degraded {
            self.add(Counter::Degraded, 1);
        }
    }
}

struct Outage {
    started: Instant,
    failures: u64,
    next_probe: Instant,
}

/// Tracks Redis failures: one `tracing` event per burst, a probe interval, recovery.
///
/// While Redis is failing, calls within `probe_interval` of the last failure are answered by
/// the policy without waiting on Redis; the first call after it tries Redis again. The first
/// success after a failure emits one recovery event.
pub(crate) struct Health {
    pub(crate) policy: FailurePolicy,
    probe_interval: Duration,
    pub(crate) closed_retry_after: Duration,
    outage: Mutex<Option<Outage>>,
}

impl Health {
    pub(crate) fn new(
        policy: FailurePolicy,
        probe_interval: Duration,
        closed_retry_after: Duration,
    ) -> Health {
        Health {
            policy,
            probe_interval,
            closed_retry_after,
            outage: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Outage>> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether to answer by policy without trying Redis (inside the probe interval).
    pub(crate) fn skip(&self) -> bool {
        let mut guard = self.lock();
        let Some(outage) = guard.as_mut() else {
            return false;
        };
        let now = Instant::now();
        if now < outage.next_probe {
            return true;
        }
        outage.next_probe = now + self.probe_interval; // this caller probes
        false
    }

    pub(crate) fn success(&self) {
        let ended = self.lock().take();
        if let Some(outage) = ended {
            tracing::warn!(
                target: "redis_rl_client",
                failures = outage.failures,
                seconds = outage.started.elapsed().as_secs_f64(),
                "redis-rl: Redis answers again after {} failed call(s) over {:.1} s; \
                 decisions come from Redis again",
                outage.failures,
                outage.started.elapsed().as_secs_f64(),
            );
        }
    }

    pub(crate) fn failure(&self, counters: &Counters, cause: &redis::RedisError) {
        counters.add(Counter::Errors, 1);
        let now = Instant::now();
        let first = {
            let mut guard = self.lock();
            match guard.as_mut() {
                None => {
                    *guard = Some(Outage {
                        started: now,
                        failures: 1,
                        next_probe: now + self.probe_interval,
                    });
                    true
                }
                Some(o) => {
                    o.failures += 1;
                    o.next_probe = now + self.probe_interval;
                    false
                }
            }
        };
        if first {
            tracing::warn!(
                target: "redis_rl_client",
                error = %cause,
                policy = ?self.policy,
                "redis-rl: Redis unavailable ({cause}); policy {:?} until it answers \
                 (logged once per outage)",
                self.policy,
            );
        }
    }

    /// The policy's decision (or the error, for [`FailurePolicy::Error`]).
    pub(crate) fn answer(
        &self,
        limit: Option<&Limit>,
        key: Option<&str>,
        cause: Option<&redis::RedisError>,
    ) -> Result<Decision, Error> {
        let cap = limit.map_or(0, Limit::capacity);
        let (allowed, wait) = match self.policy {
            FailurePolicy::Error => {
                let e = cause.cloned().unwrap_or_else(|| {
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "Redis failed within the probe interval; not retried yet",
                    ))
                });
                return Err(Error::Unavailable(e));
            }
            // Local decisions are made by the limiter; what reaches here (a refund, a
            // release) reports nothing.
            FailurePolicy::Open | FailurePolicy::Local => (true, Duration::ZERO),
            FailurePolicy::Closed => (false, self.closed_retry_after),
        };
        Ok(Decision {
            allowed,
            limit: cap,
            remaining: 0,
            retry_after: RetryAfter::Wait(wait),
            reset_after: wait,
            degraded: true,
            blind: true,
            source: Source::Local,
            policy: limit.cloned(),
            key: key.map(str::to_owned),
            per_key: Vec::new(),
        })
    }
}
