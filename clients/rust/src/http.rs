//! Framework-neutral HTTP pieces: request info, the client address, key functions, rules,
//! and the 429/413/401/503 reply.
//!
//! The [`RateLimitLayer`](crate::RateLimitLayer) builds a [`RequestInfo`], finds the
//! [`Rule`] that applies (the first that matches, else the default rule), builds the
//! request's keys ([`plan`]), makes one decision (one `RL.ALL` whenever the keys can share a
//! slot), and turns the [`Decision`] into a status, header fields and a JSON body with
//! [`respond`].
//!
//! Keys keep identities apart (`docs/clients.md#identities-stay-apart`): every key is
//! `<limit name>:{<kind>:<value>}`, where the kind names the identity (`ip`,
//! `hdr.x-api-key`, `user`, `route`, or the caller's) and the value is escaped, so a
//! per-IP limit holds the IP alone and an API key equal to an IP address never shares its
//! bucket. The braces are the identity's hash tag: all limits of one identity share a Redis
//! Cluster slot.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Extensions, Method, StatusCode};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::decision::{Decision, HeaderOptions, RetryAfter};
use crate::limits::{parse_limits, Gcra, InvalidLimit, Lease, Limit, Window};

/// What key functions and rules see of a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path (without the query), as received.
    pub path: &'a str,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// The request's extensions (where an auth layer puts the user, axum its
    /// `ConnectInfo`).
    pub extensions: &'a Extensions,
    /// The socket peer's address, if the server put it in the extensions (see
    /// [`RateLimitLayer`](crate::RateLimitLayer)).
    pub peer: Option<IpAddr>,
    /// The client's address as the layer keys it ([`ClientIp`]: the peer, or what trusted
    /// proxies forwarded; an IPv6 client as its /64 network by default), e.g. `"192.0.2.7"`
    /// or `"2001:db8::/64"`. `None` without a usable address (no peer address, e.g. a Unix
    /// socket, and no trusted forwarding header): the `ip` identity is then [`UNKNOWN_IP`].
    pub client_ip: Option<&'a str>,
    /// The matched route (axum's `MatchedPath`), if the framework gave one.
    pub route: Option<&'a str>,
    /// The `Content-Length`, if sent.
    pub content_length: Option<u64>,
}

impl RequestInfo<'_> {
    /// All values of a header field as one list, decoded as Latin-1, or `None` when absent:
    /// every line split on `,`, each element's surrounding whitespace (spaces, tabs)
    /// removed, the elements joined with `", "`. Repeated lines and one comma-separated line
    /// read the same (`a` and `b` on two lines, `a,b` and `a , b` are all `"a, b"`), as in
    /// the Python package, so one request has one key whichever server ran it.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use redis_rl_client::http::normalize_list;
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.append("x-api-key", HeaderValue::from_static("a ,b"));
    /// headers.append("x-api-key", HeaderValue::from_static(" c"));
    /// let lines = headers.get_all("x-api-key").iter().map(|v| v.to_str().unwrap());
    /// assert_eq!(normalize_list(lines), "a, b, c");
    /// ```
    pub fn header(&self, name: &str) -> Option<String> {
        let mut values = self.headers.get_all(name).iter().peekable();
        values.peek()?;
        let lines: Vec<String> = values.map(|v| latin1(v.as_bytes())).collect();
        Some(normalize_list(lines.iter().map(String::as_str)))
    }

    /// The path normalised: percent-decoded, `//` collapsed, no trailing `/` (except for
    /// `/` itself), so that spellings of one path match one rule and share one bucket.
    pub fn normalized_path(&self) -> String {
        normalize_path(self.path)
    }

    /// Whether this is a CORS preflight: `OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`.
    pub fn is_cors_preflight(&self) -> bool {
        self.method == Method::OPTIONS
            && self.headers.contains_key(http::header::ORIGIN)
            && self
                .headers
                .contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD)
    }
}

/// One header field's lines as one list value (what [`RequestInfo::header`] gives): each
/// line split on `,`, each element trimmed of spaces and tabs (the field's optional
/// whitespace), the elements joined with `", "`. Empty elements are kept (`"a,,b"` is
/// `"a, , b"`).
pub fn normalize_list<'a>(lines: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::new();
    let mut first = true;
    for element in lines.into_iter().flat_map(|line| line.split(',')) {
        if !first {
            out.push_str(", ");
        }
        first = false;
        out.push_str(element.trim_matches([' ', '\t']));
    }
    out
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes `path`, collapses runs of `/`, resolves `.` and `..` segments (RFC 3986's
/// remove_dot_segments, after decoding, so `%2e%2e` is `..` too), and drops a trailing `/`
/// (except for the root): `/api//Things/`, `/api/%54hings` and `/static/../api/Things` all
/// give `/api/Things`.
pub fn normalize_path(path: &str) -> String {
    let raw = path.as_bytes();
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex_value(raw[i + 1]), hex_value(raw[i + 2])) {
                decoded.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        decoded.push(raw[i]);
        i += 1;
    }
    let text = String::from_utf8_lossy(&decoded);
    let mut out = String::with_capacity(text.len() + 1);
    if !text.starts_with('/') {
        out.push('/');
    }
    for c in text.chars() {
        if c == '/' && out.ends_with('/') {
            continue;
        }
        out.push(c);
    }
    if out.contains('.') {
        out = remove_dot_segments(&out);
    }
    if out.len() > 1 && out.ends_with('/') {
        out.pop();
    }
    out
}

/// Resolves the `.` and `..` segments of an absolute path with single `/` separators, as RFC
/// 3986 section 5.2.4 does (`..` above the root stays at the root): `/static/../api` is
/// `/api`, the path a router that resolves them serves.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path[1..].split('/').collect();
    let mut kept: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            "." => {}
            ".." => {
                kept.pop();
            }
            other => {
                kept.push(other);
                continue;
            }
        }
        if last {
            kept.push("");
        }
    }
    let mut out = String::with_capacity(path.len());
    out.push('/');
    out.push_str(&kept.join("/"));
    out
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

/// An entry without the quotes of a quoted string (RFC 7239 `for="…"`): quoted as a whole,
/// or not at all; an unclosed or stray quote (`for="1.1.1.1`) makes the entry unusable.
fn unquoted(text: &str) -> Option<&str> {
    let t = text.trim();
    if !t.contains('"') {
        return Some(t);
    }
    let inner = t.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('"')).then_some(inner)
}

/// Reads an address from a forwarding header entry (quotes, port and brackets off); `None`:
/// not an address (garbage, a port alone, an unclosed or stray quote).
fn parse_addr(text: &str) -> Option<IpAddr> {
    let mut t = unquoted(text)?;
    if let Some(rest) = t.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !port_or_nothing(after) {
            return None;
        }
        t = addr;
    } else if t.matches(':').count() == 1 {
        let colon = t.find(':')?;
        if !port_or_nothing(&t[colon..]) {
            return None;
        }
        t = &t[..colon];
    }
    t.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Whether `s`, what follows an address in a forwarding entry, is empty or a port: `:` and a
