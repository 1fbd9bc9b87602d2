//! Usage accounting over the wire: concurrency leases (RL.LEASE, RL.RELEASE), usage recorded
//! after the fact (FORCE) and per-limit costs in RL.ALL, against a real redis-server.

mod common;

use std::time::Duration;

use common::{
    err, err_s, frozen_server, info_field, q, rl, snapshot, wait_until, Clock, Server,
    WALL_SLACK_MS,
};

fn all(c: &mut redis::Connection, args: &[&str]) -> ([i64; 5], Vec<[i64; 5]>) {
    let mut cmd = redis::cmd("RL.ALL");
    for a in args {
        cmd.arg(*a);
    }
    let (combined, per_key): (Vec<i64>, Vec<Vec<i64>>) =
        cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    (
        combined.try_into().unwrap(),
        per_key.into_iter().map(|v| v.try_into().unwrap()).collect(),
    )
}

fn release(c: &mut redis::Connection, key: &str, token: &str) -> [i64; 3] {
    let v: Vec<i64> = q(c, &["RL.RELEASE", key, token]);
    v.try_into().unwrap()
}

/// One second, in µs (the clock shim's unit).
const SECOND_US: i64 = 1_000_000;
/// One millisecond and one second, in ns (the frozen clock's unit).
const MS_NS: u64 = 1_000_000;
const SECOND_NS: u64 = 1_000_000_000;

/// Everything a call could change on `key`: its DUMP payload and absolute expiry, and its
/// digest.
fn untouched_state(c: &mut redis::Connection, key: &[u8]) -> (Option<Vec<u8>>, i64, Vec<String>) {
    let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    let expiry: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    let digest: Vec<String> = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(c)
        .unwrap();
    (dump, expiry, digest)
}

/// A server whose real-time clock is frozen at a round second of today, moved only by the
/// test; None (the test skips) where the clock shim does not govern the server.

#[test]
fn at_most_limit_slots_are_held_and_a_retried_acquire_renews() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "jobs", "3", "30", "a"]),
        [1, 3, 2, -1, 30_000]
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.LEASE", "jobs", "3", "30", "b", "QUANTITY", "2"]
        )[..4],
        [1, 3, 0, -1]
    );
    // A retry of "a" whose reply was lost renews its lease: no second slot taken.
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "jobs", "3", "30", "a"])[..4],
        [1, 3, 0, -1]
    );
    let denied = rl(&mut c, &["RL.LEASE", "jobs", "3", "30", "c"]);
    assert_eq!(denied[..3], [0, 3, 0]);
    assert!(
        denied[3] > 30_000 - WALL_SLACK_MS && denied[3] <= 30_000,
        "{denied:?}"
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.LEASE", "jobs", "3", "30", "c", "QUANTITY", "4"]
        )[..4],
        [0, 3, 0, -1]
    );
    // The key expires with its last lease.
    let pttl: i64 = q(&mut c, &["PTTL", "jobs"]);
    assert!(pttl > 30_000 - WALL_SLACK_MS && pttl <= 30_001, "{pttl}");
}

#[test]
fn a_crashed_holder_frees_its_slots_when_its_lease_ends() {
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return;
    }
    assert_eq!(rl(&mut c, &["RL.LEASE", "one", "1", "10", "crashed"])[0], 1);
    assert_eq!(rl(&mut c, &["RL.LEASE", "one", "1", "10", "next"])[0], 0);
    // Ten seconds later the crashed holder's lease has ended by itself.
    clock.step_to(10 * SECOND_US + 100_000);
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "one", "1", "10", "next"])[..3],
        [1, 1, 0]
    );
}

#[test]
fn release_frees_slots_twice_harmlessly_and_deletes_the_last_lease() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(release(&mut c, "missing", "a"), [0, 0, 0]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "missing"]), 0);
    rl(
        &mut c,
        &["RL.LEASE", "pool", "4", "60", "a", "QUANTITY", "3"],
    );
    rl(&mut c, &["RL.LEASE", "pool", "4", "60", "b"]);
    let r = release(&mut c, "pool", "a");
    assert_eq!(r[..2], [3, 3]);
    assert!(r[2] > 59_000, "{r:?}");
    assert_eq!(release(&mut c, "pool", "a")[..2], [0, 3]);
    assert_eq!(release(&mut c, "pool", "b"), [1, 4, 0]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "pool"]), 0);
}

