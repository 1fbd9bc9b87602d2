//! The tower [`Layer`]: rate limiting for axum, hyper and any tower HTTP service.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::decision::Decision;
use crate::error::Error;
use crate::http::{
    check_bucket_names, identity_required, plan_rule, respond, unavailable, ClientIp, DenialReason,
    Missing, PathPattern, Plan, Planned, RequestInfo, Rule, Verdict,
};
use crate::limiter::{BoxFuture, Entry, Limiter};
use crate::limits::{Algorithm, InvalidLimit, Limit};
use crate::policy::Counter;

type Predicate = dyn Fn(&RequestInfo<'_>) -> bool + Send + Sync;
type StatusPredicate = dyn Fn(StatusCode) -> bool + Send + Sync;
type DeniedHook = dyn Fn(&Denial<'_>) -> Response<String> + Send + Sync;

#[derive(Clone)]
struct Config {
    limiter: Limiter,
    rules: Vec<Rule>,
    default_rule: Option<Rule>,
    exempt: Vec<PathPattern>,
    exempt_when: Vec<Arc<Predicate>>,
    exempt_preflights: bool,
    deduct_when: Option<Arc<StatusPredicate>>,
    missing: Missing,
    client_ip: ClientIp,
    x_headers: bool,
    degraded_status: StatusCode,
    on_denied: Option<Arc<DeniedHook>>,
    warned_log_force: Arc<AtomicBool>,
    warned_saturated: Arc<AtomicBool>,
    warned_peer_unknown: Arc<AtomicBool>,
}

/// The true cost of a request, reported by the handler after the fact: put it in the
/// response's extensions (axum: return `(Extension(ReportedCost(n)), body)`).
///
/// The request was charged its rule's cost up front; after the response, less than that is
/// refunded (`RL.REFUND` of the difference), more is recorded with `FORCE` (GCRA, FIXED and
/// SLIDING; a LOG limit cannot record usage past its limit, so the extra is not recorded
/// there, with one warning). A cost beyond what the limit's arithmetic can hold (e.g.
/// `u64::MAX` on a GCRA, whose time would pass 64-bit nanoseconds) is recorded as the most it
/// holds (the key used up for as long as it can be), counted in `errors` and warned once.
/// A rule's [`deduct_when`](Rule::deduct_when) that refuses the status refunds the whole
/// charge instead.
///
/// ```
/// use axum::{routing::post, Extension, Router};
/// use redis_rl_client::ReportedCost;
///
/// // Charged 1 token up front by the rule; the handler knows the real figure afterwards.
/// let app: Router = Router::new().route("/complete", post(|| async {
///     let tokens_used = 1200;
///     (Extension(ReportedCost(tokens_used)), "…")
/// }));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReportedCost(pub u64);

/// A request the layer refuses, as [`RateLimitLayer::on_denied`] sees it.
#[derive(Debug)]
pub struct Denial<'a> {
    /// Why: over the limit (429), too large (413), limiter unavailable (503), identity
    /// required (401).
    pub reason: DenialReason,
    /// The status of the layer's own answer.
    pub status: StatusCode,
    /// The decision (`None` for [`DenialReason::IdentityRequired`]).
    pub decision: Option<&'a Decision>,
    /// The ready header fields: `Retry-After`, `RateLimit-Policy`, `RateLimit` (and
    /// `X-RateLimit-*` if on), `Content-Type`.
    pub headers: &'a HeaderMap,
    /// The layer's JSON body.
    pub body: &'a str,
    /// The binding limit's name.
    pub policy: &'a str,
    /// The request.
    pub request: &'a RequestInfo<'a>,
}

impl Denial<'_> {
    /// The layer's own answer (what is sent without a hook).
    pub fn default_response(&self) -> Response<String> {
        let mut resp = Response::new(self.body.to_owned());
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers.clone();
        resp
    }
}

