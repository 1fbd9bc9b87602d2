//! End to end, as users run it: the axum example (`examples/axum.rs`, compiled in here) served
//! by two real axum servers (each in its own thread with its own Tokio runtime, limiter and
//! Redis connection, on its own loopback port) sharing one limit in one `redis-server`, and
//! real HTTP/1.1 requests over TCP alternating between them: the fleet admits exactly the
//! limit. Then the same layer on a plain hyper server. Both modes.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

#[path = "../examples/axum.rs"]
#[allow(dead_code)]
mod example;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use redis_rl_client::http::{Key, Rule};
use redis_rl_client::{FailurePolicy, Gcra, Limiter, RateLimitLayer};
use support::Kind;
use tower::{Layer, Service};

/// One instance of the example app: a thread running its own runtime and axum server.
struct Instance {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Instance {
    fn start(url: String, prefix: String, name: &str) -> Instance {
        let open = (FailurePolicy::Open, Duration::from_millis(300));
        Instance::start_on(vec![url], false, prefix, name, Some(open))
    }

    /// An instance whose limiter talks to `urls` (one server, or a Redis Cluster's nodes)
    /// with this failure policy and timeout, or (`None`) the limiter the example's `main`
    /// builds.
    fn start_on(
        urls: Vec<String>,
        cluster: bool,
        prefix: String,
        name: &str,
        settings: Option<(FailurePolicy, Duration)>,
    ) -> Instance {
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let name = name.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let limiter = match settings {
                    None => example::limiter(urls[0].clone(), prefix, 1).await.unwrap(),
                    Some((policy, timeout)) => {
                        let builder = if cluster {
                            Limiter::cluster_builder(urls)
                        } else {
                            Limiter::builder(urls[0].clone())
                        };
                        builder
                            .prefix(prefix)
                            .on_error(policy)
                            .timeout(timeout)
                            .build()
                            .await
                            .unwrap()
                    }
                };
                let app = example::app(limiter, name).unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap().port()).unwrap();
                axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
            });
        });
        let port = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the app did not start");
        Instance {
            port,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.headers))
    }
}

/// One real HTTP/1.1 request on a new TCP connection.
async fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    http_on(stream, &format!("127.0.0.1:{port}"), method, path, headers).await
}

/// One real HTTP/1.1 request on a new connection to the Unix socket at `socket`.
async fn http_unix(
    socket: &std::path::Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    http_on(stream, "localhost", method, path, headers).await
}

async fn http_on<S>(
    stream: S,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        sender.send_request(req.body(Empty::<Bytes>::new()).unwrap()),
    )
    .await
    .expect("no answer within 10 s")
    .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn fleet(server: &common::Server) -> (Instance, Instance) {
    let prefix = support::prefix();
    let url = support::url(server);
    (
        Instance::start(url.clone(), prefix.clone(), "a"),
        Instance::start(url, prefix, "b"),
    )
}

both_modes!(
    two_instances_share_one_limit,
    concurrent_requests_across_the_fleet_admit_exactly_the_limit,
    per_ip_limit_honours_trusted_proxies,
    too_large_requests_get_413,
    per_route_limit_and_exemptions,
    failure_policy_through_the_server,
    plain_hyper_service,
    rotating_api_keys_from_one_ip_are_held_to_the_per_ip_limit,
    rotating_api_keys_on_a_cluster_are_held_to_the_per_ip_limit,
    zero_units_are_charged,
    the_example_keeps_limiting_while_redis_is_down,
    a_restart_while_the_app_is_idle_is_answered_by_redis,
    a_literal_hash_never_shares_a_long_keys_bucket,
    degraded_answers_carry_no_ratelimit_fields,
    repeated_header_lines_are_one_list,
    a_forwarded_value_with_an_unclosed_quote_is_unusable,
    over_a_unix_socket_requests_without_an_address_share_one_bucket,
    one_limit_name_is_one_bucket_across_rules,
    a_reported_cost_beyond_the_arithmetic_is_recorded_saturated_and_counted,
);

/// Issue 23's reproduction: one client (one IP) rotating `X-API-Key` on every request gets a
/// fresh per-key bucket each time, but the per-IP limit (100 per minute) still holds it
/// (docs/clients.md#identities-stay-apart).
async fn rotating_keys_against(port: u16) -> Vec<bool> {
    let mut admitted = Vec::new();
    for i in 0..150 {
        let key = format!("k{i}");
        let r = http(port, "GET", "/api/thing", &[("X-API-Key", key.as_str())]).await;
        assert!(
            r.status == StatusCode::OK || r.status == StatusCode::TOO_MANY_REQUESTS,
            "{}: {}",
            r.status,
            r.body
        );
        admitted.push(r.status == StatusCode::OK);
    }
    admitted
}

