//! `check_all` (and `check`) on a three-master Redis Cluster through redis-rs's async cluster
//! client, in both modes: hash-tagged keys land on every master, each call goes to its
//! slot's master, and untagged multi-key calls are refused with CROSSSLOT (a misuse, not an
//! outage). In fallback mode the client loads the Lua library on every master.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::collections::HashSet;
use std::process::Command;

use common::{Cluster, Server};
use redis_rl_client::{tag, Entry, Error, Gcra, Limiter, Window};
use support::Kind;

fn cluster(kind: Kind) -> Cluster {
    support::init();
    if kind == Kind::Module {
        return Cluster::start(3);
    }
    // The harness's Cluster::start loads the module; the same, without it.
    let nodes: Vec<Server> = (0..3)
        .map(|_| {
            Server::builder()
                .no_module()
                .arg("cluster-enabled", "yes")
                .arg("cluster-config-file", "nodes.conf")
                .arg("cluster-node-timeout", "5000")
                .start()
        })
        .collect();
    let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
    args.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    let out = Command::new("redis-cli").args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let c = Cluster { nodes };
    c.wait_ok();
    c
}

async fn check_all_on_three_masters(kind: Kind) {
    let cl = cluster(kind);
    let urls: Vec<String> = cl.nodes.iter().map(support::url).collect();
    let lim = Limiter::cluster_builder(urls)
        .prefix("c:")
        .build()
        .await
        .unwrap();
    assert_eq!(lim.resolved_mode().await.unwrap(), kind.expected());
    let users: Vec<String> = (0..12).map(|i| format!("user{i}")).collect();
    let masters: HashSet<u16> = users
        .iter()
        .map(|u| cl.owner(&format!("c:{}", tag(u, &["api"]).unwrap())).port)
        .collect();
    assert_eq!(masters.len(), 3, "every master serves some");
    let api = Gcra::new(3, 1, 60).unwrap();
    let ip = Window::sliding(2, 60).unwrap();
    for u in &users {
        let (ka, ki) = (tag(u, &["api"]).unwrap(), tag(u, &["ip"]).unwrap());
        let mut got = Vec::new();
        for _ in 0..3 {
            let d = lim
                .check_all([Entry::new(ka.as_str(), &api), Entry::new(ki.as_str(), &ip)])
                .await
                .unwrap();
            got.push(d.allowed);
        }
        assert_eq!(got, [true, true, false], "{u}");
        let left = lim.check(ka.as_str(), &api).cost(0).await.unwrap();
        assert_eq!(left.remaining, 1);
        // The state lives on the slot's master.
        let mut con = cl.owner(&format!("c:{ka}")).conn();
        let exists: i64 = common::q(&mut con, &["EXISTS", &format!("c:{ka}")]);
        assert_eq!(exists, 1);
    }
    let cross = lim
        .check_all([
            Entry::new("a-user", Gcra::new(1, 1, 1).unwrap()),
            Entry::new("b-user", Gcra::new(1, 1, 1).unwrap()),
        ])
        .await;
    match cross {
        Err(Error::Redis(e)) => assert!(e.to_string().to_lowercase().contains("slot"), "{e}"),
        other => panic!("expected a cross-slot error, got {other:?}"),
    }
    assert_eq!(
        lim.counters().snapshot().errors,
        0,
        "a misuse is not an outage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_check_all_on_three_masters() {
    check_all_on_three_masters(Kind::Module).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_check_all_on_three_masters() {
    check_all_on_three_masters(Kind::Fallback).await;
}