/// A tower [`Layer`] that limits HTTP requests by [`Rule`]s, in Redis, for the whole fleet.
///
/// The first rule whose method and (normalised) path match applies, else the
/// [`default_rule`](RateLimitLayer::default_rule) (a request matching no route, a 404,
/// included); `exempt` paths, [`exempt_when`](RateLimitLayer::exempt_when) requests and CORS
/// preflights are never limited. Admitted requests get the `RateLimit-Policy` and
/// `RateLimit` fields on their response (and the [`Decision`] in their extensions, for the
/// handler); denied ones get `429` with `Retry-After`, the fields and a JSON body; a request
/// that can never pass (its cost exceeds a limit) gets `413`; a request without the identity
/// a [`Missing::Deny`] rule needs gets `401`; a "closed" failure-policy denial (or Redis
/// down under [`FailurePolicy::Error`](crate::FailurePolicy::Error)) gets `503` with
/// `Retry-After`. [`on_denied`](RateLimitLayer::on_denied) replaces those answers.
///
/// The wrapped service's response body must be buildable from a `String` (axum's `Body`,
/// `http_body_util::Full<Bytes>`, `String`). The client address comes from axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`), or a `SocketAddr` / `IpAddr` request extension
/// (plain hyper: insert it where you accept the connection), through the layer's
/// [`ClientIp`] rule. A request with no usable client address (no peer, e.g. a Unix socket,
/// and no trusted forwarding header: trust the socket's proxy with
/// `ClientIp::new().trusted(["unix"])`) is limited in the one shared bucket `ip:unknown`,
/// counted `peer_unknown`, and warned about once.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
/// use axum::{routing::get, Router};
/// use redis_rl_client::http::{ClientIp, Key, Rule};
/// use redis_rl_client::{Gcra, Limiter, RateLimitLayer};
///
/// let limiter = Limiter::builder("redis://127.0.0.1:6379/").build().await?;
/// let app: Router = Router::new()
///     .route("/api/things", get(|| async { "things" }))
///     .route("/health", get(|| async { "ok" }))
///     .layer(
///         RateLimitLayer::new(limiter)
///             .client_ip(ClientIp::new().trusted(["10.0.0.0/8"])?)
///             .rule(Rule::new("/api/", Gcra::new(20, 10, 1)?, Key::ip())?)?
///             .exempt("/health"),
///     );
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.config.rules)
            .field("default_rule", &self.config.default_rule)
            .field("exempt", &self.config.exempt)
            .field("missing", &self.config.missing)
            .field("client_ip", &self.config.client_ip)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer with no rules yet (it limits nothing until given one). The client is the
    /// socket peer ([`ClientIp::new`]) until [`client_ip`](RateLimitLayer::client_ip) says
    /// otherwise.
    pub fn new(limiter: Limiter) -> RateLimitLayer {
        RateLimitLayer {
            config: Arc::new(Config {
                limiter,
                rules: Vec::new(),
                default_rule: None,
                exempt: Vec::new(),
                exempt_when: Vec::new(),
                exempt_preflights: true,
                deduct_when: None,
                missing: Missing::Ip,
                client_ip: ClientIp::new(),
                x_headers: false,
                degraded_status: StatusCode::SERVICE_UNAVAILABLE,
                on_denied: None,
                warned_log_force: Arc::new(AtomicBool::new(false)),
                warned_saturated: Arc::new(AtomicBool::new(false)),
                warned_peer_unknown: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> RateLimitLayer {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Adds a rule (rules are tried in the order added; the first match applies).
    ///
    /// A limit's name is its bucket's name (`<name>:{<kind>:<value>}`): rules that give one
    /// name to a limit share that bucket. That is fine on purpose with the same limit (one
    /// per-IP limit named `"ip"` in several rules), and refused otherwise. Errors: this rule
    /// gives a name another rule of the layer (or its default rule) gives a different limit.
    /// A limit computed per request ([`Limits::from_fn`](crate::http::Limits::from_fn))
    /// cannot be checked when the layer is built: give it a name no other rule uses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_rl_client::http::{Key, Rule};
    /// use redis_rl_client::{Limiter, RateLimitLayer};
    ///
    /// let limiter = Limiter::builder("redis://127.0.0.1:6379/").build().await?;
    /// let api = Rule::all("/api/", [("ip", "100/minute".parse()?, Key::ip())])?;
    /// let two = Rule::all("/two/", [("ip", "5/minute".parse()?, Key::ip())])?;
    /// let err = RateLimitLayer::new(limiter.clone()).rule(api.clone())?.rule(two).unwrap_err();
    /// assert!(err.message().contains("both name a limit 'ip'"));
    /// // One per-IP limit shared by two rules on purpose: the same limit under one name.
    /// let shared = Rule::all("/two/", [("ip", "100/minute".parse()?, Key::ip())])?;
    /// let layer = RateLimitLayer::new(limiter).rule(api)?.rule(shared)?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn rule(self, rule: Rule) -> Result<RateLimitLayer, InvalidLimit> {
        let label = format!(
            "rule {} ('{}')",
            self.config.rules.len() + 1,
            rule.describe()
        );
        self.check_names(&label, &rule)?;
        Ok(self.edit(|c| c.rules.push(rule)))
    }

    /// Refuses `rule` when it names a bucket of another rule with a different limit.
    fn check_names(&self, label: &str, rule: &Rule) -> Result<(), InvalidLimit> {
        for (i, other) in self.config.rules.iter().enumerate() {
            let theirs = format!("rule {} ('{}')", i + 1, other.describe());
            check_bucket_names((&theirs, other), (label, rule))?;
        }
        if let Some(default) = &self.config.default_rule {
            check_bucket_names(("the default rule", default), (label, rule))?;
        }
        Ok(())
    }

    /// The rule for requests no other rule matches, including those that match no route
    /// (404s): default limits for every route (replacing an earlier one). Errors: as
    /// [`rule`](RateLimitLayer::rule), a limit name another rule gives a different limit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::StatusCode;
    /// use redis_rl_client::http::{ClientIp, Forwarding, Key, Missing, Rule};
    /// use redis_rl_client::{Limiter, RateLimitLayer};
    ///
    /// let limiter = Limiter::builder("redis://127.0.0.1:6379/").build().await?; // connects lazily
    /// let layer = RateLimitLayer::new(limiter)
    ///     .client_ip(ClientIp::new().trusted(["10.0.0.0/8"])?.forwarding(Forwarding::Forwarded))
    ///     .rule(Rule::new("/api/", "100/minute", Key::header("X-API-Key"))?)?
    ///     .default_rule(Rule::any("600/minute", Key::ip())?)? // every other path
    ///     .missing(Missing::Ip)                                // the default, said out loud
    ///     .exempt("/health")
    ///     .exempt_when(|req| req.header("x-internal-token").is_some())
    ///     .deduct_when(|status| !status.is_server_error())      // a 5xx is not charged
    ///     .exempt_preflights(true)
    ///     .x_headers(true)
    ///     .degraded_status(StatusCode::SERVICE_UNAVAILABLE);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn default_rule(self, rule: Rule) -> Result<RateLimitLayer, InvalidLimit> {
        let mut layer = self.edit(|c| c.default_rule = None);
        layer.check_names("the default rule", &rule)?;
        layer = layer.edit(|c| c.default_rule = Some(rule));
        Ok(layer)
    }

    /// Never limits paths matching `pattern` (health checks, metrics).
    pub fn exempt(self, pattern: impl Into<PathPattern>) -> RateLimitLayer {
        self.edit(|c| c.exempt.push(pattern.into()))
    }

    /// Never limits requests for which `f` is true (no Redis call, no RateLimit fields),
    /// e.g. an internal caller or an admin.
    pub fn exempt_when(
        self,
        f: impl Fn(&RequestInfo<'_>) -> bool + Send + Sync + 'static,
    ) -> RateLimitLayer {
        self.edit(|c| c.exempt_when.push(Arc::new(f)))
    }

    /// Whether CORS preflights (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`) are exempt (default true: a browser sends one before
    /// a cross-origin call, and charging it would halve the client's quota).
    pub fn exempt_preflights(self, on: bool) -> RateLimitLayer {
        self.edit(|c| c.exempt_preflights = on)
    }

    /// Charge only the responses whose status makes `f` true, for rules without their own
    /// [`Rule::deduct_when`] (default: every response is charged).
    pub fn deduct_when(
        self,
        f: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> RateLimitLayer {
        self.edit(|c| c.deduct_when = Some(Arc::new(f)))
    }

    /// What rules without their own [`Rule::missing`] do when a key function finds nothing
    /// (default [`Missing::Ip`]).
    pub fn missing(self, policy: Missing) -> RateLimitLayer {
        self.edit(|c| c.missing = policy)
    }

    /// How the client's address is found ([`ClientIp`]: trusted proxies, the forwarding
    /// header, the IPv6 prefix), for [`Key::ip`](crate::http::Key::ip) and
    /// [`Missing::Ip`].
    pub fn client_ip(self, rule: ClientIp) -> RateLimitLayer {
        self.edit(|c| c.client_ip = rule)
    }

    /// Adds `X-RateLimit-Limit`, `-Remaining` and `-Reset` to every answer.
    pub fn x_headers(self, on: bool) -> RateLimitLayer {
        self.edit(|c| c.x_headers = on)
    }

    /// The status of a failure-policy denial (default 503).
    pub fn degraded_status(self, status: StatusCode) -> RateLimitLayer {
        self.edit(|c| c.degraded_status = status)
    }

    /// Builds the answer to every refused request (429, 413, 401, 503) instead of the
    /// layer's JSON. The hook gets the [`Denial`] (reason, decision, ready fields, default
    /// body, the request) and returns the response; the `Retry-After`, `RateLimit-Policy`,
    /// `RateLimit` and `X-RateLimit-*` fields are added to it unless it sets them itself.
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use redis_rl_client::http::DenialReason;
    /// use redis_rl_client::{Limiter, RateLimitLayer};
    ///
    /// fn layer(limiter: Limiter) -> RateLimitLayer {
    ///     RateLimitLayer::new(limiter).on_denied(|denial| match denial.reason {
    ///         DenialReason::RateLimited => {
    ///             let mut resp = Response::new("<h1>Slow down</h1>".to_owned());
    ///             *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///             resp.headers_mut().insert("content-type", "text/html".parse().unwrap());
    ///             resp // Retry-After and the RateLimit fields are added
    ///         }
    ///         _ => denial.default_response(),
    ///     })
    /// }
    /// # let _ = layer;
    /// ```
    pub fn on_denied(
        self,
        hook: impl Fn(&Denial<'_>) -> Response<String> + Send + Sync + 'static,
    ) -> RateLimitLayer {
        self.edit(|c| c.on_denied = Some(Arc::new(hook)))
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around yours.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

fn peer_of(ext: &http::Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0.ip());
    }
    ext.get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| ext.get::<IpAddr>().copied())
}

fn route_of(ext: &http::Extensions) -> Option<&str> {
    #[cfg(feature = "axum")]
    if let Some(m) = ext.get::<axum::extract::MatchedPath>() {
        return Some(m.as_str());
    }
    let _ = ext;
    None
}

/// Builds the [`RequestInfo`] the rules and key functions see (its `client_ip` unset: the
/// layer fills it in with its [`ClientIp`] rule).
pub fn request_info<B>(req: &Request<B>) -> RequestInfo<'_> {
    RequestInfo {
        method: req.method(),
        path: req.uri().path(),
        headers: req.headers(),
        extensions: req.extensions(),
        peer: peer_of(req.extensions()),
        client_ip: None,
        route: route_of(req.extensions()),
        content_length: req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok()),
    }
}

async fn decide(limiter: &Limiter, p: &Plan) -> Result<Decision, Error> {
    if let [(k, lim)] = p.keys.as_slice() {
        return limiter.check(k.as_str(), lim).cost(p.cost).await;
    }
    limiter
        .check_all(p.keys.iter().map(|(k, l)| Entry::new(k.as_str(), l)))
        .cost(p.cost)
        .across_slots()
        .await
}

fn build<B: From<String>>(status: StatusCode, headers: HeaderMap, body: String) -> Response<B> {
    let mut resp = Response::new(B::from(body));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

fn limiter_error<B: From<String>>() -> Response<B> {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    build(
        StatusCode::INTERNAL_SERVER_ERROR,
        headers,
        "{\"error\": \"limiter_error\", \"message\": \"the rate limiter failed\"}".to_owned(),
    )
}

/// Once per layer: a request had no usable client address, so its IP limits counted in the
/// shared `ip:unknown` bucket; how to fix the deployment.
fn warn_peer_unknown(warned: &AtomicBool) {
    if !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            target: "redis_rl_client",
            "redis-rl: a request with no usable client address (no peer address in the \
             request's extensions, e.g. a Unix socket, and no trusted forwarding header): its \
             IP limits count in the one bucket shared by all such requests, 'ip:unknown' \
             (counted peer_unknown). Fix the deployment: behind a proxy on a Unix socket, \
             trust it with ClientIp::new().trusted([\"unix\"]) so its X-Forwarded-For names \
             the client; over TCP give the layer the peer address (axum: serve with \
             into_make_service_with_connect_info::<SocketAddr>(); hyper: insert the \
             connection's SocketAddr in the request's extensions)"
        );
    }
}

/// The fields a custom denial keeps unless its hook sets them.
fn is_limit_field(name: &HeaderName) -> bool {
    let n = name.as_str();
    n == "retry-after"
        || n == "ratelimit"
        || n == "ratelimit-policy"
        || n.starts_with("x-ratelimit-")
}

/// The answer to a refused request: the hook's, with the limit fields kept, or the
/// layer's.
fn denial_response<B: From<String>>(
    config: &Config,
    v: &Verdict,
    decision: Option<&Decision>,
    info: &RequestInfo<'_>,
) -> Response<B> {
    let (Some(status), Some(reason)) = (v.status, v.reason) else {
        return build(
            StatusCode::INTERNAL_SERVER_ERROR,
            v.headers.clone(),
            v.body.clone(),
        );
    };
    let Some(hook) = &config.on_denied else {
        return build(status, v.headers.clone(), v.body.clone());
    };
    let denial = Denial {
        reason,
        status,
        decision,
        headers: &v.headers,
        body: &v.body,
        policy: &v.policy,
        request: info,
    };
    let mut resp = hook(&denial);
    for name in v.headers.keys() {
        if is_limit_field(name) && !resp.headers().contains_key(name) {
            for value in v.headers.get_all(name) {
                resp.headers_mut().append(name.clone(), value.clone());
            }
        }
    }
    resp.map(B::from)
}

/// After the response: refund the charge a `deduct_when` refuses, or settle a reported
/// cost (refund the difference, or `FORCE` the extra).
async fn settle(
    config: &Config,
    plan: &Plan,
    d: &Decision,
    status: StatusCode,
    reported: Option<u64>,
    deduct: Option<&Arc<StatusPredicate>>,
) {
    let charged = plan.cost;
    let keep = deduct.is_none_or(|f| f(status));
    let target = if keep { reported.unwrap_or(charged) } else { 0 };
    if target == charged {
        return;
    }
    let limiter = &config.limiter;
    for (i, (key, limit)) in plan.keys.iter().enumerate() {
        let sub = if d.per_key.is_empty() {
            d
        } else {
            match d.per_key.get(i) {
                Some(s) => s,
                None => continue,
            }
        };
        if sub.blind {
            continue; // the open policy charged nothing
        }
        if target < charged {
            // Given back where this limit's own decision took it (Redis, or the local
            // policy's memory, also once Redis answers again).
            let n = charged - target;
            if let Err(e) = limiter.refund_decision(sub, n).await {
                tracing::warn!(target: "redis_rl_client", "redis-rl: refund of '{key}' after the response failed: {e}");
            }
            continue;
        }
        if let Limit::Window(w) = limit {
            if w.algorithm() == Algorithm::Log {
                if !config.warned_log_force.swap(true, Ordering::Relaxed) {
                    tracing::warn!(target: "redis_rl_client", "redis-rl: a reported cost above the charge is not recorded on LOG limit '{key}' (LOG cannot record usage past its limit)");
                }
                continue;
            }
        }
        let extra = target - charged;
        let n = recordable(limit, extra);
        let mut short = n < extra;
        if short && !config.warned_saturated.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "redis_rl_client", "redis-rl: a reported cost beyond what limit '{key}' can hold ({extra} more than charged) is recorded as {n}, the most its arithmetic holds (the key is used up as long as it can be); counted in errors");
        }
        if n > 0 {
            match limiter.force(key.as_str(), limit, n).await {
                Ok(_) => {}
                // An outage: counted by the limiter's failure policy already.
                Err(Error::Unavailable(e)) => {
                    tracing::warn!(target: "redis_rl_client", "redis-rl: recording the reported cost of '{key}' failed: {e}");
                }
                Err(e) => {
                    short = true;
                    tracing::warn!(target: "redis_rl_client", "redis-rl: recording the reported cost of '{key}' failed: {e}");
                }
            }
        }
        if short {
            limiter.counters().add(Counter::Errors, 1);
        }
    }
}

