//! Replication: a replica receives the effect (RL.APPLY with absolute times) and holds
//! byte-identical state and expiry; a promoted replica keeps limiting.

mod common;

use std::time::Duration;

use common::{err_s, info_field, q, rl, snapshot, wait_until, Server};

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
    let acked: i64 = q(&mut m, &["WAIT", "1", "5000"]);
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
    assert_eq!(q::<i64>(&mut m, &["WAIT", "1", "5000"]), 1);
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
        .set_read_timeout(Some(Duration::from_millis(2000)))
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
