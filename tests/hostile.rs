//! Hostile state and hostile sizes: forged RESTORE payloads with valid checksums, a corrupt
//! RDB file at start-up, and single calls with huge quantities or limits.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    err_s, free_port, gcra_state, log_state, median, module_path, now_ns, q, rl, server_binary,
    slowlog_times, snapshot, spread_log_state, Dump, Server,
};

const MAX_PERIOD_NS: u64 = 315_360_000_000_000_000;

fn fields(version: u8, tag: u8, values: &[u64]) -> Vec<u8> {
    let mut v = vec![version, tag];
    for f in values {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v
}

/// Codec bytes (encoding version 3) of a LEASE state with `limit` and `(expiry_ns, slots,
/// token)` leases.
fn lease_state(limit: u64, leases: &[(u64, u64, &[u8])]) -> Vec<u8> {
    let mut records = Vec::new();
    for (expires, slots, token) in leases {
        records.extend_from_slice(&expires.to_le_bytes());
        records.extend_from_slice(&slots.to_le_bytes());
        records.push(token.len() as u8);
        records.extend_from_slice(token);
    }
    let mut v = vec![3u8, 5];
    for f in [limit, leases.len() as u64, records.len() as u64] {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v.extend_from_slice(&records);
    v
}

#[test]
fn forged_restore_payloads_are_refused() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "model", "3", "1", "60"]);
    let frame = Dump::parse(&q::<Vec<u8>>(&mut c, &["DUMP", "model"]));
    let now = now_ns();
    let s1 = 1_000_000_000u64;
    let good_gcra = gcra_state(now + s1, s1, 3, now);
    let good_log = log_state(60 * s1, 5, now, 2);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("gcra burst 0", gcra_state(now + s1, s1, 0, now)),
        ("gcra interval 0", gcra_state(now + s1, 0, 3, now)),
        (
            "gcra interval above ten years",
            gcra_state(now + s1, MAX_PERIOD_NS + 1, 1, now),
        ),
        (
            "gcra burst x interval overflows",
            gcra_state(now + s1, 1 << 40, u64::MAX / 1000, now),
        ),
        (
            "gcra written after its TAT",
            gcra_state(now, s1, 3, now + s1),
        ),
        ("truncated", good_gcra[..33].to_vec()),
        ("trailing bytes", [good_gcra.clone(), vec![0]].concat()),
        (
            "future encoding version",
            [vec![4], good_gcra[1..].to_vec()].concat(),
        ),
        ("version 0", [vec![0], good_gcra[1..].to_vec()].concat()),
        (
            "unknown algorithm",
            [vec![2, 9], good_gcra[2..].to_vec()].concat(),
        ),
        ("empty", vec![]),
        ("one byte", vec![2]),
        ("fixed count 0", fields(2, 2, &[10 * s1, 5, 0, 0, 1])),
        ("fixed window 0", fields(2, 2, &[0, 5, 0, 1, 0])),
        (
            "fixed start not aligned",
            fields(2, 2, &[10 * s1, 5, 3, 1, 4]),
        ),
        (
            "fixed written outside its window",
            fields(2, 2, &[10 * s1, 5, 0, 1, 10 * s1]),
        ),
        ("sliding empty", fields(2, 3, &[10 * s1, 5, 0, 0, 0, 1])),
        // (Counts above the limit are what FORCE records: they load.)
        (
            "lease slots above its limit",
            lease_state(2, &[(now, 3, b"a")]),
        ),
        (
            "lease token twice",
            lease_state(9, &[(now, 1, b"a"), (now, 1, b"a")]),
        ),
        ("lease zero slots", lease_state(9, &[(now, 0, b"a")])),
        ("lease empty token", lease_state(9, &[(now, 1, b"")])),
        (
            "lease token of 65 bytes",
            lease_state(99, &[(now, 1, &[7; 65])]),
        ),
        ("lease limit 0", lease_state(0, &[(now, 1, b"a")])),
        ("lease in version 2", {
            let mut v = lease_state(9, &[(now, 1, b"a")]);
            v[0] = 2;
            v
        }),
        ("sliding limit 0", fields(2, 3, &[10 * s1, 0, 0, 1, 0, 1])),
        ("log longer than its limit", log_state(60 * s1, 1, now, 2)),
        ("log total disagrees with entries", {
            let mut v = good_log.clone();
            v[34] = 3; // total
            v
        }),
        ("log length past the end", {
            let mut v = good_log.clone();
            v[42] = 9; // byte length
            v
        }),
        ("log zero count", {
            let mut v = log_state(60 * s1, 5, now, 2);
            *v.last_mut().unwrap() = 0;
            v
        }),
        ("log non-minimal varint", {
            let mut v = fields(2, 4, &[60 * s1, 5, now, now, 2, 2]);
            v.extend_from_slice(&[0x82, 0x00]);
            v
        }),
        (
            "log last instant disagrees",
            fields(2, 4, &[60 * s1, 5, now, now + 1, 2, 1])
                .into_iter()
                .chain([2])
                .collect(),
        ),
        (
            "replication effect is not a state",
            fields(2, 0x81, &[60 * s1, 5, now, 1]),
        ),
        (
            "expiry prefix is not a state",
            fields(2, 0x90, &[now / 1_000_000]),
        ),
        ("compact effect is not a state", {
            // Version 3, tag 0x92, event 1 (rl.gcra), then a GCRA state's tag and fields.
            let mut v = vec![3u8, 0x92, 1];
            v.extend_from_slice(&good_gcra[1..]);
            v
        }),
    ];
    for (label, state) in cases.drain(..) {
        let e = redis::cmd("RESTORE")
            .arg("forged")
            .arg(0)
            .arg(frame.with_state(&state))
            .query::<()>(&mut c);
        let e = e.err().unwrap_or_else(|| panic!("{label}: accepted"));
        assert!(e.to_string().contains("Bad data format"), "{label}: {e}");
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "forged"]), 0, "{label}");
    }
    // The same frame with valid states loads (the forging itself is sound).
    let good_lease = lease_state(3, &[(now + 60 * s1, 2, b"a"), (now + 60 * s1, 1, b"b")]);
    for (key, state) in [
        ("ok:gcra", good_gcra),
        ("ok:log", good_log),
        ("ok:lease", good_lease),
    ] {
        redis::cmd("RESTORE")
            .arg(key)
            .arg(60_000)
            .arg(frame.with_state(&state))
            .query::<()>(&mut c)
            .unwrap();
    }
    assert_eq!(
        rl(
            &mut c,
            &["RL.WINDOW", "ok:log", "5", "60", "LOG", "QUANTITY", "0"]
        )[2],
        3
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.LEASE", "ok:lease", "3", "60", "c", "QUANTITY", "0"]
        )[2],
        0
    );
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    assert!(
        s.log().contains("refusing to load a corrupt limiter value"),
        "{}",
        s.log()
    );
}

