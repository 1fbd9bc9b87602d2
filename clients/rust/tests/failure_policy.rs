//! The failure policy with a real `redis-server` stopped and started again in the middle of a
//! run, and paused (SIGSTOP) to make commands time out: open / closed / error, one `tracing`
//! event per outage and one on recovery, counters, and recovery without help. Both modes.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use common::Server;
use redis_rl_client::{
    Algorithm, Decision, Entry, Error, FailurePolicy, Gcra, Limit, Limiter, LimiterBuilder, Source,
    Window,
};
use support::{signal, Capture, Kind};
use tower::{Layer, ServiceExt};

/// Runs `f` on a current-thread runtime with a `tracing` capture installed on this thread
/// (every task of that runtime runs here, so every event is seen).
fn run<F: Future<Output = ()>>(capture: &Capture, f: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(capture.clone(), || rt.block_on(f));
}

macro_rules! both_modes_traced {
    ($($name:ident),* $(,)?) => {
        mod module {
            $(
                #[test]
                fn $name() {
                    let c = crate::support::Capture::default();
                    crate::run(&c, super::$name(crate::support::Kind::Module, c.clone()));
                }
            )*
        }
        mod fallback {
            $(
                #[test]
                fn $name() {
                    let c = crate::support::Capture::default();
                    crate::run(&c, super::$name(crate::support::Kind::Fallback, c.clone()));
                }
            )*
        }
    };
}

both_modes_traced!(
    open_admits_degraded_then_recovers,
    closed_denies_with_a_short_retry_then_recovers,
    error_policy_returns_unavailable_then_recovers,
    a_stalled_server_times_out_into_the_policy,
    server_restarted_empty_is_detected_again,
    built_while_redis_is_down,
    the_layer_answers_503_while_redis_is_down,
    the_first_probe_after_redis_returns_reaches_it,
    refund_and_release_inside_the_probe_interval_do_not_wait,
    local_enforces_the_limits_in_memory_then_returns_to_redis,
    local_through_the_layer_answers_429_with_real_fields,
    a_lease_that_cannot_be_renewed_for_a_lease_time_is_lost,
    a_restart_while_idle_is_not_an_outage,
    local_refund_after_recovery_goes_back_to_memory,
    local_owed_units_are_forgotten_when_the_key_is_idle,
    local_refund_decision_goes_where_it_was_taken,
    local_release_after_recovery_frees_the_lease_in_memory,
    local_deduct_when_after_recovery_refunds_in_memory,
    local_deduct_when_of_a_redis_decision_refunds_redis,
);

async fn make(server: &Server, f: impl FnOnce(LimiterBuilder) -> LimiterBuilder) -> Limiter {
    support::limiter_with(server, |b| {
        f(b.timeout(Duration::from_millis(300))
            .probe_interval(Duration::from_millis(100)))
    })
    .await
}

fn outage_events(c: &Capture) -> (usize, usize) {
    (c.count("Redis unavailable"), c.count("answers again"))
}

/// Checks before, during and after an outage: stop the server mid-run, keep checking, start
/// it again on the same port, keep checking until Redis answers (bounded).
async fn through_outage(
    lim: &Limiter,
    server: &mut Server,
    limit: &Limit,
    key: &str,
) -> (Vec<Decision>, Vec<Decision>, Vec<Decision>) {
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(lim.check(key, limit).await.unwrap());
    }
    server.stop();
    let mut during = Vec::new();
    for _ in 0..30 {
        during.push(lim.check(key, limit).await.unwrap());
    }
    // A check_all during the outage is answered by the policy too.
    let all = lim
        .check_all([Entry::new("{o}:a", limit), Entry::new("{o}:b", limit)])
        .await
        .unwrap();
    assert!(all.degraded && all.per_key.iter().all(|d| d.degraded));
    if lim.failure_policy() != FailurePolicy::Local {
        let h = all.headers(None);
        assert!(
            !h.contains_key("ratelimit") && !h.contains_key("ratelimit-policy"),
            "{h:?}"
        );
    }
    server.restart();
    let mut after = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let d = lim.check(key, limit).await.unwrap();
        let done = !d.degraded;
        after.push(d);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (before, during, after)
}

