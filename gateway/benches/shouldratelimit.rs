//! `make bench-gateway`: ShouldRateLimit against the `rl-gateway` binary (this crate's bench
//! build) on a real `redis-server` with the module, and, when `RATELIMIT_BIN` names a built
//! envoyproxy/ratelimit (the Makefile tries `go install`), against it on a server of its own,
//! with the same configuration and the same load: decisions per second with C concurrent
//! clients (each on its own HTTP/2 connection), p50/p99 latency with 1 and 3 descriptors per
//! request, Redis calls per request (`INFO commandstats` deltas over the load only), and what
//! two concurrent clients get admitted against one limit. Every run is bounded in requests and
//! seconds; `BENCH_QUICK=1` shortens, `BENCH_CLIENTS=N` sets C (default 8).

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

use common::Server;
use support::{desc, request, url, Gateway, OK};

/// The limit two clients race for in the admission check.
const RACE_LIMIT: u64 = 100;
/// Requests each of the two racing clients sends.
const RACE_EACH: u64 = 150;

/// One file, both services: three key-only descriptors with limits no run reaches (every
/// value its own counter), and one small limit for the admission check.
const CONFIG: &str = "domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 100}
";

struct Settings {
    seconds: f64,
    max: u64,
    clients: usize,
}

/// One load run's figures.
struct Run {
    done: u64,
    not_ok: u64,
    secs: f64,
    p50_us: f64,
    p99_us: f64,
    calls: BTreeMap<String, u64>,
}

impl Run {
    fn calls_per_request(&self) -> String {
        let total: u64 = self.calls.values().sum();
        let per = |n: u64| n as f64 / self.done.max(1) as f64;
        let parts: Vec<String> = self
            .calls
            .iter()
            .map(|(c, n)| format!("{c} {:.2}", per(*n)))
            .collect();
        format!("{:.2} ({})", per(total), parts.join(", "))
    }
}

fn request_for(ndesc: usize, client: usize, i: u64) -> RateLimitRequest {
    let ip = format!("10.{}.{}.{}", client, (i / 256) % 4, i % 256);
    let user = format!("u{}-{}", client, i % 1000);
    let path = format!("/p{}", i % 10);
    let all = [
        desc(&[("remote_address", &ip)]),
        desc(&[("user", &user)]),
        desc(&[("path", &path)]),
    ];
    request("bench", all[..ndesc].to_vec(), 1)
}

async fn connect(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// `cmdstat_*` calls from `INFO commandstats`.
fn commandstats(con: &mut redis::Connection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_ascii_uppercase(), calls))
        })
        .collect()
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

