//! Envoy's rate limit service end to end: the `rl-gateway` binary on a real `redis-server`
//! (with the module, and without it: the Lua fallback), asked by a tonic client built from
//! the same `envoy-types`.

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;

use support::{ask, both_modes, desc, desc_hits, request, url, Gateway, Kind, OK, OVER_LIMIT};

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-user}
  - key: plan
    value: free
    rate_limit: {unit: minute, requests_per_unit: 2, name: free-plan}
  - key: plan
    value: gold
    rate_limit:
      unlimited: true
      replaces: [{name: per-user}]
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tokens
    rate_limit: {requests_per_unit: 100, window: 90s, algorithm: sliding}
  - key: bucket
    rate_limit: {requests_per_unit: 2, unit: second, algorithm: gcra, burst: 4}
  - key: jobs
    rate_limit: {concurrency: 2, lease: 30s}
  - key: logins
    rate_limit: {requests_per_unit: 2, unit: minute, algorithm: log}
"#;

both_modes!(
    a_limit_admits_then_denies_with_envoys_fields,
    descriptors_of_one_request_are_all_or_nothing,
    hits_addend_is_the_quantity,
    unlimited_and_replaces,
    shadow_mode_never_denies,
    our_algorithms_and_windows,
    usage_reports_are_forced,
    concurrency_leases_are_released_by_the_usage_report,
);

async fn a_limit_admits_then_denies_with_envoys_fields(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    for left in [2, 1, 0] {
        let r = ask(
            &mut c,
            request("edge", vec![desc(&[("remote_address", "10.0.0.1")])], 0),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        let s = &r.statuses[0];
        assert_eq!(s.code, OK);
        let l = s.current_limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (3, 2 /* MINUTE */));
        assert_eq!(s.limit_remaining, left);
        assert!(s.duration_until_reset.is_some());
    }
    let r = ask(
        &mut c,
        request("edge", vec![desc(&[("remote_address", "10.0.0.1")])], 0),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
    let wait = r.statuses[0].duration_until_reset.as_ref().unwrap();
    // A fixed window ends on the minute: the wait is anything up to 60 s, below 1 s when the
    // request falls just before the window's end.
    let wait_ns = i128::from(wait.seconds) * 1_000_000_000 + i128::from(wait.nanos);
    assert!(wait_ns > 0 && wait_ns <= 60_000_000_000, "{wait:?}");
    // Another address has its own counter.
    let r = ask(
        &mut c,
        request("edge", vec![desc(&[("remote_address", "10.0.0.2")])], 0),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    // No RateLimit fields unless asked for.
    assert!(r.response_headers_to_add.is_empty());
}

async fn descriptors_of_one_request_are_all_or_nothing(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    let both = || {
        request(
            "edge",
            vec![desc(&[("user", "ann")]), desc(&[("plan", "free")])],
            1,
        )
    };
    for _ in 0..2 {
        assert_eq!(ask(&mut c, both()).await.overall_code, OK);
    }
    // The plan limit (2/min) denies: the user limit is not charged.
    let r = ask(&mut c, both()).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OK);
    assert_eq!(r.statuses[1].code, OVER_LIMIT);
    // 10 per hour, charged twice: the next request leaves 7, the denied one took nothing.
    let r = ask(&mut c, request("edge", vec![desc(&[("user", "ann")])], 1)).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 7,
        "the denied request charged nothing"
    );
    // A descriptor with no limit, and one for an unknown key: OK, no limit.
    let r = ask(&mut c, request("edge", vec![desc(&[("nothing", "x")])], 1)).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
}

async fn hits_addend_is_the_quantity(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    let r = ask(&mut c, request("edge", vec![desc(&[("user", "bo")])], 4)).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    // The descriptor's own hits_addend wins; 0 only checks.
    let r = ask(
        &mut c,
        request("edge", vec![desc_hits(&[("user", "bo")], 0)], 4),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    let r = ask(
        &mut c,
        request("edge", vec![desc_hits(&[("user", "bo")], 7)], 1),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT, "7 > 6 left");
    let r = ask(
        &mut c,
        request("edge", vec![desc_hits(&[("user", "bo")], 6)], 1),
    )
    .await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    // The same descriptor twice in one request counts twice.
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![desc(&[("user", "cy")]), desc(&[("user", "cy")])],
            1,
        ),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 8);
    assert_eq!(r.statuses[1].limit_remaining, 8);
}

