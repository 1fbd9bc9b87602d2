//! `make bench-worst`: the worst single-call server time of the LOG patterns whose work could
//! grow with the log, at the default cap (100,000 requests per key) and at the largest
//! `rl.log-max-limit` (10,000,000), measured with the server's own SLOWLOG on a real
//! redis-server with the release module.
//!
//! Logs are built at full size, one instant per request (the most entries a log of that many
//! requests can hold), by RESTOREing a state the codec accepts. Patterns:
//!
//! * a denial after the limit was lowered below what the log holds (incident response);
//! * reads alternating two window lengths (QUANTITY 0, the last minute then the last hour);
//! * a write that finds the whole log expired and drops it;
//! * a refund of every request in the log;
//! * RL.ALL … PEEK over many full LOG keys, alternating two window lengths.
//!
//! Prints a Markdown table (max and median µs per call). Measures, asserts nothing.
//!
//! Then the Lua fallback's LEASE on a key of 10,000 holders (64-byte tokens, issue 25): the
//! server time of a renewal, a denial, `QUANTITY 10000`, a release and a write that drops
//! 10,000 expired leases (SLOWLOG); the bytes each renewal and release appends to the AOF; and
//! the server time to fill one key to 10,000 holders, fallback and module (INFO commandstats).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant as WallClock;

use common::{now_ns, q, Dump, Server};

const HOUR_NS: u64 = 3_600_000_000_000;

/// The fallback, as clients load it.
const LIBRARY: &str = include_str!("../scripts/lua/redis_rl.lua");

/// Holders of the full LEASE key, and their token length.
const HOLDERS: usize = 10_000;

fn token(i: usize) -> String {
    format!("{i:0>64}")
}

