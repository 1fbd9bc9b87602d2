//! `check_all` (and `check`) on a three-master Redis Cluster through redis-rs's async cluster
//! client, in both modes: hash-tagged keys land on every master, each call goes to its
//! slot's master, and untagged multi-key calls are refused with CROSSSLOT (a misuse, not an
//! outage). In fallback mode the client loads the Lua library on every master.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use common::Cluster;
use redis_rl_client::{tag, Entry, Error, Gcra, Limiter, Window};
use std::collections::HashSet;
use std::time::Duration;
use support::Kind;

fn cluster(kind: Kind) -> Cluster {
    support::cluster(kind)
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

/// A limiter on every node of `cl` whose outages are errors (FailurePolicy::Error, so an answer
/// is never a policy's), with a 5 s call timeout for a loaded host.
async fn strict_limiter(cl: &Cluster, prefix: &str) -> Limiter {
    let urls: Vec<String> = cl.nodes.iter().map(support::url).collect();
    Limiter::cluster_builder(urls)
        .prefix(prefix)
        .on_error(redis_rl_client::FailurePolicy::Error)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_check_all_on_three_masters() {
    check_all_on_three_masters(Kind::Module).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_check_all_on_three_masters() {
    check_all_on_three_masters(Kind::Fallback).await;
}

/// docs/clients.md#identities-stay-apart on a Cluster: keys in different slots are checked
/// in order (`across_slots`), and a request the second limit denies leaves no charge on the
/// first (refunded), its decision combined as RL.ALL would combine it.
async fn a_denied_request_across_slots_leaves_no_charge(kind: Kind) {
    let cl = cluster(kind);
    let urls: Vec<String> = cl.nodes.iter().map(support::url).collect();
    let lim = Limiter::cluster_builder(urls)
        .prefix("x:")
        .build()
        .await
        .unwrap();
    let (ka, ki) = ("{hdr.x-api-key:k1}:api", "{ip:192.0.2.7}:ip");
    assert_ne!(
        common::key_slot(&format!("x:{ka}")),
        common::key_slot(&format!("x:{ki}"))
    );
    let api = Gcra::new(5, 1, 60).unwrap();
    let ip = Window::sliding(2, 60).unwrap();
    let entries = || [Entry::new(ka, &api), Entry::new(ki, &ip)];
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(lim.check_all(entries()).across_slots().await.unwrap());
    }
    assert_eq!(
        got.iter().map(|d| d.allowed).collect::<Vec<_>>(),
        [true, true, false]
    );
    let denied = &got[2];
    assert!(!denied.never() && denied.retry_after.duration().unwrap() > Duration::ZERO);
    assert_eq!(
        (denied.limit, denied.remaining),
        (2, 0),
        "bound by the IP limit"
    );
    assert_eq!(denied.per_key.len(), 2);
    // Per key, what each limit alone answers for this request (as RL.ALL reports a denial).
    assert!(denied.per_key[0].allowed && !denied.per_key[1].allowed);
    assert_eq!(denied.per_key[0].remaining, 2);
    // The per-key limit was charged twice, not three times.
    let left = lim.check(ka, &api).cost(0).await.unwrap();
    assert_eq!(left.remaining, 3);
    assert_eq!(lim.counters().snapshot().refunded, 1);
    // The deny cache answers the same request again without a charge either.
    let again = lim.check_all(entries()).across_slots().await.unwrap();
    assert!(!again.allowed);
    assert_eq!(lim.check(ka, &api).cost(0).await.unwrap().remaining, 3);
    // When the first limit denies, nothing is charged and the second is only peeked.
    let (kb, kj) = ("{hdr.x-api-key:k2}:api", "{ip:192.0.2.8}:ip");
    let tiny = Gcra::new(1, 1, 60).unwrap();
    assert!(lim.check(kb, &tiny).await.unwrap().allowed);
    let d = lim
        .check_all([Entry::new(kb, &tiny), Entry::new(kj, &ip)])
        .across_slots()
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(
        d.per_key[1].remaining, 1,
        "peeked: its answer for this request"
    );
    assert_eq!(lim.check(kj, &ip).cost(0).await.unwrap().remaining, 2);
    // Without across_slots, keys in two slots are still a misuse (CROSSSLOT).
    let cross = lim
        .check_all([Entry::new("{a}:1", &api), Entry::new("{b}:2", &ip)])
        .await;
    assert!(matches!(cross, Err(Error::Redis(_))), "{cross:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_a_denied_request_across_slots_leaves_no_charge() {
    a_denied_request_across_slots_leaves_no_charge(Kind::Module).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_a_denied_request_across_slots_leaves_no_charge() {
    a_denied_request_across_slots_leaves_no_charge(Kind::Fallback).await;
}

/// docs/clients.md#recovery on a Cluster: a master restarted on the same port while the
/// limiter was idle (it never saw it go) answers the very next call for its slots, from
/// Redis (in fallback mode the library, gone with the restart, is loaded again on that call),
/// and no outage is counted.
async fn a_master_restarted_while_idle_answers_the_next_call(kind: Kind) {
    let mut cl = cluster(kind);
    let urls: Vec<String> = cl.nodes.iter().map(support::url).collect();
    let lim = Limiter::cluster_builder(urls)
        .prefix("r:")
        .on_error(redis_rl_client::FailurePolicy::Open)
        .probe_interval(Duration::from_secs(60))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let want = match kind {
        Kind::Module => redis_rl_client::Source::Module,
        Kind::Fallback => redis_rl_client::Source::Fallback,
    };
    let g = Gcra::new(5, 1, 60).unwrap();
    // A key on every master, each decided once so every node's connection is pooled.
    let keys: Vec<String> = (0..30).map(|i| format!("{{u{i}}}:k")).collect();
    for k in &keys {
        assert!(!lim.check(k.as_str(), &g).await.unwrap().degraded);
    }
    for round in 0..cl.nodes.len() {
        let port = cl.nodes[round].port;
        cl.nodes[round].restart(); // same port, same nodes.conf: same slots, no data
        cl.wait_ok();
        let on_it: Vec<&String> = keys
            .iter()
            .filter(|k| cl.owner(&format!("r:{k}")).port == port)
            .collect();
        assert!(!on_it.is_empty());
        let d = lim.check(on_it[0].as_str(), &g).await.unwrap();
        assert!(
            !d.degraded && d.source == want && d.remaining == 4,
            "node {round}: the first call after its restart: {d:?}"
        );
    }
    let c = lim.counters().snapshot();
    assert_eq!((c.errors, c.degraded), (0, 0), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_a_master_restarted_while_idle_answers_the_next_call() {
    a_master_restarted_while_idle_answers_the_next_call(Kind::Module).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_a_master_restarted_while_idle_answers_the_next_call() {
    a_master_restarted_while_idle_answers_the_next_call(Kind::Fallback).await;
}

/// docs/clients.md#the-fallback-where-users-are on a Cluster that grows under a running
/// limiter: a master added with `CLUSTER MEET` after the limiter started, and the slot of a
/// limited key migrated to it (as `redis-cli --cluster reshard` does). The new node has
/// neither the library nor the script cached; the first call whose key lands there is
/// decided there, from the migrated state, with one load on that node (`FUNCTION LOAD`
/// as a library, one `EVAL` as scripts) and none anywhere else. `scripts`: `FUNCTION` renamed
/// away on every node.
async fn a_master_added_after_start_gets_the_fallback_once(scripts: bool) {
    let extra: &[&str] = if scripts {
        &["--rename-command", "FUNCTION", ""]
    } else {
        &[]
    };
    let loads = |s: &std::collections::HashMap<String, u64>| -> u64 {
        let name = if scripts { "eval" } else { "function|load" };
        s.get(name).copied().unwrap_or(0)
    };
    let mut cl = support::fallback_cluster_with(extra);
    let lim = strict_limiter(&cl, "grow:").await;
    // Exact counts however long the test takes.
    let w = Window::new(10, 3600, redis_rl_client::Algorithm::Log).unwrap();
    let keys: Vec<String> = (0..12)
        .map(|i| tag(&format!("user{i}"), &["api"]).unwrap())
        .collect();
    for k in &keys {
        let d = lim.check(k.as_str(), &w).await.unwrap();
        assert!(d.allowed && d.remaining == 9 && d.source == redis_rl_client::Source::Fallback);
    }
    let before: Vec<u64> = cl
        .nodes
        .iter()
        .map(|n| loads(&support::command_stats(n)))
        .collect();
    let new = support::add_master(&mut cl, support::cluster_node(Kind::Fallback, extra));
    let slot = common::key_slot(&format!("grow:{}", keys[0]));
    support::move_slot(&cl, slot, new);
    assert_eq!(loads(&support::command_stats(&cl.nodes[new])), 0);

    // Routed by the limiter's old slot table: MOVED, then the new node.
    let d = lim.check(keys[0].as_str(), &w).await.unwrap();
    assert!(
        d.allowed && !d.degraded && d.remaining == 8,
        "decided on the new node from the migrated key: {d:?}"
    );
    let on_new = support::command_stats(&cl.nodes[new]);
    assert_eq!(loads(&on_new), 1, "{on_new:?}");
    if !scripts {
        let v: String = redis::cmd("FCALL_RO")
            .arg("rl_version")
            .arg(0)
            .query(&mut cl.nodes[new].conn())
            .unwrap();
        assert!(redis_rl_client::LUA_LIBRARY.contains(&format!("local VERSION = '{v}'")));
    }
    assert_eq!(lim.check(keys[0].as_str(), &w).await.unwrap().remaining, 7);
    let on_new = support::command_stats(&cl.nodes[new]);
    assert_eq!(loads(&on_new), 1, "loaded once, not per call: {on_new:?}");
    if scripts {
        assert!(
            on_new.get("evalsha").copied().unwrap_or(0) >= 1,
            "{on_new:?}"
        );
    }
    for (i, n) in cl.nodes[..new].iter().enumerate() {
        assert_eq!(
            loads(&support::command_stats(n)),
            before[i],
            "no load on node {i}"
        );
    }
    for k in &keys[1..] {
        assert_eq!(lim.check(k.as_str(), &w).await.unwrap().remaining, 8);
    }
    let c = lim.counters().snapshot();
    assert_eq!((c.errors, c.degraded), (0, 0), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_a_master_added_after_start_gets_the_fallback_once() {
    a_master_added_after_start_gets_the_fallback_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_a_master_added_after_start_gets_the_fallback_once() {
    a_master_added_after_start_gets_the_fallback_once(true).await;
}

/// docs/clients.md#the-fallback-where-users-are on a Cluster whose replica is promoted
/// under a running limiter: three masters, one of them with a replica, the limiter started,
/// then the replica made master (`CLUSTER FAILOVER` once its copy caught up, `TAKEOVER`
/// where the manual failover does not complete). The limiter's slot table still names the
/// old master: its first call there is MOVED to the new one. As scripts (`FUNCTION`
/// renamed away) the replica never got the script (Redis 7 replicates a script's effects,
/// not its text: `EVALSHA` there answers NOSCRIPT): that call is recovered once, by one
/// `EVAL` on the new master (one more Redis call, nothing degraded), and decided from the
/// replicated state; `EVALSHA` again from then on, no load anywhere else. As a library the
/// replica got the library with the data: it is called there with no `FUNCTION LOAD`
/// anywhere and no second Redis call.
async fn a_replica_promoted_after_start_answers_exactly(scripts: bool) {
    let extra: &[&str] = if scripts {
        &["--rename-command", "FUNCTION", ""]
    } else {
        &[]
    };
    let count = |s: &std::collections::HashMap<String, u64>, name: &str| -> u64 {
        s.get(name).copied().unwrap_or(0)
    };
    let load = if scripts { "eval" } else { "function|load" };
    let mut cl = support::fallback_cluster_with(extra);
    let keys: Vec<String> = (0..12)
        .map(|i| tag(&format!("user{i}"), &["api"]).unwrap())
        .collect();
    let owner = cl.owner(&format!("prom:{}", keys[0])).port;
    let master = cl.nodes.iter().position(|n| n.port == owner).unwrap();
    let replica = support::add_replica(
        &mut cl,
        master,
        support::cluster_node(Kind::Fallback, extra),
    );
    let lim = strict_limiter(&cl, "prom:").await;
    // Exact counts however long the test takes.
    let w = Window::new(10, 3600, redis_rl_client::Algorithm::Log).unwrap();
    for k in &keys {
        let d = lim.check(k.as_str(), &w).await.unwrap();
        assert!(d.allowed && d.remaining == 9 && d.source == redis_rl_client::Source::Fallback);
    }
    assert_eq!(lim.check(keys[0].as_str(), &w).await.unwrap().remaining, 8);
    if !scripts {
        // The master's FUNCTION LOAD reaches the replica in its replication stream.
        let mut rc = cl.nodes[replica].conn();
        common::wait_until(
            "the library on the replica",
            Duration::from_secs(30),
            || {
                let listed: redis::Value = redis::cmd("FUNCTION")
                    .arg("LIST")
                    .arg("LIBRARYNAME")
                    .arg("redis_rl")
                    .query(&mut rc)
                    .unwrap();
                matches!(&listed, redis::Value::Array(libs) if !libs.is_empty())
            },
        );
    }
    let before: Vec<_> = cl.nodes.iter().map(support::command_stats).collect();

    let way = support::fail_over(&cl, replica);
    assert_eq!(
        cl.owner(&format!("prom:{}", keys[0])).port,
        cl.nodes[replica].port
    );

    let calls = lim.counters().snapshot().redis_calls;
    // Routed by the limiter's old slot table: MOVED, then the promoted replica.
    let d = lim.check(keys[0].as_str(), &w).await.unwrap();
    assert!(
        d.allowed && !d.degraded && d.source == redis_rl_client::Source::Fallback,
        "{way:?}: {d:?}"
    );
    assert_eq!(
        d.remaining, 7,
        "{way:?}: decided on the promoted replica from the replicated state"
    );
    let on_new = support::command_stats(&cl.nodes[replica]);
    let was = &before[replica];
    let calls_now = lim.counters().snapshot().redis_calls;
    if scripts {
        // EVALSHA met NOSCRIPT there, then the text once: one recovery, one more call.
        assert_eq!(
            count(&on_new, "eval"),
            count(was, "eval") + 1,
            "{way:?}: {on_new:?}"
        );
        assert_eq!(
            count(&on_new, "evalsha"),
            count(was, "evalsha") + 1,
            "{way:?}: {on_new:?}"
        );
        assert_eq!(calls_now, calls + 2, "{way:?}");
    } else {
        // The library was there already: one FCALL, nothing loaded.
        assert_eq!(
            count(&on_new, "fcall"),
            count(was, "fcall") + 1,
            "{way:?}: {on_new:?}"
        );
        assert_eq!(calls_now, calls + 1, "{way:?}");
        let v: String = redis::cmd("FCALL_RO")
            .arg("rl_version")
            .arg(0)
            .query(&mut cl.nodes[replica].conn())
            .unwrap();
        assert!(redis_rl_client::LUA_LIBRARY.contains(&format!("local VERSION = '{v}'")));
    }

    assert_eq!(lim.check(keys[0].as_str(), &w).await.unwrap().remaining, 6);
    let on_new = support::command_stats(&cl.nodes[replica]);
    assert_eq!(
        count(&on_new, load),
        count(was, load) + u64::from(scripts),
        "loaded once, not per call: {on_new:?}"
    );
    if scripts {
        assert_eq!(
            count(&on_new, "evalsha"),
            count(was, "evalsha") + 2,
            "by SHA1 again: {on_new:?}"
        );
    }
    for k in &keys[1..] {
        assert_eq!(lim.check(k.as_str(), &w).await.unwrap().remaining, 8);
    }
    for (i, n) in cl.nodes.iter().enumerate() {
        if i != replica {
            assert_eq!(
                count(&support::command_stats(n), load),
                count(&before[i], load),
                "{way:?}: no load on node {i}"
            );
        }
    }
    let c = lim.counters().snapshot();
    assert_eq!((c.errors, c.degraded), (0, 0), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_a_replica_promoted_after_start_answers_exactly() {
    a_replica_promoted_after_start_answers_exactly(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_a_replica_promoted_after_start_answers_exactly() {
    a_replica_promoted_after_start_answers_exactly(true).await;
}

/// A rolling deploy reached one master first: the older client keeps the newer library
/// there and still loads its own where none is (each master has its own plan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_library_on_one_master_leaves_the_others_loaded() {
    let cl = cluster(Kind::Fallback);
    let ours = redis_rl_client::LUA_LIBRARY
        .split("local VERSION = '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap()
        .to_owned();
    let newer = redis_rl_client::LUA_LIBRARY.replace(
        &format!("local VERSION = '{ours}'"),
        "local VERSION = '99.0.0'",
    );
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(newer)
        .query(&mut cl.nodes[0].conn())
        .unwrap();
    let lim = strict_limiter(&cl, "nw:").await;
    let w = Window::new(5, 3600, redis_rl_client::Algorithm::Log).unwrap();
    for i in 0..12 {
        let k = tag(&format!("user{i}"), &["api"]).unwrap();
        assert!(lim.check(k.as_str(), &w).await.unwrap().allowed, "{k}");
    }
    let versions: Vec<String> = cl
        .nodes
        .iter()
        .map(|n| {
            redis::cmd("FCALL_RO")
                .arg("rl_version")
                .arg(0)
                .query(&mut n.conn())
                .unwrap()
        })
        .collect();
    assert_eq!(versions, ["99.0.0", ours.as_str(), ours.as_str()]);
}
