//! The Lua fallback scripts (scripts/lua/) keep the module's contract: the same request
//! sequences through RL.GCRA / RL.WINDOW and through the scripts give the same replies
//! (decisions and counts exactly, millisecond fields within the clock's resolution).

mod common;

use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use common::{q, Server};

fn load(c: &mut redis::Connection, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/lua")
        .join(name);
    let source = std::fs::read_to_string(path).unwrap();
    q(c, &["SCRIPT", "LOAD", &source])
}

fn eval(
    c: &mut redis::Connection,
    sha: &str,
    key: &str,
    args: &[&str],
) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key);
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c)
}

fn module(
    c: &mut redis::Connection,
    command: &str,
    key: &str,
    args: &[&str],
) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::cmd(command);
    cmd.arg(key);
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c)
}

/// One step: wait, then send `args` to both.
struct Step<'a> {
    wait_ms: u64,
    args: &'a [&'a str],
}

fn compare(c: &mut redis::Connection, command: &str, sha: &str, label: &str, steps: &[Step<'_>]) {
    let (mkey, lkey) = (format!("m:{label}"), format!("l:{label}"));
    for (i, step) in steps.iter().enumerate() {
        sleep(Duration::from_millis(step.wait_ms));
        let m = module(c, command, &mkey, step.args);
        let l = eval(c, sha, &lkey, step.args);
        match (m, l) {
            (Ok(m), Ok(l)) => {
                assert_eq!(
                    m[..3],
                    l[..3],
                    "{label} step {i} {:?}: module {m:?}, lua {l:?}",
                    step.args
                );
                for f in [3, 4] {
                    let close = (m[f] == -1 && l[f] == -1)
                        || (m[f] >= 0 && l[f] >= 0 && (m[f] - l[f]).abs() <= 2);
                    assert!(close, "{label} step {i} field {f}: module {m:?}, lua {l:?}");
                }
                let (mp, lp): (i64, i64) = (q(c, &["PTTL", &mkey]), q(c, &["PTTL", &lkey]));
                assert!(
                    (mp < 0) == (lp < 0) && (mp - lp).abs() <= 5,
                    "{label} step {i}: PTTL {mp} vs {lp}"
                );
            }
            (Err(m), Err(l)) => {
                // Errors may name the key: compare them with the key names taken out.
                let m = m.detail().map(|d| d.replace(&mkey, "KEY"));
                let l = l.detail().map(|d| d.replace(&lkey, "KEY"));
                assert_eq!(m, l, "{label} step {i}: errors differ");
            }
            (m, l) => panic!("{label} step {i} {:?}: module {m:?}, lua {l:?}", step.args),
        }
    }
}

fn st<'a>(wait_ms: u64, args: &'a [&'a str]) -> Step<'a> {
    Step { wait_ms, args }
}

#[test]
fn gcra_script_matches_the_module() {
    let s = Server::start();
    let mut c = s.conn();
    let sha = load(&mut c, "gcra.lua");
    let burst3: &[&str] = &["3", "10", "1"];
    compare(
        &mut c,
        "RL.GCRA",
        &sha,
        "burst",
        &[
            st(0, &["3", "10", "1", "QUANTITY", "0"]),
            st(0, burst3),
            st(0, burst3),
            st(0, burst3),
            st(0, burst3),
            st(0, &["3", "10", "1", "PEEK"]),
            st(0, &["3", "10", "1", "QUANTITY", "4"]),
            st(150, burst3),
            st(0, burst3),
            st(350, &["3", "10", "1", "QUANTITY", "2"]),
            st(0, &["3", "10", "1", "QUANTITY", "0"]),
        ],
    );
    compare(
        &mut c,
        "RL.GCRA",
        &sha,
        "slow",
        &[
            st(0, &["5", "1", "60", "QUANTITY", "3"]),
            st(0, &["5", "1", "60", "QUANTITY", "3"]),
            st(0, &["5", "1", "60.5"]),
            st(0, &["10", "2", "60", "QUANTITY", "0"]),
        ],
    );
    for bad in [
        &["0", "1", "1"][..],
        &["1", "x", "1"],
        &["1", "1", "1e3"],
        &["1", "1", ".5"],
        &["1", "1", "1", "QUANTITY"],
        &["1", "1", "1", "PEEK", "PEEK"],
        &["1", "1", "1", "FOO"],
    ] {
        compare(&mut c, "RL.GCRA", &sha, "bad", &[st(0, bad)]);
    }
}

#[test]
fn window_script_matches_the_module() {
    let s = Server::start();
    let mut c = s.conn();
    let sha = load(&mut c, "window.lua");
    for algo in ["FIXED", "SLIDING", "LOG"] {
        let one = ["4", "3600", algo];
        let (q0, q2, peek, q5) = (
            ["4", "3600", algo, "QUANTITY", "0"],
            ["4", "3600", algo, "QUANTITY", "2"],
            ["4", "3600", algo, "PEEK"],
            ["4", "3600", algo, "QUANTITY", "5"],
        );
        let (bigger_q0, bigger) = (["6", "3600", algo, "QUANTITY", "0"], ["6", "3600", algo]);
        let steps = [
            st(0, &q0),
            st(0, &one),
            st(0, &q2),
            st(0, &peek),
            st(0, &one),
            st(0, &one),
            st(0, &q5),
            st(0, &bigger_q0),
            st(0, &bigger),
        ];
        compare(&mut c, "RL.WINDOW", &sha, &format!("w:{algo}"), &steps);
    }
    // LOG over time: entries leave the trailing window one by one.
    let log: &[&str] = &["2", "0.3", "LOG"];
    compare(
        &mut c,
        "RL.WINDOW",
        &sha,
        "log-time",
        &[
            st(0, log),
            st(100, log),
            st(0, log),
            st(220, log),
            st(0, log),
            st(120, log),
        ],
    );
    // Mixing algorithms on a key is refused by both with the same message.
    compare(
        &mut c,
        "RL.WINDOW",
        &sha,
        "w:FIXED",
        &[st(0, &["4", "3600", "LOG"])],
    );
    for bad in [
        &["0", "1"][..],
        &["1", "0"],
        &["1", "1", "FIXED", "LOG"],
        &["1", "1", "QUANTITY", "-1"],
        &["1", "1", "BOGUS"],
    ] {
        compare(&mut c, "RL.WINDOW", &sha, "bad", &[st(0, bad)]);
    }
}
