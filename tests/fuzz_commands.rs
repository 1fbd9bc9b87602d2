//! Command fuzzer: random RL.* commands against a real server over several connections.
//!
//! Seeded and reproducible (`FUZZ_SEED`, default 1), bounded in count (`FUZZ_COMMANDS`,
//! default 20 000 for `make test`; `make fuzz-commands` runs 1 000 000) and in time
//! (`FUZZ_SECONDS`, default 300). Arguments come from pools of numbers at and around every
//! boundary, malformed numbers, keywords, random bytes, binary and 64 KiB keys and keys of
//! every other Redis type; some calls run inside MULTI/EXEC and EVAL. After every batch it
//! checks that PING answers, that every reply was an error or well formed, and that every
//! limiter key has a TTL.

mod common;

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

use common::{q, Server};

const BATCH: usize = 200;
const CONNECTIONS: usize = 4;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "10",
    "100",
    "1000",
    "100000",
    "100001",
    "2147483647",
    "2147483648",
    "2147483649",
    "4294967296",
    "9007199254740992",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "315360000",
    "315360001",
    "-1",
    "-0",
    "+1",
    "1.5",
    "0.5",
    "0.000000001",
    "0.0000000001",
    "1.0000000000",
    "1e3",
    "1E3",
    " 1",
    "1 ",
    "",
    "inf",
    "-inf",
    "nan",
    "0x10",
    "1,5",
    ".5",
    "5.",
    "007",
    "1..2",
    "١",
    "0.25",
    "86400",
    "1000000000",
    "2000000000",
    "2000000001",
];

const KEYWORDS: &[&str] = &[
    "QUANTITY", "quantity", "PEEK", "peek", "MAXWAIT", "FIXED", "SLIDING", "LOG", "log", "GCRA",
    "WINDOW", "PXAT", "BOGUS", "FORCE", "force", "COST", "LEASE", "RENEW", "renew",
];

const COMMANDS: &[&str] = &[
    "RL.GCRA",
    "RL.WINDOW",
    "RL.ALL",
    "RL.REFUND",
    "CL.THROTTLE",
    "RL.LEASE",
    "RL.RELEASE",
    "RL.APPLY",
];

/// Lease tokens: a few shared ones (so leases renew and release), empty, 64 and 65 bytes.
fn token(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0 => Vec::new(),
        1 => vec![b't'; 64],
        2 => vec![b't'; 65],
        3 => (0..rng.gen_range(1..70)).map(|_| rng.gen()).collect(),
        _ => format!("holder-{}", rng.gen_range(0..6)).into_bytes(),
    }
}

/// Keys: a few limiter keys (so state builds up), keys of other types, binary and huge ones.
fn key(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..20) {
        0 => b"other:string".to_vec(),
        1 => b"other:list".to_vec(),
        2 => b"other:hash".to_vec(),
        3 => b"other:set".to_vec(),
        4 => b"other:zset".to_vec(),
        5 => b"other:stream".to_vec(),
        6 => (0..rng.gen_range(0..16)).map(|_| rng.gen()).collect(),
        7 => vec![b'k'; 64 * 1024],
        _ => format!("{{f}}:k{}", rng.gen_range(0..24)).into_bytes(),
    }
}

fn arg(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0..=4 => NUMBERS[rng.gen_range(0..NUMBERS.len())].as_bytes().to_vec(),
        5..=6 => KEYWORDS[rng.gen_range(0..KEYWORDS.len())]
            .as_bytes()
            .to_vec(),
        7 => rng.gen_range(0u64..5000).to_string().into_bytes(),
        8 => (0..rng.gen_range(0..24)).map(|_| rng.gen()).collect(),
        _ => key(rng),
    }
}

