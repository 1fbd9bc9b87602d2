//! Commands, replies, the connection, and the Lua fallback library.
//!
//! The module's commands and the Lua fallback take the same arguments and give the same
//! replies; only the framing differs: `RL.GCRA key a b c …` becomes
//! `FCALL rl_gcra 1 key a b c …`, `RL.ALL n k1 … spec …` becomes `FCALL rl_all n k1 … spec …`.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{Cmd, RedisError, Value};

use crate::decision::Source;

/// The project's Lua fallback, the Functions library `redis_rl`, compiled into the crate from
/// the repository's one copy (`scripts/lua/redis_rl.lua`).
///
/// Load it yourself with `FUNCTION LOAD REPLACE` where clients may not run `FUNCTION LOAD`
/// (see [`LimiterBuilder::load_library`](crate::LimiterBuilder::load_library)).
pub const LUA_LIBRARY: &str = include_str!("../../../scripts/lua/redis_rl.lua");

/// The Functions library's name (`#!lua name=redis_rl`).
pub const LIBRARY_NAME: &str = "redis_rl";

/// Which commands decide: the module's, the Lua fallback's, or detect ([`Mode::Auto`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Ask the server once per connection (`COMMAND INFO RL.GCRA`): the module if it is
    /// loaded, else the fallback.
    #[default]
    Auto,
    /// The module's `RL.*` commands.
    Module,
    /// The Lua Functions library (`FCALL rl_gcra 1 key …`).
    Fallback,
}

impl Mode {
    pub(crate) fn source(self) -> Source {
        if self == Mode::Fallback {
            Source::Fallback
        } else {
            Source::Module
        }
    }
}

/// One of the project's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Gcra,
    Window,
    All,
    Refund,
    Lease,
    Release,
}

impl Op {
    fn module_command(self) -> &'static str {
        match self {
            Op::Gcra => "RL.GCRA",
            Op::Window => "RL.WINDOW",
            Op::All => "RL.ALL",
            Op::Refund => "RL.REFUND",
            Op::Lease => "RL.LEASE",
            Op::Release => "RL.RELEASE",
        }
    }

    fn function(self) -> &'static str {
        match self {
            Op::Gcra => "rl_gcra",
            Op::Window => "rl_window",
            Op::All => "rl_all",
            Op::Refund => "rl_refund",
            Op::Lease => "rl_lease",
            Op::Release => "rl_release",
        }
    }

    /// The no-writes twin of a writing function that may grow memory (library 1.3.0):
    /// `FCALL rl_<op>` carries no `allow-oom`, so the server refuses it whole when out of
    /// memory, and `FCALL_RO rl_<op>_ro` answers what writes nothing (a denial, `PEEK`,
    /// `QUANTITY 0`, an error) and the module's `OOM` error where the call would write
    /// (docs/clients.md#out-of-memory). Refunds and releases only free: they have none.
    pub(crate) fn twin(self) -> Option<&'static str> {
        match self {
            Op::Gcra => Some("rl_gcra_ro"),
            Op::Window => Some("rl_window_ro"),
            Op::All => Some("rl_all_ro"),
            Op::Lease => Some("rl_lease_ro"),
            Op::Refund | Op::Release => None,
        }
    }
}

/// `FCALL_RO rl_<op>_ro numkeys key … arg …`: the twin of [`Op::twin`], if `op` has one.
pub(crate) fn twin_frame(op: Op, keys: &[&str], args: &[Vec<u8>]) -> Option<Cmd> {
    let mut cmd = redis::cmd("FCALL_RO");
    cmd.arg(op.twin()?).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(a.as_slice());
    }
    Some(cmd)
}

/// The server is out of memory (`OOM command not allowed when used memory > 'maxmemory'.`).
pub(crate) fn is_oom(e: &RedisError) -> bool {
    e.code() == Some("OOM")
}

