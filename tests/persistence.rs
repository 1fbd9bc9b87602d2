//! The native type through the server's persistence machinery: RDB, AOF (plain and
//! rewritten), DEBUG RELOAD, DUMP/RESTORE, COPY, MEMORY USAGE, and the golden RDB fixture.

mod common;

use std::time::Duration;

use common::{info_field, q, rl, snapshot, wait_until, Server};

/// Keys written by [`workload`], with their expected allowed count.
const KEYS: &[&str] = &[
    "a",
    "b",
    "c",
    "{tag}d",
    "e:\u{00e9}",
    "wf",
    "ws",
    "wl",
    "wl2",
];

/// A mixed GCRA workload with long periods (nothing expires during a test).
fn workload(c: &mut redis::Connection) {
    rl(c, &["RL.GCRA", "a", "5", "1", "100"]);
    rl(c, &["RL.GCRA", "a", "5", "1", "100", "QUANTITY", "3"]);
    rl(c, &["RL.GCRA", "b", "1", "1", "3600"]);
    rl(c, &["RL.GCRA", "b", "1", "1", "3600"]); // denied
    rl(c, &["RL.GCRA", "c", "100", "7", "0.5", "QUANTITY", "90"]);
    rl(
        c,
        &["RL.GCRA", "{tag}d", "10", "3", "86400", "QUANTITY", "10"],
    );
    rl(c, &["RL.GCRA", "e:\u{00e9}", "2", "1", "1000.123456789"]);
    rl(
        c,
        &["RL.WINDOW", "wf", "5", "3600", "FIXED", "QUANTITY", "5"],
    );
    rl(
        c,
        &["RL.WINDOW", "ws", "7", "3600", "SLIDING", "QUANTITY", "7"],
    );
    for _ in 0..20 {
        rl(c, &["RL.WINDOW", "wl", "20", "3600", "LOG"]);
    }
    rl(
        c,
        &["RL.WINDOW", "wl2", "50", "3600", "LOG", "QUANTITY", "3"],
    );
    rl(
        c,
        &["RL.WINDOW", "wl2", "50", "3600", "LOG", "QUANTITY", "4"],
    );
}

fn snapshots(c: &mut redis::Connection) -> Vec<(Option<Vec<u8>>, i64)> {
    KEYS.iter().map(|k| snapshot(c, k)).collect()
}

fn assert_still_limits(c: &mut redis::Connection) {
    // "b" is at its limit for an hour, "{tag}d" for a day: still denied after the restart.
    assert_eq!(rl(c, &["RL.GCRA", "b", "1", "1", "3600"])[0], 0);
    assert_eq!(rl(c, &["RL.GCRA", "{tag}d", "10", "3", "86400"])[0], 0);
    let a = rl(c, &["RL.GCRA", "a", "5", "1", "100", "QUANTITY", "0"]);
    assert_eq!(&a[..3], &[1, 5, 1]);
    for (key, limit, algo) in [
        ("wf", "5", "FIXED"),
        ("ws", "7", "SLIDING"),
        ("wl", "20", "LOG"),
    ] {
        assert_eq!(
            rl(c, &["RL.WINDOW", key, limit, "3600", algo])[0],
            0,
            "{key}"
        );
    }
    assert_eq!(
        rl(
            c,
            &["RL.WINDOW", "wl2", "50", "3600", "LOG", "QUANTITY", "0"]
        )[2],
        43
    );
}

#[test]
fn save_and_restart_keep_state_and_expiry() {
    let mut s = Server::start();
    let mut c = s.conn();
    workload(&mut c);
    let before = snapshots(&mut c);
    q::<()>(&mut c, &["SAVE"]);
    s.kill();
    s.restart();
    let mut c = s.conn();
    assert_eq!(snapshots(&mut c), before);
    assert_still_limits(&mut c);
}

