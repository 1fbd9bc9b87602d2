//! Framework-neutral HTTP pieces: request info, key functions, rules, and the 429/413 reply.
//!
//! The [`RateLimitLayer`](crate::RateLimitLayer) builds a [`RequestInfo`], finds the
//! [`Rule`] that applies (the first that matches), makes one limiter call (`check`, or
//! `check_all` when a rule has several limits), and turns the [`Decision`] into a status,
//! header fields and a JSON body with [`respond`].

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Extensions, Method, StatusCode};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::decision::{Decision, HeaderOptions, RetryAfter};
use crate::limits::{InvalidLimit, Limit};

/// What key functions and rules see of a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path (without the query).
    pub path: &'a str,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// The request's extensions (where an auth layer puts the user, axum its
    /// `ConnectInfo`).
    pub extensions: &'a Extensions,
    /// The socket peer's address, if the server put it in the extensions (see
    /// [`RateLimitLayer`](crate::RateLimitLayer)).
    pub peer: Option<IpAddr>,
    /// The matched route (axum's `MatchedPath`, else the rule's path).
    pub route: Option<&'a str>,
    /// The `Content-Length`, if sent.
    pub content_length: Option<u64>,
}

impl RequestInfo<'_> {
    /// All values of a header field, decoded as Latin-1 and joined with `", "` (as a
    /// repeated field reads), or `None` when absent.
    pub fn header(&self, name: &str) -> Option<String> {
        let mut values = self.headers.get_all(name).iter().peekable();
        values.peek()?;
        let parts: Vec<String> = values.map(|v| latin1(v.as_bytes())).collect();
        Some(parts.join(", "))
    }
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

