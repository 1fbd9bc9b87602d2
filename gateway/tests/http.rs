//! The forward-auth endpoint end to end: the `rl-gateway` binary on a real `redis-server`,
//! asked over HTTP as Caddy, Traefik and nginx ask it.

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;
use support::{both_modes, header, http_get, url, Gateway, Kind};

const CONFIG: &str = r#"
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 1, name: login}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding}
http_rules:
  - name: login
    methods: [POST]
    path: /login
    descriptors:
      - [{key: login, value: "yes"}, {key: remote_address, from: remote_address}]
  - name: api
    path: /api/
    descriptors:
      - [{key: api_key, from: "header:x-api-key"}]
  - name: site
    descriptors:
      - [{key: remote_address, from: remote_address}]
"#;

both_modes!(
    forward_auth_admits_then_denies_with_the_fields,
    rules_are_chosen_from_the_forwarded_method_path_and_headers,
    forwarded_for_is_read_only_from_trusted_proxies,
    redis_down_is_503_for_a_closed_domain_and_200_for_an_open_one,
    healthz_asks_redis,
);

async fn healthz_asks_redis(kind: Kind) {
    let mut server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &["--redis-timeout-ms", "200"]);
    let addr = gw.http.unwrap();
    let mode = match kind {
        Kind::Module => "module",
        Kind::Fallback => "fallback",
    };
    let (status, _, body) = http_get(addr, "/healthz", &[]).await;
    assert_eq!(
        (status, body.trim()),
        (200, format!("ok: 1 domain, redis: {mode}").as_str())
    );
    // The probe changes nothing: the domain's counters are as they were.
    let (status, hs, _) = http_get(addr, "/auth/web", &[("X-Forwarded-For", "198.51.100.1")]).await;
    assert_eq!(status, 200);
    assert!(header(&hs, "ratelimit")
        .unwrap()
        .starts_with("\"remote_address\";r=2;"));
    // Paused, Redis does not answer within the timeout; the body says so.
    let pid = server.pid().unwrap().to_string();
    signal("-STOP", &pid);
    let (status, _, body) = http_get(addr, "/healthz", &[]).await;
    signal("-CONT", &pid);
    assert_eq!(
        (status, body.trim()),
        (
            503,
            "unhealthy: 1 domain, redis: Redis did not answer within 200 ms"
        )
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, body) = http_get(addr, "/healthz", &[]).await;
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Stopped, the body names the connection's error, not a timeout.
    server.kill();
    let (status, _, body) = http_get(addr, "/healthz", &[]).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("unhealthy: 1 domain, redis: "), "{body}");
    assert!(!body.contains("did not answer"), "{body}");
}

fn signal(which: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {which} {pid}");
}

async fn forward_auth_admits_then_denies_with_the_fields(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let addr = gw.http.unwrap();
    let from = |ip: &'static str| {
        [
            ("X-Forwarded-For", ip),
            ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Uri", "/page?q=1"),
        ]
    };
    for left in ["2", "1", "0"] {
        let (status, hs, _) = http_get(addr, "/auth/web", &from("198.51.100.7")).await;
        assert_eq!(status, 200);
        assert_eq!(
            header(&hs, "ratelimit-policy"),
            Some("\"remote_address\";q=3;w=60")
        );
        let rl = header(&hs, "ratelimit").unwrap();
        assert!(
            rl.starts_with(&format!("\"remote_address\";r={left};t=")),
            "{rl}"
        );
        assert!(header(&hs, "retry-after").is_none());
    }
    let (status, hs, body) = http_get(addr, "/auth/web", &from("198.51.100.7")).await;
    assert_eq!(status, 429);
    assert_eq!(body.trim(), "rate limited");
    let retry: u64 = header(&hs, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    assert!(header(&hs, "ratelimit").unwrap().contains(";r=0;"));
    // Another client (the rightmost untrusted address of the chain) has its own counter;
    // what the client wrote at the left is ignored.
    let (status, _, _) = http_get(addr, "/auth/web", &from("198.51.100.7, 203.0.113.9")).await;
    assert_eq!(status, 200);
    // nginx's mapping.
    let (status, hs, _) = http_get(addr, "/auth/web?deny_status=403", &from("198.51.100.7")).await;
    assert_eq!(status, 403);
    assert!(header(&hs, "retry-after").is_some());
    let (status, _, _) = http_get(addr, "/auth/web?deny_status=200", &from("198.51.100.7")).await;
    assert_eq!(status, 400);
}

