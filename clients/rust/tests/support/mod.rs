//! What the crate's integration tests share: the mode under test, servers for it, limiters
//! on them, a `tracing` capture, and the macro that runs a test in both modes.
//!
//! Servers come from the repository's harness (`tests/common/mod.rs`): real `redis-server`
//! processes on free loopback ports in temporary directories, killed by PID on drop. The
//! module under test is `$RL_MODULE`, else the workspace's `target/release/libredis_rl.so`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use redis_rl_client::{Limiter, LimiterBuilder, Mode};

use crate::common::{Cluster, Server};

static INIT: Once = Once::new();

/// Points the shared harness at the module (its own default is relative to the root
/// crate, not this one).
pub fn init() {
    INIT.call_once(|| {
        if std::env::var_os("RL_MODULE").is_none() {
            let p: PathBuf =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/libredis_rl.so");
            assert!(
                p.exists(),
                "no module at {}: run `cargo build --release` at the workspace root",
                p.display()
            );
            std::env::set_var("RL_MODULE", p);
        }
    });
}

/// The mode a test runs in: a server with the module, or one without it (the Lua
/// fallback, chosen by `Mode::Auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Module,
    Fallback,
}

impl Kind {
    pub fn expected(self) -> Mode {
        match self {
            Kind::Module => Mode::Module,
            Kind::Fallback => Mode::Fallback,
        }
    }

    /// A fresh server for this mode.
    pub fn server(self) -> Server {
        init();
        match self {
            Kind::Module => Server::start(),
            Kind::Fallback => Server::builder().no_module().start(),
        }
    }

    /// The command name of `op` in this mode, for direct calls: `RL.GCRA` or
    /// `FCALL rl_gcra 1`.
    pub fn command(self, op: &str, key: &str) -> redis::Cmd {
        match self {
            Kind::Module => {
                let mut c = redis::cmd(&format!("RL.{}", op.to_uppercase()));
                c.arg(key);
                c
            }
            Kind::Fallback => {
                let mut c = redis::cmd("FCALL");
                c.arg(format!("rl_{}", op.to_lowercase())).arg(1).arg(key);
                c
            }
        }
    }
}

pub fn url(server: &Server) -> String {
    format!("redis://127.0.0.1:{}/", server.port)
}

/// A unique key prefix per limiter, so tests never share keys.
pub fn prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}-{}:",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A limiter on `server`, configured by `f`, with a fresh prefix.
pub async fn limiter_with(
    server: &Server,
    f: impl FnOnce(LimiterBuilder) -> LimiterBuilder,
) -> Limiter {
    f(Limiter::builder(url(server)).prefix(prefix()))
        .build()
        .await
        .expect("build the limiter")
}

/// Sends `sig` (`"-STOP"`: accepts connections, answers nothing; `"-CONT"`) to the server.
pub fn signal(server: &Server, sig: &str) {
    let pid = server.pid().expect("server running").to_string();
    let ok = std::process::Command::new("kill")
        .arg(sig)
        .arg(&pid)
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

pub async fn limiter(server: &Server) -> Limiter {
    limiter_with(server, |b| b).await
}

/// Runs each named `async fn(Kind)` test in both modes: `module::name` against a server
/// with the module, `fallback::name` against one without it.
#[macro_export]
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {
        mod module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Kind::Module).await
                }
            )*
        }
        mod fallback {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Kind::Fallback).await
                }
            )*
        }
    };
}

/// Collects the messages of the `tracing` events emitted on this thread while installed.
#[derive(Clone, Default)]
pub struct Capture {
    pub messages: Arc<Mutex<Vec<String>>>,
}

impl Capture {
    pub fn count(&self, needle: &str) -> usize {
        self.messages
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.contains(needle))
            .count()
    }
}

struct MessageVisitor<'a>(&'a mut String);

