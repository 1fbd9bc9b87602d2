//! The same limiter rules in every topology production runs: a plain server, behind a replica,
//! with AOF (appendfsync always) across SIGKILL, and in a three-master Redis Cluster; plus
//! resharding, concurrency, eviction and clock steps.

mod common;

use std::process::Command;
use std::thread;
use std::time::Duration;

use common::{
    err_s, gcra_state, info_field, key_slot, log_state, now_ns, q, rl, snapshot, wait_until,
    Cluster, Dump, Server,
};

/// Runs one limiter command and returns its five-integer reply.
type Run<'a> = dyn FnMut(&[&str]) -> [i64; 5] + 'a;

/// The behaviour suite: the core RL.GCRA and RL.WINDOW rules, on `n` keys per rule (spread
/// over the cluster's slots when there is one). Returns every key written.
fn behaviour_suite(run: &mut Run<'_>, prefix: &str, n: usize) -> Vec<String> {
    let mut written = Vec::new();
    for i in 0..n {
        // GCRA: exactly the burst, then denied; QUANTITY 0 and PEEK write nothing.
        let key = format!("{prefix}:gcra:{i}");
        assert_eq!(
            run(&["RL.GCRA", &key, "3", "1", "600", "QUANTITY", "0"]),
            [1, 3, 3, -1, 0]
        );
        assert_eq!(
            run(&["RL.GCRA", &key, "3", "1", "600", "PEEK"])[..3],
            [1, 3, 2]
        );
        for remaining in [2, 1, 0] {
            assert_eq!(
                run(&["RL.GCRA", &key, "3", "1", "600"])[..3],
                [1, 3, remaining],
                "{key}"
            );
        }
        let denied = run(&["RL.GCRA", &key, "3", "1", "600"]);
        assert_eq!(denied[..3], [0, 3, 0]);
        assert!(
            denied[3] > 600_000 - common::WALL_SLACK_MS && denied[3] <= 600_000,
            "{denied:?}"
        );
        assert_eq!(
            run(&["RL.GCRA", &key, "3", "1", "600", "QUANTITY", "4"])[..4],
            [0, 3, 0, -1]
        );
        written.push(key);
        // Each window algorithm: the limit, then denied; oversize never passes.
        for algo in ["FIXED", "SLIDING", "LOG"] {
            let key = format!("{prefix}:{algo}:{i}");
            assert_eq!(
                run(&["RL.WINDOW", &key, "4", "3600", algo, "QUANTITY", "3"])[..3],
                [1, 4, 1],
                "{key}"
            );
            assert_eq!(
                run(&["RL.WINDOW", &key, "4", "3600", algo])[..3],
                [1, 4, 0],
                "{key}"
            );
            assert_eq!(run(&["RL.WINDOW", &key, "4", "3600", algo])[0], 0, "{key}");
            assert_eq!(
                run(&["RL.WINDOW", &key, "4", "3600", algo, "QUANTITY", "5"])[..4],
                [0, 4, 0, -1]
            );
            written.push(key);
        }
        // LEASE: at most 2 slots held; the same token renews; a third holder waits.
        let key = format!("{prefix}:lease:{i}");
        assert_eq!(run(&["RL.LEASE", &key, "2", "600", "a"])[..3], [1, 2, 1]);
        assert_eq!(run(&["RL.LEASE", &key, "2", "600", "a"])[..3], [1, 2, 1]);
        assert_eq!(run(&["RL.LEASE", &key, "2", "600", "b"])[..3], [1, 2, 0]);
        assert_eq!(run(&["RL.LEASE", &key, "2", "600", "c"])[..3], [0, 2, 0]);
        written.push(key);
        // FORCE: usage past the burst is recorded, and later requests wait for it.
        let key = format!("{prefix}:force:{i}");
        assert_eq!(
            run(&["RL.GCRA", &key, "3", "1", "600", "QUANTITY", "5", "FORCE"])[..4],
            [1, 3, 0, -1]
        );
        assert_eq!(run(&["RL.GCRA", &key, "3", "1", "600"])[0], 0);
        written.push(key);
    }
    written
}

/// After the suite, every key is still over its limit.
fn still_over_limit(run: &mut Run<'_>, keys: &[String]) {
    for key in keys {
        let r = if key.contains(":gcra:") || key.contains(":force:") {
            run(&["RL.GCRA", key, "3", "1", "600"])
        } else if key.contains(":lease:") {
            run(&["RL.LEASE", key, "2", "600", "c"])
        } else {
            let algo = ["FIXED", "SLIDING", "LOG"]
                .into_iter()
                .find(|a| key.contains(a))
                .unwrap();
            run(&["RL.WINDOW", key, "4", "3600", algo])
        };
        assert_eq!(r[0], 0, "{key} admitted after the topology change: {r:?}");
    }
}

