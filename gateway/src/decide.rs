//! The decision engine both front ends use: a request's descriptors matched against the
//! domain's configuration, decided in Redis through [`redis_rl_client::Limiter`], and the
//! per-descriptor statuses Envoy's rate limit service returns.
//!
//! * Every enforced descriptor of one request is decided in one `RL.ALL`
//!   ([`Limiter::check_all`]) when their keys share a slot (always on one server); on a
//!   Cluster, with keys in several slots, one slot group at a time with what earlier groups
//!   took refunded when a later one denies (the client's `across_slots`).
//! * Shadow-mode limits are decided apart, after the enforced ones (charged when those
//!   admit, peeked when they deny), and never deny.
//! * A descriptor holding the entry [`USAGE_KEY`] reports usage that already happened
//!   (Envoy's `apply_on_stream_done`): it is recorded with `FORCE` and never denies; on a
//!   concurrency limit it releases the lease of the token in [`TOKEN_KEY`]. A descriptor with
//!   `is_negative_hits` gives its hits back (`RL.REFUND`, or the lease's release).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use http::HeaderMap;
use redis_rl_client::http::safe_key_part;
use redis_rl_client::{Decision, Entry, Error, HeaderOptions, Limit, Limiter, RetryAfter};

use crate::config::{Action, Config, LimitSpec, Policy, Unit};
use crate::metrics::Metrics;

/// The descriptor entry key that marks a usage report (Envoy's `apply_on_stream_done`
/// call): add it, with any value, to the rate limit actions applied on stream done (a
/// `generic_key` action with `descriptor_key: rl_gateway_usage`). It is removed before
/// matching.
pub const USAGE_KEY: &str = "rl_gateway_usage";
/// The descriptor entry key whose value is the holder's token on a concurrency limit (e.g.
/// a `request_headers` action on `x-request-id`): the lease taken at request time is
/// released by the usage report carrying the same token. Removed before matching; without
/// it a lease is held for its whole lease time.
pub const TOKEN_KEY: &str = "rl_gateway_token";

/// One descriptor of a request.
#[derive(Debug, Clone, Default)]
pub struct DescriptorIn {
    /// Its entries, (key, value), in order.
    pub entries: Vec<(String, String)>,
    /// The descriptor's own hits (Envoy's per-descriptor `hits_addend`; 0 only checks).
    pub hits: Option<u64>,
    /// `is_negative_hits`: give the hits back instead of taking them.
    pub negative: bool,
}

/// A rate limit request.
#[derive(Debug, Clone, Default)]
pub struct RequestIn {
    /// The domain.
    pub domain: String,
    /// The descriptors.
    pub descriptors: Vec<DescriptorIn>,
    /// The request's hits (0 counts as 1, as Envoy and envoyproxy/ratelimit do).
    pub hits_addend: u64,
}

/// A descriptor's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Under the limit (or no limit, unlimited, shadow mode, a usage report).
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The limit a status reports (Envoy's `current_limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// `rate_limit.name` (empty when unnamed).
    pub name: String,
    /// The count per unit (the burst of a GCRA, the slots of a concurrency limit).
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// One descriptor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// OK or over the limit.
    pub code: Code,
    /// The limit applied, `None` when none did (no match, unlimited, replaced).
    pub current_limit: Option<CurrentLimit>,
    /// Requests of cost 1 still allowed (`u32::MAX` for an unlimited descriptor).
    pub limit_remaining: u32,
    /// Denied: until the request would be allowed; admitted: until the key is idle.
    /// `None` without a limit.
    pub duration_until_reset: Option<Duration>,
}

impl Status {
    fn ok_no_limit() -> Status {
        Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
        }
    }
}

/// The answer to a request.
#[derive(Debug, Clone)]
pub struct Answer {
    /// OVER_LIMIT when any enforced descriptor is over its limit.
    pub overall: Code,
    /// One status per descriptor, in request order.
    pub statuses: Vec<Status>,
    /// The response fields of the enforced limits: `RateLimit-Policy` and `RateLimit`
    /// (draft-ietf-httpapi-ratelimit-headers), and `Retry-After` when denied.
    pub headers: HeaderMap,
    /// Denied: how long until the request may be retried (`None` when it never can).
    pub retry_after: Option<Duration>,
    /// Denied because Redis did not answer and the domain's policy is closed.
    pub blind_denial: bool,
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The request breaks the rules (gRPC INVALID_ARGUMENT).
    Invalid(String),
    /// Redis answered with an error that is not an outage, e.g. a LOG limit over the
    /// server's cap (gRPC INTERNAL).
    Internal(String),
}

