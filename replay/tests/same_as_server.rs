//! The replay decides exactly as the server: a sequence of RL.ALL calls is sent to a real
//! `redis-server` with the module, the server's clock is read just before and just after each
//! call (pipelined `TIME`, `RL.ALL`, `TIME`), and the same requests, stamped with those
//! instants, are run through the `rl-replay` binary. Every decision and reply must match.
//!
//! The module reads its own clock, a few µs after the first `TIME`. The sequence keeps its
//! gaps at tens of ms and its limits' boundaries coarse, so µs cannot flip a decision; the
//! test replays both the "before" and the "after" instants and only a step where the two
//! disagree (a boundary fell inside the µs between them) may go unchecked, and such steps must
//! stay rare.
//!
//! Needs `redis-server` (or `$REDIS_SERVER`) and the module (`$RL_MODULE`, else the
//! workspace's `target/release/libredis_rl.so`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

const LIMITS: [(&str, &str); 4] = [
    ("GCRA 3 10 1", "{ip}"),
    ("WINDOW 4 1 SLIDING", "{user}"),
    ("WINDOW 3 0.5 LOG", "{ip}"),
    ("WINDOW 5 2 FIXED", "{path:1}"),
];
/// The LOG limit applies only here (`on /login`), as a route selection.
const LOG_ROUTE: &str = "/login";
const STEPS: usize = 110;

/// One pipelined round: `TIME`, the `RL.ALL` reply (combined, per key), `TIME`.
type Timed = (
    (String, String),
    (Vec<i64>, Vec<Vec<i64>>),
    (String, String),
);

#[derive(Debug, Clone)]
struct Step {
    ip: &'static str,
    user: Option<&'static str>,
    path: &'static str,
    before_ns: u64,
    after_ns: u64,
    combined: [i64; 5],
    each: Vec<[i64; 5]>,
}

#[derive(Deserialize, Debug)]
struct Decided {
    line: u64,
    allowed: bool,
    reply: Option<[i64; 5]>,
    limits: Vec<Option<PerLimit>>,
}

#[derive(Deserialize, Debug)]
struct PerLimit {
    key: String,
    reply: [i64; 5],
}

fn module() -> PathBuf {
    if let Ok(p) = std::env::var("RL_MODULE") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/libredis_rl.so");
    assert!(
        p.exists(),
        "no module at {}: run `cargo build --release` at the workspace root",
        p.display()
    );
    // The shared harness reads $RL_MODULE (its own fallback is relative to the root crate).
    std::env::set_var("RL_MODULE", &p);
    p
}

fn time_ns(t: &(String, String)) -> u64 {
    let s: u64 = t.0.parse().expect("TIME seconds");
    let us: u64 = t.1.parse().expect("TIME micros");
    s * 1_000_000_000 + us * 1_000
}

/// The keys a request has under each limit (None: the limit does not apply).
fn keys(ip: &str, user: Option<&str>, path: &str) -> [Option<String>; 4] {
    let first = path.split('/').take(2).collect::<Vec<_>>().join("/");
    [
        Some(ip.to_owned()),
        user.map(str::to_owned),
        path.starts_with(LOG_ROUTE).then(|| ip.to_owned()),
        Some(first),
    ]
}

fn run_server(seed: u64) -> Vec<Step> {
    let module = module();
    let server = common::Server::builder().module(module).start();
    let mut con = server.conn();
    let mut rng = StdRng::seed_from_u64(seed);
    let ips = ["10.0.0.1", "10.0.0.2", "2001:db8::3"];
    let users = ["alice", "bob"];
    let paths = ["/login", "/login/form", "/api/items", "/api/orders", "/"];
    // A guard against a hung server, with room for a loaded machine (the comparison itself reads
    // the server's clock around each call, whatever the pace).
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut steps = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        assert!(Instant::now() < deadline, "the sequence took too long");
        let ip = ips[rng.gen_range(0..ips.len())];
        let user = rng
            .gen_bool(0.8)
            .then(|| users[rng.gen_range(0..users.len())]);
        let path = paths[rng.gen_range(0..paths.len())];
        let ks = keys(ip, user, path);
        let mut call = redis::cmd("RL.ALL");
        let applied: Vec<usize> = (0..4).filter(|&i| ks[i].is_some()).collect();
        call.arg(applied.len());
        for &i in &applied {
            call.arg(format!("rl:{i}:{}", ks[i].as_deref().unwrap_or_default()));
        }
        for &i in &applied {
            for word in LIMITS[i].0.split_whitespace() {
                call.arg(word);
            }
        }
        let (before, (combined, each), after): Timed = redis::pipe()
            .cmd("TIME")
            .add_command(call)
            .cmd("TIME")
            .query(&mut con)
            .expect("pipeline");
        let five = |v: &[i64]| -> [i64; 5] { v.try_into().expect("five integers") };
        steps.push(Step {
            ip,
            user,
            path,
            before_ns: time_ns(&before),
            after_ns: time_ns(&after),
            combined: five(&combined),
            each: each.iter().map(|v| five(v)).collect(),
        });
        std::thread::sleep(Duration::from_millis(rng.gen_range(12..40)));
    }
    steps
}