/// How many of `extra` reported units a `FORCE` on `limit` can record: all of them, unless
/// the limit's arithmetic cannot hold them (the module answers `arithmetic overflow` and
/// records nothing), then the most it surely can. GCRA: the key's time may not pass 64-bit
/// nanoseconds since the epoch (the year 2554): its time before the force is at most `now +
/// burst · T` (now from this host's clock, with a day's margin for the server's), so at most
/// `(2^64 − 1 − now − margin − burst · T) / T` units. A window: its count may not pass
/// 2^64 − 1, and holds at most `limit` before the force, so at most `2^64 − 1 − limit`.
fn recordable(limit: &Limit, extra: u64) -> u64 {
    match limit {
        Limit::Gcra(g) => {
            let t = u128::from(g.interval_ns().max(1));
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let margin = 86_400 * 1_000_000_000u128;
            let used = now + margin + u128::from(g.burst()) * t;
            let room = u128::from(u64::MAX).saturating_sub(used) / t;
            extra.min(u64::try_from(room).unwrap_or(u64::MAX))
        }
        Limit::Window(w) => extra.min(u64::MAX - w.limit()),
        Limit::Lease(_) => extra,
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // The clone waits for the next request; this call uses the one that was ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(async move {
            let limiter = &config.limiter;
            let (client, bad_forwarding) = config
                .client_ip
                .resolve(peer_of(req.extensions()), req.headers());
            // Decide with the request borrowed; answer a refusal in the same scope.
            let admitted = {
                let mut info = request_info(&req);
                info.client_ip = client.as_deref();
                let path = info.normalized_path();
                let exempt = (config.exempt_preflights && info.is_cors_preflight())
                    || config.exempt.iter().any(|p| p.matches(&path))
                    || config.exempt_when.iter().any(|f| f(&info));
                let rule = if exempt {
                    None
                } else {
                    config
                        .rules
                        .iter()
                        .find(|r| r.matches(info.method, &path))
                        .or(config.default_rule.as_ref())
                };
                let planned = match rule {
                    None => Planned::Exempt,
                    Some(r) => plan_rule(r, &info, config.missing),
                };
                let forwarded_unusable = bad_forwarding
                    || matches!(&planned, Planned::Limited(p) if p.forwarded_unusable);
                if forwarded_unusable {
                    limiter.counters().add(Counter::ForwardedUnusable, 1);
                }
                if matches!(&planned, Planned::Limited(p) if p.peer_unknown) {
                    limiter.counters().add(Counter::PeerUnknown, 1);
                    warn_peer_unknown(&config.warned_peer_unknown);
                }
                match planned {
                    Planned::Exempt => None,
                    Planned::Unlimited { skipped } => {
                        if skipped > 0 {
                            limiter.counters().add(Counter::Skipped, skipped);
                        }
                        None
                    }
                    Planned::Failed(e) => {
                        tracing::error!(target: "redis_rl_client", "redis-rl: the rule's limits failed: {e}");
                        return Ok(limiter_error());
                    }
                    Planned::IdentityRequired { policy } => {
                        limiter.counters().add(Counter::MissingDenied, 1);
                        let v = identity_required(&policy);
                        return Ok(denial_response(&config, &v, None, &info));
                    }
                    Planned::Limited(p) => {
                        if p.skipped > 0 {
                            limiter.counters().add(Counter::Skipped, p.skipped);
                        }
                        let d = match decide(limiter, &p).await {
                            Ok(d) => d,
                            Err(Error::Unavailable(_)) => unavailable(limiter.closed_retry_after()),
                            Err(e) => {
                                tracing::error!(target: "redis_rl_client", "redis-rl: the limiter failed: {e}");
                                return Ok(limiter_error());
                            }
                        };
                        let v = respond(
                            &d,
                            &p.names,
                            config.x_headers,
                            config.degraded_status,
                            limiter.prefix(),
                        );
                        if v.status.is_some() {
                            return Ok(denial_response(&config, &v, Some(&d), &info));
                        }
                        let deduct = rule
                            .and_then(Rule::deduct_rule)
                            .or(config.deduct_when.as_ref())
                            .cloned();
                        Some((p, d, v.headers, deduct))
                    }
                }
            };
            let Some((p, d, headers, deduct)) = admitted else {
                return inner.call(req).await;
            };
            req.extensions_mut().insert(d.clone());
            let mut resp = inner.call(req).await?;
            let reported = resp.extensions().get::<ReportedCost>().map(|c| c.0);
            if reported.is_some() || deduct.is_some() {
                settle(&config, &p, &d, resp.status(), reported, deduct.as_ref()).await;
            }
            for (name, value) in &headers {
                resp.headers_mut().append(name, value.clone());
            }
            Ok(resp)
        })
    }
}