fn plain_runner(c: &mut redis::Connection) -> impl FnMut(&[&str]) -> [i64; 5] + '_ {
    move |args| rl(c, args)
}

#[test]
fn plain_server() {
    let s = Server::start();
    let mut c = s.conn();
    let keys = behaviour_suite(&mut plain_runner(&mut c), "plain", 2);
    for key in &keys {
        let pttl: i64 = q(&mut c, &["PTTL", key]);
        assert!(pttl > 0, "{key} has no TTL");
    }
}

#[test]
fn behind_a_replica() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    let mut r = replica.conn();
    wait_until("the replication link", Duration::from_secs(20), || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut m = master.conn();
    let keys = behaviour_suite(&mut plain_runner(&mut m), "repl", 2);
    assert_eq!(q::<i64>(&mut m, &["WAIT", "1", "30000"]), 1);
    for key in &keys {
        assert_eq!(snapshot(&mut r, key), snapshot(&mut m, key), "{key}");
    }
    // Failover: the promoted replica keeps every limit.
    q::<()>(&mut r, &["REPLICAOF", "NO", "ONE"]);
    still_over_limit(&mut plain_runner(&mut r), &keys);
}

#[test]
fn aof_always_across_sigkill() {
    let mut s = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = s.conn();
    let keys = behaviour_suite(&mut plain_runner(&mut c), "aof", 2);
    let before: Vec<_> = keys.iter().map(|k| snapshot(&mut c, k)).collect();
    s.kill();
    s.restart();
    let mut c = s.conn();
    let after: Vec<_> = keys.iter().map(|k| snapshot(&mut c, k)).collect();
    assert_eq!(after, before, "every admitted request survived SIGKILL");
    still_over_limit(&mut plain_runner(&mut c), &keys);
}

fn cluster_rl(c: &mut redis::cluster::ClusterConnection, args: &[&str]) -> [i64; 5] {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let v: Vec<i64> = cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    v.try_into().unwrap()
}

#[test]
fn redis_cluster() {
    let cluster = Cluster::start(3);
    let mut c = cluster.conn();
    let keys = behaviour_suite(&mut |args: &[&str]| cluster_rl(&mut c, args), "cl", 8);
    // The keys are spread over all three masters.
    let owners: std::collections::HashSet<u16> =
        keys.iter().map(|k| cluster.owner(k).port).collect();
    assert_eq!(owners.len(), 3, "keys on {owners:?}");
    // Every command declares its keys, and a node that does not own the slot answers MOVED.
    let key = &keys[0];
    let owner = cluster.owner(key).port;
    let other = cluster.nodes.iter().find(|n| n.port != owner).unwrap();
    let mut wrong = other.conn();
    for cmd in [
        vec!["RL.GCRA", key.as_str(), "3", "1", "600"],
        vec!["RL.WINDOW", key.as_str(), "3", "600"],
        vec!["RL.REFUND", key.as_str(), "1"],
        vec!["CL.THROTTLE", key.as_str(), "2", "1", "600"],
        vec!["RL.ALL", "1", key.as_str(), "GCRA", "3", "1", "600"],
    ] {
        let e = err_s(&mut wrong, &cmd);
        assert!(e.starts_with("MOVED"), "{cmd:?}: {e}");
        let mut getkeys = vec!["COMMAND", "GETKEYS"];
        getkeys.extend(&cmd);
        assert_eq!(
            q::<Vec<String>>(&mut wrong, &getkeys),
            vec![key.clone()],
            "{cmd:?}"
        );
    }
    // Hash tags keep one user's limits together, so RL.ALL works; different slots: CROSSSLOT.
    let (a, b) = ("{user42}:api", "{user42}:ip");
    assert_eq!(key_slot(a), key_slot(b));
    let mut owner_conn = cluster.owner(a).conn();
    let combined: (Vec<i64>, Vec<Vec<i64>>) = redis::cmd("RL.ALL")
        .arg(2)
        .arg(a)
        .arg(b)
        .arg("GCRA")
        .arg(5)
        .arg(1)
        .arg(60)
        .arg("WINDOW")
        .arg(3)
        .arg(60)
        .arg("LOG")
        .query(&mut owner_conn)
        .unwrap();
    assert_eq!(combined.0[..3], [1, 3, 2]);
    let e = err_s(
        &mut owner_conn,
        &[
            "RL.ALL", "2", "{a}x", "{b}y", "GCRA", "1", "1", "1", "GCRA", "1", "1", "1",
        ],
    );
    assert!(e.starts_with("CROSSSLOT"), "{e}");
}