#[test]
fn debug_reload_keeps_state() {
    let s = Server::start();
    let mut c = s.conn();
    workload(&mut c);
    let before = snapshots(&mut c);
    let digest_before: String = q(&mut c, &["DEBUG", "DIGEST"]);
    q::<()>(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(snapshots(&mut c), before);
    assert_eq!(q::<String>(&mut c, &["DEBUG", "DIGEST"]), digest_before);
    assert_still_limits(&mut c);
}

#[test]
fn aof_always_survives_sigkill() {
    let mut s = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = s.conn();
    workload(&mut c);
    let before = snapshots(&mut c);
    s.kill();
    s.restart();
    let mut c = s.conn();
    assert_eq!(snapshots(&mut c), before);
    assert_still_limits(&mut c);
}

#[test]
fn bgrewriteaof_then_restart_keeps_state() {
    let mut s = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("aof-use-rdb-preamble", "no")
        .start();
    let mut c = s.conn();
    workload(&mut c);
    let before = snapshots(&mut c);
    q::<String>(&mut c, &["BGREWRITEAOF"]);
    wait_until("the AOF rewrite", Duration::from_secs(20), || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    // The rewritten base file holds our effect command (the type's aof_rewrite callback).
    let aof_dir = s.dir().join("appendonlydir");
    let base = std::fs::read_dir(&aof_dir)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().contains(".base.aof"))
        .expect("a base AOF file");
    let text = std::fs::read(base.path()).unwrap();
    assert!(
        text.windows(8).any(|w| w == b"RL.APPLY"),
        "base AOF lacks RL.APPLY"
    );
    s.kill();
    s.restart();
    let mut c = s.conn();
    assert_eq!(snapshots(&mut c), before);
    assert_still_limits(&mut c);
}

#[test]
fn dump_restore_and_copy_are_exact() {
    let s = Server::start();
    let mut c = s.conn();
    workload(&mut c);
    for key in KEYS {
        let (dump, expire_at) = snapshot(&mut c, key);
        let dump = dump.unwrap();
        let digest: Vec<String> = q(&mut c, &["DEBUG", "DIGEST-VALUE", key]);
        let restored = format!("restored:{key}");
        redis::cmd("RESTORE")
            .arg(&restored)
            .arg(expire_at)
            .arg(&dump)
            .arg("ABSTTL")
            .query::<()>(&mut c)
            .unwrap();
        assert_eq!(
            snapshot(&mut c, &restored),
            (Some(dump.clone()), expire_at),
            "{key}"
        );
        assert_eq!(
            q::<Vec<String>>(&mut c, &["DEBUG", "DIGEST-VALUE", &restored]),
            digest,
            "{key}"
        );
        let copied = format!("copied:{key}");
        q::<i64>(&mut c, &["COPY", key, &copied]);
        assert_eq!(snapshot(&mut c, &copied), (Some(dump), expire_at), "{key}");
    }
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "restored:b", "1", "1", "3600"])[0],
        0
    );
    assert_eq!(
        rl(&mut c, &["RL.WINDOW", "restored:wl", "20", "3600", "LOG"])[0],
        0
    );
    // A copy is independent: writing one leaves the other alone.
    for (key, args) in [
        ("a", vec!["RL.GCRA", "copied:a", "5", "1", "100"]),
        ("wl2", vec!["RL.WINDOW", "copied:wl2", "50", "3600", "LOG"]),
    ] {
        let before = snapshot(&mut c, key);
        rl(&mut c, &args);
        assert_eq!(snapshot(&mut c, key), before);
        assert_ne!(snapshot(&mut c, &format!("copied:{key}")), before);
    }
}

#[test]
fn memory_usage_reports_the_value() {
    let s = Server::start();
    let mut c = s.conn();
    workload(&mut c);
    let bytes: i64 = q(&mut c, &["MEMORY", "USAGE", "a"]);
    assert!(bytes > 24 && bytes < 200, "MEMORY USAGE a = {bytes}");
}

const FIXTURE_KEY: &str = "fixture:gcra";

fn start_with_fixture(name: &str) -> Server {
    let dir = tempfile::Builder::new()
        .prefix("redis-rl-fixture-")
        .tempdir()
        .unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::copy(&fixture, dir.path().join("dump.rdb")).unwrap();
    Server::builder().dir(dir).start()
}

