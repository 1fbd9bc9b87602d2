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
//! one limit per API key, so the fleet admits exactly the limit, however the requests are
//! spread. Configuration: `RL_REDIS_URL` (default `redis://127.0.0.1:6379/`), `PORT`
//! (default 3000), `RL_PREFIX` (default `demo:`), `RL_INSTANCE` (a name in the replies).
//!
//! * `/api/*`: two limits in one atomic call: per API key, 10 at once then one more per minute
//!   (GCRA: burst 10, 1 per 60 s), and 100 per minute per client IP (exact sliding log), behind
//!   trusted proxies on loopback.
//! * `/upload`: per client IP, 5 units at once then one more per minute; a request costs
//!   `X-Units` units (413 for more than 5: it can never pass).
//! * `/reports`: its own limit per API key, 2 at once then one more per minute, with a
//!   `route_layer`.
//! * `/health` is exempt; `/metrics` shows the limiter's counters.

use std::net::SocketAddr;

use axum::extract::Extension;
use axum::routing::{get, post};
use axum::Router;
use redis_rl_client::http::{Key, Rule};
use redis_rl_client::{Algorithm, Decision, Gcra, Limiter, RateLimitLayer, Window};

/// The application: routes and their limits, on `limiter`.
pub fn app(limiter: Limiter, instance: String) -> Result<Router, redis_rl_client::InvalidLimit> {
    let proxies = ["127.0.0.1", "::1"];
    let api_key = || Key::header_or("X-API-Key", "anonymous");
    let fleet = RateLimitLayer::new(limiter.clone())
        .rule(Rule::all(
            "/api/",
            [
                ("api", Gcra::new(10, 1, 60)?.into(), api_key()),
                (
                    "ip",
                    Window::new(100, 60, Algorithm::Log)?.into(),
                    Key::client_ip(proxies)?,
                ),
            ],
        ))
        .rule(
            Rule::new("/upload", Gcra::new(5, 1, 60)?, Key::client_ip(proxies)?)
                .name("upload")?
                .cost_fn(|req| {
                    req.header("x-units")
                        .and_then(|u| u.parse().ok())
                        .unwrap_or(1)
                }),
        )
        .exempt("/health")
        .exempt("/metrics");
    let reports = Router::new()
        .route("/reports", get(|| async { "{\"ok\": \"report\"}" }))
        .route_layer(
            RateLimitLayer::new(limiter.clone())
                .rule(Rule::any(Gcra::new(2, 1, 60)?.named("reports")?, api_key())),
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
                     \"errors\": {}, \"redis_calls\": {}}}",
                    c.allowed, c.denied, c.denied_locally, c.degraded, c.errors, c.redis_calls
                )
            }),
        )
        .merge(reports)
        .layer(fleet))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("RL_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let limiter = Limiter::builder(url)
        .prefix(std::env::var("RL_PREFIX").unwrap_or_else(|_| "demo:".into()))
        .build()
        .await?;
    let instance = std::env::var("RL_INSTANCE").unwrap_or_else(|_| format!("port-{port}"));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app(limiter, instance)?.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