async fn load(
    addr: SocketAddr,
    redis: &mut redis::Connection,
    clients: usize,
    ndesc: usize,
    s: &Settings,
) -> Run {
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(connect(addr).await);
    }
    // Warm-up: a few requests per connection, outside the figures.
    for (c, conn) in conns.iter_mut().enumerate() {
        for i in 0..20 {
            conn.should_rate_limit(request_for(ndesc, c, i))
                .await
                .expect("ShouldRateLimit");
        }
    }
    let before = commandstats(redis);
    let per_client = s.max / clients as u64;
    let deadline = Duration::from_secs_f64(s.seconds);
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut not_ok = 0u64;
                let mut i = 0u64;
                while i < per_client && start.elapsed() < deadline {
                    let req = request_for(ndesc, c, i + 20);
                    let t = Instant::now();
                    let r = conn.should_rate_limit(req).await;
                    lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    match r {
                        Ok(r) if r.get_ref().overall_code == OK => {}
                        _ => not_ok += 1,
                    }
                    i += 1;
                }
                (lat, not_ok)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut not_ok = 0;
    for t in tasks {
        let (l, n) = t.await.expect("client task");
        lat.extend(l);
        not_ok += n;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = commandstats(redis);
    let calls = after
        .iter()
        .filter(|(c, _)| c.as_str() != "INFO")
        .map(|(c, n)| (c.clone(), n - before.get(c).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    lat.sort_unstable();
    Run {
        done: lat.len() as u64,
        not_ok,
        secs,
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        calls,
    }
}

/// Two clients at once, `RACE_EACH` requests each, on one counter limited to `RACE_LIMIT`:
/// how many are admitted.
async fn race(addr: SocketAddr) -> u64 {
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = connect(addr).await;
                let mut ok = 0u64;
                for _ in 0..RACE_EACH {
                    let req = request("bench", vec![desc(&[("tenant", "race")])], 1);
                    let r = conn.should_rate_limit(req).await.expect("ShouldRateLimit");
                    if r.get_ref().overall_code == OK {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("race task");
    }
    ok
}

/// Runs every phase against one service and prints its rows.
async fn bench(name: &str, addr: SocketAddr, server: &Server, s: &Settings) {
    let mut redis = server.conn();
    for ndesc in [1, 3] {
        for clients in [1, s.clients] {
            let r = load(addr, &mut redis, clients, ndesc, s).await;
            println!(
                "{name:<22} {ndesc:>5} {clients:>7} {:>11.0} {:>7.0} {:>7.0}  {}{}",
                r.done as f64 / r.secs,
                r.p50_us,
                r.p99_us,
                r.calls_per_request(),
                if r.not_ok > 0 {
                    format!("  ({} not OK)", r.not_ok)
                } else {
                    String::new()
                }
            );
        }
    }
    let ok = race(addr).await;
    println!("{name:<22} two clients x {RACE_EACH} on one limit of {RACE_LIMIT}: {ok} admitted");
}

/// A running envoyproxy/ratelimit, killed on drop.
struct Theirs {
    child: Child,
    grpc: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Theirs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_theirs(bin: &Path, server: &Server) -> Result<Theirs, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let conf = dir.path().join("runtime/ratelimit/config");
    std::fs::create_dir_all(&conf).map_err(|e| e.to_string())?;
    std::fs::write(conf.join("bench.yaml"), CONFIG).map_err(|e| e.to_string())?;
    let port = || common::free_port().to_string();
    let grpc_port = port();
    let log = dir.path().join("ratelimit.log");
    let child = Command::new(bin)
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", server.port))
        .env("RUNTIME_ROOT", dir.path().join("runtime"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("USE_STATSD", "false")
        .env("LOG_LEVEL", "warn")
        .env("HOST", "127.0.0.1")
        .env("PORT", port())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", &grpc_port)
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", port())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).map_err(|e| e.to_string())?)
        .stderr(std::fs::File::create(dir.path().join("stderr.log")).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut theirs = Theirs {
        child,
        grpc,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(grpc).is_err() {
        if Instant::now() > deadline || theirs.child.try_wait().ok().flatten().is_some() {
            let err =
                std::fs::read_to_string(theirs._dir.path().join("stderr.log")).unwrap_or_default();
            return Err(format!(
                "did not listen on {grpc}: {}",
                err.lines().last().unwrap_or("")
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(theirs)
}

/// Waits until a service answers with the configuration loaded (a limit on `path`).
async fn ready(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = RateLimitServiceClient::connect(format!("http://{addr}")).await {
            let req = request("bench", vec![desc(&[("path", "/ready")])], 1);
            if let Ok(r) = c.should_rate_limit(req).await {
                if r.get_ref()
                    .statuses
                    .first()
                    .is_some_and(|s| s.current_limit.is_some())
                {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{addr}: no configured limit within 20 s"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes --bench; no other arguments.
    let quick = std::env::var_os("BENCH_QUICK").is_some_and(|v| !v.is_empty());
    let s = Settings {
        seconds: if quick { 1.0 } else { 5.0 },
        max: if quick { 20_000 } else { 200_000 },
        clients: std::env::var("BENCH_CLIENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    };
    support::init();
    println!(
        "ShouldRateLimit, each run {} s or {} requests at most, whichever first; client, service \
         and redis-server on this machine ({} cores)",
        s.seconds,
        s.max,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<22} {:>5} {:>7} {:>11} {:>7} {:>7}  redis calls/request (by command)",
        "service", "descs", "clients", "decisions/s", "p50 us", "p99 us"
    );

    {
        let server = Server::start();
        let gw = Gateway::start(&url(&server), CONFIG, &[]);
        let addr = gw.grpc.expect("grpc address");
        ready(addr).await.expect("rl-gateway ready");
        bench("rl-gateway", addr, &server, &s).await;
    }

    let theirs = std::env::var_os("RATELIMIT_BIN").map(PathBuf::from);
    match theirs {
        None => println!("envoyproxy/ratelimit: not run: RATELIMIT_BIN is not set"),
        Some(bin) if !bin.exists() => println!(
            "envoyproxy/ratelimit: not run: {} was not built{}",
            bin.display(),
            std::env::var("RATELIMIT_WHY")
                .map(|w| format!(" ({w})"))
                .unwrap_or_default()
        ),
        Some(bin) => {
            // Its own server: its INFO figures are its own.
            let server = Server::builder().no_module().start();
            match start_theirs(&bin, &server) {
                Err(e) => println!("envoyproxy/ratelimit: not run: {e}"),
                Ok(t) => match ready(t.grpc).await {
                    Err(e) => println!("envoyproxy/ratelimit: not run: {e}"),
                    Ok(()) => {
                        if let Ok(v) = std::env::var("RATELIMIT_VERSION") {
                            println!("envoyproxy/ratelimit {v}, on a redis-server of its own");
                        }
                        bench("envoyproxy/ratelimit", t.grpc, &server, &s).await
                    }
                },
            }
        }
    }
}
