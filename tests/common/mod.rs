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
    assert!(debug.exists(), "no module built: run `make build` (or `cargo build --release`)");
    debug
}

/// Path of the debug build (which has the RL.PANIC trigger).
pub fn debug_module_path() -> PathBuf {
    if let Ok(p) = std::env::var("RL_DEBUG_MODULE") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/libredis_rl.so");
    assert!(p.exists(), "no debug module built: run `cargo build`");
    p
}

/// The server binary: `$REDIS_SERVER` or `redis-server` from PATH.
pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A running redis-server with the module loaded.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    module: Option<PathBuf>,
}

/// Builds a server with extra configuration.
pub struct Builder {
    extra: Vec<String>,
    module: Option<PathBuf>,
    dir: Option<tempfile::TempDir>,
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

    /// Starts in a directory prepared by the caller (e.g. holding an RDB fixture).
    pub fn dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// Starts the server and waits until it answers.
    pub fn start(self) -> Server {
        let dir = match self.dir {
            Some(d) => d,
            None => tempfile::Builder::new().prefix("redis-rl-test-").tempdir().expect("temp dir"),
        };
        let mut server =
            Server { child: None, port: 0, dir, extra: self.extra, module: self.module };
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
        Builder { extra: Vec::new(), module: Some(module_path()), dir: None }
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
        for _ in 0..5 {
            self.port = free_port();
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
        cmd.arg("--port").arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--daemonize", "no", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes", "--enable-module-command", "yes"])
            .arg("--dir").arg(self.dir.path())
            .arg("--logfile").arg(self.log_path())
            .args(self.module.iter().flat_map(|m| [std::ffi::OsStr::new("--loadmodule"), m.as_os_str()]))
            .args(&self.extra)
            .stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    }

    fn launch(&mut self) -> Result<(), String> {
        let child = self.command().spawn().map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
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
                return Err(format!("no PING answer within {START_DEADLINE:?}; log:\n{}", self.log()));
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
        self.try_conn().unwrap_or_else(|e| panic!("connect to port {}: {e}; log:\n{}", self.port, self.log()))
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
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
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
    cmd.query(con).unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// Runs a limiting command and returns its five-integer reply.
pub fn rl(con: &mut redis::Connection, args: &[&str]) -> [i64; 5] {
    let v: Vec<i64> = q(con, args);
    v.try_into().unwrap_or_else(|v: Vec<i64>| panic!("{args:?}: not five integers: {v:?}"))
}

/// Runs a command that must fail, returning the full error line (`ERR …`, `WRONGTYPE …`).
pub fn err(con: &mut redis::Connection, args: &[&[u8]]) -> String {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("utf-8 command name"));
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query::<redis::Value>(con) {
        Ok(v) => panic!("{:?} succeeded with {v:?}", args.iter().map(|a| String::from_utf8_lossy(a)).collect::<Vec<_>>()),
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
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_owned()))
}
