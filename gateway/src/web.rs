//! The HTTP side: the forward-auth decision endpoint (`/auth/<domain>`, for Caddy's
//! `forward_auth`, Traefik's `ForwardAuth` and nginx's `auth_request`), `/healthz` and
//! `/metrics`.
//!
//! A forward-auth request describes the original request in headers: the method in
//! `X-Forwarded-Method` (or `X-Original-Method`), the URI in `X-Forwarded-Uri` (or
//! `X-Original-URI`), the host in `X-Forwarded-Host` (else `Host`), the client in
//! `X-Forwarded-For`, read only when the peer is a trusted proxy (the rightmost address not
//! trusted is the client). The domain's first `http_rules` entry that matches the method
//! and path gives the descriptors, built from those attributes; they are decided as one
//! Envoy request. Admitted: 200 with the RateLimit fields. Denied: 429 (503 when Redis did
//! not answer and the domain's policy is closed) with `Retry-After` and the fields, or the
//! status of `?deny_status=` (e.g. 403 for nginx, whose `auth_request` understands only
//! 2xx, 401 and 403).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use redis_rl_client::http::ClientIp;
use serde::Deserialize;

use crate::config::Source;
use crate::decide::{Code, DescriptorIn, Engine, Refusal, RequestIn};

/// Options of the HTTP side.
#[derive(Debug, Clone)]
pub struct WebOptions {
    /// Who the client is: the peer, or what trusted proxies forwarded.
    pub client_ip: ClientIp,
}

#[derive(Clone)]
struct AppState {
    engine: Arc<Engine>,
    options: Arc<WebOptions>,
}

/// The HTTP routes.
pub fn router(engine: Arc<Engine>, options: WebOptions) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/auth/{domain}", any(auth))
        .with_state(AppState {
            engine,
            options: Arc::new(options),
        })
}

/// 200 `ok: N domains, redis: module` (or `fallback`; `1 domain` for one) when Redis answers
/// a peek within the Redis timeout; 503 `unhealthy: N domains, redis: <why>` when it does not
/// (requests are then decided by each domain's failure policy), so that a readiness probe
/// takes the instance out of rotation while it cannot count.
async fn healthz(State(s): State<AppState>) -> Response {
    let domains = match s.engine.config().domain_names().len() {
        1 => "1 domain".to_owned(),
        n => format!("{n} domains"),
    };
    match s.engine.redis_health().await {
        Ok(mode) => {
            let mode = match mode {
                redis_rl_client::Mode::Module => "module",
                _ => "fallback",
            };
            (StatusCode::OK, format!("ok: {domains}, redis: {mode}\n")).into_response()
        }
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {domains}, redis: {why}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.engine.metrics.encode(),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct AuthQuery {
    deny_status: Option<String>,
}

/// A header's values as one text, `", "`-joined, bytes outside ASCII read as Latin-1.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<String> = headers
        .get_all(name)
        .iter()
        .map(|v| v.as_bytes().iter().map(|&b| char::from(b)).collect())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// The original request's method, path (without the query) and host.
fn original(headers: &HeaderMap, method: &Method, uri: &Uri) -> (String, String, Option<String>) {
    let m = header_text(headers, "x-forwarded-method")
        .or_else(|| header_text(headers, "x-original-method"))
        .unwrap_or_else(|| method.as_str().to_owned());
    let u = header_text(headers, "x-forwarded-uri")
        .or_else(|| header_text(headers, "x-original-uri"))
        .unwrap_or_else(|| uri.path().to_owned());
    let path = u.split(['?', '#']).next().unwrap_or("").to_owned();
    let host = header_text(headers, "x-forwarded-host").or_else(|| header_text(headers, "host"));
    (m, path, host)
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, format!("{text}\n")).into_response()
}

async fn auth(
    State(s): State<AppState>,
    Path(domain_name): Path<String>,
    Query(q): Query<AuthQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let deny_status = match q.deny_status.as_deref() {
        None => None,
        Some(t) => match t.parse::<u16>().ok().filter(|c| (400..=599).contains(c)) {
            Some(c) => StatusCode::from_u16(c).ok(),
            None => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    "deny_status must be a status from 400 to 599",
                )
            }
        },
    };
    let (m, path, host) = original(&headers, &method, &uri);
    let config = s.engine.config();
    let Some(domain) = config.domain(&domain_name) else {
        s.engine.metrics.domain_not_found(&domain_name);
        return plain(StatusCode::OK, "no limit: unknown domain");
    };
    let Some(rule) = domain.http_rules.iter().find(|r| r.matches(&m, &path)) else {
        return plain(StatusCode::OK, "no limit: no rule");
    };
    let (client, _) = s.options.client_ip.resolve(Some(peer.ip()), &headers);
    let mut descriptors = Vec::new();
    for d in &rule.descriptors {
        let mut entries = Vec::with_capacity(d.len());
        for (key, source) in d {
            let value = match source {
                Source::Value(v) => Some(v.clone()),
                Source::RemoteAddress => client.clone(),
                Source::Method => Some(m.clone()),
                Source::Path => Some(path.clone()),
                Source::Host => host.clone(),
                Source::Header(h) => header_text(&headers, h),
            };
            // As Envoy's actions: an entry whose source is absent drops its descriptor.
            let Some(value) = value else {
                entries.clear();
                break;
            };
            entries.push((key.clone(), value));
        }
        if !entries.is_empty() {
            descriptors.push(DescriptorIn {
                entries,
                ..DescriptorIn::default()
            });
        }
    }
    if descriptors.is_empty() {
        return plain(StatusCode::OK, "no limit: no descriptor");
    }
    let req = RequestIn {
        domain: domain_name,
        descriptors,
        hits_addend: 1,
    };
    drop(config);
    let answer = match s.engine.decide(&req).await {
        Ok(a) => a,
        Err(Refusal::Invalid(m)) => return plain(StatusCode::BAD_REQUEST, &m),
        Err(Refusal::Internal(m)) => {
            tracing::error!("forward-auth decision failed: {m}");
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rate limit decision failed",
            );
        }
    };
    let (status, body) = match answer.overall {
        Code::Ok => (StatusCode::OK, "ok"),
        Code::OverLimit => {
            let status = deny_status.unwrap_or(if answer.blind_denial {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::TOO_MANY_REQUESTS
            });
            (status, "rate limited")
        }
    };
    let mut response = plain(status, body);
    response.headers_mut().extend(answer.headers);
    response
}