type KeyFn = dyn Fn(&RequestInfo<'_>) -> Option<String> + Send + Sync;

/// A key function: the key's value for a request, or `None` when the limit does not apply
/// to it (no API key sent, anonymous user, …).
///
/// ```
/// use redis_rl_client::http::Key;
///
/// let by_ip = Key::client_ip(["10.0.0.0/8"]).unwrap();   // behind proxies in 10/8
/// let by_api_key = Key::header_or("X-API-Key", "anonymous");
/// let by_route = Key::route();                              // one shared limit per endpoint
/// let by_tenant = Key::from_fn(|req| req.header("x-tenant"));
/// # let _ = (by_ip, by_api_key, by_route, by_tenant);
/// ```
#[derive(Clone)]
pub struct Key(Arc<KeyFn>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Which forwarding header trusted proxies write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Forwarding {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// Reads an address from a forwarding header entry (port and brackets off).
fn parse_addr(text: &str) -> Option<IpAddr> {
    let mut t = text.trim().trim_matches('"');
    if let Some(rest) = t.strip_prefix('[') {
        t = rest.split(']').next().unwrap_or(rest);
    } else if t.matches(':').count() == 1 {
        t = t.split(':').next().unwrap_or(t);
    }
    t.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// The `for=` values of an RFC 7239 Forwarded field, in order.
fn forwarded_for(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    for element in value.split(',') {
        for pair in element.split(';') {
            if let Some((name, v)) = pair.trim().split_once('=') {
                if name.trim().eq_ignore_ascii_case("for") {
                    out.push(v.trim().to_owned());
                }
            }
        }
    }
    out
}

fn parse_network(text: &str) -> Result<IpNet, InvalidLimit> {
    let t = text.trim();
    t.parse::<IpNet>()
        .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| InvalidLimit::new(format!("trusted proxy '{t}' is not an address or network")))
}

impl Key {
    /// The client's IP address, honouring `trusted_proxies` (addresses or CIDR networks)
    /// for `X-Forwarded-For`.
    ///
    /// The socket peer is the client unless it is a trusted proxy. Then the header is read
    /// from the right, skipping trusted proxies; the first untrusted address is the client
    /// (what a client writes at the left is ignored). With no trusted proxies the peer is
    /// always the client. The peer comes from the request's extensions: axum's
    /// `ConnectInfo<SocketAddr>` (serve with `into_make_service_with_connect_info`), or a
    /// `SocketAddr` / `IpAddr` extension your hyper server inserts; without one, this key
    /// does not apply (and a warning is logged once).
    pub fn client_ip<I, S>(trusted_proxies: I) -> Result<Key, InvalidLimit>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Key::client_ip_with(trusted_proxies, Forwarding::XForwardedFor)
    }

    /// [`Key::client_ip`] reading the header your proxies write: only that one is read
    /// (`Forwarded` ignores `X-Forwarded-For`, and the reverse).
    pub fn client_ip_with<I, S>(trusted_proxies: I, header: Forwarding) -> Result<Key, InvalidLimit>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets: Vec<IpNet> = trusted_proxies
            .into_iter()
            .map(|t| parse_network(t.as_ref()))
            .collect::<Result<_, _>>()?;
        let warned = AtomicBool::new(false);
        let name = match header {
            Forwarding::XForwardedFor => "x-forwarded-for",
            Forwarding::Forwarded => "forwarded",
        };
        Ok(Key(Arc::new(move |info: &RequestInfo<'_>| {
            let Some(peer) = info.peer.map(|p| p.to_canonical()) else {
                if !warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        target: "redis_rl_client",
                        "redis-rl: no peer address in the request's extensions: the client-IP \
                         limit does not apply (axum: serve with \
                         into_make_service_with_connect_info::<SocketAddr>())"
                    );
                }
                return None;
            };
            let trusted = |a: &IpAddr| nets.iter().any(|n| n.contains(a));
            if nets.is_empty() || !trusted(&peer) {
                return Some(peer.to_string());
            }
            let raw = match info.header(name) {
                Some(r) if !r.is_empty() => r,
                _ => return Some(peer.to_string()),
            };
            let hops: Vec<String> = match header {
                Forwarding::Forwarded => forwarded_for(&raw),
                Forwarding::XForwardedFor => raw.split(',').map(str::to_owned).collect(),
            };
            for hop in hops.iter().rev() {
                match parse_addr(hop) {
                    // An obfuscated or unknown hop written by a trusted proxy: stop here.
                    None => {
                        let t = hop.trim().trim_matches('"');
                        return Some(if t.is_empty() {
                            peer.to_string()
                        } else {
                            t.to_owned()
                        });
                    }
                    Some(a) if !trusted(&a) => return Some(a.to_string()),
                    Some(_) => {}
                }
            }
            Some(
                hops.first()
                    .and_then(|h| parse_addr(h))
                    .unwrap_or(peer)
                    .to_string(),
            )
        })))
    }

    /// A request header (e.g. an API key); the limit does not apply when it is absent.
    pub fn header(name: &str) -> Key {
        let name = name.to_ascii_lowercase();
        Key(Arc::new(move |info: &RequestInfo<'_>| {
            info.header(&name).filter(|v| !v.is_empty())
        }))
    }

    /// A request header, or `default` when it is absent.
    pub fn header_or(name: &str, default: &str) -> Key {
        let name = name.to_ascii_lowercase();
        let default = default.to_owned();
        Key(Arc::new(move |info: &RequestInfo<'_>| {
            Some(
                info.header(&name)
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| default.clone()),
            )
        }))
    }

    /// The method and the matched route: one shared limit per endpoint (`"GET /users/{id}"`
    /// with axum's `MatchedPath`, else the rule's path).
    pub fn route() -> Key {
        Key(Arc::new(|info: &RequestInfo<'_>| {
            Some(format!(
                "{} {}",
                info.method,
                info.route.unwrap_or(info.path)
            ))
        }))
    }

    /// A value an earlier layer put in the request's extensions, e.g. the authenticated
    /// user's id; anonymous requests (no such extension) are not limited by it.
    pub fn extension<T>() -> Key
    where
        T: fmt::Display + Send + Sync + 'static,
    {
        Key(Arc::new(|info: &RequestInfo<'_>| {
            info.extensions.get::<T>().map(ToString::to_string)
        }))
    }

    /// Any function of the request.
    pub fn from_fn<F>(f: F) -> Key
    where
        F: Fn(&RequestInfo<'_>) -> Option<String> + Send + Sync + 'static,
    {
        Key(Arc::new(f))
    }

    /// The key's value for a request.
    pub fn value(&self, info: &RequestInfo<'_>) -> Option<String> {
        (self.0)(info)
    }
}

