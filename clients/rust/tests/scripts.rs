//! The fallback where users are (docs/clients.md#the-fallback-where-users-are), as the
//! Python package's test_scripts.py and test_fallback_library.py test it: where `FUNCTION`
//! is not allowed the Lua fallback runs as scripts, `EVAL` first and `EVALSHA` once the
//! server has the text; a refused `EVALSHA` moves to `EVAL`, a refused `EVAL` to `SCRIPT
//! LOAD` + `EVALSHA`; with nothing left, one clear error. A library an operator loaded serves
//! a client that may not run `FUNCTION`; an older client works beside a newer library and
//! leaves its text. Every server here runs without the module.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use common::Server;
use redis_rl_client::{Algorithm, Entry, Error, Gcra, Lease, Limiter, Mode, Source, Window};
use support::command_stats;

/// A server without the module whose `renamed` commands are renamed away.
fn server_with(renamed: &[&str]) -> Server {
    support::init();
    let mut b = Server::builder().no_module();
    for name in renamed {
        b = b.words(&["--rename-command", name, ""]);
    }
    b.start()
}

/// A limiter on `server` as `user` (password "pw"), or as the default user.
async fn limiter_as(server: &Server, user: Option<&str>) -> Limiter {
    let url = match user {
        Some(u) => format!("redis://{u}:pw@127.0.0.1:{}/", server.port),
        None => support::url(server),
    };
    // A loaded host may take over the default 500 ms for a call (the first EVAL compiles the
    // whole library): these tests are about which script command answers, not about outages.
    Limiter::builder(url)
        .prefix(support::prefix())
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .await
        .expect("build the limiter")
}

/// Adds an ACL user `name` (password "pw", every key and command) less `rules`.
fn acl_user(server: &Server, name: &str, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+@all");
    for r in rules {
        cmd.arg(*r);
    }
    let _: () = cmd.query(&mut server.conn()).unwrap();
}

/// Three decisions, a check_all, a refund and a lease, all answered by the fallback.
async fn run_burst(lim: &Limiter) {
    let g = Gcra::new(2, 1, 60).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(lim.check("b", &g).await.unwrap());
    }
    assert_eq!(
        got.iter().map(|d| d.allowed).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert!(got
        .iter()
        .all(|d| d.source == Source::Fallback && !d.degraded));
    let both = lim
        .check_all([
            Entry::new("{u}:a", Window::new(2, 60, Algorithm::Fixed).unwrap()),
            Entry::new("{u}:b", Gcra::new(5, 1, 60).unwrap()),
        ])
        .await
        .unwrap();
    assert!(both.allowed && both.remaining == 1, "{both:?}");
    assert_eq!(lim.refund("b", 1).await.unwrap().refunded, 1);
    let held = lim
        .acquire("job", &Lease::new(1, 30).unwrap())
        .await
        .unwrap();
    held.renew().await.unwrap();
    held.release().await.unwrap();
    assert_eq!(lim.resolved_mode().await.unwrap(), Mode::Fallback);
}