#[test]
fn lease_reports_and_peeks_touch_nothing_and_writes_emit_their_events() {
    let s = Server::start();
    let mut c = s.conn();
    q::<()>(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KA"]);
    rl(&mut c, &["RL.LEASE", "w", "1", "60", "a"]);
    let mut watcher = s.conn();
    q::<()>(&mut watcher, &["WATCH", "w"]);
    assert_eq!(rl(&mut c, &["RL.LEASE", "w", "1", "60", "b"])[0], 0);
    assert_eq!(rl(&mut c, &["RL.LEASE", "w", "1", "60", "b", "PEEK"])[0], 0);
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "w", "1", "60", "b", "QUANTITY", "0"])[..3],
        [1, 1, 0]
    );
    assert_eq!(release(&mut c, "w", "nobody")[0], 0);
    q::<()>(&mut watcher, &["MULTI"]);
    q::<()>(&mut watcher, &["PING"]);
    let exec: Option<Vec<String>> = q(&mut watcher, &["EXEC"]);
    assert_eq!(exec, Some(vec!["PONG".to_owned()]));
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "nokey", "1", "60", "a", "PEEK"])[0],
        1
    );
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "nokey"]), 0);
    // Events: rl.lease for a lease taken, rl.release for one freed.
    let mut sub_con = s.conn();
    let mut pubsub = sub_con.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:e*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    rl(&mut c, &["RL.LEASE", "e", "2", "60", "a"]);
    rl(&mut c, &["RL.LEASE", "e", "2", "60", "b"]);
    release(&mut c, "e", "a");
    release(&mut c, "e", "b");
    q::<()>(&mut c, &["SET", "end", "1"]);
    let mut events = Vec::new();
    while events.len() < 4 {
        let Ok(msg) = pubsub.get_message() else { break };
        events.push(msg.get_payload::<String>().unwrap());
    }
    assert_eq!(events, ["rl.lease", "rl.lease", "rl.release", "rl.release"]);
}

#[test]
fn lease_errors_name_the_argument_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "g", "1", "1", "60"]);
    let long = "t".repeat(65);
    let cases: &[(&[&str], &str)] = &[
        (
            &["RL.LEASE", "x", "0", "30", "a"],
            "ERR limit must be a positive integer",
        ),
        (
            &["RL.LEASE", "x", "2", "0", "a"],
            "ERR lease must be seconds",
        ),
        (
            &["RL.LEASE", "x", "2", "30", ""],
            "ERR token must be 1 to 64 bytes",
        ),
        (
            &["RL.LEASE", "x", "2", "30", &long],
            "ERR token must be 1 to 64 bytes",
        ),
        (&["RL.RELEASE", "x", ""], "ERR token must be 1 to 64 bytes"),
        (
            &["RL.LEASE", "x", "20000", "30", "a"],
            "ERR limit 20000 is above rl.lease-max-limit (10000)",
        ),
        (
            &["RL.LEASE", "x", "2", "30", "a", "FORCE"],
            "ERR FORCE cannot be used on a LEASE limit",
        ),
        (
            &["RL.LEASE", "g", "2", "30", "a"],
            "ERR key 'g' holds a GCRA limiter, not a LEASE limit",
        ),
        (
            &["RL.RELEASE", "g", "a"],
            "ERR key 'g' holds a GCRA limiter, not a LEASE limit",
        ),
        (
            &["RL.LEASE", "g", "2", "30", "a", "RENEW"],
            "ERR key 'g' holds a GCRA limiter, not a LEASE limit",
        ),
        (
            &["RL.LEASE", "x", "2", "30", "a", "RENEW", "FORCE"],
            "ERR FORCE cannot be used on a LEASE limit",
        ),
    ];
    for (args, prefix) in cases {
        let e = err_s(&mut c, args);
        assert!(e.starts_with(prefix), "{args:?}: {e}");
    }
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "x"]), 0);
    rl(&mut c, &["RL.LEASE", "l", "2", "30", "a"]);
    let e = err_s(&mut c, &["RL.REFUND", "l", "1"]);
    assert!(e.contains("RL.RELEASE"), "{e}");
    // The cap is a module configuration.
    q::<()>(&mut c, &["CONFIG", "SET", "rl.lease-max-limit", "20000"]);
    assert_eq!(rl(&mut c, &["RL.LEASE", "x", "20000", "30", "a"])[0], 1);
    let max: Vec<String> = q(&mut c, &["CONFIG", "GET", "rl.lease-max-limit"]);
    assert_eq!(max[1], "20000");
}