/// The per-key key of API key `k{i}` in the example's layout (prefix included).
fn api_key_of(prefix: &str, i: usize) -> String {
    format!("{prefix}api:{{hdr.x-api-key:k{i}}}")
}

/// A denied request left no charge: the per-key buckets of the denied requests do not
/// exist (RL.ALL wrote nothing, or the refund returned the key to idle, which deletes it);
/// those of the admitted ones do.
fn assert_no_charge_on_denial(admitted: &[bool], exists: impl Fn(&str) -> bool, prefix: &str) {
    assert_eq!(admitted.iter().filter(|a| **a).count(), 100);
    for (i, ok) in admitted.iter().enumerate() {
        assert_eq!(exists(&api_key_of(prefix, i)), *ok, "k{i}");
    }
}

/// Decided by Redis only: a timeout on this loaded machine is a 503 (and fails the test),
/// never a silent fail-open admission.
const STRICT: Option<(FailurePolicy, Duration)> =
    Some((FailurePolicy::Closed, Duration::from_secs(5)));

/// A limiter on `server` decided by Redis only (as [`STRICT`]), configured by `f`.
async fn strict_with(
    server: &common::Server,
    f: impl FnOnce(redis_rl_client::LimiterBuilder) -> redis_rl_client::LimiterBuilder,
) -> Limiter {
    support::limiter_with(server, |b| {
        f(b.on_error(FailurePolicy::Closed)
            .timeout(Duration::from_secs(5)))
    })
    .await
}

async fn strict(server: &common::Server) -> Limiter {
    strict_with(server, |b| b).await
}

async fn rotating_api_keys_from_one_ip_are_held_to_the_per_ip_limit(kind: Kind) {
    let server = kind.server();
    let prefix = support::prefix();
    let a = Instance::start_on(
        vec![support::url(&server)],
        false,
        prefix.clone(),
        "a",
        STRICT,
    );
    let admitted = rotating_keys_against(a.port).await;
    let exists = |k: &str| common::q::<i64>(&mut server.conn(), &["EXISTS", k]) == 1;
    assert_no_charge_on_denial(&admitted, exists, &prefix);
}

async fn rotating_api_keys_on_a_cluster_are_held_to_the_per_ip_limit(kind: Kind) {
    let cl = support::cluster(kind);
    let urls: Vec<String> = cl.nodes.iter().map(support::url).collect();
    let prefix = support::prefix();
    let a = Instance::start_on(urls, true, prefix.clone(), "a", STRICT);
    let admitted = rotating_keys_against(a.port).await;
    // On the cluster the per-key and per-IP keys live in different slots: the denied
    // requests' per-key charges were refunded.
    let exists = |k: &str| common::q::<i64>(&mut cl.owner(k).conn(), &["EXISTS", k]) == 1;
    assert_no_charge_on_denial(&admitted, exists, &prefix);
}

