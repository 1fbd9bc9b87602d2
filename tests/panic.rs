//! A panic inside the module becomes an error reply and a log line; the server survives.
//! Uses the debug build, which alone has the RL.PANIC trigger.

mod common;

use common::{debug_module_path, err_s, q, rl, Server};

#[test]
fn a_panic_is_an_error_reply_and_the_server_survives() {
    let mut s = Server::builder().module(debug_module_path()).start();
    let mut c = s.conn();
    rl(&mut c, &["RL.GCRA", "k", "2", "1", "100"]);
    for _ in 0..3 {
        let e = err_s(&mut c, &["RL.PANIC"]);
        assert!(e.starts_with("ERR internal error in redis-rl"), "{e}");
    }
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    assert_eq!(
        rl(&mut c, &["RL.GCRA", "k", "2", "1", "100"])[..3],
        [1, 2, 0]
    );
    assert!(s.is_alive());
    assert!(
        s.log().contains("redis-rl: panic in RL.PANIC"),
        "log:\n{}",
        s.log()
    );
}

#[test]
fn release_builds_have_no_panic_trigger() {
    let module = common::module_path();
    if module == debug_module_path() {
        return; // only the debug build is present
    }
    let s = Server::start();
    let mut c = s.conn();
    let e = err_s(&mut c, &["RL.PANIC"]);
    assert!(e.contains("unknown command"), "{e}");
}