#[test]
fn force_records_usage_past_the_limit_and_later_requests_wait() {
    let s = Server::start();
    let mut c = s.conn();
    // GCRA, burst 5 per minute (one per 12 s): 12 requests already happened.
    let forced = rl(
        &mut c,
        &["RL.GCRA", "g", "5", "5", "60", "QUANTITY", "12", "FORCE"],
    );
    assert_eq!(forced[..4], [1, 5, 0, -1]);
    assert!(
        forced[4] > 144_000 - WALL_SLACK_MS && forced[4] <= 144_000,
        "{forced:?}"
    );
    let pttl: i64 = q(&mut c, &["PTTL", "g"]);
    assert!(
        pttl > 144_000 - WALL_SLACK_MS,
        "the TTL covers the whole excess: {pttl}"
    );
    let next = rl(&mut c, &["RL.GCRA", "g", "5", "5", "60"]);
    assert_eq!(next[0], 0);
    assert!(
        next[3] > 96_000 - WALL_SLACK_MS,
        "waits until the excess drained: {next:?}"
    );
    // FIXED and SLIDING: the count passes the limit.
    for algo in ["FIXED", "SLIDING"] {
        let key = format!("w:{algo}");
        let r = rl(
            &mut c,
            &["RL.WINDOW", &key, "5", "60", algo, "QUANTITY", "9", "FORCE"],
        );
        assert_eq!(r[..4], [1, 5, 0, -1], "{algo}");
        assert_eq!(
            rl(&mut c, &["RL.WINDOW", &key, "5", "60", algo])[0],
            0,
            "{algo}"
        );
    }
    // Refused where it cannot apply; nothing written.
    let cases: &[(&[&str], &str)] = &[
        (
            &["RL.WINDOW", "n", "5", "60", "LOG", "FORCE"],
            "ERR FORCE cannot be used with LOG",
        ),
        (
            &["RL.GCRA", "n", "5", "1", "60", "FORCE", "PEEK"],
            "ERR FORCE cannot be used with PEEK",
        ),
        (
            &["RL.GCRA", "n", "5", "1", "60", "FORCE", "MAXWAIT", "100"],
            "ERR FORCE cannot be used with MAXWAIT",
        ),
        (
            &[
                "RL.ALL", "2", "{n}a", "{n}b", "GCRA", "5", "1", "60", "LEASE", "2", "60", "t",
                "FORCE",
            ],
            "ERR FORCE cannot be used on a LEASE limit",
        ),
        (
            &["RL.GCRA", "n", "5", "1", "60", "FORCE", "FORCE"],
            "ERR syntax error: FORCE given more than once",
        ),
    ];
    for (args, prefix) in cases {
        let e = err_s(&mut c, args);
        assert!(e.starts_with(prefix), "{args:?}: {e}");
    }
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "n", "{n}a", "{n}b"]), 0);
    // A count past 2^64 − 1 is an error, and the count stays.
    rl(
        &mut c,
        &[
            "RL.WINDOW",
            "big",
            "5",
            "60",
            "FIXED",
            "QUANTITY",
            "18446744073709551615",
            "FORCE",
        ],
    );
    let e = err_s(&mut c, &["RL.WINDOW", "big", "5", "60", "FIXED", "FORCE"]);
    assert!(e.starts_with("ERR arithmetic overflow"), "{e}");
}