/// number, or RFC 7239's obfuscated port (`_` and letters, digits, `.`, `_`, `-`). Anything
/// else (`[2001:db8::1]junk`) makes the entry unusable.
fn port_or_nothing(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let Some(port) = s.strip_prefix(':') else {
        return false;
    };
    if port.starts_with('_') {
        port.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    } else {
        !port.is_empty() && port.bytes().all(|c| c.is_ascii_digit())
    }
}

/// The `for=` values of an RFC 7239 Forwarded field, in order.
fn forwarded_for(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    for element in value.split(',') {
        let mut found = false;
        for pair in element.split(';') {
            if let Some((name, v)) = pair.trim().split_once('=') {
                if name.trim().eq_ignore_ascii_case("for") {
                    out.push(v.trim().to_owned());
                    found = true;
                }
            }
        }
        if !found {
            // An element without `for=` is an unusable entry, not a skipped one.
            out.push(String::new());
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

/// The client address rule (`docs/clients.md#client-ip`): which peers are trusted proxies,
/// which forwarding header they write, and how IPv6 clients are keyed.
///
/// * The socket peer is the client unless it is a trusted proxy (an address or CIDR
///   network). Then exactly one forwarding header is read (`X-Forwarded-For` by default,
///   or `Forwarded`; never both), every line of it counting (repeated fields are one list),
///   and the rightmost address not in the trusted set is the client; what a client writes at
///   the left is ignored.
/// * An unusable value (garbage, a port-only entry, an `unknown` or obfuscated hop, an
///   unclosed or stray quote such as `for="1.1.1.1`, an empty list) falls back to the peer
///   address, and the layer counts it (`forwarded_unusable`).
/// * An IPv4-mapped IPv6 address is IPv4. IPv6 clients are keyed by their network of
///   [`ipv6_prefix`](ClientIp::ipv6_prefix) bits (default /64: rotating addresses inside one
///   allocation gains nothing), written `2001:db8:1:2::/64`.
///
/// ```
/// use redis_rl_client::http::{ClientIp, Forwarding};
///
/// let behind_proxies = ClientIp::new()
///     .trusted(["10.0.0.0/8", "192.0.2.1"])?
///     .forwarding(Forwarding::XForwardedFor)
///     .ipv6_prefix(56)?;
/// let headers = http::HeaderMap::from_iter([(
///     http::header::HeaderName::from_static("x-forwarded-for"),
///     http::HeaderValue::from_static("6.6.6.6, 198.51.100.7, 10.1.1.1"),
/// )]);
/// let peer = "10.0.0.5".parse().ok();
/// assert_eq!(behind_proxies.resolve(peer, &headers).0.as_deref(), Some("198.51.100.7"));
/// assert_eq!(ClientIp::new().key_of("2001:db8:1:2:3:4:5:6".parse()?), "2001:db8:1:2::/64");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    /// `"unix"` was trusted: a peer with no IP address (a Unix socket) is a trusted proxy.
    trust_unix: bool,
    forwarding: Forwarding,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> ClientIp {
        ClientIp::new()
    }
}

impl ClientIp {
    /// The socket peer is the client (no trusted proxies), IPv6 keyed by /64.
    pub fn new() -> ClientIp {
        ClientIp {
            trusted: Vec::new(),
            trust_unix: false,
            forwarding: Forwarding::XForwardedFor,
            ipv6_prefix: 64,
        }
    }

    /// Trusts these proxies: addresses, CIDR networks, and the word `"unix"`, which means "a
    /// peer with no IP address (a Unix socket) is a trusted proxy": behind nginx (or any
    /// proxy) on a Unix socket, its forwarding header then names the client, read as for any
    /// trusted proxy. Errors: an entry that is none of these.
    ///
    /// ```
    /// use redis_rl_client::http::ClientIp;
    ///
    /// let behind_nginx_on_a_socket = ClientIp::new().trusted(["unix"])?;
    /// let headers = http::HeaderMap::from_iter([(
    ///     http::header::HeaderName::from_static("x-forwarded-for"),
    ///     http::HeaderValue::from_static("198.51.100.7"),
    /// )]);
    /// // No peer address (a Unix socket): the trusted proxy's header names the client.
    /// assert_eq!(behind_nginx_on_a_socket.resolve(None, &headers).0.as_deref(), Some("198.51.100.7"));
    /// // Without "unix" a socket peer is no proxy: no usable address (the `unknown` bucket).
    /// assert_eq!(ClientIp::new().resolve(None, &headers).0, None);
    /// # Ok::<(), redis_rl_client::InvalidLimit>(())
    /// ```
    pub fn trusted<I, S>(mut self, proxies: I) -> Result<ClientIp, InvalidLimit>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut nets = Vec::new();
        let mut unix = false;
        for p in proxies {
            let p = p.as_ref();
            if p.trim().eq_ignore_ascii_case("unix") {
                unix = true;
            } else {
                nets.push(parse_network(p)?);
            }
        }
        self.trusted = nets;
        self.trust_unix = unix;
        Ok(self)
    }

    /// The one forwarding header trusted proxies write (default `X-Forwarded-For`).
    pub fn forwarding(mut self, header: Forwarding) -> ClientIp {
        self.forwarding = header;
        self
    }

    /// How many leading bits of an IPv6 client address are its identity: 48 to 128 (default
    /// 64; 128 keys each address). Errors: a value outside 48..=128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<ClientIp, InvalidLimit> {
        if !(48..=128).contains(&bits) {
            return Err(InvalidLimit::new("ipv6_prefix must be 48 to 128"));
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    /// How an address is keyed: IPv4 (also IPv4-mapped IPv6) as is, IPv6 as its network of
    /// `ipv6_prefix` bits (`2001:db8::/64`; the plain address at 128).
    pub fn key_of(&self, addr: IpAddr) -> String {
        match addr.to_canonical() {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) if self.ipv6_prefix >= 128 => v6.to_string(),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = u128::MAX << (128 - u32::from(self.ipv6_prefix));
                let net = std::net::Ipv6Addr::from(bits & mask);
                format!("{net}/{}", self.ipv6_prefix)
            }
        }
    }

    /// The client's key for a request from `peer` with these `headers`, and whether a
    /// forwarding header was unusable (then the peer is the client). `None`: no usable
    /// client address (no peer address, e.g. a Unix socket, unless `"unix"` is trusted and
    /// its forwarding header names the client); the layer then keys the `ip` identity as
    /// `unknown`, one bucket shared by all such requests.
    pub fn resolve(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> (Option<String>, bool) {
        let (addr, bad) = self.client_addr(peer.map(|p| p.to_canonical()), headers);
        (addr.map(|a| self.key_of(a)), bad)
    }

    fn client_addr(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> (Option<IpAddr>, bool) {
        let trusted = |a: &IpAddr| self.trusted.iter().any(|n| n.contains(a));
        let from_proxy = match peer {
            Some(p) => trusted(&p),
            None => self.trust_unix,
        };
        if !from_proxy {
            return (peer, false);
        }
        let name = match self.forwarding {
            Forwarding::XForwardedFor => "x-forwarded-for",
            Forwarding::Forwarded => "forwarded",
        };
        let mut lines = headers.get_all(name).iter().peekable();
        if lines.peek().is_none() {
            return (peer, false); // no header: the proxy is the client (a health check)
        }
        let raw: Vec<String> = lines.map(|v| latin1(v.as_bytes())).collect();
        let raw = raw.join(", ");
        let hops: Vec<String> = match self.forwarding {
            Forwarding::Forwarded => forwarded_for(&raw),
            Forwarding::XForwardedFor => raw.split(',').map(str::to_owned).collect(),
        };
        let mut leftmost = None;
        for hop in hops.iter().rev() {
            match parse_addr(hop) {
                None => return (peer, true),
                Some(a) if !trusted(&a) => return (Some(a), false),
                Some(a) => leftmost = Some(a),
            }
        }
        // Every hop is a trusted proxy: the request started inside; the leftmost is it.
        match leftmost {
            Some(a) => (Some(a), false),
            None => (peer, true),
        }
    }
}

/// The `ip` identity's value when no usable client address can be found (no peer address,
/// e.g. a Unix socket or a server that gives the layer none, and no trusted forwarding
/// header): every such request counts in the one bucket `<name>:{ip:unknown}`, limited,
/// never unlimited (the Python package's, too).
pub const UNKNOWN_IP: &str = "unknown";

/// What a key function found: the identity's value, or nothing; whether a forwarding header
/// was unusable on the way; whether the value is [`UNKNOWN_IP`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    pub(crate) value: Option<String>,
    pub(crate) bad_forwarding: bool,
    pub(crate) peer_unknown: bool,
}

impl Found {
    fn of(value: Option<String>) -> Found {
        Found {
            value,
            ..Found::default()
        }
    }

    /// An `ip` identity: the address, or [`UNKNOWN_IP`] without one.
    fn ip(value: Option<String>, bad_forwarding: bool) -> Found {
        Found {
            peer_unknown: value.is_none(),
            value: Some(value.unwrap_or_else(|| UNKNOWN_IP.to_owned())),
            bad_forwarding,
        }
    }
}

type KeyFn = dyn Fn(&RequestInfo<'_>) -> Found + Send + Sync;

/// A key function: the identity a limit counts by (its **kind**, part of every key) and its
/// value for a request, or nothing when the request does not carry it (no API key sent, an
/// anonymous user: the rule's [`Missing`] policy decides).
///
/// Kinds: `ip` ([`Key::ip`], [`Key::client_ip`]), `hdr.<lower-case name>` ([`Key::header`]),
/// `route` ([`Key::route`]), `user` ([`Key::extension`]), `fn` ([`Key::from_fn`]); rename
/// with [`Key::kind`].
///
/// ```
/// use redis_rl_client::http::Key;
///
/// let by_ip = Key::ip();                                   // the layer's client-IP rule
/// let by_api_key = Key::header("X-API-Key");               // kind "hdr.x-api-key"
/// let shared = Key::header_or("X-API-Key", "anonymous");   // keyless clients share one bucket
/// let by_route = Key::route();                             // one shared limit per endpoint
/// let by_tenant = Key::from_fn(|req| req.header("x-tenant")).kind("tenant")?;
/// assert_eq!((by_api_key.kind_name(), by_tenant.kind_name()), ("hdr.x-api-key", "tenant"));
/// # let _ = (by_ip, shared, by_route);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Clone)]
pub struct Key {
    kind: Arc<str>,
    f: Arc<KeyFn>,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.kind)
    }
}