/// Makes a client-supplied value safe inside a Redis key: braces (hash tags), spaces and
/// other bytes are percent-encoded, and values over 128 characters are hashed
/// (`sha256:<hex>`), so a client cannot choose the hash tag or grow the key.
pub fn safe_key_part(value: &str) -> String {
    if value.chars().count() > 128 {
        let digest = Sha256::digest(value.as_bytes());
        let mut out = String::from("sha256:");
        for b in digest {
            out.push_str(&format!("{b:02x}"));
        }
        return out;
    }
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c.is_ascii_alphanumeric() || "._:@/+=-".contains(c) {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

type PathFn = dyn Fn(&str) -> bool + Send + Sync;

/// Which paths a [`Rule`] (or an exemption) applies to.
///
/// From a string: a glob when it holds `*` (`"/users/*/avatar"`; `*` matches any run of
/// characters, `?` one, `[abc]` one of a set), a prefix when it ends with `/` (`"/api/"`
/// also matches `"/api"`), else exact (`"/login"`). Or any function of the path.
#[derive(Clone)]
pub enum PathPattern {
    /// The path equals this.
    Exact(String),
    /// The path starts with this (which ends with `/`), or equals it without the `/`.
    Prefix(String),
    /// A glob (`*`, `?`, `[…]`).
    Glob(String),
    /// A predicate (e.g. a regex from the `regex` crate).
    Fn(Arc<PathFn>),
}

impl fmt::Debug for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathPattern::Exact(p) => write!(f, "Exact({p:?})"),
            PathPattern::Prefix(p) => write!(f, "Prefix({p:?})"),
            PathPattern::Glob(p) => write!(f, "Glob({p:?})"),
            PathPattern::Fn(_) => f.write_str("Fn(..)"),
        }
    }
}

impl From<&str> for PathPattern {
    fn from(p: &str) -> PathPattern {
        if p.contains('*') {
            PathPattern::Glob(p.to_owned())
        } else if p.ends_with('/') {
            PathPattern::Prefix(p.to_owned())
        } else {
            PathPattern::Exact(p.to_owned())
        }
    }
}

impl From<String> for PathPattern {
    fn from(p: String) -> PathPattern {
        PathPattern::from(p.as_str())
    }
}

impl PathPattern {
    /// A pattern from a predicate over the path.
    pub fn from_fn(f: impl Fn(&str) -> bool + Send + Sync + 'static) -> PathPattern {
        PathPattern::Fn(Arc::new(f))
    }

    /// Whether `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(p) => path == p,
            PathPattern::Prefix(p) => {
                path.starts_with(p.as_str()) || path == p.trim_end_matches('/')
            }
            PathPattern::Glob(p) => glob(p.as_bytes(), path.as_bytes()),
            PathPattern::Fn(f) => f(path),
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            PathPattern::Exact(p) | PathPattern::Prefix(p) | PathPattern::Glob(p) => Some(p),
            PathPattern::Fn(_) => None,
        }
    }
}