#[test]
fn all_charges_each_limit_its_cost_and_binds_on_the_scarcest() {
    let s = Server::start();
    let mut c = s.conn();
    let call = |c: &mut redis::Connection, cost: &str, token: &str, extra: &[&str]| {
        let mut args = vec![
            "3", "{t}:rpm", "{t}:tpm", "{t}:cc", "WINDOW", "600", "60", "WINDOW", "90000", "60",
            "COST", cost, "LEASE", "2", "300", token,
        ];
        args.extend_from_slice(extra);
        all(c, &args)
    };
    // A model call estimated at 1,200 tokens.
    let (combined, per_key) = call(&mut c, "1200", "call-1", &[]);
    assert_eq!(per_key[0][..3], [1, 600, 599]);
    assert_eq!(per_key[1][..3], [1, 90_000, 88_800]);
    assert_eq!(per_key[2][..3], [1, 2, 1]);
    // Binding: the concurrency limit admits 1 more call of this shape, fewer than the others.
    assert_eq!(combined[..3], [1, 2, 1]);
    // The estimate was 800 too high: give the tokens back, release the slot.
    let refund: Vec<i64> = q(&mut c, &["RL.REFUND", "{t}:tpm", "800"]);
    assert_eq!(refund[..2], [800, 89_600]);
    assert_eq!(release(&mut c, "{t}:cc", "call-1")[..2], [1, 2]);
    // Another call's answer was 3,000 tokens longer than its estimate: record it after the
    // fact on the tokens limit alone.
    call(&mut c, "1200", "call-2", &[]);
    let forced = rl(
        &mut c,
        &[
            "RL.WINDOW",
            "{t}:tpm",
            "90000",
            "60",
            "QUANTITY",
            "3000",
            "FORCE",
        ],
    );
    assert_eq!(forced[..3], [1, 90_000, 85_400]);
    release(&mut c, "{t}:cc", "call-2");
    // Tokens nearly spent: a 1,200-token call is bound by tokens, not requests.
    rl(
        &mut c,
        &[
            "RL.WINDOW",
            "{t}:tpm",
            "90000",
            "60",
            "QUANTITY",
            "85000",
            "FORCE",
        ],
    );
    let (combined, per_key) = call(&mut c, "1200", "call-3", &[]);
    assert_eq!(combined[..3], [0, 90_000, 400]);
    assert!(combined[3] > 0, "{combined:?}");
    assert_eq!(
        per_key[0][2], 597,
        "denied: nothing consumed from the requests limit"
    );
    assert_eq!(per_key[2][2], 1, "what the free slots would answer");
    assert_eq!(release(&mut c, "{t}:cc", "call-3")[0], 0);
}

#[test]
fn a_request_that_finds_no_free_slot_consumes_nothing_anywhere_and_the_reverse() {
    let s = Server::start();
    let mut c = s.conn();
    let spec = |token: &str| {
        vec![
            "2".to_owned(),
            "{u}:rate".to_owned(),
            "{u}:slots".to_owned(),
            "GCRA".to_owned(),
            "2".to_owned(),
            "1".to_owned(),
            "60".to_owned(),
            "LEASE".to_owned(),
            "1".to_owned(),
            "60".to_owned(),
            token.to_owned(),
        ]
    };
    let run = |c: &mut redis::Connection, token: &str| {
        let args = spec(token);
        all(c, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    assert_eq!(run(&mut c, "a").0[0], 1);
    // No free slot: the rate limit is not charged.
    let (combined, per_key) = run(&mut c, "b");
    assert_eq!(combined[0], 0);
    assert_eq!(
        per_key[0][..3],
        [1, 2, 0],
        "what the rate limit alone would answer"
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.GCRA", "{u}:rate", "2", "1", "60", "QUANTITY", "0"]
        )[2],
        1,
        "rate untouched"
    );
    release(&mut c, "{u}:slots", "a");
    assert_eq!(run(&mut c, "b").0[0], 1);
    release(&mut c, "{u}:slots", "b");
    // The rate limit spent: no slot is taken.
    let (combined, per_key) = run(&mut c, "c");
    assert_eq!(combined[0], 0);
    assert_eq!(
        per_key[1][..3],
        [1, 1, 0],
        "what the free slot would answer"
    );
    assert_eq!(
        q::<i64>(&mut c, &["EXISTS", "{u}:slots"]),
        0,
        "no slot taken"
    );
}

#[test]
fn a_limit_at_cost_zero_is_only_reported() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.WINDOW", "{z}:spent", "1", "60"]);
    let (combined, per_key) = all(
        &mut c,
        &[
            "2",
            "{z}:rpm",
            "{z}:spent",
            "WINDOW",
            "10",
            "60",
            "WINDOW",
            "1",
            "60",
            "COST",
            "0",
        ],
    );
    assert_eq!(
        combined[..3],
        [1, 10, 9],
        "the reported limit neither denies nor binds"
    );
    assert_eq!(per_key[1][..3], [1, 1, 0]);
    assert_eq!(
        rl(
            &mut c,
            &["RL.WINDOW", "{z}:spent", "1", "60", "QUANTITY", "0"]
        )[2],
        0
    );
}

