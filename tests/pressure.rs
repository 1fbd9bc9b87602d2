//! What an operator meets under pressure, over the wire: LOG work that does not grow with the
//! log (a lowered limit during an attack, one log read through two windows), memory that
//! comes back after large values are dumped and deleted, and a server out of memory where
//! the limiter still denies.

mod common;

use common::{
    err_s, info_field, median, now_ns, q, rl, slowlog_start, slowlog_times, snapshot, Clock, Dump,
    Server,
};

/// Records `n` requests on a LOG key (limit 100,000 per hour), pipelined, one instant each
/// as far as the clock's microseconds allow.
fn fill_log(c: &mut redis::Connection, key: &str, n: usize) {
    for _ in 0..n / 1000 {
        let mut pipe = redis::pipe();
        for _ in 0..1000 {
            pipe.cmd("RL.WINDOW")
                .arg(key)
                .arg(100_000)
                .arg(3600)
                .arg("LOG")
                .ignore();
        }
        pipe.query::<()>(c).unwrap();
    }
}

/// Codec bytes (encoding version 2) of a LOG of `n` requests one microsecond apart, ending
/// now, in a one-hour window: about 3 bytes a request.
fn big_log_state(n: u64) -> Vec<u8> {
    let last = now_ns() / 1000 * 1000;
    let first = last - (n - 1) * 1000;
    let mut entries = vec![1u8];
    for _ in 1..n {
        entries.extend_from_slice(&[0xe8, 0x07, 1]); // delta 1000 ns (LEB128), count 1
    }
    let mut v = vec![2u8, 4];
    for f in [
        3_600_000_000_000,
        100_000,
        first,
        last,
        n,
        entries.len() as u64,
    ] {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v.extend_from_slice(&entries);
    v
}

fn used_memory(c: &mut redis::Connection) -> i64 {
    info_field(c, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory")
}

#[test]
fn a_log_denial_costs_the_same_whatever_the_log_holds() {
    let s = Server::start();
    let mut c = s.conn();
    fill_log(&mut c, "hot", 100_000);
    // The limit is lowered during an attack: every call is denied, and each must cost what a
    // denial on a small log costs (a few µs of server time), not a walk of the 99,000
    // requests over the new limit (hundreds). The median of the server's own times: a mean
    // (or a client's clock) also counts the calls a busy machine stalled.
    slowlog_start(&mut c, 4000);
    for _ in 0..2000 {
        let reply = rl(&mut c, &["RL.WINDOW", "hot", "1000", "3600", "LOG"]);
        assert_eq!(reply[0], 0);
        assert!(reply[3] > 3_590_000, "{reply:?}");
    }
    let times = slowlog_times(&mut c, "RL.WINDOW");
    assert_eq!(times.len(), 2000);
    let per_call = median(&times);
    assert!(
        per_call < 100,
        "a denial on a 100,000-request log costs {per_call} µs of server time (median)"
    );
}

#[test]
fn reading_one_log_through_two_windows_costs_no_more_than_through_one() {
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return;
    }
    // Half the log 30 minutes old, half now: the last minute's cutoff lies inside the log,
    // the last hour's before it.
    clock.step_to(-1_800_000_000);
    fill_log(&mut c, "two", 50_000);
    clock.step_to(0);
    fill_log(&mut c, "two", 50_000);
    slowlog_start(&mut c, 4000);
    for _ in 0..1000 {
        let minute = rl(
            &mut c,
            &["RL.WINDOW", "two", "100000", "60", "LOG", "QUANTITY", "0"],
        );
        let hour = rl(
            &mut c,
            &["RL.WINDOW", "two", "100000", "3600", "LOG", "QUANTITY", "0"],
        );
        assert_eq!(minute[2], 50_000, "{minute:?}");
        assert_eq!(hour[2], 0, "{hour:?}");
    }
    // Server time, median: a read that walked the 50,000 requests between the two cutoffs
    // each time would cost hundreds of µs.
    let times = slowlog_times(&mut c, "RL.WINDOW");
    assert_eq!(times.len(), 2000);
    let per_call = median(&times);
    assert!(
        per_call < 100,
        "reads alternating two windows cost {per_call} µs each (median of the server's times)"
    );
}

#[test]
fn memory_comes_back_after_dump_digest_del_and_flushall() {
    let s = Server::start();
    let big_state = big_log_state(100_000);
    let baseline = {
        // Warm up: the same server paths with a plain string of the same size (RESTORE,
        // DUMP, DIGEST, SAVE, DEL: the server keeps some of that memory for reuse), and one
        // small key of each kind, so that whatever is allocated once is in the baseline.
        let mut c = s.conn();
        let plain = vec![b'x'; big_state.len()];
        redis::cmd("SET")
            .arg("plain")
            .arg(&plain)
            .query::<()>(&mut c)
            .unwrap();
        let dumped: Vec<u8> = q(&mut c, &["DUMP", "plain"]);
        redis::cmd("RESTORE")
            .arg("plain2")
            .arg(0)
            .arg(dumped)
            .query::<()>(&mut c)
            .unwrap();
        let _: Vec<String> = q(&mut c, &["DEBUG", "DIGEST-VALUE", "plain"]);
        q::<()>(&mut c, &["SAVE"]);
        q::<i64>(&mut c, &["DEL", "plain", "plain2"]);
        rl(&mut c, &["RL.GCRA", "warm:g", "5", "1", "1"]);
        rl(&mut c, &["RL.WINDOW", "warm:l", "5", "1", "LOG"]);
        for k in ["warm:g", "warm:l"] {
            let _: Vec<u8> = q(&mut c, &["DUMP", k]);
        }
        q::<i64>(&mut c, &["DEL", "warm:g", "warm:l"]);
        drop(c);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut c = s.conn();
        used_memory(&mut c)
    };
    {
        let mut c = s.conn();
        // A full LOG at the default cap, one instant per request, dumped, digested and saved.
        rl(&mut c, &["RL.WINDOW", "frame", "5", "60", "LOG"]);
        let frame: Vec<u8> = q(&mut c, &["DUMP", "frame"]);
        let payload = Dump::parse(&frame).with_state(&big_state);
        redis::cmd("RESTORE")
            .arg("big")
            .arg(0)
            .arg(payload)
            .query::<()>(&mut c)
            .unwrap();
        let bytes: i64 = q(&mut c, &["MEMORY", "USAGE", "big"]);
        assert!(bytes > 250_000, "{bytes} bytes");
        let _: Vec<u8> = q(&mut c, &["DUMP", "big"]);
        let _: Vec<String> = q(&mut c, &["DEBUG", "DIGEST-VALUE", "big"]);
        q::<()>(&mut c, &["SAVE"]);
        q::<i64>(&mut c, &["DEL", "big"]);
        // 5,000 distinct GCRA parameter sets, then all keys gone.
        let mut pipe = redis::pipe();
        for i in 0..5000 {
            pipe.cmd("RL.GCRA")
                .arg(format!("p:{i}"))
                .arg(1 + i % 50)
                .arg(1 + i / 50)
                .arg(60)
                .ignore();
        }
        pipe.query::<()>(&mut c).unwrap();
        q::<()>(&mut c, &["FLUSHALL", "SYNC"]);
    }
    // The closed connection's buffers go when the server notices the close: give it up to
    // 20 s (a moment on an idle machine; a loaded one may take longer to schedule it).
    let mut c = s.conn();
    let mut after = used_memory(&mut c);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while after - baseline >= 64 * 1024 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        after = used_memory(&mut c);
    }
    assert!(
        after - baseline < 64 * 1024,
        "used_memory {after} after DEL and FLUSHALL, {baseline} before: {} bytes kept",
        after - baseline
    );
}