#[test]
fn resharding_keeps_state_ttl_and_limits() {
    let cluster = Cluster::start(3);
    let source = &cluster.nodes[1];
    let target = &cluster.nodes[2];
    let mut sc = source.conn();
    // redis-cli --cluster reshard moves the source's lowest slots first: use keys in it.
    let slots: Vec<redis::Value> = q(&mut sc, &["CLUSTER", "SLOTS"]);
    let lowest = slots.iter().filter_map(|r| match r {
        redis::Value::Array(p) => match (p.first(), p.get(2)) {
            (Some(redis::Value::Int(lo)), Some(redis::Value::Array(m)))
                if matches!(m.get(1), Some(redis::Value::Int(port)) if *port == i64::from(source.port)) => Some(*lo as u16),
            _ => None,
        },
        _ => None,
    }).min().expect("source owns slots");
    let tag = (0..200_000)
        .map(|i| format!("t{i}"))
        .find(|t| key_slot(t) == lowest)
        .expect("a tag in the slot");
    let keys: Vec<String> = ["gcra", "FIXED", "SLIDING", "LOG", "lease"]
        .iter()
        .map(|k| format!("{{{tag}}}:{k}"))
        .collect();
    let lease = &keys[4];
    assert_eq!(
        rl(
            &mut sc,
            &["RL.GCRA", &keys[0], "2", "1", "600", "QUANTITY", "2"]
        )[0],
        1
    );
    for (key, algo) in keys[1..].iter().zip(["FIXED", "SLIDING", "LOG"]) {
        assert_eq!(
            rl(
                &mut sc,
                &["RL.WINDOW", key, "2", "3600", algo, "QUANTITY", "2"]
            )[0],
            1
        );
    }
    assert_eq!(
        rl(
            &mut sc,
            &["RL.LEASE", lease, "2", "600", "a", "QUANTITY", "2"]
        )[0],
        1
    );
    let before: Vec<(Option<Vec<u8>>, i64)> = keys.iter().map(|k| snapshot(&mut sc, k)).collect();
    let out = Command::new("redis-cli")
        .args([
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{}", source.port),
        ])
        .args([
            "--cluster-from",
            &Cluster::node_id(source),
            "--cluster-to",
            &Cluster::node_id(target),
        ])
        .args(["--cluster-slots", "1", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reshard: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    cluster.wait_ok();
    assert_eq!(cluster.owner(&keys[0]).port, target.port, "the slot moved");
    let mut tc = target.conn();
    for (key, (dump, expire_at)) in keys.iter().zip(&before) {
        let (dump_after, expire_after) = snapshot(&mut tc, key);
        assert_eq!(&dump_after, dump, "{key}: state moved byte for byte");
        // MIGRATE carries a relative TTL: the expiry may move by the transfer time (a few
        // ms; the margin is for a loaded machine).
        assert!(
            (expire_after - expire_at).abs() < 5 * common::WALL_SLACK_MS,
            "{key}: {expire_at} → {expire_after}"
        );
    }
    // The client over its limit stays over it on the new owner.
    assert_eq!(rl(&mut tc, &["RL.GCRA", &keys[0], "2", "1", "600"])[0], 0);
    for (key, algo) in keys[1..].iter().zip(["FIXED", "SLIDING", "LOG"]) {
        assert_eq!(
            rl(&mut tc, &["RL.WINDOW", key, "2", "3600", algo])[0],
            0,
            "{key}"
        );
    }
    assert_eq!(rl(&mut tc, &["RL.LEASE", lease, "2", "600", "b"])[0], 0);
    let released: Vec<i64> = q(&mut tc, &["RL.RELEASE", lease, "a"]);
    assert_eq!(released, [2, 2, 0]);
}

#[test]
fn eight_connections_on_one_key_admit_exactly_the_limit() {
    let s = Server::start();
    for (label, args) in [
        (
            "FIXED",
            vec!["RL.WINDOW", "conc:fixed", "100", "3600", "FIXED"],
        ),
        ("LOG", vec!["RL.WINDOW", "conc:log", "100", "3600", "LOG"]),
        (
            "SLIDING",
            vec!["RL.WINDOW", "conc:sliding", "100", "3600", "SLIDING"],
        ),
        ("GCRA", vec!["RL.GCRA", "conc:gcra", "100", "1", "3600"]),
    ] {
        let admitted: i64 = thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let mut c = s.conn();
                    let args = args.clone();
                    scope.spawn(move || (0..60).map(|_| rl(&mut c, &args)[0]).sum::<i64>())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100, "{label}: 480 attempts from 8 connections");
    }
}

#[test]
fn eviction_treats_limiter_keys_like_any_key() {
    for policy in ["volatile-ttl", "allkeys-lru"] {
        let s = Server::builder()
            .arg("maxmemory", "4mb")
            .arg("maxmemory-policy", policy)
            .start();
        let mut c = s.conn();
        let mut pipe = redis::pipe();
        for i in 0..60_000 {
            pipe.cmd("RL.GCRA")
                .arg(format!("evict:{i}"))
                .arg(10)
                .arg(1)
                .arg(3600)
                .ignore();
        }
        // Some writes may meet OOM before eviction catches up: that is the server's answer.
        let _ = pipe.query::<()>(&mut c);
        let evicted: i64 = info_field(&mut c, "stats", "evicted_keys")
            .unwrap()
            .parse()
            .unwrap();
        assert!(evicted > 0, "{policy}: nothing evicted");
        assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
        assert_eq!(
            rl(&mut c, &["RL.GCRA", "evict:after", "10", "1", "3600"])[0],
            1,
            "{policy}"
        );
        let dbsize: i64 = q(&mut c, &["DBSIZE"]);
        assert!(dbsize > 0 && dbsize < 60_000, "{policy}: {dbsize} keys");
    }
}

/// One hour in ns.
const HOUR_NS: u64 = 3_600_000_000_000;

#[test]
fn clock_steps_never_admit_beyond_the_limit() {
    // A state dated in the future (as after the server's clock stepped back, a failover to a
    // host whose clock is behind, or an RDB moved between hosts) is RESTOREd with a valid
    // checksum: requests stay denied and nothing panics. A state dated in the past is idle.
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "model", "3", "1", "3600"]);
    let frame = Dump::parse(&q::<Vec<u8>>(&mut c, &["DUMP", "model"]));
    let now = now_ns();
    let t = HOUR_NS; // 3 per 3 hours... one request per hour
    let cases = [
        ("future_gcra", gcra_state(now + 4 * t, t, 3, now + HOUR_NS)),
        ("future_log", log_state(3 * HOUR_NS, 3, now + HOUR_NS, 3)),
        (
            "past_gcra",
            gcra_state(now - HOUR_NS, t, 3, now - 4 * HOUR_NS),
        ),
        ("past_log", log_state(HOUR_NS, 3, now - 2 * HOUR_NS, 3)),
    ];
    for (key, state) in &cases {
        redis::cmd("RESTORE")
            .arg(*key)
            .arg(36_000_000)
            .arg(frame.with_state(state))
            .query::<()>(&mut c)
            .unwrap_or_else(|e| panic!("RESTORE {key}: {e}"));
    }
    let r = rl(&mut c, &["RL.GCRA", "future_gcra", "3", "1", "10800"]);
    assert_eq!(r[..3], [0, 3, 0], "future-dated GCRA");
    assert!(r[3] >= 3_600_000, "retry covers the time ahead: {r:?}");
    assert_eq!(
        rl(
            &mut c,
            &["RL.GCRA", "future_gcra", "3", "1", "10800", "QUANTITY", "0"]
        )[2],
        0
    );
    let r = rl(&mut c, &["RL.WINDOW", "future_log", "3", "10800", "LOG"]);
    assert_eq!(r[..3], [0, 3, 0], "future-dated LOG");
    assert!(r[3] >= 3 * 3_600_000, "{r:?}");
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "past_gcra", "3", "1", "10800"])[..3],
        [1, 3, 2]
    );
    assert_eq!(
        rl(&mut c, &["RL.WINDOW", "past_log", "3", "3600", "LOG"])[..3],
        [1, 3, 2]
    );
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
}