/// A mostly well-formed command (so deep paths run) with random damage.
fn command(rng: &mut StdRng) -> Vec<Vec<u8>> {
    let name = COMMANDS[rng.gen_range(0..COMMANDS.len())];
    let mut c: Vec<Vec<u8>> = vec![name.as_bytes().to_vec()];
    let small = |rng: &mut StdRng| rng.gen_range(1u64..20).to_string().into_bytes();
    let period = |rng: &mut StdRng| {
        ["1", "10", "60", "0.5", "3600", "0.001"][rng.gen_range(0..6)]
            .as_bytes()
            .to_vec()
    };
    match name {
        "RL.GCRA" => {
            c.extend([key(rng), small(rng), small(rng), period(rng)]);
        }
        "RL.WINDOW" => {
            c.extend([key(rng), small(rng), period(rng)]);
            if rng.gen_bool(0.7) {
                c.push(
                    ["FIXED", "SLIDING", "LOG"][rng.gen_range(0..3)]
                        .as_bytes()
                        .to_vec(),
                );
            }
        }
        "RL.ALL" => {
            let n = rng.gen_range(1..4);
            c.push(n.to_string().into_bytes());
            for i in 0..n {
                c.push(format!("{{f}}:all{}", (i + rng.gen_range(0..3)) % 6).into_bytes());
            }
            for _ in 0..n {
                match rng.gen_range(0..3) {
                    0 => c.extend([b"GCRA".to_vec(), small(rng), small(rng), period(rng)]),
                    1 => c.extend([b"WINDOW".to_vec(), small(rng), period(rng)]),
                    _ => c.extend([b"LEASE".to_vec(), small(rng), period(rng), token(rng)]),
                }
                if rng.gen_bool(0.3) {
                    c.extend([
                        b"COST".to_vec(),
                        rng.gen_range(0u64..30).to_string().into_bytes(),
                    ]);
                }
            }
        }
        "RL.LEASE" => c.extend([key(rng), small(rng), period(rng), token(rng)]),
        "RL.RELEASE" => c.extend([key(rng), token(rng)]),
        "RL.REFUND" => c.extend([key(rng), small(rng)]),
        "CL.THROTTLE" => c.extend([key(rng), small(rng), small(rng), small(rng)]),
        _ => c.extend([key(rng), arg(rng)]),
    }
    // Options and damage: extra arguments, replaced arguments, truncation.
    for _ in 0..rng.gen_range(0..4) {
        c.push(arg(rng));
    }
    if c.len() > 1 && rng.gen_bool(0.4) {
        let i = rng.gen_range(1..c.len());
        c[i] = arg(rng);
    }
    if rng.gen_bool(0.1) {
        c.truncate(rng.gen_range(1..=c.len()));
    }
    c
}

/// A reply is an error or the shape its command promises.
fn well_formed(name: &[u8], v: &Value) -> bool {
    let ints = |v: &Value, n: usize| matches!(v, Value::Array(a) if a.len() == n && a.iter().all(|x| matches!(x, Value::Int(_))));
    match name {
        b"RL.GCRA" | b"RL.WINDOW" | b"CL.THROTTLE" | b"RL.LEASE" => ints(v, 5),
        b"RL.REFUND" | b"RL.RELEASE" => ints(v, 3),
        b"RL.ALL" => match v {
            Value::Array(a) if a.len() == 2 => {
                ints(&a[0], 5)
                    && matches!(&a[1], Value::Array(per) if per.iter().all(|p| ints(p, 5)))
            }
            _ => false,
        },
        _ => false, // RL.APPLY from a client must always fail
    }
}

