//! RL.WINDOW over the wire: FIXED, SLIDING and LOG against a real redis-server.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{assert_ms, err_s, q, rl, snapshot, Server};

/// A ten-year window: its epoch-aligned boundaries (1980, 1990, …, Dec 2029) are far from
/// any test run, so counts never roll over mid-test.
const DECADE: &str = "315360000";
const DECADE_MS: i64 = 315_360_000_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Milliseconds from now to the end of the current epoch-aligned window of `window_ms`.
fn to_window_end_ms(window_ms: i64) -> i64 {
    window_ms - now_ms() % window_ms
}

#[test]
fn fixed_counts_in_epoch_aligned_windows() {
    let s = Server::start();
    let mut c = s.conn();
    let end = to_window_end_ms(DECADE_MS);
    let r = rl(&mut c, &["RL.WINDOW", "f", "3", DECADE, "FIXED"]);
    assert_eq!(&r[..4], &[1, 3, 2, -1]);
    assert_ms(r[4], end, 100);
    let r = rl(
        &mut c,
        &["RL.WINDOW", "f", "3", DECADE, "FIXED", "QUANTITY", "2"],
    );
    assert_eq!(&r[..4], &[1, 3, 0, -1]);
    let r = rl(&mut c, &["RL.WINDOW", "f", "3", DECADE, "FIXED"]);
    assert_eq!(&r[..3], &[0, 3, 0]);
    assert_ms(r[3], end, 100);
    assert_ms(r[4], end, 100);
    // The key expires at the window's end.
    let pexpiretime: i64 = q(&mut c, &["PEXPIRETIME", "f"]);
    assert!(
        (pexpiretime - (now_ms() + end)).abs() < 200,
        "{pexpiretime}"
    );
    assert_eq!(
        pexpiretime % DECADE_MS,
        0,
        "expiry on the epoch-aligned window end"
    );
}

#[test]
fn sliding_is_the_default_and_counts() {
    let s = Server::start();
    let mut c = s.conn();
    for remaining in (0..5).rev() {
        let r = rl(&mut c, &["RL.WINDOW", "s", "5", DECADE]);
        assert_eq!(&r[..4], &[1, 5, remaining, -1]);
        // curr > 0: idle at the end of the next window.
        assert_ms(r[4], to_window_end_ms(DECADE_MS) + DECADE_MS, 100);
    }
    let r = rl(&mut c, &["RL.WINDOW", "s", "5", DECADE]);
    assert_eq!(&r[..3], &[0, 5, 0]);
    // The same key is SLIDING: naming it explicitly works, FIXED does not.
    assert_eq!(
        rl(&mut c, &["RL.WINDOW", "s", "5", DECADE, "sliding", "PEEK"])[0],
        0
    );
    let e = err_s(&mut c, &["RL.WINDOW", "s", "5", DECADE, "FIXED"]);
    assert!(e.contains("holds a SLIDING window"), "{e}");
}

#[test]
fn log_is_exact_and_reports_when_the_oldest_leaves() {
    let s = Server::start();
    let mut c = s.conn();
    let r = rl(&mut c, &["RL.WINDOW", "l", "2", "100", "LOG"]);
    assert_eq!(r, [1, 2, 1, -1, 100_000]);
    let r = rl(&mut c, &["RL.WINDOW", "l", "2", "100", "LOG"]);
    assert_eq!(&r[..4], &[1, 2, 0, -1]);
    assert_ms(r[4], 100_000, 50);
    let r = rl(&mut c, &["RL.WINDOW", "l", "2", "100", "LOG"]);
    assert_eq!(&r[..3], &[0, 2, 0]);
    assert_ms(r[3], 100_000, 50);
    let pttl: i64 = q(&mut c, &["PTTL", "l"]);
    assert_ms(pttl, 100_000, 60);
}

#[test]
fn ttl_matches_reset_after_for_every_algorithm() {
    let s = Server::start();
    let mut c = s.conn();
    for algo in ["FIXED", "SLIDING", "LOG"] {
        let key = format!("ttl:{algo}");
        for _ in 0..3 {
            let r = rl(&mut c, &["RL.WINDOW", &key, "10", "30", algo]);
            assert_eq!(r[0], 1);
            let pttl: i64 = q(&mut c, &["PTTL", &key]);
            assert_ms(pttl, r[4], 100);
        }
    }
}