async fn open_admits_degraded_then_recovers(kind: Kind, capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Open)).await;
    let g: Limit = Gcra::new(100, 100, 1).unwrap().into();
    let (before, during, after) = through_outage(&lim, &mut server, &g, "open").await;
    assert!(before.iter().all(|d| d.allowed && !d.degraded));
    let want = match kind {
        Kind::Module => Source::Module,
        Kind::Fallback => Source::Fallback,
    };
    assert_eq!(before[0].source, want);
    assert!(during
        .iter()
        .all(|d| d.allowed && d.degraded && d.source == Source::Local));
    // docs/clients.md#closed-policy: nothing is known about the key, so no RateLimit field
    // at all, not even the policy.
    let h = during[0].headers_with(&redis_rl_client::HeaderOptions {
        x_headers: true,
        ..Default::default()
    });
    assert!(h.is_empty(), "{h:?}");
    let last = after.last().unwrap();
    assert!(!last.degraded && last.allowed, "{after:?}");
    let snap = lim.counters().snapshot();
    assert!(snap.degraded >= 30, "{snap:?}");
    assert!((1..=31).contains(&snap.errors), "{snap:?}");
    assert_eq!(
        outage_events(&capture),
        (1, 1),
        "once per burst of failures, once on recovery: {:?}",
        capture.messages.lock().unwrap()
    );
}

async fn closed_denies_with_a_short_retry_then_recovers(kind: Kind, capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| {
        b.on_error(FailurePolicy::Closed)
            .closed_retry_after(Duration::from_secs(2))
    })
    .await;
    let w: Limit = Window::new(100, 60, Algorithm::Fixed).unwrap().into();
    let (before, during, after) = through_outage(&lim, &mut server, &w, "closed").await;
    assert!(before.iter().all(|d| d.allowed));
    assert!(during.iter().all(|d| !d.allowed && d.degraded));
    assert_eq!(
        during[0].retry_after.duration(),
        Some(Duration::from_secs(2))
    );
    assert_eq!(during[0].headers(None)["retry-after"], "2");
    let h = during[0].headers(Some("w"));
    assert_eq!(h.len(), 1, "Retry-After alone: {h:?}");
    let last = after.last().unwrap();
    assert!(last.allowed && !last.degraded, "{after:?}");
    assert_eq!(outage_events(&capture), (1, 1));
}