/// Runs the tool on the steps stamped `at(step)`; returns its decisions in line order.
fn replay(steps: &[Step], at: impl Fn(&Step) -> u64, dir: &Path, name: &str) -> Vec<Decided> {
    let log = dir.join(format!("{name}.jsonl"));
    let mut text = String::new();
    for s in steps {
        let t = at(s);
        let line = serde_json::json!({
            "time": format!("{}.{:09}", t / 1_000_000_000, t % 1_000_000_000),
            "ip": s.ip,
            "user": s.user,
            "path": s.path,
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&log, text).expect("write log");
    let out = dir.join(format!("{name}.decisions"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-replay"));
    cmd.arg(&log).arg("--quiet").arg("--skew").arg("0");
    for (i, (spec, per)) in LIMITS.iter().enumerate() {
        let route = if i == 2 {
            format!(" on {LOG_ROUTE}")
        } else {
            String::new()
        };
        cmd.arg("-l").arg(format!("{spec} per {per}{route}"));
    }
    cmd.arg("--decisions").arg(&out);
    let status = cmd.status().expect("run rl-replay");
    assert!(status.success(), "rl-replay failed");
    let mut decided: Vec<Decided> = std::fs::read_to_string(&out)
        .expect("decisions")
        .lines()
        .map(|l| serde_json::from_str(l).expect("decision line"))
        .collect();
    decided.sort_by_key(|d| d.line);
    assert_eq!(decided.len(), steps.len());
    decided
}

/// Whether the server's durations (retry_after_ms, reset_after_ms) lie between what the
/// replay answers at the instant before the call and at the instant after it (± 1 ms for the
/// rounding up to milliseconds): the server read its clock somewhere in between.
fn durations_between(server: &[i64; 5], early: &[i64; 5], late: &[i64; 5]) -> bool {
    (3..5).all(|j| {
        let (lo, hi) = (early[j].min(late[j]), early[j].max(late[j]));
        (lo - 1..=hi + 1).contains(&server[j])
    })
}

/// The part of a reply that µs cannot change: allowed, limit, remaining.
fn exact(r: &[i64; 5]) -> [i64; 3] {
    [r[0], r[1], r[2]]
}

#[test]
fn replay_decides_every_request_as_the_server_did() {
    let steps = run_server(18);
    let dir = tempfile::tempdir().expect("temp dir");
    let early = replay(&steps, |s| s.before_ns, dir.path(), "before");
    let late = replay(&steps, |s| s.after_ns, dir.path(), "after");
    let mut checked = 0;
    let mut ambiguous = 0;
    let (mut allowed, mut denied) = (0, 0);
    for (i, s) in steps.iter().enumerate() {
        let (a, b) = (&early[i], &late[i]);
        let same = a.reply.map(|r| exact(&r)) == b.reply.map(|r| exact(&r))
            && a.limits.iter().zip(&b.limits).all(|(x, y)| {
                x.as_ref().map(|p| exact(&p.reply)) == y.as_ref().map(|p| exact(&p.reply))
            });
        if !same {
            ambiguous += 1;
            continue;
        }
        checked += 1;
        let ctx = format!("step {i} ({s:?})");
        let reply = a.reply.expect("every request has a limit");
        let reply_late = b.reply.expect("every request has a limit");
        assert_eq!(a.allowed, s.combined[0] == 1, "{ctx}: allowed");
        assert_eq!(exact(&reply), exact(&s.combined), "{ctx}: combined reply");
        assert!(
            durations_between(&s.combined, &reply, &reply_late),
            "{ctx}: combined {reply:?} .. {reply_late:?} vs server {:?}",
            s.combined
        );
        let ks = keys(s.ip, s.user, s.path);
        let mine: Vec<&PerLimit> = a.limits.iter().flatten().collect();
        let mine_late: Vec<&PerLimit> = b.limits.iter().flatten().collect();
        assert_eq!(mine.len(), s.each.len(), "{ctx}: limits applied");
        let applied = ks.iter().flatten();
        for (((m, m_late), server), key) in mine.iter().zip(&mine_late).zip(&s.each).zip(applied) {
            assert_eq!(&m.key, key, "{ctx}: key");
            assert_eq!(exact(&m.reply), exact(server), "{ctx}: per-key reply");
            assert!(
                durations_between(server, &m.reply, &m_late.reply),
                "{ctx}: per-key {:?} .. {:?} vs server {server:?}",
                m.reply,
                m_late.reply
            );
        }
        if a.allowed {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    eprintln!(
        "{checked} steps checked ({allowed} allowed, {denied} denied), {ambiguous} too close to a boundary"
    );
    assert!(ambiguous * 20 <= steps.len(), "{ambiguous} ambiguous steps");
    // The sequence must exercise both outcomes, or it proves little.
    assert!(
        allowed >= 20 && denied >= 20,
        "{allowed} allowed, {denied} denied"
    );
}