async fn unlimited_and_replaces(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    // plan_gold is unlimited and replaces per-user: 20 requests pass.
    for _ in 0..20 {
        let r = ask(
            &mut c,
            request(
                "edge",
                vec![desc(&[("user", "dee")]), desc(&[("plan", "gold")])],
                1,
            ),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none(), "replaced");
        assert_eq!(r.statuses[1].limit_remaining, u32::MAX, "unlimited");
    }
    // Without gold, per-user counts (and was never charged).
    let r = ask(&mut c, request("edge", vec![desc(&[("user", "dee")])], 1)).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

async fn shadow_mode_never_denies(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    for _ in 0..3 {
        let r = ask(&mut c, request("edge", vec![desc(&[("shadowed", "s")])], 1)).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
    }
    let (status, _, body) = support::http_get(gw.http.unwrap(), "/metrics", &[]).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"rl_gateway_shadow_mode_total{domain="edge",key="edge.shadowed"} 2"#),
        "{body}"
    );
    assert!(body.contains(r#"rl_gateway_total_hits_total{domain="edge",key="edge.shadowed"} 3"#));
}

async fn our_algorithms_and_windows(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    // GCRA with burst 4: four at once, then denied with a sub-second wait.
    for _ in 0..4 {
        assert_eq!(
            ask(&mut c, request("edge", vec![desc(&[("bucket", "b")])], 1))
                .await
                .overall_code,
            OK
        );
    }
    let r = ask(&mut c, request("edge", vec![desc(&[("bucket", "b")])], 1)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let wait = r.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(wait.seconds == 0 && wait.nanos > 0, "{wait:?}");
    // A 90 s window reports the largest unit within it (MINUTE) and its own count.
    let r = ask(&mut c, request("edge", vec![desc(&[("tokens", "t")])], 30)).await;
    let l = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (l.requests_per_unit, l.unit, r.statuses[0].limit_remaining),
        (100, 2, 70)
    );
    // LOG.
    for _ in 0..2 {
        assert_eq!(
            ask(&mut c, request("edge", vec![desc(&[("logins", "l")])], 1))
                .await
                .overall_code,
            OK
        );
    }
    assert_eq!(
        ask(&mut c, request("edge", vec![desc(&[("logins", "l")])], 1))
            .await
            .overall_code,
        OVER_LIMIT
    );
}

async fn usage_reports_are_forced(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    // The request path checks with hits 0; the stream-done call reports 250 tokens used,
    // more than the limit: recorded all the same (FORCE), and its status is OK.
    let check = || request("edge", vec![desc_hits(&[("tokens", "t2")], 0)], 1);
    assert_eq!(ask(&mut c, check()).await.overall_code, OK);
    let report = request(
        "edge",
        vec![desc_hits(
            &[("tokens", "t2"), ("rl_gateway_usage", "1")],
            250,
        )],
        1,
    );
    let r = ask(&mut c, report).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].code, OK);
    let r = ask(&mut c, request("edge", vec![desc(&[("tokens", "t2")])], 1)).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "the reported usage counts");
    // A negative descriptor gives hits back.
    let r = ask(&mut c, request("edge", vec![desc(&[("user", "eve")])], 5)).await;
    assert_eq!(r.statuses[0].limit_remaining, 5);
    let mut give_back = desc_hits(&[("user", "eve")], 3);
    give_back.is_negative_hits = true;
    let r = ask(&mut c, request("edge", vec![give_back], 1)).await;
    assert_eq!(r.overall_code, OK);
    let r = ask(
        &mut c,
        request("edge", vec![desc_hits(&[("user", "eve")], 0)], 1),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 8);
}