#[test]
fn leases_and_forced_usage_replicate_byte_for_byte() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    let mut r = replica.conn();
    wait_until("the replication link", Duration::from_secs(20), || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut m = master.conn();
    rl(
        &mut m,
        &["RL.LEASE", "r:lease", "5", "60", "a", "QUANTITY", "2"],
    );
    rl(&mut m, &["RL.LEASE", "r:lease", "5", "60", "b"]);
    rl(&mut m, &["RL.LEASE", "r:lease", "5", "60", "a"]);
    release(&mut m, "r:lease", "b");
    rl(&mut m, &["RL.LEASE", "r:gone", "5", "60", "x"]);
    release(&mut m, "r:gone", "x");
    rl(
        &mut m,
        &[
            "RL.GCRA", "r:force", "3", "1", "60", "QUANTITY", "9", "FORCE",
        ],
    );
    rl(
        &mut m,
        &[
            "RL.WINDOW",
            "r:fixed",
            "3",
            "60",
            "FIXED",
            "QUANTITY",
            "9",
            "FORCE",
        ],
    );
    all(
        &mut m,
        &[
            "2", "{r}a", "{r}b", "GCRA", "3", "1", "60", "COST", "2", "LEASE", "3", "60", "t",
        ],
    );
    assert_eq!(q::<i64>(&mut m, &["WAIT", "1", "30000"]), 1);
    for key in ["r:lease", "r:force", "r:fixed", "{r}a", "{r}b"] {
        assert_eq!(snapshot(&mut r, key), snapshot(&mut m, key), "{key}");
    }
    assert_eq!(q::<i64>(&mut r, &["EXISTS", "r:gone"]), 0);
    // A promoted replica keeps the leases.
    q::<()>(&mut r, &["REPLICAOF", "NO", "ONE"]);
    assert_eq!(
        rl(
            &mut r,
            &["RL.LEASE", "r:lease", "5", "60", "c", "QUANTITY", "3"]
        )[0],
        1
    );
    // a holds 1 (its renewal resized it), c holds 3: d's 2 do not fit.
    assert_eq!(
        rl(
            &mut r,
            &["RL.LEASE", "r:lease", "5", "60", "d", "QUANTITY", "2"]
        )[0],
        0
    );
}

#[test]
fn info_counts_leases_and_releases() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.LEASE", "i", "1", "60", "a"]);
    rl(&mut c, &["RL.LEASE", "i", "1", "60", "b"]);
    release(&mut c, "i", "a");
    assert_eq!(
        info_field(&mut c, "rl", "rl_lease").as_deref(),
        Some("calls=2,allowed=1,denied=1,errors=0")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_release").as_deref(),
        Some("calls=1,allowed=1,denied=0,errors=0")
    );
    rl(&mut c, &["RL.LEASE", "j", "1", "60", "a"]);
    assert_eq!(
        info_field(&mut c, "rl", "rl_lease_keys").as_deref(),
        Some("1")
    );
}