async fn error_policy_returns_unavailable_then_recovers(kind: Kind, _capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Error)).await;
    let g = Gcra::new(10, 1, 1).unwrap();
    assert!(lim.check("r", &g).await.unwrap().allowed);
    server.stop();
    match lim.check("r", &g).await {
        Err(Error::Unavailable(e)) => {
            assert!(std::error::Error::source(&Error::Unavailable(e)).is_some())
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(matches!(
        lim.refund("r", 1).await,
        Err(Error::Unavailable(_))
    ));
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let d = loop {
        match lim.check("r", &g).await {
            Ok(d) => break d,
            Err(Error::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("did not recover: {e}"),
        }
    };
    assert!(d.allowed && !d.degraded);
}

async fn a_stalled_server_times_out_into_the_policy(kind: Kind, _capture: Capture) {
    let server = kind.server();
    let lim = make(&server, |b| {
        b.on_error(FailurePolicy::Open)
            .probe_interval(Duration::from_secs(1))
    })
    .await;
    let g = Gcra::new(10, 1, 1).unwrap();
    assert!(!lim.check("t", &g).await.unwrap().degraded);
    signal(&server, "-STOP"); // accepts connections, answers nothing
    let start = Instant::now();
    let d = lim.check("t", &g).await.unwrap();
    let took = start.elapsed();
    // Inside the probe interval the policy answers at once, without waiting on Redis.
    let start2 = Instant::now();
    let mut fast = true;
    for _ in 0..100 {
        fast &= lim.check("t", &g).await.unwrap().degraded;
    }
    let took2 = start2.elapsed();
    signal(&server, "-CONT");
    assert!(d.degraded && d.allowed, "{d:?}");
    assert!(
        took < Duration::from_millis(1500),
        "{took:?}: the 0.3 s timeout, not a hang"
    );
    assert!(fast && took2 < Duration::from_millis(500), "{took2:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while lim.check("t", &g).await.unwrap().degraded {
        assert!(Instant::now() < deadline, "did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn server_restarted_empty_is_detected_again(kind: Kind, _capture: Capture) {
    // A restart without persistence loses the Functions library: the fallback reloads it.
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Error)).await;
    let g = Gcra::new(5, 1, 60).unwrap();
    assert_eq!(lim.check("e", &g).await.unwrap().remaining, 4);
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let d = loop {
        match lim.check("e", &g).await {
            Ok(d) => break d,
            Err(Error::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("did not recover: {e}"),
        }
    };
    assert!(
        d.allowed && d.remaining == 4,
        "the state went with the restart: {d:?}"
    );
    assert_eq!(lim.resolved_mode().await.unwrap(), kind.expected());
}

async fn built_while_redis_is_down(kind: Kind, capture: Capture) {
    // A limiter is built without waiting on Redis: a service starts while Redis is down,
    // the policy answers, and decisions come from Redis once it is up.
    let mut server = kind.server();
    server.stop();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Open)).await;
    let g = Gcra::new(3, 1, 60).unwrap();
    let d = lim.check("boot", &g).await.unwrap();
    assert!(d.allowed && d.degraded);
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = lim.check("boot", &g).await.unwrap();
        if !d.degraded {
            assert_eq!(d.remaining, 2);
            break;
        }
        assert!(Instant::now() < deadline, "did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lim.resolved_mode().await.unwrap(), kind.expected());
    assert_eq!(outage_events(&capture), (1, 1));
}

async fn the_layer_answers_503_while_redis_is_down(kind: Kind, _capture: Capture) {
    // Through the tower layer: "closed" answers 503 with Retry-After and a JSON body while
    // Redis is down, and so does "error" (the layer cannot decide); both recover.
    use http::{Request, Response, StatusCode};
    use redis_rl_client::http::{Key, Rule};
    use redis_rl_client::RateLimitLayer;

    let mut server = kind.server();
    for policy in [FailurePolicy::Closed, FailurePolicy::Error] {
        let lim = make(&server, |b| b.on_error(policy)).await;
        let svc = RateLimitLayer::new(lim)
            .rule(Rule::any(Gcra::new(5, 1, 60).unwrap(), Key::header_or("x-k", "anon")).unwrap())
            .unwrap()
            .layer(tower::service_fn(|_req: Request<String>| async {
                Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
            }));
        let call = || {
            let svc = svc.clone();
            async move { svc.oneshot(Request::new(String::new())).await.unwrap() }
        };
        let up = call().await;
        assert_eq!(up.status(), StatusCode::OK);
        assert!(up.headers().contains_key("ratelimit"));
        server.stop();
        let down = call().await;
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE, "{policy:?}");
        assert_eq!(down.headers()["retry-after"], "1");
        assert!(
            down.body().contains("\"error\": \"limiter_unavailable\""),
            "{}",
            down.body()
        );
        server.restart();
        let deadline = Instant::now() + Duration::from_secs(5);
        while call().await.status() != StatusCode::OK {
            assert!(Instant::now() < deadline, "did not recover");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn the_first_probe_after_redis_returns_reaches_it(kind: Kind, capture: Capture) {
    // Recovery costs no extra probe interval: the first call allowed to probe once Redis is
    // back gets its answer from Redis (the connection manager's stale "connection refused"
    // from the outage must not be taken for a new failure).
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Open)).await;
    let g = Gcra::new(100, 100, 1).unwrap();
    assert!(!lim.check("p", &g).await.unwrap().degraded);
    server.stop();
    assert!(lim.check("p", &g).await.unwrap().degraded);
    tokio::time::sleep(Duration::from_millis(150)).await; // past the 100 ms probe interval
    assert!(
        lim.check("p", &g).await.unwrap().degraded,
        "a probe while down"
    );
    // Let the reconnect that probe started fail while Redis is still down (this runtime
    // runs it only when the test yields).
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.restart(); // answers PING when this returns
    tokio::time::sleep(Duration::from_millis(150)).await;
    let d = lim.check("p", &g).await.unwrap();
    assert!(!d.degraded && d.allowed, "{d:?}");
    assert_eq!(outage_events(&capture), (1, 1));
}

async fn refund_and_release_inside_the_probe_interval_do_not_wait(kind: Kind, _capture: Capture) {
    // Like a check, a refund or a release made while Redis is known to be down is answered at
    // once, not after a timeout each (a guard dropped mid-outage releases this way too).
    let server = kind.server();
    let lim = make(&server, |b| {
        b.on_error(FailurePolicy::Open)
            .probe_interval(Duration::from_secs(5))
    })
    .await;
    let g = Gcra::new(10, 1, 1).unwrap();
    assert!(!lim.check("q", &g).await.unwrap().degraded);
    signal(&server, "-STOP");
    let d = lim.check("q", &g).await.unwrap(); // the 300 ms timeout: the outage starts
    let start = Instant::now();
    let refund = lim.refund("q", 1).await;
    let release = lim.release("l", "token").await;
    let took = start.elapsed();
    signal(&server, "-CONT");
    assert!(d.degraded);
    assert!(refund.unwrap().degraded && release.unwrap().degraded);
    assert!(took < Duration::from_millis(150), "{took:?}");
}

/// docs/clients.md#failure-policy-local: with Redis stopped mid-run, each process enforces
/// the same limits in memory (divided by the fleet size), with real figures, and the first
/// call after Redis answers again is decided by Redis, which never saw the local decisions.
async fn local_enforces_the_limits_in_memory_then_returns_to_redis(kind: Kind, capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local).fleet_size(2)).await;
    let g: Limit = Gcra::new(6, 2, 60).unwrap().into(); // locally: burst 3, 1 per 60 s
    let w: Limit = Window::new(4, 60, Algorithm::Fixed).unwrap().into(); // locally: 2
    assert!(!lim.check("g", &g).await.unwrap().degraded);
    server.stop();
    let first_local = Instant::now();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(lim.check("g", &g).await.unwrap());
    }
    let elapsed = first_local.elapsed();
    assert!(got
        .iter()
        .all(|d| d.degraded && !d.blind && d.source == Source::Local));
    assert_eq!(
        got.iter()
            .map(|d| (d.allowed, d.limit, d.remaining))
            .collect::<Vec<_>>(),
        [(true, 3, 2), (true, 3, 1), (true, 3, 0), (false, 3, 0)]
    );
    let denied = &got[3];
    // 60 s from the first local charge, less the time these calls took (measured, not
    // assumed small: a busy machine may stall between them), rounded to milliseconds.
    let wait = denied.retry_after.duration().unwrap();
    assert!(
        wait + elapsed + Duration::from_millis(1) >= Duration::from_secs(60)
            && wait <= Duration::from_secs(60),
        "{wait:?} after {elapsed:?}"
    );
    let h = denied.headers(Some("g"));
    assert_eq!(h["ratelimit-policy"], "\"g\";q=3;w=180");
    assert!(
        h["ratelimit"].to_str().unwrap().starts_with("\"g\";r=0;t="),
        "{h:?}"
    );
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        retry <= 60 && retry + elapsed.as_secs() + 1 >= 60,
        "{retry}"
    );
    // Several limits in memory: all or nothing, as RL.ALL.
    let both = || [Entry::new("{u}:g", &g), Entry::new("{u}:w", &w)];
    let mut all = Vec::new();
    for _ in 0..3 {
        all.push(lim.check_all(both()).await.unwrap());
    }
    assert_eq!(
        all.iter().map(|d| d.allowed).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert_eq!(all[2].per_key[0].remaining, 0, "{:?}", all[2]);
    assert_eq!(
        all[1].per_key[0].remaining, 1,
        "the GCRA was charged twice, not three times"
    );
    // A refund during the outage goes back to memory.
    assert_eq!(lim.refund("g", 1).await.unwrap().refunded, 1);
    assert!(lim.check("g", &g).await.unwrap().allowed);
    let c = lim.counters().snapshot();
    assert!(c.local >= 8 && c.degraded >= 8, "{c:?}");
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        let d = lim.check("g", &g).await.unwrap();
        if !d.degraded {
            break d;
        }
        assert!(Instant::now() < deadline, "did not return to Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(back.allowed && !back.degraded && back.source != Source::Local);
    assert_eq!(back.limit, 6, "Redis's limit, not the local share");
    assert_eq!(outage_events(&capture), (1, 1));
    // Built with a fleet size of 0: refused.
    let zero = Limiter::builder(support::url(&server))
        .on_error(FailurePolicy::Local)
        .fleet_size(0)
        .build()
        .await;
    assert!(matches!(zero, Err(Error::Usage(_))));
}

async fn local_through_the_layer_answers_429_with_real_fields(kind: Kind, _capture: Capture) {
    use http::{Request, Response, StatusCode};
    use redis_rl_client::http::{Key, Rule};
    use redis_rl_client::RateLimitLayer;

    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let svc = RateLimitLayer::new(lim)
        .rule(
            Rule::any("2/minute", Key::header("x-k"))
                .unwrap()
                .name("local")
                .unwrap(),
        )
        .unwrap()
        .layer(tower::service_fn(|_req: Request<String>| async {
            Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
        }));
    let call = || {
        let svc = svc.clone();
        let req = Request::builder()
            .header("x-k", "a")
            .body(String::new())
            .unwrap();
        async move { svc.oneshot(req).await.unwrap() }
    };
    assert_eq!(call().await.status(), StatusCode::OK);
    server.stop();
    let got = [call().await, call().await, call().await];
    assert_eq!(
        got.iter().map(|r| r.status().as_u16()).collect::<Vec<_>>(),
        [200, 200, 429],
        "the local limiter holds: its own 2, not open, not 503"
    );
    assert_eq!(
        got[0].headers()["ratelimit"]
            .to_str()
            .unwrap()
            .split(';')
            .nth(1),
        Some("r=1")
    );
    assert!(
        got[2].body().contains("\"error\": \"rate_limited\""),
        "{}",
        got[2].body()
    );
    assert!(got[2].headers().contains_key("retry-after"));
    server.restart();
}

/// docs/clients.md#leases-that-know-they-are-lost: a renewal that cannot reach Redis for a
/// whole lease time marks the lease lost.
async fn a_lease_that_cannot_be_renewed_for_a_lease_time_is_lost(kind: Kind, capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Open)).await;
    let guard = lim
        .acquire("held", &redis_rl_client::Lease::new(1, "0.6").unwrap())
        .await
        .unwrap();
    server.stop();
    let lost = tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("not reported lost");
    assert_eq!(lost.reason, redis_rl_client::LostReason::Unreachable);
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(Error::LeaseLost(_))));
    assert_eq!(lim.counters().snapshot().leases_lost, 1);
    assert!(capture.count("was lost") >= 1);
    server.restart();
}

