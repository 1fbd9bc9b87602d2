//! The layer's rule options against a real `redis-server`, in both modes, through the tower
//! service (the e2e tests serve the same layer over real HTTP): the `missing` policy,
//! `exempt_when`, CORS preflights, `deduct_when`, reported costs, `on_denied`, limits from
//! strings and functions of the request, the default rule, and the client-IP rule.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use redis_rl_client::http::{ClientIp, DenialReason, Key, Limits, Missing, Rule};
use redis_rl_client::{Gcra, RateLimitLayer, ReportedCost, Window};
use support::Kind;
use tower::{Layer, ServiceExt};

both_modes!(
    a_missing_key_is_limited_by_ip_not_unlimited,
    a_missing_key_can_be_denied_or_skipped_explicitly,
    exempt_requests_make_no_redis_call,
    deduct_when_refunds_the_statuses_it_refuses,
    a_reported_cost_is_refunded_or_forced,
    on_denied_builds_the_answer_and_keeps_the_fields,
    limits_from_strings_and_per_request_functions,
    the_default_rule_covers_unmatched_routes,
    an_unusable_forwarded_header_falls_back_to_the_peer,
);

/// The app behind the layer: answers the status in `x-status` (default 200) and reports the
/// cost in `x-report`, if any.
fn app(
    layer: RateLimitLayer,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    layer.layer(tower::service_fn(|req: Request<String>| async move {
        let status = req
            .headers()
            .get("x-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(200u16);
        let mut resp = Response::new(String::from("ok"));
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        if let Some(n) = req
            .headers()
            .get("x-report")
            .and_then(|v| v.to_str().ok()?.parse().ok())
        {
            resp.extensions_mut().insert(ReportedCost(n));
        }
        Ok::<_, Infallible>(resp)
    }))
}

fn request(peer: &str, path: &str, headers: &[(&str, &str)]) -> Request<String> {
    let mut b = Request::builder().uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut req = b.body(String::new()).unwrap();
    let addr: SocketAddr = format!("{peer}:40000").parse().unwrap();
    req.extensions_mut().insert(addr);
    req
}

async fn send<S>(svc: &S, req: Request<String>) -> Response<String>
where
    S: tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    svc.clone().oneshot(req).await.unwrap()
}

async fn statuses<S>(svc: &S, n: usize, req: impl Fn() -> Request<String>) -> Vec<u16>
where
    S: tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(svc, req()).await.status().as_u16());
    }
    out
}

/// Issue 23, 2: `Key::header` without a default left a request without the header
/// unlimited (5 of 5 admitted against a limit of 2). Now it is keyed by its IP, apart from
/// every other IP (docs/clients.md#a-missing-identity-is-never-no-limit).
async fn a_missing_key_is_limited_by_ip_not_unlimited(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let rule = Rule::new("/", Gcra::new(2, 1, 60).unwrap(), Key::header("x-api-key"))
        .unwrap()
        .name("api")
        .unwrap();
    let svc = app(RateLimitLayer::new(lim.clone()).rule(rule).unwrap());
    let got = statuses(&svc, 5, || request("203.0.113.1", "/x", &[])).await;
    assert_eq!(got, [200, 200, 429, 429, 429]);
    // Another keyless client is not blocked by the first (no shared "anonymous" bucket).
    assert_eq!(
        send(&svc, request("203.0.113.2", "/x", &[])).await.status(),
        200
    );
    // A client with a key has its own bucket.
    let keyed = send(&svc, request("203.0.113.1", "/x", &[("x-api-key", "k")])).await;
    assert_eq!(keyed.status(), 200);
    let mut con = server.conn();
    let prefix = lim.prefix();
    let exists: i64 = common::q(
        &mut con,
        &["EXISTS", &format!("{prefix}api:{{ip:203.0.113.1}}")],
    );
    assert_eq!(exists, 1);
}