fn calls(stats: &std::collections::HashMap<String, u64>, name: &str) -> u64 {
    stats.get(name).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_functions_eval_first_then_evalsha() {
    let s = server_with(&["FUNCTION"]);
    let lim = limiter_as(&s, None).await;
    let g = Gcra::new(3, 1, 60).unwrap();
    let got: Vec<bool> = [
        lim.check("g", &g).await.unwrap().allowed,
        lim.check("g", &g).await.unwrap().allowed,
        lim.check("g", &g).await.unwrap().allowed,
        lim.check("g", &g).await.unwrap().allowed,
    ]
    .into();
    assert_eq!(got, [true, true, true, false]);
    let st = command_stats(&s);
    // The text once, then its SHA1 (as the Python package: no SCRIPT LOAD).
    assert_eq!(
        (
            calls(&st, "eval"),
            calls(&st, "evalsha"),
            calls(&st, "script|load")
        ),
        (1, 3, 0),
        "{st:?}"
    );
    // NOSCRIPT (the cache flushed, as by a restart): one EVALSHA refused, one EVAL.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut s.conn())
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut s.conn())
        .unwrap();
    assert!(lim.check("h", &g).await.unwrap().allowed); // "g" is denied locally now
    let st = command_stats(&s);
    assert_eq!(
        (calls(&st, "evalsha"), calls(&st, "eval")),
        (1, 1),
        "{st:?}"
    );
    run_burst(&lim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evalsha_renamed_away_every_call_sends_the_text() {
    let s = server_with(&["FUNCTION", "EVALSHA"]);
    let lim = limiter_as(&s, None).await;
    run_burst(&lim).await;
    let st = command_stats(&s);
    assert!(
        calls(&st, "eval") >= 6 && !st.contains_key("evalsha"),
        "{st:?}"
    );
    let before = calls(&st, "eval");
    assert!(
        lim.check("b", Gcra::new(2, 1, 60).unwrap())
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(
        calls(&command_stats(&s), "eval"),
        before + 1,
        "one EVAL per call"
    );
    assert_eq!(lim.counters().snapshot().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_renamed_away_runs_by_script_load_and_evalsha() {
    let s = server_with(&["FUNCTION", "EVAL"]);
    let lim = limiter_as(&s, None).await;
    run_burst(&lim).await;
    let st = command_stats(&s);
    assert_eq!(calls(&st, "script|load"), 1, "{st:?}");
    assert!(calls(&st, "evalsha") >= 6, "{st:?}");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut s.conn())
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut s.conn())
        .unwrap();
    let g = Gcra::new(2, 1, 60).unwrap();
    assert!(lim.check("b", &g).await.unwrap().allowed);
    let st = command_stats(&s);
    // One EVALSHA met NOSCRIPT, SCRIPT LOAD sent the text, the EVALSHA again: decided.
    assert_eq!(
        (calls(&st, "evalsha"), calls(&st, "script|load")),
        (2, 1),
        "{st:?}"
    );
    assert!(!lim.check("b", &g).await.unwrap().allowed);
    let st = command_stats(&s);
    assert_eq!(
        (calls(&st, "evalsha"), calls(&st, "script|load")),
        (3, 1),
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_that_denies_one_script_command_uses_the_other() {
    let s = server_with(&[]);
    for denied in ["-evalsha", "-eval"] {
        let user = format!("u{}", &denied[1..]);
        acl_user(&s, &user, &["-function", "-fcall", "-fcall_ro", denied]);
        let lim = limiter_as(&s, Some(&user)).await;
        run_burst(&lim).await;
        assert_eq!(lim.counters().snapshot().errors, 0, "{denied}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_renamed_away_is_one_clear_error() {
    for renamed in [
        &["FUNCTION", "EVAL", "EVALSHA"][..],
        &["FCALL", "FCALL_RO", "EVAL", "EVALSHA"][..],
    ] {
        let s = server_with(renamed);
        let lim = limiter_as(&s, None).await;
        for _ in 0..2 {
            // Every call: the same error, not an outage, not a second kind.
            match lim.check("none", Gcra::new(2, 1, 60).unwrap()).await {
                Err(Error::Library(m)) => assert!(
                    m.contains("no redis-rl module")
                        && m.contains("Functions library")
                        && m.contains("scripts"),
                    "{m}"
                ),
                other => panic!("{renamed:?}: expected Error::Library, got {other:?}"),
            }
        }
        let c = lim.counters().snapshot();
        assert_eq!((c.degraded, c.errors), (0, 0), "{renamed:?}: {c:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_acl_forbids_is_not_taken_for_no_scripting() {
    // As scripts, a NOPERM on the key (the user's key patterns) is the server's own error,
    // not "no scripting here".
    let s = server_with(&["FUNCTION"]);
    let prefix = support::prefix();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("keys")
        .arg("on")
        .arg(">pw")
        .arg(format!("~{prefix}ok*"))
        .arg("+@all")
        .query(&mut s.conn())
        .unwrap();
    let lim = Limiter::builder(format!("redis://keys:pw@127.0.0.1:{}/", s.port))
        .prefix(prefix)
        .build()
        .await
        .unwrap();
    let g = Gcra::new(2, 1, 60).unwrap();
    assert!(lim.check("ok1", &g).await.unwrap().allowed);
    match lim.check("other", &g).await {
        Err(Error::Redis(e)) => assert_eq!(e.code(), Some("NOPERM"), "{e}"),
        other => panic!("expected the server's NOPERM, got {other:?}"),
    }
}

/// The library an operator loaded serves a client whose ACL denies `FUNCTION` (and even
/// every script command): it is called with `FCALL`, never replaced, never run as scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_an_operator_loaded_serves_a_client_denied_function() {
    let s = server_with(&[]);
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(redis_rl_client::LUA_LIBRARY)
        .query(&mut s.conn())
        .unwrap();
    acl_user(
        &s,
        "fcallonly",
        &["-function", "-eval", "-evalsha", "-script"],
    );
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut s.conn())
        .unwrap();
    let lim = limiter_as(&s, Some("fcallonly")).await;
    run_burst(&lim).await;
    let st = command_stats(&s);
    assert!(calls(&st, "fcall") >= 6, "{st:?}");
    assert_eq!(
        calls(&st, "eval") + calls(&st, "evalsha") + calls(&st, "script|load"),
        0,
        "{st:?}"
    );
}

fn with_version(version: &str) -> String {
    let ours = redis_rl_client::LUA_LIBRARY;
    let v = ours
        .split("local VERSION = '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap();
    ours.replace(
        &format!("local VERSION = '{v}'"),
        &format!("local VERSION = '{version}'"),
    )
    .replacen(
        "local LOG_MAX_LIMIT = 100000\n",
        "local LOG_MAX_LIMIT = 500\n",
        1,
    )
}

/// Two library versions, as two client releases carry them: this crate's text as the
/// "older", a copy with a higher VERSION (and an operator's setting) as the "newer". The
/// older client works beside the newer library, twice, and leaves its text byte for byte.
/// (The newer replacing an older one, settings kept, is
/// behaviour.rs's a_newer_library_is_left_in_place_and_an_older_one_replaced.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_client_works_beside_a_newer_library_and_leaves_its_text() {
    let s = server_with(&[]);
    let newer = with_version("99.0.0");
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&newer)
        .query(&mut s.conn())
        .unwrap();
    for _ in 0..2 {
        let lim = limiter_as(&s, None).await;
        let d = lim.check("k", Gcra::new(5, 1, 1).unwrap()).await.unwrap();
        assert!(d.allowed && d.source == Source::Fallback && !d.degraded);
    }
    let listing: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("WITHCODE")
        .query(&mut s.conn())
        .unwrap();
    assert!(
        format!("{listing:?}").contains("99.0.0"),
        "the newer library stays"
    );
    let code: Vec<redis::Value> = match listing {
        redis::Value::Array(libs) => libs,
        other => panic!("{other:?}"),
    };
    let text = format!("{code:?}");
    assert!(text.contains("LOG_MAX_LIMIT = 500"), "its settings too");
    assert_eq!(
        calls(&command_stats(&s), "function|load"),
        1,
        "only ours, above"
    );
}

/// Valkey 9.1 runs Lua as an engine module an operator can unload: then neither the library
/// nor scripts can run, and the limiter says so with the one clear error (not "Engine 'lua'
/// not found"). Elsewhere Lua is built in and cannot be switched off: nothing to test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_switched_off_is_one_clear_error() {
    let s = server_with(&[]);
    let modules: redis::Value = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut s.conn())
        .unwrap();
    // An empty list on Redis 7.0 (no modules here); the `lua` engine on Valkey 9.1.
    if !format!("{modules:?}").contains("lua") {
        eprintln!("Lua is built into this server (only Valkey 9+ can switch it off)");
        return;
    }
    let _: () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("lua")
        .query(&mut s.conn())
        .unwrap();
    let lim = limiter_as(&s, None).await;
    for _ in 0..2 {
        match lim.check("none", Gcra::new(2, 1, 60).unwrap()).await {
            Err(Error::Library(m)) => assert!(m.contains("no redis-rl module"), "{m}"),
            other => panic!("expected Error::Library, got {other:?}"),
        }
    }
    let c = lim.counters().snapshot();
    assert_eq!((c.degraded, c.errors), (0, 0), "{c:?}");
}

/// Concurrent first calls per round, and rounds (each a new limiter: nothing learned yet).
/// Their `EVAL`s (or `EVALSHA`s) go out on the one multiplexed connection before the first
/// refusal is read.
const CALLERS: usize = 16;
const ROUNDS: usize = 6;

/// A new limiter on `server` (as `user`) learns that the server allows no Functions (the
/// mode detected, no decision yet), takes one decision if `warm` (`EVAL`: the server has the
/// text, the next calls go by SHA1), then `CALLERS` decisions on their own keys at once, each
/// a tokio task, joined with a deadline. Their answers.
async fn first_calls_at_once(
    server: &Server,
    user: Option<&str>,
    warm: bool,
) -> Vec<Result<redis_rl_client::Decision, Error>> {
    let lim = limiter_as(server, user).await;
    assert_eq!(lim.resolved_mode().await.unwrap(), Mode::Fallback);
    let g = Gcra::new(1, 1, 3600).unwrap();
    if warm {
        assert!(lim.check("warm", &g).await.unwrap().allowed);
    }
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (lim, g) = (lim.clone(), g.clone());
            tokio::spawn(async move { lim.check(format!("c{i}"), &g).await })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        let joined = tokio::time::timeout(std::time::Duration::from_secs(60), task)
            .await
            .expect("a call finished within 60 s");
        out.push(joined.expect("the task ran to its end"));
    }
    out
}

/// docs/clients.md#the-fallback-where-users-are: calls refused `EVAL` (or `EVALSHA`) at the
/// same moment each go on in the other form; the refusal one of them recorded first is no
/// reason for the others to report "no scripting". (It failed so before: of a round's calls,
/// those that read their refusal after the first got the one clear error.) `refused` by
/// `rename-command`, or by an ACL (`by_acl`).
async fn concurrent_first_calls_refused(refused: &str, by_acl: bool) {
    let s = if by_acl {
        let s = server_with(&[]);
        let rule = format!("-{}", refused.to_lowercase());
        acl_user(&s, "scripts", &["-function", "-fcall", "-fcall_ro", &rule]);
        s
    } else {
        server_with(&["FUNCTION", refused])
    };
    let user = by_acl.then_some("scripts");
    for round in 0..ROUNDS {
        let got = first_calls_at_once(&s, user, refused == "EVALSHA").await;
        let failed: Vec<_> = got.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            failed.is_empty(),
            "round {round}: {} of {CALLERS} calls failed: {:?}",
            failed.len(),
            failed[0]
        );
        assert!(got.iter().all(|r| {
            let d = r.as_ref().unwrap();
            d.allowed && d.source == Source::Fallback && !d.degraded
        }));
    }
    let st = command_stats(&s);
    // Every decision was taken, by the form the server allows.
    let other = if refused == "EVAL" { "evalsha" } else { "eval" };
    assert!(calls(&st, other) >= (ROUNDS * CALLERS) as u64, "{st:?}");
    if refused == "EVAL" {
        assert!(calls(&st, "script|load") >= ROUNDS as u64, "{st:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_refused_eval_by_rename_all_use_evalsha() {
    concurrent_first_calls_refused("EVAL", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_refused_eval_by_acl_all_use_evalsha() {
    concurrent_first_calls_refused("EVAL", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_refused_evalsha_by_rename_all_use_eval() {
    concurrent_first_calls_refused("EVALSHA", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_refused_evalsha_by_acl_all_use_eval() {
    concurrent_first_calls_refused("EVALSHA", true).await;
}

/// Both forms refused: every one of the concurrent calls ends with the one clear error (none
/// with the server's raw refusal, none with "kept failing").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_without_any_scripting_all_get_the_clear_error() {
    let s = server_with(&["FUNCTION", "EVAL", "EVALSHA"]);
    for _ in 0..2 {
        for got in first_calls_at_once(&s, None, false).await {
            match got {
                Err(Error::Library(m)) => {
                    assert!(
                        m.contains("no redis-rl module") && m.contains("scripts"),
                        "{m}"
                    )
                }
                other => panic!("expected Error::Library, got {other:?}"),
            }
        }
    }
}
