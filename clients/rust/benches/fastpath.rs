//! Benchmark of the local fast path, the same measurement as the Python package's
//! `clients/python/bench/fastpath.py`: N client processes hammer one key above its limit.
//!
//! ```sh
//! cargo bench -p redis-rl-client --bench fastpath -- [--procs 4] [--seconds 3] [--batch 10]
//!     [--redis-url URL] [--out FILE]
//! ```
//!
//! Starts its own `redis-server` with the module (`$RL_MODULE`, default the workspace's
//! `target/release/libredis_rl.so`) on a free loopback port, unless `--redis-url` is given.
//! Each process (this program again, with `--worker`) runs one `Limiter` on a current-thread
//! Tokio runtime in a tight loop (one decision at a time, as the Python processes do) on one
//! GCRA key for the given time, three ways: no fast path, the deny cache, and the deny cache
//! with batching. Reports, per configuration: requests admitted against what the limit allows
//! over the run (burst + rate × elapsed), Redis calls per admitted request, and decisions per
//! second per process. Batching must never admit more than the limit: the program exits 1 if
//! any configuration does.
//!
//! Then, in one process, the cost of one decision (the comparison with an in-process limiter
//! such as `tower-governor`): a Redis round trip, a local denial, a batch-credit admission,
//! `governor`'s in-process keyed check, and a Redis round trip with 64 concurrent tasks
//! sharing the limiter's one multiplexed connection.

use std::net::TcpListener;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_rl_client::{Gcra, Limiter};

const PERIOD: u64 = 1;
/// (burst, rate per second): a low limit (most requests denied), a higher one, both far below
/// what the processes ask for; and one the processes cannot reach (where batching pays).
const SCENARIOS: [(u64, u64); 3] = [(20, 100), (200, 2000), (1000, 100_000)];

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn epoch_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One worker's figures, one line on its stdout.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    t0: f64,
    t1: f64,
    decisions: u64,
    admitted: u64,
    redis_calls: u64,
    denied_locally: u64,
    allowed_locally: u64,
    refunded: u64,
}

fn builder(url: &str, config: &str, batch: u64) -> redis_rl_client::LimiterBuilder {
    let b = Limiter::builder(url).timeout(Duration::from_secs(2));
    match config {
        "none" => b.deny_cache(false),
        "deny" => b,
        "batch" => b.batch(batch).batch_hold(Duration::from_millis(100)),
        other => panic!("unknown configuration {other}"),
    }
}