async fn a_missing_key_can_be_denied_or_skipped_explicitly(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let rule = |m| {
        Rule::new("/", "2/minute", Key::header("x-api-key"))
            .unwrap()
            .name("api")
            .unwrap()
            .missing(m)
    };
    let deny = app(RateLimitLayer::new(lim.clone())
        .rule(rule(Missing::Deny))
        .unwrap());
    let r = send(&deny, request("203.0.113.1", "/", &[])).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(
        r.body().contains("\"error\": \"identity_required\""),
        "{}",
        r.body()
    );
    assert!(r.body().contains("\"policy\": \"api\""), "{}", r.body());
    assert!(!r.headers().contains_key("ratelimit"));
    assert_eq!(lim.counters().snapshot().missing_denied, 1);
    let calls = lim.counters().snapshot().redis_calls;
    // The layer-wide default applies to rules without their own.
    let skip = app(RateLimitLayer::new(lim.clone())
        .missing(Missing::Skip)
        .rule(Rule::new("/", "2/minute", Key::header("x-api-key")).unwrap())
        .unwrap());
    let got = statuses(&skip, 5, || request("203.0.113.1", "/", &[])).await;
    assert_eq!(got, [200; 5]);
    let c = lim.counters().snapshot();
    assert_eq!(
        (c.skipped, c.redis_calls),
        (5, calls),
        "skipped, counted, no call"
    );
}

async fn exempt_requests_make_no_redis_call(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let svc = app(RateLimitLayer::new(lim.clone())
        .rule(
            Rule::any("1/minute", Key::ip())
                .unwrap()
                .exempt_when(|req| req.header("x-rule-exempt").is_some()),
        )
        .unwrap()
        .exempt_when(|req| req.header("x-internal").is_some()));
    for headers in [
        vec![("x-internal", "1")],
        vec![("x-rule-exempt", "1")],
        vec![
            ("origin", "https://a.example"),
            ("access-control-request-method", "POST"),
        ],
    ] {
        for _ in 0..3 {
            let mut req = request("198.51.100.1", "/x", &headers);
            if headers[0].0 == "origin" {
                *req.method_mut() = http::Method::OPTIONS;
            }
            let r = send(&svc, req).await;
            assert_eq!(r.status(), 200, "{headers:?}");
            assert!(!r.headers().contains_key("ratelimit"), "{headers:?}");
        }
    }
    assert_eq!(lim.counters().snapshot().redis_calls, 0);
    // Not exempt: limited. A preflight is limited too once the exemption is turned off.
    let got = statuses(&svc, 2, || request("198.51.100.1", "/x", &[])).await;
    assert_eq!(got, [200, 429]);
    let strict = app(RateLimitLayer::new(lim.clone())
        .exempt_preflights(false)
        .rule(Rule::any("1/minute", Key::ip()).unwrap())
        .unwrap());
    let preflight = || {
        let mut req = request(
            "198.51.100.2",
            "/x",
            &[
                ("origin", "https://a.example"),
                ("access-control-request-method", "POST"),
            ],
        );
        *req.method_mut() = http::Method::OPTIONS;
        req
    };
    assert_eq!(statuses(&strict, 2, preflight).await, [200, 429]);
}

async fn deduct_when_refunds_the_statuses_it_refuses(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let svc = app(RateLimitLayer::new(lim.clone())
        .rule(
            Rule::any(Gcra::new(2, 1, 60).unwrap(), Key::ip())
                .unwrap()
                .name("d")
                .unwrap()
                .deduct_when(|s| s.is_success()),
        )
        .unwrap());
    // Failed responses are refunded: five 500s in a row never exhaust a limit of 2.
    let fail = || request("192.0.2.50", "/", &[("x-status", "500")]);
    assert_eq!(statuses(&svc, 5, fail).await, [500; 5]);
    assert_eq!(lim.counters().snapshot().refunded, 5);
    let ok = || request("192.0.2.50", "/", &[]);
    assert_eq!(statuses(&svc, 3, ok).await, [200, 200, 429]);
    // The layer-wide predicate applies to rules without one.
    let lim2 = support::limiter(&server).await;
    let svc = app(RateLimitLayer::new(lim2.clone())
        .deduct_when(|s| s != StatusCode::NOT_MODIFIED)
        .rule(Rule::any(Gcra::new(1, 1, 60).unwrap(), Key::ip()).unwrap())
        .unwrap());
    let cached = || request("192.0.2.51", "/", &[("x-status", "304")]);
    assert_eq!(statuses(&svc, 3, cached).await, [304; 3]);
    let ok = || request("192.0.2.51", "/", &[]);
    assert_eq!(statuses(&svc, 2, ok).await, [200, 429]);
}

