//! An axum service limited fleet-wide in Redis.
//!
//! ```sh
//! cargo build --release                     # the module (or use a server without it: the
//! redis-server --loadmodule target/release/libredis_rl.so   # client falls back to Lua)
//! cargo run -p redis-rl-client --example axum            # listens on 127.0.0.1:3000
//! curl -i -H 'X-API-Key: alice' http://127.0.0.1:3000/api/thing
//! ```
//!
//! Run it twice (`PORT=3001 cargo run …`) behind any load balancer: both instances share
//! one limit per API key and one per client IP, so the fleet admits exactly the limits,
//! however the requests are spread. Configuration: `REDIS_URL` (default
//! `redis://127.0.0.1:6379`), `PORT` (default 3000), `RL_PREFIX` (default `demo:`),
//! `RL_INSTANCE` (a name in the replies), `RL_FLEET_SIZE` (how many instances run, default
//! 1), `RUST_LOG` (default `info`: the limiter's warnings, e.g. Redis unreachable, are
//! logged).
//!
//! * `/api/*`: two limits, each keyed by its own identity: per API key (`X-API-Key`), 10 at
//!   once then one more per minute (GCRA: burst 10, 1 per 60 s), and per client IP, 100 per
//!   minute (exact sliding log), behind trusted proxies on loopback. A client rotating API
//!   keys gets a fresh per-key bucket each time, and is still held to 100 per minute by its
//!   IP. A request without an API key is keyed by its IP for the per-key limit too. On one
//!   Redis server both limits are one `RL.ALL`; on a Redis Cluster they usually live in
//!   different slots and are checked in order, what the first took being refunded when the
//!   second denies.
//! * `/upload`: per client IP, 5 units at once then one more per minute; a request costs
//!   `X-Units` units (at least 1; 413 for more than 5, which can never pass).
//! * `/reports`: its own limit per API key, 2 at once then one more per minute, with a
//!   `route_layer`.
//! * `/health` is exempt; `/metrics` shows the limiter's counters.
//!
//! Failure policy: [`FailurePolicy::Local`]. These limits protect cost and fairness, not
//! security: while Redis is unreachable, failing open would let one client take everything
//! and failing closed would refuse everyone, so each instance enforces its share
//! (`limit / RL_FLEET_SIZE`) in memory with the same algorithms, and returns to Redis as soon
//! as it answers. Every outage and recovery is logged once.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Extension;
use axum::routing::{get, post};
use axum::Router;
use redis_rl_client::http::{ClientIp, Key, Rule};
use redis_rl_client::{
    Algorithm, Decision, Error, FailurePolicy, Gcra, InvalidLimit, Limiter, RateLimitLayer, Window,
};

/// The application: routes and their limits, on `limiter`.
pub fn app(limiter: Limiter, instance: String) -> Result<Router, InvalidLimit> {
    let fleet = RateLimitLayer::new(limiter.clone())
        .client_ip(ClientIp::new().trusted(["127.0.0.1", "::1"])?)
        .rule(Rule::all(
            "/api/",
            [
                (
                    "api",
                    Gcra::new(10, 1, 60)?.into(),
                    Key::header("X-API-Key"),
                ),
                (
                    "ip",
                    Window::new(100, 60, Algorithm::Log)?.into(),
                    Key::ip(),
                ),
            ],
        )?)?
        .rule(
            Rule::new("/upload", Gcra::new(5, 1, 60)?, Key::ip())?
                .name("upload")?
                .cost_header("X-Units"),
        )?
        .exempt("/health")
        .exempt("/metrics");
    let reports = Router::new()
        .route("/reports", get(|| async { "{\"ok\": \"report\"}" }))
        .route_layer(
            RateLimitLayer::new(limiter.clone())
                .client_ip(ClientIp::new().trusted(["127.0.0.1", "::1"])?)
                .rule(Rule::any(
                    Gcra::new(2, 1, 60)?.named("reports")?,
                    Key::header("X-API-Key"),
                )?)?,
        );
    let metrics = limiter.clone();
    Ok(Router::new()
        .route(
            "/api/thing",
            get(move |Extension(d): Extension<Decision>| async move {
                format!(
                    "{{\"ok\": \"thing\", \"instance\": \"{instance}\", \"remaining\": {}}}",
                    d.remaining
                )
            }),
        )
        .route("/upload", post(|| async { "{\"ok\": \"upload\"}" }))
        .route("/health", get(|| async { "{\"ok\": \"healthy\"}" }))
        .route(
            "/metrics",
            get(move || async move {
                let c = metrics.counters().snapshot();
                format!(
                    "{{\"allowed\": {}, \"denied\": {}, \"denied_locally\": {}, \"degraded\": {}, \
                     \"local\": {}, \"errors\": {}, \"redis_calls\": {}}}",
                    c.allowed,
                    c.denied,
                    c.denied_locally,
                    c.degraded,
                    c.local,
                    c.errors,
                    c.redis_calls
                )
            }),
        )
        .merge(reports)
        .layer(fleet))
}

/// The limiter `main` uses: Redis at `url`, the local failure policy for a fleet of
/// `fleet_size` instances.
pub async fn limiter(url: String, prefix: String, fleet_size: u64) -> Result<Limiter, Error> {
    Limiter::builder(url)
        .prefix(prefix)
        .on_error(FailurePolicy::Local)
        .fleet_size(fleet_size)
        .timeout(Duration::from_millis(500))
        .build()
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let fleet_size: u64 = std::env::var("RL_FLEET_SIZE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let prefix = std::env::var("RL_PREFIX").unwrap_or_else(|_| "demo:".into());
    let limiter = limiter(url.clone(), prefix, fleet_size).await?;
    let instance = std::env::var("RL_INSTANCE").unwrap_or_else(|_| format!("port-{port}"));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tracing::info!(
        "listening on http://{}, limits in {url}; failure policy: local (while Redis is \
         unreachable each of {fleet_size} instance(s) enforces its share of every limit in \
         memory: these limits protect cost and fairness, so neither opening the door nor \
         refusing everyone)",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app(limiter, instance)?.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
