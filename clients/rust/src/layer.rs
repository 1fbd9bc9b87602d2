//! The tower [`Layer`]: rate limiting for axum, hyper and any tower HTTP service.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::decision::Decision;
use crate::error::Error;
use crate::http::{plan, respond, unavailable, PathPattern, Plan, RequestInfo, Rule};
use crate::limiter::{BoxFuture, Entry, Limiter};

#[derive(Clone)]
struct Config {
    limiter: Limiter,
    rules: Vec<Rule>,
    exempt: Vec<PathPattern>,
    x_headers: bool,
    degraded_status: StatusCode,
}

/// A tower [`Layer`] that limits HTTP requests by [`Rule`]s, in Redis, for the whole fleet.
///
/// The first rule whose path (and method) matches applies; `exempt` paths are never limited.
/// Admitted requests get the `RateLimit-Policy` and `RateLimit` fields on their response
/// (and the [`Decision`] in their extensions, for the handler); denied ones get `429` with
/// `Retry-After`, the fields and a JSON body; a request that can never pass (its cost
/// exceeds the limit) gets `413`; a "closed" failure-policy denial (or Redis down under
/// [`FailurePolicy::Error`](crate::FailurePolicy::Error)) gets `503` with `Retry-After`.
///
/// The wrapped service's response body must be buildable from a `String` (axum's `Body`,
/// `http_body_util::Full<Bytes>`, `String`). The client address comes from axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`), or a `SocketAddr` / `IpAddr` request extension
/// (plain hyper: insert it where you accept the connection).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
/// use axum::{routing::get, Router};
/// use redis_rl_client::http::{Key, Rule};
/// use redis_rl_client::{Gcra, Limiter, RateLimitLayer};
///
/// let limiter = Limiter::builder("redis://127.0.0.1:6379/").build().await?;
/// let app: Router = Router::new()
///     .route("/api/things", get(|| async { "things" }))
///     .route("/health", get(|| async { "ok" }))
///     .layer(
///         RateLimitLayer::new(limiter)
///             .rule(Rule::new("/api/", Gcra::new(20, 10, 1)?, Key::client_ip(["10.0.0.0/8"])?))
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
            .field("exempt", &self.config.exempt)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer with no rules yet (it limits nothing until given one).
    pub fn new(limiter: Limiter) -> RateLimitLayer {
        RateLimitLayer {
            config: Arc::new(Config {
                limiter,
                rules: Vec::new(),
                exempt: Vec::new(),
                x_headers: false,
                degraded_status: StatusCode::SERVICE_UNAVAILABLE,
            }),
        }
    }

    /// Adds a rule (rules are tried in the order added; the first match applies).
    pub fn rule(mut self, rule: Rule) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).rules.push(rule);
        self
    }

    /// Never limits paths matching `pattern` (health checks, metrics).
    pub fn exempt(mut self, pattern: impl Into<PathPattern>) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).exempt.push(pattern.into());
        self
    }

    /// Adds `X-RateLimit-Limit`, `-Remaining` and `-Reset` to every answer.
    pub fn x_headers(mut self, on: bool) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).x_headers = on;
        self
    }

    /// The status of a failure-policy denial (default 503).
    pub fn degraded_status(mut self, status: StatusCode) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).degraded_status = status;
        self
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

/// Builds the [`RequestInfo`] the rules and key functions see.
pub fn request_info<B>(req: &Request<B>) -> RequestInfo<'_> {
    RequestInfo {
        method: req.method(),
        path: req.uri().path(),
        headers: req.headers(),
        extensions: req.extensions(),
        peer: peer_of(req.extensions()),
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
        .await
}

fn build<B: From<String>>(
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
) -> Response<B> {
    let mut resp = Response::new(B::from(body));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
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
            let planned = plan(&config.rules, &request_info(&req), &config.exempt);
            let Some(p) = planned else {
                return inner.call(req).await;
            };
            let limiter = &config.limiter;
            let d = match decide(limiter, &p).await {
                Ok(d) => d,
                Err(Error::Unavailable(_)) => unavailable(limiter.closed_retry_after()),
                Err(e) => {
                    tracing::error!(target: "redis_rl_client", "redis-rl: the limiter failed: {e}");
                    let mut headers = http::HeaderMap::new();
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    return Ok(build(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        headers,
                        "{\"error\": \"limiter_error\", \"message\": \"the rate limiter failed\"}"
                            .to_owned(),
                    ));
                }
            };
            let v = respond(
                &d,
                &p.names,
                config.x_headers,
                config.degraded_status,
                limiter.prefix(),
            );
            if let Some(status) = v.status {
                return Ok(build(status, v.headers, v.body));
            }
            req.extensions_mut().insert(d);
            let mut resp = inner.call(req).await?;
            for (name, value) in &v.headers {
                resp.headers_mut().append(name, value.clone());
            }
            Ok(resp)
        })
    }
}