fn check_kind(kind: &str) -> Result<(), InvalidLimit> {
    if kind.is_empty()
        || kind.len() > 64
        || !kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(InvalidLimit::new(
            "a key kind must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-'",
        ));
    }
    Ok(())
}

impl Key {
    fn new(
        kind: impl Into<Arc<str>>,
        f: impl Fn(&RequestInfo<'_>) -> Found + Send + Sync + 'static,
    ) -> Key {
        Key {
            kind: kind.into(),
            f: Arc::new(f),
        }
    }

    /// The client's IP address as the layer finds it (its [`ClientIp`] setting:
    /// [`RateLimitLayer::client_ip`](crate::RateLimitLayer::client_ip)), kind `ip`. Without
    /// a usable address (no peer address: a Unix socket, or a server that gives none) the
    /// value is [`UNKNOWN_IP`]: all such requests share one bucket, limited, never
    /// unlimited (the layer counts them, `peer_unknown`, and warns once).
    pub fn ip() -> Key {
        Key::new("ip", |info: &RequestInfo<'_>| {
            Found::ip(info.client_ip.map(str::to_owned), false)
        })
    }

    /// The client's IP address with its own client-IP rule: `trusted_proxies` (addresses or
    /// CIDR networks) for `X-Forwarded-For`, IPv6 by /64 (see [`ClientIp`]), kind `ip`.
    ///
    /// The peer comes from the request's extensions: axum's `ConnectInfo<SocketAddr>` (serve
    /// with `into_make_service_with_connect_info`), or a `SocketAddr` / `IpAddr` extension
    /// your hyper server inserts; without one (a Unix socket) the value is [`UNKNOWN_IP`],
    /// unless `"unix"` is trusted and the proxy's forwarding header names the client (see
    /// [`ClientIp::trusted`]). Errors: a proxy entry that is not an address, a network or
    /// `"unix"`.
    pub fn client_ip<I, S>(trusted_proxies: I) -> Result<Key, InvalidLimit>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Key::client_ip_from(
            ClientIp::new().trusted(trusted_proxies)?,
        ))
    }

    /// [`Key::client_ip`] reading the header your proxies write: only that one is read
    /// (`Forwarded` ignores `X-Forwarded-For`, and the reverse).
    pub fn client_ip_with<I, S>(trusted_proxies: I, header: Forwarding) -> Result<Key, InvalidLimit>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Key::client_ip_from(
            ClientIp::new().trusted(trusted_proxies)?.forwarding(header),
        ))
    }

    /// The client's IP address by the given [`ClientIp`] rule, kind `ip`.
    pub fn client_ip_from(rule: ClientIp) -> Key {
        Key::new("ip", move |info: &RequestInfo<'_>| {
            let (value, bad_forwarding) = rule.resolve(info.peer, info.headers);
            Found::ip(value, bad_forwarding)
        })
    }

    /// A request header (e.g. an API key), kind `hdr.<lower-case name>`. A request without
    /// it (or with it empty) is handled by the rule's [`Missing`] policy: by default keyed
    /// by its client IP instead, never unlimited and never in a bucket shared by every
    /// keyless client.
    pub fn header(name: &str) -> Key {
        let name = name.to_ascii_lowercase();
        Key::new(format!("hdr.{name}"), move |info: &RequestInfo<'_>| {
            Found::of(info.header(&name).filter(|v| !v.is_empty()))
        })
    }

    /// A request header, or `default` when it is absent: every client without the header
    /// shares the one bucket `default` (ask for this only when that is what you want; see
    /// [`Key::header`]).
    pub fn header_or(name: &str, default: &str) -> Key {
        let name = name.to_ascii_lowercase();
        let default = default.to_owned();
        Key::new(format!("hdr.{name}"), move |info: &RequestInfo<'_>| {
            Found::of(Some(
                info.header(&name)
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| default.clone()),
            ))
        })
    }

    /// The method and the route: one shared limit per endpoint, kind `route`
    /// (`"GET /users/{id}"` with axum's `MatchedPath`, else the normalised path, so that
    /// `/users/7/` and `/users//7` are one endpoint).
    pub fn route() -> Key {
        Key::new("route", |info: &RequestInfo<'_>| {
            let route = match info.route {
                Some(r) => Cow::Borrowed(r),
                None => Cow::Owned(info.normalized_path()),
            };
            Found::of(Some(format!("{} {route}", info.method)))
        })
    }

    /// A value an earlier layer put in the request's extensions, e.g. the authenticated
    /// user's id, kind `user`; a request without it is handled by the rule's [`Missing`]
    /// policy.
    pub fn extension<T>() -> Key
    where
        T: fmt::Display + Send + Sync + 'static,
    {
        Key::new("user", |info: &RequestInfo<'_>| {
            Found::of(info.extensions.get::<T>().map(ToString::to_string))
        })
    }

    /// Any function of the request, kind `fn` (name it with [`Key::kind`]).
    pub fn from_fn<F>(f: F) -> Key
    where
        F: Fn(&RequestInfo<'_>) -> Option<String> + Send + Sync + 'static,
    {
        Key::new("fn", move |info: &RequestInfo<'_>| Found::of(f(info)))
    }

    /// The same key function under another identity kind (1 to 64 of `A-Za-z0-9._-`): keys
    /// of different kinds never share a bucket. Errors: any other kind.
    pub fn kind(mut self, kind: &str) -> Result<Key, InvalidLimit> {
        check_kind(kind)?;
        self.kind = Arc::from(kind);
        Ok(self)
    }

    /// The identity kind (part of every key this function makes).
    pub fn kind_name(&self) -> &str {
        &self.kind
    }

    /// The key's value for a request (`None`: the request does not carry the identity).
    pub fn value(&self, info: &RequestInfo<'_>) -> Option<String> {
        (self.f)(info).value
    }

    pub(crate) fn lookup(&self, info: &RequestInfo<'_>) -> Found {
        (self.f)(info)
    }
}

/// Makes a client-supplied value safe inside a Redis key: braces (hash tags), spaces,
/// control and other bytes are percent-encoded (UTF-8, upper-case hex), and values over 128
/// bytes are hashed, so a client cannot choose the hash tag, collide with another identity,
/// or grow the key.
///
/// The hashed form is `~sha256:<lower-case hex of the SHA-256 of the value's UTF-8 bytes>`:
/// it starts with `~`, which the escaping always encodes (`%7E`), so no literal value can
/// produce it (a client sending `sha256:<hex>` of another client's long key gets a bucket of
/// its own). The same bytes as the Python package's `safe_key_part`.
///
/// ```
/// use redis_rl_client::http::safe_key_part;
///
/// assert_eq!(safe_key_part("{evil} ~"), "%7Bevil%7D%20%7E");
/// let long = "a".repeat(200);
/// assert!(safe_key_part(&long).starts_with("~sha256:"));
/// assert_eq!(safe_key_part(&long).len(), "~sha256:".len() + 64);
/// ```
pub fn safe_key_part(value: &str) -> String {
    if value.len() > 128 {
        let digest = Sha256::digest(value.as_bytes());
        let mut out = String::from("~sha256:");
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

/// Which paths a [`Rule`] (or an exemption) applies to; matched against the normalised path
/// ([`normalize_path`]), so `/login/` and `//login` are `/login`.
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
    /// A pattern from a predicate over the (normalised) path.
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

type LimitsFn = dyn Fn(&RequestInfo<'_>) -> Result<Vec<Limit>, InvalidLimit> + Send + Sync;

#[derive(Clone)]
enum LimitsInner {
    Fixed(Vec<Limit>),
    Fn(Arc<LimitsFn>),
}

/// The limits of one identity in a [`Rule`]: one or several rate limits (a [`Gcra`], a
/// [`Window`], a string such as `"20/minute; 200 per hour"`), or a function of the request
/// that picks them (by plan, by tenant, …), evaluated per request.
///
/// ```
/// use redis_rl_client::http::{Key, Limits, Rule};
/// use redis_rl_client::Gcra;
///
/// #[derive(Clone, Copy, PartialEq)]
/// enum Plan { Free, Pro }
///
/// let free: Limits = "100 per hour".parse()?;
/// let pro = Limits::parse("1000/hour; 10000/day")?;
/// let by_plan = Limits::from_fn(move |req| {
///     if req.extensions.get::<Plan>() == Some(&Plan::Pro) { pro.clone() } else { free.clone() }
/// });
/// let rule = Rule::new("/api/", by_plan, Key::header("X-API-Key"))?;
/// let burst = Rule::new("/burst", Gcra::new(20, 10, 1)?, Key::ip())?;
/// # let _ = (rule, burst);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Clone)]
pub struct Limits(LimitsInner);

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            LimitsInner::Fixed(v) => f.debug_tuple("Limits").field(v).finish(),
            LimitsInner::Fn(_) => f.write_str("Limits(fn)"),
        }
    }
}

impl Limits {
    /// Limits from a string ([`parse_limits`](crate::parse_limits)'s grammar). Errors: the
    /// bad part, named.
    pub fn parse(text: &str) -> Result<Limits, InvalidLimit> {
        Ok(Limits(LimitsInner::Fixed(parse_limits(text)?)))
    }

    /// Limits computed per request: `f` returns anything [`IntoLimits`] (a limit, a string,
    /// a `Vec<Limit>`, `Limits`, or a `Result` of one). A request whose function gives no
    /// usable limit (an error, an empty list, a [`Lease`]) is answered 500
    /// (`limiter_error`) with an error event.
    pub fn from_fn<F, L>(f: F) -> Limits
    where
        F: Fn(&RequestInfo<'_>) -> L + Send + Sync + 'static,
        L: IntoLimits,
    {
        Limits(LimitsInner::Fn(Arc::new(move |info: &RequestInfo<'_>| {
            f(info).into_limits()?.resolve_depth(info, 0)
        })))
    }

    /// The limits for this request (a function's are evaluated now). Errors: a function's
    /// error, an empty list, a [`Lease`].
    pub fn resolve(&self, info: &RequestInfo<'_>) -> Result<Vec<Limit>, InvalidLimit> {
        self.resolve_depth(info, 0)
    }

    fn resolve_depth(
        &self,
        info: &RequestInfo<'_>,
        depth: usize,
    ) -> Result<Vec<Limit>, InvalidLimit> {
        let limits = match &self.0 {
            LimitsInner::Fixed(v) => v.clone(),
            LimitsInner::Fn(_) if depth > 4 => {
                return Err(InvalidLimit::new(
                    "a limit function returned functions more than 4 deep",
                ))
            }
            LimitsInner::Fn(f) => f(info)?,
        };
        check_rates(&limits)?;
        Ok(limits)
    }
}

/// A rule's limits are request rates: a lease would fail every request it applies to.
fn check_rates(limits: &[Limit]) -> Result<(), InvalidLimit> {
    if limits.is_empty() {
        return Err(InvalidLimit::new("a rule needs at least one limit"));
    }
    if limits.iter().any(|l| matches!(l, Limit::Lease(_))) {
        return Err(InvalidLimit::new(
            "a Rule takes Gcra or Window limits, not a Lease: take a concurrency limit with \
             Limiter::acquire in the handler",
        ));
    }
    Ok(())
}

impl std::str::FromStr for Limits {
    type Err = InvalidLimit;

    fn from_str(text: &str) -> Result<Limits, InvalidLimit> {
        Limits::parse(text)
    }
}

impl From<Gcra> for Limits {
    fn from(g: Gcra) -> Limits {
        Limits(LimitsInner::Fixed(vec![g.into()]))
    }
}

impl From<Window> for Limits {
    fn from(w: Window) -> Limits {
        Limits(LimitsInner::Fixed(vec![w.into()]))
    }
}

impl From<Limit> for Limits {
    fn from(l: Limit) -> Limits {
        Limits(LimitsInner::Fixed(vec![l]))
    }
}

impl From<Vec<Limit>> for Limits {
    fn from(v: Vec<Limit>) -> Limits {
        Limits(LimitsInner::Fixed(v))
    }
}

/// What a [`Rule`] accepts as its limits (and a [`Limits::from_fn`] function may return):
/// [`Limits`], [`Limit`], [`Gcra`], [`Window`], `&str` / `String` (parsed), `Vec<Limit>`,
/// `[Limit; N]`, and a `Result` of any of them. A [`Lease`] converts to an error.
pub trait IntoLimits {
    /// Converts, validating. Errors: a string that does not parse, a [`Lease`], no limit.
    fn into_limits(self) -> Result<Limits, InvalidLimit>;
}

impl IntoLimits for Limits {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Ok(self)
    }
}