/// Shell-style matching (`*`, `?`, `[seq]`, `[!seq]`), as Python's `fnmatchcase`.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(pattern, p, text[t]) {
                        if matched {
                            p = next;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == b'[' {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                c if c == text[t] => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches one byte against the class starting at `pattern[start] == b'['`: `Some((matched,
/// index after the class))`, or `None` when the class is not closed (a literal `[`).
fn class(pattern: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'!');
    if negate {
        i += 1;
    }
    let first = i;
    let mut matched = false;
    while i < pattern.len() {
        if pattern[i] == b']' && i > first {
            return Some((matched != negate, i + 1));
        }
        if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            if pattern[i] <= c && c <= pattern[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if pattern[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

type CostFn = dyn Fn(&RequestInfo<'_>) -> u64 + Send + Sync;

#[derive(Clone)]
enum Cost {
    Fixed(u64),
    Fn(Arc<CostFn>),
}

/// Limits the requests whose path matches (and whose method is one of `methods`, if set).
///
/// One limit with its key function ([`Rule::new`]), or several checked together in one
/// atomic call ([`Rule::all`]: e.g. per API key and per IP; the request is admitted by all
/// or charged to none). Keys are `<name>:<value>`; several limits share the first value as
/// hash tag (`{value}:<name>:<value2>`), so the call works on a Redis Cluster, and the later
/// limits are scoped under the first.
///
/// ```
/// use redis_rl_client::http::{Key, Rule};
/// use redis_rl_client::{Algorithm, Gcra, Window};
///
/// let login = Rule::new("/login", Window::new(5, 300, Algorithm::Log)?, Key::client_ip(["10.0.0.0/8"])?)
///     .methods(["POST"])
///     .name("login")?;
/// let api = Rule::all("/api/", [
///     ("api", Gcra::new(100, 10, 1)?.into(), Key::header_or("X-API-Key", "anonymous")),
///     ("ip", Window::sliding(300, 60)?.into(), Key::client_ip(["10.0.0.0/8"])?),
/// ]);
/// let upload = Rule::new("/upload", Gcra::new(50, 1, 1)?, Key::header("X-User"))
///     .cost_fn(|req| req.content_length.unwrap_or(0) / 1_000_000);
/// # let _ = (login, api, upload);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Clone)]
pub struct Rule {
    path: PathPattern,
    named: Vec<(String, Limit, Key)>,
    single: bool,
    name: Option<String>,
    methods: Option<Vec<Method>>,
    cost: Cost,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("path", &self.path)
            .field(
                "limits",
                &self
                    .named
                    .iter()
                    .map(|(n, l, _)| (n, l))
                    .collect::<Vec<_>>(),
            )
            .field("name", &self.name)
            .field("methods", &self.methods)
            .finish_non_exhaustive()
    }
}

fn path_name(p: &PathPattern) -> String {
    let text = p
        .text()
        .unwrap_or("")
        .trim_matches(|c| matches!(c, '/' | '^' | '$' | '*'))
        .replace('/', "-");
    if text.is_empty() {
        "default".to_owned()
    } else {
        text
    }
}

/// A rule's limits are request rates: a lease would fail every request it applies to.
fn refuse_lease(limit: &Limit) {
    assert!(
        !matches!(limit, Limit::Lease(_)),
        "a Rule takes a Gcra or a Window limit, not a Lease: take a concurrency limit with \
         Limiter::acquire in the handler"
    );
}

impl Rule {
    /// One limit, keyed by `key`. Its name (in keys and headers) is the rule's
    /// [`name`](Rule::name), else the limit's, else one made from the path.
    ///
    /// # Panics
    ///
    /// When `limit` is a [`Lease`](crate::Lease): the layer limits request rates
    /// ([`Gcra`](crate::Gcra), [`Window`](crate::Window)); a concurrency limit is taken with
    /// [`Limiter::acquire`](crate::Limiter::acquire) in the handler.
    pub fn new(path: impl Into<PathPattern>, limit: impl Into<Limit>, key: Key) -> Rule {
        let limit = limit.into();
        refuse_lease(&limit);
        Rule {
            path: path.into(),
            named: vec![(String::new(), limit, key)],
            single: true,
            name: None,
            methods: None,
            cost: Cost::Fixed(1),
        }
    }

    /// Several named limits checked together (`RL.ALL`).
    ///
    /// # Panics
    ///
    /// When `limits` is empty or holds a [`Lease`](crate::Lease) (see [`Rule::new`]).
    pub fn all<I, N>(path: impl Into<PathPattern>, limits: I) -> Rule
    where
        I: IntoIterator<Item = (N, Limit, Key)>,
        N: Into<String>,
    {
        let named: Vec<(String, Limit, Key)> = limits
            .into_iter()
            .map(|(n, l, k)| (n.into(), l, k))
            .collect();
        assert!(!named.is_empty(), "a Rule needs at least one limit");
        for (_, limit, _) in &named {
            refuse_lease(limit);
        }
        Rule {
            path: path.into(),
            named,
            single: false,
            name: None,
            methods: None,
            cost: Cost::Fixed(1),
        }
    }

    /// A rule for every path (for a layer on one route, e.g. axum's `route_layer`).
    pub fn any(limit: impl Into<Limit>, key: Key) -> Rule {
        Rule::new("*", limit, key)
    }

    /// Names the policy in keys and the RateLimit fields (printable ASCII).
    pub fn name(mut self, name: &str) -> Result<Rule, InvalidLimit> {
        if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(InvalidLimit::new(
                "name must be non-empty printable ASCII (it is sent in HTTP headers)",
            ));
        }
        self.name = Some(name.to_owned());
        Ok(self)
    }

    /// Only these methods (case-insensitive); others pass unlimited by this rule.
    pub fn methods<I, S>(mut self, methods: I) -> Rule
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.methods = Some(
            methods
                .into_iter()
                .filter_map(|m| Method::from_bytes(m.as_ref().to_ascii_uppercase().as_bytes()).ok())
                .collect(),
        );
        self
    }

    /// Units each request costs (default 1).
    pub fn cost(mut self, n: u64) -> Rule {
        self.cost = Cost::Fixed(n);
        self
    }

    /// Units each request costs, from the request (e.g. by size). A request costing more
    /// than the limit can never pass: 413.
    pub fn cost_fn(mut self, f: impl Fn(&RequestInfo<'_>) -> u64 + Send + Sync + 'static) -> Rule {
        self.cost = Cost::Fn(Arc::new(f));
        self
    }

    /// Whether the rule applies to this method and path.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if let Some(ms) = &self.methods {
            if !ms.contains(method) {
                return false;
            }
        }
        self.path.matches(path)
    }

    fn single_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.named[0].1.name().map(str::to_owned))
            .unwrap_or_else(|| path_name(&self.path))
    }
}

