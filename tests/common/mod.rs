//! The real-server harness: starts `redis-server` with the module on a free loopback port in
//! a temporary directory, waits for it with a deadline (failing with the server's log), and
//! kills it by PID on drop.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// How long a server may take to answer PING after start.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// Path of the module under test: `$RL_MODULE`, else the release build, else the debug build.
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("RL_MODULE") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let release = root.join("target/release/libredis_rl.so");
    if release.exists() {
        return release;
    }
    let debug = root.join("target/debug/libredis_rl.so");
    assert!(
        debug.exists(),
        "no module built: run `make build` (or `cargo build --release`)"
    );
    debug
}

/// Path of the debug build (which has the RL.PANIC trigger): `$RL_DEBUG_MODULE`, else the one
/// `cargo test` itself built beside the test binaries (target/debug/deps/: the suites link
/// the crate, so the run that built them built it too, from the same sources), else
/// `cargo build`'s.
pub fn debug_module_path() -> PathBuf {
    if let Ok(p) = std::env::var("RL_DEBUG_MODULE") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deps = root.join("target/debug/deps/libredis_rl.so");
    if deps.exists() {
        return deps;
    }
    let p = root.join("target/debug/libredis_rl.so");
    assert!(p.exists(), "no debug module built: run `cargo build`");
    p
}

/// The server binary: `$REDIS_SERVER` or `redis-server` from PATH.
pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A free loopback port for a Redis Cluster node: at most 55535, its bus port (+10000) free
/// too. Redis exits at start with a higher one ("Your Redis port number must be 55535 or
/// less"), and the kernel's ephemeral ports reach 60999: about one in five of them.
pub fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = free_port();
        if port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

/// A running redis-server with the module loaded.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    module: Option<PathBuf>,
    env: Vec<(String, String)>,
}

/// Builds a server with extra configuration.
pub struct Builder {
    extra: Vec<String>,
    module: Option<PathBuf>,
    dir: Option<tempfile::TempDir>,
    env: Vec<(String, String)>,
}

impl Builder {
    /// Adds `--name value` to the command line.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        self.extra.push(format!("--{name}"));
        self.extra.push(value.to_owned());
        self
    }

    /// Adds raw command-line words (e.g. `--replicaof`, `127.0.0.1`, `6379`).
    pub fn words(mut self, words: &[&str]) -> Self {
        self.extra.extend(words.iter().map(|w| (*w).to_owned()));
        self
    }

    /// Makes the server a replica of `master`.
    pub fn replica_of(self, master: &Server) -> Self {
        let port = master.port.to_string();
        self.words(&["--replicaof", "127.0.0.1", &port])
    }

    /// Uses another module file.
    pub fn module(mut self, path: PathBuf) -> Self {
        self.module = Some(path);
        self
    }

    /// Starts without loading the module (the test loads it with MODULE LOAD).
    pub fn no_module(mut self) -> Self {
        self.module = None;
        self
    }

    /// Runs the server with the clock shim preloaded: `clock.step_to(…)` moves its real-time
    /// clock.
    pub fn clock(mut self, clock: &Clock) -> Self {
        self.env.extend(clock.env());
        self
    }

    /// Sets an environment variable of the server process (e.g. `LD_PRELOAD`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts in a directory prepared by the caller (e.g. holding an RDB fixture).
    pub fn dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// Starts the server and waits until it answers.
    pub fn start(self) -> Server {
        let dir = match self.dir {
            Some(d) => d,
            None => tempfile::Builder::new()
                .prefix("redis-rl-test-")
                .tempdir()
                .expect("temp dir"),
        };
        let mut server = Server {
            child: None,
            port: 0,
            dir,
            extra: self.extra,
            module: self.module,
            env: self.env,
        };
        server.launch_fresh_port();
        server
    }
}

impl Server {
    /// A plain server: no persistence, module loaded.
    pub fn start() -> Server {
        Self::builder().start()
    }

