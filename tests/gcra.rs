//! RL.GCRA over the wire, against a real redis-server: the RL.GCRA rules of docs/reference.md
//! (docs/reference.md#r-gcra-1 on) and the conventions they share with every command.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::{assert_ms, err_s, frozen_server, q, rl, Server, WALL_SLACK_MS};

const MS_NS: u64 = 1_000_000;

#[test]
fn idle_key_admits_exactly_burst_then_denies() {
    let s = Server::start();
    let mut c = s.conn();
    // burst 3, 1 request per 100 s: T = 100 000 ms.
    let r = rl(&mut c, &["RL.GCRA", "k", "3", "1", "100"]);
    assert_eq!(&r[..4], &[1, 3, 2, -1]);
    assert_ms(r[4], 100_000, WALL_SLACK_MS);
    let r = rl(&mut c, &["RL.GCRA", "k", "3", "1", "100"]);
    assert_eq!(&r[..4], &[1, 3, 1, -1]);
    assert_ms(r[4], 200_000, WALL_SLACK_MS);
    let r = rl(&mut c, &["RL.GCRA", "k", "3", "1", "100"]);
    assert_eq!(&r[..4], &[1, 3, 0, -1]);
    assert_ms(r[4], 300_000, WALL_SLACK_MS);
    let r = rl(&mut c, &["RL.GCRA", "k", "3", "1", "100"]);
    assert_eq!(&r[..3], &[0, 3, 0]);
    assert_ms(r[3], 100_000, WALL_SLACK_MS);
    assert_ms(r[4], 300_000, WALL_SLACK_MS);
}

#[test]
fn waiting_retry_after_admits_the_same_request() {
    // On a frozen clock: on the real one, a machine that stalls 100 ms between the first two
    // calls (a loaded one can) would give the token back before the denial is asked for.
    let Some((clock, _s, mut c, start)) = frozen_server() else {
        return;
    };
    // burst 2, 10 per second: T = 100 ms.
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "w", "2", "10", "1", "QUANTITY", "2"])[0],
        1
    );
    let denied = rl(&mut c, &["RL.GCRA", "w", "2", "10", "1"]);
    assert_eq!(denied, [0, 2, 0, 100, 200]);
    // A millisecond less is still denied; waiting exactly retry_after admits.
    clock.freeze_at(start + 99 * MS_NS);
    assert_eq!(rl(&mut c, &["RL.GCRA", "w", "2", "10", "1"])[0], 0);
    clock.freeze_at(start + 100 * MS_NS);
    assert_eq!(rl(&mut c, &["RL.GCRA", "w", "2", "10", "1"])[0], 1);
}

#[test]
fn ttl_follows_every_allowed_write() {
    let s = Server::start();
    let mut c = s.conn();
    for i in 1..=5 {
        let r = rl(&mut c, &["RL.GCRA", "t", "10", "2", "60"]);
        assert_eq!(r[0], 1);
        // PTTL is read by a second command: it may trail reset_after_ms by the time between
        // the two (the exact expiry is checked against the effect in the replication tests).
        let pttl: i64 = q(&mut c, &["PTTL", "t"]);
        assert_ms(pttl, r[4], WALL_SLACK_MS);
        assert_ms(r[4], 30_000 * i, WALL_SLACK_MS);
    }
    // A denied request does not move the TTL.
    let full = rl(&mut c, &["RL.GCRA", "t", "10", "2", "60", "QUANTITY", "6"]);
    assert_eq!(full[0], 0);
    let pexpiretime_before: i64 = q(&mut c, &["PEXPIRETIME", "t"]);
    let _ = rl(&mut c, &["RL.GCRA", "t", "10", "2", "60", "QUANTITY", "6"]);
    let pexpiretime_after: i64 = q(&mut c, &["PEXPIRETIME", "t"]);
    assert_eq!(pexpiretime_before, pexpiretime_after);
}