/// Bounds on what one request may ask.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Descriptors per request.
    pub max_descriptors: usize,
    /// Entries per descriptor.
    pub max_entries: usize,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            max_descriptors: 64,
            max_entries: 32,
        }
    }
}

/// What decides: the configuration in force, the limiters (one per failure policy), the
/// metrics.
pub struct Engine {
    config: RwLock<Arc<Config>>,
    open: Limiter,
    closed: Limiter,
    /// The metrics.
    pub metrics: Metrics,
    /// The request caps.
    pub caps: Caps,
    tokens: AtomicU64,
    token_base: String,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

enum Kind {
    Enforce,
    Shadow,
    Usage,
    Refund,
}

struct Planned {
    index: usize,
    spec: Arc<LimitSpec>,
    limit: Limit,
    key: String,
    hits: u64,
    kind: Kind,
    token: Option<String>,
    metric_key: String,
}

impl Engine {
    /// An engine on these limiters (`open` and `closed`: the same servers, each with its
    /// failure policy) and this configuration.
    pub fn new(config: Config, open: Limiter, closed: Limiter, caps: Caps) -> Engine {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Engine {
            config: RwLock::new(Arc::new(config)),
            open,
            closed,
            metrics: Metrics::new(),
            caps,
            tokens: AtomicU64::new(0),
            token_base: format!("gw-{:x}-{nanos:x}", std::process::id()),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Puts `config` in force; requests already being decided finish on the old one.
    pub fn set_config(&self, config: Config) {
        let new = Arc::new(config);
        match self.config.write() {
            Ok(mut c) => *c = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    /// Whether Redis answers now: a peek (`RL.GCRA … PEEK`, or the fallback's, which changes
    /// nothing) at a key of its own, bounded by the limiter's timeout. `Ok` with the mode in
    /// use, or `Err` with why not: Redis did not answer (the failure policy would decide), or
    /// refused the call.
    pub async fn redis_health(&self) -> Result<redis_rl_client::Mode, String> {
        let limit: Limit = redis_rl_client::Gcra::new(1, 1, 1u64)
            .map_err(|e| e.to_string())?
            .into();
        match self.open.check("rl-gateway:healthz", limit).peek().await {
            Ok(d) if d.degraded => Err(self.why_unavailable().await),
            Ok(_) => self.open.resolved_mode().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Why a degraded peek was degraded, in words: a `PING` on the same connection, bounded
    /// by the same timeout, names the cause (connection refused, a timeout, a loading or
    /// read-only server, or an error the limiter's mode detection met).
    async fn why_unavailable(&self) -> String {
        async fn ping(mut c: impl redis::aio::ConnectionLike) -> redis::RedisResult<String> {
            redis::cmd("PING").query_async(&mut c).await
        }
        let answer = match self.open.connection() {
            redis_rl_client::Connection::Single(c) => {
                tokio::time::timeout(self.open.timeout(), ping(c.clone())).await
            }
            redis_rl_client::Connection::Cluster(c) => {
                tokio::time::timeout(self.open.timeout(), ping(c.clone())).await
            }
        };
        let late = || {
            format!(
                "Redis did not answer within {} ms",
                self.open.timeout().as_millis()
            )
        };
        match answer {
            Err(_) => late(),
            // The connection's own response timeout is the same bound.
            Ok(Err(e)) if e.is_timeout() => late(),
            Ok(Err(e)) => e.to_string(),
            // PING answers but the peek did not: the limiter's own call failed (its error
            // went to the failure policy); its mode detection says why.
            Ok(Ok(_)) => match self.open.resolved_mode().await {
                Ok(_) => "Redis answered PING but not the limiter's call".to_owned(),
                Err(e) => e.to_string(),
            },
        }
    }

    /// The limiter of a failure policy.
    pub fn limiter(&self, policy: Policy) -> &Limiter {
        match policy {
            Policy::Open => &self.open,
            Policy::Closed => &self.closed,
        }
    }

    /// Decides a request.
    pub async fn decide(&self, req: &RequestIn) -> Result<Answer, Refusal> {
        let started = Instant::now();
        if req.domain.is_empty() {
            return Err(Refusal::Invalid(
                "rate limit domain must not be empty".into(),
            ));
        }
        if req.descriptors.is_empty() {
            return Err(Refusal::Invalid(
                "rate limit descriptor list must not be empty".into(),
            ));
        }
        if req.descriptors.len() > self.caps.max_descriptors {
            return Err(Refusal::Invalid(format!(
                "{} descriptors in one request: at most {} are allowed",
                req.descriptors.len(),
                self.caps.max_descriptors
            )));
        }
        if let Some((i, d)) = req
            .descriptors
            .iter()
            .enumerate()
            .find(|(_, d)| d.entries.len() > self.caps.max_entries)
        {
            return Err(Refusal::Invalid(format!(
                "descriptor {i} has {} entries: at most {} are allowed",
                d.entries.len(),
                self.caps.max_entries
            )));
        }
        let config = self.config();
        let Some(domain) = config.domain(&req.domain) else {
            // As envoyproxy/ratelimit: an unknown domain has no limit.
            self.metrics.domain_not_found(&req.domain);
            return Ok(Answer {
                overall: Code::Ok,
                statuses: vec![Status::ok_no_limit(); req.descriptors.len()],
                headers: HeaderMap::new(),
                retry_after: None,
                blind_denial: false,
            });
        };
        let limiter = self.limiter(domain.failure_policy);
        let request_hits = req.hits_addend.max(1);

        // ---- Match every descriptor; collect what `replaces` names.
        let mut statuses = vec![Status::ok_no_limit(); req.descriptors.len()];
        let mut matched = Vec::new();
        let mut replaced: Vec<&str> = Vec::new();
        for (i, d) in req.descriptors.iter().enumerate() {
            let usage = d.entries.iter().any(|(k, _)| k == USAGE_KEY);
            let token = d
                .entries
                .iter()
                .find(|(k, _)| k == TOKEN_KEY)
                .map(|(_, v)| v.clone());
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .filter(|(k, _)| k != USAGE_KEY && k != TOKEN_KEY)
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let Some(m) = domain.lookup(&entries) else {
                continue;
            };
            let hits = d.hits.unwrap_or(request_hits);
            matched.push((i, m, entries, usage, token, hits, d.negative));
        }
        for (_, m, ..) in &matched {
            replaced.extend(m.spec.replaces.iter().map(String::as_str));
        }
        let mut plans = Vec::new();
        for (index, m, entries, usage, token, hits, negative) in &matched {
            let spec = &m.spec;
            if spec.name.as_deref().is_some_and(|n| replaced.contains(&n)) {
                continue; // replaced: no limit
            }
            let Action::Limit { limit, .. } = &spec.action else {
                statuses[*index] = Status {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: u32::MAX,
                    duration_until_reset: None,
                };
                continue;
            };
            let key = redis_key(&req.domain, entries, &m.shared, limit);
            let metric_key = if spec.detailed_metric {
                detailed_key(&req.domain, entries)
            } else {
                spec.path.clone()
            };
            let kind = if *negative {
                Kind::Refund
            } else if *usage {
                Kind::Usage
            } else if spec.shadow_mode {
                Kind::Shadow
            } else {
                Kind::Enforce
            };
            let token = match (limit, token) {
                (Limit::Lease(_), Some(t)) if !t.is_empty() && t.len() <= 64 => Some(t.clone()),
                (Limit::Lease(_), _) => Some(format!(
                    "{}-{:x}",
                    self.token_base,
                    self.tokens.fetch_add(1, Ordering::Relaxed)
                )),
                _ => None,
            };
            plans.push(Planned {
                index: *index,
                spec: spec.clone(),
                limit: limit.clone(),
                key,
                hits: *hits,
                kind,
                token,
                metric_key,
            });
        }

        // ---- Usage reports and refunds: recorded one by one, never deny.
        for p in plans
            .iter()
            .filter(|p| matches!(p.kind, Kind::Usage | Kind::Refund))
        {
            self.metrics.hit(&req.domain, &p.metric_key, p.hits);
            let outcome = self.record(limiter, p).await;
            match outcome {
                Ok(Some(d)) => {
                    if d.degraded {
                        self.metrics.redis_error(&req.domain, &p.metric_key);
                    }
                    let mut s = status_of(&p.spec, &d);
                    s.code = Code::Ok;
                    statuses[p.index] = s;
                }
                Ok(None) => {}
                Err(e) => {
                    self.metrics.redis_error(&req.domain, &p.metric_key);
                    tracing::warn!("usage report on '{}' not recorded: {e}", p.spec.path);
                }
            }
        }

        // ---- Enforced limits: one combined decision.
        let enforced: Vec<&Planned> = plans
            .iter()
            .filter(|p| matches!(p.kind, Kind::Enforce))
            .collect();
        let mut overall = Code::Ok;
        let mut headers = HeaderMap::new();
        let mut retry_after = None;
        let mut blind_denial = false;
        let mut enforced_allowed = true;
        if !enforced.is_empty() {
            let d = self.combined(limiter, &enforced, false).await?;
            enforced_allowed = d.allowed;
            for p in &enforced {
                let one = per_key(limiter, &d, &p.key);
                self.metrics
                    .observe(&req.domain, &p.metric_key, p.hits, one, false);
                statuses[p.index] = status_of(&p.spec, one);
            }
            if !d.allowed {
                overall = Code::OverLimit;
                retry_after = d.retry_after.duration();
                blind_denial = d.blind;
            }
            let mut names = HashMap::new();
            for p in &enforced {
                names.insert(
                    format!("{}{}", limiter.prefix(), p.key),
                    p.spec.header_name(),
                );
            }
            let options = HeaderOptions {
                policy_name: enforced.first().map(|p| p.spec.header_name()),
                names,
                x_headers: false,
            };
            headers = d.headers_with(&options);
        }

        // ---- Shadow limits: charged when the enforced ones admit, peeked otherwise.
        let shadow: Vec<&Planned> = plans
            .iter()
            .filter(|p| matches!(p.kind, Kind::Shadow))
            .collect();
        if !shadow.is_empty() {
            let d = self.combined(limiter, &shadow, !enforced_allowed).await?;
            for p in &shadow {
                let one = per_key(limiter, &d, &p.key);
                self.metrics
                    .observe(&req.domain, &p.metric_key, p.hits, one, true);
                let mut s = status_of(&p.spec, one);
                s.code = Code::Ok;
                statuses[p.index] = s;
            }
        }
        self.metrics
            .latency(&req.domain, started.elapsed().as_secs_f64());
        Ok(Answer {
            overall,
            statuses,
            headers,
            retry_after,
            blind_denial,
        })
    }

    /// One `check_all` over `plans`, a key asked twice charged once with the hits summed.
    async fn combined(
        &self,
        limiter: &Limiter,
        plans: &[&Planned],
        peek: bool,
    ) -> Result<Decision, Refusal> {
        let mut order: Vec<&str> = Vec::new();
        let mut merged: HashMap<&str, (u64, &Planned)> = HashMap::new();
        for p in plans {
            match merged.get_mut(p.key.as_str()) {
                Some((hits, _)) => *hits = hits.saturating_add(p.hits),
                None => {
                    order.push(p.key.as_str());
                    merged.insert(p.key.as_str(), (p.hits, p));
                }
            }
        }
        let entries: Vec<Entry> = order
            .iter()
            .filter_map(|k| merged.get(k))
            .map(|(hits, p)| {
                let e = Entry::new(p.key.clone(), p.limit.clone()).cost(*hits);
                match &p.token {
                    Some(t) => e.token(t.as_bytes()),
                    None => e,
                }
            })
            .collect();
        let call = limiter.check_all(entries).across_slots();
        let call = if peek { call.peek() } else { call };
        match call.await {
            Ok(d) => {
                if d.degraded {
                    for p in plans {
                        self.metrics
                            .redis_error(domain_of(&p.spec.path), &p.metric_key);
                    }
                }
                Ok(d)
            }
            Err(e) => {
                for p in plans {
                    self.metrics
                        .redis_error(domain_of(&p.spec.path), &p.metric_key);
                }
                Err(refusal(e))
            }
        }
    }

    /// Records a usage report (`FORCE`) or a refund; a lease's is its release.
    async fn record(&self, limiter: &Limiter, p: &Planned) -> Result<Option<Decision>, Error> {
        if p.hits == 0 {
            return Ok(None);
        }
        match (&p.limit, &p.kind) {
            (Limit::Lease(_), _) => {
                if let Some(t) = &p.token {
                    limiter.release(&p.key, t.as_bytes()).await?;
                }
                Ok(None)
            }
            (_, Kind::Refund) => {
                limiter.refund(&p.key, p.hits).await?;
                Ok(None)
            }
            _ => limiter
                .check(p.key.clone(), p.limit.clone())
                .cost(p.hits)
                .force()
                .await
                .map(Some),
        }
    }
}

fn domain_of(path: &str) -> &str {
    path.split_once('.').map_or(path, |(d, _)| d)
}

fn refusal(e: Error) -> Refusal {
    match e {
        Error::InvalidLimit(e) => Refusal::Internal(format!("invalid limit: {e}")),
        other => Refusal::Internal(other.to_string()),
    }
}

/// The decision of `key` in a combined decision (itself for a single key).
fn per_key<'a>(limiter: &Limiter, d: &'a Decision, key: &str) -> &'a Decision {
    let full = format!("{}{key}", limiter.prefix());
    d.get(&full).unwrap_or(d)
}

/// Envoy's status of one descriptor from its decision.
fn status_of(spec: &LimitSpec, d: &Decision) -> Status {
    let (unit, rpu) = match &spec.action {
        Action::Limit {
            unit,
            requests_per_unit,
            ..
        } => (*unit, *requests_per_unit),
        Action::Unlimited => (Unit::Second, 0),
    };
    let until = if d.allowed {
        d.reset_after
    } else {
        match d.retry_after {
            RetryAfter::Wait(w) => w,
            RetryAfter::Never => d.reset_after,
        }
    };
    Status {
        code: if d.allowed { Code::Ok } else { Code::OverLimit },
        current_limit: Some(CurrentLimit {
            name: spec.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(rpu).unwrap_or(u32::MAX),
            unit,
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(until),
    }
}

/// The Redis key of a descriptor: the domain, then each entry's key and value (a
/// `share_threshold` entry's wildcard pattern instead of its value), each escaped
/// ([`safe_key_part`]: control bytes, separators and braces percent-encoded, a part over
/// 128 bytes hashed), joined by `|`, then the limit's algorithm. Keys of different domains,
/// descriptors, or entry boundaries never collide.
pub fn redis_key(
    domain: &str,
    entries: &[(&str, &str)],
    shared: &[Option<String>],
    limit: &Limit,
) -> String {
    let mut key = safe_key_part(domain);
    for (i, (k, v)) in entries.iter().enumerate() {
        key.push('|');
        key.push_str(&safe_key_part(k));
        key.push('|');
        match shared.get(i).and_then(Option::as_ref) {
            Some(pattern) => {
                key.push('*');
                key.push_str(&safe_key_part(pattern));
            }
            None => key.push_str(&safe_key_part(v)),
        }
    }
    // The algorithm is part of the key: a reload that changes it starts a new counter
    // instead of meeting a key of another kind (an error in Redis until it expires).
    key.push_str("|#");
    match limit {
        Limit::Gcra(_) => key.push_str("gcra"),
        Limit::Window(w) => key.push_str(&w.algorithm().as_str().to_ascii_lowercase()),
        Limit::Lease(_) => key.push_str("lease"),
    }
    key
}

/// envoyproxy/ratelimit's detailed metric key: the domain and every entry as `key_value`.
fn detailed_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut out = domain.to_owned();
    for (k, v) in entries {
        out.push('.');
        out.push_str(k);
        if !v.is_empty() {
            out.push('_');
            out.push_str(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_rl_client::Window;

    #[test]
    fn keys_keep_parts_apart_and_escape_control_bytes() {
        let w: Limit = Window::sliding(1, 1).unwrap().into();
        let a = redis_key("d", &[("a|b", "c")], &[None], &w);
        let b = redis_key("d", &[("a", "b|c")], &[None], &w);
        assert_ne!(a, b);
        let c = redis_key("d", &[("k", "v\r\n\0{x}")], &[None], &w);
        assert!(!c.bytes().any(|b| b.is_ascii_control()), "{c}");
        assert!(!c.contains('{') && !c.contains('}'), "{c}");
        assert_eq!(
            redis_key("d", &[("k", "b7")], &[Some("b*".into())], &w),
            "d|k|*b%2A|#sliding"
        );
        assert_ne!(
            redis_key("d", &[("k", "*b%2A")], &[None], &w),
            redis_key("d", &[("k", "b7")], &[Some("b*".into())], &w)
        );
    }
}