    pub fn builder() -> Builder {
        Builder {
            extra: Vec::new(),
            module: Some(module_path()),
            dir: None,
            env: Vec::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn launch_fresh_port(&mut self) {
        let mut last_error = String::new();
        let cluster = self.extra.iter().any(|w| w == "--cluster-enabled");
        for _ in 0..5 {
            self.port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            match self.launch() {
                Ok(()) => return,
                Err(e) if e.contains("Address already in use") => last_error = e,
                Err(e) => panic!("redis-server did not start: {e}"),
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(server_binary());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--enable-debug-command",
                "yes",
                "--enable-module-command",
                "yes",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(
                self.module
                    .iter()
                    .flat_map(|m| [std::ffi::OsStr::new("--loadmodule"), m.as_os_str()]),
            )
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    fn launch(&mut self) -> Result<(), String> {
        let child = self
            .command()
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited with {status}; log:\n{}", self.log()));
            }
            if let Ok(mut con) = self.try_conn() {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut con);
                if pong.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "no PING answer within {START_DEADLINE:?}; log:\n{}",
                    self.log()
                ));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let con = client.get_connection_with_timeout(Duration::from_secs(2))?;
        con.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(con)
    }

    /// A new connection to the server.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn()
            .unwrap_or_else(|e| panic!("connect to port {}: {e}; log:\n{}", self.port, self.log()))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL (no shutdown save) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with SIGTERM (a clean shutdown) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (after `stop` or `kill`).
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.launch() {
            panic!("restart failed: {e}");
        }
    }

    /// Starts the server again with other extra arguments.
    pub fn restart_with(&mut self, extra: Vec<String>) {
        self.extra = extra;
        self.restart();
    }

    /// Whether the server process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs a command that must succeed, returning its reply as `T`.
pub fn q<T: redis::FromRedisValue>(con: &mut redis::Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
        .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// Runs a limiting command and returns its five-integer reply.
pub fn rl(con: &mut redis::Connection, args: &[&str]) -> [i64; 5] {
    let v: Vec<i64> = q(con, args);
    v.try_into()
        .unwrap_or_else(|v: Vec<i64>| panic!("{args:?}: not five integers: {v:?}"))
}

/// Runs a command that must fail, returning the full error line (`ERR …`, `WRONGTYPE …`).
pub fn err(con: &mut redis::Connection, args: &[&[u8]]) -> String {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("utf-8 command name"));
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query::<redis::Value>(con) {
        Ok(v) => panic!(
            "{:?} succeeded with {v:?}",
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>()
        ),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

/// Same as [`err`] for text arguments.
pub fn err_s(con: &mut redis::Connection, args: &[&str]) -> String {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    err(con, &bytes)
}

/// Asserts `actual` is within `[expected - slack, expected + 1]`: ms fields shrink as time
/// passes, and rounding up a duration that started mid-millisecond may add one.
#[track_caller]
pub fn assert_ms(actual: i64, expected: i64, slack: i64) {
    assert!(
        actual <= expected + 1 && actual >= expected - slack,
        "expected {expected} ms (−{slack}, +1), got {actual}"
    );
}

/// `DUMP` payload and absolute expiry (ms) of a key.
pub fn snapshot(con: &mut redis::Connection, key: &str) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = q(con, &["DUMP", key]);
    let pexpiretime: i64 = q(con, &["PEXPIRETIME", key]);
    (dump, pexpiretime)
}

/// Waits until `f` holds or the deadline passes.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(20));
    }
}

/// The value of one `INFO` field.
pub fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let info: String = q(con, &["INFO", section]);
    info.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_owned())
    })
}