/// `X-Units: 0` used to be a free pass: QUANTITY 0 only reports, so it was always admitted
/// and never charged. Every upload costs at least one unit.
async fn zero_units_are_charged(kind: Kind) {
    let server = kind.server();
    let a = Instance::start_on(
        vec![support::url(&server)],
        false,
        support::prefix(),
        "a",
        STRICT,
    );
    let mut got = Vec::new();
    for _ in 0..7 {
        got.push(
            http(a.port, "POST", "/upload", &[("X-Units", "0")])
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(got, [200, 200, 200, 200, 200, 429, 429]);
    let huge = http(
        a.port,
        "POST",
        "/upload",
        &[("X-Units", "18446744073709551616")],
    )
    .await;
    assert_eq!(huge.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", huge.body);
}

async fn two_instances_share_one_limit(kind: Kind) {
    let server = kind.server();
    let (a, b) = fleet(&server);
    let mut replies = Vec::new();
    for i in 0..30 {
        let port = if i % 2 == 0 { a.port } else { b.port };
        replies.push(http(port, "GET", "/api/thing", &[("X-API-Key", "cust-1")]).await);
    }
    let ok = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    let denied = replies
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((ok, denied), (10, 20), "the fleet admits exactly the limit");
    let instances: std::collections::HashSet<&str> = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .map(|r| if r.body.contains("\"a\"") { "a" } else { "b" })
        .collect();
    assert_eq!(instances.len(), 2, "both instances admitted some");
    let first = &replies[0];
    assert_eq!(
        first.header("ratelimit-policy"),
        "\"api\";q=10;w=600, \"ip\";q=100;w=60"
    );
    assert!(
        first
            .header("ratelimit")
            .starts_with("\"api\";r=9;t=60, \"ip\";r=99;t="),
        "{}",
        first.header("ratelimit")
    );
    assert!(
        first.body.contains("\"remaining\": 9"),
        "the handler sees the decision"
    );
    let last = replies.last().unwrap();
    let retry = retry_after_near(last.header("retry-after"), 60);
    assert!(last.header("content-type").starts_with("application/json"));
    assert_eq!(
        last.body,
        format!(
            r#"{{"error": "rate_limited", "message": "too many requests", "policy": "api", "retry_after": {retry}}}"#
        )
    );
    // Another API key has its own limit.
    let other = http(b.port, "GET", "/api/thing", &[("X-API-Key", "cust-2")]).await;
    assert_eq!(other.status, StatusCode::OK);
}

async fn concurrent_requests_across_the_fleet_admit_exactly_the_limit(kind: Kind) {
    let server = kind.server();
    let (a, b) = fleet(&server);
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let port = if i % 2 == 0 { a.port } else { b.port };
            tokio::spawn(async move {
                http(port, "GET", "/api/thing", &[("X-API-Key", "burst")])
                    .await
                    .status
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        let s = t.await.unwrap();
        assert!(
            s == StatusCode::OK || s == StatusCode::TOO_MANY_REQUESTS,
            "{s}"
        );
        ok += usize::from(s == StatusCode::OK);
    }
    assert_eq!(ok, 10);
}

async fn per_ip_limit_honours_trusted_proxies(kind: Kind) {
    let server = kind.server();
    let (a, b) = fleet(&server);
    // The app trusts loopback (our connection) as a proxy, so X-Forwarded-For names the
    // client; a forged left-most entry does not help. The IP limit is keyed by the IP alone.
    let r = http(
        a.port,
        "GET",
        "/api/thing",
        &[
            ("X-API-Key", "k-ip"),
            ("X-Forwarded-For", "6.6.6.6, 198.51.100.20"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("ratelimit").contains("\"ip\";r=99"));
    let r2 = http(
        b.port,
        "GET",
        "/api/thing",
        &[
            ("X-API-Key", "k-ip"),
            ("X-Forwarded-For", "7.7.7.7, 198.51.100.20"),
        ],
    )
    .await;
    assert!(
        r2.header("ratelimit").contains("\"ip\";r=98"),
        "same client, other instance"
    );
    let r3 = http(
        b.port,
        "GET",
        "/api/thing",
        &[("X-API-Key", "k-ip"), ("X-Forwarded-For", "198.51.100.21")],
    )
    .await;
    assert!(
        r3.header("ratelimit").contains("\"ip\";r=99"),
        "another client IP"
    );
}

async fn too_large_requests_get_413(kind: Kind) {
    let server = kind.server();
    let (a, _b) = fleet(&server);
    let r = http(a.port, "POST", "/upload", &[("X-Units", "6")]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        r.body.contains("\"error\": \"request_too_large\""),
        "{}",
        r.body
    );
    assert!(!r.headers.contains_key("retry-after"));
    let ok = http(a.port, "POST", "/upload", &[("X-Units", "5")]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.header("ratelimit-policy"), "\"upload\";q=5;w=300");
}

async fn per_route_limit_and_exemptions(kind: Kind) {
    let server = kind.server();
    let (a, b) = fleet(&server);
    let mut got = Vec::new();
    for port in [a.port, b.port, a.port] {
        got.push(http(port, "GET", "/reports", &[("X-API-Key", "rep")]).await);
    }
    assert_eq!(
        got.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>(),
        [200, 200, 429]
    );
    assert_eq!(got[0].header("ratelimit-policy"), "\"reports\";q=2;w=120");
    retry_after_near(got[2].header("retry-after"), 60);
    assert!(got[2].body.contains("\"policy\": \"reports\""));
    let health = http(a.port, "GET", "/health", &[]).await;
    assert_eq!(health.status, StatusCode::OK);
    assert!(!health.headers.contains_key("ratelimit"));
}

async fn failure_policy_through_the_server(kind: Kind) {
    // The apps are configured fail-open: with Redis paused they answer 200 within the
    // client's timeout, and come back to Redis's decisions when it resumes.
    let server = kind.server();
    let (a, _b) = fleet(&server);
    let key = [("X-API-Key", "fo")];
    assert_eq!(
        http(a.port, "GET", "/api/thing", &key).await.status,
        StatusCode::OK
    );
    let pid = server.pid().unwrap().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let start = Instant::now();
    let r = http(a.port, "GET", "/api/thing", &key).await;
    let took = start.elapsed();
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        !r.headers.contains_key("ratelimit"),
        "degraded: nothing known"
    );
    // Bounded by the client's 300 ms timeout, not a hang (a generous margin for a loaded
    // machine: a hang is forever).
    assert!(took < Duration::from_secs(10), "{took:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = http(a.port, "GET", "/api/thing", &key).await;
        if r.headers.contains_key("ratelimit") {
            break;
        }
        assert!(Instant::now() < deadline, "did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = http(a.port, "GET", "/metrics", &[]).await;
    assert!(!m.body.contains("\"degraded\": 0,"), "{}", m.body);
    assert!(!m.body.contains("\"errors\": 0,"), "{}", m.body);
}

async fn plain_hyper_service(kind: Kind) {
    // No axum: the layer around a tower `service_fn`, served by hyper, with the peer
    // address inserted where the connection is accepted.
    let server = kind.server();
    let limiter = support::limiter(&server).await;
    let layer = RateLimitLayer::new(limiter)
        .rule(
            Rule::new(
                "/",
                Gcra::new(2, 1, 60).unwrap().named("hyper").unwrap(),
                Key::ip(),
            )
            .unwrap(),
        )
        .unwrap();
    let svc = layer.layer(tower::service_fn(|req: Request<Incoming>| async move {
        let remaining = req
            .extensions()
            .get::<redis_rl_client::Decision>()
            .map_or(0, |d| d.remaining);
        Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::from(format!(
            "remaining {remaining}"
        ))))
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accept = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                break;
            };
            let svc = svc.clone();
            let with_peer = tower::service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(peer);
                let mut svc = svc.clone();
                async move { svc.call(req).await }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(with_peer)),
            );
        }
    });
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(http(port, "GET", "/x", &[]).await);
    }
    accept.abort();
    assert_eq!(
        got.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>(),
        [200, 200, 429]
    );
    assert_eq!(got[0].body, "remaining 1");
    assert_eq!(got[0].header("ratelimit"), "\"hyper\";r=1;t=60");
    retry_after_near(got[2].header("retry-after"), 60);
}

/// The example's own limiter (`main`'s: FailurePolicy::Local): with Redis stopped the
/// instance keeps answering and keeps limiting, from memory, with real RateLimit fields, and
/// goes back to Redis when it is started again.
async fn the_example_keeps_limiting_while_redis_is_down(kind: Kind) {
    let mut server = kind.server();
    let a = Instance::start_on(
        vec![support::url(&server)],
        false,
        support::prefix(),
        "a",
        None,
    );
    let up = http(a.port, "POST", "/upload", &[]).await;
    assert_eq!(up.status, StatusCode::OK);
    server.stop();
    let first_local = Instant::now();
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(http(a.port, "POST", "/upload", &[]).await);
    }
    let elapsed = first_local.elapsed();
    assert_eq!(
        got.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>(),
        [200, 200, 200, 200, 200, 429],
        "the local limiter's own 5 units"
    );
    assert!(
        got[0].header("ratelimit").starts_with("\"upload\";r=4;"),
        "{:?}",
        got[0].headers
    );
    // 60 s from the first local charge, less the time the requests took (measured).
    let retry: u64 = got[5].header("retry-after").parse().unwrap();
    assert!(
        retry <= 60 && retry + elapsed.as_secs() + 1 >= 60,
        "{retry}"
    );
    let m = http(a.port, "GET", "/metrics", &[]).await;
    assert!(!m.body.contains("\"local\": 0,"), "{}", m.body);
    server.restart();
    // The local bucket is empty for a minute, so the first 200 is Redis's, and the
    // restarted server (no persistence) starts the key afresh.
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        let r = http(a.port, "POST", "/upload", &[]).await;
        if r.status == StatusCode::OK {
            break r;
        }
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < deadline, "did not return to Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        back.header("ratelimit").starts_with("\"upload\";r=4;"),
        "{:?}",
        back.headers
    );
}

