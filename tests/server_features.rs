//! How the module presents itself to the server: INFO, COMMAND DOCS, ACL (categories where the
//! server supports them, key patterns everywhere), and a clean refusal of bad loads.

mod common;

use common::{err_s, info_field, q, rl, Server};

#[test]
fn info_rl_counts_calls_outcomes_and_keys() {
    let s = Server::start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "g", "1", "1", "100"]);
    rl(&mut c, &["RL.GCRA", "g", "1", "1", "100"]);
    let _ = err_s(&mut c, &["RL.GCRA", "g", "x", "1", "100"]);
    rl(&mut c, &["RL.WINDOW", "w", "5", "100", "LOG"]);
    rl(&mut c, &["RL.WINDOW", "f", "5", "100", "FIXED"]);
    rl(&mut c, &["CL.THROTTLE", "t", "1", "1", "100"]);
    assert_eq!(
        info_field(&mut c, "rl", "rl_gcra").as_deref(),
        Some("calls=3,allowed=1,denied=1,errors=1")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_window").as_deref(),
        Some("calls=2,allowed=2,denied=0,errors=0")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_throttle").as_deref(),
        Some("calls=1,allowed=1,denied=0,errors=0")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_gcra_keys").as_deref(),
        Some("2")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_log_keys").as_deref(),
        Some("1")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_fixed_keys").as_deref(),
        Some("1")
    );
    q::<()>(&mut c, &["FLUSHALL", "SYNC"]);
    assert_eq!(
        info_field(&mut c, "rl", "rl_gcra_keys").as_deref(),
        Some("0")
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_log_keys").as_deref(),
        Some("0")
    );
}

#[test]
fn command_docs_describe_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    for (cmd, words) in [
        (
            "RL.GCRA",
            &["burst", "rate", "period", "QUANTITY", "PEEK", "MAXWAIT"][..],
        ),
        (
            "RL.WINDOW",
            &[
                "limit", "window", "FIXED", "SLIDING", "LOG", "QUANTITY", "PEEK",
            ][..],
        ),
        (
            "RL.ALL",
            &[
                "numkeys", "spec", "QUANTITY", "PEEK", "FORCE", "COST", "LEASE",
            ][..],
        ),
        ("RL.REFUND", &["quantity"][..]),
        (
            "RL.LEASE",
            &["limit", "lease", "token", "QUANTITY", "PEEK", "RENEW"][..],
        ),
        ("RL.RELEASE", &["token"][..]),
        (
            "CL.THROTTLE",
            &["max_burst", "count_per_period", "period"][..],
        ),
    ] {
        let docs: redis::Value = q(&mut c, &["COMMAND", "DOCS", cmd]);
        let text = format!("{docs:?}");
        assert!(
            text.contains("summary") && text.contains("complexity"),
            "{cmd}: {text}"
        );
        for w in words {
            assert!(text.contains(w), "{cmd} docs lack {w}: {text}");
        }
        let info: redis::Value = q(&mut c, &["COMMAND", "INFO", cmd]);
        assert!(format!("{info:?}").contains("write"), "{cmd}");
    }
}

#[test]
fn acl_categories_where_the_server_supports_them() {
    let s = Server::start();
    let mut c = s.conn();
    let version: String = info_field(&mut c, "server", "redis_version").unwrap();
    let valkey = info_field(&mut c, "server", "valkey_version").is_some();
    let cat: redis::RedisResult<Vec<String>> =
        redis::cmd("ACL").arg("CAT").arg("ratelimit").query(&mut c);
    if valkey || version.as_str() >= "7.4" {
        let mut cmds = cat.expect("@ratelimit exists");
        cmds.sort();
        assert_eq!(
            cmds,
            vec![
                "CL.THROTTLE",
                "RL.ALL",
                "RL.GCRA",
                "RL.LEASE",
                "RL.REFUND",
                "RL.RELEASE",
                "RL.WINDOW"
            ]
        );
        let write: Vec<String> = q(&mut c, &["ACL", "CAT", "write"]);
        assert!(write.iter().any(|w| w == "RL.GCRA"));
    } else {
        // Redis 7.0 has no API for module ACL categories: the module registers none.
        assert!(cat.is_err(), "Redis {version} should not know @ratelimit");
    }
}

#[test]
fn acl_key_patterns_apply_to_every_command() {
    let s = Server::start();
    let mut admin = s.conn();
    q::<()>(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "limiter",
            "on",
            ">pw",
            "~rl:*",
            "+rl.gcra",
            "+rl.window",
            "+rl.all",
            "+rl.refund",
            "+cl.throttle",
            "+rl.lease",
            "+rl.release",
        ],
    );
    let client = redis::Client::open(format!("redis://limiter:pw@127.0.0.1:{}/", s.port)).unwrap();
    let mut c = client.get_connection().unwrap();
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &["RL.GCRA", "rl:a", "1", "1", "10"],
            &["RL.GCRA", "other", "1", "1", "10"],
        ),
        (
            &["RL.WINDOW", "rl:b", "1", "10"],
            &["RL.WINDOW", "other", "1", "10"],
        ),
        (
            &[
                "RL.ALL", "2", "rl:c", "rl:d", "GCRA", "1", "1", "1", "WINDOW", "1", "1",
            ],
            &[
                "RL.ALL", "2", "rl:c", "other", "GCRA", "1", "1", "1", "WINDOW", "1", "1",
            ],
        ),
        (&["RL.REFUND", "rl:a", "1"], &["RL.REFUND", "other", "1"]),
        (
            &["CL.THROTTLE", "rl:e", "1", "1", "10"],
            &["CL.THROTTLE", "other", "1", "1", "10"],
        ),
        (
            &["RL.LEASE", "rl:f", "1", "10", "t"],
            &["RL.LEASE", "other", "1", "10", "t"],
        ),
        (&["RL.RELEASE", "rl:f", "t"], &["RL.RELEASE", "other", "t"]),
    ];
    for (ok, denied) in cases {
        let _: redis::Value = {
            let mut cmd = redis::cmd(ok[0]);
            for a in &ok[1..] {
                cmd.arg(*a);
            }
            cmd.query(&mut c).unwrap_or_else(|e| panic!("{ok:?}: {e}"))
        };
        let e = err_s(&mut c, denied);
        assert!(e.starts_with("NOPERM"), "{denied:?}: {e}");
    }
    assert!(err_s(&mut c, &["GET", "rl:a"]).starts_with("NOPERM"));
    assert_eq!(q::<i64>(&mut admin, &["EXISTS", "other"]), 0);
}

#[test]
fn unsupported_server_or_duplicate_load_is_refused_cleanly() {
    let s = Server::start();
    let mut c = s.conn();
    let path = common::module_path();
    let e = err_s(&mut c, &["MODULE", "LOAD", path.to_str().unwrap()]);
    assert!(e.starts_with("ERR"), "{e}");
    assert!(
        s.log().contains("a module named 'rl' is already loaded"),
        "{}",
        s.log()
    );
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
}