impl IntoLimits for Limit {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        check_rates(std::slice::from_ref(&self))?;
        Ok(self.into())
    }
}

impl IntoLimits for Gcra {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Ok(self.into())
    }
}

impl IntoLimits for Window {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Ok(self.into())
    }
}

impl IntoLimits for &Gcra {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Ok(self.clone().into())
    }
}

impl IntoLimits for &Window {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Ok(self.clone().into())
    }
}

impl IntoLimits for &Limit {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        self.clone().into_limits()
    }
}

impl IntoLimits for Lease {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Limit::Lease(self).into_limits()
    }
}

impl IntoLimits for &str {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Limits::parse(self)
    }
}

impl IntoLimits for String {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Limits::parse(&self)
    }
}

impl IntoLimits for Vec<Limit> {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        check_rates(&self)?;
        Ok(self.into())
    }
}

impl<const N: usize> IntoLimits for [Limit; N] {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        Vec::from(self).into_limits()
    }
}

impl<L: IntoLimits> IntoLimits for Result<L, InvalidLimit> {
    fn into_limits(self) -> Result<Limits, InvalidLimit> {
        self?.into_limits()
    }
}

/// What a rule does with a request whose key function finds nothing (no API key header, no
/// authenticated user): `docs/clients.md#a-missing-identity-is-never-no-limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Missing {
    /// Apply the limit keyed by the client IP instead (kind `ip`, the layer's
    /// [`ClientIp`] rule): keyless clients of one IP share one bucket of that limit, apart
    /// from every other IP and from the rule's own per-IP limit (another limit name).
    /// Without a usable client address, the IP is [`UNKNOWN_IP`] (one shared bucket).
    #[default]
    Ip,
    /// Answer 401 with `{"error": "identity_required", …}` (counted `missing_denied`).
    Deny,
    /// Do not apply this limit to the request (an explicit opt-in, counted `skipped`).
    Skip,
}