#[test]
fn key_expires_exactly_when_idle_again() {
    let s = Server::start();
    let mut c = s.conn();
    // T = 50 ms; after one request the key is idle again 50 ms later and must be gone.
    let r = rl(&mut c, &["RL.GCRA", "e", "5", "20", "1"]);
    assert_eq!(r[0], 1);
    assert_ms(r[4], 50, 5);
    sleep(Duration::from_millis(120));
    let exists: i64 = q(&mut c, &["EXISTS", "e"]);
    assert_eq!(exists, 0);
}

#[test]
fn quantity_zero_reports_and_never_creates_a_key() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "z", "5", "1", "10", "QUANTITY", "0"]),
        [1, 5, 5, -1, 0]
    );
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "z"]), 0);
    rl(&mut c, &["RL.GCRA", "z", "5", "1", "10", "QUANTITY", "2"]);
    let r = rl(&mut c, &["RL.GCRA", "z", "5", "1", "10", "quantity", "0"]);
    assert_eq!(&r[..4], &[1, 5, 3, -1]);
    assert_ms(r[4], 20_000, WALL_SLACK_MS);
}

#[test]
fn peek_evaluates_exactly_but_writes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let r = rl(&mut c, &["RL.GCRA", "p", "2", "1", "10", "PEEK"]);
    assert_eq!(&r[..4], &[1, 2, 1, -1]);
    assert_ms(r[4], 10_000, WALL_SLACK_MS);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "p"]), 0);
    rl(&mut c, &["RL.GCRA", "p", "2", "1", "10", "QUANTITY", "2"]);
    let before: Vec<u8> = q(&mut c, &["DUMP", "p"]);
    let peek = rl(&mut c, &["RL.GCRA", "p", "2", "1", "10", "peek"]);
    assert_eq!(&peek[..3], &[0, 2, 0]);
    assert_ms(peek[3], 10_000, WALL_SLACK_MS);
    let real = rl(&mut c, &["RL.GCRA", "p", "2", "1", "10"]);
    assert_eq!(&real[..3], &peek[..3]);
    assert_eq!(q::<Vec<u8>>(&mut c, &["DUMP", "p"]), before);
}

#[test]
fn quantity_above_burst_is_denied_with_minus_one() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "q", "5", "1", "10"]);
    let r = rl(&mut c, &["RL.GCRA", "q", "5", "1", "10", "QUANTITY", "6"]);
    assert_eq!(&r[..4], &[0, 5, 4, -1]);
    assert_ms(r[4], 10_000, WALL_SLACK_MS);
    // The whole burst at once is fine from an idle key.
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "q2", "5", "1", "10", "QUANTITY", "5"])[..3],
        [1, 5, 0]
    );
}

#[test]
fn parameter_change_keeps_capacity_in_use() {
    let s = Server::start();
    let mut c = s.conn();
    // 4 of 10 used at 1 per 10 s; at 1 per 1 s those 4 requests take 4 s to drain.
    rl(&mut c, &["RL.GCRA", "c", "10", "1", "10", "QUANTITY", "4"]);
    let r = rl(&mut c, &["RL.GCRA", "c", "10", "1", "1", "QUANTITY", "0"]);
    assert_eq!(&r[..3], &[1, 10, 6]);
    assert_ms(r[4], 4_000, WALL_SLACK_MS);
    // Lower burst below what is in use: denied until it drains, not reset, not locked out.
    let r = rl(&mut c, &["RL.GCRA", "c", "3", "1", "10"]);
    assert_eq!(&r[..3], &[0, 3, 0]);
    assert_ms(r[3], 20_000, WALL_SLACK_MS);
}

#[test]
fn wrong_type_is_wrongtype() {
    let s = Server::start();
    let mut c = s.conn();
    q::<()>(&mut c, &["SET", "str", "x"]);
    q::<i64>(&mut c, &["LPUSH", "list", "x"]);
    for key in ["str", "list"] {
        let e = err_s(&mut c, &["RL.GCRA", key, "1", "1", "1"]);
        assert!(e.starts_with("WRONGTYPE"), "{e}");
        let e = err_s(&mut c, &["RL.GCRA", key, "1", "1", "1", "PEEK"]);
        assert!(e.starts_with("WRONGTYPE"), "{e}");
    }
    assert_eq!(q::<String>(&mut c, &["GET", "str"]), "x");
}