async fn rules_are_chosen_from_the_forwarded_method_path_and_headers(kind: Kind) {
    let server = kind.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let addr = gw.http.unwrap();
    // POST /login: one per minute per client (nginx's X-Original-* headers).
    let login = [
        ("X-Forwarded-For", "192.0.2.1"),
        ("X-Original-Method", "POST"),
        ("X-Original-URI", "/login?next=/"),
    ];
    assert_eq!(http_get(addr, "/auth/web", &login).await.0, 200);
    let (status, hs, _) = http_get(addr, "/auth/web", &login).await;
    assert_eq!(status, 429);
    assert_eq!(header(&hs, "ratelimit-policy"), Some("\"login\";q=1;w=60"));
    // GET /login is the site rule: its own counter.
    let get = [
        ("X-Forwarded-For", "192.0.2.1"),
        ("X-Original-Method", "GET"),
        ("X-Original-URI", "/login"),
    ];
    assert_eq!(http_get(addr, "/auth/web", &get).await.0, 200);
    // /api/ by API key; without the header the descriptor is dropped: no limit.
    let api = [("X-Forwarded-Uri", "/api/items"), ("X-Api-Key", "k1")];
    assert_eq!(http_get(addr, "/auth/web", &api).await.0, 200);
    assert_eq!(http_get(addr, "/auth/web", &api).await.0, 200);
    assert_eq!(http_get(addr, "/auth/web", &api).await.0, 429);
    let (status, _, body) = http_get(addr, "/auth/web", &[("X-Forwarded-Uri", "/api/items")]).await;
    assert_eq!((status, body.trim()), (200, "no limit: no descriptor"));
    // An unknown domain has no limit.
    let (status, _, body) = http_get(addr, "/auth/nowhere", &[]).await;
    assert_eq!((status, body.trim()), (200, "no limit: unknown domain"));
}

async fn forwarded_for_is_read_only_from_trusted_proxies(kind: Kind) {
    let server = kind.server();
    // Loopback is not trusted here: the peer (127.0.0.1) is the client, whatever it says.
    let gw = Gateway::start(&url(&server), CONFIG, &["--trusted-proxy", "10.0.0.0/8"]);
    let addr = gw.http.unwrap();
    for (i, ip) in ["1.1.1.1", "2.2.2.2", "3.3.3.3"].iter().enumerate() {
        let (status, hs, _) = http_get(addr, "/auth/web", &[("X-Forwarded-For", ip)]).await;
        assert_eq!(status, 200);
        let want = format!("\"remote_address\";r={};", 2 - i);
        assert!(header(&hs, "ratelimit").unwrap().starts_with(&want));
    }
    assert_eq!(
        http_get(addr, "/auth/web", &[("X-Forwarded-For", "4.4.4.4")])
            .await
            .0,
        429
    );
}

async fn redis_down_is_503_for_a_closed_domain_and_200_for_an_open_one(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    for (name, policy) in [("open", "open"), ("closed", "closed")] {
        std::fs::write(
            dir.path().join(format!("{name}.yaml")),
            format!(
                "domain: {name}\nfailure_policy: {policy}\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\nhttp_rules:\n  - descriptors: [[{{key: remote_address, from: remote_address}}]]\n"
            ),
        )
        .unwrap();
    }
    let mut server = kind.server();
    let cfg = dir.path().to_path_buf();
    let gw = Gateway::start_with(&[&url(&server)], &cfg, dir, &["--redis-timeout-ms", "100"]);
    let addr = gw.http.unwrap();
    assert_eq!(http_get(addr, "/auth/closed", &[]).await.0, 200);
    server.kill();
    let (status, hs, _) = http_get(addr, "/auth/closed", &[]).await;
    assert_eq!(status, 503);
    assert_eq!(header(&hs, "retry-after"), Some("1"));
    assert!(
        header(&hs, "ratelimit").is_none(),
        "nothing is known about the key"
    );
    let (status, _, _) = http_get(addr, "/auth/closed?deny_status=403", &[]).await;
    assert_eq!(status, 403);
    assert_eq!(http_get(addr, "/auth/open", &[]).await.0, 200);
}