/// docs/clients.md#recovery, over HTTP: Redis restarts on the same port while the example
/// (the local failure policy, as its own limiter; a 5 s timeout, so that a slow reply on this
/// loaded machine is not taken for an outage) is idle; the very next request is decided by
/// Redis (its key is written there), not by the failure policy, and no outage is counted.
async fn a_restart_while_the_app_is_idle_is_answered_by_redis(kind: Kind) {
    let mut server = kind.server();
    let prefix = support::prefix();
    let a = Instance::start_on(
        vec![support::url(&server)],
        false,
        prefix.clone(),
        "a",
        Some((FailurePolicy::Local, Duration::from_secs(5))),
    );
    let key = format!("{prefix}upload:{{ip:127.0.0.1}}");
    let exists = |server: &common::Server| {
        common::q::<i64>(&mut server.conn(), &["EXISTS", key.as_str()]) == 1
    };
    for round in 0..3 {
        let r = http(a.port, "POST", "/upload", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "round {round}: {}", r.body);
        assert!(r.header("ratelimit").starts_with("\"upload\";r=4;"));
        assert!(exists(&server), "round {round}: decided in Redis");
        server.restart(); // no persistence: the key goes with it
        assert!(!exists(&server));
    }
    let m = http(a.port, "GET", "/metrics", &[]).await;
    for zero in ["\"degraded\": 0,", "\"local\": 0,", "\"errors\": 0,"] {
        assert!(m.body.contains(zero), "{zero} {}", m.body);
    }
}