/// The one limiter call a request needs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Keys (without the limiter's prefix) and their limits, in rule order.
    pub keys: Vec<(String, Limit)>,
    /// Keys (without the prefix) and their policy names.
    pub names: Vec<(String, String)>,
    /// Units this request costs.
    pub cost: u64,
}

/// Finds the first rule for the request and builds its keys (`None`: not limited).
pub fn plan(rules: &[Rule], info: &RequestInfo<'_>, exempt: &[PathPattern]) -> Option<Plan> {
    if exempt.iter().any(|p| p.matches(info.path)) {
        return None;
    }
    let rule = rules.iter().find(|r| r.matches(info.method, info.path))?;
    plan_rule(rule, info)
}

/// Builds a matched rule's keys for this request (`None`: no key applies).
pub fn plan_rule(rule: &Rule, info: &RequestInfo<'_>) -> Option<Plan> {
    let info = RequestInfo {
        route: info.route.or_else(|| rule.path.text()),
        ..*info
    };
    let present: Vec<(String, &Limit, String)> = rule
        .named
        .iter()
        .filter_map(|(n, l, k)| k.value(&info).map(|v| (n.clone(), l, safe_key_part(&v))))
        .collect();
    if present.is_empty() {
        return None;
    }
    let cost = match &rule.cost {
        Cost::Fixed(n) => *n,
        Cost::Fn(f) => f(&info),
    };
    let mut keys = Vec::with_capacity(present.len());
    let mut names = Vec::with_capacity(present.len());
    if rule.single {
        let n = rule.single_name();
        let (_, lim, v) = &present[0];
        let k = format!("{n}:{v}");
        keys.push((k.clone(), (*lim).clone()));
        names.push((k, n));
    } else if present.len() == 1 {
        let (n, lim, v) = &present[0];
        let k = format!("{n}:{v}");
        keys.push((k.clone(), (*lim).clone()));
        names.push((k, n.clone()));
    } else {
        let tag = present[0].2.clone();
        for (n, lim, v) in &present {
            let k = format!("{{{tag}}}:{n}:{v}");
            keys.push((k.clone(), (*lim).clone()));
            names.push((k, n.clone()));
        }
    }
    Some(Plan { keys, names, cost })
}

