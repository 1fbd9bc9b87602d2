//! Limits are validated values with the module's rules and messages: each bad limit is
//! refused when built with the text a real server with the module answers for the same
//! arguments (and the fallback library too).

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::Duration;

use redis_rl_client::{Algorithm, Gcra, InvalidLimit, Lease, Limit, Window};
use support::Kind;

/// The server's error text for `RL.GCRA grammar <args>` (without `ERR `).
fn server_error(con: &mut redis::Connection, kind: Kind, args: &[&str]) -> String {
    let mut cmd = kind.command("gcra", "grammar");
    for a in args {
        cmd.arg(*a);
    }
    let e = cmd
        .query::<redis::Value>(con)
        .expect_err("the server must refuse it");
    e.detail().unwrap_or_default().to_owned()
}

#[test]
fn period_grammar_and_messages_match_the_server() {
    for kind in [Kind::Module, Kind::Fallback] {
        let server = kind.server();
        let mut con = server.conn();
        if kind == Kind::Fallback {
            let _: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(redis_rl_client::LUA_LIBRARY)
                .query(&mut con)
                .unwrap();
        }
        for text in [
            "1e3",
            "-1",
            "+1",
            "0x10",
            "inf",
            "nan",
            "1,5",
            ".5",
            "5.",
            "",
            "0",
            "1.0000000001",
            "315360000.000000001",
            " 1",
        ] {
            let ours = Gcra::new(1, 1, text).unwrap_err();
            assert_eq!(
                ours.message(),
                server_error(&mut con, kind, &["1", "1", text]),
                "{kind:?} {text:?}"
            );
        }
        let cases: [(&[&str], InvalidLimit); 3] = [
            (&["0", "1", "1"], Gcra::new(0, 1, 1).unwrap_err()),
            (
                &["1", "3", "0.000000001"],
                Gcra::new(1, 3, "0.000000001").unwrap_err(),
            ),
            (
                &["9223372036854775808", "1", "4"],
                Gcra::new(1 << 63, 1, 4).unwrap_err(),
            ),
        ];
        for (args, ours) in cases {
            assert_eq!(
                ours.message(),
                server_error(&mut con, kind, args),
                "{kind:?} {args:?}"
            );
        }
    }
}

#[test]
fn bad_limits_fail_when_built() {
    let cases: Vec<(Result<Limit, InvalidLimit>, &str)> = vec![
        (
            Gcra::new(0, 1, 1).map(Into::into),
            "burst must be a positive integer",
        ),
        (
            Gcra::new(1, 0, 1).map(Into::into),
            "rate must be a positive integer",
        ),
        (
            Gcra::new(1, 3, "0.000000001").map(Into::into),
            "rate is too high for period",
        ),
        (
            Gcra::new(1 << 63, 1, 4).map(Into::into),
            "burst is too large",
        ),
        (
            Gcra::new(1, 1, -1).map(Into::into),
            "period must be seconds as a plain decimal",
        ),
        (
            Gcra::new(1, 1, f64::NAN).map(Into::into),
            "period must be seconds",
        ),
        (
            Window::sliding(1, 0).map(Into::into),
            "window must be seconds as a plain decimal",
        ),
        (
            Window::sliding(0, 1).map(Into::into),
            "limit must be a positive integer",
        ),
        (
            Lease::new(1, "1e3").map(Into::into),
            "lease must be seconds as a plain decimal",
        ),
        (
            Lease::new(1, Duration::ZERO).map(Into::into),
            "lease must be seconds",
        ),
        (
            Gcra::new(1, 1, 1)
                .and_then(|g| g.named("bad\"\n"))
                .map(Into::into),
            "name must be",
        ),
    ];
    for (got, message) in cases {
        let e = got.expect_err(message);
        assert!(e.message().starts_with(message), "{e} / {message}");
    }
    let e = "HOURLY".parse::<Algorithm>().unwrap_err();
    assert_eq!(
        e.message(),
        "algorithm must be FIXED, SLIDING or LOG, not 'HOURLY'"
    );
    assert_eq!("log".parse::<Algorithm>().unwrap(), Algorithm::Log);
}

#[test]
fn durations_and_windows() {
    let g = Gcra::new(10, 3, 1).unwrap();
    assert_eq!(g.emission_interval(), Duration::from_nanos(333_333_333));
    let l: Limit = g.into();
    assert_eq!(l.policy_window(), Some(Duration::from_nanos(3_333_333_330)));
    assert_eq!(
        Limit::from(Window::sliding(5, 60).unwrap()).policy_window(),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        Lease::new(3, "0.5").unwrap().lease(),
        Duration::from_millis(500)
    );
    assert_eq!(
        redis_rl_client::tag("user42", &["api"]).unwrap(),
        "{user42}:api"
    );
    assert_eq!(
        Limit::from(Gcra::new(10, 5, "0.5").unwrap()).spec(),
        ["GCRA", "10", "5", "0.5"]
    );
    assert_eq!(
        Limit::from(Window::new(5, 60, Algorithm::Log).unwrap()).args(),
        ["5", "60", "LOG"]
    );
}

#[test]
fn limits_are_values() {
    assert_eq!(Gcra::new(1, 1, 60).unwrap(), Gcra::new(1, 1, "60").unwrap());
    assert_eq!(
        Gcra::new(1, 1, 60).unwrap(),
        Gcra::new(1, 1, Duration::from_secs(60)).unwrap()
    );
    let set: std::collections::HashSet<Limit> = [
        Window::sliding(1, 1).unwrap().into(),
        Window::sliding(1, "1").unwrap().into(),
        Window::new(1, 1, Algorithm::Fixed).unwrap().into(),
    ]
    .into_iter()
    .collect();
    assert_eq!(set.len(), 2);
    assert_ne!(
        Gcra::new(1, 1, 1).unwrap(),
        Gcra::new(1, 1, 1).unwrap().named("api").unwrap()
    );
}