/// docs/reference.md#r-lease-9: a live lease renewed with RENEW moves its expiry and may
/// change its size, exactly as a plain renewal; a denied renewal and RENEW with PEEK leave it
/// as it was; once it has expired, RENEW is LEASELOST even with free slots.
#[test]
fn renew_renews_a_live_lease_like_a_plain_renewal() {
    let Some((clock, _s, mut c, start)) = frozen_server() else {
        return;
    };
    let at = |s: u64| clock.freeze_at(start + s * SECOND_NS);
    let start_ms = i64::try_from(start / MS_NS).unwrap();
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "r", "3", "10", "A"]),
        [1, 3, 2, -1, 10_000]
    );
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "r", "3", "60", "D"]),
        [1, 3, 1, -1, 60_000]
    );
    // 4 s later: renewed for 10 s more, and resized to 2 slots (D's 1 plus 2 fit in 3).
    at(4);
    assert_eq!(
        rl(
            &mut c,
            &["RL.LEASE", "r", "3", "10", "A", "QUANTITY", "2", "RENEW"]
        ),
        [1, 3, 0, -1, 56_000]
    );
    assert_eq!(q::<i64>(&mut c, &["PEXPIRETIME", "r"]), start_ms + 60_000);
    // 11 s after the first acquire A would have lapsed; renewed at 4 s it lives until 14 s.
    at(11);
    let before = untouched_state(&mut c, b"r");
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "r", "3", "10", "A", "RENEW", "PEEK"]),
        [1, 3, 1, -1, 49_000]
    );
    assert_eq!(untouched_state(&mut c, b"r"), before);
    // Resizing past the limit is denied until D expires, and A stays as it was.
    assert_eq!(
        rl(
            &mut c,
            &["RL.LEASE", "r", "3", "10", "A", "renew", "QUANTITY", "3"]
        ),
        [0, 3, 0, 49_000, 49_000]
    );
    assert_eq!(untouched_state(&mut c, b"r"), before);
    // Resizing down to 1 slot: renewed until 21 s.
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "r", "3", "10", "A", "RENEW"]),
        [1, 3, 1, -1, 49_000]
    );
    // At 21 s A's lease has ended (a lease ending at now is gone): RENEW is LEASELOST, though
    // two slots are free and a plain acquire would be granted.
    at(21);
    let before = untouched_state(&mut c, b"r");
    assert_eq!(
        err_s(&mut c, &["RL.LEASE", "r", "3", "10", "A", "RENEW"]),
        "LEASELOST lease 'A' on key 'r' is not held"
    );
    assert_eq!(untouched_state(&mut c, b"r"), before);
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "r", "3", "10", "A", "PEEK"]),
        [1, 3, 1, -1, 39_000]
    );
    // D, still live, renews with RENEW as ever.
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "r", "3", "60", "D", "RENEW"]),
        [1, 3, 2, -1, 60_000]
    );
}