#[test]
fn multi_exec_and_eval_run_the_command() {
    let s = Server::start();
    let mut c = s.conn();
    let replies: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("RL.GCRA")
        .arg("m")
        .arg(2)
        .arg(1)
        .arg(100)
        .cmd("RL.GCRA")
        .arg("m")
        .arg(2)
        .arg(1)
        .arg(100)
        .cmd("RL.GCRA")
        .arg("m")
        .arg(2)
        .arg(1)
        .arg(100)
        .query(&mut c)
        .unwrap();
    let allowed: Vec<i64> = replies.iter().map(|r| r[0]).collect();
    assert_eq!(allowed, vec![1, 1, 0]);
    let script = "return redis.call('RL.GCRA', KEYS[1], ARGV[1], 1, 100)";
    let r: Vec<i64> = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("ev")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(&r[..3], &[1, 1, 0]);
    let r: Vec<i64> = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("ev")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(&r[..3], &[0, 1, 0]);
}

#[test]
fn watch_is_aborted_by_an_allowed_write_only() {
    let s = Server::start();
    let mut watcher = s.conn();
    let mut other = s.conn();
    rl(&mut other, &["RL.GCRA", "wk", "1", "1", "100"]);
    // Denied, PEEK and QUANTITY 0 do not touch the key: the transaction goes through.
    q::<()>(&mut watcher, &["WATCH", "wk"]);
    rl(&mut other, &["RL.GCRA", "wk", "1", "1", "100"]);
    rl(&mut other, &["RL.GCRA", "wk", "1", "1", "100", "PEEK"]);
    rl(
        &mut other,
        &["RL.GCRA", "wk", "1", "1", "100", "QUANTITY", "0"],
    );
    q::<()>(&mut watcher, &["MULTI"]);
    q::<()>(&mut watcher, &["PING"]);
    let exec: Option<Vec<String>> = q(&mut watcher, &["EXEC"]);
    assert_eq!(exec, Some(vec!["PONG".to_owned()]));
    // An allowed write aborts it.
    q::<()>(&mut watcher, &["WATCH", "wk2"]);
    rl(&mut other, &["RL.GCRA", "wk2", "1", "1", "100"]);
    q::<()>(&mut watcher, &["MULTI"]);
    q::<()>(&mut watcher, &["PING"]);
    let exec: Option<Vec<String>> = q(&mut watcher, &["EXEC"]);
    assert_eq!(exec, None);
}

#[test]
fn keyspace_events_name_the_command_and_only_for_writes() {
    let s = Server::start();
    let mut c = s.conn();
    q::<()>(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
    let mut sub_con = s.conn();
    let mut pubsub = sub_con.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    rl(&mut c, &["RL.GCRA", "n", "1", "1", "100"]); // allowed: event
    rl(&mut c, &["RL.GCRA", "n", "1", "1", "100"]); // denied: none
    rl(&mut c, &["RL.GCRA", "n", "1", "1", "100", "PEEK"]); // none
    rl(&mut c, &["RL.GCRA", "n2", "1", "1", "100", "QUANTITY", "0"]); // none
    q::<()>(&mut c, &["SET", "marker", "1"]);
    let mut events = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        let payload: String = msg.get_payload().unwrap();
        events.push((msg.get_channel_name().to_owned(), payload));
        if events.last().is_some_and(|e| e.0.ends_with(":marker")) {
            break;
        }
    }
    assert_eq!(
        events,
        vec![
            ("__keyspace@0__:n".to_owned(), "rl.gcra".to_owned()),
            ("__keyspace@0__:marker".to_owned(), "set".to_owned()),
        ]
    );
}

