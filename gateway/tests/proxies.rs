//! Real proxies in front of a small upstream, asking the gateway before each request: nginx
//! (`auth_request`, with the documented snippet: gateway/examples/nginx.conf) and Caddy
//! (`forward_auth`: gateway/examples/Caddyfile). A test fails when its proxy is not installed
//! (`make gateway-deps` installs both; `NGINX` / `CADDY` name the binaries; default
//! /usr/sbin/nginx, /usr/bin/caddy).

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{header, http_get, url, Gateway, Kind};

const CONFIG: &str = r#"
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
http_rules:
  - descriptors:
      - [{key: remote_address, from: remote_address}]
"#;

/// The upstream: answers every request with 200 "upstream" and the path it got.
async fn upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let rl = req
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("ratelimit:"))
                    .unwrap_or("")
                    .to_owned();
                let body = format!("upstream {rl}\n");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn render(
    template: &str,
    gw: &Gateway,
    up: std::net::SocketAddr,
    listen: &str,
    dir: &Path,
) -> String {
    template
        .replace("@GATEWAY@", &gw.http.unwrap().to_string())
        .replace("@UPSTREAM@", &up.to_string())
        .replace("@LISTEN@", listen)
        .replace("@DIR@", &dir.display().to_string())
}

async fn wait_ready(addr: std::net::SocketAddr) {
    support::eventually("the proxy to listen", Duration::from_secs(15), async || {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
}

async fn check_through(addr: std::net::SocketAddr, admitted_fields_to_client: bool) {
    for left in ["1", "0"] {
        let (status, hs, body) = http_get(addr, "/page?x=1", &[]).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with("upstream"), "{hs:?} {body:?}");
        if admitted_fields_to_client {
            assert_eq!(
                header(&hs, "ratelimit-policy"),
                Some("\"remote_address\";q=2;w=60")
            );
            assert!(header(&hs, "ratelimit")
                .unwrap()
                .contains(&format!(";r={left};")));
        } else {
            // Handed to the upstream instead.
            assert!(body.contains(&format!(";r={left};")), "{body}");
        }
    }
    let (status, hs, body) = http_get(addr, "/page", &[]).await;
    assert_eq!(status, 429, "{hs:?} {body}");
    assert_eq!(body.trim(), "rate limited");
    let retry: u64 = header(&hs, "retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(
        header(&hs, "ratelimit-policy"),
        Some("\"remote_address\";q=2;w=60")
    );
    assert!(header(&hs, "ratelimit").unwrap().contains(";r=0;"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_with_the_documented_snippet() {
    let bin = std::env::var("NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".into());
    assert!(
        Path::new(&bin).exists(),
        "no nginx at {bin}: `make gateway-deps` installs Debian's package"
    );
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let conf = dir.path().join("nginx.conf");
    let template = include_str!("../examples/nginx.conf");
    std::fs::write(&conf, render(template, &gw, up, &listen, dir.path())).unwrap();
    let child = Command::new(&bin)
        .arg("-p")
        .arg(dir.path())
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    let _nginx = Proxy(child);
    wait_ready(listen.parse().unwrap()).await;
    check_through(listen.parse().unwrap(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_forward_auth() {
    let bin = std::env::var("CADDY").unwrap_or_else(|_| "/usr/bin/caddy".into());
    assert!(
        Path::new(&bin).exists(),
        "no caddy at {bin}: `make gateway-deps` installs Debian's package"
    );
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), CONFIG, &[]);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let conf = dir.path().join("Caddyfile");
    let template = include_str!("../examples/Caddyfile");
    std::fs::write(&conf, render(template, &gw, up, &listen, dir.path())).unwrap();
    let log = std::fs::File::create(dir.path().join("caddy.log")).unwrap();
    let child = Command::new(&bin)
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&conf)
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start caddy");
    let _caddy = Proxy(child);
    wait_ready(listen.parse().unwrap()).await;
    check_through(listen.parse().unwrap(), false).await;
}
