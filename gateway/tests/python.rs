//! A Python grpcio client of the gateway, its stubs compiled at test time from the .proto
//! files the envoy-types crate ships (Envoy's own API), not from this crate's Rust types.
//! Runs with the Python named by `RL_GATEWAY_PYTHON` (with grpcio and grpcio-tools;
//! scripts/test.sh makes .venv-gateway), and says it skipped without it.

// The root crate's harness, written for its older MSRV (1.85).
#[allow(clippy::manual_is_multiple_of)]
#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::path::PathBuf;
use std::process::Command;

use support::{url, Gateway, Kind};

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-ip}
"#;

/// The host's target triple (`rustc -vV`).
fn host() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

/// envoy-types' proto/ directory, from `cargo metadata` (offline, this platform's graph:
/// every crate of it is already here, since the test was built).
fn proto_root() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(host())
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let manifest = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types in the dependency graph");
    PathBuf::from(manifest).parent().unwrap().join("proto")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_client_from_envoys_protos() {
    let Some(python) = std::env::var_os("RL_GATEWAY_PYTHON") else {
        eprintln!("skipped: RL_GATEWAY_PYTHON (a Python with grpcio and grpcio-tools) is not set");
        return;
    };
    let server = Kind::Module.server();
    let gw = Gateway::start(&url(&server), CONFIG, &["--ratelimit-headers"]);
    let out_dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/envoy_client.py");
    let out = tokio::task::spawn_blocking({
        let root = proto_root();
        let out_dir = out_dir.path().to_path_buf();
        let target = gw.grpc.unwrap().to_string();
        move || {
            Command::new(python)
                .arg(script)
                .arg(root)
                .arg(out_dir)
                .arg(target)
                .output()
                .expect("run the Python client")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines[0]["compiled"].as_u64().unwrap() > 10, "{}", lines[0]);
    let codes: Vec<&str> = lines[1..4]
        .iter()
        .map(|l| l["overall"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);
    assert_eq!(lines[1]["unit"], "MINUTE");
    assert_eq!(lines[1]["requests_per_unit"], 2);
    assert_eq!(lines[1]["remaining"], 1);
    assert_eq!(
        lines[1]["headers"]["ratelimit-policy"],
        "\"per-ip\";q=2;w=60"
    );
    assert!(lines[3]["headers"]["retry-after"].is_string());
    assert_eq!(lines[4]["error"], "INVALID_ARGUMENT");
    // Malformed messages: each an error answer (the protobuf decoder's INTERNAL), never a
    // hang or a crash, and the next well-formed call is decided.
    for l in &lines[5..9] {
        assert_eq!(l["error"], "INTERNAL", "{l}");
    }
    assert_eq!(
        lines[9]["after"], "OK",
        "the service answers after malformed messages"
    );
}