#[test]
fn regression_refund_of_a_future_dated_sliding_state_keeps_files_loadable() {
    // Found by attack testing: RL.REFUND rebuilt a SLIDING state written in a later window
    // (by a node whose clock was ahead) into an invalid one; replicas refused the effect and
    // the RDB no longer loaded.
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    let mut r = replica.conn();
    wait_until("the replication link", Duration::from_secs(20), || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut c = master.conn();
    rl(&mut c, &["RL.GCRA", "model", "3", "1", "3600"]);
    let frame = Dump::parse(&q::<Vec<u8>>(&mut c, &["DUMP", "model"]));
    let s1: u64 = 1_000_000_000;
    let later = (now_ns() / s1 + 3) * s1; // a window three seconds ahead
    let mut state = vec![2u8, 3];
    for f in [s1, 10, later, 2, 3, later + s1 / 10] {
        state.extend_from_slice(&f.to_le_bytes());
    }
    redis::cmd("RESTORE")
        .arg("sl")
        .arg(60_000)
        .arg(frame.with_state(&state))
        .query::<()>(&mut c)
        .unwrap();
    let r1: Vec<i64> = q(&mut c, &["RL.REFUND", "sl", "1"]);
    assert_eq!(r1[0], 1);
    assert_eq!(q::<i64>(&mut c, &["WAIT", "1", "30000"]), 1);
    assert_eq!(
        snapshot(&mut r, "sl"),
        snapshot(&mut c, "sl"),
        "the replica applied the effect"
    );
    let dump: Vec<u8> = q(&mut c, &["DUMP", "sl"]);
    redis::cmd("RESTORE")
        .arg("sl2")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    q::<()>(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "sl"]), 1);
}