impl tracing::field::Visit for MessageVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = String::new();
        event.record(&mut MessageVisitor(&mut message));
        self.messages.lock().unwrap().push(message);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A three-master Redis Cluster for this mode (the harness's `Cluster::start` loads the
/// module; the fallback's is the same without it).
pub fn cluster(kind: Kind) -> Cluster {
    init();
    if kind == Kind::Module {
        return Cluster::start(3);
    }
    fallback_cluster_with(&[])
}

/// A cluster node for `kind` (no module for the fallback), with `extra` words
/// (`--rename-command FUNCTION ""`), not yet in any cluster.
pub fn cluster_node(kind: Kind, extra: &[&str]) -> Server {
    init();
    let b = if kind == Kind::Module {
        Server::builder()
    } else {
        Server::builder().no_module()
    };
    b.arg("cluster-enabled", "yes")
        .arg("cluster-config-file", "nodes.conf")
        .arg("cluster-node-timeout", "5000")
        .words(extra)
        .start()
}

/// A three-master cluster without the module whose nodes start with `extra` words.
pub fn fallback_cluster_with(extra: &[&str]) -> Cluster {
    let nodes: Vec<Server> = (0..3)
        .map(|_| cluster_node(Kind::Fallback, extra))
        .collect();
    let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
    args.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    let out = std::process::Command::new("redis-cli")
        .args(&args)
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let c = Cluster { nodes };
    c.wait_ok();
    c
}

/// Whether `con`'s node lists `id` as a connected master (the handshake over) and the
/// cluster as ok.
fn knows(con: &mut redis::Connection, id: &str) -> bool {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(con).unwrap();
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(con).unwrap();
    info.contains("cluster_state:ok")
        && nodes.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 7
                && f[0] == id
                && f[2].contains("master")
                && !f[2].contains("handshake")
                && f[7] == "connected"
        })
}

/// Adds `node` (started by [`cluster_node`]) to `cluster` as a master without slots:
/// `CLUSTER MEET`, then waits until every node knows it. Returns its index in `nodes`.
pub fn add_master(cluster: &mut Cluster, node: Server) -> usize {
    let mut c = cluster.nodes[0].conn();
    let _: () = redis::cmd("CLUSTER")
        .arg("MEET")
        .arg("127.0.0.1")
        .arg(node.port)
        .query(&mut c)
        .unwrap();
    let id = Cluster::node_id(&node);
    cluster.nodes.push(node);
    for n in &cluster.nodes {
        let mut con = n.conn();
        crate::common::wait_until("the new master is known", Duration::from_secs(30), || {
            knows(&mut con, &id)
        });
    }
    cluster.nodes.len() - 1
}

/// How `con`'s node lists node `id`: its role (`master` or `slave`), its master's id (`-`
/// for a master) and whether it serves slots; `None` when it does not list it.
fn listed(con: &mut redis::Connection, id: &str) -> Option<(String, String, bool)> {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(con).unwrap();
    nodes.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[0] == id).then(|| {
            let slave = f[2].split(',').any(|flag| flag == "slave");
            let role = if slave { "slave" } else { "master" };
            (role.to_owned(), f[3].to_owned(), f.len() > 8)
        })
    })
}

/// Adds `node` (started by [`cluster_node`]) to `cluster` as a replica of
/// `cluster.nodes[of]`: joined as [`add_master`] does, then `CLUSTER REPLICATE`; waits
/// until every node lists it as that master's replica and its link is up (the first sync
/// done). Returns its index in `nodes`.
pub fn add_replica(cluster: &mut Cluster, of: usize, node: Server) -> usize {
    let at = add_master(cluster, node);
    let master_id = Cluster::node_id(&cluster.nodes[of]);
    let me = Cluster::node_id(&cluster.nodes[at]);
    let mut c = cluster.nodes[at].conn();
    let _: () = redis::cmd("CLUSTER")
        .arg("REPLICATE")
        .arg(&master_id)
        .query(&mut c)
        .unwrap();
    for n in &cluster.nodes {
        let mut con = n.conn();
        crate::common::wait_until("the replica is known", Duration::from_secs(30), || {
            listed(&mut con, &me).is_some_and(|(role, m, _)| role == "slave" && m == master_id)
        });
    }
    crate::common::wait_until("the replica's link is up", Duration::from_secs(30), || {
        crate::common::info_field(&mut c, "replication", "master_link_status").as_deref()
            == Some("up")
    });
    at
}

/// How [`fail_over`] promoted a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promotion {
    /// `CLUSTER FAILOVER`: the manual failover, agreed with the old master and voted.
    Failover,
    /// `CLUSTER FAILOVER TAKEOVER`: the replica took the slots without a vote.
    Takeover,
}

/// How long a manual failover is given before TAKEOVER (Redis aborts one after 5 s).
const MANUAL_FAILOVER: Duration = Duration::from_secs(15);