/// docs/reference.md#r-lease-9: RENEW of a lease that was released or never taken, on a key
/// that exists or not, with PEEK or without, answers LEASELOST (key and token shown as other
/// errors show them) and writes nothing: no key created, no change of value or TTL, no
/// aborted WATCH, no keyspace event, nothing replicated.
#[test]
fn renew_of_a_lease_not_held_is_leaselost_and_writes_nothing() {
    let master = Server::builder()
        .arg("notify-keyspace-events", "KA")
        .arg("repl-ping-replica-period", "3600")
        .start();
    let replica = Server::builder().replica_of(&master).start();
    let mut r = replica.conn();
    wait_until("the replication link", Duration::from_secs(20), || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut c = master.conn();
    let long_key = "k".repeat(100);
    let bin_key: &[u8] = b"bin\xff\xfe\xc3\xa9:key";
    let bin_token: &[u8] = b"tok\xff\xc3\xa9";
    for key in [&b"p"[..], long_key.as_bytes(), bin_key] {
        for token in [&b"A"[..], b"B"] {
            let _: Vec<i64> = redis::cmd("RL.LEASE")
                .arg(key)
                .arg(2)
                .arg(60)
                .arg(token)
                .query(&mut c)
                .unwrap();
        }
        let _: Vec<i64> = redis::cmd("RL.RELEASE")
            .arg(key)
            .arg("B")
            .query(&mut c)
            .unwrap();
    }
    assert_eq!(q::<i64>(&mut c, &["WAIT", "1", "30000"]), 1);
    let keys: [&[u8]; 4] = [b"p", long_key.as_bytes(), bin_key, b"missing"];
    let before: Vec<_> = keys.iter().map(|k| untouched_state(&mut c, k)).collect();
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    let mut sub_con = master.conn();
    let mut pubsub = sub_con.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut watcher = master.conn();
    let mut watch = redis::cmd("WATCH");
    for k in keys {
        watch.arg(k);
    }
    let _: () = watch.query(&mut watcher).unwrap();
    let shown_long = "k".repeat(64);
    let cases: Vec<(Vec<&[u8]>, String)> = vec![
        // Released.
        (
            vec![b"RL.LEASE", b"p", b"2", b"60", b"B", b"RENEW"],
            "LEASELOST lease 'B' on key 'p' is not held".into(),
        ),
        (
            vec![b"RL.LEASE", b"p", b"2", b"60", b"B", b"PEEK", b"RENEW"],
            "LEASELOST lease 'B' on key 'p' is not held".into(),
        ),
        // Never taken, a slot free; a renewal that would also be too big.
        (
            vec![b"RL.LEASE", b"p", b"2", b"60", b"C", b"RENEW"],
            "LEASELOST lease 'C' on key 'p' is not held".into(),
        ),
        (
            vec![
                b"RL.LEASE",
                b"p",
                b"2",
                b"60",
                b"C",
                b"RENEW",
                b"QUANTITY",
                b"5",
            ],
            "LEASELOST lease 'C' on key 'p' is not held".into(),
        ),
        // No key at all.
        (
            vec![b"RL.LEASE", b"missing", b"2", b"60", b"A", b"RENEW"],
            "LEASELOST lease 'A' on key 'missing' is not held".into(),
        ),
        (
            vec![
                b"RL.LEASE",
                b"missing",
                b"2",
                b"60",
                b"A",
                b"RENEW",
                b"PEEK",
            ],
            "LEASELOST lease 'A' on key 'missing' is not held".into(),
        ),
        // Keys and tokens as every error shows client bytes: lossy UTF-8, 64 characters.
        (
            vec![
                b"RL.LEASE",
                long_key.as_bytes(),
                b"2",
                b"60",
                b"B",
                b"RENEW",
            ],
            format!("LEASELOST lease 'B' on key '{shown_long}' is not held"),
        ),
        (
            vec![b"RL.LEASE", bin_key, b"2", b"60", bin_token, b"RENEW"],
            "LEASELOST lease 'tok\u{fffd}é' on key 'bin\u{fffd}\u{fffd}é:key' is not held".into(),
        ),
    ];
    for (args, expected) in &cases {
        assert_eq!(&err(&mut c, args), expected);
    }
    // The key is shown exactly as the wrong-algorithm error shows it.
    let wrong = err(&mut c, &[b"RL.GCRA", bin_key, b"1", b"1", b"1"]);
    assert!(
        wrong.starts_with("ERR key 'bin\u{fffd}\u{fffd}é:key' holds a LEASE limit"),
        "{wrong}"
    );
    let after: Vec<_> = keys.iter().map(|k| untouched_state(&mut c, k)).collect();
    assert_eq!(after, before);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "missing"]), 0);
    // Nothing was propagated (the replica link sends no PING for an hour).
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset
    );
    // No WATCH was aborted.
    q::<()>(&mut watcher, &["MULTI"]);
    q::<()>(&mut watcher, &["PING"]);
    let exec: Option<Vec<String>> = q(&mut watcher, &["EXEC"]);
    assert_eq!(exec, Some(vec!["PONG".to_owned()]));
    // No keyspace event: the first one is the marker's.
    q::<()>(&mut c, &["SET", "marker", "1"]);
    let msg = pubsub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), "__keyspace@0__:marker");
    // Each is counted as an error.
    let counts = info_field(&mut c, "rl", "rl_lease").unwrap();
    assert!(
        counts.ends_with(&format!("errors={}", cases.len())),
        "{counts}"
    );
}