/// The fallback as a script, for servers where `FUNCTION` is not allowed (Redis 6.x,
/// services that disable it): the library without its `#!lua` line, run with `EVAL` /
/// `EVALSHA sha numkeys key … name arg …` (`ARGV[1]` names the function).
pub(crate) fn script_text() -> &'static str {
    LUA_LIBRARY
        .split_once('\n')
        .map_or(LUA_LIBRARY, |(_, rest)| rest)
}

/// The SHA1 the server knows [`script_text`] by (`EVALSHA`), lower-case hex.
pub(crate) fn script_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| {
        use sha1::Digest;
        sha1::Sha1::digest(script_text().as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    })
}

/// How the fallback is called: the Functions library, or the script by its SHA1 (`EVALSHA`)
/// or by its text (`EVAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    /// `FCALL` (the Functions library).
    Functions,
    /// `EVALSHA <sha>`.
    Sha,
    /// `EVAL <text>` (loads it into the node's script cache too).
    Text,
}

/// Builds the wire command for `op` in MODULE or FALLBACK mode (the fallback as `script`).
pub(crate) fn frame_with(
    mode: Mode,
    script: Script,
    op: Op,
    keys: &[&str],
    args: &[Vec<u8>],
) -> Cmd {
    if mode != Mode::Fallback || script == Script::Functions {
        return frame(mode, op, keys, args);
    }
    let mut cmd = match script {
        Script::Sha => {
            let mut c = redis::cmd("EVALSHA");
            c.arg(script_sha());
            c
        }
        _ => {
            let mut c = redis::cmd("EVAL");
            c.arg(script_text());
            c
        }
    };
    cmd.arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    cmd.arg(op.function());
    for a in args {
        cmd.arg(a.as_slice());
    }
    cmd
}

/// Builds the wire command for `op` in MODULE or FALLBACK mode.
pub(crate) fn frame(mode: Mode, op: Op, keys: &[&str], args: &[Vec<u8>]) -> Cmd {
    let mut cmd;
    if mode == Mode::Fallback {
        cmd = redis::cmd("FCALL");
        cmd.arg(op.function()).arg(keys.len());
    } else {
        cmd = redis::cmd(op.module_command());
        if op == Op::All {
            cmd.arg(keys.len());
        }
    }
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(a.as_slice());
    }
    cmd
}

/// The connection a limiter talks through: one server (an auto-reconnecting
/// [`ConnectionManager`]) or a Redis Cluster ([`ClusterConnection`]). Both are cheap to clone
/// and multiplex concurrent calls over one socket per node.
#[derive(Clone)]
pub enum Connection {
    /// One server (or a proxy in front of several).
    Single(ConnectionManager),
    /// A Redis Cluster: every call goes to its key's slot's master.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connection::Single(c) => f.debug_tuple("Single").field(c).finish(),
            Connection::Cluster(_) => f.write_str("Cluster(..)"),
        }
    }
}

impl From<ConnectionManager> for Connection {
    fn from(c: ConnectionManager) -> Connection {
        Connection::Single(c)
    }
}

impl From<ClusterConnection> for Connection {
    fn from(c: ClusterConnection) -> Connection {
        Connection::Cluster(c)
    }
}

impl Connection {
    /// Runs `cmd`; on a cluster, on the master of `route_key`'s slot when given (the
    /// cluster client cannot tell where `RL.ALL numkeys key …` keeps its keys).
    pub(crate) async fn query(
        &self,
        cmd: &Cmd,
        route_key: Option<&str>,
    ) -> Result<Value, RedisError> {
        match (self, route_key) {
            (Connection::Single(c), _) => cmd.query_async(&mut c.clone()).await,
            (Connection::Cluster(c), Some(key)) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                // A routed command's error reply comes back as a value: an error it is, so
                // that "function not found" and NOSCRIPT (a restarted or new node) are
                // recovered on a Cluster as on one server.
                match c.clone().route_command(cmd.clone(), routing).await? {
                    Value::ServerError(e) => Err(e.into()),
                    v => Ok(v),
                }
            }
            (Connection::Cluster(c), None) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs `cmd` on every master (a cluster) or the one server; returns each node's
    /// address (`None`: the one server) and its reply, a server's error reply as `Err`. An
    /// error that reached no node is the outer `Err`.
    pub(crate) async fn on_masters(&self, cmd: Cmd) -> Result<Vec<NodeReply>, RedisError> {
        match self {
            Connection::Single(c) => Ok(vec![(
                None,
                server_reply(cmd.query_async(&mut c.clone()).await)?,
            )]),
            Connection::Cluster(c) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let reply = c.clone().route_command(cmd, routing).await?;
                // Without a response policy the replies come back as a map: node -> reply.
                Ok(match reply {
                    Value::Map(pairs) => pairs
                        .into_iter()
                        .map(|(node, v)| (text(&node).and_then(|a| address(&a)), value_reply(v)))
                        .collect(),
                    other => vec![(None, value_reply(other))],
                })
            }
        }
    }