#[test]
fn corrupt_rdb_file_stops_startup_with_a_clear_log_line() {
    // Write an RDB without compression or checksum, so the state bytes can be found and
    // changed on disk: burst 7777 becomes 0.
    let mut s = Server::builder()
        .arg("rdbcompression", "no")
        .arg("rdbchecksum", "no")
        .start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "victim", "7777", "1", "3600"]);
    q::<()>(&mut c, &["SAVE"]);
    s.stop();
    let path = s.dir().join("dump.rdb");
    let mut rdb = std::fs::read(&path).unwrap();
    let needle = 7777u64.to_le_bytes();
    let at = rdb
        .windows(8)
        .position(|w| w == needle)
        .expect("burst in the RDB");
    rdb[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&path, &rdb).unwrap();
    let log = s.dir().join("restart.log");
    let mut child = Command::new(server_binary())
        .args([
            "--port",
            &free_port().to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
        ])
        .arg(s.dir())
        .arg("--logfile")
        .arg(&log)
        .arg("--loadmodule")
        .arg(module_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started with a corrupt RDB");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("refusing to load a corrupt limiter value: field burst out of range"),
        "{text}"
    );
    // Redis stops loading and exits instead of serving a partial data set.
    assert!(
        text.contains("Internal error in RDB reading")
            && !text.contains("Ready to accept connections"),
        "{status}: {text}"
    );
}

/// Runs a command and returns its reply (or error) and the server's own time for it, in µs
/// (SLOWLOG, which [`common::slowlog_start`] set to log every command).
fn timed(c: &mut redis::Connection, args: &[&str]) -> (redis::Value, i64) {
    q::<()>(c, &["SLOWLOG", "RESET"]);
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let v = cmd
        .query::<redis::Value>(c)
        .unwrap_or_else(|e| redis::Value::SimpleString(e.to_string()));
    let times = slowlog_times(c, args[0]);
    assert_eq!(times.len(), 1, "{args:?}: one SLOWLOG entry");
    (v, times[0])
}