#[test]
fn out_of_memory_the_limiter_refuses_writes_and_still_denies() {
    let s = Server::builder()
        .arg("maxmemory-policy", "noeviction")
        .start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "full", "1", "1", "3600"]);
    rl(
        &mut c,
        &["RL.WINDOW", "used", "5", "60", "LOG", "QUANTITY", "3"],
    );
    rl(
        &mut c,
        &["RL.GCRA", "held", "5", "1", "60", "QUANTITY", "2"],
    );
    // Nothing can be written any more.
    q::<()>(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
    let oom = "OOM command not allowed when used memory > 'maxmemory'.";
    for write in [
        &["RL.GCRA", "fresh", "5", "1", "60"][..],
        &["RL.WINDOW", "fresh", "5", "60"],
        &["RL.WINDOW", "used", "5", "60", "LOG"],
        &["RL.ALL", "1", "fresh", "GCRA", "5", "1", "60"],
        &["CL.THROTTLE", "fresh", "4", "1", "60"],
    ] {
        assert_eq!(err_s(&mut c, write), oom, "{write:?}");
    }
    // Denials, reports and refunds answer as usual.
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "full", "1", "1", "3600"])[..3],
        [0, 1, 0]
    );
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "fresh", "5", "1", "60", "PEEK"]),
        [1, 5, 4, -1, 60_000]
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.GCRA", "fresh", "5", "1", "60", "QUANTITY", "0"]
        ),
        [1, 5, 5, -1, 0]
    );
    let denied = rl(
        &mut c,
        &["RL.WINDOW", "used", "5", "60", "LOG", "QUANTITY", "3"],
    );
    assert_eq!(denied[..3], [0, 5, 2]);
    assert!(denied[3] > 60_000 - common::WALL_SLACK_MS, "{denied:?}");
    let refund: Vec<i64> = q(&mut c, &["RL.REFUND", "held", "1"]);
    assert_eq!(refund[..2], [1, 4]);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "fresh"]), 0);
    // Room again: writes go through.
    q::<()>(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(rl(&mut c, &["RL.GCRA", "fresh", "5", "1", "60"])[0], 1);
}

