//! Key functions (the trusted-proxy rule), rules and the 429/413/503 answer: pure, no server.
//! The same cases as the Python package's tests, so both packages build the same keys and
//! answers.

use std::net::IpAddr;
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use redis_rl_client::http::{
    plan, respond, safe_key_part, ClientIp, Forwarding, Key, Missing, PathPattern, Plan, Planned,
    RequestInfo, Rule,
};
use redis_rl_client::{Algorithm, Decision, Gcra, Limit, RetryAfter, Source, Window};

struct Req {
    method: Method,
    path: String,
    headers: HeaderMap,
    ext: Extensions,
    peer: Option<IpAddr>,
    client_ip: Option<String>,
    route: Option<String>,
    length: Option<u64>,
}

fn req(peer: Option<&str>, path: &str, headers: &[(&str, &str)]) -> Req {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    let peer: Option<IpAddr> = peer.map(|p| p.parse().unwrap());
    Req {
        method: Method::GET,
        path: path.to_owned(),
        headers: h,
        ext: Extensions::new(),
        peer,
        client_ip: peer.map(|p| ClientIp::new().key_of(p)),
        route: None,
        length: None,
    }
}

impl Req {
    fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            method: &self.method,
            path: &self.path,
            headers: &self.headers,
            extensions: &self.ext,
            peer: self.peer,
            client_ip: self.client_ip.as_deref(),
            route: self.route.as_deref(),
            content_length: self.length,
        }
    }

    fn method(mut self, m: Method) -> Self {
        self.method = m;
        self
    }
}

fn key_of(k: &Key, r: &Req) -> Option<String> {
    k.value(&r.info())
}

/// The plan of a limited request, `None` for any other outcome.
fn limited(rules: &[Rule], r: &Req, exempt: &[PathPattern]) -> Option<Plan> {
    match plan(rules, None, &r.info(), exempt) {
        Planned::Limited(p) => Some(p),
        _ => None,
    }
}