#[test]
fn one_call_is_bounded_whatever_its_numbers() {
    let s = Server::start();
    let mut c = s.conn();
    let max = "18446744073709551615";
    // A LOG at the configured maximum with one entry per request: 100 000 entries.
    let mut pipe = redis::pipe();
    for _ in 0..100_000 {
        pipe.cmd("RL.WINDOW")
            .arg("big")
            .arg(100_000)
            .arg(3600)
            .arg("LOG")
            .ignore();
    }
    pipe.query::<()>(&mut c).unwrap();
    let bytes: i64 = q(&mut c, &["MEMORY", "USAGE", "big"]);
    assert!(bytes < 1_000_000, "a 100 000-request log in {bytes} bytes");
    // Server time, not the client's wait: the worst of these does O(entries) work, about a
    // millisecond; work that grew with a quantity or a limit of 2^64 would not end at all.
    // 250 ms is far from both, and a loaded machine does not stretch one call that much.
    let slow_us = 250_000;
    common::slowlog_start(&mut c, 128);
    for args in [
        vec![
            "RL.WINDOW",
            "big",
            "100000",
            "3600",
            "LOG",
            "QUANTITY",
            "100000",
        ],
        vec!["RL.WINDOW", "big", "100000", "3600", "LOG", "QUANTITY", max],
        vec![
            "RL.WINDOW",
            "big",
            "100000",
            "0.000000001",
            "LOG",
            "QUANTITY",
            "100000",
        ],
        vec!["RL.REFUND", "big", max],
        vec!["RL.GCRA", "g", max, "1000000000", "1", "QUANTITY", "1000"],
        vec!["RL.GCRA", "g2", "1", "1", "315360000", "QUANTITY", max],
        vec!["RL.WINDOW", "f", max, "315360000", "FIXED", "QUANTITY", max],
        vec![
            "RL.WINDOW",
            "sl",
            max,
            "315360000",
            "SLIDING",
            "QUANTITY",
            max,
        ],
        vec!["CL.THROTTLE", "t", "18446744073709551614", "1", "1", max],
    ] {
        let (v, took_us) = timed(&mut c, &args);
        assert!(
            took_us < slow_us,
            "{args:?} took {took_us} µs of server time: {v:?}"
        );
    }
    // Above the LOG cap: an error, no allocation.
    let e = err_s(&mut c, &["RL.WINDOW", "huge", "100001", "1", "LOG"]);
    assert!(e.contains("rl.log-max-limit"), "{e}");
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
}

#[test]
fn regression_rl_all_with_many_keys_is_refused_before_its_keys_are_read() {
    // Found by attack testing: nothing capped numkeys, so one RL.ALL with 40 000 keys held the
    // server for a quarter of a second (and, before the duplicate-key check used a hash set,
    // for seconds). Now rl.all-max-keys (default 64) refuses it as soon as numkeys is read:
    // the answer is the cap's error, not the error the keys (given twice) or the specs (the
    // last one invalid) would earn if they were looked at.
    let s = Server::start();
    let mut c = s.conn();
    let n = 40_000;
    let call = |n: usize, spec_kind: &str| {
        let mut cmd = redis::cmd("RL.ALL");
        cmd.arg(n);
        for i in 0..n {
            cmd.arg(format!("{{b}}:{:08}", i % (n - 1)));
        }
        for _ in 0..n - 1 {
            cmd.arg("GCRA").arg(1).arg(1).arg(1);
        }
        cmd.arg(spec_kind).arg(1).arg(1).arg(1);
        cmd
    };
    let e = call(n, "BOGUS").query::<redis::Value>(&mut c).unwrap_err();
    assert_eq!(
        e.detail(),
        Some(
            "numkeys 40000 is above rl.all-max-keys (64): give fewer keys per call, or raise \
             rl.all-max-keys"
        ),
        "{e}"
    );
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
    // Big calls, where an operator allows them: at the largest cap, the key check and the
    // spec check still run over every key, and a valid call of 10 000 keys is decided.
    q::<()>(&mut c, &["CONFIG", "SET", "rl.all-max-keys", "10000"]);
    let e = call(10_000, "GCRA")
        .query::<redis::Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("given more than once"), "{e}");
    let mut cmd = redis::cmd("RL.ALL");
    cmd.arg(10_000);
    for i in 0..10_000 {
        cmd.arg(format!("{{b}}:{i:08}"));
    }
    for _ in 0..9_999 {
        cmd.arg("GCRA").arg(1).arg(1).arg(1);
    }
    cmd.arg("BOGUS");
    let e = cmd.query::<redis::Value>(&mut c).unwrap_err();
    assert!(e.to_string().contains("expected GCRA or WINDOW"), "{e}");
    let mut cmd = redis::cmd("RL.ALL");
    cmd.arg(10_000);
    for i in 0..10_000 {
        cmd.arg(format!("{{b}}:{i:08}"));
    }
    for _ in 0..10_000 {
        cmd.arg("GCRA").arg(1).arg(1).arg(1);
    }
    let (combined, per_key): (Vec<i64>, Vec<Vec<i64>>) = cmd.query(&mut c).unwrap();
    assert_eq!((combined[0], per_key.len()), (1, 10_000));
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 10_000);
}