/// docs/clients.md#recovery: Redis restarted on the same address while the limiter was idle
/// (the limiter never saw it go): the pooled connection the restart closed is replaced on the
/// spot, and the very next decision comes from Redis, not from the failure policy. In the
/// fallback mode the restart also took the library, which is loaded again on that call. Every
/// kind of call, under every policy that answers for Redis: a check, a check_all, a refund, a
/// lease.
async fn a_restart_while_idle_is_not_an_outage(kind: Kind, capture: Capture) {
    let mut server = kind.server();
    let want = match kind {
        Kind::Module => Source::Module,
        Kind::Fallback => Source::Fallback,
    };
    let g = Gcra::new(5, 1, 60).unwrap();
    for policy in [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::Local,
        FailurePolicy::Error,
    ] {
        // A probe interval longer than the test: a decision the policy answered would stay.
        // A timeout of 5 s: a slow reply on a loaded machine is no outage of this test's.
        let lim = make(&server, |b| {
            b.on_error(policy)
                .probe_interval(Duration::from_secs(60))
                .timeout(Duration::from_secs(5))
        })
        .await;
        let d = lim.check("r", &g).await.unwrap();
        assert!(!d.degraded && d.remaining == 4, "{policy:?}: {d:?}");
        server.restart(); // answers PING when this returns; the limiter did not see it
        let d = lim.check("r", &g).await.unwrap();
        assert!(
            !d.degraded && d.source == want && d.remaining == 4,
            "{policy:?}: the first check after the restart: {d:?}"
        );
        server.restart();
        let both = [Entry::new("{r}:a", &g), Entry::new("{r}:b", &g)];
        let d = lim.check_all(both).await.unwrap();
        assert!(
            !d.degraded && d.source == want,
            "{policy:?}: check_all: {d:?}"
        );
        server.restart();
        // Redis answers (the state went with the restart: nothing to give back).
        let r = lim.refund("{r}:a", 1).await.unwrap();
        assert!(!r.degraded && r.refunded == 0, "{policy:?}: refund: {r:?}");
        server.restart();
        let lease = lim
            .acquire("r-lease", &redis_rl_client::Lease::new(1, 30).unwrap())
            .await
            .unwrap();
        assert!(!lease.decision().degraded, "{policy:?}: acquire");
        lease.release().await.unwrap();
        let c = lim.counters().snapshot();
        assert_eq!((c.errors, c.degraded), (0, 0), "{policy:?}: {c:?}");
    }
    assert_eq!(outage_events(&capture), (0, 0), "no outage was seen");
}