    /// Runs `cmd` on one node: `node` (an address from [`Connection::on_masters`]), or on a
    /// cluster without one the master of `route_key`'s slot, or the one server.
    pub(crate) async fn on_node(
        &self,
        cmd: &Cmd,
        node: Option<&(String, u16)>,
        route_key: Option<&str>,
    ) -> Result<Value, RedisError> {
        match (self, node) {
            (Connection::Cluster(c), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                match c.clone().route_command(cmd.clone(), routing).await? {
                    Value::ServerError(e) => Err(e.into()),
                    v => Ok(v),
                }
            }
            _ => self.query(cmd, route_key).await,
        }
    }
}

/// One node's reply to a command sent to every master: its address (`None`: the one
/// server) and the reply, a server's error reply as `Err`.
pub(crate) type NodeReply = (Option<(String, u16)>, Result<Value, RedisError>);

/// A reply as [`NodeReply`]'s result: `Ok(Err(_))` for an error the server sent, `Err` for
/// one that never reached it (a dropped connection, a timeout).
fn server_reply(r: Result<Value, RedisError>) -> Result<Result<Value, RedisError>, RedisError> {
    match r {
        Err(e) if e.code().is_none() => Err(e),
        other => Ok(other),
    }
}

fn value_reply(v: Value) -> Result<Value, RedisError> {
    match v {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

/// Reads a node's `host:port` (IPv6 hosts keep their colons).
fn address(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

fn protocol_error(what: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}

fn int(v: &Value) -> Result<i64, RedisError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol_error("an integer")),
        _ => Err(protocol_error("an integer")),
    }
}

/// Reads a flat integer array of `N` elements.
pub(crate) fn ints<const N: usize>(v: &Value) -> Result<[i64; N], RedisError> {
    let Value::Array(items) = v else {
        return Err(protocol_error("an array of integers"));
    };
    if items.len() != N {
        return Err(protocol_error("an array of integers"));
    }
    let mut out = [0i64; N];
    for (o, item) in out.iter_mut().zip(items) {
        *o = int(item)?;
    }
    Ok(out)
}

/// Reads RL.ALL's reply: the combined five integers, then each key's.
pub(crate) fn all_reply(v: &Value) -> Result<([i64; 5], Vec<[i64; 5]>), RedisError> {
    let bad = || protocol_error(&format!("RL.ALL's two-element reply, not {v:?}"));
    let Value::Array(parts) = v else {
        return Err(bad());
    };
    let (Some(combined), Some(Value::Array(each))) = (parts.first(), parts.get(1)) else {
        return Err(bad());
    };
    Ok((
        ints(combined)?,
        each.iter().map(ints).collect::<Result<_, _>>()?,
    ))
}