/// A Redis Cluster of `n` masters on loopback, each with the module (unless started
/// `without_module`), joined with
/// `redis-cli --cluster create`; every node is killed on drop.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(n: usize) -> Cluster {
        Cluster::start_nodes(n, true)
    }

    /// The same cluster with no module loaded on any node (the clients' Lua fallback).
    pub fn start_without_module(n: usize) -> Cluster {
        Cluster::start_nodes(n, false)
    }

    fn start_nodes(n: usize, module: bool) -> Cluster {
        let nodes: Vec<Server> = (0..n)
            .map(|_| {
                let b = Server::builder()
                    .arg("cluster-enabled", "yes")
                    .arg("cluster-config-file", "nodes.conf")
                    .arg("cluster-node-timeout", "5000");
                if module { b } else { b.no_module() }.start()
            })
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and agrees on the slots.
    pub fn wait_ok(&self) {
        for node in &self.nodes {
            let mut c = node.conn();
            wait_until("cluster_state:ok", Duration::from_secs(30), || {
                let info: String = q(&mut c, &["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384")
            });
        }
    }

    /// A cluster-aware client connection (follows MOVED/ASK).
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect();
        redis::cluster::ClusterClient::new(urls)
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// The node serving `key`'s slot.
    pub fn owner(&self, key: &str) -> &Server {
        let mut c = self.nodes[0].conn();
        let slot: i64 = q(&mut c, &["CLUSTER", "KEYSLOT", key]);
        let slots: Vec<redis::Value> = q(&mut c, &["CLUSTER", "SLOTS"]);
        for range in slots {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(master)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&slot) {
                let Some(redis::Value::Int(port)) = master.get(1) else {
                    continue;
                };
                return self
                    .nodes
                    .iter()
                    .find(|s| i64::from(s.port) == *port)
                    .expect("node of the slot");
            }
        }
        panic!("no owner for slot {slot}");
    }

    /// The cluster node id of `node`.
    pub fn node_id(node: &Server) -> String {
        let mut c = node.conn();
        q(&mut c, &["CLUSTER", "MYID"])
    }
}

/// Redis Cluster's key slot (CRC16/XMODEM of the key or its hash tag, mod 16384).
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Redis's CRC64 (Jones polynomial, reflected), as DUMP payloads carry it.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc: u64 = 0;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x95AC_9329_AC4B_C9B5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// The frame of a DUMP payload of a `ratelimit` value, to wrap other codec bytes in (for
/// forged-state tests). Redis may LZF-compress the value's string; a forged payload uses the
/// plain form, which RESTORE reads as well.
pub struct Dump {
    /// Type byte (7, module), 64-bit module id, string opcode (5).
    pub head: Vec<u8>,
    /// EOF opcode (0) and the 2-byte RDB version.
    pub tail: Vec<u8>,
}

impl Dump {
    /// Takes the frame of a DUMP payload written by this module.
    pub fn parse(payload: &[u8]) -> Dump {
        assert_eq!(payload[0], 7, "module value type");
        assert_eq!(payload[1], 0x81, "64-bit module id");
        assert_eq!(payload[10], 5, "string opcode");
        let n = payload.len();
        let mut tail = vec![0u8];
        tail.extend_from_slice(&payload[n - 10..n - 8]);
        Dump {
            head: payload[..11].to_vec(),
            tail,
        }
    }