type CostFn = dyn Fn(&RequestInfo<'_>) -> u64 + Send + Sync;
type Predicate = dyn Fn(&RequestInfo<'_>) -> bool + Send + Sync;
type StatusPredicate = dyn Fn(StatusCode) -> bool + Send + Sync;

#[derive(Clone)]
enum Cost {
    Fixed(u64),
    Fn(Arc<CostFn>),
}

#[derive(Clone)]
struct Part {
    name: String,
    limits: Limits,
    key: Key,
}

/// Limits the requests whose path matches (and whose method is one of `methods`, if set).
///
/// One identity's limits ([`Rule::new`]) or several identities' ([`Rule::all`]: e.g. per
/// API key and per IP), checked in one decision: admitted by all or charged to none. Each
/// limit is keyed by its own identity only (`<name>:{<kind>:<value>}`), so a
/// client that changes one identity (rotating API keys) cannot reset another's limit (its
/// IP's). On one server (or when every key shares a slot) the decision is one `RL.ALL`; on
/// a Redis Cluster, keys of different identities usually live in different slots, and the
/// limits are checked in the rule's order, what earlier ones took being refunded when a
/// later one denies ([`CheckAll::across_slots`](crate::CheckAll::across_slots)); give the
/// rule a [`hash_tag`](Rule::hash_tag) to make it one `RL.ALL` there too.
///
/// Building a rule never panics: every constructor returns a `Result`.
///
/// ```
/// use redis_rl_client::http::{Key, Missing, Rule};
/// use redis_rl_client::{Algorithm, Gcra, Window};
///
/// let login = Rule::new("/login", Window::new(5, 300, Algorithm::Log)?, Key::ip())?
///     .methods(["POST"])
///     .name("login")?;
/// let api = Rule::all("/api/", [
///     ("key", "100/minute; 1000/hour".parse()?, Key::header("X-API-Key")),
///     ("ip", Window::sliding(300, 60)?.into(), Key::ip()),
/// ])?
/// .missing(Missing::Deny)                      // 401 without an API key
/// .exempt_when(|req| req.header("x-internal").is_some())
/// .deduct_when(|status| status.as_u16() < 500); // a server error is not charged
/// let upload = Rule::new("/upload", Gcra::new(50, 1, 1)?, Key::header("X-User"))?
///     .cost_fn(|req| req.content_length.unwrap_or(0) / 1_000_000);
/// assert!(Rule::new("/x", redis_rl_client::Lease::new(2, 30)?, Key::ip()).is_err());
/// # let _ = (login, api, upload);
/// # Ok::<(), redis_rl_client::InvalidLimit>(())
/// ```
#[derive(Clone)]
pub struct Rule {
    path: PathPattern,
    parts: Vec<Part>,
    single: bool,
    name: Option<String>,
    methods: Option<Vec<Method>>,
    cost: Cost,
    missing: Option<Missing>,
    exempt_when: Option<Arc<Predicate>>,
    deduct_when: Option<Arc<StatusPredicate>>,
    hash_tag: Option<String>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("path", &self.path)
            .field(
                "limits",
                &self
                    .parts
                    .iter()
                    .map(|p| (&p.name, &p.limits, &p.key))
                    .collect::<Vec<_>>(),
            )
            .field("name", &self.name)
            .field("methods", &self.methods)
            .field("missing", &self.missing)
            .field("hash_tag", &self.hash_tag)
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

fn check_name(name: &str) -> Result<(), InvalidLimit> {
    if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(InvalidLimit::new(
            "name must be non-empty printable ASCII (it is sent in HTTP headers)",
        ));
    }
    Ok(())
}

/// Names several limits of one identity: each its own name if it has one, else
/// `<base>-<window seconds>s`, with `-2`, `-3` appended when two names are equal.
fn limit_names(base: &str, limits: &[Limit]) -> Vec<String> {
    if let [only] = limits {
        return vec![only.name().map_or_else(|| base.to_owned(), str::to_owned)];
    }
    let mut out: Vec<String> = Vec::with_capacity(limits.len());
    for l in limits {
        let first = match l.name() {
            Some(n) => n.to_owned(),
            None => {
                let secs = l.policy_window().map_or(0, crate::decision::ceil_seconds);
                format!("{base}-{secs}s")
            }
        };
        let mut name = first.clone();
        let mut n = 2;
        while out.contains(&name) {
            name = format!("{first}-{n}");
            n += 1;
        }
        out.push(name);
    }
    out
}

impl Rule {
    /// One identity's limits (one or several: a limit, a string, [`Limits`]), keyed by
    /// `key`. The name (in keys and headers) is the rule's [`name`](Rule::name), else the
    /// limit's, else one made from the path; several limits are named
    /// `<name>-<window seconds>s`.
    ///
    /// Errors: a string that does not parse, a [`Lease`] (the layer limits request rates; a
    /// concurrency limit is taken with [`Limiter::acquire`](crate::Limiter::acquire) in the
    /// handler).
    pub fn new(
        path: impl Into<PathPattern>,
        limits: impl IntoLimits,
        key: Key,
    ) -> Result<Rule, InvalidLimit> {
        let limits = limits.into_limits()?;
        if let LimitsInner::Fixed(v) = &limits.0 {
            check_rates(v)?;
        }
        Ok(Rule::build(
            path.into(),
            vec![Part {
                name: String::new(),
                limits,
                key,
            }],
            true,
        ))
    }

    /// Several identities' limits, each named, checked together as one decision (e.g.
    /// `("key", …, Key::header("X-API-Key"))` and `("ip", …, Key::ip())`).
    ///
    /// Errors: no limits, an empty or non-ASCII name, two parts with one name, a [`Lease`].
    pub fn all<I, N>(path: impl Into<PathPattern>, limits: I) -> Result<Rule, InvalidLimit>
    where
        I: IntoIterator<Item = (N, Limits, Key)>,
        N: Into<String>,
    {
        let mut parts: Vec<Part> = Vec::new();
        for (name, limits, key) in limits {
            let name = name.into();
            check_name(&name)?;
            if parts.iter().any(|p| p.name == name) {
                return Err(InvalidLimit::new(format!(
                    "two limits of one rule are named '{name}'"
                )));
            }
            if let LimitsInner::Fixed(v) = &limits.0 {
                check_rates(v)?;
            }
            parts.push(Part { name, limits, key });
        }
        if parts.is_empty() {
            return Err(InvalidLimit::new("a rule needs at least one limit"));
        }
        Ok(Rule::build(path.into(), parts, false))
    }

    /// A rule for every path (for a layer on one route, e.g. axum's `route_layer`, or as the
    /// layer's [`default_rule`](crate::RateLimitLayer::default_rule)). Errors: as
    /// [`Rule::new`].
    pub fn any(limits: impl IntoLimits, key: Key) -> Result<Rule, InvalidLimit> {
        Rule::new("*", limits, key)
    }

    fn build(path: PathPattern, parts: Vec<Part>, single: bool) -> Rule {
        Rule {
            path,
            parts,
            single,
            name: None,
            methods: None,
            cost: Cost::Fixed(1),
            missing: None,
            exempt_when: None,
            deduct_when: None,
            hash_tag: None,
        }
    }

    /// Names the policy in keys and the RateLimit fields (printable ASCII). Errors: an
    /// empty or non-printable name.
    pub fn name(mut self, name: &str) -> Result<Rule, InvalidLimit> {
        check_name(name)?;
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

    /// Units each request costs (default 1; 0 makes requests free: admitted, not charged).
    pub fn cost(mut self, n: u64) -> Rule {
        self.cost = Cost::Fixed(n);
        self
    }

    /// Units each request costs, from the request (e.g. by size). A request costing more
    /// than a limit can never pass: 413. Return `u64::MAX` for a cost too large to count
    /// (it is a 413 too). A cost of 0 is a free request (admitted, not charged): never let a
    /// client choose 0 (see [`Rule::cost_header`]).
    pub fn cost_fn(mut self, f: impl Fn(&RequestInfo<'_>) -> u64 + Send + Sync + 'static) -> Rule {
        self.cost = Cost::Fn(Arc::new(f));
        self
    }

    /// Units each request costs, read from the request header `name` as a client declares
    /// its cost: absent, empty or not a number → 1; `0` → 1 (a client cannot make its
    /// request free); a number of 2^64 or more → can never pass (413).
    ///
    /// ```
    /// # use redis_rl_client::http::{Key, Rule};
    /// # use redis_rl_client::Gcra;
    /// let upload = Rule::new("/upload", Gcra::new(5, 1, 60)?, Key::ip())?.cost_header("X-Units");
    /// # let _ = upload;
    /// # Ok::<(), redis_rl_client::InvalidLimit>(())
    /// ```
    pub fn cost_header(self, name: &str) -> Rule {
        let name = name.to_ascii_lowercase();
        self.cost_fn(move |req| header_cost(req.header(&name).as_deref()))
    }

    /// What to do when a key function finds nothing (default: the layer's, [`Missing::Ip`]).
    pub fn missing(mut self, policy: Missing) -> Rule {
        self.missing = Some(policy);
        self
    }

    /// Requests for which `f` is true are not limited by this rule: no Redis call, no
    /// RateLimit fields.
    pub fn exempt_when(
        mut self,
        f: impl Fn(&RequestInfo<'_>) -> bool + Send + Sync + 'static,
    ) -> Rule {
        self.exempt_when = Some(Arc::new(f));
        self
    }

    /// Charge only the responses whose status (the one actually sent) makes `f` true: the
    /// request is charged up front (so a denial still denies), and the charge is refunded
    /// (`RL.REFUND`) after a response for which `f` is false. A request whose client went
    /// away before a status was sent stays charged. Default: the layer's, else every
    /// response is charged.
    pub fn deduct_when(mut self, f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Rule {
        self.deduct_when = Some(Arc::new(f));
        self
    }

    /// One hash tag for every key of the rule (`{<tag>}:…`, replacing the per-identity
    /// tags), so the rule is one `RL.ALL` on a Redis Cluster too, at the price of putting
    /// all its keys (of every client) in one slot. Errors: an empty tag or one with braces.
    pub fn hash_tag(mut self, tag: &str) -> Result<Rule, InvalidLimit> {
        if tag.is_empty() || tag.contains('{') || tag.contains('}') {
            return Err(InvalidLimit::new(
                "hash tag must be non-empty and hold no braces",
            ));
        }
        self.hash_tag = Some(tag.to_owned());
        Ok(self)
    }

    /// Whether the rule applies to this method and (normalised) path.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if let Some(ms) = &self.methods {
            if !ms.contains(method) {
                return false;
            }
        }
        self.path.matches(path)
    }

    pub(crate) fn is_exempt(&self, info: &RequestInfo<'_>) -> bool {
        self.exempt_when.as_ref().is_some_and(|f| f(info))
    }

    pub(crate) fn deduct_rule(&self) -> Option<&Arc<StatusPredicate>> {
        self.deduct_when.as_ref()
    }

    fn base_name(&self, part: &Part) -> String {
        if !self.single {
            return part.name.clone();
        }
        self.name.clone().unwrap_or_else(|| path_name(&self.path))
    }

    /// The names of one part's limits (as in its keys and the RateLimit fields).
    fn part_names(&self, part: &Part, limits: &[Limit]) -> Vec<String> {
        let base = self.base_name(part);
        if limits.len() == 1 && (self.name.is_some() || !self.single) {
            vec![base]
        } else {
            limit_names(&base, limits)
        }
    }

    /// What the rule's error messages call it: its methods and path (`POST /login`).
    pub(crate) fn describe(&self) -> String {
        let path = match &self.path {
            PathPattern::Fn(_) => "<path function>".to_owned(),
            p => p.text().unwrap_or("").to_owned(),
        };
        match &self.methods {
            Some(ms) if !ms.is_empty() => {
                let ms: Vec<&str> = ms.iter().map(Method::as_str).collect();
                format!("{} {path}", ms.join(","))
            }
            _ => path,
        }
    }

    /// The buckets of the limits fixed when the rule was built: (hash tag, limit name,
    /// limit). A limit computed per request is not known here.
    fn fixed_buckets(&self) -> Vec<(Option<&str>, String, &Limit)> {
        let mut out = Vec::new();
        for part in &self.parts {
            if let LimitsInner::Fixed(limits) = &part.limits.0 {
                for (name, limit) in self.part_names(part, limits).into_iter().zip(limits) {
                    out.push((self.hash_tag.as_deref(), name, limit));
                }
            }
        }
        out
    }
}

/// Refuses two rules of one layer that give the same limit name to different limits: the
/// limit name is the bucket's name (`<name>:{<kind>:<value>}`), so they would share one
/// bucket, each answering with its own limit (a 5/minute rule denied at once because
/// another rule's 100/minute filled the bucket; two algorithms on one key, an error).
/// Sharing a bucket on purpose (one per-IP limit, named alike in several rules) is fine with
/// the same limit. `a` and `b` name the rules in the message.
pub(crate) fn check_bucket_names(a: (&str, &Rule), b: (&str, &Rule)) -> Result<(), InvalidLimit> {
    let theirs = a.1.fixed_buckets();
    for (tag, name, limit) in b.1.fixed_buckets() {
        let clash = theirs
            .iter()
            .find(|(t, n, l)| *t == tag && *n == name && l.spec() != limit.spec());
        if let Some((_, _, other)) = clash {
            return Err(InvalidLimit::new(format!(
                "{} and {} both name a limit '{name}', with different limits ({} and {}): a \
                 limit's name is its bucket's name ('{name}:{{<kind>:<value>}}'), so they \
                 would share one bucket; name one of them otherwise (Rule::name, or its name \
                 in Rule::all), or give both the same limit to share it on purpose",
                b.0,
                a.0,
                limit.spec().join(" "),
                other.spec().join(" "),
            )));
        }
    }
    Ok(())
}

/// Reads a declared cost: absent / not a number → 1, `0` → 1, ≥ 2^64 → `u64::MAX`.
pub(crate) fn header_cost(value: Option<&str>) -> u64 {
    let Some(v) = value.map(str::trim) else {
        return 1;
    };
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return 1;
    }
    v.parse::<u64>().map_or(u64::MAX, |n| n.max(1))
}

/// The one decision a request needs: its keys, each with its limit and name.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Keys (without the limiter's prefix) and their limits, in rule order.
    pub keys: Vec<(String, Limit)>,
    /// Keys (without the prefix) and their policy names.
    pub names: Vec<(String, String)>,
    /// Units this request costs.
    pub cost: u64,
    /// Limits not applied ([`Missing::Skip`]).
    pub skipped: u64,
    /// A forwarding header was unusable (the peer was taken as the client).
    pub forwarded_unusable: bool,
    /// An `ip` identity had no usable client address and was keyed [`UNKNOWN_IP`] (the
    /// layer counts it, `peer_unknown`, and warns once).
    pub peer_unknown: bool,
}

/// What a request gets from the rules ([`plan`]).
#[derive(Debug, Clone)]
pub enum Planned {
    /// No rule applies (no match, an exempt path, `exempt_when`, a CORS preflight).
    Exempt,
    /// A rule applies, but none of its limits does ([`Missing::Skip`]).
    Unlimited {
        /// Limits skipped.
        skipped: u64,
    },
    /// Decide these keys.
    Limited(Plan),
    /// A key function found nothing and the rule's policy is [`Missing::Deny`]: 401.
    IdentityRequired {
        /// The limit that needs the identity.
        policy: String,
    },
    /// The rule's limit function gave no usable limit (answered 500).
    Failed(InvalidLimit),
}

/// Finds the rule for the request (the first that matches its method and normalised path,
/// else `default`) and builds its keys. `exempt` paths are never limited.
pub fn plan(
    rules: &[Rule],
    default: Option<&Rule>,
    info: &RequestInfo<'_>,
    exempt: &[PathPattern],
) -> Planned {
    let path = info.normalized_path();
    if exempt.iter().any(|p| p.matches(&path)) {
        return Planned::Exempt;
    }
    let Some(rule) = rules
        .iter()
        .find(|r| r.matches(info.method, &path))
        .or(default)
    else {
        return Planned::Exempt;
    };
    plan_rule(rule, info, Missing::Ip)
}

/// Builds a matched rule's keys for this request; `missing` is the policy of rules without
/// their own.
pub fn plan_rule(rule: &Rule, info: &RequestInfo<'_>, missing: Missing) -> Planned {
    if rule.is_exempt(info) {
        return Planned::Exempt;
    }
    let cost = match &rule.cost {
        Cost::Fixed(n) => *n,
        Cost::Fn(f) => f(info),
    };
    let mut p = Plan {
        keys: Vec::new(),
        names: Vec::new(),
        cost,
        skipped: 0,
        forwarded_unusable: false,
        peer_unknown: false,
    };
    for part in &rule.parts {
        let limits = match part.limits.resolve(info) {
            Ok(l) => l,
            Err(e) => return Planned::Failed(e),
        };
        let base = rule.base_name(part);
        let names = rule.part_names(part, &limits);
        let found = part.key.lookup(info);
        p.forwarded_unusable |= found.bad_forwarding;
        p.peer_unknown |= found.peer_unknown;
        let (kind, value) = match found.value {
            Some(v) => (part.key.kind_name().to_owned(), v),
            None => match rule.missing.unwrap_or(missing) {
                Missing::Ip => match info.client_ip {
                    Some(ip) => ("ip".to_owned(), ip.to_owned()),
                    // No usable client address either: the one shared `unknown` bucket,
                    // limited, never unlimited.
                    None => {
                        p.peer_unknown = true;
                        ("ip".to_owned(), UNKNOWN_IP.to_owned())
                    }
                },
                Missing::Deny => return Planned::IdentityRequired { policy: base },
                Missing::Skip => {
                    p.skipped += limits.len() as u64;
                    continue;
                }
            },
        };
        let value = safe_key_part(&value);
        for (limit, name) in limits.into_iter().zip(names) {
            // The same layout as the Python package's, so services in both share keys.
            let k = match &rule.hash_tag {
                Some(tag) => format!("{{{tag}}}:{name}:{kind}:{value}"),
                None => format!("{name}:{{{kind}:{value}}}"),
            };
            p.names.push((k.clone(), name));
            p.keys.push((k, limit));
        }
    }
    if p.keys.is_empty() {
        return Planned::Unlimited { skipped: p.skipped };
    }
    Planned::Limited(p)
}

/// What to answer: `status` `None` lets the request through with `headers`.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// `None`: pass; else the status to answer with.
    pub status: Option<StatusCode>,
    /// Why the request is refused (`None` when it passes).
    pub reason: Option<DenialReason>,
    /// The fields to set (on the admitted response, or on the denial).
    pub headers: HeaderMap,
    /// The JSON body of a denial (empty when admitted).
    pub body: String,
    /// The name of the binding limit (`"default"` without one).
    pub policy: String,
}

/// Why the layer refuses a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenialReason {
    /// Over the limit: 429 with `Retry-After`.
    RateLimited,
    /// The request's cost exceeds a limit and can never pass: 413.
    TooLarge,
    /// The limiter could not decide (failure policy "closed", or "error" with Redis down):
    /// 503 with `Retry-After`.
    Unavailable,
    /// The rule's key function found no identity and its policy is [`Missing::Deny`]: 401.
    IdentityRequired,
}