#[test]
fn command_info_and_getkeys_declare_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = q(
        &mut c,
        &["COMMAND", "GETKEYS", "RL.GCRA", "user:42", "5", "1", "1"],
    );
    assert_eq!(keys, vec!["user:42"]);
    let info: redis::Value = q(&mut c, &["COMMAND", "INFO", "RL.GCRA"]);
    let text = format!("{info:?}");
    for needle in ["write", "RW", "access", "update"] {
        assert!(text.contains(needle), "COMMAND INFO lacks {needle}: {text}");
    }
    // Out of memory the limiter must still deny, so it checks memory itself (only writes are
    // refused) instead of being refused whole by the server.
    assert!(
        !text.contains("denyoom"),
        "RL.GCRA must not be deny-oom: {text}"
    );
    let modules: redis::Value = q(&mut c, &["MODULE", "LIST"]);
    let text = format!("{modules:?}");
    assert!(text.contains("\"rl\"") || text.contains("rl"), "{text}");
}

#[test]
fn module_reports_the_crate_version() {
    let s = Server::start();
    let mut c = s.conn();
    let list: Vec<Vec<redis::Value>> = q(&mut c, &["MODULE", "LIST"]);
    // Valkey 9 lists its built-in `lua` module too: find ours by name.
    let entry = list
        .iter()
        .find(|e| e.windows(2).any(|w| matches!((&w[0], &w[1]), (redis::Value::BulkString(k), redis::Value::BulkString(v)) if k == b"name" && v == b"rl")))
        .expect("module rl in MODULE LIST");
    let version = entry
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"ver"))
        .and_then(|i| entry.get(i + 1))
        .cloned();
    let (major, minor, patch): (i64, i64, i64) = {
        let v: Vec<i64> = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        (v[0], v[1], v[2])
    };
    assert_eq!(
        version,
        Some(redis::Value::Int(major * 10000 + minor * 100 + patch))
    );
}

#[test]
fn apply_is_refused_from_normal_clients() {
    let s = Server::start();
    let mut c = s.conn();
    let e = err_s(&mut c, &["RL.APPLY", "k", "x"]);
    assert!(e.starts_with("ERR RL.APPLY is internal"), "{e}");
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "k"]), 0);
    let e: String = redis::cmd("EVAL")
        .arg("return redis.pcall('RL.APPLY', KEYS[1], 'x')['err']")
        .arg(1)
        .arg("k")
        .query(&mut c)
        .unwrap();
    assert!(e.contains("RL.APPLY is internal"), "{e}");
}

#[test]
fn binary_keys_work() {
    let s = Server::start();
    let mut c = s.conn();
    let key: &[u8] = b"bin\x00key\xff\r\n";
    let r: Vec<i64> = redis::cmd("RL.GCRA")
        .arg(key)
        .arg(1)
        .arg(1)
        .arg(100)
        .query(&mut c)
        .unwrap();
    assert_eq!(&r[..3], &[1, 1, 0]);
    let r: Vec<i64> = redis::cmd("RL.GCRA")
        .arg(key)
        .arg(1)
        .arg(1)
        .arg(100)
        .query(&mut c)
        .unwrap();
    assert_eq!(r[0], 0);
}

#[test]
fn regression_raising_the_rate_never_locks_out() {
    // Found by attack testing: a denied call under a higher rate used to re-convert from the
    // stored state on every call, so the key drained at the old rate (an hour here).
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(rl(&mut c, &["RL.GCRA", "up", "1", "1", "3600"])[0], 1);
    let r = rl(&mut c, &["RL.GCRA", "up", "1", "10", "1"]);
    assert_eq!(&r[..3], &[0, 1, 0]);
    assert!(r[3] >= 1 && r[3] <= 100, "{r:?}");
    sleep(Duration::from_millis(r[3] as u64));
    let again = rl(&mut c, &["RL.GCRA", "up", "1", "10", "1"]);
    assert_eq!(again[0], 1, "waiting retry_after_ms must admit: {again:?}");
    // The allowed write adopted the new parameters: the TTL follows them.
    let pttl: i64 = q(&mut c, &["PTTL", "up"]);
    assert!(pttl <= 101, "PTTL {pttl}");
}
