//! What the gateway's integration tests share: real `redis-server`s from the repository's
//! harness (`tests/common/mod.rs`: free loopback ports, temporary directories, killed by
//! PID), the `rl-gateway` binary run as a child process on ports it picks itself (it
//! prints them), and a tonic client built from the same `envoy-types`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

use crate::common::Server;

static INIT: Once = Once::new();

/// Points the shared harness at the module (its default is relative to the root crate).
pub fn init() {
    INIT.call_once(|| {
        if std::env::var_os("RL_MODULE").is_none() {
            let p: PathBuf =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/libredis_rl.so");
            assert!(
                p.exists(),
                "no module at {}: run `cargo build --release` at the workspace root",
                p.display()
            );
            std::env::set_var("RL_MODULE", p);
        }
    });
}

/// A server with the module, or one without it (the client loads the Lua fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Module,
    Fallback,
}

impl Kind {
    pub fn server(self) -> Server {
        init();
        match self {
            Kind::Module => Server::start(),
            Kind::Fallback => Server::builder().no_module().start(),
        }
    }
}

/// Defines each named `async fn(Kind)` test twice, in `mod module` and `mod fallback`: on a
/// server with the module and on one without it (the Lua fallback).
#[allow(unused_macros)]
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {
        mod module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Kind::Module).await;
                }
            )*
        }
        mod fallback {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Kind::Fallback).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_modes;

pub fn url(server: &Server) -> String {
    format!("redis://127.0.0.1:{}/", server.port)
}

/// A running `rl-gateway`, killed on drop.
pub struct Gateway {
    child: Child,
    pub grpc: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub config: PathBuf,
    _dir: tempfile::TempDir,
    stderr: PathBuf,
}

impl Gateway {
    /// Starts the gateway on `redis` with `config` (YAML text) and extra arguments, serving
    /// gRPC and HTTP on ports of its choosing.
    pub fn start(redis: &str, config: &str, extra: &[&str]) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratelimit.yaml");
        std::fs::write(&path, config).unwrap();
        Gateway::start_with(&[redis], &path, dir, extra)
    }

    pub fn start_with(
        redis: &[&str],
        config: &Path,
        dir: tempfile::TempDir,
        extra: &[&str],
    ) -> Gateway {
        let stderr = dir.path().join("gateway.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-gateway"));
        for r in redis {
            cmd.arg("--redis").arg(r);
        }
        cmd.arg("--config")
            .arg(config)
            .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let mut child = cmd.spawn().expect("start rl-gateway");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let (mut grpc, mut http) = (None, None);
        while grpc.is_none() || http.is_none() {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.wait();
                panic!(
                    "rl-gateway exited before listening: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            };
            if let Some(a) = line.strip_prefix("rl-gateway: grpc listening on ") {
                grpc = a.parse().ok();
            }
            if let Some(a) = line.strip_prefix("rl-gateway: http listening on ") {
                http = a.parse().ok();
            }
        }
        // Keep reading stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Gateway {
            child,
            grpc,
            http,
            config: config.to_path_buf(),
            _dir: dir,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the gateway logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        let addr = self.grpc.expect("grpc address");
        RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect to the gateway")
    }

    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http.expect("http address"))
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A descriptor of (key, value) entries.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A descriptor with its own hits_addend.
pub fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = desc(entries);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    d
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    }
}

pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(req)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// Polls `f` until it holds or `timeout` passes.
pub async fn eventually(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A plain HTTP/1.1 request over a fresh connection: (status, lowercase headers, body).
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let hs = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, hs, body.to_owned())
}

pub fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}
