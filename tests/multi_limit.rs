//! RL.ALL (several limits, one atomic decision), RL.REFUND and RL.GCRA … MAXWAIT over the wire.

mod common;

use common::{assert_ms, err_s, frozen_server, q, rl, snapshot, Server, WALL_SLACK_MS};

const MS_NS: u64 = 1_000_000;

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

const USER_AND_IP: &[&str] = &[
    "2",
    "{u42}:key",
    "{u42}:ip",
    "GCRA",
    "3",
    "1",
    "60",
    "WINDOW",
    "2",
    "60",
    "LOG",
];

#[test]
fn all_admits_only_when_every_limit_admits() {
    let s = Server::start();
    let mut c = s.conn();
    let (combined, per_key) = all(&mut c, USER_AND_IP);
    assert_eq!(&combined[..4], &[1, 2, 1, -1]);
    assert_eq!(&per_key[0][..4], &[1, 3, 2, -1]);
    assert_eq!(&per_key[1][..4], &[1, 2, 1, -1]);
    let (combined, _) = all(&mut c, USER_AND_IP);
    assert_eq!(&combined[..3], &[1, 2, 0]);
    // The IP limit (2) denies the third request: nothing is consumed anywhere.
    let user_before = snapshot(&mut c, "{u42}:key");
    let ip_before = snapshot(&mut c, "{u42}:ip");
    let (combined, per_key) = all(&mut c, USER_AND_IP);
    assert_eq!(&combined[..3], &[0, 3, 0]);
    assert_ms(combined[3], 60_000, WALL_SLACK_MS);
    assert_eq!(
        &per_key[0][..4],
        &[1, 3, 0, -1],
        "the user limit alone would admit"
    );
    assert_eq!(&per_key[1][..3], &[0, 2, 0]);
    assert_eq!(snapshot(&mut c, "{u42}:key"), user_before);
    assert_eq!(snapshot(&mut c, "{u42}:ip"), ip_before);
    // The user limit still has its third request.
    assert_eq!(rl(&mut c, &["RL.GCRA", "{u42}:key", "3", "1", "60"])[0], 1);
}

#[test]
fn all_with_quantity_peek_and_never() {
    let s = Server::start();
    let mut c = s.conn();
    let mut args = USER_AND_IP.to_vec();
    args.extend(["PEEK", "QUANTITY", "2"]);
    let (combined, _) = all(&mut c, &args);
    assert_eq!(&combined[..3], &[1, 2, 0]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "{u42}:key", "{u42}:ip"]), 0);
    let mut args = USER_AND_IP.to_vec();
    args.extend(["QUANTITY", "3"]);
    let (combined, per_key) = all(&mut c, &args);
    assert_eq!(
        &combined[..4],
        &[0, 3, 0, -1],
        "3 > the IP limit of 2: never (limit/remaining from the smallest remaining)"
    );
    assert_eq!(&per_key[0][..4], &[1, 3, 0, -1]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "{u42}:key", "{u42}:ip"]), 0);
    let mut args = USER_AND_IP.to_vec();
    args.extend(["QUANTITY", "0"]);
    assert_eq!(all(&mut c, &args).0, [1, 2, 2, -1, 0]);
}