#[test]
fn golden_v2_rdb_fixture_still_loads() {
    // tests/fixtures/v2-all.rdb was written by encoding version 2, with ten-year windows and
    // PERSIST on every key (so the file never expires): see tests/fixtures/README.md.
    let s = start_with_fixture("v2-all.rdb");
    let mut c = s.conn();
    let r = rl(
        &mut c,
        &[
            "RL.GCRA",
            "fixture:gcra",
            "3",
            "1",
            "315360000",
            "QUANTITY",
            "0",
        ],
    );
    assert_eq!(&r[..3], &[1, 3, 1]);
    let r = rl(
        &mut c,
        &[
            "RL.WINDOW",
            "fixture:log",
            "5",
            "315360000",
            "LOG",
            "QUANTITY",
            "0",
        ],
    );
    assert_eq!(&r[..3], &[1, 5, 2]);
    assert_eq!(
        rl(
            &mut c,
            &[
                "RL.WINDOW",
                "fixture:log",
                "5",
                "315360000",
                "LOG",
                "QUANTITY",
                "3"
            ]
        )[0],
        0
    );
    // FIXED and SLIDING counts belong to the window they were made in; they load and answer.
    let r = rl(
        &mut c,
        &[
            "RL.WINDOW",
            "fixture:fixed",
            "4",
            "315360000",
            "FIXED",
            "QUANTITY",
            "0",
        ],
    );
    assert_eq!(r[1], 4);
    let r = rl(
        &mut c,
        &[
            "RL.WINDOW",
            "fixture:sliding",
            "6",
            "315360000",
            "SLIDING",
            "QUANTITY",
            "0",
        ],
    );
    assert_eq!(r[1], 6);
    let dump: Vec<u8> = q(&mut c, &["DUMP", "fixture:log"]);
    assert!(dump.len() > 50);
}

#[test]
fn golden_v3_rdb_fixture_still_loads() {
    // tests/fixtures/v3-leases.rdb was written by encoding version 3 (LEASE states, counts
    // past the limit from FORCE), ten-year periods, PERSIST on every key: see
    // tests/fixtures/README.md.
    let s = start_with_fixture("v3-leases.rdb");
    let mut c = s.conn();
    let lease = |c: &mut redis::Connection, token: &str, qty: &str| {
        rl(
            c,
            &[
                "RL.LEASE",
                "fixture:lease",
                "5",
                "315360000",
                token,
                "QUANTITY",
                qty,
            ],
        )
    };
    // job-a holds 2 slots and job-b 1 until 2036: 2 of 5 remain.
    assert_eq!(lease(&mut c, "job-c", "0")[..3], [1, 5, 2]);
    assert_eq!(lease(&mut c, "job-c", "3")[0], 0);
    let released: Vec<i64> = q(&mut c, &["RL.RELEASE", "fixture:lease", "job-a"]);
    assert_eq!(released[..2], [2, 4]);
    // GCRA forced 5 past a burst of 3: over its burst for decades.
    let r = rl(
        &mut c,
        &[
            "RL.GCRA",
            "fixture:gcra",
            "3",
            "1",
            "315360000",
            "QUANTITY",
            "0",
        ],
    );
    assert_eq!(r[..3], [1, 3, 0]);
    let r = rl(
        &mut c,
        &[
            "RL.WINDOW",
            "fixture:log",
            "5",
            "315360000",
            "LOG",
            "QUANTITY",
            "0",
        ],
    );
    assert_eq!(r[..3], [1, 5, 2]);
    for (key, limit, algo) in [
        ("fixture:fixed", "4", "FIXED"),
        ("fixture:sliding", "6", "SLIDING"),
    ] {
        let r = rl(
            &mut c,
            &["RL.WINDOW", key, limit, "315360000", algo, "QUANTITY", "0"],
        );
        assert_eq!(r[1].to_string(), limit, "{key}");
    }
}

#[test]
fn golden_v1_rdb_fixture_still_loads() {
    // tests/fixtures/v1-gcra.rdb was written by the first release (encoding version 1):
    // RL.GCRA fixture:gcra 3 1 315360000 QUANTITY 2, then PERSIST (so it never expires), SAVE.
    let s = start_with_fixture("v1-gcra.rdb");
    let mut c = s.conn();
    assert_eq!(q::<i64>(&mut c, &["EXISTS", FIXTURE_KEY]), 1);
    let r = rl(
        &mut c,
        &[
            "RL.GCRA",
            FIXTURE_KEY,
            "3",
            "1",
            "315360000",
            "QUANTITY",
            "0",
        ],
    );
    // Two of three used at one per ten years: one remains, and it stays so until 2046.
    assert_eq!(&r[..3], &[1, 3, 1]);
    assert!(r[4] > 0);
    let r = rl(
        &mut c,
        &[
            "RL.GCRA",
            FIXTURE_KEY,
            "3",
            "1",
            "315360000",
            "QUANTITY",
            "2",
        ],
    );
    assert_eq!(r[0], 0);
}