/// Issue 23's lapse at command level (docs/reference.md#r-lease-9): A holds the only slot
/// for 0.3 s and is stalled past it; B acquires and releases; A's late renewal arrives.
/// Without RENEW it is granted as a fresh acquire and A never learns it ran unguarded; with
/// RENEW it is LEASELOST, whether another holder has the slot at that moment or not.
#[test]
fn regression_a_lapsed_holder_renewing_learns_it_lost_its_lease() {
    let Some((clock, _s, mut c, start)) = frozen_server() else {
        return;
    };
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "job", "1", "0.3", "A"]),
        [1, 1, 0, -1, 300]
    );
    // A's event loop is blocked for 0.9 s; meanwhile B takes the slot.
    clock.freeze_at(start + 900 * MS_NS);
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "job", "1", "0.3", "B"]),
        [1, 1, 0, -1, 300]
    );
    assert_eq!(
        err_s(&mut c, &["RL.LEASE", "job", "1", "0.3", "A", "RENEW"]),
        "LEASELOST lease 'A' on key 'job' is not held"
    );
    assert_eq!(release(&mut c, "job", "B"), [1, 1, 0]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "job"]), 0);
    // B is done and the slot is free: still LEASELOST, and nothing is created.
    assert_eq!(
        err_s(&mut c, &["RL.LEASE", "job", "1", "0.3", "A", "RENEW"]),
        "LEASELOST lease 'A' on key 'job' is not held"
    );
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "job"]), 0);
    // What the old renewal did: a plain call takes the slot anew.
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "job", "1", "0.3", "A"]),
        [1, 1, 0, -1, 300]
    );
}

/// docs/reference.md#r-lease-10: RENEW with QUANTITY 0 is an error naming both; RENEW twice
/// is a syntax error; RL.ALL refuses RENEW (after a LEASE spec, as a spec, or as an option);
/// nothing is created.
#[test]
fn renew_errors_name_the_arguments_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let quantity_zero = "ERR RENEW cannot be used with QUANTITY 0: a renewal holds at least one \
                         slot, QUANTITY 0 only reports";
    let in_all = "ERR RENEW cannot be used in RL.ALL: renew a lease on its own with RL.LEASE key \
                  limit lease token RENEW";
    let cases: &[(&[&str], &str)] = &[
        (
            &["RL.LEASE", "x", "2", "30", "a", "RENEW", "QUANTITY", "0"],
            quantity_zero,
        ),
        (
            &[
                "RL.LEASE", "x", "2", "30", "a", "QUANTITY", "000", "renew", "PEEK",
            ],
            quantity_zero,
        ),
        (
            &["RL.LEASE", "x", "2", "30", "a", "RENEW", "RENEW"],
            "ERR syntax error: RENEW given more than once",
        ),
        (
            &["RL.ALL", "1", "x", "LEASE", "2", "30", "a", "RENEW"],
            in_all,
        ),
        (
            &["RL.ALL", "1", "x", "LEASE", "2", "30", "a", "PEEK", "RENEW"],
            in_all,
        ),
        (
            &[
                "RL.ALL", "2", "{x}1", "{x}2", "LEASE", "2", "30", "a", "RENEW", "GCRA", "1", "1",
                "1",
            ],
            in_all,
        ),
        (
            &[
                "RL.ALL", "2", "{x}1", "{x}2", "LEASE", "2", "30", "a", "COST", "1", "RENEW",
                "GCRA", "1", "1", "1",
            ],
            in_all,
        ),
        (
            &["RL.ALL", "1", "x", "RENEW", "LEASE", "2", "30", "a"],
            in_all,
        ),
        (
            &["RL.GCRA", "x", "1", "1", "1", "RENEW"],
            "ERR syntax error: unknown argument 'RENEW'",
        ),
        (
            &["RL.WINDOW", "x", "1", "1", "RENEW"],
            "ERR syntax error: unknown argument 'RENEW'",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(err_s(&mut c, args), *expected, "{args:?}");
    }
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "x", "{x}1", "{x}2"]), 0);
    // A token named RENEW is a token like any other.
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "x", "2", "30", "RENEW"])[..3],
        [1, 2, 1]
    );
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "x", "2", "30", "RENEW", "RENEW"])[..3],
        [1, 2, 1]
    );
}