async fn concurrency_leases_are_released_by_the_usage_report(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let mut c = gw.client().await;
    let take = |token: &str| {
        request(
            "edge",
            vec![desc(&[("jobs", "j"), ("rl_gateway_token", token)])],
            1,
        )
    };
    assert_eq!(ask(&mut c, take("r1")).await.overall_code, OK);
    assert_eq!(ask(&mut c, take("r2")).await.overall_code, OK);
    let r = ask(&mut c, take("r3")).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let l = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(l.requests_per_unit, 2);
    // r1's stream ends: its slot is released.
    let done = request(
        "edge",
        vec![desc(&[
            ("jobs", "j"),
            ("rl_gateway_token", "r1"),
            ("rl_gateway_usage", "1"),
        ])],
        1,
    );
    assert_eq!(ask(&mut c, done).await.overall_code, OK);
    assert_eq!(ask(&mut c, take("r3")).await.overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_domain_has_no_limit_and_bad_input_is_invalid_argument() {
    let server = Kind::Module.server();
    let gw = Gateway::start(
        &url(&server),
        CONFIG,
        &["--max-descriptors", "3", "--max-entries", "2"],
    );
    let mut c = gw.client().await;
    let r = ask(
        &mut c,
        request("elsewhere", vec![desc(&[("user", "x")])], 1),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.statuses[0].code, OK);
    assert!(r.statuses[0].current_limit.is_none());

    let too_many = request("edge", (0..4).map(|_| desc(&[("user", "x")])).collect(), 1);
    let e = c.should_rate_limit(too_many).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .contains("4 descriptors in one request: at most 3"),
        "{}",
        e.message()
    );
    let wide = request("edge", vec![desc(&[("a", "1"), ("b", "2"), ("c", "3")])], 1);
    let e = c.should_rate_limit(wide).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .contains("descriptor 0 has 3 entries: at most 2"),
        "{}",
        e.message()
    );
    let e = c
        .should_rate_limit(request("", vec![desc(&[("user", "x")])], 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = c
        .should_rate_limit(request("edge", vec![], 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // Control bytes, braces and separators in values: accepted, each value its own key.
    let odd = ["a\r\nb", "a|b", "{tag}", "\u{0}", "é", &"x".repeat(5000)];
    for v in odd {
        let r = ask(
            &mut c,
            request("edge", vec![desc(&[("remote_address", v)])], 3),
        )
        .await;
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (OK, 0),
            "{v:?}"
        );
    }
    let mut con = server.conn();
    let keys: Vec<String> = common::q(&mut con, &["KEYS", "rl-gateway:*"]);
    assert_eq!(keys.len(), odd.len(), "{keys:?}");
    assert!(
        keys.iter()
            .all(|k| !k.bytes().any(|b| b.is_ascii_control())),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimit_headers_when_asked() {
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), CONFIG, &["--ratelimit-headers"]);
    let mut c = gw.client().await;
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![desc(&[("plan", "free")]), desc(&[("remote_address", "h")])],
            1,
        ),
    )
    .await;
    let h = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse, n: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == n)
            .map(|h| h.value.clone())
    };
    assert_eq!(
        h(&r, "ratelimit-policy").as_deref(),
        Some("\"free-plan\";q=2;w=60, \"remote_address\";q=3;w=60")
    );
    assert_eq!(
        h(&r, "ratelimit")
            .as_deref()
            .map(|v| v.split(";t=").next().unwrap().to_owned()),
        Some("\"free-plan\";r=1".to_owned())
    );
    assert!(h(&r, "retry-after").is_none());
    ask(&mut c, request("edge", vec![desc(&[("plan", "free")])], 1)).await;
    let r = ask(&mut c, request("edge", vec![desc(&[("plan", "free")])], 1)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let retry: u64 = h(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_per_domain_when_redis_stops() {
    let server = Kind::Module.server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("open.yaml"),
        "domain: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("closed.yaml"),
        "domain: closed\nfailure_policy: closed\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap();
    let cfg = dir.path().to_path_buf();
    let mut server = server;
    let gw = Gateway::start_with(&[&url(&server)], &cfg, dir, &["--redis-timeout-ms", "100"]);
    let mut c = gw.client().await;
    for d in ["open", "closed"] {
        assert_eq!(
            ask(&mut c, request(d, vec![desc(&[("k", "v")])], 1))
                .await
                .overall_code,
            OK
        );
    }
    server.kill();
    let started = std::time::Instant::now();
    let r = ask(&mut c, request("open", vec![desc(&[("k", "v")])], 1)).await;
    assert_eq!(r.overall_code, OK, "open admits");
    let r = ask(&mut c, request("closed", vec![desc(&[("k", "v")])], 1)).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "closed denies");
    assert!(started.elapsed() < Duration::from_secs(5));
    let (_, _, body) = support::http_get(gw.http.unwrap(), "/metrics", &[]).await;
    assert!(
        body.contains(r#"rl_gateway_redis_errors_total{domain="closed",key="closed.k"}"#),
        "{body}"
    );
    server.restart();
    // Back: decided in Redis again (the counter was lost with the server: 4 left).
    support::eventually(
        "Redis to decide again",
        Duration::from_secs(10),
        async || {
            let r = ask(&mut c, request("open", vec![desc(&[("k", "v")])], 1)).await;
            r.statuses[0].limit_remaining == 4
        },
    )
    .await;
}