async fn a_reported_cost_is_refunded_or_forced(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let svc = app(RateLimitLayer::new(lim.clone())
        .rule(
            Rule::any(
                Window::new(10, 60, redis_rl_client::Algorithm::Fixed).unwrap(),
                Key::ip(),
            )
            .unwrap()
            .name("tokens")
            .unwrap()
            .cost(3),
        )
        .unwrap());
    let key = format!("{}tokens:{{ip:192.0.2.60}}", lim.prefix());
    let window = Window::new(10, 60, redis_rl_client::Algorithm::Fixed).unwrap();
    let raw = support::limiter_with(&server, |b| b.prefix("").deny_cache(false)).await;
    let remaining = || async {
        raw.check(key.as_str(), &window)
            .cost(0)
            .await
            .unwrap()
            .remaining
    };
    // Charged 3 up front; the handler reports 1: 2 come back.
    let r = send(&svc, request("192.0.2.60", "/", &[("x-report", "1")])).await;
    assert_eq!(r.status(), 200);
    assert_eq!(remaining().await, 9);
    // Reports 6: 3 more are recorded (FORCE).
    send(&svc, request("192.0.2.60", "/", &[("x-report", "6")])).await;
    assert_eq!(remaining().await, 3);
    // A report of exactly the charge changes nothing.
    send(&svc, request("192.0.2.60", "/", &[("x-report", "3")])).await;
    assert_eq!(remaining().await, 0);
}

