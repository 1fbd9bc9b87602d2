//! Bad input: every malformed argument gets an `ERR` naming it, changes nothing, and the
//! server keeps answering.

mod common;

use common::{err, err_s, q, rl, Server};

const PERIOD_ERR: &str = "ERR period must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 more digits), > 0 and <= 315360000";

#[test]
fn bad_inputs_are_errors_naming_the_argument() {
    let s = Server::start();
    let mut c = s.conn();
    // A key with state, to prove that nothing changes.
    rl(&mut c, &["RL.GCRA", "k", "5", "1", "100"]);
    let before: Vec<u8> = q(&mut c, &["DUMP", "k"]);
    let before_exp: i64 = q(&mut c, &["PEXPIRETIME", "k"]);
    let burst = "ERR burst must be a positive integer";
    let rate = "ERR rate must be a positive integer";
    let quantity = "ERR QUANTITY must be a non-negative integer";
    let maxwait = "ERR MAXWAIT must be a non-negative integer";
    let table: &[(&[&str], &str)] = &[
        (&["k", "0", "1", "1"], burst),
        (&["k", "-1", "1", "1"], burst),
        (&["k", "+1", "1", "1"], burst),
        (&["k", "1e3", "1", "1"], burst),
        (&["k", "1.0", "1", "1"], burst),
        (&["k", "", "1", "1"], burst),
        (&["k", " 1", "1", "1"], burst),
        (&["k", "18446744073709551616", "1", "1"], burst),
        (&["k", "abc", "1", "1"], burst),
        (&["k", "1", "0", "1"], rate),
        (&["k", "1", "-5", "1"], rate),
        (&["k", "1", "0x10", "1"], rate),
        (&["k", "1", "1", "0"], PERIOD_ERR),
        (&["k", "1", "1", "1e3"], PERIOD_ERR),
        (&["k", "1", "1", "-1"], PERIOD_ERR),
        (&["k", "1", "1", "+1"], PERIOD_ERR),
        (&["k", "1", "1", "0x10"], PERIOD_ERR),
        (&["k", "1", "1", "inf"], PERIOD_ERR),
        (&["k", "1", "1", "nan"], PERIOD_ERR),
        (&["k", "1", "1", "1,5"], PERIOD_ERR),
        (&["k", "1", "1", ".5"], PERIOD_ERR),
        (&["k", "1", "1", "5."], PERIOD_ERR),
        (&["k", "1", "1", ""], PERIOD_ERR),
        (&["k", "1", "1", "0.0000000001"], PERIOD_ERR),
        (&["k", "1", "1", "315360001"], PERIOD_ERR),
        (&["k", "1", "1", "0.0"], PERIOD_ERR),
        (
            &["k", "1", "2000000001", "1"],
            "ERR rate is too high for period: the emission interval period/rate is below 1 ns",
        ),
        (
            &["k", "18446744073709551615", "1", "1"],
            "ERR burst is too large: burst * period / rate overflows 64-bit nanoseconds",
        ),
        (
            &["k", "1", "1", "1", "QUANTITY"],
            "ERR syntax error: QUANTITY needs a value",
        ),
        (&["k", "1", "1", "1", "QUANTITY", "-1"], quantity),
        (&["k", "1", "1", "1", "QUANTITY", "1.5"], quantity),
        (&["k", "1", "1", "1", "QUANTITY", "x"], quantity),
        (
            &["k", "1", "1", "1", "QUANTITY", "1", "QUANTITY", "1"],
            "ERR syntax error: QUANTITY given more than once",
        ),
        (
            &["k", "1", "1", "1", "PEEK", "peek"],
            "ERR syntax error: PEEK given more than once",
        ),
        (&["k", "1", "1", "1", "MAXWAIT", "-1"], maxwait),
        (
            &["k", "1", "1", "1", "MAXWAIT"],
            "ERR syntax error: MAXWAIT needs a value",
        ),
        (
            &["k", "1", "1", "1", "FOO"],
            "ERR syntax error: unknown argument 'FOO'",
        ),
        (
            &["k", "1", "1", "1", "QUANTITYX", "1"],
            "ERR syntax error: unknown argument 'QUANTITYX'",
        ),
    ];
    for (args, expected) in table {
        let mut full = vec!["RL.GCRA"];
        full.extend_from_slice(args);
        assert_eq!(&err_s(&mut c, &full), expected, "{full:?}");
    }
    assert!(err_s(&mut c, &["RL.GCRA", "k", "1", "1"]).starts_with("ERR wrong number of arguments"));
    assert!(err_s(&mut c, &["RL.GCRA"]).starts_with("ERR wrong number of arguments"));
    // Binary junk and very long arguments.
    let junk = vec![0xffu8; 70_000];
    let e = err(&mut c, &[b"RL.GCRA", b"k", &junk, b"1", b"1"]);
    assert_eq!(e, burst);
    let e = err(&mut c, &[b"RL.GCRA", b"k", b"1", b"1", b"1", &junk]);
    assert!(e.starts_with("ERR syntax error: unknown argument"), "{e}");
    // Nothing changed, nothing was created, and the server still answers.
    assert_eq!(q::<Vec<u8>>(&mut c, &["DUMP", "k"]), before);
    assert_eq!(q::<i64>(&mut c, &["PEXPIRETIME", "k"]), before_exp);
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 1);
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
}

#[test]
fn extreme_but_valid_values_never_crash() {
    let s = Server::start();
    let mut c = s.conn();
    let max = "18446744073709551615";
    // Largest period, rate 1: T = 10 years; a huge quantity is simply "never".
    let r = rl(
        &mut c,
        &["RL.GCRA", "x", "1", "1", "315360000", "QUANTITY", max],
    );
    assert_eq!(&r[..4], &[0, 1, 1, -1]);
    // One request per ns, the largest burst that fits: tolerance close to 2^64 ns.
    let r = rl(&mut c, &["RL.GCRA", "y", max, "1000000000", "1"]);
    assert_eq!(r[0], 1);
    assert_eq!(r[1], i64::MAX, "limit saturates at i64::MAX in the reply");
    // The whole burst in one go pushes the TAT past 2^64 ns: an overflow error, not a panic.
    let e = err_s(
        &mut c,
        &["RL.GCRA", "y2", max, "1000000000", "1", "QUANTITY", max],
    );
    assert!(e.starts_with("ERR arithmetic overflow"), "{e}");
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "y2"]), 0);
    let r = rl(&mut c, &["RL.GCRA", "z", "1", "1", "0.000000001"]);
    assert_eq!(r[0], 1);
    let r = rl(&mut c, &["RL.GCRA", "z2", "1", "1", "1", "MAXWAIT", max]);
    assert_eq!(&r[..4], &[1, 1, 0, 0]);
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
}
