//! Reloading: a changed file is put in force, a bad one refused with one log line while the
//! old configuration keeps serving, under a steady loop of gRPC calls that must never fail
//! or be mis-decided; SIGHUP reloads without a file watch.

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;

use support::{ask, desc, request, url, Gateway, Kind, OK, OVER_LIMIT};

/// Every version keeps `steady` (1,000,000 per hour) and differs in `probe`.
fn version(probe_limit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: steady\n    rate_limit: {{unit: hour, requests_per_unit: 1000000}}\n  - key: probe\n    rate_limit: {{unit: hour, requests_per_unit: {probe_limit}}}\n"
    )
}

const BAD: &str = "domain: edge\ndescriptors:\n  - key: steady\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";

/// Writes the file as editors and deploy tools do: a temporary file renamed into place.
fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn probe_limit(gw: &Gateway) -> u32 {
    let mut c = gw.client().await;
    let r = ask(
        &mut c,
        request("edge", vec![support::desc_hits(&[("probe", "p")], 0)], 1),
    )
    .await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_never_fails_a_request() {
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), &version(1), &[]);
    let mut c = gw.client().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let addr = gw.grpc.unwrap();
    // The load: one client, sequential calls on `steady`; each must be OK with exactly one
    // unit fewer left than the one before.
    let load = tokio::spawn(async move {
        let mut c = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://{addr}")).await.unwrap();
        let mut last = None;
        let mut n = 0u32;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            let r = c
                .should_rate_limit(request("edge", vec![desc(&[("steady", "s")])], 1))
                .await
                .expect("no request fails during a reload")
                .into_inner();
            assert_eq!(r.overall_code, OK);
            let left = r.statuses[0].limit_remaining;
            if let Some(prev) = last {
                assert_eq!(left, prev - 1, "call {n}: mis-decided");
            }
            last = Some(left);
            n += 1;
        }
        n
    });
    for round in 0..6u32 {
        let limit = 10 + round;
        replace(&gw.config, &version(limit));
        support::eventually("the new version", Duration::from_secs(10), async || {
            probe_limit(&gw).await == limit
        })
        .await;
        // A bad file: refused, the version in force keeps serving.
        replace(&gw.config, BAD);
        support::eventually(
            "the refusal in the log",
            Duration::from_secs(10),
            async || gw.log().matches("configuration refused").count() > round as usize,
        )
        .await;
        assert_eq!(probe_limit(&gw).await, limit);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let calls = load.await.unwrap();
    assert!(calls > 50, "{calls} calls");
    // Each refusal is one line naming the file and the problem.
    let log = gw.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("configuration refused"))
        .collect();
    assert!(!refused.is_empty());
    for l in refused {
        assert!(l.contains("ratelimit.yaml: domain 'edge': descriptor 'edge.steady': invalid rate limit unit 'fortnight'"), "{l}");
    }
    let r = ask(&mut c, request("edge", vec![desc(&[("steady", "s")])], 1)).await;
    assert_eq!(r.overall_code, OK);
    let (_, _, metrics) = support::http_get(gw.http.unwrap(), "/metrics", &[]).await;
    assert!(
        metrics.contains("rl_gateway_config_load_error_total"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_without_a_watch() {
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), &version(1), &["--no-watch"]);
    let mut c = gw.client().await;
    assert_eq!(
        ask(&mut c, request("edge", vec![desc(&[("probe", "p")])], 1))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        ask(&mut c, request("edge", vec![desc(&[("probe", "p")])], 1))
            .await
            .overall_code,
        OVER_LIMIT
    );
    replace(&gw.config, &version(5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(probe_limit(&gw).await, 1, "no watch: not reloaded yet");
    let st = std::process::Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    support::eventually("SIGHUP's reload", Duration::from_secs(10), async || {
        probe_limit(&gw).await == 5
    })
    .await;
    assert!(gw.log().contains("SIGHUP: reloading the configuration"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_algorithm_starts_a_new_counter() {
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), &version(3), &[]);
    let mut c = gw.client().await;
    let r = ask(&mut c, request("edge", vec![desc(&[("probe", "p")])], 2)).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    replace(
        &gw.config,
        "domain: edge\ndescriptors:\n  - key: probe\n    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding}\n",
    );
    support::eventually("the sliding version", Duration::from_secs(10), async || {
        probe_limit(&gw).await == 4
    })
    .await;
    // Not an error about a key of another kind: a counter of its own.
    let r = ask(&mut c, request("edge", vec![desc(&[("probe", "p")])], 1)).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 3));
}