pub(crate) fn json_str(s: &str) -> String {
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
/// `{"error": "limiter_unavailable", …}`; a denial of the "local" policy's in-memory limiter
/// is a 429 with that limiter's figures. `names` are the [`Plan`]'s (keys without the
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
            reason: None,
            headers,
            body: String::new(),
            policy,
        };
    }
    let retry = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (status, reason, body) = if decision.never() {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            DenialReason::TooLarge,
            format!(
                "{{\"error\": \"request_too_large\", \"message\": \"this request asks for more \
                 than the limit allows and can never pass\", \"policy\": {}}}",
                json_str(&policy)
            ),
        )
    } else if decision.blind {
        (
            degraded_status,
            DenialReason::Unavailable,
            format!(
                "{{\"error\": \"limiter_unavailable\", \"message\": \"the rate limiter is \
                 unavailable; retry shortly\", \"retry_after\": {}}}",
                retry.map_or_else(|| "null".to_owned(), |r| r.to_string())
            ),
        )
    } else {
        (
            StatusCode::TOO_MANY_REQUESTS,
            DenialReason::RateLimited,
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
        reason: Some(reason),
        headers,
        body,
        policy,
    }
}

/// The 401 of [`Missing::Deny`]: `{"error": "identity_required", "message": …, "policy": …}`,
/// no RateLimit fields.
pub fn identity_required(policy: &str) -> Verdict {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Verdict {
        status: Some(StatusCode::UNAUTHORIZED),
        reason: Some(DenialReason::IdentityRequired),
        headers,
        body: format!(
            "{{\"error\": \"identity_required\", \"message\": \"this request must identify \
             itself (e.g. with an API key) to be served\", \"policy\": {}}}",
            json_str(policy)
        ),
        policy: policy.to_owned(),
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
        blind: true,
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
        assert!(safe_key_part(&"x".repeat(200)).starts_with("~sha256:"));
        assert_eq!(
            safe_key_part(&"x".repeat(129)),
            format!("~sha256:{:x}", Sha256::digest("x".repeat(129).as_bytes()))
        );
        assert_eq!(safe_key_part(&"x".repeat(128)), "x".repeat(128));
        // Over 128 bytes, not characters (as the Python package counts): 65 × "é" is 130.
        let e = "é".repeat(65);
        assert_eq!(
            safe_key_part(&e),
            format!("~sha256:{:x}", Sha256::digest(e.as_bytes()))
        );
        assert_eq!(safe_key_part(&"é".repeat(64)), "%C3%A9".repeat(64));
        // No literal takes the hashed form: its `~` is escaped.
        let hashed = safe_key_part(&"a".repeat(200));
        assert_eq!(safe_key_part(&hashed), format!("%7E{}", &hashed[1..]));
        assert_ne!(safe_key_part(&hashed[1..]), hashed);
    }

    #[test]
    fn paths_are_normalised() {
        for (raw, want) in [
            ("/", "/"),
            ("", "/"),
            ("/login/", "/login"),
            ("//login", "/login"),
            ("/api//x///y/", "/api/x/y"),
            ("/a%2Fb", "/a/b"),
            ("/%6Cogin", "/login"),
            ("/bad%zz", "/bad%zz"),
            ("/end%4", "/end%4"),
            // Dot segments resolved (RFC 3986 5.2.4), after decoding, never above the root.
            ("/static/../api", "/api"),
            ("/static/./../api/x/", "/api/x"),
            ("/a/./b/.", "/a/b"),
            ("/a/b/..", "/a"),
            ("/..", "/"),
            ("/../../etc", "/etc"),
            ("/static/%2e%2e/api", "/api"),
            ("/static/%2E%2E%2Fapi", "/api"),
            ("/static//..//api", "/api"),
            ("/a/.../b/..c/.d", "/a/.../b/..c/.d"),
            ("..", "/"),
        ] {
            assert_eq!(normalize_path(raw), want, "{raw}");
        }
    }

    #[test]
    fn declared_costs() {
        assert_eq!(header_cost(None), 1);
        assert_eq!(header_cost(Some("")), 1);
        assert_eq!(header_cost(Some("abc")), 1);
        assert_eq!(header_cost(Some("0")), 1);
        assert_eq!(header_cost(Some(" 7 ")), 7);
        assert_eq!(header_cost(Some("18446744073709551615")), u64::MAX);
        assert_eq!(header_cost(Some("18446744073709551616")), u64::MAX);
        assert_eq!(header_cost(Some("-3")), 1);
    }

    #[test]
    fn several_limits_are_named_by_window() {
        let limits = parse_limits("20/minute; 200 per hour; 30/60s").unwrap();
        assert_eq!(
            limit_names("api", &limits),
            ["api-60s", "api-3600s", "api-60s-2"]
        );
        let named = vec![
            Limit::from(Window::sliding(1, 1).unwrap().named("x").unwrap()),
            Limit::from(Window::sliding(1, 1).unwrap()),
        ];
        assert_eq!(limit_names("r", &named), ["x", "r-1s"]);
    }
}