fn run_one(c: &mut redis::Connection, cmd: &[Vec<u8>], rng: &mut StdRng) -> Result<(), String> {
    let build = |cmd: &[Vec<u8>]| {
        let mut r = redis::cmd(std::str::from_utf8(&cmd[0]).unwrap());
        for a in &cmd[1..] {
            r.arg(a.as_slice());
        }
        r
    };
    let check = |v: redis::RedisResult<Value>| -> Result<(), String> {
        match v {
            Err(e) if e.kind() == redis::ErrorKind::Io => Err(format!("connection lost: {e}")),
            Err(_) => Ok(()),
            Ok(Value::ServerError(_)) => Ok(()),
            Ok(v) if well_formed(&cmd[0], &v) => Ok(()),
            Ok(v) => Err(format!(
                "malformed reply to {:?}: {v:?}",
                String::from_utf8_lossy(&cmd[0])
            )),
        }
    };
    match rng.gen_range(0..20) {
        0 => {
            // Inside MULTI/EXEC, twice.
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe.add_command(build(cmd));
            pipe.add_command(build(cmd));
            match pipe.query::<Vec<Value>>(c) {
                Ok(replies) => replies.iter().try_for_each(|v| check(Ok(v.clone()))),
                Err(e) if e.kind() == redis::ErrorKind::Io => Err(format!("connection lost: {e}")),
                Err(_) => Ok(()),
            }
        }
        1 => {
            // From a script.
            let mut r = redis::cmd("EVAL");
            r.arg("return redis.pcall(unpack(ARGV))").arg(0);
            for a in cmd {
                r.arg(a.as_slice());
            }
            check(r.query::<Value>(c))
        }
        _ => check(build(cmd).query::<Value>(c)),
    }
}

fn every_limiter_key_has_a_ttl(c: &mut redis::Connection) -> Result<(), String> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("ratelimit")
            .query(c)
            .map_err(|e| e.to_string())?;
        for k in keys {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&k)
                .query(c)
                .map_err(|e| e.to_string())?;
            if pttl == -1 {
                return Err(format!(
                    "limiter key {:?} has no TTL",
                    String::from_utf8_lossy(&k)
                ));
            }
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

#[test]
fn fuzz_commands() {
    let seed = env_u64("FUZZ_SEED", 1);
    let total = env_u64("FUZZ_COMMANDS", 20_000) as usize;
    let deadline = Instant::now() + Duration::from_secs(env_u64("FUZZ_SECONDS", 300));
    let s = Server::start();
    let mut admin = s.conn();
    q::<()>(&mut admin, &["SET", "other:string", "x"]);
    q::<i64>(&mut admin, &["RPUSH", "other:list", "x"]);
    q::<i64>(&mut admin, &["HSET", "other:hash", "f", "v"]);
    q::<i64>(&mut admin, &["SADD", "other:set", "x"]);
    q::<i64>(&mut admin, &["ZADD", "other:zset", "1", "x"]);
    q::<String>(&mut admin, &["XADD", "other:stream", "*", "f", "v"]);
    let per_connection = total.div_ceil(CONNECTIONS);
    let sent: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|t| {
                let mut c = s.conn();
                scope.spawn(move || {
                    let mut rng =
                        StdRng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(t as u64));
                    let mut sent = 0;
                    while sent < per_connection && Instant::now() < deadline {
                        for _ in 0..BATCH.min(per_connection - sent) {
                            let cmd = command(&mut rng);
                            if let Err(e) = run_one(&mut c, &cmd, &mut rng) {
                                panic!("seed {seed}, connection {t}, command {sent}: {e}");
                            }
                            sent += 1;
                        }
                        let pong: String = q(&mut c, &["PING"]);
                        assert_eq!(pong, "PONG");
                        if let Err(e) = every_limiter_key_has_a_ttl(&mut c) {
                            panic!("seed {seed}, connection {t}, after command {sent}: {e}");
                        }
                    }
                    sent
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("fuzz connection"))
            .sum()
    });
    every_limiter_key_has_a_ttl(&mut admin).unwrap();
    assert_eq!(q::<String>(&mut admin, &["PING"]), "PONG");
    assert!(
        !s.log().contains("panic"),
        "a panic was caught and logged:\n{}",
        s.log()
    );
    assert!(
        sent >= total || Instant::now() >= deadline,
        "sent only {sent} of {total}"
    );
    println!("fuzz_commands: seed {seed}, {sent} commands over {CONNECTIONS} connections, server healthy");
}