#[test]
fn out_of_memory_follows_maxmemory_however_it_is_set() {
    // The module skips its memory check while `maxmemory` is 0, following the setting
    // through the server's config-change event; these are the ways the setting can change.
    let oom = "OOM command not allowed when used memory > 'maxmemory'.";
    // Set when the server starts: the module reads it as it loads.
    let s = Server::builder()
        .arg("maxmemory", "1")
        .arg("maxmemory-policy", "noeviction")
        .start();
    let mut c = s.conn();
    assert_eq!(err_s(&mut c, &["RL.GCRA", "a", "5", "1", "60"]), oom);
    q::<()>(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(rl(&mut c, &["RL.GCRA", "a", "5", "1", "60"])[0], 1);
    // Set again among other parameters of one CONFIG SET.
    q::<()>(&mut c, &["CONFIG", "SET", "hz", "11", "maxmemory", "1"]);
    assert_eq!(err_s(&mut c, &["RL.GCRA", "b", "5", "1", "60"]), oom);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "b"]), 0);
    drop(c);
    drop(s);

    // CONFIG renamed: the module cannot read the setting, so it checks every write.
    let s = Server::builder()
        .arg("maxmemory", "1")
        .arg("maxmemory-policy", "noeviction")
        .words(&["--rename-command", "CONFIG", "RL-TEST-CONFIG"])
        .start();
    let mut c = s.conn();
    assert_eq!(err_s(&mut c, &["RL.GCRA", "a", "5", "1", "60"]), oom);
    q::<()>(&mut c, &["RL-TEST-CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(rl(&mut c, &["RL.GCRA", "a", "5", "1", "60"])[0], 1);
    q::<()>(&mut c, &["RL-TEST-CONFIG", "SET", "maxmemory", "1"]);
    assert_eq!(err_s(&mut c, &["RL.GCRA", "b", "5", "1", "60"]), oom);
}

#[test]
fn regression_a_write_the_server_would_accept_while_evicting_is_not_refused() {
    // Found by attack testing: under an eviction policy, when the server's eviction pass ran
    // out of its time budget (it goes on in the background and the server still accepts
    // `deny-oom` commands), used memory is briefly above `maxmemory`; the limiter read that
    // as out of memory and answered OOM where SET succeeded in the same instant.
    let s = Server::builder()
        .arg("maxmemory-policy", "allkeys-lru")
        // No time budget: each command's eviction pass frees 16 keys and leaves the rest to
        // the background, so the overshoot below lasts for many commands.
        .arg("maxmemory-eviction-tenacity", "0")
        .start();
    let mut c = s.conn();
    let mut fill = redis::pipe();
    for i in 0..20_000 {
        fill.cmd("SET")
            .arg(format!("fill:{i}"))
            .arg(&[b'x'; 100][..])
            .ignore();
    }
    fill.query::<()>(&mut c).unwrap();
    let target = used_memory(&mut c) - 1_000_000;
    // One packet: the server handles it without returning to its event loop, so no
    // background eviction runs between the commands.
    let writes: &[&[&str]] = &[
        &["RL.GCRA", "g", "5", "1", "60"],
        &["RL.GCRA", "g", "5", "1", "60", "FORCE"],
        &["RL.WINDOW", "w", "5", "60", "FIXED"],
        &["RL.WINDOW", "l", "5", "60", "LOG"],
        &[
            "RL.ALL", "2", "a1", "a2", "GCRA", "5", "1", "60", "WINDOW", "5", "60",
        ],
        &["CL.THROTTLE", "t", "4", "1", "60"],
        &["RL.LEASE", "e", "3", "60", "job"],
    ];
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(target.to_string());
    for write in writes {
        pipe.cmd("SET").arg("plain").arg("v");
        let mut cmd = redis::cmd(write[0]);
        for a in &write[1..] {
            cmd.arg(*a);
        }
        pipe.add_command(cmd);
    }
    let replies: Vec<redis::RedisResult<redis::Value>> = pipe.query(&mut c).unwrap();
    assert!(replies[0].is_ok(), "CONFIG SET: {:?}", replies[0]);
    for (i, write) in writes.iter().enumerate() {
        let set = &replies[1 + 2 * i];
        let limiter = &replies[2 + 2 * i];
        assert!(set.is_ok(), "SET before {write:?}: {set:?}");
        assert!(
            limiter.is_ok(),
            "{write:?} refused where SET was accepted: {limiter:?}"
        );
    }
    let evicted: i64 = info_field(&mut c, "stats", "evicted_keys")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        evicted > 0,
        "the server evicted nothing: not the case under test"
    );
}

