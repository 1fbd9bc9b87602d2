//! Replication: a replica receives the effect (RL.APPLY with absolute times) and holds
//! byte-identical state and expiry; a promoted replica keeps limiting.

mod common;

use std::time::Duration;

use common::{err_s, info_field, q, rl, snapshot, wait_until, Clock, Server};

fn wait_for_link(replica: &Server) {
    let mut c = replica.conn();
    wait_until("the replication link", Duration::from_secs(20), || {
        info_field(&mut c, "replication", "master_link_status").as_deref() == Some("up")
    });
}

fn keys(c: &mut redis::Connection) -> Vec<String> {
    let mut k: Vec<String> = q(c, &["KEYS", "*"]);
    k.sort();
    k
}

#[test]
fn replica_holds_identical_state_and_expiry() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_for_link(&replica);
    let mut m = master.conn();
    for i in 0..50 {
        let key = format!("user:{}", i % 7);
        let burst = (3 + i % 4).to_string();
        let qty = (i % 3).to_string();
        rl(
            &mut m,
            &["RL.GCRA", &key, &burst, "1", "60", "QUANTITY", &qty],
        );
        rl(&mut m, &["RL.GCRA", &key, &burst, "1", "60", "PEEK"]);
        for algo in ["FIXED", "SLIDING", "LOG"] {
            let wkey = format!("{algo}:{}", i % 5);
            rl(
                &mut m,
                &["RL.WINDOW", &wkey, &burst, "60", algo, "QUANTITY", &qty],
            );
        }
    }
    // Writes from MULTI/EXEC and from a script replicate as effects too.
    let _: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("RL.GCRA")
        .arg("tx")
        .arg(2)
        .arg(1)
        .arg(60)
        .cmd("RL.GCRA")
        .arg("tx")
        .arg(2)
        .arg(1)
        .arg(60)
        .query(&mut m)
        .unwrap();
    let _: Vec<i64> = redis::cmd("EVAL")
        .arg("return redis.call('RL.GCRA', KEYS[1], 2, 1, 60)")
        .arg(1)
        .arg("lua")
        .query(&mut m)
        .unwrap();
    // RL.ALL and RL.REFUND replicate their effects too.
    for i in 0..6 {
        let _: redis::Value = redis::cmd("RL.ALL")
            .arg(2)
            .arg("{all}:a")
            .arg("{all}:b")
            .arg("GCRA")
            .arg(5)
            .arg(1)
            .arg(60)
            .arg("WINDOW")
            .arg(4)
            .arg(60)
            .arg("LOG")
            .query(&mut m)
            .unwrap();
        if i % 2 == 0 {
            let _: Vec<i64> = q(&mut m, &["RL.REFUND", "{all}:b", "1"]);
            let _: Vec<i64> = q(&mut m, &["RL.REFUND", "FIXED:1", "1"]);
            let _: Vec<i64> = q(&mut m, &["RL.REFUND", "user:2", "1"]);
        }
    }
    let acked: i64 = q(&mut m, &["WAIT", "1", "30000"]);
    assert_eq!(acked, 1);
    let mut r = replica.conn();
    let master_keys = keys(&mut m);
    assert_eq!(keys(&mut r), master_keys);
    assert!(master_keys.len() >= 24, "{master_keys:?}");
    for key in &master_keys {
        assert_eq!(snapshot(&mut r, key), snapshot(&mut m, key), "key {key}");
        let dm: Vec<String> = q(&mut m, &["DEBUG", "DIGEST-VALUE", key]);
        let dr: Vec<String> = q(&mut r, &["DEBUG", "DIGEST-VALUE", key]);
        assert_eq!(dm, dr, "digest of {key}");
    }
    // The replica refuses writes from clients, as for any write command.
    let e = err_s(&mut r, &["RL.GCRA", "user:1", "3", "1", "60"]);
    assert!(e.starts_with("READONLY"), "{e}");
}

#[test]
fn full_resync_transfers_state_through_rdb() {
    let master = Server::start();
    let mut m = master.conn();
    rl(
        &mut m,
        &["RL.GCRA", "pre", "2", "1", "600", "QUANTITY", "2"],
    );
    let before = snapshot(&mut m, "pre");
    // The replica joins afterwards: the state travels in the RDB of the full sync.
    let replica = Server::builder().replica_of(&master).start();
    wait_for_link(&replica);
    let mut r = replica.conn();
    assert_eq!(snapshot(&mut r, "pre"), before);
}

