//! RL.WINDOW over the wire: FIXED, SLIDING and LOG against a real redis-server.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{assert_ms, err_s, now_ns, q, rl, snapshot, Clock, Server, WALL_SLACK_MS};

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
    assert_ms(r[4], end, WALL_SLACK_MS);
    let r = rl(
        &mut c,
        &["RL.WINDOW", "f", "3", DECADE, "FIXED", "QUANTITY", "2"],
    );
    assert_eq!(&r[..4], &[1, 3, 0, -1]);
    let r = rl(&mut c, &["RL.WINDOW", "f", "3", DECADE, "FIXED"]);
    assert_eq!(&r[..3], &[0, 3, 0]);
    assert_ms(r[3], end, WALL_SLACK_MS);
    assert_ms(r[4], end, WALL_SLACK_MS);
    // The key expires at the window's end.
    let pexpiretime: i64 = q(&mut c, &["PEXPIRETIME", "f"]);
    assert!(
        (pexpiretime - (now_ms() + end)).abs() < WALL_SLACK_MS,
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
        assert_ms(r[4], to_window_end_ms(DECADE_MS) + DECADE_MS, WALL_SLACK_MS);
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
    assert_ms(r[4], 100_000, WALL_SLACK_MS);
    let r = rl(&mut c, &["RL.WINDOW", "l", "2", "100", "LOG"]);
    assert_eq!(&r[..3], &[0, 2, 0]);
    assert_ms(r[3], 100_000, WALL_SLACK_MS);
    let pttl: i64 = q(&mut c, &["PTTL", "l"]);
    assert_ms(pttl, 100_000, WALL_SLACK_MS);
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
            assert_ms(pttl, r[4], WALL_SLACK_MS);
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
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
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

/// A brute-force LOG: every admitted request's instant (ns), oldest first; what RL.WINDOW
/// LOG must answer, computed by scanning them all.
#[derive(Default)]
struct LogModel {
    at: Vec<u64>,
}

impl LogModel {
    fn in_window(&self, now: u64, window: u64) -> Vec<u64> {
        let cutoff = now.checked_sub(window);
        let kept = self.at.iter().filter(|&&t| cutoff.is_none_or(|c| t > c));
        kept.copied().collect()
    }

    /// The five-integer reply to `RL.WINDOW key limit window LOG QUANTITY q` at `now`, and
    /// the key's new absolute expiry (ms) if the call writes.
    fn call(&mut self, now: u64, limit: u64, window: u64, q: u64) -> ([i64; 5], Option<i64>) {
        let ms = |ns: u64| ns.div_ceil(1_000_000) as i64;
        let inside = self.in_window(now, window);
        let n = inside.len() as u64;
        let reset = |newest: Option<&u64>| newest.map_or(0, |t| t + window - now);
        let remaining = |used: u64| limit.saturating_sub(used) as i64;
        if q == 0 {
            return (
                [1, limit as i64, remaining(n), -1, ms(reset(inside.last()))],
                None,
            );
        }
        if n + q <= limit {
            self.at
                .retain(|&t| now.checked_sub(window).is_none_or(|c| t > c));
            let newest = self.at.last().copied().unwrap_or(now).max(now);
            self.at.extend(std::iter::repeat_n(now, q as usize));
            let reply = [
                1,
                limit as i64,
                remaining(n + q),
                -1,
                ms(newest + window - now),
            ];
            return (reply, Some(ms(newest + window)));
        }
        // Wait for the (n + q − limit)-th oldest request in the window to leave it.
        let leaves = inside[(n + q - limit - 1) as usize] + window;
        let reply = [
            0,
            limit as i64,
            remaining(n),
            ms(leaves - now).max(1),
            ms(reset(inside.last())),
        ];
        (reply, None)
    }

    /// `RL.REFUND key q` at `now` on a key last written with `window` and `limit`.
    fn refund(&mut self, now: u64, limit: u64, window: u64, q: u64) -> [i64; 3] {
        let n = self.in_window(now, window).len() as u64;
        let given = q.min(n);
        if given == n {
            self.at.clear();
            return [given as i64, limit as i64, 0];
        }
        self.at
            .retain(|&t| now.checked_sub(window).is_none_or(|c| t > c));
        self.at.truncate(self.at.len() - given as usize);
        let newest = self.at.last().unwrap();
        let left = limit - self.at.len() as u64;
        [
            given as i64,
            left as i64,
            (newest + window - now).div_ceil(1_000_000) as i64,
        ]
    }
}

#[test]
fn logs_around_the_index_boundary_match_a_brute_force_model() {
    // The log indexes every 64th entry once it reaches 64 (the head standing in for entry
    // 0); an RDB reload renumbers the entries from its head. Logs of 63, 64, 65 and 128
    // requests at distinct instants, read through two alternating windows as time moves,
    // under a lowered limit (a denial waiting deep in the log), after the oldest entries
    // leave the window (the head off the marks), after a reload, refunded back below 64
    // and to empty: every reply and every expiry is the brute-force model's.
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return;
    }
    // Instants are whole microseconds: the module reads the clock at that resolution.
    let ms = 1_000_000u64;
    let (window, long) = ("1", 1000 * ms);
    let (short_s, short) = ("0.0305", 30_500_000u64);
    for n in [63u64, 64, 65, 128] {
        let key = format!("log:{n}");
        let base = (now_ns() / 1_000_000_000 + 10) * 1_000_000_000 + n * 10_000_000_000;
        let mut model = LogModel::default();
        let mut at = base;
        let step = |c: &mut redis::Connection,
                    model: &mut LogModel,
                    at: u64,
                    limit: u64,
                    win: (&str, u64),
                    qty: u64,
                    what: &str| {
            clock.freeze_at(at);
            let (limit_s, qty_s) = (limit.to_string(), qty.to_string());
            let got = rl(
                c,
                &[
                    "RL.WINDOW",
                    &key,
                    &limit_s,
                    win.0,
                    "LOG",
                    "QUANTITY",
                    &qty_s,
                ],
            );
            let (want, expiry) = model.call(at, limit, win.1, qty);
            assert_eq!(got, want, "{key}: {what} at +{} ms", (at - base) / ms);
            if let Some(expiry) = expiry {
                assert_eq!(q::<i64>(c, &["PEXPIRETIME", &key]), expiry, "{key}: {what}");
            }
        };
        for i in 0..n {
            at = base + i * ms;
            step(&mut c, &mut model, at, 200, (window, long), 1, "fill");
        }
        let full: i64 = q(&mut c, &["MEMORY", "USAGE", &key]);
        // A limit lowered far below what the log holds: the denial waits deep in the log.
        step(
            &mut c,
            &mut model,
            at,
            10,
            (window, long),
            1,
            "lowered limit",
        );
        // Two windows read alternately while time moves (the cursors in play).
        for j in 1..40 {
            at += ms / 2 + j * 1000;
            step(
                &mut c,
                &mut model,
                at,
                200,
                (short_s, short),
                0,
                "short window",
            );
            step(
                &mut c,
                &mut model,
                at,
                200,
                (window, long),
                0,
                "long window",
            );
        }
        // The oldest 20 leave the window; the next request drops them (the head moves off
        // the marks).
        at = base + long + 19 * ms + 1000;
        step(
            &mut c,
            &mut model,
            at,
            200,
            (window, long),
            2,
            "after the oldest left",
        );
        step(
            &mut c,
            &mut model,
            at,
            10,
            (window, long),
            1,
            "lowered limit again",
        );
        q::<()>(&mut c, &["DEBUG", "RELOAD"]);
        at += 1000;
        step(
            &mut c,
            &mut model,
            at,
            200,
            (short_s, short),
            0,
            "short, reloaded",
        );
        step(
            &mut c,
            &mut model,
            at,
            200,
            (window, long),
            1,
            "after the reload",
        );
        step(
            &mut c,
            &mut model,
            at,
            10,
            (window, long),
            1,
            "lowered, reloaded",
        );
        // Refunds: back below the first mark, then everything (the key goes).
        clock.freeze_at(at);
        let left = model.in_window(at, long).len() as u64;
        let give = left.saturating_sub(60).max(1);
        let got: Vec<i64> = q(&mut c, &["RL.REFUND", &key, &give.to_string()]);
        assert_eq!(
            got,
            model.refund(at, 200, long, give),
            "{key}: refund {give}"
        );
        step(
            &mut c,
            &mut model,
            at + 1000,
            200,
            (window, long),
            1,
            "after the refund",
        );
        let got: Vec<i64> = q(&mut c, &["RL.REFUND", &key, "1000"]);
        assert_eq!(
            got,
            model.refund(at + 1000, 200, long, 1000),
            "{key}: refund all"
        );
        assert_eq!(q::<i64>(&mut c, &["EXISTS", &key]), 0, "{key}: emptied");
        // Memory: a few bytes per request on top of the value's fixed part.
        assert!(
            full < 400 + 16 * n as i64,
            "{key}: MEMORY USAGE {full} for {n}"
        );
    }
}