#[test]
fn out_of_memory_leases_and_force_record_nothing_and_release_still_answers() {
    let s = Server::builder()
        .arg("maxmemory-policy", "noeviction")
        .arg("notify-keyspace-events", "KA")
        .start();
    let mut c = s.conn();
    rl(&mut c, &["RL.LEASE", "e", "3", "60", "job-1"]);
    rl(
        &mut c,
        &["RL.LEASE", "e", "3", "60", "job-2", "QUANTITY", "2"],
    );
    rl(&mut c, &["RL.GCRA", "g", "5", "1", "60", "QUANTITY", "2"]);
    rl(
        &mut c,
        &["RL.WINDOW", "f", "5", "60", "FIXED", "QUANTITY", "2"],
    );
    rl(
        &mut c,
        &["RL.WINDOW", "s", "5", "60", "SLIDING", "QUANTITY", "2"],
    );
    let unchanged = ["g", "f", "s"];
    let before: Vec<_> = unchanged.iter().map(|k| snapshot(&mut c, k)).collect();
    let mut events = s.conn();
    let mut pubsub = events.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    q::<()>(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
    let oom = "OOM command not allowed when used memory > 'maxmemory'.";
    for write in [
        &["RL.LEASE", "new", "3", "60", "job"][..],
        &["RL.LEASE", "e", "3", "60", "job-1"], // a renewal is a write too
        &["RL.GCRA", "g", "5", "1", "60", "QUANTITY", "9", "FORCE"],
        &[
            "RL.WINDOW",
            "f",
            "5",
            "60",
            "FIXED",
            "QUANTITY",
            "9",
            "FORCE",
        ],
        &["RL.WINDOW", "s", "5", "60", "SLIDING", "FORCE"],
        &["RL.ALL", "1", "g", "GCRA", "5", "1", "60", "FORCE"],
        &[
            "RL.ALL", "2", "g", "new", "GCRA", "5", "1", "60", "LEASE", "3", "60", "job",
        ],
    ] {
        assert_eq!(err_s(&mut c, write), oom, "{write:?}");
    }
    // A lease that finds no free slot, a peek and a report answer as usual.
    let full = rl(&mut c, &["RL.LEASE", "e", "3", "60", "job-3"]);
    assert_eq!(full[..3], [0, 3, 0]);
    assert_eq!(
        rl(&mut c, &["RL.LEASE", "e", "3", "60", "job-3", "PEEK"])[..3],
        [0, 3, 0]
    );
    assert_eq!(
        rl(
            &mut c,
            &["RL.LEASE", "e", "3", "60", "job-3", "QUANTITY", "0"]
        )[..3],
        [1, 3, 0]
    );
    // RL.RELEASE only frees: it answers and writes.
    let released: Vec<i64> = q(&mut c, &["RL.RELEASE", "e", "job-1"]);
    assert_eq!(released[..2], [1, 1]);
    let nothing: Vec<i64> = q(&mut c, &["RL.RELEASE", "e", "nobody"]);
    assert_eq!(nothing[..2], [0, 1]);
    for (key, before) in unchanged.iter().zip(&before) {
        assert_eq!(
            &snapshot(&mut c, key),
            before,
            "{key} changed on an OOM answer"
        );
    }
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "new"]), 0);
    // The only keyspace event is the release's: read up to a marker written once there is
    // room again (no timeout decides what was seen).
    q::<()>(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    q::<()>(&mut c, &["SET", "marker", "1"]);
    let mut seen = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        let payload: String = msg.get_payload().unwrap();
        seen.push(format!("{} {payload}", msg.get_channel_name()));
        if msg.get_channel_name().ends_with(":marker") {
            break;
        }
    }
    assert_eq!(
        seen,
        ["__keyspace@0__:e rl.release", "__keyspace@0__:marker set"]
    );
    assert_eq!(rl(&mut c, &["RL.LEASE", "new", "3", "60", "job"])[0], 1);
}