#[test]
fn promoted_replica_keeps_denying() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_for_link(&replica);
    let mut m = master.conn();
    for _ in 0..3 {
        assert_eq!(rl(&mut m, &["RL.GCRA", "over", "3", "1", "600"])[0], 1);
    }
    assert_eq!(rl(&mut m, &["RL.GCRA", "over", "3", "1", "600"])[0], 0);
    rl(
        &mut m,
        &["RL.GCRA", "half", "4", "1", "600", "QUANTITY", "2"],
    );
    assert_eq!(q::<i64>(&mut m, &["WAIT", "1", "30000"]), 1);
    let mut r = replica.conn();
    q::<()>(&mut r, &["REPLICAOF", "NO", "ONE"]);
    assert_eq!(rl(&mut r, &["RL.GCRA", "over", "3", "1", "600"])[0], 0);
    // Exactly what the master would have admitted: 2 more of 4, then no more.
    assert_eq!(
        rl(&mut r, &["RL.GCRA", "half", "4", "1", "600"])[..3],
        [1, 4, 1]
    );
    assert_eq!(
        rl(&mut r, &["RL.GCRA", "half", "4", "1", "600"])[..3],
        [1, 4, 0]
    );
    assert_eq!(rl(&mut r, &["RL.GCRA", "half", "4", "1", "600"])[0], 0);
}

#[test]
fn replicas_emit_the_masters_event_names() {
    let master = Server::start();
    let replica = Server::builder()
        .replica_of(&master)
        .arg("notify-keyspace-events", "KA")
        .start();
    wait_for_link(&replica);
    let mut sub_con = replica.conn();
    let mut pubsub = sub_con.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut m = master.conn();
    rl(
        &mut m,
        &["RL.GCRA", "e:gcra", "5", "1", "60", "QUANTITY", "2"],
    );
    rl(&mut m, &["RL.WINDOW", "e:window", "5", "60", "LOG"]);
    let _: redis::Value = q(&mut m, &["RL.ALL", "1", "e:all", "WINDOW", "5", "60"]);
    let _: Vec<i64> = q(&mut m, &["RL.REFUND", "e:gcra", "1"]); // partial
    let _: Vec<i64> = q(&mut m, &["RL.REFUND", "e:window", "9"]); // back to idle: deleted
    let _: Vec<i64> = q(&mut m, &["CL.THROTTLE", "e:throttle", "4", "1", "60"]);
    q::<()>(&mut m, &["SET", "e:marker", "1"]);
    let mut events = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        let payload: String = msg.get_payload().unwrap();
        let key = msg.get_channel_name().trim_start_matches("__keyspace@0__:");
        events.push(format!("{key} {payload}"));
        if key == "e:marker" {
            break;
        }
    }
    assert_eq!(
        events,
        [
            "e:gcra rl.gcra",
            "e:window rl.window",
            "e:all rl.all",
            "e:gcra rl.refund",
            "e:window rl.refund",
            "e:throttle cl.throttle",
            "e:marker set",
        ]
    );
    let mut r = replica.conn();
    assert_eq!(q::<i64>(&mut r, &["EXISTS", "e:window"]), 0);
}

/// Every key of `a` (and of `b`) holds the same value, expiry and digest in both.
fn assert_same_keys(a: &mut redis::Connection, b: &mut redis::Connection, what: &str) {
    let names = keys(a);
    assert_eq!(keys(b), names, "{what}: key names");
    for key in &names {
        assert_eq!(snapshot(b, key), snapshot(a, key), "{what}: key {key}");
        let da: Vec<String> = q(a, &["DEBUG", "DIGEST-VALUE", key]);
        let db: Vec<String> = q(b, &["DEBUG", "DIGEST-VALUE", key]);
        assert_eq!(da, db, "{what}: digest of {key}");
    }
}

/// After the master's writes: the replica, the replica of the replica and the master
/// reloaded from its own AOF hold what the master held.
fn assert_everywhere(
    m: &mut redis::Connection,
    r: &mut redis::Connection,
    s: &mut redis::Connection,
    what: &str,
) {
    assert_eq!(q::<i64>(m, &["WAIT", "1", "30000"]), 1, "{what}");
    wait_until("the sub-replica's offset", Duration::from_secs(30), || {
        info_field(s, "replication", "slave_repl_offset")
            == info_field(r, "replication", "master_repl_offset")
    });
    assert_same_keys(m, r, &format!("{what}, replica"));
    assert_same_keys(m, s, &format!("{what}, replica of the replica"));
    q::<()>(m, &["DEBUG", "LOADAOF"]);
    assert_same_keys(m, r, &format!("{what}, master reloaded from its AOF"));
}