/// What to answer: `status` `None` lets the request through with `headers`.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// `None`: pass; else the status to answer with.
    pub status: Option<StatusCode>,
    /// The fields to set (on the admitted response, or on the denial).
    pub headers: HeaderMap,
    /// The JSON body of a denial (empty when admitted).
    pub body: String,
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Turns a decision into the HTTP answer.
///
/// Allowed: pass, with the RateLimit fields. Denied: 429 with `Retry-After`, the fields and
/// `{"error": "rate_limited", "message": …, "policy": …, "retry_after": s}`. Never allowed
/// (its cost exceeds the limit): 413 with `{"error": "request_too_large", …}`. Denied by the
/// "closed" failure policy: `degraded_status` (503) with `Retry-After` and
/// `{"error": "limiter_unavailable", …}`. `names` are the [`Plan`]'s (keys without the
/// prefix), `prefix` the limiter's.
pub fn respond(
    decision: &Decision,
    names: &[(String, String)],
    x_headers: bool,
    degraded_status: StatusCode,
    prefix: &str,
) -> Verdict {
    let full: Vec<(String, String)> = names
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .collect();
    let (mut headers, policy) = if decision.per_key.is_empty() {
        let policy = full
            .first()
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| "default".to_owned());
        let h = decision.headers_with(&HeaderOptions {
            policy_name: Some(policy.clone()),
            x_headers,
            ..HeaderOptions::default()
        });
        (h, policy)
    } else {
        let h = decision.headers_with(&HeaderOptions {
            names: full.iter().cloned().collect(),
            x_headers,
            ..HeaderOptions::default()
        });
        (h, binding_name(decision, &full))
    };
    if decision.allowed {
        return Verdict {
            status: None,
            headers,
            body: String::new(),
        };
    }
    let retry = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (status, body) = if decision.never() {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{{\"error\": \"request_too_large\", \"message\": \"this request asks for more \
                 than the limit allows and can never pass\", \"policy\": {}}}",
                json_str(&policy)
            ),
        )
    } else if decision.degraded {
        (
            degraded_status,
            format!(
                "{{\"error\": \"limiter_unavailable\", \"message\": \"the rate limiter is \
                 unavailable; retry shortly\", \"retry_after\": {}}}",
                retry.map_or_else(|| "null".to_owned(), |r| r.to_string())
            ),
        )
    } else {
        (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{{\"error\": \"rate_limited\", \"message\": \"too many requests\", \"policy\": \
                 {}, \"retry_after\": {}}}",
                json_str(&policy),
                retry.unwrap_or(1)
            ),
        )
    };
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Verdict {
        status: Some(status),
        headers,
        body,
    }
}

fn binding_name(d: &Decision, names: &[(String, String)]) -> String {
    let name_of = |k: &str| {
        names
            .iter()
            .find(|(key, _)| key == k)
            .map_or_else(|| k.to_owned(), |(_, n)| n.clone())
    };
    for sub in &d.per_key {
        if !sub.allowed && (sub.never() || d.never()) == d.never() {
            return name_of(sub.key.as_deref().unwrap_or(""));
        }
    }
    for sub in &d.per_key {
        if sub.policy.is_some() && sub.policy == d.policy {
            return name_of(sub.key.as_deref().unwrap_or(""));
        }
    }
    names
        .first()
        .map_or_else(|| "default".to_owned(), |(_, n)| n.clone())
}

/// A denial for a limiter that could not decide (policy `Error`, Redis down): answered as
/// the "closed" policy would be.
pub(crate) fn unavailable(retry: std::time::Duration) -> Decision {
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        retry_after: RetryAfter::Wait(retry),
        reset_after: retry,
        degraded: true,
        source: crate::decision::Source::Local,
        policy: None,
        key: None,
        per_key: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_fnmatch() {
        assert!(glob(b"/users/*/avatar", b"/users/3/avatar"));
        assert!(glob(b"*", b"/anything/at/all"));
        assert!(!glob(b"/users/*/avatar", b"/users/3/avatars"));
        assert!(glob(b"/v?/x", b"/v2/x"));
        assert!(glob(b"/v[0-9]/*", b"/v7/y"));
        assert!(!glob(b"/v[!0-9]/*", b"/v7/y"));
        assert!(glob(b"/a[/b*", b"/a[/bc"));
    }

    #[test]
    fn safe_key_parts() {
        assert_eq!(safe_key_part("{evil}"), "%7Bevil%7D");
        assert_eq!(safe_key_part("a b"), "a%20b");
        assert_eq!(safe_key_part("é"), "%C3%A9");
        assert!(safe_key_part(&"x".repeat(200)).starts_with("sha256:"));
        assert_eq!(
            safe_key_part(&"x".repeat(129)),
            format!("sha256:{:x}", Sha256::digest("x".repeat(129).as_bytes()))
        );
    }
}