    /// A payload holding `state` as the value's codec bytes, with a valid CRC64.
    pub fn with_state(&self, state: &[u8]) -> Vec<u8> {
        let mut out = self.head.clone();
        if state.len() < 64 {
            out.push(state.len() as u8);
        } else if state.len() < 16384 {
            out.push(0x40 | (state.len() >> 8) as u8);
            out.push(state.len() as u8);
        } else {
            // RDB's 32-bit length: 0x80, then the length big-endian.
            out.push(0x80);
            out.extend_from_slice(&u32::try_from(state.len()).unwrap().to_be_bytes());
        }
        out.extend_from_slice(state);
        out.extend_from_slice(&self.tail);
        let crc = crc64(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// Codec bytes (encoding version 2) of a GCRA state.
pub fn gcra_state(tat_ns: u64, interval_ns: u64, burst: u64, updated_ns: u64) -> Vec<u8> {
    let mut v = vec![2u8, 1];
    for f in [tat_ns, interval_ns, burst, updated_ns] {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v
}

/// Codec bytes (encoding version 2) of a LOG state holding `count` requests at one instant.
pub fn log_state(window_ns: u64, limit: u64, at_ns: u64, count: u8) -> Vec<u8> {
    let mut v = vec![2u8, 4];
    for f in [window_ns, limit, at_ns, at_ns, u64::from(count), 1] {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v.push(count);
    v
}

/// Codec bytes (encoding version 2) of a LOG state of `n` requests at distinct instants
/// `gap_ns` apart (a whole number of µs), the newest at `last_ns`: one entry per request, the
/// most entries `n` requests can make. A test builds a big log this way in one RESTORE, the
/// same whatever the machine's speed (requests sent one by one share an instant, and so an
/// entry, when the server handles several in one microsecond).
pub fn spread_log_state(window_ns: u64, limit: u64, last_ns: u64, n: u64, gap_ns: u64) -> Vec<u8> {
    assert!(n > 0 && gap_ns % 1000 == 0 && gap_ns > 0);
    let last = last_ns / 1000 * 1000;
    let first = last - (n - 1) * gap_ns;
    let mut delta = Vec::new();
    let mut d = gap_ns;
    while d >= 0x80 {
        delta.push((d as u8) | 0x80);
        d >>= 7;
    }
    delta.push(d as u8);
    let mut entries = Vec::with_capacity(n as usize * (delta.len() + 1));
    entries.push(1u8);
    for _ in 1..n {
        entries.extend_from_slice(&delta);
        entries.push(1);
    }
    let mut v = vec![2u8, 4];
    for f in [window_ns, limit, first, last, n, entries.len() as u64] {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v.extend_from_slice(&entries);
    v
}

/// Starts recording every command's server time (`SLOWLOG` with no threshold and room for
/// `len` entries), from an empty log. The server times a command from its start to its
/// reply, without the client's round trip: a bound on it holds on a busy machine, where a
/// bound on the time a client waits does not.
pub fn slowlog_start(c: &mut redis::Connection, len: u64) {
    q::<()>(c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    q::<()>(c, &["CONFIG", "SET", "slowlog-max-len", &len.to_string()]);
    q::<()>(c, &["SLOWLOG", "RESET"]);
}

/// The commands the server ran since [`slowlog_start`], oldest first: `(words, µs)`, the
/// command's words (as SLOWLOG keeps them: at most 32, each at most 128 bytes) and the
/// server's time for it.
pub fn slowlog_entries(c: &mut redis::Connection) -> Vec<(Vec<String>, i64)> {
    let entries: Vec<Vec<redis::Value>> = q(c, &["SLOWLOG", "GET", "-1"]);
    let mut out: Vec<(i64, Vec<String>, i64)> = entries
        .iter()
        .filter_map(|e| match (e.first(), e.get(2), e.get(3)) {
            (
                Some(redis::Value::Int(id)),
                Some(redis::Value::Int(us)),
                Some(redis::Value::Array(w)),
            ) => {
                let words = w
                    .iter()
                    .map(|v| match v {
                        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => format!("{other:?}"),
                    })
                    .collect();
                Some((*id, words, *us))
            }
            _ => None,
        })
        .collect();
    out.sort_by_key(|e| e.0);
    out.into_iter().map(|(_, w, us)| (w, us)).collect()
}

/// The server's time (µs) of each command named `name` (any case) since [`slowlog_start`],
/// oldest first.
pub fn slowlog_times(c: &mut redis::Connection, name: &str) -> Vec<i64> {
    slowlog_entries(c)
        .into_iter()
        .filter(|(w, _)| w.first().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|(_, us)| us)
        .collect()
}

/// The median of `v` (the upper one of an even count); panics on an empty slice. A median of
/// many server times is what a call costs: a call the busy machine interrupted is one
/// sample among many.
pub fn median(v: &[i64]) -> i64 {
    assert!(!v.is_empty(), "no samples");
    let mut v = v.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

/// The most wall time, in ms, a test allows to pass between two commands whose replies it
/// compares (or between a command and the client's clock): generous, because on a loaded
/// machine (make test-loaded) a process can wait for a CPU for tens of milliseconds at a
/// time. A millisecond field checked within this margin still tells the right value from the
/// wrong ones (every such test expects seconds, or checks the exact value on a frozen clock).
pub const WALL_SLACK_MS: i64 = 2_000;

/// A server whose clock is frozen at a whole second (real time, rounded down): its replies'
/// millisecond fields are exact, and time moves only when the test moves it
/// (`clock.freeze_at(start + …)`), however slowly the machine runs the test. None (and a
/// note) where the clock shim does not govern the server (Valkey 9.1).
pub fn frozen_server() -> Option<(Clock, Server, redis::Connection, u64)> {
    let clock = Clock::new();
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    if !clock.governs(&mut c) {
        return None;
    }
    let start = now_ns() / 1_000_000_000 * 1_000_000_000;
    clock.freeze_at(start);
    Some((clock, s, c, start))
}

/// Nanoseconds since the epoch by this machine's clock (the test servers run here too).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Reads the little-endian u64 at `offset`.
pub fn le_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}

/// Writes the little-endian u64 at `offset`.
pub fn set_le_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

/// Clock steps a server's real-time clock through `tests/support/clock_shim.c` (built here
/// with the system C compiler): the shim adds the offset this value writes to a file.
pub struct Clock {
    shim: PathBuf,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Clock {
    /// Builds the shim (once per test binary run) and a zero offset.
    pub fn new() -> Clock {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let source = root.join("tests/support/clock_shim.c");
        let dir = tempfile::Builder::new()
            .prefix("redis-rl-clock-")
            .tempdir()
            .expect("temp dir");
        let shim = dir.path().join("libclockshim.so");
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&shim)
            .arg(&source)
            .status()
            .expect("run the C compiler for the clock shim");
        assert!(status.success(), "building the clock shim failed");
        let file = dir.path().join("offset");
        std::fs::write(&file, [0u8; 16]).expect("write the offset file");
        Clock {
            shim,
            file,
            _dir: dir,
        }
    }

    /// The environment that makes a server process use this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.shim.display().to_string()),
            (
                "RL_CLOCK_OFFSET_FILE".into(),
                self.file.display().to_string(),
            ),
        ]
    }

    /// Sets the server clock to real time plus `offset_us` microseconds (negative: behind).
    pub fn step_to(&self, offset_us: i64) {
        self.write(0, offset_us.to_le_bytes());
        self.write(8, 0u64.to_le_bytes());
    }

    /// Freezes the server clock at `ns` since the epoch: it reads exactly that until moved.
    pub fn freeze_at(&self, ns: u64) {
        self.write(8, ns.max(1).to_le_bytes());
    }

    /// Whether this clock governs what the server behind `c` reads, checked by freezing it
    /// and asking `TIME` (then back to real time). Not on Valkey 9.1, which derives its wall
    /// clock from the monotonic one: there a test that needs a stepped clock says SKIPPED
    /// and returns (`make test` runs it on Redis 7.0, where the shim governs the clock).
    pub fn governs(&self, c: &mut redis::Connection) -> bool {
        const PROBE_NS: u64 = 1_700_000_000_123_456_000;
        self.freeze_at(PROBE_NS);
        let t: Vec<String> = q(c, &["TIME"]);
        self.step_to(0);
        let us = t[0].parse::<u64>().unwrap_or(0) * 1_000_000 + t[1].parse::<u64>().unwrap_or(0);
        if us == PROBE_NS / 1000 {
            return true;
        }
        let version = info_field(c, "server", "redis_version").unwrap_or_default();
        eprintln!("SKIPPED: the clock shim does not govern this server ({version})");
        false
    }

    fn write(&self, at: u64, bytes: [u8; 8]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .expect("open the offset file");
        // In place: the shim maps these bytes; truncating would pull the page away.
        f.write_all_at(&bytes, at).expect("write the clock file");
    }
}