#[test]
fn all_rejects_bad_input_before_touching_anything() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: &[(&[&str], &str)] = &[
        (
            &["0", "k", "GCRA", "1", "1", "1"],
            "ERR numkeys must be a positive integer",
        ),
        (
            &["2", "a", "a", "GCRA", "1", "1", "1", "GCRA", "1", "1", "1"],
            "ERR syntax error: key 'a' given more than once",
        ),
        (
            &["2", "a", "b", "GCRA", "1", "1", "1"],
            "ERR syntax error: expected 2 specs (GCRA … or WINDOW … or LEASE …), got 1",
        ),
        (
            &["1", "a", "GCRA", "1", "1"],
            "ERR syntax error: spec is missing its GCRA period",
        ),
        (
            &["1", "a", "GCRA", "0", "1", "1"],
            "ERR burst must be a positive integer",
        ),
        (
            &["1", "a", "WINDOW", "1", "0"],
            "ERR window must be seconds as a plain decimal",
        ),
        (
            &["1", "a", "TOKEN", "1", "1"],
            "ERR syntax error: expected GCRA or WINDOW or LEASE for key 1 of 1, got 'TOKEN'",
        ),
        (
            &["1", "a", "WINDOW", "5", "1", "LOG", "LOG"],
            "ERR syntax error: unknown argument 'LOG'",
        ),
        (
            &["1", "a", "WINDOW", "200000", "1", "LOG"],
            "ERR limit 200000 is above rl.log-max-limit",
        ),
        (
            &["9", "a", "WINDOW", "1", "1"],
            "ERR syntax error: numkeys is larger than the number of arguments",
        ),
        (
            &["1", "a", "GCRA", "1", "1", "1", "MAXWAIT", "5"],
            "ERR syntax error: unknown argument 'MAXWAIT'",
        ),
    ];
    for (args, prefix) in cases {
        let mut full = vec!["RL.ALL"];
        full.extend_from_slice(args);
        let e = err_s(&mut c, &full);
        assert!(e.starts_with(prefix), "{full:?}: {e}");
    }
    // A wrong algorithm on the second key fails the whole call, and the first is untouched.
    rl(&mut c, &["RL.WINDOW", "b", "5", "60", "FIXED"]);
    let e = err_s(
        &mut c,
        &[
            "RL.ALL", "2", "a", "b", "GCRA", "5", "1", "60", "WINDOW", "5", "60",
        ],
    );
    assert!(
        e.starts_with("ERR key 'b' holds a FIXED window, not a SLIDING window"),
        "{e}"
    );
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "a"]), 0);
    let keys: Vec<String> = q(
        &mut c,
        &[
            "COMMAND", "GETKEYS", "RL.ALL", "2", "x", "y", "GCRA", "1", "1", "1", "WINDOW", "1",
            "1",
        ],
    );
    assert_eq!(keys, vec!["x", "y"]);
}

#[test]
fn refund_gives_back_for_every_algorithm() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        q::<Vec<i64>>(&mut c, &["RL.REFUND", "missing", "3"]),
        vec![0, 0, 0]
    );
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "missing"]), 0);
    rl(&mut c, &["RL.GCRA", "g", "5", "1", "60", "QUANTITY", "3"]);
    let r: Vec<i64> = q(&mut c, &["RL.REFUND", "g", "1"]);
    assert_eq!(&r[..2], &[1, 3]);
    assert_ms(r[2], 120_000, WALL_SLACK_MS);
    let pttl: i64 = q(&mut c, &["PTTL", "g"]);
    assert_ms(pttl, r[2], WALL_SLACK_MS);
    for algo in ["FIXED", "SLIDING", "LOG"] {
        let key = format!("w:{algo}");
        rl(
            &mut c,
            &["RL.WINDOW", &key, "5", "600", algo, "QUANTITY", "4"],
        );
        let r: Vec<i64> = q(&mut c, &["RL.REFUND", &key, "3"]);
        assert_eq!(&r[..2], &[3, 4], "{algo}");
        assert_eq!(
            rl(
                &mut c,
                &["RL.WINDOW", &key, "5", "600", algo, "QUANTITY", "0"]
            )[2],
            4,
            "{algo}"
        );
        // Refunding more than was used gives back what there is, and the idle key goes.
        let r: Vec<i64> = q(&mut c, &["RL.REFUND", &key, "10"]);
        assert_eq!(r, vec![1, 5, 0], "{algo}");
        assert_eq!(q::<i64>(&mut c, &["EXISTS", &key]), 0, "{algo}");
    }
    let r: Vec<i64> = q(&mut c, &["RL.REFUND", "g", "99"]);
    assert_eq!(r, vec![2, 5, 0]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "g"]), 0);
    assert!(err_s(&mut c, &["RL.REFUND", "g", "0"])
        .starts_with("ERR quantity must be a positive integer"));
    assert!(err_s(&mut c, &["RL.REFUND", "g"]).starts_with("ERR wrong number of arguments"));
    q::<()>(&mut c, &["SET", "str", "x"]);
    assert!(err_s(&mut c, &["RL.REFUND", "str", "1"]).starts_with("WRONGTYPE"));
}