#[test]
fn replicas_and_the_aof_keep_the_masters_state_and_expiry_across_clock_steps() {
    // The limiting commands send most writes in the compact form, whose expiry the reader
    // derives from the write; under clock steps the derived expiry is often not the master's
    // (a LOG request dated before the newest entry joins it, and the key keeps the newest
    // entry's expiry), and the general form must be sent. Every kind of write, with the clock
    // stepping back and forth, through a replica, a replica of the replica, the master's AOF
    // and its rewrite: all hold the master's bytes and expiries.
    let clock = Clock::new();
    let master = Server::builder()
        .clock(&clock)
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("aof-use-rdb-preamble", "no")
        .arg("repl-diskless-sync-delay", "0")
        .start();
    let replica = Server::builder()
        .clock(&clock)
        .replica_of(&master)
        .arg("repl-diskless-sync-delay", "0")
        .start();
    let sub = Server::builder().clock(&clock).replica_of(&replica).start();
    wait_for_link(&replica);
    wait_for_link(&sub);
    let mut m = master.conn();
    if !clock.governs(&mut m) {
        return;
    }
    let mut r = replica.conn();
    let mut s = sub.conn();
    let log = ["RL.WINDOW", "log", "200", "3600", "LOG"];
    for _ in 0..130 {
        assert_eq!(rl(&mut m, &log)[0], 1);
    }
    let before_step = q::<i64>(&mut m, &["PEXPIRETIME", "log"]);
    // 1.5 s back: these requests join the newest entry, which keeps its expiry.
    clock.step_to(-1_500_000);
    for _ in 0..5 {
        assert_eq!(rl(&mut m, &log)[0], 1);
    }
    assert_eq!(q::<i64>(&mut m, &["PEXPIRETIME", "log"]), before_step);
    assert_everywhere(&mut m, &mut r, &mut s, "after the step back");
    let script: &[&[&str]] = &[
        &["RL.GCRA", "g", "5", "1", "3600", "QUANTITY", "3"],
        &["RL.GCRA", "g", "5", "1", "3600", "MAXWAIT", "10000000"],
        &["RL.GCRA", "g", "5", "1", "3600", "QUANTITY", "4", "FORCE"],
        &["RL.GCRA", "g", "9", "2", "1800", "MAXWAIT", "99999999"],
        &[
            "RL.WINDOW",
            "f",
            "5",
            "3600",
            "FIXED",
            "QUANTITY",
            "7",
            "FORCE",
        ],
        &["RL.WINDOW", "s", "5", "3600", "SLIDING", "QUANTITY", "2"],
        &["RL.WINDOW", "s", "5", "7200", "SLIDING", "FORCE"],
        &["RL.WINDOW", "log2", "70", "3600", "LOG", "QUANTITY", "3"],
        &["RL.LEASE", "e", "3", "3600", "job-1"],
        &[
            "RL.ALL", "3", "g2", "log", "e", "GCRA", "5", "1", "3600", "WINDOW", "200", "3600",
            "LOG", "LEASE", "3", "3600", "job-2",
        ],
        &["CL.THROTTLE", "t", "3", "1", "3600", "2"],
    ];
    for (step, offset_us) in [0, 2_000_000, -700_000, 1_100_000].into_iter().enumerate() {
        clock.step_to(offset_us);
        for args in script {
            let _: redis::Value = q(&mut m, args);
        }
        assert_everywhere(&mut m, &mut r, &mut s, &format!("step {step}, writes"));
        for _ in 0..40 {
            rl(&mut m, &log);
            rl(&mut m, &["RL.WINDOW", "log2", "70", "3600", "LOG"]);
        }
        assert_everywhere(&mut m, &mut r, &mut s, &format!("step {step}, LOG"));
        let _: Vec<i64> = q(&mut m, &["RL.REFUND", "g", "2"]);
        let _: Vec<i64> = q(&mut m, &["RL.REFUND", "f", "3"]);
        let _: Vec<i64> = q(&mut m, &["RL.REFUND", "s", "1"]);
        let _: Vec<i64> = q(&mut m, &["RL.RELEASE", "e", "job-1"]);
        // Back below the first mark of the log's index, and a whole log given back.
        let _: Vec<i64> = q(&mut m, &["RL.REFUND", "log", "70"]);
        if step == 2 {
            let _: Vec<i64> = q(&mut m, &["RL.REFUND", "log2", "1000"]);
            assert_eq!(q::<i64>(&mut m, &["EXISTS", "log2"]), 0);
        }
        assert_everywhere(&mut m, &mut r, &mut s, &format!("step {step}, refunds"));
    }
    assert!(keys(&mut m).len() >= 8, "{:?}", keys(&mut m));
    // The AOF's rewrite (a state per key).
    q::<()>(&mut m, &["BGREWRITEAOF"]);
    wait_until("the AOF rewrite", Duration::from_secs(20), || {
        info_field(&mut m, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut m, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    q::<()>(&mut m, &["DEBUG", "LOADAOF"]);
    assert_same_keys(&mut m, &mut r, "master reloaded from its rewritten AOF");
}