fn worker(args: &[String]) {
    let [url, key, burst, rate, config, batch, start_at, seconds] = args else {
        panic!("worker arguments: {args:?}");
    };
    let (burst, rate, batch): (u64, u64, u64) = (
        burst.parse().unwrap(),
        rate.parse().unwrap(),
        batch.parse().unwrap(),
    );
    let start_at: u64 = start_at.parse().unwrap();
    let seconds: f64 = seconds.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = rt.block_on(async {
        let lim = builder(url, config, batch).build().await.unwrap();
        let g = Gcra::new(burst, rate, PERIOD).unwrap();
        lim.check("warm-up", &g).peek().await.unwrap(); // connect and detect before the start
        while now_ms() < start_at {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let t0 = epoch_s();
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let (mut decisions, mut admitted) = (0u64, 0u64);
        while Instant::now() < end {
            if lim.check(key.as_str(), &g).await.unwrap().allowed {
                admitted += 1;
            }
            decisions += 1;
        }
        let t1 = epoch_s();
        lim.close().await; // refunds held batch units
        let c = lim.counters().snapshot();
        Figures {
            t0,
            t1,
            decisions,
            admitted,
            redis_calls: c.redis_calls - 1, // the warm-up
            denied_locally: c.denied_locally,
            allowed_locally: c.allowed_locally,
            refunded: c.refunded,
        }
    });
    println!(
        "{} {} {} {} {} {} {} {}",
        f.t0,
        f.t1,
        f.decisions,
        f.admitted,
        f.redis_calls,
        f.denied_locally,
        f.allowed_locally,
        f.refunded
    );
}

fn parse(line: &str) -> Figures {
    let v: Vec<&str> = line.split_whitespace().collect();
    let n = |i: usize| v[i].parse::<u64>().unwrap();
    Figures {
        t0: v[0].parse().unwrap(),
        t1: v[1].parse().unwrap(),
        decisions: n(2),
        admitted: n(3),
        redis_calls: n(4),
        denied_locally: n(5),
        allowed_locally: n(6),
        refunded: n(7),
    }
}

struct Row {
    limit: String,
    config: String,
    admitted: u64,
    bound: u64,
    calls_per_admitted: f64,
    decisions_per_s: f64,
    local_denials: u64,
    local_admissions: u64,
    refunded: u64,
}

fn run(url: &str, procs: usize, seconds: f64, limit: (u64, u64), config: &str, batch: u64) -> Row {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let key = format!(
        "bench:{}:{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let start_at = now_ms() + 1000;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<Child> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .arg("--worker")
                .args([
                    url,
                    &key,
                    &limit.0.to_string(),
                    &limit.1.to_string(),
                    config,
                    &batch.to_string(),
                    &start_at.to_string(),
                    &seconds.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let figures: Vec<Figures> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "a worker failed");
            parse(String::from_utf8_lossy(&out.stdout).trim())
        })
        .collect();
    let t0 = figures.iter().map(|f| f.t0).fold(f64::INFINITY, f64::min);
    let t1 = figures.iter().map(|f| f.t1).fold(0.0, f64::max);
    let admitted: u64 = figures.iter().map(|f| f.admitted).sum();
    let calls: u64 = figures.iter().map(|f| f.redis_calls).sum();
    let bound = limit.0 + ((t1 - t0) * limit.1 as f64 / PERIOD as f64) as u64 + 1;
    Row {
        limit: format!("burst {}, {}/s", limit.0, limit.1),
        config: match config {
            "none" => "no fast path".into(),
            "deny" => "deny cache".into(),
            _ => format!("deny cache + batch {batch}"),
        },
        admitted,
        bound,
        calls_per_admitted: if admitted > 0 {
            calls as f64 / admitted as f64
        } else {
            f64::INFINITY
        },
        decisions_per_s: figures
            .iter()
            .map(|f| f.decisions as f64 / (f.t1 - f.t0))
            .sum::<f64>()
            / procs as f64,
        local_denials: figures.iter().map(|f| f.denied_locally).sum(),
        local_admissions: figures.iter().map(|f| f.allowed_locally).sum(),
        refunded: figures.iter().map(|f| f.refunded).sum(),
    }
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Nanoseconds per call of `f`, over `seconds`.
async fn per_call<F, Fut>(seconds: f64, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut n = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            f().await;
        }
        n += 64;
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn costs(url: &str, seconds: f64) -> Vec<(String, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    rt.block_on(async {
        let big = Gcra::new(1_000_000_000, 1_000_000_000, 1).unwrap(); // never denies here
        let tiny = Gcra::new(1, 1, 3600).unwrap();
        let plain = builder(url, "none", 0).build().await.unwrap();
        let ns = per_call(seconds, || async {
            assert!(plain.check("cost:rt", &big).await.unwrap().allowed);
        })
        .await;
        rows.push((
            "a decision in Redis (one round trip, loopback, module)".to_owned(),
            format!("{:.1} µs", ns / 1000.0),
        ));
        let cached = builder(url, "deny", 0).build().await.unwrap();
        cached.check("cost:deny", &tiny).await.unwrap();
        cached.check("cost:deny", &tiny).await.unwrap();
        let ns = per_call(seconds, || async {
            assert!(!cached.check("cost:deny", &tiny).await.unwrap().allowed);
        })
        .await;
        rows.push((
            "a local denial (deny cache)".to_owned(),
            format!("{:.0} ns", ns),
        ));
        let batched = builder(url, "batch", 10).build().await.unwrap();
        let ns = per_call(seconds, || async {
            assert!(batched.check("cost:batch", &big).await.unwrap().allowed);
        })
        .await;
        rows.push((
            "an admission with batch 10 (one round trip per 10)".to_owned(),
            format!("{:.1} µs", ns / 1000.0),
        ));
        // 64 tasks share one limiter (one multiplexed connection): the round trip overlaps.
        let shared = plain.clone();
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let start = Instant::now();
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let lim = shared.clone();
                let g = big.clone();
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < end {
                        lim.check(format!("cost:conc:{i}"), &g).await.unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut total = 0u64;
        for t in tasks {
            total += t.await.unwrap();
        }
        rows.push((
            "decisions per second, 64 concurrent tasks, one process, no fast path".to_owned(),
            thousands(total as f64 / start.elapsed().as_secs_f64()),
        ));
    });
    // governor, the in-process limiter tower-governor uses: a keyed check.
    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let keyed = governor::RateLimiter::keyed(quota);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut n = 0u64;
    while Instant::now() < end {
        for i in 0..64u64 {
            let _ = std::hint::black_box(keyed.check_key(&(i % 8)));
        }
        n += 64;
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    rows.push((
        "governor keyed check (in process, what tower-governor calls)".to_owned(),
        format!("{:.0} ns", ns),
    ));
    rows
}

struct RedisServer {
    child: Child,
    dir: PathBuf,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server() -> (RedisServer, String) {
    let module = std::env::var("RL_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/libredis_rl.so")
        });
    assert!(module.exists(), "no module at {}", module.display());
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("rl-bench-rs-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child =
        Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--logfile", "redis.log", "--dir"])
            .arg(&dir)
            .arg("--loadmodule")
            .arg(&module)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
    let server = RedisServer { child, dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let mut buf = [0u8; 7];
            if s.write_all(b"PING\r\n").is_ok()
                && s.read(&mut buf).is_ok()
                && buf.starts_with(b"+PONG")
            {
                break;
            }
        }
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, format!("redis://127.0.0.1:{port}/"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        worker(&args[1..]);
        return;
    }
    let mut procs = 4usize;
    let mut seconds: f64 = std::env::var("BENCH_FASTPATH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let mut batch = 10u64;
    let mut url = None;
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--procs" => procs = it.next().unwrap().parse().unwrap(),
            "--seconds" => seconds = it.next().unwrap().parse().unwrap(),
            "--batch" => batch = it.next().unwrap().parse().unwrap(),
            "--redis-url" => url = it.next().cloned(),
            "--out" => out = it.next().cloned(),
            "--bench" => {} // what `cargo bench` passes
            other => panic!("unknown argument {other}"),
        }
    }
    let (_server, url) = match url {
        Some(u) => (None, u),
        None => {
            let (s, u) = start_server();
            (Some(s), u)
        }
    };
    let configs = ["none", "deny", "batch"];
    let mut rows = Vec::new();
    let mut ok = true;
    for limit in SCENARIOS {
        for config in configs {
            let r = run(&url, procs, seconds, limit, config, batch);
            ok &= r.admitted <= r.bound;
            rows.push(r);
        }
    }
    let cost_rows = costs(&url, seconds.min(2.0));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut lines = vec![
        format!(
            "{procs} processes on one GCRA key for {seconds} s each configuration, each process one \
             Limiter on a current-thread Tokio runtime in a tight loop (far above the limit); \
             redis-server with the module on loopback; {cpus} CPUs shared by everything."
        ),
        String::new(),
        "| limit | configuration | admitted / limit allows | Redis calls per admitted | decisions/s per process | local denials | local admissions | refunded |".into(),
        "|---|---|---|---|---|---|---|---|".into(),
    ];
    for r in &rows {
        lines.push(format!(
            "| {} | {} | {} / {} | {:.2} | {} | {} | {} | {} |",
            r.limit,
            r.config,
            r.admitted,
            r.bound,
            r.calls_per_admitted,
            thousands(r.decisions_per_s),
            thousands(r.local_denials as f64),
            thousands(r.local_admissions as f64),
            r.refunded
        ));
    }
    lines.push(String::new());
    lines.push("One process, one decision at a time unless stated:".into());
    lines.push(String::new());
    lines.push("| what | cost |".into());
    lines.push("|---|---|".into());
    for (what, cost) in &cost_rows {
        lines.push(format!("| {what} | {cost} |"));
    }
    let text = lines.join("\n");
    println!("{text}");
    if let Some(path) = out {
        std::fs::write(path, text + "\n").unwrap();
    }
    if !ok {
        eprintln!("FAILED: a configuration admitted more than the limit allows");
        std::process::exit(1);
    }
}