#[test]
fn maxwait_reserves_a_slot() {
    // On a frozen clock: on the real one, 50 ms between two calls (a loaded machine can take
    // that) would bring the wait under MAXWAIT 150 and admit the request denied below.
    let Some((clock, _s, mut c, start)) = frozen_server() else {
        return;
    };
    // One request every 100 ms, burst 1.
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "r", "1", "10", "1", "MAXWAIT", "1000"]),
        [1, 1, 0, 0, 100]
    );
    let r = rl(&mut c, &["RL.GCRA", "r", "1", "10", "1", "MAXWAIT", "1000"]);
    assert_eq!(r, [1, 1, 0, 100, 200]);
    // A wait beyond MAXWAIT is denied and writes nothing.
    let before = snapshot(&mut c, "r");
    let r = rl(&mut c, &["RL.GCRA", "r", "1", "10", "1", "MAXWAIT", "150"]);
    assert_eq!(&r[..4], &[0, 1, 0, 200]);
    assert_eq!(snapshot(&mut c, "r"), before);
    // Without MAXWAIT the reservations count: denied until they pass.
    let r = rl(&mut c, &["RL.GCRA", "r", "1", "10", "1"]);
    assert_eq!(&r[..4], &[0, 1, 0, 200]);
    clock.freeze_at(start + 199 * MS_NS);
    assert_eq!(rl(&mut c, &["RL.GCRA", "r", "1", "10", "1"])[0], 0);
    clock.freeze_at(start + 200 * MS_NS);
    assert_eq!(rl(&mut c, &["RL.GCRA", "r", "1", "10", "1"])[0], 1);
}

#[test]
fn regression_refund_of_an_expired_log_touches_nothing() {
    // A refund on a LOG whose requests had all left the window used to empty the log in
    // place and keep the key: an RDB holding that empty log then refused to load.
    // On a frozen clock: on the real one, a 50 ms stall between the write and the PEXPIRE (a
    // loaded machine can) would let the key expire first.
    let Some((clock, _s, mut c, start)) = frozen_server() else {
        return;
    };
    rl(
        &mut c,
        &["RL.WINDOW", "short", "5", "0.05", "LOG", "QUANTITY", "3"],
    );
    assert_eq!(q::<i64>(&mut c, &["PEXPIRE", "short", "60000"]), 1); // keep the key past its window
    clock.freeze_at(start + 80 * MS_NS);
    let before = snapshot(&mut c, "short");
    let r: Vec<i64> = q(&mut c, &["RL.REFUND", "short", "2"]);
    assert_eq!(r, vec![0, 5, 0]);
    assert_eq!(snapshot(&mut c, "short"), before);
    q::<()>(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(snapshot(&mut c, "short"), before);
}

#[test]
fn all_says_when_the_specs_do_not_match_numkeys() {
    let s = Server::start();
    let mut c = s.conn();
    // numkeys 5 swallows the spec's words as keys: the error says so, rather than that
    // key '1' is given twice.
    let e = err_s(&mut c, &["RL.ALL", "5", "a", "b", "GCRA", "1", "1", "1"]);
    assert!(
        e.starts_with("ERR syntax error: numkeys is 5, but the specs do not match it"),
        "{e}"
    );
    assert!(!e.contains("more than once"), "{e}");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
}

#[test]
fn getkeys_never_reports_spec_words_as_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = q(
        &mut c,
        &[
            "COMMAND", "GETKEYS", "RL.ALL", "2", "a", "b", "GCRA", "1", "1", "1", "WINDOW", "5",
            "1",
        ],
    );
    assert_eq!(keys, ["a", "b"]);
    // An oversized numkeys: no spec word is a key (the call has no keys at all).
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "RL.ALL", "5", "a", "b", "GCRA", "1", "1", "1"])
        .query(&mut c);
    match reply {
        Ok(keys) => assert!(
            keys.iter().all(|k| k == "a" || k == "b"),
            "spec words reported as keys: {keys:?}"
        ),
        Err(e) => assert!(e.to_string().contains("Invalid arguments"), "{e}"),
    }
}

/// An RL.ALL of `n` keys `{c}:<prefix><i>`, each with the spec `GCRA 5 1 60`.
fn many(prefix: &str, n: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ALL");
    cmd.arg(n);
    for i in 0..n {
        cmd.arg(format!("{{c}}:{prefix}{i}"));
    }
    for _ in 0..n {
        cmd.arg("GCRA").arg(5).arg(1).arg(60);
    }
    cmd
}

/// The error of a command that must fail.
fn error_of(c: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    let e = cmd.query::<redis::Value>(c).unwrap_err();
    format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))
}

fn too_many(numkeys: &str, max: u64) -> String {
    format!(
        "ERR numkeys {numkeys} is above rl.all-max-keys ({max}): give fewer keys per call, or \
         raise rl.all-max-keys"
    )
}