async fn on_denied_builds_the_answer_and_keeps_the_fields(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let layer = RateLimitLayer::new(lim.clone())
        .rule(
            Rule::new("/a", Gcra::new(1, 1, 60).unwrap(), Key::ip())
                .unwrap()
                .name("a")
                .unwrap(),
        )
        .unwrap()
        .rule(
            Rule::new("/who", "5/minute", Key::header("x-user"))
                .unwrap()
                .missing(Missing::Deny),
        )
        .unwrap()
        .on_denied(|denial| {
            let mut resp = Response::new(format!(
                "<p>{:?} by {} ({})</p>",
                denial.reason, denial.policy, denial.request.path
            ));
            *resp.status_mut() = match denial.reason {
                DenialReason::RateLimited => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::FORBIDDEN,
            };
            resp.headers_mut()
                .insert("content-type", "text/html".parse().unwrap());
            resp
        });
    let svc = app(layer);
    assert_eq!(
        send(&svc, request("192.0.2.70", "/a", &[])).await.status(),
        200
    );
    let denied = send(&svc, request("192.0.2.70", "/a", &[])).await;
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.body(), "<p>RateLimited by a (/a)</p>");
    assert_eq!(denied.headers()["content-type"], "text/html");
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // 60 s less the time the two requests took on a loaded machine.
    assert!((50..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(denied.headers()["ratelimit-policy"], "\"a\";q=1;w=60");
    assert!(denied.headers()["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"a\";r=0;t="));
    let who = send(&svc, request("192.0.2.70", "/who", &[])).await;
    assert_eq!(who.status(), StatusCode::FORBIDDEN);
    assert!(
        who.body().starts_with("<p>IdentityRequired"),
        "{}",
        who.body()
    );
}

async fn limits_from_strings_and_per_request_functions(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let pro: Limits = "4/minute".parse().unwrap();
    let free: Limits = "1/minute; 2 per hour".parse().unwrap();
    let by_plan = Limits::from_fn(move |req| {
        if req.header("x-plan").as_deref() == Some("pro") {
            pro.clone()
        } else {
            free.clone()
        }
    });
    let svc = app(RateLimitLayer::new(lim.clone())
        .rule(
            Rule::new("/", by_plan, Key::header("x-api-key"))
                .unwrap()
                .name("plan")
                .unwrap(),
        )
        .unwrap());
    let pro = || request("192.0.2.80", "/", &[("x-api-key", "p"), ("x-plan", "pro")]);
    assert_eq!(statuses(&svc, 5, pro).await, [200, 200, 200, 200, 429]);
    let free = || request("192.0.2.80", "/", &[("x-api-key", "f")]);
    let first = send(&svc, free()).await;
    assert_eq!(first.status(), 200);
    assert_eq!(
        first.headers()["ratelimit-policy"],
        "\"plan-60s\";q=1;w=60, \"plan-3600s\";q=2;w=3600"
    );
    assert_eq!(send(&svc, free()).await.status(), 429);
}

async fn the_default_rule_covers_unmatched_routes(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let svc = app(RateLimitLayer::new(lim.clone())
        .rule(Rule::new("/api/", "5/minute", Key::ip()).unwrap())
        .unwrap()
        .default_rule(
            Rule::any("2/minute", Key::ip())
                .unwrap()
                .name("default")
                .unwrap(),
        )
        .unwrap());
    let scan = |i: usize| request("192.0.2.90", &format!("/nowhere/{i}"), &[]);
    let mut got = Vec::new();
    for i in 0..3 {
        got.push(send(&svc, scan(i)).await.status().as_u16());
    }
    assert_eq!(
        got,
        [200, 200, 429],
        "every unmatched path shares the default limit"
    );
    assert_eq!(
        send(&svc, request("192.0.2.90", "/api/x", &[]))
            .await
            .status(),
        200
    );
}

async fn an_unusable_forwarded_header_falls_back_to_the_peer(kind: Kind) {
    let server = kind.server();
    let lim = support::limiter(&server).await;
    let svc = app(RateLimitLayer::new(lim.clone())
        .client_ip(ClientIp::new().trusted(["10.0.0.0/8"]).unwrap())
        .rule(
            Rule::any("1/minute", Key::ip())
                .unwrap()
                .name("ip")
                .unwrap(),
        )
        .unwrap());
    // Garbage from the proxy: the proxy's address is the client (and it is counted), so a
    // client cannot get a fresh bucket per garbage value.
    let garbage = |v: &'static str| move || request("10.0.0.9", "/", &[("x-forwarded-for", v)]);
    assert_eq!(send(&svc, garbage("not-an-ip")()).await.status(), 200);
    assert_eq!(send(&svc, garbage("also, :80")()).await.status(), 429);
    assert_eq!(lim.counters().snapshot().forwarded_unusable, 2);
    // IPv6 clients are keyed by their /64.
    let v6 = |a: &'static str| move || request("10.0.0.9", "/", &[("x-forwarded-for", a)]);
    assert_eq!(send(&svc, v6("2001:db8:1:2::1")()).await.status(), 200);
    assert_eq!(send(&svc, v6("2001:db8:1:2:ffff::7")()).await.status(), 429);
    assert_eq!(send(&svc, v6("2001:db8:1:3::1")()).await.status(), 200);
}

/// Requests without a usable client address (no peer in the extensions) are limited in the
/// one `ip:unknown` bucket, counted per request (`peer_unknown`), and warned about once per
/// layer, with how to fix the deployment.
fn without_a_peer_address_one_warning(kind: Kind) {
    let capture = support::Capture::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = kind.server();
    tracing::subscriber::with_default(capture.clone(), || {
        rt.block_on(async {
            // Decided by Redis only (a slow reply is a 503 here, never an open admission).
            let lim = support::limiter_with(&server, |b| {
                b.on_error(redis_rl_client::FailurePolicy::Closed)
                    .timeout(std::time::Duration::from_secs(5))
            })
            .await;
            let svc = app(RateLimitLayer::new(lim.clone())
                .rule(
                    Rule::any("2/minute", Key::ip())
                        .unwrap()
                        .name("np")
                        .unwrap(),
                )
                .unwrap());
            let no_peer = || Request::builder().uri("/").body(String::new()).unwrap();
            assert_eq!(statuses(&svc, 4, no_peer).await, [200, 200, 429, 429]);
            assert_eq!(lim.counters().snapshot().peer_unknown, 4);
        })
    });
    assert_eq!(capture.count("no usable client address"), 1);
    assert_eq!(
        capture.count("trusted([\"unix\"])"),
        1,
        "says how to fix it"
    );
}

#[test]
fn module_without_a_peer_address_one_warning() {
    without_a_peer_address_one_warning(Kind::Module);
}

#[test]
fn fallback_without_a_peer_address_one_warning() {
    without_a_peer_address_one_warning(Kind::Fallback);
}
