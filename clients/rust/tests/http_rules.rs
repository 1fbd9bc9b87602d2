//! Key functions (the trusted-proxy rule), rules and the 429/413/503 answer: pure, no server.
//! The same cases as the Python package's tests, so both packages build the same keys and
//! answers.

use std::net::IpAddr;
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use redis_rl_client::http::{
    plan, respond, safe_key_part, Forwarding, Key, PathPattern, RequestInfo, Rule,
};
use redis_rl_client::{Algorithm, Decision, Gcra, Limit, RetryAfter, Source, Window};

struct Req {
    method: Method,
    path: String,
    headers: HeaderMap,
    ext: Extensions,
    peer: Option<IpAddr>,
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
    Req {
        method: Method::GET,
        path: path.to_owned(),
        headers: h,
        ext: Extensions::new(),
        peer: peer.map(|p| p.parse().unwrap()),
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
    assert_eq!(key_of(&key, &r).unwrap(), "2001:db8::1");
    let r = req(
        Some("10.0.0.1"),
        "/",
        &[("forwarded", fwd), ("x-forwarded-for", "9.9.9.9")],
    );
    assert_eq!(key_of(&key, &r).unwrap(), "2001:db8::1");
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
    assert_eq!(key_of(&key, &r).unwrap(), "2001:db8::1");
    let any = Key::client_ip(Vec::<&str>::new()).unwrap();
    assert_eq!(
        key_of(&any, &req(Some("2001:db8:0:0::1"), "/", &[])).unwrap(),
        "2001:db8::1"
    );
    // An IPv4 client on a dual-stack socket is the IPv4 address.
    assert_eq!(
        key_of(&any, &req(Some("::ffff:192.0.2.7"), "/", &[])).unwrap(),
        "192.0.2.7"
    );
    assert_eq!(
        key_of(&any, &req(None, "/", &[])),
        None,
        "no peer: the key does not apply"
    );
    assert!(Key::client_ip(["not-a-network"]).is_err());
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
fn client_values_cannot_change_the_hash_tag() {
    assert_eq!(safe_key_part("{evil}"), "%7Bevil%7D");
    assert_eq!(safe_key_part("a b"), "a%20b");
    assert!(safe_key_part(&"x".repeat(200)).starts_with("sha256:"));
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
    );
    let r = req(Some("203.0.113.9"), "/api/x", &[("x-api-key", "}{")]);
    let p = plan(&[rule], &r.info(), &[]).unwrap();
    let keys: Vec<&str> = p.keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["{%7D%7B}:api:%7D%7B", "{%7D%7B}:ip:203.0.113.9"]);
}

#[test]
fn rules_match_by_path_and_method_first_match_wins() {
    let login = Rule::new(
        "/login",
        Window::new(5, 60, Algorithm::Log).unwrap(),
        Key::client_ip(Vec::<&str>::new()).unwrap(),
    )
    .methods(["post"]);
    let users = Rule::new("/users/*/avatar", Gcra::new(2, 1, 1).unwrap(), Key::route());
    let api = Rule::new(
        "/api/",
        Gcra::new(10, 1, 1).unwrap(),
        Key::header_or("x-api-key", "anonymous"),
    )
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
    .name("versioned")
    .unwrap();
    let rules = [login, users, api, versioned];
    let get = |path: &str| req(Some("192.0.2.1"), path, &[]);
    assert!(plan(&rules, &get("/login").info(), &[]).is_none());
    let post = get("/login").method(Method::POST);
    assert_eq!(
        plan(&rules, &post.info(), &[]).unwrap().keys[0].0,
        "login:192.0.2.1"
    );
    let p = plan(&rules, &get("/users/3/avatar").info(), &[]).unwrap();
    assert_eq!(p.keys[0].0, "users-*-avatar:GET%20/users/%2A/avatar");
    let p = plan(&rules, &get("/api/things").info(), &[]).unwrap();
    assert_eq!(p.keys[0].0, "api:anonymous");
    assert_eq!(p.names, [("api:anonymous".to_owned(), "api".to_owned())]);
    assert!(plan(&rules, &get("/api").info(), &[]).is_some());
    assert_eq!(
        plan(&rules, &get("/v2/x").info(), &[]).unwrap().keys[0].0,
        "versioned:192.0.2.1"
    );
    assert!(plan(&rules, &get("/health").info(), &[]).is_none());
    assert!(plan(&rules, &get("/api/x").info(), &["/api/x".into()]).is_none());
}

#[test]
fn a_rule_whose_keys_do_not_apply_does_not_limit() {
    let rule = Rule::any(Gcra::new(1, 1, 1).unwrap(), Key::header("authorization"));
    assert!(plan(&[rule], &req(None, "/", &[]).info(), &[]).is_none());
}

#[test]
fn cost_function() {
    let rule = Rule::new(
        "/upload",
        Gcra::new(10, 1, 1).unwrap(),
        Key::client_ip(Vec::<&str>::new()).unwrap(),
    )
    .cost_fn(|i| i.content_length.unwrap_or(0) / 1000);
    let mut r = req(Some("1.2.3.4"), "/upload", &[]).method(Method::POST);
    r.length = Some(5000);
    assert_eq!(plan(&[rule], &r.info(), &[]).unwrap().cost, 5);
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
        .name("")
        .is_err());
}

#[test]
#[should_panic(expected = "not a Lease")]
fn a_lease_is_refused_when_the_rule_is_built() {
    // Checked by the layer, a Lease failed every request with 500.
    let _ = Rule::new(
        "/export",
        redis_rl_client::Lease::new(2, 30).unwrap(),
        Key::header("x-user"),
    );
}

#[test]
#[should_panic(expected = "not a Lease")]
fn a_lease_is_refused_in_a_combined_rule() {
    let _ = Rule::all(
        "/export",
        [
            (
                "rate",
                Gcra::new(5, 1, 1).unwrap().into(),
                Key::header("x-user"),
            ),
            (
                "jobs",
                redis_rl_client::Lease::new(2, 30).unwrap().into(),
                Key::header("x-user"),
            ),
        ],
    );
}