#[test]
fn regression_reads_of_a_log_do_not_rescan_expired_entries() {
    // Found by attack testing: PEEK, QUANTITY 0 and denials re-read every entry that had left
    // the window on every call (only writes drop them).
    let s = Server::start();
    let mut c = s.conn();
    // A log of 60,000 requests at distinct instants, all more than the 1 s window ago: built
    // in one RESTORE (requests sent one by one share entries when the server is fast, and a
    // slow machine's later requests push the first ones out of a 1 s window while it fills).
    rl(&mut c, &["RL.WINDOW", "frame", "5", "1", "LOG"]);
    let frame = Dump::parse(&q::<Vec<u8>>(&mut c, &["DUMP", "frame"]));
    let s1 = 1_000_000_000u64;
    let state = spread_log_state(s1, 100_000, now_ns() - 2 * s1, 60_000, 1_000);
    redis::cmd("RESTORE")
        .arg("scan")
        .arg(60_000)
        .arg(frame.with_state(&state))
        .query::<()>(&mut c)
        .unwrap();
    let bytes: i64 = q(&mut c, &["MEMORY", "USAGE", "scan"]);
    assert!(
        bytes > 100_000,
        "the log should hold 60,000 entries: {bytes} bytes"
    );
    common::slowlog_start(&mut c, 1000);
    for _ in 0..200 {
        assert_eq!(
            rl(&mut c, &["RL.WINDOW", "scan", "100000", "1", "LOG", "PEEK"])[2],
            99_999,
            "every entry has left the window"
        );
    }
    // Each read finds the window's start with the log's index, whatever lies before it: a
    // read that walked the 60,000 expired entries would decode them all, hundreds of µs of
    // server time, where these take about 1 µs. The median is what a read costs even when
    // the busy machine stalled a few of them.
    let micros = slowlog_times(&mut c, "RL.WINDOW");
    assert_eq!(micros.len(), 200, "PEEKs in the slow log");
    let median = median(&micros);
    assert!(
        median < 40,
        "median PEEK on a log of 60,000 expired entries: {median} µs of server time (the \
         first {} µs)",
        micros[0]
    );
}

/// The commands of an AOF file (RESP arrays of bulk strings), in order.
fn aof_commands(data: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line<'a>(data: &'a [u8], at: &mut usize) -> &'a [u8] {
        let end = *at + data[*at..].windows(2).position(|w| w == b"\r\n").unwrap();
        let l = &data[*at..end];
        *at = end + 2;
        l
    }
    let number = |l: &[u8]| -> usize { std::str::from_utf8(&l[1..]).unwrap().parse().unwrap() };
    let mut at = 0;
    let mut commands = Vec::new();
    while at < data.len() {
        let n = number(line(data, &mut at));
        let mut words = Vec::new();
        for _ in 0..n {
            let len = number(line(data, &mut at));
            words.push(data[at..at + len].to_vec());
            at += len + 2;
        }
        commands.push(words);
    }
    commands
}

/// The last `RL.APPLY` blob the AOF under `dir` holds for each key.
fn applied_blobs(dir: &Path) -> std::collections::HashMap<String, Vec<u8>> {
    let mut blobs = std::collections::HashMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir.join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    files.sort();
    for file in files {
        for words in aof_commands(&std::fs::read(file).unwrap()) {
            if let [name, key, blob] = &words[..] {
                if name == b"RL.APPLY" {
                    blobs.insert(String::from_utf8(key.clone()).unwrap(), blob.clone());
                }
            }
        }
    }
    blobs
}