#[test]
fn quantity_zero_peek_and_oversize_write_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    for algo in ["FIXED", "SLIDING", "LOG"] {
        let key = format!("q:{algo}");
        let r = rl(
            &mut c,
            &["RL.WINDOW", &key, "4", "100", algo, "QUANTITY", "0"],
        );
        assert_eq!(r, [1, 4, 4, -1, 0], "{algo}");
        let r = rl(
            &mut c,
            &["RL.WINDOW", &key, "4", "100", algo, "PEEK", "QUANTITY", "4"],
        );
        assert_eq!(&r[..4], &[1, 4, 0, -1], "{algo}");
        assert_eq!(q::<i64>(&mut c, &["EXISTS", &key]), 0, "{algo}");
        rl(
            &mut c,
            &["RL.WINDOW", &key, "4", "100", algo, "QUANTITY", "3"],
        );
        let before = snapshot(&mut c, &key);
        let r = rl(
            &mut c,
            &["RL.WINDOW", &key, "4", "100", algo, "QUANTITY", "5"],
        );
        assert_eq!(&r[..4], &[0, 4, 1, -1], "{algo}: oversize");
        let r = rl(
            &mut c,
            &["RL.WINDOW", &key, "4", "100", algo, "QUANTITY", "2"],
        );
        assert_eq!(&r[..3], &[0, 4, 1], "{algo}: denied");
        assert!(r[3] >= 1);
        let r = rl(
            &mut c,
            &["RL.WINDOW", &key, "4", "100", algo, "QUANTITY", "1", "PEEK"],
        );
        assert_eq!(&r[..4], &[1, 4, 0, -1], "{algo}: peek");
        assert_eq!(snapshot(&mut c, &key), before, "{algo}: state changed");
    }
}

#[test]
fn algorithms_never_mix_on_one_key() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.WINDOW", "fx", "5", "10", "FIXED"]);
    rl(&mut c, &["RL.WINDOW", "lg", "5", "10", "LOG"]);
    rl(&mut c, &["RL.GCRA", "gc", "5", "1", "10"]);
    let cases: &[(&[&str], &str)] = &[
        (
            &["RL.WINDOW", "fx", "5", "10", "LOG"],
            "ERR key 'fx' holds a FIXED window, not a LOG window",
        ),
        (
            &["RL.WINDOW", "fx", "5", "10"],
            "ERR key 'fx' holds a FIXED window, not a SLIDING window",
        ),
        (
            &["RL.WINDOW", "lg", "5", "10", "FIXED"],
            "ERR key 'lg' holds a LOG window, not a FIXED window",
        ),
        (
            &["RL.WINDOW", "gc", "5", "10", "LOG"],
            "ERR key 'gc' holds a GCRA limiter, not a LOG window",
        ),
        (
            &["RL.GCRA", "fx", "5", "1", "10"],
            "ERR key 'fx' holds a FIXED window, not a GCRA limiter",
        ),
        (
            &["RL.WINDOW", "lg", "5", "10", "FIXED", "PEEK"],
            "ERR key 'lg' holds a LOG window",
        ),
    ];
    for (args, prefix) in cases {
        let e = err_s(&mut c, args);
        assert!(e.starts_with(prefix), "{args:?}: {e}");
    }
    q::<()>(&mut c, &["SET", "str", "x"]);
    assert!(err_s(&mut c, &["RL.WINDOW", "str", "5", "10", "LOG"]).starts_with("WRONGTYPE"));
}