/// Makes `cluster.nodes[replica]` the master of its master's slots, as an operator does:
/// once its copy has caught up (the two replication offsets equal), `CLUSTER FAILOVER` on
/// it, and where that manual failover has not completed within [`MANUAL_FAILOVER`],
/// `CLUSTER FAILOVER TAKEOVER` (no vote of the other masters needed). Returns once every
/// node lists the replica as a master with slots and its old master as its replica, and
/// the cluster is ok.
pub fn fail_over(cluster: &Cluster, replica: usize) -> Promotion {
    let rid = Cluster::node_id(&cluster.nodes[replica]);
    let mut rc = cluster.nodes[replica].conn();
    let old_id = listed(&mut rc, &rid).expect("the replica lists itself").1;
    let old = cluster
        .nodes
        .iter()
        .find(|n| Cluster::node_id(n) == old_id)
        .expect("the replica's master");
    let mut oc = old.conn();
    let offset = |c: &mut redis::Connection| {
        crate::common::info_field(c, "replication", "master_repl_offset")
    };
    crate::common::wait_until("the replica caught up", Duration::from_secs(30), || {
        crate::common::info_field(&mut rc, "replication", "master_link_status").as_deref()
            == Some("up")
            && offset(&mut rc) == offset(&mut oc)
    });
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut rc)
        .unwrap();
    if promoted(cluster, &rid, &old_id, MANUAL_FAILOVER) {
        return Promotion::Failover;
    }
    let takeover: redis::RedisResult<()> = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query(&mut rc);
    if let Err(e) = takeover {
        // The manual failover finished meanwhile: "You should send CLUSTER FAILOVER to a replica".
        assert!(e.to_string().to_lowercase().contains("replica"), "{e}");
    }
    assert!(
        promoted(cluster, &rid, &old_id, Duration::from_secs(30)),
        "replica not promoted; its log:\n{}",
        cluster.nodes[replica].log()
    );
    Promotion::Takeover
}

/// Waits up to `within` until every node lists `rid` as a master with slots and `old_id`
/// as its replica, and says `cluster_state:ok`; false if the deadline passed first.
fn promoted(cluster: &Cluster, rid: &str, old_id: &str, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    for n in &cluster.nodes {
        let mut con = n.conn();
        loop {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
            if info.contains("cluster_state:ok")
                && listed(&mut con, rid).is_some_and(|(role, _, slots)| role == "master" && slots)
                && listed(&mut con, old_id).is_some_and(|(role, m, _)| role == "slave" && m == rid)
            {
                break;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    true
}

/// Moves `slot` with its keys from its owner to `cluster.nodes[to]`, as `redis-cli
/// --cluster reshard` does (SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE on every
/// node), and waits until every node sends the slot to it.
pub fn move_slot(cluster: &Cluster, slot: u16, to: usize) {
    let src = cluster
        .nodes
        .iter()
        .position(|n| slot_owner(n, slot) == Some(Cluster::node_id(n)))
        .expect("the slot's owner");
    let dst = &cluster.nodes[to];
    let (src_id, dst_id) = (Cluster::node_id(&cluster.nodes[src]), Cluster::node_id(dst));
    let mut s = cluster.nodes[src].conn();
    let mut d = dst.conn();
    let setslot = |c: &mut redis::Connection, how: &str, id: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(id)
            .query(c)
            .unwrap();
    };
    setslot(&mut d, "IMPORTING", &src_id);
    setslot(&mut s, "MIGRATING", &dst_id);
    loop {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut s)
            .unwrap();
        if keys.is_empty() {
            break;
        }
        let _: redis::Value = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(dst.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(&mut s)
            .unwrap();
    }
    setslot(&mut d, "NODE", &dst_id);
    setslot(&mut s, "NODE", &dst_id);
    for (i, n) in cluster.nodes.iter().enumerate() {
        if i != src && i != to {
            setslot(&mut n.conn(), "NODE", &dst_id);
        }
    }
    for n in &cluster.nodes {
        crate::common::wait_until(
            "the slot's new owner is known",
            Duration::from_secs(30),
            || slot_owner(n, slot).as_deref() == Some(dst_id.as_str()),
        );
    }
}

/// The node id `node` sends `slot` to (its `CLUSTER SLOTS`).
fn slot_owner(node: &Server, slot: u16) -> Option<String> {
    let mut c = node.conn();
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).unwrap();
    slots.iter().find_map(|r| {
        let redis::Value::Array(p) = r else {
            return None;
        };
        match (p.first(), p.get(1), p.get(2)) {
            (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(master)),
            ) if (*lo..=*hi).contains(&i64::from(slot)) => match master.get(2) {
                Some(redis::Value::BulkString(id)) => {
                    Some(String::from_utf8_lossy(id).into_owned())
                }
                _ => None,
            },
            _ => None,
        }
    })
}

/// A server's `INFO commandstats` calls by command name (`function|load`, `evalsha`, …).
pub fn command_stats(server: &Server) -> std::collections::HashMap<String, u64> {
    let mut c = server.conn();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_lowercase(), calls))
        })
        .collect()
}