fn resp(words: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        out.extend_from_slice(w);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[test]
fn forged_compact_effects_in_the_aof_are_refused_and_real_ones_load_exactly() {
    // The compact effect (tag 0x92) carries no expiry: the reader derives it. The master's
    // own compact blobs, replayed by a fresh server from an AOF, give its bytes and expiries
    // exactly; forged ones (truncated, a byte too many, overlong or 11-byte varints, tags
    // and events that do not exist, an older version, prefixes the form does not take) are
    // each refused with a named error, write nothing, and do not stop the load.
    let master = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut m = master.conn();
    rl(&mut m, &["RL.GCRA", "g", "5", "1", "600", "QUANTITY", "2"]);
    rl(&mut m, &["RL.WINDOW", "f", "5", "600", "FIXED"]);
    // A limit and counts of more than 127: two-byte varints.
    rl(
        &mut m,
        &["RL.WINDOW", "s", "300", "600", "SLIDING", "QUANTITY", "200"],
    );
    rl(&mut m, &["RL.WINDOW", "l", "5", "600", "LOG"]);
    let keys = ["g", "f", "s", "l"];
    let expected: Vec<_> = keys.iter().map(|k| snapshot(&mut m, k)).collect();
    let blobs = applied_blobs(master.dir());
    for key in keys {
        assert_eq!(blobs[key][..2], [3, 0x92], "{key}: not the compact form");
    }
    let (g, sl) = (&blobs["g"], &blobs["s"]);
    let last = sl.len() - 1;
    let with = |blob: &[u8], at: usize, byte: u8| {
        let mut v = blob.to_vec();
        v[at] = byte;
        v
    };
    let bad: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", sl[..last].to_vec(), "truncated"),
        ("trailing", [&sl[..], &[0]].concat(), "trailing bytes"),
        (
            "overlong varint",
            [&sl[..last], &[sl[last] | 0x80, 0]].concat(),
            "varint",
        ),
        (
            "eleven-byte varint",
            [&sl[..last], &[0xff; 10][..], &[1]].concat(),
            "varint",
        ),
        ("LOG state tag", with(sl, 3, 4), "tag 4"),
        ("LEASE state tag", with(g, 3, 5), "tag 5"),
        ("unknown event", with(g, 2, 0xee), "event"),
        ("version 2", with(g, 0, 2), "tag 146"),
        (
            "after an event prefix",
            [&[3, 0x91, 1][..], g].concat(),
            "tag 146",
        ),
        (
            "after an expiry prefix",
            [&[3, 0x90][..], &u64::MAX.to_le_bytes()[..7], &[0], g].concat(),
            "tag 146",
        ),
    ];
    let dir = tempfile::Builder::new()
        .prefix("redis-rl-test-")
        .tempdir()
        .unwrap();
    let mut aof = resp(&[b"SELECT", b"0"]);
    for key in keys {
        aof.extend(resp(&[
            b"RL.APPLY",
            format!("ok:{key}").as_bytes(),
            &blobs[key],
        ]));
    }
    for (label, blob, _) in &bad {
        aof.extend(resp(&[
            b"RL.APPLY",
            format!("bad:{label}").as_bytes(),
            blob,
        ]));
    }
    aof.extend(resp(&[b"SET", b"marker", b"loaded"]));
    std::fs::write(dir.path().join("appendonly.aof"), aof).unwrap();
    let replay = Server::builder().dir(dir).arg("appendonly", "yes").start();
    let mut c = replay.conn();
    assert_eq!(q::<String>(&mut c, &["GET", "marker"]), "loaded");
    for (key, expected) in keys.iter().zip(&expected) {
        assert_eq!(&snapshot(&mut c, &format!("ok:{key}")), expected, "{key}");
    }
    // One log line per refused effect, in the file's order, naming what is wrong.
    let log = replay.log();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("invalid limiter state"))
        .collect();
    assert_eq!(refusals.len(), bad.len(), "{log}");
    for ((label, _, why), line) in bad.iter().zip(&refusals) {
        assert_eq!(
            q::<i64>(&mut c, &["EXISTS", &format!("bad:{label}")]),
            0,
            "{label}"
        );
        assert!(line.contains(why), "{label}: '{line}' does not say '{why}'");
    }
}