/// docs/clients.md#identity-values: a value over 128 bytes is stored hashed, as
/// `~sha256:<hex>`, a form no literal value can take (a literal `~` is `%7E`). The reviewer's
/// collision: 10 requests with `X-API-Key: sha256:<sha256 of 200 × "a">` used to exhaust the
/// real long key's bucket.
async fn a_literal_hash_never_shares_a_long_keys_bucket(kind: Kind) {
    use sha2::{Digest, Sha256};

    let server = kind.server();
    let prefix = support::prefix();
    let a = Instance::start_on(
        vec![support::url(&server)],
        false,
        prefix.clone(),
        "a",
        STRICT,
    );
    let long = "a".repeat(200);
    let hex = format!("{:x}", Sha256::digest(long.as_bytes()));
    let literal = format!("sha256:{hex}");
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            http(
                a.port,
                "GET",
                "/reports",
                &[("X-API-Key", literal.as_str())],
            )
            .await,
        );
    }
    assert_eq!(
        got.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>(),
        [200, 200, 429],
        "the literal's own bucket (2 at once)"
    );
    let real = http(a.port, "GET", "/reports", &[("X-API-Key", long.as_str())]).await;
    assert_eq!(
        real.status,
        StatusCode::OK,
        "the long key's bucket is its own"
    );
    assert!(real.header("ratelimit").starts_with("\"reports\";r=1;"));
    let exists = |k: &str| common::q::<i64>(&mut server.conn(), &["EXISTS", k]) == 1;
    assert!(exists(&format!(
        "{prefix}reports:{{hdr.x-api-key:~sha256:{hex}}}"
    )));
    assert!(exists(&format!(
        "{prefix}reports:{{hdr.x-api-key:sha256:{hex}}}"
    )));
    // A literal `~sha256:…` is escaped, so it cannot reach the hashed form either.
    let tilde = format!("~sha256:{hex}");
    let r = http(a.port, "GET", "/reports", &[("X-API-Key", tilde.as_str())]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(exists(&format!(
        "{prefix}reports:{{hdr.x-api-key:%7Esha256:{hex}}}"
    )));
}

