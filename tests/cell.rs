//! CL.THROTTLE: a drop-in for redis-cell, pinned to the replies in redis-cell's public README.

mod common;

use common::{err_s, q, rl, Server};

#[test]
fn readme_examples_of_redis_cell() {
    let s = Server::start();
    let mut c = s.conn();
    // "CL.THROTTLE user123 15 30 60" → 0 allowed, 16 limit, 15 remaining, -1 retry, 2 s reset.
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "user123", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "user123b", "15", "30", "60", "1"]),
        [0, 16, 15, -1, 2]
    );
    // "CL.THROTTLE test 5 5 60 1" → [0, 6, 5, -1, 12].
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "test", "5", "5", "60", "1"]),
        [0, 6, 5, -1, 12]
    );
}

#[test]
fn capacity_is_max_burst_plus_one() {
    let s = Server::start();
    let mut c = s.conn();
    for i in 0..16 {
        let r = rl(&mut c, &["CL.THROTTLE", "u", "15", "30", "60"]);
        assert_eq!(&r[..4], &[0, 16, 15 - i, -1], "request {}", i + 1);
    }
    // The 17th is limited: retry in one emission interval (2 s), full again in 32 s.
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "u", "15", "30", "60"]),
        [1, 16, 0, 2, 32]
    );
    // quantity above the capacity can never pass; quantity 0 only reports.
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "u", "15", "30", "60", "17"])[..4],
        [1, 16, 0, -1]
    );
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "v", "15", "30", "60", "0"]),
        [0, 16, 16, -1, 0]
    );
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "v"]), 0);
    // max_burst 0: capacity 1.
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "w", "0", "1", "10"]),
        [0, 1, 0, -1, 10]
    );
    assert_eq!(
        rl(&mut c, &["CL.THROTTLE", "w", "0", "1", "10"]),
        [1, 1, 0, 10, 10]
    );
}

#[test]
fn shares_keys_ttl_and_type_with_rl_gcra() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["CL.THROTTLE", "shared", "4", "1", "10", "3"]);
    // Same state read by RL.GCRA with burst = max_burst + 1.
    let r = rl(
        &mut c,
        &["RL.GCRA", "shared", "5", "1", "10", "QUANTITY", "0"],
    );
    assert_eq!(&r[..3], &[1, 5, 2]);
    let pttl: i64 = q(&mut c, &["PTTL", "shared"]);
    assert!(
        pttl > 30_000 - common::WALL_SLACK_MS && pttl <= 30_001,
        "{pttl}"
    );
    assert_eq!(q::<String>(&mut c, &["TYPE", "shared"]), "ratelimit");
    rl(&mut c, &["RL.WINDOW", "win", "5", "10"]);
    assert!(err_s(&mut c, &["CL.THROTTLE", "win", "4", "1", "10"])
        .starts_with("ERR key 'win' holds a SLIDING window, not a GCRA limiter"));
}

#[test]
fn bad_arguments_are_errors() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: &[(&[&str], &str)] = &[
        (
            &["k", "-1", "1", "1"],
            "ERR max_burst must be a non-negative integer",
        ),
        (
            &["k", "1", "0", "1"],
            "ERR count_per_period must be a positive integer",
        ),
        (
            &["k", "1", "1", "0"],
            "ERR period must be a positive integer",
        ),
        (
            &["k", "1", "1", "1.5"],
            "ERR period must be a positive integer",
        ),
        (
            &["k", "1", "1", "315360001"],
            "ERR syntax error: period must be whole seconds",
        ),
        (
            &["k", "1", "1", "1", "-2"],
            "ERR quantity must be a non-negative integer",
        ),
        (
            &["k", "1", "1", "1", "1", "extra"],
            "ERR wrong number of arguments for 'cl.throttle' command",
        ),
        (
            &["k", "18446744073709551615", "1", "1"],
            "ERR burst is too large",
        ),
    ];
    for (args, prefix) in cases {
        let mut full = vec!["CL.THROTTLE"];
        full.extend_from_slice(args);
        let e = err_s(&mut c, &full);
        assert!(e.starts_with(prefix), "{full:?}: {e}");
    }
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
}