/// docs/reference.md#r-all-9: `numkeys` above `rl.all-max-keys` (default 64) is an error that
/// names both, and writes nothing; exactly at the cap is accepted; `CONFIG SET` moves the cap
/// within 1 to 10000 and refuses anything else.
#[test]
fn all_max_keys_caps_numkeys_and_config_set_moves_it() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "rl.all-max-keys"]),
        ["rl.all-max-keys", "64"]
    );
    let (combined, per_key): (Vec<i64>, Vec<Vec<i64>>) =
        many("at", 64).query(&mut c).expect("64 keys at the cap");
    assert_eq!((combined[..3].to_vec(), per_key.len()), (vec![1, 5, 4], 64));
    assert_eq!(error_of(&mut c, &many("over", 65)), too_many("65", 64));
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "{c}:over0", "{c}:over64"]), 0);
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 64);
    // A numkeys far beyond the arguments (and leading zeros) is refused the same way.
    assert_eq!(
        err_s(
            &mut c,
            &["RL.ALL", "18446744073709551615", "a", "GCRA", "1", "1", "1"]
        ),
        too_many("18446744073709551615", 64)
    );
    assert_eq!(
        err_s(&mut c, &["RL.ALL", "0065", "a", "b", "c"]),
        too_many("65", 64)
    );
    // Such a call has no keys (it fails wherever it runs).
    let keys: redis::RedisResult<Vec<String>> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "RL.ALL", "65", "a", "b", "c"])
        .query(&mut c);
    assert!(keys.is_err(), "{keys:?}");
    // CONFIG SET moves the cap, within 1 to 10000.
    q::<()>(&mut c, &["CONFIG", "SET", "rl.all-max-keys", "2"]);
    assert_eq!(error_of(&mut c, &many("three", 3)), too_many("3", 2));
    let (combined, _): (Vec<i64>, Vec<Vec<i64>>) = many("two", 2).query(&mut c).unwrap();
    assert_eq!(combined[0], 1);
    for bad in ["0", "-1", "abc", "10001", "1.5"] {
        let e = err_s(&mut c, &["CONFIG", "SET", "rl.all-max-keys", bad]);
        assert!(e.starts_with("ERR"), "{bad}: {e}");
    }
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "rl.all-max-keys"])[1],
        "2"
    );
    q::<()>(&mut c, &["CONFIG", "SET", "rl.all-max-keys", "10000"]);
    assert_eq!(
        error_of(&mut c, &many("big", 10_001)),
        too_many("10001", 10_000)
    );
    q::<()>(&mut c, &["CONFIG", "SET", "rl.all-max-keys", "1"]);
    assert_eq!(error_of(&mut c, &many("one", 2)), too_many("2", 1));
    assert!(many("one", 1).query::<redis::Value>(&mut c).is_ok());
}

/// docs/reference.md#r-conf-3: `rl.all-max-keys` as a module argument (with or without the
/// `rl.` prefix) and with `MODULE LOADEX … CONFIG`; a bad value fails the load.
#[test]
fn all_max_keys_from_module_arguments() {
    let s = Server::builder().no_module().start();
    let mut c = s.conn();
    let path = common::module_path();
    let path = path.to_str().unwrap();
    for bad in ["0", "10001", "x"] {
        let e = err_s(&mut c, &["MODULE", "LOAD", path, "all-max-keys", bad]);
        assert!(e.starts_with("ERR"), "{bad}: {e}");
        assert!(
            s.log().contains(&format!(
                "module argument all-max-keys must be an integer from 1 to 10000, got '{bad}'"
            )),
            "{}",
            s.log()
        );
    }
    q::<()>(&mut c, &["MODULE", "LOAD", path, "rl.all-max-keys", "3"]);
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "rl.all-max-keys"])[1],
        "3"
    );
    assert_eq!(error_of(&mut c, &many("m", 4)), too_many("4", 3));
    assert!(s.log().contains("rl.all-max-keys 3)"), "{}", s.log());

    let s2 = Server::builder().no_module().start();
    let mut c2 = s2.conn();
    q::<()>(
        &mut c2,
        &["MODULE", "LOADEX", path, "CONFIG", "rl.all-max-keys", "7"],
    );
    assert_eq!(
        q::<Vec<String>>(&mut c2, &["CONFIG", "GET", "rl.all-max-keys"])[1],
        "7"
    );
    assert_eq!(error_of(&mut c2, &many("x", 8)), too_many("8", 7));

    let s3 = Server::builder()
        .words(&["--loadmodule", path, "ALL-MAX-KEYS", "9"])
        .no_module()
        .start();
    let mut c3 = s3.conn();
    assert_eq!(
        q::<Vec<String>>(&mut c3, &["CONFIG", "GET", "rl.all-max-keys"])[1],
        "9"
    );
}