#[test]
fn client_ip_ignores_forwarding_headers_from_untrusted_peers() {
    let key = Key::client_ip(["10.0.0.0/8"]).unwrap();
    let r = req(Some("203.0.113.9"), "/", &[("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(key_of(&key, &r).unwrap(), "203.0.113.9");
    let none = Key::client_ip(Vec::<&str>::new()).unwrap();
    let r = req(Some("10.0.0.1"), "/", &[("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(key_of(&none, &r).unwrap(), "10.0.0.1");
}

#[test]
fn client_ip_walks_x_forwarded_for_from_the_right_skipping_trusted_proxies() {
    let key = Key::client_ip(["10.0.0.0/8", "192.0.2.1"]).unwrap();
    // A client-forged left part is ignored: the first untrusted hop from the right wins.
    let r = req(
        Some("10.0.0.5"),
        "/",
        &[(
            "x-forwarded-for",
            "6.6.6.6, 198.51.100.7, 192.0.2.1, 10.1.1.1",
        )],
    );
    assert_eq!(key_of(&key, &r).unwrap(), "198.51.100.7");
    assert_eq!(
        key_of(&key, &req(Some("10.0.0.5"), "/", &[])).unwrap(),
        "10.0.0.5"
    );
    let r = req(
        Some("10.0.0.5"),
        "/",
        &[("x-forwarded-for", "10.2.2.2, 10.3.3.3")],
    );
    assert_eq!(key_of(&key, &r).unwrap(), "10.2.2.2");
    // Repeated fields read as one list.
    let r = req(
        Some("10.0.0.5"),
        "/",
        &[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.8"),
        ],
    );
    assert_eq!(key_of(&key, &r).unwrap(), "198.51.100.8");
}

#[test]
fn client_ip_reads_forwarded_only_when_configured() {
    let fwd = "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https, for=10.0.0.2";
    let only_xff = Key::client_ip(["10.0.0.0/8"]).unwrap();
    let r = req(Some("10.0.0.1"), "/", &[("forwarded", fwd)]);
    assert_eq!(key_of(&only_xff, &r).unwrap(), "10.0.0.1");
    let key = Key::client_ip_with(["10.0.0.0/8"], Forwarding::Forwarded).unwrap();
    assert_eq!(key_of(&key, &r).unwrap(), "2001:db8::/64");
    let r = req(
        Some("10.0.0.1"),
        "/",
        &[("forwarded", fwd), ("x-forwarded-for", "9.9.9.9")],
    );
    assert_eq!(key_of(&key, &r).unwrap(), "2001:db8::/64");
    // Quoted as a whole or not at all: an unclosed or stray quote is unusable (the peer).
    let rule = ClientIp::new()
        .trusted(["10.0.0.0/8"])
        .unwrap()
        .forwarding(Forwarding::Forwarded);
    for (value, want, unusable) in [
        ("for=\"1.1.1.1\"", "1.1.1.1", false),
        ("for=1.1.1.1", "1.1.1.1", false),
        ("for=\"1.1.1.1", "10.0.0.1", true),
        ("for=1.1.1.1\"", "10.0.0.1", true),
        ("for=\"1.1.1\".1\"", "10.0.0.1", true),
        ("for=\"\"", "10.0.0.1", true),
        ("for=\"[2001:db8::1]:4711", "10.0.0.1", true),
    ] {
        let h = req(None, "/", &[("forwarded", value)]).headers;
        let (got, bad) = rule.resolve("10.0.0.1".parse().ok(), &h);
        assert_eq!((got.as_deref(), bad), (Some(want), unusable), "{value}");
    }
}

#[test]
fn client_ip_normalises_ports_and_ipv6() {
    let key = Key::client_ip(["::1"]).unwrap();
    let r = req(
        Some("::1"),
        "/",
        &[("x-forwarded-for", "198.51.100.7:5555")],
    );
    assert_eq!(key_of(&key, &r).unwrap(), "198.51.100.7");
    let r = req(
        Some("::1"),
        "/",
        &[("x-forwarded-for", "[2001:DB8:0::1]:80")],
    );
    // IPv6 clients are keyed by their /64 (docs/clients.md#client-ip).
    assert_eq!(key_of(&key, &r).unwrap(), "2001:db8::/64");
    let any = Key::client_ip(Vec::<&str>::new()).unwrap();
    assert_eq!(
        key_of(&any, &req(Some("2001:db8:0:0:9:8:7:6"), "/", &[])).unwrap(),
        "2001:db8::/64"
    );
    let exact = Key::client_ip_from(ClientIp::new().ipv6_prefix(128).unwrap());
    assert_eq!(
        key_of(&exact, &req(Some("2001:db8::1"), "/", &[])).unwrap(),
        "2001:db8::1"
    );
    assert!(ClientIp::new().ipv6_prefix(47).is_err());
    assert!(ClientIp::new().ipv6_prefix(129).is_err());
    // An IPv4 client on a dual-stack socket is the IPv4 address.
    assert_eq!(
        key_of(&any, &req(Some("::ffff:192.0.2.7"), "/", &[])).unwrap(),
        "192.0.2.7"
    );
    assert_eq!(
        key_of(&any, &req(None, "/", &[])).as_deref(),
        Some("unknown"),
        "no peer: the one shared `unknown` bucket, never no limit"
    );
    assert!(Key::client_ip(["not-a-network"]).is_err());
    // A port after the address (a number, or RFC 7239's obfuscated `_…`), and nothing else:
    // any other tail makes the hop unusable, and the trusted peer is the client.
    for (hop, want) in [
        ("198.51.100.7:80", "198.51.100.7"),
        ("198.51.100.7:_obf-1", "198.51.100.7"),
        ("[2001:db8::1]:_x", "2001:db8::/64"),
        ("[2001:db8::1]", "2001:db8::/64"),
        ("[2001:db8::1]junk", "::1/64"),
        ("[2001:db8::1]:", "::1/64"),
        ("[2001:db8::1", "::1/64"),
        ("198.51.100.7:junk", "::1/64"),
        ("198.51.100.7:", "::1/64"),
        ("198.51.100.7:80x", "::1/64"),
    ] {
        let r = req(Some("::1"), "/", &[("x-forwarded-for", hop)]);
        assert_eq!(
            key_of(&key, &r).unwrap(),
            want.replace("::1/64", "::/64"),
            "{hop}"
        );
    }
}

#[test]
fn other_key_functions() {
    let r = req(None, "/", &[("x-api-key", "k1")]);
    assert_eq!(key_of(&Key::header("X-API-Key"), &r).unwrap(), "k1");
    assert_eq!(
        key_of(&Key::header("X-API-Key"), &req(None, "/", &[])),
        None
    );
    assert_eq!(
        key_of(
            &Key::header_or("X-API-Key", "anonymous"),
            &req(None, "/", &[])
        )
        .unwrap(),
        "anonymous"
    );
    let mut r = req(None, "/users/9", &[]).method(Method::POST);
    r.route = Some("/users/{id}".into());
    assert_eq!(key_of(&Key::route(), &r).unwrap(), "POST /users/{id}");
    #[derive(Clone)]
    struct UserId(u64);
    impl std::fmt::Display for UserId {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "u{}", self.0)
        }
    }
    let mut r = req(None, "/", &[]);
    assert_eq!(key_of(&Key::extension::<UserId>(), &r), None);
    r.ext.insert(UserId(7));
    assert_eq!(key_of(&Key::extension::<UserId>(), &r).unwrap(), "u7");
    let f = Key::from_fn(|i| i.header("x-tenant").map(|t| format!("tenant-{t}")));
    assert_eq!(
        key_of(&f, &req(None, "/", &[("x-tenant", "acme")])).unwrap(),
        "tenant-acme"
    );
}

#[test]
fn a_header_is_one_list_however_it_was_sent() {
    let key = Key::header("X-API-Key");
    for headers in [
        &[("x-api-key", "a"), ("x-api-key", "b")][..],
        &[("x-api-key", "a,b")],
        &[("x-api-key", "a , b")],
        &[("x-api-key", "\ta,\tb\t")],
        &[("x-api-key", "a ,"), ("x-api-key", " b")],
    ] {
        let r = req(Some("203.0.113.9"), "/", headers);
        let want = if headers.len() == 2 && headers[0].1 == "a ," {
            "a, , b" // an empty element is kept
        } else {
            "a, b"
        };
        assert_eq!(
            r.info().header("x-api-key").as_deref(),
            Some(want),
            "{headers:?}"
        );
        assert_eq!(key_of(&key, &r).as_deref(), Some(want), "{headers:?}");
    }
    let r = req(
        Some("203.0.113.9"),
        "/",
        &[("x-api-key", "a,,b"), ("x-api-key", "c")],
    );
    assert_eq!(r.info().header("x-api-key").as_deref(), Some("a, , b, c"));
    let r = req(Some("203.0.113.9"), "/", &[("x-api-key", "  ")]);
    assert_eq!(key_of(&key, &r), None, "blank is missing");
}

#[test]
fn client_values_cannot_change_the_hash_tag() {
    assert_eq!(safe_key_part("{evil}"), "%7Bevil%7D");
    assert_eq!(safe_key_part("a b"), "a%20b");
    assert!(safe_key_part(&"x".repeat(200)).starts_with("~sha256:"));
    let rule = Rule::all(
        "/",
        [
            (
                "api",
                Gcra::new(5, 1, 1).unwrap().into(),
                Key::header("x-api-key"),
            ),
            (
                "ip",
                Window::sliding(9, 60).unwrap().into(),
                Key::client_ip(Vec::<&str>::new()).unwrap(),
            ),
        ],
    )
    .unwrap();
    let r = req(Some("203.0.113.9"), "/api/x", &[("x-api-key", "}{")]);
    let p = limited(&[rule], &r, &[]).unwrap();
    let keys: Vec<&str> = p.keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["api:{hdr.x-api-key:%7D%7B}", "ip:{ip:203.0.113.9}"]);
}

/// docs/clients.md#identities-stay-apart: the per-IP key holds the IP alone (whatever API
/// key came with it), and an API key equal to an IP address is another identity kind.
#[test]
fn identities_stay_apart() {
    let rule = Rule::all(
        "/",
        [
            (
                "api",
                "10/minute".parse().unwrap(),
                Key::header("x-api-key"),
            ),
            ("ip", "100/minute".parse().unwrap(), Key::ip()),
        ],
    )
    .unwrap();
    let keys = |api_key: &str| {
        let r = req(Some("198.51.100.7"), "/x", &[("x-api-key", api_key)]);
        limited(std::slice::from_ref(&rule), &r, &[])
            .unwrap()
            .keys
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    let (a, b) = (keys("k1"), keys("k2"));
    assert_ne!(a[0], b[0], "each API key its own bucket");
    assert_eq!(a[1], b[1], "one per-IP bucket whatever the API key");
    assert_eq!(a[1], "ip:{ip:198.51.100.7}");
    let spoof = keys("198.51.100.7");
    assert_eq!(spoof[0], "api:{hdr.x-api-key:198.51.100.7}");
    assert_ne!(spoof[0], a[1]);
    // An explicit hash tag puts every key of the rule in one slot.
    let tagged = Rule::new("/", Gcra::new(1, 1, 1).unwrap(), Key::ip())
        .unwrap()
        .hash_tag("api")
        .unwrap();
    let p = limited(&[tagged], &req(Some("192.0.2.1"), "/", &[]), &[]).unwrap();
    assert_eq!(p.keys[0].0, "{api}:default:ip:192.0.2.1");
    assert!(Rule::any(Gcra::new(1, 1, 1).unwrap(), Key::ip())
        .unwrap()
        .hash_tag("a{b")
        .is_err());
}

/// docs/clients.md#a-missing-identity-is-never-no-limit: without the header, the limit is
/// keyed by the client IP (default), denied (401) or skipped (counted) as the rule says;
/// no shared bucket unless asked for.
#[test]
fn a_missing_identity_is_never_no_limit() {
    let rule = |m: Option<Missing>| {
        let r = Rule::new("/", "5/minute", Key::header("x-api-key"))
            .unwrap()
            .name("api")
            .unwrap();
        match m {
            Some(m) => r.missing(m),
            None => r,
        }
    };
    let keyless = req(Some("203.0.113.4"), "/", &[]);
    let p = limited(&[rule(None)], &keyless, &[]).unwrap();
    assert_eq!(p.keys[0].0, "api:{ip:203.0.113.4}");
    let other = limited(&[rule(None)], &req(Some("203.0.113.5"), "/", &[]), &[]).unwrap();
    assert_ne!(
        p.keys[0].0, other.keys[0].0,
        "keyless clients do not share one bucket"
    );
    match plan(&[rule(Some(Missing::Deny))], None, &keyless.info(), &[]) {
        Planned::IdentityRequired { policy } => assert_eq!(policy, "api"),
        other => panic!("{other:?}"),
    }
    match plan(&[rule(Some(Missing::Skip))], None, &keyless.info(), &[]) {
        Planned::Unlimited { skipped } => assert_eq!(skipped, 1),
        other => panic!("{other:?}"),
    }
    // Keyless and without a usable client address (a Unix socket, a server that records
    // none): the IP fallback is the one shared `unknown` bucket, limited, never skipped.
    let p = limited(&[rule(None)], &req(None, "/", &[]), &[]).unwrap();
    assert_eq!(p.keys[0].0, "api:{ip:unknown}");
    assert!(p.peer_unknown && p.skipped == 0, "{p:?}");
    assert!(!limited(&[rule(None)], &keyless, &[]).unwrap().peer_unknown);
    // header_or shares one bucket among keyless clients, as asked.
    let shared = Rule::new("/", "5/minute", Key::header_or("x-api-key", "anonymous")).unwrap();
    let p = limited(&[shared], &keyless, &[]).unwrap();
    assert_eq!(p.keys[0].0, "default:{hdr.x-api-key:anonymous}");
}

/// docs/clients.md#limits-as-users-write-them: strings, and a function of the request.
#[test]
fn limits_from_strings_and_functions() {
    let rule = Rule::new("/api/", "20/minute; 200 per hour", Key::ip())
        .unwrap()
        .name("api")
        .unwrap();
    let p = limited(&[rule], &req(Some("192.0.2.9"), "/api/x", &[]), &[]).unwrap();
    let names: Vec<&str> = p.names.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["api-60s", "api-3600s"]);
    assert_eq!(
        p.keys[1],
        (
            "api-3600s:{ip:192.0.2.9}".to_owned(),
            Window::sliding(200, 3600).unwrap().into()
        )
    );
    let by_plan = redis_rl_client::http::Limits::from_fn(|req| {
        if req.header("x-plan").as_deref() == Some("pro") {
            "1000/minute"
        } else {
            "10/minute"
        }
    });
    let rule = Rule::new("/", by_plan, Key::header("x-api-key")).unwrap();
    let pro = req(None, "/", &[("x-api-key", "a"), ("x-plan", "pro")]);
    let free = req(None, "/", &[("x-api-key", "b")]);
    assert_eq!(
        limited(std::slice::from_ref(&rule), &pro, &[])
            .unwrap()
            .keys[0]
            .1
            .capacity(),
        1000
    );
    assert_eq!(
        limited(std::slice::from_ref(&rule), &free, &[])
            .unwrap()
            .keys[0]
            .1
            .capacity(),
        10
    );
    let broken = Rule::new(
        "/",
        redis_rl_client::http::Limits::from_fn(|_| "ten per minute"),
        Key::ip(),
    )
    .unwrap();
    assert!(matches!(
        plan(&[broken], None, &free.info(), &[]),
        Planned::Failed(_)
    ));
    assert!(Rule::new("/", "10/fortnight", Key::ip()).is_err());
}

#[test]
fn rules_match_by_path_and_method_first_match_wins() {
    let login = Rule::new(
        "/login",
        Window::new(5, 60, Algorithm::Log).unwrap(),
        Key::client_ip(Vec::<&str>::new()).unwrap(),
    )
    .unwrap()
    .methods(["post"]);
    let users = Rule::new("/users/*/avatar", Gcra::new(2, 1, 1).unwrap(), Key::route()).unwrap();
    let api = Rule::new(
        "/api/",
        Gcra::new(10, 1, 1).unwrap(),
        Key::header_or("x-api-key", "anonymous"),
    )
    .unwrap()
    .name("api")
    .unwrap();
    let versioned = Rule::new(
        PathPattern::from_fn(|p| {
            p.strip_prefix("/v")
                .and_then(|rest| rest.split_once('/'))
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        }),
        Gcra::new(3, 1, 1).unwrap(),
        Key::client_ip(Vec::<&str>::new()).unwrap(),
    )
    .unwrap()
    .name("versioned")
    .unwrap();
    let rules = [login, users, api, versioned];
    let get = |path: &str| req(Some("192.0.2.1"), path, &[]);
    assert!(limited(&rules, &get("/login"), &[]).is_none());
    let post = get("/login").method(Method::POST);
    assert_eq!(
        limited(&rules, &post, &[]).unwrap().keys[0].0,
        "login:{ip:192.0.2.1}"
    );
    // Spellings of one path are one path (docs/clients.md#routes).
    let post2 = get("//login/").method(Method::POST);
    assert!(
        limited(&rules, &post2, &[]).is_some(),
        "a trailing / is no way around a rule"
    );
    let p = limited(&rules, &get("/users/3/avatar"), &[]).unwrap();
    assert_eq!(p.keys[0].0, "users-*-avatar:{route:GET%20/users/3/avatar}");
    let p2 = limited(&rules, &get("/users/3//avatar/"), &[]).unwrap();
    assert_eq!(p.keys[0].0, p2.keys[0].0, "one route, one bucket");
    let p = limited(&rules, &get("/api/things"), &[]).unwrap();
    let k = "api:{hdr.x-api-key:anonymous}";
    assert_eq!(p.keys[0].0, k);
    assert_eq!(p.names, [(k.to_owned(), "api".to_owned())]);
    assert!(limited(&rules, &get("/api"), &[]).is_some());
    assert_eq!(
        limited(&rules, &get("/v2/x"), &[]).unwrap().keys[0].0,
        "versioned:{ip:192.0.2.1}"
    );
    assert!(limited(&rules, &get("/health"), &[]).is_none());
    assert!(limited(&rules, &get("/api/x"), &["/api/x".into()]).is_none());
    // Dot segments are resolved first: "/static/../api/x" is the "/api/x" a resolving
    // router serves, so the "/static/" exemption is no way around the "/api/" rule.
    for raw in [
        "/static/../api/x",
        "/static/%2e%2e/api/x",
        "/static/./../api/x/",
    ] {
        let p = limited(&rules, &get(raw), &["/static/".into()]);
        assert_eq!(p.map(|p| p.keys[0].0.clone()).as_deref(), Some(k), "{raw}");
    }
    // The default rule takes what no rule matches (a 404 included).
    let fallback = Rule::any(Gcra::new(9, 1, 1).unwrap(), Key::ip()).unwrap();
    match plan(&rules, Some(&fallback), &get("/nowhere").info(), &[]) {
        Planned::Limited(p) => assert_eq!(p.keys[0].1.capacity(), 9),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_without_a_usable_address_shares_the_unknown_bucket() {
    // No peer address (a Unix socket): Key::ip, Key::client_ip and the Missing::Ip fallback
    // all key the `ip` identity `unknown`, so every such request counts in one bucket.
    let rule = Rule::all(
        "/",
        [
            (
                "auth",
                Gcra::new(1, 1, 1).unwrap().into(),
                Key::header("authorization"),
            ),
            ("ip", "9/minute".parse().unwrap(), Key::ip()),
            (
                "own",
                "9/minute".parse().unwrap(),
                Key::client_ip(["10.0.0.0/8"]).unwrap(),
            ),
        ],
    )
    .unwrap();
    let p = limited(std::slice::from_ref(&rule), &req(None, "/", &[]), &[]).unwrap();
    let keys: Vec<&str> = p.keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["auth:{ip:unknown}", "ip:{ip:unknown}", "own:{ip:unknown}"]
    );
    assert!(p.peer_unknown);
    // A Unix socket's forwarding header is not read unless "unix" is trusted.
    let forwarded = req(None, "/", &[("x-forwarded-for", "198.51.100.7")]);
    let ip = Key::client_ip(["10.0.0.0/8"]).unwrap();
    assert_eq!(key_of(&ip, &forwarded).as_deref(), Some("unknown"));
    let behind_a_socket = Key::client_ip(["unix", "10.0.0.0/8"]).unwrap();
    assert_eq!(
        key_of(&behind_a_socket, &forwarded).as_deref(),
        Some("198.51.100.7")
    );
    let hops = req(
        None,
        "/",
        &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.3")],
    );
    assert_eq!(
        key_of(&behind_a_socket, &hops).as_deref(),
        Some("198.51.100.7"),
        "the rightmost untrusted hop"
    );
    // A trusted socket without the header, or with garbage: no usable address.
    let rule = ClientIp::new().trusted(["UNIX"]).unwrap();
    assert_eq!(rule.resolve(None, &HeaderMap::new()), (None, false));
    let garbage = req(None, "/", &[("x-forwarded-for", "nope")]).headers;
    assert_eq!(rule.resolve(None, &garbage), (None, true));
    // An IP peer is never taken for a socket: "unix" trusts no address.
    let h = req(None, "/", &[("x-forwarded-for", "198.51.100.7")]).headers;
    assert_eq!(
        rule.resolve("10.0.0.1".parse().ok(), &h).0.as_deref(),
        Some("10.0.0.1")
    );
}

#[test]
fn cost_function() {
    let rule = Rule::new(
        "/upload",
        Gcra::new(10, 1, 1).unwrap(),
        Key::client_ip(Vec::<&str>::new()).unwrap(),
    )
    .unwrap()
    .cost_fn(|i| i.content_length.unwrap_or(0) / 1000);
    let mut r = req(Some("1.2.3.4"), "/upload", &[]).method(Method::POST);
    r.length = Some(5000);
    assert_eq!(limited(&[rule], &r, &[]).unwrap().cost, 5);
}

fn decision(allowed: bool, retry: RetryAfter, degraded: bool) -> Decision {
    let policy: Limit = Gcra::new(10, 1, 1).unwrap().named("api").unwrap().into();
    Decision {
        allowed,
        limit: 10,
        remaining: if allowed { 3 } else { 0 },
        retry_after: retry,
        reset_after: Duration::from_millis(7200),
        degraded,
        blind: degraded,
        source: if degraded {
            Source::Local
        } else {
            Source::Module
        },
        policy: Some(policy),
        key: Some("api:k".into()),
        per_key: vec![],
    }
}

fn names() -> Vec<(String, String)> {
    vec![("api:k".to_owned(), "api".to_owned())]
}

#[test]
fn admitted_requests_carry_the_fields() {
    let v = respond(
        &decision(true, RetryAfter::Wait(Duration::ZERO), false),
        &names(),
        false,
        StatusCode::SERVICE_UNAVAILABLE,
        "",
    );
    assert!(v.status.is_none());
    assert_eq!(v.headers.len(), 2);
    assert_eq!(v.headers["ratelimit-policy"], "\"api\";q=10;w=10");
    assert_eq!(v.headers["ratelimit"], "\"api\";r=3;t=8");
}

#[test]
fn denied_requests_get_429_json_and_retry_after() {
    let d = decision(false, RetryAfter::Wait(Duration::from_millis(1500)), false);
    let v = respond(&d, &names(), true, StatusCode::SERVICE_UNAVAILABLE, "");
    assert_eq!(v.status, Some(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(v.headers["retry-after"], "2");
    assert_eq!(v.headers["x-ratelimit-remaining"], "0");
    assert_eq!(v.headers["content-type"], "application/json");
    assert_eq!(
        v.body,
        r#"{"error": "rate_limited", "message": "too many requests", "policy": "api", "retry_after": 2}"#
    );
}

#[test]
fn never_gets_413_and_closed_degraded_gets_503() {
    let v = respond(
        &decision(false, RetryAfter::Never, false),
        &names(),
        false,
        StatusCode::SERVICE_UNAVAILABLE,
        "",
    );
    assert_eq!(v.status, Some(StatusCode::PAYLOAD_TOO_LARGE));
    assert!(!v.headers.contains_key("retry-after"));
    assert!(v.body.contains("\"error\": \"request_too_large\""));
    let d = decision(false, RetryAfter::Wait(Duration::from_secs(1)), true);
    let v = respond(&d, &names(), false, StatusCode::SERVICE_UNAVAILABLE, "");
    assert_eq!(v.status, Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(v.headers["retry-after"], "1");
    assert!(!v.headers.contains_key("ratelimit"));
    assert!(v.body.contains("\"error\": \"limiter_unavailable\""));
}

#[test]
fn names_are_validated() {
    assert!(Gcra::new(1, 1, 1).unwrap().named("bad\"\n").is_err());
    assert!(Rule::any(Gcra::new(1, 1, 1).unwrap(), Key::route())
        .unwrap()
        .name("")
        .is_err());
}

#[test]
fn a_lease_is_refused_when_the_rule_is_built() {
    // Checked by the layer, a Lease failed every request with 500; a panic was no better
    // (STYLE.md §8: no constructor panics): the rule is an error.
    let lease = redis_rl_client::Lease::new(2, 30).unwrap();
    let e = Rule::new("/export", lease.clone(), Key::header("x-user")).unwrap_err();
    assert!(e.message().contains("not a Lease"), "{e}");
    let e = Rule::all(
        "/export",
        [
            (
                "rate",
                Gcra::new(5, 1, 1).unwrap().into(),
                Key::header("x-user"),
            ),
            ("jobs", Limit::from(lease).into(), Key::header("x-user")),
        ],
    )
    .unwrap_err();
    assert!(e.message().contains("not a Lease"), "{e}");
    let none: [(&str, redis_rl_client::http::Limits, Key); 0] = [];
    assert!(Rule::all("/", none).is_err());
    let twice = Rule::all(
        "/",
        [
            ("a", "1/s".parse().unwrap(), Key::ip()),
            ("a", "2/s".parse().unwrap(), Key::route()),
        ],
    );
    assert!(twice.is_err());
}