#[test]
fn parameter_changes_keep_counts() {
    let s = Server::start();
    let mut c = s.conn();
    // LOG: 3 requests recorded; a larger limit admits more at once, a smaller denies.
    rl(
        &mut c,
        &["RL.WINDOW", "pl", "3", "100", "LOG", "QUANTITY", "3"],
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.WINDOW", "pl", "5", "100", "LOG", "QUANTITY", "0"]
        )[2],
        2
    );
    assert_eq!(rl(&mut c, &["RL.WINDOW", "pl", "2", "100", "LOG"])[0], 0);
    // A shorter window still sees requests made just now.
    assert_eq!(rl(&mut c, &["RL.WINDOW", "pl", "3", "10", "LOG"])[0], 0);
    // FIXED: the count made in the current window carries into a new window length.
    rl(
        &mut c,
        &["RL.WINDOW", "pf", "10", DECADE, "FIXED", "QUANTITY", "8"],
    );
    let r = rl(
        &mut c,
        &["RL.WINDOW", "pf", "10", "3600", "FIXED", "QUANTITY", "0"],
    );
    assert_eq!(r[2], 2);
    // SLIDING too.
    rl(&mut c, &["RL.WINDOW", "ps", "10", DECADE, "QUANTITY", "8"]);
    let r = rl(&mut c, &["RL.WINDOW", "ps", "10", "3600", "QUANTITY", "0"]);
    assert_eq!(r[2], 2);
}

#[test]
fn log_memory_is_at_most_8_bytes_per_request() {
    let s = Server::start();
    let mut c = s.conn();
    let empty: i64 = {
        rl(&mut c, &["RL.WINDOW", "m1", "10000", "3600", "LOG"]);
        q(&mut c, &["MEMORY", "USAGE", "m1"])
    };
    let mut pipe = redis::pipe();
    for _ in 0..9_999 {
        pipe.cmd("RL.WINDOW")
            .arg("m1")
            .arg(10_000)
            .arg(3600)
            .arg("LOG")
            .ignore();
    }
    pipe.query::<()>(&mut c).unwrap();
    let r = rl(
        &mut c,
        &["RL.WINDOW", "m1", "10000", "3600", "LOG", "QUANTITY", "0"],
    );
    assert_eq!(r[2], 0, "10 000 requests recorded");
    let full: i64 = q(&mut c, &["MEMORY", "USAGE", "m1"]);
    let per_request = (full - empty) as f64 / 9_999.0;
    assert!(
        per_request <= 8.0,
        "{per_request:.2} bytes per request (total {full}, empty {empty})"
    );
    assert_eq!(
        rl(&mut c, &["RL.WINDOW", "m1", "10000", "3600", "LOG"])[0],
        0
    );
}

#[test]
fn log_limit_is_capped_by_config() {
    let s = Server::start();
    let mut c = s.conn();
    let e = err_s(&mut c, &["RL.WINDOW", "big", "100001", "10", "LOG"]);
    assert!(
        e.starts_with("ERR limit 100001 is above rl.log-max-limit (100000)")
            && e.contains("SLIDING"),
        "{e}"
    );
    assert_eq!(
        rl(&mut c, &["RL.WINDOW", "big", "100001", "10", "SLIDING"])[0],
        1
    );
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "rl.log-max-limit"]),
        vec!["rl.log-max-limit", "100000"]
    );
    q::<()>(&mut c, &["CONFIG", "SET", "rl.log-max-limit", "200000"]);
    assert_eq!(
        rl(&mut c, &["RL.WINDOW", "big2", "100001", "10", "LOG"])[0],
        1
    );
    for bad in ["0", "-1", "abc", "10000001"] {
        let e = err_s(&mut c, &["CONFIG", "SET", "rl.log-max-limit", bad]);
        assert!(e.starts_with("ERR"), "{bad}: {e}");
    }
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "rl.log-max-limit"])[1],
        "200000"
    );
}