// -- the local policy's give-backs after Redis answers again ---------------------------------
//
// docs/clients.md#failure-policy-local: a charge the in-memory limiter took during an outage
// is given back there, not to Redis, which never had it (a refund Redis took for it would
// give back another request's unit: the fleet would admit past the limit). As the Go
// package's local_refund_test.go. The in-memory limiter's figures are read in a later outage
// (a check of cost 0, answered in memory).

fn probe() -> Limit {
    Gcra::new(4, 1, 3600).unwrap().into()
}

/// Waits (bounded) until Redis decides a check of a probe key again.
async fn until_redis(lim: &Limiter) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while lim.check("probe", probe()).cost(0).await.unwrap().degraded {
        assert!(Instant::now() < deadline, "Redis never answered again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What Redis reports for `key` (cost 0).
async fn in_redis(lim: &Limiter, key: &str, limit: &Limit) -> Decision {
    let d = lim.check(key, limit).cost(0).await.unwrap();
    assert!(!d.degraded, "Redis did not report {key}: {d:?}");
    d
}

/// What the in-memory limiter reports for `key` (cost 0), Redis being down.
async fn in_memory(lim: &Limiter, key: &str, limit: &Limit) -> u64 {
    let d = lim.check(key, limit).cost(0).await.unwrap();
    assert!(d.degraded && !d.blind, "memory did not report {key}: {d:?}");
    d.remaining
}

async fn local_refund_after_recovery_goes_back_to_memory(kind: Kind, _capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let g: Limit = Gcra::new(4, 1, 3600).unwrap().into(); // nothing drains during the test
    until_redis(&lim).await;
    server.stop();
    for (key, n) in [("k", 2), ("split", 1)] {
        let d = lim.check(key, &g).cost(n).await.unwrap();
        assert!(d.allowed && d.degraded && !d.blind, "{key}: {d:?}");
    }
    // A refund memory answers carries memory's figures, as RL.REFUND's reply would.
    assert!(lim.check("p", &g).cost(3).await.unwrap().degraded);
    let r = lim.refund("p", 1).await.unwrap();
    assert_eq!((r.refunded, r.degraded, r.remaining), (1, true, 2), "{r:?}");
    // Two units of an hour each left to drain.
    assert!(
        r.reset_after > Duration::from_secs(7190) && r.reset_after <= Duration::from_secs(7200),
        "{r:?}"
    );
    server.restart();
    until_redis(&lim).await;
    // Redis charges k once too: it holds 1 unit, memory 2.
    let d = lim.check("k", &g).await.unwrap();
    assert!(d.allowed && !d.degraded && d.remaining == 3, "{d:?}");
    // Refunding the outage's 2 units gives them back in memory; Redis keeps its own.
    let r = lim.refund("k", 2).await.unwrap();
    assert_eq!(
        (r.refunded, r.degraded, r.remaining, r.reset_after),
        (2, true, 4, Duration::ZERO),
        "{r:?}: memory's figures, the key idle again"
    );
    assert_eq!(
        in_redis(&lim, "k", &g).await.remaining,
        3,
        "Redis gave back a unit it did not take for this charge"
    );
    // Nothing is owed in memory any more: the next refund is Redis's.
    let r = lim.refund("k", 2).await.unwrap();
    assert_eq!(
        (r.refunded, r.degraded, r.remaining),
        (1, false, 4),
        "{r:?}"
    );
    // More than memory owes: memory's part there, the rest to Redis.
    let d = lim.check("split", &g).cost(2).await.unwrap();
    assert!(d.allowed && !d.degraded, "{d:?}");
    let r = lim.refund("split", 3).await.unwrap();
    assert_eq!((r.refunded, r.degraded), (3, false), "{r:?}");
    assert_eq!(in_redis(&lim, "split", &g).await.remaining, 4);
    assert_eq!(lim.counters().snapshot().refunded, 7, "1 (p) + 2 + 1 + 3");
    // Memory gave back what it took: in the next outage both keys are whole there.
    server.stop();
    assert_eq!(in_memory(&lim, "k", &g).await, 4, "memory kept k's charge");
    assert_eq!(
        in_memory(&lim, "split", &g).await,
        4,
        "memory kept split's charge"
    );
}

async fn local_owed_units_are_forgotten_when_the_key_is_idle(kind: Kind, _capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let quick: Limit = Gcra::new(2, 1, 1).unwrap().into(); // idle again 1 s after a charge of 1
    until_redis(&lim).await;
    server.stop();
    assert!(lim.check("q", &quick).await.unwrap().degraded);
    server.restart();
    until_redis(&lim).await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // memory's state is idle: gone
    assert_eq!(lim.check("q", &quick).await.unwrap().remaining, 1); // Redis charges 1
    let r = lim.refund("q", 1).await.unwrap();
    assert_eq!((r.refunded, r.degraded), (1, false), "{r:?}");
    assert_eq!(in_redis(&lim, "q", &quick).await.remaining, 2);
}

async fn local_refund_decision_goes_where_it_was_taken(kind: Kind, _capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let g: Limit = Gcra::new(4, 1, 3600).unwrap().into();
    until_redis(&lim).await;
    server.stop();
    let outage = lim.check("d", &g).cost(2).await.unwrap();
    assert!(
        outage.allowed && outage.degraded && !outage.blind,
        "{outage:?}"
    );
    server.restart();
    until_redis(&lim).await;
    let now = lim.check("d", &g).await.unwrap();
    assert!(!now.degraded, "{now:?}");
    // Redis's decision: Redis gives back.
    let r = lim.refund_decision(&now, 1).await.unwrap();
    assert_eq!(
        (r.refunded, r.degraded, r.remaining),
        (1, false, 4),
        "{r:?}"
    );
    // The outage's decision: memory gives back, after recovery; Redis is not asked.
    let calls = lim.counters().snapshot().redis_calls;
    let r = lim.refund_decision(&outage, 2).await.unwrap();
    assert_eq!((r.refunded, r.degraded), (2, true), "{r:?}");
    assert_eq!(
        lim.counters().snapshot().redis_calls,
        calls,
        "a refund of memory's charge called Redis"
    );
    // The per-key decisions of a check_all go back each where it was taken.
    let both = lim
        .check_all([Entry::new("{u}:a", &g), Entry::new("{u}:b", &g)])
        .await
        .unwrap();
    let r = lim.refund_decision(&both.per_key[0], 1).await.unwrap();
    assert_eq!((r.refunded, r.degraded), (1, false), "{r:?}");
    assert_eq!(in_redis(&lim, "{u}:a", &g).await.remaining, 4);
    assert_eq!(in_redis(&lim, "{u}:b", &g).await.remaining, 3);
    // Usage errors, as the Go package's RefundDecision returns them.
    assert!(
        matches!(lim.refund_decision(&both, 1).await, Err(Error::Usage(_))),
        "a combined decision"
    );
    let keyless = Decision {
        key: None,
        ..now.clone()
    };
    assert!(matches!(
        lim.refund_decision(&keyless, 1).await,
        Err(Error::Usage(_))
    ));
    assert!(matches!(
        lim.refund_decision(&now, 0).await,
        Err(Error::InvalidLimit(_))
    ));
    let held = lim
        .acquire("lease", &redis_rl_client::Lease::new(2, 30).unwrap())
        .await
        .unwrap();
    match lim.refund_decision(held.decision(), 1).await {
        Err(Error::Usage(m)) => assert!(m.contains("release"), "{m}"),
        other => panic!("a lease's decision: {other:?}"),
    }
    held.release().await.unwrap();
    // A refund of Redis's charge while Redis is down is lost, not taken from memory.
    let redis_x = lim.check("x", &g).await.unwrap();
    assert!(!redis_x.degraded);
    server.stop();
    assert!(lim.check("x", &g).await.unwrap().degraded); // memory charges 1 of its own
    let r = lim.refund_decision(&redis_x, 1).await.unwrap();
    assert_eq!((r.refunded, r.degraded), (0, true), "{r:?}");
    assert_eq!(
        in_memory(&lim, "x", &g).await,
        3,
        "memory gave back a unit Redis took"
    );
    assert_eq!(
        in_memory(&lim, "d", &g).await,
        4,
        "memory kept the outage's charge"
    );
    // The open policy charged nothing: nothing to give back; the error policy says so.
    let open = make(&server, |b| b.on_error(FailurePolicy::Open)).await;
    let blind = open.check("x", &g).await.unwrap();
    assert!(blind.blind, "{blind:?}");
    let r = open.refund_decision(&blind, 1).await.unwrap();
    assert_eq!((r.refunded, r.degraded), (0, true), "{r:?}");
    let error = make(&server, |b| b.on_error(FailurePolicy::Error)).await;
    assert!(matches!(
        error.refund_decision(&redis_x, 1).await,
        Err(Error::Unavailable(_))
    ));
}

async fn local_release_after_recovery_frees_the_lease_in_memory(kind: Kind, _capture: Capture) {
    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let lease = redis_rl_client::Lease::new(1, 60).unwrap();
    until_redis(&lim).await;
    server.stop();
    let held = lim.acquire("job", &lease).await.unwrap();
    assert!(
        held.decision().degraded && !held.decision().blind,
        "{:?}",
        held.decision()
    );
    server.restart();
    until_redis(&lim).await;
    let r = lim.release("job", held.token()).await.unwrap();
    assert_eq!((r.released, r.degraded), (1, false), "{r:?}");
    // Memory no longer holds the slot: in the next outage another holder takes it.
    server.stop();
    let other = lim.acquire("job", &lease).token("another").await;
    assert!(
        other.as_ref().is_ok_and(|g| g.decision().degraded),
        "memory still holds the released lease: {:?}",
        other.as_ref().map(|g| g.decision().clone())
    );
    drop(other);
    drop(held);
}

/// The layer's deduct_when: a request admitted in memory during an outage whose handler,
/// once Redis answered again, charged the same key in Redis (another request's unit) and
/// answered 500: Redis keeps that unit, and memory gives the 500's unit back.
async fn local_deduct_when_after_recovery_refunds_in_memory(kind: Kind, _capture: Capture) {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response, StatusCode};
    use redis_rl_client::http::{Key, Rule};
    use redis_rl_client::RateLimitLayer;

    let server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let server = Arc::new(Mutex::new(server));
    let limit: Limit = Gcra::new(3, 1, 3600).unwrap().into(); // nothing drains during the test
    let seen: Arc<Mutex<Option<Decision>>> = Arc::default();
    let svc = {
        let (server, lim, limit, seen) = (server.clone(), lim.clone(), limit.clone(), seen.clone());
        RateLimitLayer::new(lim.clone())
            .rule(
                Rule::any(limit.clone(), Key::header("x-k"))
                    .unwrap()
                    .name("api")
                    .unwrap()
                    .deduct_when(|s| s.as_u16() < 500),
            )
            .unwrap()
            .layer(tower::service_fn(move |req: Request<String>| {
                let (server, lim, limit, seen) =
                    (server.clone(), lim.clone(), limit.clone(), seen.clone());
                async move {
                    let d = req.extensions().get::<Decision>().cloned().unwrap();
                    assert!(d.allowed && d.degraded && !d.blind, "{d:?}");
                    server.lock().unwrap().restart(); // Redis answers again before the handler fails
                    until_redis(&lim).await;
                    let key = d.key.clone().unwrap();
                    let short = key.strip_prefix(lim.prefix()).unwrap();
                    // Another request's unit, charged in Redis (a restarted Redis kept nothing).
                    assert!(!lim.check(short, &limit).await.unwrap().degraded);
                    *seen.lock().unwrap() = Some(d);
                    let mut resp = Response::new(String::from("boom"));
                    *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    Ok::<_, std::convert::Infallible>(resp)
                }
            }))
    };
    until_redis(&lim).await;
    server.lock().unwrap().stop();
    let req = Request::builder()
        .header("x-k", "k1")
        .body(String::new())
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let d = seen.lock().unwrap().clone().unwrap();
    let key = d.key.clone().unwrap();
    let short = key.strip_prefix(lim.prefix()).unwrap();
    assert_eq!(
        in_redis(&lim, short, &limit).await.remaining,
        2,
        "Redis gave back a unit it never took for the 500"
    );
    server.lock().unwrap().stop();
    assert_eq!(
        in_memory(&lim, short, &limit).await,
        3,
        "memory kept the 500's charge"
    );
}

/// The layer's deduct_when on a key memory still owes units (a 200 admitted during an
/// outage): after Redis answers again, a request Redis admitted answers 500, and its unit goes
/// back to Redis, where its decision took it, not to memory (which `refund(key)` would pick
/// first).
async fn local_deduct_when_of_a_redis_decision_refunds_redis(kind: Kind, _capture: Capture) {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response, StatusCode};
    use redis_rl_client::http::{Key, Rule};
    use redis_rl_client::RateLimitLayer;

    let mut server = kind.server();
    let lim = make(&server, |b| b.on_error(FailurePolicy::Local)).await;
    let limit: Limit = Gcra::new(3, 1, 3600).unwrap().into();
    let seen: Arc<Mutex<Vec<Decision>>> = Arc::default();
    let svc = {
        let seen = seen.clone();
        RateLimitLayer::new(lim.clone())
            .rule(
                Rule::any(limit.clone(), Key::header("x-k"))
                    .unwrap()
                    .name("api")
                    .unwrap()
                    .deduct_when(|s| s.as_u16() < 500),
            )
            .unwrap()
            .layer(tower::service_fn(move |req: Request<String>| {
                let seen = seen.clone();
                async move {
                    let d = req.extensions().get::<Decision>().cloned().unwrap();
                    seen.lock().unwrap().push(d);
                    let mut resp = Response::new(String::from("ok"));
                    if req.headers().contains_key("x-fail") {
                        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                }
            }))
    };
    let call = |fail: bool| {
        let svc = svc.clone();
        let mut req = Request::builder().header("x-k", "k1");
        if fail {
            req = req.header("x-fail", "1");
        }
        let req = req.body(String::new()).unwrap();
        async move { svc.oneshot(req).await.unwrap().status() }
    };
    until_redis(&lim).await;
    server.stop();
    assert_eq!(call(false).await, StatusCode::OK); // charged in memory, kept
    server.restart();
    until_redis(&lim).await;
    assert_eq!(call(true).await, StatusCode::INTERNAL_SERVER_ERROR);
    let seen = seen.lock().unwrap().clone();
    assert!(seen[0].degraded && !seen[1].degraded, "{seen:?}");
    let key = seen[1].key.clone().unwrap();
    let short = key.strip_prefix(lim.prefix()).unwrap();
    assert_eq!(
        in_redis(&lim, short, &limit).await.remaining,
        3,
        "Redis kept the 500's unit"
    );
    server.stop();
    assert_eq!(
        in_memory(&lim, short, &limit).await,
        2,
        "memory gave back a unit Redis took"
    );
}
