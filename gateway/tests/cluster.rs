//! A three-master Redis Cluster, with the module and without it (the Lua fallback): descriptors of one request whose keys are
//! in several slots are decided slot group by slot group, a later denial refunding what
//! the earlier groups took.

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use support::{ask, desc, request, Gateway, OK, OVER_LIMIT};

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_across_slots_are_all_or_nothing_with_the_module() {
    support::init();
    across_slots(common::Cluster::start(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_across_slots_are_all_or_nothing_on_the_fallback() {
    support::init();
    across_slots(common::Cluster::start_without_module(3)).await;
}

async fn across_slots(cluster: common::Cluster) {
    let user_key = "rl-gateway:edge|user|ann|#fixed";
    let plan_key = "rl-gateway:edge|plan|free|#fixed";
    assert_ne!(
        cluster.owner(user_key).port,
        cluster.owner(plan_key).port,
        "the test needs the two keys on two masters"
    );
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}/", s.port))
        .collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimit.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    let gw = Gateway::start_with(&refs, &path, dir, &["--cluster"]);
    let mut c = gw.client().await;
    let both = || {
        request(
            "edge",
            vec![desc(&[("user", "ann")]), desc(&[("plan", "free")])],
            1,
        )
    };
    for left in [9, 8] {
        let r = ask(&mut c, both()).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    let r = ask(&mut c, both()).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[1].code, OVER_LIMIT);
    // The user limit's charge was refunded: the next request leaves 7.
    let r = ask(&mut c, request("edge", vec![desc(&[("user", "ann")])], 1)).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 7));
    // Both keys are where the cluster put them.
    let mut con = cluster.owner(user_key).conn();
    let n: i64 = common::q(&mut con, &["EXISTS", user_key]);
    assert_eq!(n, 1);
}