#[test]
fn log_max_limit_from_module_arguments() {
    let s = Server::builder().no_module().start();
    let mut c = s.conn();
    let path = common::module_path();
    let path = path.to_str().unwrap();
    let e = err_s(&mut c, &["MODULE", "LOAD", path, "log-max-limit", "0"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert!(
        s.log()
            .contains("module argument log-max-limit must be an integer"),
        "{}",
        s.log()
    );
    let e = err_s(&mut c, &["MODULE", "LOAD", path, "bogus", "1"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert!(s.log().contains("unknown module argument 'bogus'"));
    q::<()>(&mut c, &["MODULE", "LOAD", path, "log-max-limit", "50"]);
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "rl.log-max-limit"])[1],
        "50"
    );
    assert!(err_s(&mut c, &["RL.WINDOW", "k", "51", "1", "LOG"]).contains("rl.log-max-limit (50)"));
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");

    let s2 = Server::builder().no_module().start();
    let mut c2 = s2.conn();
    q::<()>(
        &mut c2,
        &["MODULE", "LOADEX", path, "CONFIG", "rl.log-max-limit", "77"],
    );
    assert_eq!(
        q::<Vec<String>>(&mut c2, &["CONFIG", "GET", "rl.log-max-limit"])[1],
        "77"
    );

    let s3 = Server::builder()
        .words(&["--loadmodule", path, "log-max-limit", "12"])
        .no_module()
        .start();
    let mut c3 = s3.conn();
    assert_eq!(
        q::<Vec<String>>(&mut c3, &["CONFIG", "GET", "rl.log-max-limit"])[1],
        "12"
    );
}

#[test]
fn bad_window_arguments_name_the_argument() {
    let s = Server::start();
    let mut c = s.conn();
    let window_err = "ERR window must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 more digits), > 0 and <= 315360000";
    let table: &[(&[&str], &str)] = &[
        (&["k", "0", "1"], "ERR limit must be a positive integer"),
        (&["k", "-3", "1"], "ERR limit must be a positive integer"),
        (&["k", "1.5", "1"], "ERR limit must be a positive integer"),
        (&["k", "3", "0"], window_err),
        (&["k", "3", "1e3"], window_err),
        (&["k", "3", ".5"], window_err),
        (&["k", "3", "315360000.1"], window_err),
        (
            &["k", "3", "1", "FIXED", "LOG"],
            "ERR syntax error: the algorithm (FIXED | SLIDING | LOG) given more than once",
        ),
        (
            &["k", "3", "1", "LOG", "log"],
            "ERR syntax error: the algorithm (FIXED | SLIDING | LOG) given more than once",
        ),
        (
            &["k", "3", "1", "QUANTITY", "-1"],
            "ERR QUANTITY must be a non-negative integer",
        ),
        (
            &["k", "3", "1", "QUANTITY"],
            "ERR syntax error: QUANTITY needs a value",
        ),
        (
            &["k", "3", "1", "PEEK", "PEEK"],
            "ERR syntax error: PEEK given more than once",
        ),
        (
            &["k", "3", "1", "SLIDINGX"],
            "ERR syntax error: unknown argument 'SLIDINGX'",
        ),
        (
            &["k", "3", "1", "MAXWAIT", "5"],
            "ERR syntax error: unknown argument 'MAXWAIT'",
        ),
    ];
    for (args, expected) in table {
        let mut full = vec!["RL.WINDOW"];
        full.extend_from_slice(args);
        assert_eq!(&err_s(&mut c, &full), expected, "{full:?}");
    }
    assert!(err_s(&mut c, &["RL.WINDOW", "k", "3"]).starts_with("ERR wrong number of arguments"));
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
    let keys: Vec<String> = q(
        &mut c,
        &[
            "COMMAND",
            "GETKEYS",
            "RL.WINDOW",
            "user:1",
            "5",
            "60",
            "LOG",
        ],
    );
    assert_eq!(keys, vec!["user:1"]);
}

#[test]
fn keyspace_event_is_rl_window() {
    let s = Server::start();
    let mut c = s.conn();
    q::<()>(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let mut sub_con = s.conn();
    let mut pubsub = sub_con.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    rl(&mut c, &["RL.WINDOW", "ev", "1", "100", "LOG"]);
    rl(&mut c, &["RL.WINDOW", "ev", "1", "100", "LOG"]); // denied: no event
    rl(&mut c, &["RL.WINDOW", "ev2", "1", "100", "FIXED"]);
    let mut got = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        got.push((
            msg.get_channel_name().to_owned(),
            msg.get_payload::<String>().unwrap(),
        ));
        if got.len() == 2 {
            break;
        }
    }
    assert_eq!(
        got,
        vec![
            ("__keyspace@0__:ev".to_owned(), "rl.window".to_owned()),
            ("__keyspace@0__:ev2".to_owned(), "rl.window".to_owned()),
        ]
    );
}
