"""Key functions (the trusted-proxy rule), rules and the 429/413 answer: pure, no server."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from redis_rl import GCRA, NEVER, Decision, Lease, Source, Window
from redis_rl.http import (
    Identity,
    KeyFunc,
    RequestInfo,
    Rule,
    client_ip,
    header,
    plan,
    respond,
    route,
    safe_key_part,
    user,
)


def req(peer: str | None = "203.0.113.9", path: str = "/api/x", method: str = "GET", **headers: str) -> RequestInfo:
    return RequestInfo(method, path, {k.replace("_", "-").lower(): v for k, v in headers.items()}, peer)


class Value:
    """Value wraps a key function to give the value of the Identity it returns."""

    def __init__(self, key: KeyFunc) -> None:
        self.key = key

    def __call__(self, info: RequestInfo) -> str | None:
        got = self.key(info)
        assert got is None or isinstance(got, Identity), got
        return None if got is None else got.value


def test_client_ip_ignores_forwarding_headers_from_untrusted_peers() -> None:
    key = Value(client_ip(["10.0.0.0/8"]))
    assert key(req("203.0.113.9", x_forwarded_for="1.2.3.4")) == "203.0.113.9"


def test_client_ip_walks_x_forwarded_for_from_the_right_skipping_trusted_proxies() -> None:
    key = Value(client_ip(["10.0.0.0/8", "192.0.2.1"]))
    # A client-forged left part is ignored: the first untrusted hop from the right wins.
    info = req("10.0.0.5", x_forwarded_for="6.6.6.6, 198.51.100.7, 192.0.2.1, 10.1.1.1")
    assert key(info) == "198.51.100.7"
    assert key(req("10.0.0.5")) == "10.0.0.5"  # no header: the proxy itself
    assert key(req("10.0.0.5", x_forwarded_for="10.2.2.2, 10.3.3.3")) == "10.2.2.2"


def test_client_ip_reads_forwarded_only_when_configured() -> None:
    fwd = 'for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=10.0.0.2'
    only_xff = Value(client_ip(["10.0.0.0/8"]))
    assert only_xff(req("10.0.0.1", forwarded=fwd)) == "10.0.0.1"
    key = Value(client_ip(["10.0.0.0/8"], header="Forwarded"))
    assert key(req("10.0.0.1", forwarded=fwd)) == "2001:db8::/64"
    assert key(req("10.0.0.1", forwarded=fwd, x_forwarded_for="9.9.9.9")) == "2001:db8::/64"


def test_client_ip_normalises_ports_and_ipv6() -> None:
    key = Value(client_ip(["::1"]))
    assert key(req("::1", x_forwarded_for="198.51.100.7:5555")) == "198.51.100.7"
    assert key(req("::1", x_forwarded_for="[2001:DB8:0::1]:80")) == "2001:db8::/64"
    assert Value(client_ip(ipv6_prefix=128))(req("2001:db8:0:0::1")) == "2001:db8::1"


@pytest.mark.parametrize(
    ("hop", "want"),
    [
        ("198.51.100.7:80", "198.51.100.7"),
        ("198.51.100.7:_obf-1", "198.51.100.7"),  # RFC 7239's obfuscated port
        ("[2001:db8::1]:_x", "2001:db8::/64"),
        ("[2001:db8::1]", "2001:db8::/64"),
        # Anything else after the address makes the hop unusable: the trusted peer is used.
        ("[2001:db8::1]junk", "::1"),
        ("[2001:db8::1]:", "::1"),
        ("[2001:db8::1", "::1"),
        ("198.51.100.7:junk", "::1"),
        ("198.51.100.7:", "::1"),
        ("198.51.100.7:80x", "::1"),
    ],
)
def test_client_ip_takes_a_port_after_the_address_and_nothing_else(hop: str, want: str) -> None:
    assert Value(client_ip(["::1"], ipv6_prefix=128 if want == "::1" else 64))(req("::1", x_forwarded_for=hop)) == want


def test_client_ip_keys_an_ipv4_client_on_a_dual_stack_socket_by_its_ipv4_address() -> None:
    assert Value(client_ip())(req("::ffff:192.0.2.7")) == "192.0.2.7"
    assert Value(client_ip())(req("::FFFF:c000:0207")) == "192.0.2.7"
    # A trusted proxy seen through a dual-stack socket is still trusted, and a mapped hop in
    # the header is the IPv4 client.
    key = Value(client_ip(["10.0.0.0/8"]))
    assert key(req("::ffff:10.0.0.5", x_forwarded_for="[::ffff:198.51.100.7]:80")) == "198.51.100.7"


def test_other_key_functions() -> None:
    assert Value(header("X-API-Key"))(req(x_api_key="k1")) == "k1"
    assert Value(header("X-API-Key"))(req()) is None
    assert Value(header("X-API-Key", "anonymous"))(req()) == "anonymous"
    assert Value(user())(RequestInfo("GET", "/", {}, None, user="u7")) == "u7"
    assert Value(route())(RequestInfo("POST", "/users/9", {}, None, route="/users/{id}")) == "POST /users/{id}"


def test_client_values_cannot_change_the_hash_tag() -> None:
    assert safe_key_part("{evil}") == "%7Bevil%7D"
    assert safe_key_part("a b") == "a%20b"
    assert safe_key_part("x" * 200).startswith("~sha256:")
    # The shared spelling (the Rust crate's tests hold the same vectors).
    assert safe_key_part("a" * 200) == "~sha256:c2a908d98f5df987ade41b5fce213067efbcc21ef2240212a41e54b5e7c28ae5"
    assert safe_key_part("~x") == "%7Ex" and safe_key_part("sha256:ab") == "sha256:ab"
    assert safe_key_part("\xe9" * 64) == "%C3%A9" * 64  # 128 bytes of UTF-8: kept
    assert safe_key_part("\xe9" * 65) == "~sha256:c8a2666a1a2bceeac205744f944a3f5bdad0fb469a015a9dcb5766c2ea2db470"
    assert safe_key_part("x" * 128) == "x" * 128
    rule = Rule("/", {"api": (GCRA(5, 1, 1), header("x-api-key")), "ip": (Window(9, 60), client_ip())})
    p = plan([rule], req(x_api_key="}{"))
    assert p is not None
    # Each limit is keyed by its own identity, which is its hash tag (escaped: a value can
    # never pick the tag).
    assert list(p.keys) == ["api:{hdr.x-api-key:%7D%7B}", "ip:{ip:203.0.113.9}"]


def test_rules_match_by_path_and_method_first_match_wins() -> None:
    login = Rule("/login", Window(5, 60, "LOG"), key=client_ip(), methods=["post"])
    users = Rule("/users/*/avatar", GCRA(2, 1, 1), key=route())
    api = Rule("/api/", GCRA(10, 1, 1), key=header("x-api-key", "anonymous"), name="api")
    rx = Rule(re.compile(r"/v\d+/.*"), GCRA(3, 1, 1), key=client_ip(), name="versioned")
    rules = [login, users, api, rx]
    assert plan(rules, req(path="/login", method="GET")) is None
    assert plan(rules, req(path="/login", method="POST")).rule is login  # type: ignore[union-attr]
    assert plan(rules, req(path="/users/3/avatar")).rule is users  # type: ignore[union-attr]
    p = plan(rules, req(path="/api/things"))
    assert p is not None and p.rule is api and list(p.keys) == ["api:{hdr.x-api-key:anonymous}"]
    assert p.names == {"api:{hdr.x-api-key:anonymous}": "api"}
    assert plan(rules, req(path="/api")) is not None
    assert plan(rules, req(path="/v2/x")).rule is rx  # type: ignore[union-attr]
    assert plan(rules, req(path="/health")) is None
    assert plan(rules, req(path="/api/x"), exempt=["/api/x"]) is None


def test_a_rule_whose_identity_is_missing_is_keyed_by_ip_unless_it_says_skip() -> None:
    # docs/clients.md#a-missing-identity-is-never-no-limit: "ip" by default.
    p = plan([Rule("/", GCRA(1, 1, 1), key=user())], req())
    assert p is not None and list(p.keys) == ["default:{ip:203.0.113.9}"]
    skipped = plan([Rule("/", GCRA(1, 1, 1), key=user(), missing="skip")], req())
    assert skipped is not None and skipped.checks == () and skipped.skipped == 1


def test_cost_function() -> None:
    rule = Rule("/upload", GCRA(10, 1, 1), key=client_ip(), cost=lambda i: (i.content_length or 0) // 1000)
    info = RequestInfo("POST", "/upload", {}, "1.2.3.4", content_length=5000)
    p = plan([rule], info)
    assert p is not None and p.cost == 5


def decision(**kw: object) -> Decision:
    base: dict[str, object] = dict(
        allowed=True, limit=10, remaining=3, retry_after=timedelta(0),
        reset_after=timedelta(seconds=7.2), source=Source.MODULE, policy=GCRA(10, 1, 1, name="api"),
        key="api:k",
    )
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


def test_admitted_requests_carry_the_fields() -> None:
    v = respond(decision(), {"api:k": "api"})
    assert v.status is None
    assert v.headers == {"RateLimit-Policy": '"api";q=10;w=10', "RateLimit": '"api";r=3;t=8'}


def test_denied_requests_get_429_json_and_retry_after() -> None:
    v = respond(decision(allowed=False, remaining=0, retry_after=timedelta(milliseconds=1500)), {"api:k": "api"},
                x_headers=True)
    assert v.status == 429
    assert v.headers["Retry-After"] == "2" and v.headers["X-RateLimit-Remaining"] == "0"
    body = json.loads(v.body)
    assert body == {"error": "rate_limited", "message": "too many requests", "policy": "api", "retry_after": 2}


def test_never_gets_413_and_closed_degraded_gets_503() -> None:
    v = respond(decision(allowed=False, remaining=0, retry_after=NEVER), {"api:k": "api"})
    assert v.status == 413 and "Retry-After" not in v.headers
    d = decision(allowed=False, remaining=0, retry_after=timedelta(seconds=1), degraded=True, source=Source.LOCAL,
                 blind=True)
    v = respond(d, {"api:k": "api"})
    assert v.status == 503 and v.headers["Retry-After"] == "1" and "RateLimit" not in v.headers
    # retry_after is an integer of seconds, as in the 429 body.
    assert json.loads(v.body)["retry_after"] == 1


def test_names_are_validated() -> None:
    with pytest.raises(ValueError):
        GCRA(1, 1, 1, name='bad"\n')


def test_a_lease_is_refused_when_the_rule_is_built() -> None:
    # Checked by the middleware, a Lease failed every request with 500 (check() refuses a
    # Lease, check_all wants a token).
    with pytest.raises(TypeError, match="not a Lease"):
        Rule("/export", Lease(2, 30), key=header("X-User"))
    with pytest.raises(TypeError, match="not a Lease.*'jobs'"):
        Rule("/export", {
            "rate": (GCRA(5, 1, 1), header("X-User")),
            "jobs": (Lease(2, 30), header("X-User")),
        })


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("/api//things/", "/api/things"),
        ("/static/../api", "/api"),
        ("/static/./../api/x/", "/api/x"),
        ("/a/./b/.", "/a/b"),
        ("/a/b/..", "/a"),
        ("/..", "/"),
        ("/../../etc", "/etc"),
        ("/static//..//api", "/api"),
        ("/a/.../b/..c/.d", "/a/.../b/..c/.d"),
        ("..", "/"),
        ("", "/"),
    ],
)
def test_normalise_path_resolves_dot_segments(raw: str, want: str) -> None:
    from redis_rl.http import normalise_path

    assert normalise_path(raw) == want


def test_dot_segments_do_not_escape_a_limit_through_an_exemption() -> None:
    # "/static/../api/x" is the "/api/x" a resolving router serves: the "/static/" exemption
    # does not apply, the "/api/" rule does (ASGI and WSGI alike; their paths come decoded).
    from redis_rl.asgi import request_info as asgi_info
    from redis_rl.wsgi import request_info as wsgi_info

    api = Rule("/api/", GCRA(10, 1, 1), key=client_ip(), name="api")
    for raw in ("/static/../api/x", "/static/./../api/x/", "/static//../api/x"):
        for info in (
            asgi_info({"type": "http", "method": "GET", "path": raw, "headers": [], "client": ("203.0.113.9", 1)}),
            wsgi_info({"REQUEST_METHOD": "GET", "PATH_INFO": raw, "REMOTE_ADDR": "203.0.113.9"}),
        ):
            assert info.path == "/api/x"
            p = plan([api], info, exempt=["/static/"])
            assert p is not None and p.rule is api, raw