/// Reads a `COMMAND INFO name` reply: whether the command exists.
pub(crate) fn command_exists(v: &Value) -> bool {
    match v {
        Value::Array(items) => items.iter().any(|x| !matches!(x, Value::Nil)),
        Value::Map(items) => items.iter().any(|(_, x)| !matches!(x, Value::Nil)),
        Value::Nil => false,
        _ => true,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The version a library's code declares (`local VERSION = '1.1.0'`), the one its
/// `rl_version` function answers.
pub(crate) fn library_version(code: &str) -> Option<&str> {
    let rest = code.split("local VERSION = '").nth(1)?;
    rest.split('\'').next()
}

/// What to do with one server's `redis_rl` library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LibraryPlan {
    /// The server runs our version.
    Keep,
    /// Not loaded: load ours.
    Load,
    /// An older (or unreadable) version: replace it with ours.
    Replace,
    /// A newer version, loaded by a newer client (a rolling deploy): leave it.
    Newer,
}

fn version_key(v: &str) -> Option<Vec<u64>> {
    v.split('.').map(|p| p.parse().ok()).collect()
}

/// Compares the server's library version (`None`: no library) with ours, as the Python
/// package does: never replace a newer library with an older one.
pub(crate) fn library_plan(theirs: Option<&str>, ours: &str) -> LibraryPlan {
    let Some(theirs) = theirs else {
        return LibraryPlan::Load;
    };
    if theirs == ours {
        return LibraryPlan::Keep;
    }
    match (version_key(theirs), version_key(ours)) {
        (Some(t), Some(o)) if t > o => LibraryPlan::Newer,
        _ => LibraryPlan::Replace,
    }
}

/// The fallback's setting lines (`local LOG_MAX_LIMIT = 100000`): rl.log-max-limit,
/// rl.lease-max-limit and rl.all-max-keys, set by an operator who edits the line and loads
/// the text.
const SETTING_LINES: [&str; 3] = ["LOG_MAX_LIMIT", "LEASE_MAX_LIMIT", "ALL_MAX_KEYS"];

/// The value of one setting line in a library's code, if the code has that line.
fn setting(code: &str, variable: &str) -> Option<u64> {
    let prefix = format!("local {variable} = ");
    code.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim_end().parse().ok())
}

/// Our library's code with the settings of the library it replaces kept (the Python
/// package's rule), so an upgrade does not reset an operator's rl.log-max-limit,
/// rl.lease-max-limit or rl.all-max-keys to the defaults. The library checks each value's
/// range when it loads.
pub(crate) fn configured_code(ours: &str, theirs: &str) -> String {
    let mut code = ours.to_owned();
    for variable in SETTING_LINES {
        let (Some(kept), Some(default)) = (setting(theirs, variable), setting(ours, variable))
        else {
            continue;
        };
        if kept == 0 || kept == default {
            continue;
        }
        code = code.replacen(
            &format!("local {variable} = {default}\n"),
            &format!("local {variable} = {kept}\n"),
            1,
        );
    }
    code
}

/// Reads `FUNCTION LIST LIBRARYNAME redis_rl WITHCODE`: the loaded library's version (`""`
/// when its code declares none) and code, `None` when it is not loaded.
pub(crate) fn listed_library(listing: &Value) -> Option<(String, String)> {
    let entries: &[Value] = match listing {
        Value::Array(items) | Value::Set(items) => items,
        _ => return None,
    };
    for entry in entries {
        let fields: Vec<(String, &Value)> = match entry {
            Value::Array(flat) => flat
                .chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => text(k).map(|k| (k, v)),
                    _ => None,
                })
                .collect(),
            Value::Map(pairs) => pairs
                .iter()
                .filter_map(|(k, v)| text(k).map(|k| (k, v)))
                .collect(),
            _ => continue,
        };
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        if get("library_name").and_then(text).as_deref() != Some(LIBRARY_NAME) {
            continue;
        }
        let code = get("library_code").and_then(text).unwrap_or_default();
        return Some((library_version(&code).unwrap_or("").to_owned(), code));
    }
    None
}

/// The module is not (or no longer) loaded on this server.
pub(crate) fn is_unknown_command(e: &RedisError) -> bool {
    let msg = e.to_string().to_lowercase();
    msg.contains("unknown command") && msg.contains("rl.")
}

