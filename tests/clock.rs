//! The server's real-time clock stepped on a live server (the LD_PRELOAD shim of
//! tests/support/clock_shim.c): a step back never admits more than the limit, retry times
//! stay honest across it, and a clock near the end of 64-bit time is named as the cause of
//! an overflow. Every algorithm.

mod common;

use common::{err_s, rl, Clock, Server};

/// One hour, in µs (the shim's unit).
const HOUR_US: i64 = 3_600_000_000;

/// Each algorithm limited to 5 requests per 60 s, on its own key.
const LIMITS: &[(&str, &[&str])] = &[
    ("GCRA", &["RL.GCRA", "step:gcra", "5", "5", "60"]),
    ("FIXED", &["RL.WINDOW", "step:fixed", "5", "60", "FIXED"]),
    (
        "SLIDING",
        &["RL.WINDOW", "step:sliding", "5", "60", "SLIDING"],
    ),
    ("LOG", &["RL.WINDOW", "step:log", "5", "60", "LOG"]),
];

fn admitted(c: &mut redis::Connection, cmd: &[&str], tries: usize) -> usize {
    (0..tries).filter(|_| rl(c, cmd)[0] == 1).count()
}

#[test]
fn clock_stepping_back_never_admits_more_than_the_limit() {
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return;
    }
    for (name, cmd) in LIMITS {
        clock.step_to(0);
        assert_eq!(admitted(&mut c, cmd, 3), 3, "{name}: first 3");
        // The clock steps back an hour: at most the 2 left of the limit.
        clock.step_to(-HOUR_US);
        let during = admitted(&mut c, cmd, 10);
        // The clock is corrected: nothing more within the same minute.
        clock.step_to(0);
        let after = admitted(&mut c, cmd, 10);
        assert!(
            3 + during + after <= 5,
            "{name}: {} admitted within a second (3 + {during} during the step + {after} after)",
            3 + during + after
        );
    }
}

#[test]
fn retry_after_stays_honest_across_a_step_back() {
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return;
    }
    for (name, cmd) in LIMITS {
        clock.step_to(0);
        admitted(&mut c, cmd, 5);
        clock.step_to(-HOUR_US);
        let reply = rl(&mut c, cmd);
        assert_eq!(reply[0], 0, "{name}: exhausted before the step");
        let retry_ms = reply[3];
        // The stored state is an hour in the future: the same request is denied for about
        // an hour, and the reply says so.
        assert!(
            retry_ms > 3_600_000,
            "{name}: retry_after_ms {retry_ms} names a time it would still be denied"
        );
        // Just before the named time: still denied; just after: admitted.
        clock.step_to(-HOUR_US + retry_ms * 1000 - 200_000);
        assert_eq!(rl(&mut c, cmd)[0], 0, "{name}: admitted before retry_after");
        clock.step_to(-HOUR_US + retry_ms * 1000 + 200_000);
        assert_eq!(rl(&mut c, cmd)[0], 1, "{name}: denied after retry_after");
    }
}

#[test]
fn an_overflow_caused_by_the_clock_names_the_clock() {
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return;
    }
    // Move the clock to within 5 years of the end of 64-bit nanoseconds (the year 2554).
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let five_years_us = 5 * 365 * 24 * HOUR_US;
    let late_us = (u64::MAX / 1000) as i64 - five_years_us;
    clock.step_to(late_us - now_us);
    // The next ten-year window ends past 2554: the clock, not the request, is to blame.
    let e = err_s(&mut c, &["RL.WINDOW", "late", "10", "315360000", "SLIDING"]);
    assert!(e.contains("server's clock"), "{e}");
    assert!(!e.contains("QUANTITY"), "{e}");
    // A short GCRA still works at that hour.
    assert_eq!(rl(&mut c, &["RL.GCRA", "late:gcra", "1", "1", "1"])[0], 1);
}