/// docs/clients.md#closed-policy: the degraded answers of the open and closed policies (an
/// admission, a 503) carry no RateLimit fields, neither `RateLimit` nor `RateLimit-Policy`,
/// for one limit (`/reports`) and for several (`/api/thing`: one check_all); the closed
/// policy's 503 keeps its `Retry-After`.
async fn degraded_answers_carry_no_ratelimit_fields(kind: Kind) {
    let mut server = kind.server();
    let url = support::url(&server);
    let open = Instance::start_on(
        vec![url.clone()],
        false,
        support::prefix(),
        "open",
        Some((FailurePolicy::Open, Duration::from_secs(5))),
    );
    let closed = Instance::start_on(
        vec![url],
        false,
        support::prefix(),
        "closed",
        Some((FailurePolicy::Closed, Duration::from_secs(5))),
    );
    let key = [("X-API-Key", "dg")];
    for port in [open.port, closed.port] {
        let r = http(port, "GET", "/reports", &key).await;
        assert!(r.headers.contains_key("ratelimit-policy"), "Redis up");
    }
    server.stop();
    for (port, want) in [
        (open.port, StatusCode::OK),
        (closed.port, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        for path in ["/reports", "/api/thing"] {
            let r = http(port, "GET", path, &key).await;
            assert_eq!(r.status, want, "{path}: {}", r.body);
            for field in ["ratelimit", "ratelimit-policy", "x-ratelimit-limit"] {
                assert!(
                    !r.headers.contains_key(field),
                    "{want} {path}: a degraded answer with {field}: {:?}",
                    r.headers
                );
            }
            assert_eq!(
                r.headers.contains_key("retry-after"),
                want == StatusCode::SERVICE_UNAVAILABLE,
                "{path}"
            );
        }
    }
    server.restart();
}

/// One request has one key whichever server ran it: a header key sent on two lines, as one
/// comma-separated line, or with spaces around the comma is the one list `a, b` (split on
/// `,`, each element trimmed, joined with `", "`, as the Python package's WSGI and ASGI
/// integrations read it), so all three spellings share one bucket.
async fn repeated_header_lines_are_one_list(kind: Kind) {
    let server = kind.server();
    let prefix = support::prefix();
    let a = Instance::start_on(
        vec![support::url(&server)],
        false,
        prefix.clone(),
        "a",
        STRICT,
    );
    let spellings: [&[(&str, &str)]; 3] = [
        &[("X-API-Key", "a"), ("X-API-Key", "b")],
        &[("X-API-Key", "a,b")],
        &[("X-API-Key", " a ,\tb ")],
    ];
    let mut got = Vec::new();
    for headers in spellings {
        got.push(
            http(a.port, "GET", "/reports", headers)
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(got, [200, 200, 429], "one bucket (2 at once)");
    let exists = |k: &str| common::q::<i64>(&mut server.conn(), &["EXISTS", k]) == 1;
    assert!(exists(&format!(
        "{prefix}reports:{{hdr.x-api-key:a%2C%20b}}"
    )));
}

/// An axum app served on a loopback port in this runtime (with the peer address), until the
/// handle is dropped or aborted.
async fn serve(app: axum::Router) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (port, task)
}

/// docs/clients.md#client-ip: `Forwarded: for="1.1.1.1` (an unclosed quote) and
/// `for=2.2.2.2"` (a stray one) are unusable values: the peer is the client and it is
/// counted (`forwarded_unusable`); only a value quoted as a whole (`for="1.1.1.1"`) names
/// 1.1.1.1.
async fn a_forwarded_value_with_an_unclosed_quote_is_unusable(kind: Kind) {
    use redis_rl_client::http::{ClientIp, Forwarding};

    let server = kind.server();
    let lim = strict(&server).await;
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(
            RateLimitLayer::new(lim.clone())
                .client_ip(
                    ClientIp::new()
                        .trusted(["127.0.0.1"])
                        .unwrap()
                        .forwarding(Forwarding::Forwarded),
                )
                .rule(
                    Rule::any("1/minute", Key::ip())
                        .unwrap()
                        .name("fw")
                        .unwrap(),
                )
                .unwrap(),
        );
    let (port, task) = serve(app).await;
    let mut got = Vec::new();
    for value in ["for=\"1.1.1.1", "for=2.2.2.2\"", "for=\"1.1.1.1\""] {
        got.push(
            http(port, "GET", "/", &[("Forwarded", value)])
                .await
                .status
                .as_u16(),
        );
    }
    task.abort();
    assert_eq!(
        got,
        [200, 429, 200],
        "the first two are the peer's bucket, the third 1.1.1.1's"
    );
    assert_eq!(lim.counters().snapshot().forwarded_unusable, 2);
    let exists = |k: &str| common::q::<i64>(&mut server.conn(), &["EXISTS", k]) == 1;
    let prefix = lim.prefix();
    assert!(exists(&format!("{prefix}fw:{{ip:127.0.0.1}}")));
    assert!(exists(&format!("{prefix}fw:{{ip:1.1.1.1}}")));
    assert!(!exists(&format!("{prefix}fw:{{ip:2.2.2.2}}")));
}

/// An axum app served on a Unix socket in `dir` (as behind nginx, or uvicorn `--uds`): its
/// requests carry no peer address.
async fn serve_unix(
    app: axum::Router,
    dir: &std::path::Path,
) -> (std::path::PathBuf, tokio::task::JoinHandle<()>) {
    let path = dir.join("app.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (path, task)
}

/// Issue 23b, 1: over a Unix socket there is no peer address. The IP limits are neither
/// skipped nor unlimited: every request without a usable client address counts in the one
/// bucket `<name>:{ip:unknown}` (Key::ip, and a keyless request's Missing::Ip fallback),
/// counted `peer_unknown`. With "unix" trusted (a proxy in front of the socket), the
/// proxy's X-Forwarded-For names each client.
async fn over_a_unix_socket_requests_without_an_address_share_one_bucket(kind: Kind) {
    use redis_rl_client::http::ClientIp;

    let server = kind.server();
    let dir = tempfile::tempdir().unwrap();
    let rules = |lim: Limiter, client_ip: ClientIp| {
        axum::Router::new()
            .route("/ip", axum::routing::get(|| async { "ok" }))
            .route("/key", axum::routing::get(|| async { "ok" }))
            .layer(
                RateLimitLayer::new(lim)
                    .client_ip(client_ip)
                    .rule(
                        Rule::new("/ip", "3/minute", Key::ip())
                            .unwrap()
                            .name("u")
                            .unwrap(),
                    )
                    .unwrap()
                    .rule(
                        Rule::new("/key", "2/minute", Key::header("X-API-Key"))
                            .unwrap()
                            .name("k")
                            .unwrap(),
                    )
                    .unwrap(),
            )
    };
    let direct = strict(&server).await;
    let (socket, task) = serve_unix(rules(direct.clone(), ClientIp::new()), dir.path()).await;
    let mut by_ip = Vec::new();
    for _ in 0..5 {
        by_ip.push(http_unix(&socket, "GET", "/ip", &[]).await.status.as_u16());
    }
    let mut keyless = Vec::new();
    for _ in 0..3 {
        keyless.push(http_unix(&socket, "GET", "/key", &[]).await.status.as_u16());
    }
    // A forwarding header from an untrusted socket peer names nobody.
    let forged = http_unix(
        &socket,
        "GET",
        "/ip",
        &[("X-Forwarded-For", "198.51.100.9")],
    )
    .await;
    task.abort();
    assert_eq!(
        by_ip,
        [200, 200, 200, 429, 429],
        "one shared bucket, limited"
    );
    assert_eq!(keyless, [200, 200, 429], "the keyless fallback too");
    assert_eq!(forged.status, StatusCode::TOO_MANY_REQUESTS);
    let c = direct.counters().snapshot();
    assert_eq!((c.peer_unknown, c.skipped), (9, 0), "{c:?}");
    let exists = |k: &str| common::q::<i64>(&mut server.conn(), &["EXISTS", k]) == 1;
    let prefix = direct.prefix().to_owned();
    assert!(exists(&format!("{prefix}u:{{ip:unknown}}")));
    assert!(exists(&format!("{prefix}k:{{ip:unknown}}")));

    // Behind a proxy on the socket: trust it, and its header names each client.
    let proxied = strict(&server).await;
    let sub = dir.path().join("proxied");
    std::fs::create_dir(&sub).unwrap();
    let trusted = ClientIp::new().trusted(["unix"]).unwrap();
    let (socket, task) = serve_unix(rules(proxied.clone(), trusted), &sub).await;
    let mut one = Vec::new();
    for _ in 0..4 {
        let r = http_unix(
            &socket,
            "GET",
            "/ip",
            &[("X-Forwarded-For", "198.51.100.1")],
        )
        .await;
        one.push(r.status.as_u16());
    }
    let other = http_unix(
        &socket,
        "GET",
        "/ip",
        &[("X-Forwarded-For", "198.51.100.2")],
    )
    .await;
    let health_check = http_unix(&socket, "GET", "/ip", &[]).await;
    task.abort();
    assert_eq!(one, [200, 200, 200, 429]);
    assert_eq!(other.status, StatusCode::OK, "another client's own bucket");
    assert_eq!(health_check.status, StatusCode::OK);
    let prefix = proxied.prefix().to_owned();
    assert!(exists(&format!("{prefix}u:{{ip:198.51.100.1}}")));
    assert!(
        exists(&format!("{prefix}u:{{ip:unknown}}")),
        "no header: unknown"
    );
    assert_eq!(proxied.counters().snapshot().peer_unknown, 1);
}

/// A limit's name is its bucket's name across the rules of a layer: two rules that give the
/// name `ip` to different limits (the reviewer's 100/minute `/api/` and 5/minute `/two/`,
/// which answered 429 at once; a GCRA and a window on one key answered 500) are refused
/// when the layer is built, naming both rules and the name. The same limit under one name in
/// several rules is one bucket on purpose, over HTTP.
async fn one_limit_name_is_one_bucket_across_rules(kind: Kind) {
    let server = kind.server();
    let lim = strict(&server).await;
    let ip = |path: &str, limit: &str| {
        Rule::all(path, [("ip", limit.parse().unwrap(), Key::ip())]).unwrap()
    };
    let layer = || RateLimitLayer::new(lim.clone());
    let err = layer()
        .rule(ip("/api/", "100/minute"))
        .unwrap()
        .rule(ip("/two/", "5/minute"))
        .unwrap_err();
    let m = err.message();
    assert!(
        m.contains("rule 2 ('/two/')") && m.contains("rule 1 ('/api/')"),
        "{m}"
    );
    assert!(m.contains("both name a limit 'ip'"), "{m}");
    let gcra = Rule::new("/g/", Gcra::new(5, 1, 1).unwrap(), Key::ip())
        .unwrap()
        .methods(["POST"])
        .name("ip")
        .unwrap();
    let err = layer()
        .rule(ip("/api/", "5/minute"))
        .unwrap()
        .rule(gcra.clone())
        .unwrap_err();
    assert!(err.message().contains("rule 2 ('POST /g/')"), "{err}");
    let err = layer()
        .default_rule(gcra)
        .unwrap()
        .rule(ip("/api/", "5/minute"))
        .unwrap_err();
    assert!(err.message().contains("the default rule"), "{err}");
    // Several limits of one string are named `<name>-<window>s`: the same string in two rules
    // named alike is the same limits, so it is accepted.
    let named = |path: &str| {
        Rule::new(path, "3/minute; 10/hour", Key::ip())
            .unwrap()
            .name("both")
            .unwrap()
    };
    assert!(layer()
        .rule(named("/a/"))
        .unwrap()
        .rule(named("/b/"))
        .is_ok());
    // One shared per-IP limit on purpose, and a differently named one apart.
    let app = axum::Router::new()
        .route("/api/x", axum::routing::get(|| async { "ok" }))
        .route("/two/x", axum::routing::get(|| async { "ok" }))
        .route("/three/x", axum::routing::get(|| async { "ok" }))
        .layer(
            layer()
                .rule(ip("/api/", "5/minute"))
                .unwrap()
                .rule(ip("/two/", "5/minute"))
                .unwrap()
                .rule(
                    Rule::new("/three/", "5/minute", Key::ip())
                        .unwrap()
                        .name("three-ip")
                        .unwrap(),
                )
                .unwrap(),
        );
    let (port, task) = serve(app).await;
    let mut got = Vec::new();
    for path in [
        "/api/x", "/api/x", "/api/x", "/two/x", "/two/x", "/two/x", "/three/x",
    ] {
        got.push(http(port, "GET", path, &[]).await.status.as_u16());
    }
    task.abort();
    assert_eq!(got, [200, 200, 200, 200, 200, 429, 200]);
}

/// A reported cost beyond what a limit's arithmetic can hold (2^64 − 1 on a GCRA: its time
/// would pass 64-bit nanoseconds) used to record nothing, with one log line. The layer now
/// records the largest FORCE the limit can hold (the key is used up for as long as the
/// arithmetic goes: centuries), and counts the shortfall in `errors`; the same for the
/// windows (their count saturates). Over HTTP.
async fn a_reported_cost_beyond_the_arithmetic_is_recorded_saturated_and_counted(kind: Kind) {
    use axum::response::IntoResponse;
    use redis_rl_client::{Algorithm, ReportedCost, Window};

    let server = kind.server();
    let lim = strict_with(&server, |b| b.deny_cache(false)).await;
    let handler = |headers: http::HeaderMap| async move {
        let n: u64 = headers["x-report"].to_str().unwrap().parse().unwrap();
        (axum::Extension(ReportedCost(n)), "ok").into_response()
    };
    let g = Gcra::new(5, 1, 60).unwrap();
    let fixed = Window::new(5, 60, Algorithm::Fixed).unwrap();
    let sliding = Window::new(5, 60, Algorithm::Sliding).unwrap();
    let rule = |path: &str, name: &str, limit: redis_rl_client::Limit| {
        Rule::new(path, limit, Key::ip())
            .unwrap()
            .name(name)
            .unwrap()
    };
    let app = axum::Router::new()
        .route("/g", axum::routing::get(handler))
        .route("/f", axum::routing::get(handler))
        .route("/s", axum::routing::get(handler))
        .layer(
            RateLimitLayer::new(lim.clone())
                .rule(rule("/g", "g", g.clone().into()))
                .unwrap()
                .rule(rule("/f", "f", fixed.clone().into()))
                .unwrap()
                .rule(rule("/s", "s", sliding.clone().into()))
                .unwrap(),
        );
    let (port, task) = serve(app).await;
    let max = u64::MAX.to_string();
    let mut first = Vec::new();
    let mut then = Vec::new();
    for path in ["/g", "/f", "/s"] {
        first.push(http(port, "GET", path, &[("x-report", max.as_str())]).await);
        then.push(http(port, "GET", path, &[("x-report", "1")]).await);
    }
    task.abort();
    assert!(first.iter().all(|r| r.status == StatusCode::OK));
    assert_eq!(
        then.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>(),
        [429, 429, 429],
        "the reported usage was recorded"
    );
    let c = lim.counters().snapshot();
    assert_eq!(c.errors, 3, "each shortfall counted: {c:?}");
    // The GCRA key is used up for centuries (as far as 64-bit nanoseconds go), not 60 s.
    let state = lim.check("g:{ip:127.0.0.1}", &g).cost(0).await.unwrap();
    assert_eq!(state.remaining, 0);
    assert!(
        state.reset_after > Duration::from_secs(100 * 365 * 86_400),
        "{state:?}"
    );
    let retry: u64 = then[0].header("retry-after").parse().unwrap();
    assert!(retry > 100 * 365 * 86_400, "{retry}");
    // The windows' counts are saturated: used up until the window ends.
    for (key, w) in [("f:{ip:127.0.0.1}", &fixed), ("s:{ip:127.0.0.1}", &sliding)] {
        let d = lim.check(key, w).cost(0).await.unwrap();
        assert_eq!(d.remaining, 0, "{key}: {d:?}");
    }
}

/// Checks a denial's `Retry-After` against the `full` seconds it names when the requests
/// before it took no time: the seconds that passed between them on a loaded machine are
/// taken off (at most WALL_SLACK_S), never added. Returns the value.
fn retry_after_near(header: &str, full: u64) -> u64 {
    const WALL_SLACK_S: u64 = 10;
    let secs: u64 = header
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After {header:?}"));
    assert!(
        (full.saturating_sub(WALL_SLACK_S)..=full).contains(&secs),
        "Retry-After {secs}, expected {full} less the time the requests took"
    );
    secs
}