/// The server refuses a command to this client: unknown (Redis 6.x, a renamed or disabled
/// command), not permitted by its ACL, or a scripting command on a server that runs no Lua
/// at all (Valkey 9.1 with its `lua` engine module unloaded: "Could not find scripting
/// engine 'lua'", "Engine 'lua' not found"). A `NOPERM` on one of the keys (`… access one
/// of the keys`) is not a refused command: it is reported as it is.
pub(crate) fn is_refused(e: &RedisError) -> bool {
    let msg = e.to_string().to_lowercase();
    let noperm = e.code() == Some("NOPERM") || msg.contains("noperm");
    msg.contains("unknown command")
        || (noperm && msg.contains("command"))
        || msg.contains("engine 'lua'")
        || msg.contains("scripting engine")
}

/// `EVALSHA` of a script the node does not have cached (a restart, a failover, `SCRIPT
/// FLUSH`, a node added to a Cluster).
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.code() == Some("NOSCRIPT") || e.to_string().contains("NOSCRIPT")
}

/// The Functions library is not (or no longer) loaded.
pub(crate) fn is_missing_function(e: &RedisError) -> bool {
    let msg = e.to_string().to_lowercase();
    msg.contains("function not found") || msg.contains("no such function")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        let args = vec![b"3".to_vec(), b"1".to_vec(), b"10".to_vec()];
        let m = frame(Mode::Module, Op::Gcra, &["k"], &args);
        assert_eq!(m.args_iter().count(), 5, "RL.GCRA k 3 1 10 has five words");
        let f = frame(Mode::Fallback, Op::All, &["a", "b"], &args);
        assert_eq!(f.args_iter().count(), 3 + 2 + 3);
    }

    #[test]
    fn replacing_a_library_keeps_its_setting_lines() {
        let theirs = LUA_LIBRARY
            .replacen(
                "local LOG_MAX_LIMIT = 100000\n",
                "local LOG_MAX_LIMIT = 500\n",
                1,
            )
            .replacen("local ALL_MAX_KEYS = 64\n", "local ALL_MAX_KEYS = 8\n", 1);
        let code = configured_code(LUA_LIBRARY, &theirs);
        assert_eq!(setting(&code, "LOG_MAX_LIMIT"), Some(500));
        assert_eq!(setting(&code, "LEASE_MAX_LIMIT"), Some(10_000));
        assert_eq!(setting(&code, "ALL_MAX_KEYS"), Some(8));
        // A library without the lines (or with unreadable ones) keeps our defaults.
        assert_eq!(configured_code(LUA_LIBRARY, "return 1"), LUA_LIBRARY);
    }

    #[test]
    fn a_newer_library_is_never_replaced() {
        let ours = library_version(LUA_LIBRARY).expect("the library declares its version");
        assert_eq!(library_plan(None, ours), LibraryPlan::Load);
        assert_eq!(library_plan(Some(ours), ours), LibraryPlan::Keep);
        assert_eq!(library_plan(Some("1.0.0"), "1.1.0"), LibraryPlan::Replace);
        assert_eq!(library_plan(Some("1.10.0"), "1.9.0"), LibraryPlan::Newer);
        assert_eq!(library_plan(Some(""), "1.1.0"), LibraryPlan::Replace);
        assert_eq!(library_plan(Some("x"), "1.1.0"), LibraryPlan::Replace);
    }

    #[test]
    fn the_scripts_sha1_is_the_servers() {
        use sha1::Digest;
        let hex = |b: &[u8]| -> String {
            sha1::Sha1::digest(b)
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect()
        };
        assert_eq!(hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(script_sha(), hex(script_text().as_bytes()));
        assert_eq!(script_sha().len(), 40);
    }

    #[test]
    fn node_addresses_are_read() {
        assert!(address("127.0.0.1:7000") == Some(("127.0.0.1".into(), 7000)));
        assert!(address("::1:7000") == Some(("::1".into(), 7000)));
        assert!(address("nope").is_none());
    }

    #[test]
    fn library_is_the_repository_copy() {
        assert!(LUA_LIBRARY.starts_with("#!lua name=redis_rl"));
        assert!(LUA_LIBRARY.contains("rl_lease"));
    }
}
