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

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant as WallClock;

use common::{now_ns, q, Dump, Server};

const HOUR_NS: u64 = 3_600_000_000_000;

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
    println!("| rl.log-max-limit | pattern (full logs, one instant per request) | worst µs | median µs | calls |");
    println!("|---:|---|---:|---:|---:|");
    for (cap, label, (max, median, n)) in rows {
        println!("| {cap} | {label} | {max} | {median} | {n} |");
    }
}