/// Codec bytes (encoding version 2) of a LOG of `n` requests, one per instant, evenly spread
/// over the hour that ends `ends_ago_ns` before now (limit `n`, window one hour).
fn log_state(n: u64, ends_ago_ns: u64) -> Vec<u8> {
    let last = (now_ns() - ends_ago_ns) / 1000 * 1000;
    let gap = (HOUR_NS - 60_000_000_000) / n / 1000 * 1000;
    let first = last - (n - 1) * gap;
    let mut entries = Vec::with_capacity(n as usize * 4);
    entries.push(1u8);
    let mut delta = Vec::new();
    let mut v = gap;
    while v >= 0x80 {
        delta.push((v as u8) | 0x80);
        v >>= 7;
    }
    delta.push(v as u8);
    for _ in 1..n {
        entries.extend_from_slice(&delta);
        entries.push(1);
    }
    let mut out = vec![2u8, 4];
    for f in [HOUR_NS, n, first, last, n, entries.len() as u64] {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out.extend_from_slice(&entries);
    out
}

struct Bench {
    /// Kept alive for the measurements (stopped on drop).
    _server: Server,
    con: redis::Connection,
    frame: Dump,
}

impl Bench {
    fn start(cap: u64) -> Bench {
        let server = Server::builder().arg("proto-max-bulk-len", "1gb").start();
        let mut con = server.conn();
        q::<()>(
            &mut con,
            &["CONFIG", "SET", "rl.log-max-limit", &cap.to_string()],
        );
        q::<()>(&mut con, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        q::<()>(&mut con, &["CONFIG", "SET", "slowlog-max-len", "10000"]);
        // RL.ALL over 100 keys below: above the default rl.all-max-keys (64).
        q::<()>(&mut con, &["CONFIG", "SET", "rl.all-max-keys", "100"]);
        let _: Vec<i64> = q(&mut con, &["RL.WINDOW", "frame", "5", "60", "LOG"]);
        let payload: Vec<u8> = q(&mut con, &["DUMP", "frame"]);
        let frame = Dump::parse(&payload);
        Bench {
            _server: server,
            con,
            frame,
        }
    }

    fn restore(&mut self, key: &str, payload: &[u8]) {
        redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(payload)
            .arg("REPLACE")
            .query::<()>(&mut self.con)
            .unwrap_or_else(|e| panic!("RESTORE {key}: {e}"));
    }

    /// Runs `calls` (each a full command) and returns the server time of each, in µs.
    fn timed(&mut self, calls: &[Vec<String>]) -> Vec<i64> {
        q::<()>(&mut self.con, &["SLOWLOG", "RESET"]);
        for call in calls {
            let mut cmd = redis::cmd(&call[0]);
            for a in &call[1..] {
                cmd.arg(a);
            }
            let _: redis::Value = cmd.query(&mut self.con).unwrap();
        }
        let entries: Vec<Vec<redis::Value>> = q(&mut self.con, &["SLOWLOG", "GET", "10000"]);
        entries
            .iter()
            .filter(|e| {
                let text = format!("{:?}", e.get(3));
                !text.contains("SLOWLOG")
            })
            .filter_map(|e| match e.get(2) {
                Some(redis::Value::Int(us)) => Some(*us),
                _ => None,
            })
            .collect()
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

fn summary(mut us: Vec<i64>) -> (i64, i64, usize) {
    us.sort_unstable();
    let n = us.len();
    (
        us.last().copied().unwrap_or(0),
        us.get(n / 2).copied().unwrap_or(0),
        n,
    )
}

fn main() {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let caps: &[u64] = &[100_000, 10_000_000];
    let mut rows = Vec::new();
    for &cap in caps {
        let started = WallClock::now();
        let mut b = Bench::start(cap);
        let full = b.frame.with_state(&log_state(cap, 0));
        let expired = b
            .frame
            .with_state(&log_state(cap, HOUR_NS + 60_000_000_000));
        let reps = if quick { 20 } else { 100 };

        b.restore("hot", &full);
        let denials: Vec<_> = (0..reps)
            .map(|_| words("RL.WINDOW hot 1000 3600 LOG"))
            .collect();
        rows.push((
            cap,
            "denial after the limit is lowered to 1,000",
            summary(b.timed(&denials)),
        ));

        let alternating: Vec<_> = (0..reps)
            .flat_map(|_| {
                [
                    words(&format!("RL.WINDOW hot {cap} 60 LOG QUANTITY 0")),
                    words(&format!("RL.WINDOW hot {cap} 3600 LOG QUANTITY 0")),
                ]
            })
            .collect();
        rows.push((
            cap,
            "reads alternating a 60 s and a 3600 s window",
            summary(b.timed(&alternating)),
        ));

        let mut drops = Vec::new();
        let mut refunds = Vec::new();
        for _ in 0..reps.min(10) {
            b.restore("old", &expired);
            drops.extend(b.timed(&[words(&format!("RL.WINDOW old {cap} 3600 LOG"))]));
            b.restore("hot", &full);
            refunds.extend(b.timed(&[words(&format!("RL.REFUND hot {cap}"))]));
        }
        rows.push((
            cap,
            "a write that drops a whole expired log",
            summary(drops),
        ));
        rows.push((
            cap,
            "a refund of every request in the log",
            summary(refunds),
        ));

        let n_keys = if cap > 100_000 { 10 } else { 100 };
        for i in 0..n_keys {
            b.restore(&format!("{{all}}:{i}"), &full);
        }
        let all_call = |window: u64| {
            let mut call = vec!["RL.ALL".to_owned(), n_keys.to_string()];
            call.extend((0..n_keys).map(|i| format!("{{all}}:{i}")));
            for _ in 0..n_keys {
                call.extend(words(&format!("WINDOW {cap} {window} LOG")));
            }
            call.push("PEEK".to_owned());
            call
        };
        let all_calls: Vec<_> = (0..reps / 2)
            .flat_map(|_| [all_call(60), all_call(3600)])
            .collect();
        let label = if n_keys == 100 {
            "RL.ALL … PEEK over 100 full LOG keys, alternating windows"
        } else {
            "RL.ALL … PEEK over 10 full LOG keys, alternating windows"
        };
        rows.push((cap, label, summary(b.timed(&all_calls))));
        drop(b);
        eprintln!("cap {cap}: measured in {:.1?}", started.elapsed());
    }
    let lease = lease_rows(quick);
    println!("| rl.log-max-limit | pattern (full logs, one instant per request) | worst µs | median µs | calls |");
    println!("|---:|---|---:|---:|---:|");
    for (cap, label, (max, median, n)) in rows {
        println!("| {cap} | {label} | {max} | {median} | {n} |");
    }
    println!();
    println!("The Lua fallback's LEASE on one key of {HOLDERS} holders (64-byte tokens, leases of an hour):");
    println!();
    println!("| pattern | worst µs | median µs | calls | AOF bytes per call |");
    println!("|---|---:|---:|---:|---:|");
    for (label, (max, median, n), bytes) in &lease.rows {
        let bytes = bytes.map_or("–".to_owned(), |b| b.to_string());
        println!("| {label} | {max} | {median} | {n} | {bytes} |");
    }
    println!();
    println!(
        "Filling one key to {HOLDERS} holders, one call each: fallback {:.1} ms, module {:.1} ms of \
         server time ({:.2}x the module).",
        lease.fill_fallback_us / 1000.0,
        lease.fill_module_us / 1000.0,
        lease.fill_fallback_us / lease.fill_module_us
    );
}

/// One pattern: its label, (worst, median, calls) µs, and the AOF bytes per call of a write.
type LeaseRow = (&'static str, (i64, i64, usize), Option<i64>);

/// The fallback's LEASE measurements.
struct LeaseRows {
    rows: Vec<LeaseRow>,
    fill_fallback_us: f64,
    fill_module_us: f64,
}

/// The server's total µs in `cmdstat_<name>` (INFO commandstats).
fn usec_total(con: &mut redis::Connection, name: &str) -> f64 {
    let stats: String = q(con, &["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:")))
        .and_then(|f| f.split(',').find_map(|p| p.strip_prefix("usec=")))
        .map_or(0.0, |v| v.parse().unwrap())
}

fn aof_size(con: &mut redis::Connection) -> i64 {
    let info: String = q(con, &["INFO", "persistence"]);
    info.lines()
        .find_map(|l| l.strip_prefix("aof_current_size:"))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Fills `key` with HOLDERS holders through `cmd` (RL.LEASE or the fallback's FCALL), pipelined;
/// `lease` is the lease in seconds.
fn fill(con: &mut redis::Connection, fallback: bool, key: &str, lease: &str) {
    for chunk in (0..HOLDERS).collect::<Vec<_>>().chunks(1000) {
        let mut p = redis::pipe();
        for &i in chunk {
            if fallback {
                p.cmd("FCALL").arg("rl_lease").arg(1);
            } else {
                p.cmd("RL.LEASE");
            }
            p.arg(key).arg(HOLDERS).arg(lease).arg(token(i));
        }
        let _: Vec<Vec<i64>> = p.query(con).unwrap();
    }
}

/// Makes `key` a LEASE key of the fallback's layout (a sorted set: the header "\\0rlE" scored
/// by minus the limit, a member per slot scored by its expiry in µs) whose HOLDERS leases all
/// expired a second ago.
fn expired_leases(con: &mut redis::Connection, key: &str) {
    q::<()>(con, &["DEL", key]);
    let expired_us = now_ns() / 1000 - 1_000_000;
    let mut cmd = redis::cmd("ZADD");
    cmd.arg(key).arg(-(HOLDERS as i64)).arg(b"\0rlE");
    for i in 0..HOLDERS {
        let mut member = vec![64u8];
        member.extend_from_slice(token(i).as_bytes());
        cmd.arg(expired_us).arg(member);
    }
    let _: i64 = cmd.query(con).unwrap();
    q::<()>(con, &["PEXPIRE", key, "60000"]);
}

fn lease_rows(quick: bool) -> LeaseRows {
    let server = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "no")
        .start();
    let mut con = server.conn();
    let c = &mut con;
    let name: String = q(c, &["FUNCTION", "LOAD", "REPLACE", LIBRARY]);
    assert_eq!(name, "redis_rl");
    q::<()>(c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    q::<()>(c, &["CONFIG", "SET", "slowlog-max-len", "10000"]);
    q::<()>(c, &["CONFIG", "RESETSTAT"]);
    fill(c, true, "full", "3600");
    let fill_fallback_us = usec_total(c, "fcall");
    fill(c, false, "mfull", "3600");
    let fill_module_us = usec_total(c, "RL.LEASE");
    let reps = if quick { 20 } else { 100 };
    // One call at a time: the server time from SLOWLOG (the FCALL's own entry), the AOF bytes
    // from its size before and after.
    let timed_one = |c: &mut redis::Connection, args: &[String]| -> (i64, i64) {
        q::<()>(c, &["SLOWLOG", "RESET"]);
        let before = aof_size(c);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&args[0]).arg(1).arg("full");
        for a in &args[1..] {
            cmd.arg(a);
        }
        let _: redis::Value = cmd.query(c).unwrap();
        let after = aof_size(c);
        let entries: Vec<Vec<redis::Value>> = q(c, &["SLOWLOG", "GET", "10000"]);
        let us = entries
            .iter()
            .filter(|e| format!("{:?}", e.get(3)).contains("FCALL"))
            .filter_map(|e| match e.get(2) {
                Some(redis::Value::Int(us)) => Some(*us),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        (us, after - before)
    };
    let words = |v: &[&str]| -> Vec<String> { v.iter().map(|s| (*s).to_owned()).collect() };
    let mut rows = Vec::new();
    let mut run = |c: &mut redis::Connection,
                   label: &'static str,
                   make: &dyn Fn(usize) -> Vec<String>,
                   bytes: bool| {
        let mut times = Vec::new();
        let mut total_bytes = 0;
        for i in 0..reps {
            let (us, b) = timed_one(c, &make(i));
            times.push(us);
            total_bytes += b;
        }
        let per = bytes.then(|| total_bytes / reps as i64);
        rows.push((label, summary(times), per));
    };
    let h = HOLDERS.to_string();
    run(
        c,
        "renewal (RENEW)",
        &|i| words(&["rl_lease", &h, "3600", &token(i), "RENEW"]),
        true,
    );
    run(
        c,
        "renewal (a retried acquire)",
        &|i| words(&["rl_lease", &h, "3600", &token(i + 1000)]),
        true,
    );
    run(
        c,
        "denial of a newcomer",
        &|_| words(&["rl_lease", &h, "3600", "newcomer"]),
        false,
    );
    run(
        c,
        "QUANTITY 10000 (denied)",
        &|_| words(&["rl_lease", &h, "3600", "newcomer", "QUANTITY", "10000"]),
        false,
    );
    run(
        c,
        "QUANTITY 0 (a read)",
        &|_| words(&["rl_lease", &h, "3600", "newcomer", "QUANTITY", "0"]),
        false,
    );
    run(
        c,
        "release",
        &|i| words(&["rl_release", &token(i + 5000)]),
        true,
    );
    // A write that finds every lease expired and drops them.
    let mut drops = Vec::new();
    let mut drop_bytes = 0;
    let drop_reps = if quick { 2 } else { 5 };
    for _ in 0..drop_reps {
        expired_leases(c, "full");
        let (us, b) = timed_one(c, &words(&["rl_lease", &h, "3600", "late"]));
        drops.push(us);
        drop_bytes += b;
    }
    rows.push((
        "a write dropping 10,000 expired leases",
        summary(drops),
        Some(drop_bytes / drop_reps as i64),
    ));
    LeaseRows {
        rows,
        fill_fallback_us,
        fill_module_us,
    }
}
