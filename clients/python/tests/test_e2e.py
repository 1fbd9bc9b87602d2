"""End to end, as users run it: two app processes under a real server (uvicorn for the
FastAPI app, gunicorn for the Flask app) share one limit in one redis-server, and an HTTP
client makes real requests to both. The fleet never admits more than the limit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import RedisServer, free_port, ping, retry_after_within

pytestmark = pytest.mark.e2e

APPS = Path(__file__).parent / "apps"


def http_client(uds: str | None = None) -> httpx.Client:
    """http_client is an HTTP client over TCP, or over the Unix socket `uds`."""
    if uds is None:
        return httpx.Client(timeout=5)
    return httpx.Client(transport=httpx.HTTPTransport(uds=uds), timeout=5)


def wait_http(port: int, proc: subprocess.Popen[bytes], log: Path, deadline: float = 20,
              uds: str | None = None) -> None:
    end = time.monotonic() + deadline
    with http_client(uds) as http:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"app exited: {log.read_text()}")
            try:
                if http.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise RuntimeError(f"app did not answer on {uds or port}: {log.read_text()}")


def start_app(kind: str, port: int, env: dict[str, str], log: Path, extra: tuple[str, ...] = (),
              uds: str | None = None) -> subprocess.Popen[bytes]:
    """start_app runs the test app under a real server on 127.0.0.1:`port`, or on the Unix
    socket `uds` (uvicorn for the FastAPI app, gunicorn for the Flask app), with `extra`
    server options, and waits until it answers."""
    if kind == "uvicorn":
        where = ["--uds", uds] if uds else ["--host", "127.0.0.1", "--port", str(port)]
        cmd = [sys.executable, "-m", "uvicorn", "asgi_app:app", "--app-dir", str(APPS),
               *where, "--log-level", "warning", *extra]
    else:
        bind = f"unix:{uds}" if uds else f"127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "gunicorn", "--chdir", str(APPS), "-w", "1",
               "-b", bind, "--log-level", "warning", *extra, "wsgi_app:app"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(port, proc, log, uds=uds)
    except BaseException:
        stop_apps([proc])
        raise
    return proc


def stop_apps(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def app_env(server: RedisServer, **extra: str) -> dict[str, str]:
    return dict(os.environ, RL_REDIS_URL=server.url, RL_PREFIX=f"e2e{uuid.uuid4().hex[:8]}:", **extra)


@pytest.fixture(params=["uvicorn", "gunicorn"])
def fleet(request: pytest.FixtureRequest, server: RedisServer, mode: str, tmp_path: Path) -> Iterator[list[int]]:
    """fleet is two app processes (ports) on the test's server."""
    kind = str(request.param)
    env = app_env(server)
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for i in range(2):
            port = free_port()
            procs.append(start_app(kind, port, env, tmp_path / f"{kind}-{i}.log"))
            ports.append(port)
        yield ports
    finally:
        stop_apps(procs)


@pytest.fixture
def mixed(server: RedisServer, mode: str, tmp_path: Path) -> Iterator[list[int]]:
    """mixed is the FastAPI app under uvicorn and the Flask app under gunicorn, with the
    same rules on one prefix (ports: uvicorn's, gunicorn's)."""
    env = app_env(server)
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for kind in ("uvicorn", "gunicorn"):
            port = free_port()
            procs.append(start_app(kind, port, env, tmp_path / f"{kind}.log"))
            ports.append(port)
        yield ports
    finally:
        stop_apps(procs)


def test_two_processes_share_one_limit(fleet: list[int]) -> None:
    a, b = fleet
    with httpx.Client(timeout=5) as http:
        start = time.monotonic()
        replies = [
            http.get(f"http://127.0.0.1:{a if i % 2 == 0 else b}/api/thing", headers={"X-API-Key": "cust-1"})
            for i in range(30)
        ]
        statuses = [r.status_code for r in replies]
        assert statuses.count(200) == 10 and statuses.count(429) == 20, statuses
        pids = {r.json()["pid"] for r in replies if r.status_code == 200}
        assert len(pids) == 2  # both processes admitted some
        ok = replies[0]
        assert ok.headers["RateLimit-Policy"] == '"api";q=10;w=600, "ip";q=100;w=60'
        assert ok.headers["RateLimit"].startswith('"api";r=9;t=60, "ip";r=99;t=')
        denied = replies[-1]
        assert retry_after_within(denied.headers["Retry-After"], 60, start)
        assert denied.headers["Content-Type"].startswith("application/json")
        assert denied.json() == {"error": "rate_limited", "message": "too many requests",
                                 "policy": "api", "retry_after": int(denied.headers["Retry-After"])}
        # Another API key has its own limit.
        assert http.get(f"http://127.0.0.1:{b}/api/thing", headers={"X-API-Key": "cust-2"}).status_code == 200


def test_per_ip_limit_honours_trusted_proxies(fleet: list[int]) -> None:
    a, b = fleet
    with httpx.Client(timeout=5) as http:
        # The app trusts 127.0.0.1 (our connection) as a proxy, so X-Forwarded-For names the
        # client; a forged left-most entry does not help. The IP limit is keyed by the IP
        # alone (docs/clients.md#identities-stay-apart).
        r = http.get(f"http://127.0.0.1:{a}/api/thing",
                     headers={"X-API-Key": "k-ip", "X-Forwarded-For": "6.6.6.6, 198.51.100.20"})
        assert r.status_code == 200
        assert '"ip";r=99' in r.headers["RateLimit"]
        r2 = http.get(f"http://127.0.0.1:{b}/api/thing",
                      headers={"X-API-Key": "k-ip", "X-Forwarded-For": "7.7.7.7, 198.51.100.20"})
        assert '"ip";r=98' in r2.headers["RateLimit"]  # same client IP, other process
        r3 = http.get(f"http://127.0.0.1:{b}/api/thing",
                      headers={"X-API-Key": "k-ip", "X-Forwarded-For": "198.51.100.21"})
        assert '"ip";r=99' in r3.headers["RateLimit"]  # another client IP


def test_413_for_a_request_that_can_never_pass(fleet: list[int]) -> None:
    a, _ = fleet
    with httpx.Client(timeout=5) as http:
        r = http.post(f"http://127.0.0.1:{a}/upload", headers={"X-Units": "6"})
        assert r.status_code == 413
        assert r.json()["error"] == "request_too_large" and "Retry-After" not in r.headers
        assert http.post(f"http://127.0.0.1:{a}/upload", headers={"X-Units": "5"}).status_code == 200


def test_per_endpoint_decorator_and_exemptions(fleet: list[int]) -> None:
    a, b = fleet
    with httpx.Client(timeout=5) as http:
        start = time.monotonic()
        got = [http.get(f"http://127.0.0.1:{p}/reports", headers={"X-API-Key": "rep"}) for p in (a, b, a)]
        assert [r.status_code for r in got] == [200, 200, 429]
        assert got[0].headers["RateLimit-Policy"] == '"reports";q=2;w=120'
        assert retry_after_within(got[2].headers["Retry-After"], 60, start)
        assert "application/json" in got[2].headers["Content-Type"]
        assert json.loads(got[2].content)  # a JSON body
        health = http.get(f"http://127.0.0.1:{a}/health")
        assert health.status_code == 200 and "RateLimit" not in health.headers


def test_failure_policy_through_the_server(fleet: list[int], server: RedisServer) -> None:
    # The apps are configured fail-open: with Redis paused they answer 200 within the
    # client's timeout, and come back to Redis's decisions when it resumes.
    a, _ = fleet
    with httpx.Client(timeout=5) as http:
        assert http.get(f"http://127.0.0.1:{a}/api/thing", headers={"X-API-Key": "fo"}).status_code == 200
        server.pause()
        try:
            # Answered within the client's timeout (0.5 s, far below httpx's 5 s), not hung.
            r = http.get(f"http://127.0.0.1:{a}/api/thing", headers={"X-API-Key": "fo"})
            assert r.status_code == 200 and "RateLimit" not in r.headers
        finally:
            server.resume()
        assert ping(server.port, timeout=2)
        deadline = time.monotonic() + 5
        while True:
            r = http.get(f"http://127.0.0.1:{a}/api/thing", headers={"X-API-Key": "fo"})
            if "RateLimit" in r.headers:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        m = http.get(f"http://127.0.0.1:{a}/metrics").json()
        assert m["degraded"] >= 1 and m["errors"] >= 1


def test_rotating_api_keys_stay_under_the_per_ip_limit(fleet: list[int]) -> None:
    # The reproduction through the real servers: 150 requests from one client IP,
    # each with a new X-API-Key, spread over both processes; the per-IP limit is 100 per
    # minute (LOG): 100 admitted, and every request after them denied.
    a, b = fleet
    with httpx.Client(timeout=5) as http:
        got = [
            http.get(f"http://127.0.0.1:{a if i % 2 else b}/api/thing",
                     headers={"X-API-Key": f"rot-{i}", "X-Forwarded-For": "198.51.100.77"}).status_code
            for i in range(150)
        ]
    assert got.count(200) == 100 and got[100:] == [429] * 50, got


def test_deduct_when_through_the_server(fleet: list[int]) -> None:
    a, b = fleet
    with httpx.Client(timeout=5) as http:
        k = {"X-API-Key": "deduct"}
        misses = [http.get(f"http://127.0.0.1:{p}/maybe?status=404", headers=k).status_code for p in (a, b, a)]
        assert misses == [404, 404, 404]  # not charged: deduct_when says status < 400
        hits = [http.get(f"http://127.0.0.1:{p}/maybe", headers=k).status_code for p in (a, b, a)]
        assert hits == [200, 200, 429]


def test_the_denial_is_answered_by_the_apps_own_handler(fleet: list[int]) -> None:
    # Flask's errorhandler(429) (RateLimits, under gunicorn) and FastAPI's
    # exception_handler(429) (the dependency, under uvicorn) answer the denial; it keeps
    # Retry-After and the RateLimit fields.
    a, b = fleet
    with httpx.Client(timeout=5) as http:
        k = {"X-API-Key": "inside"}
        assert http.get(f"http://127.0.0.1:{a}/inside", headers=k).status_code == 200
        r = http.get(f"http://127.0.0.1:{b}/inside", headers=k)
        assert r.status_code == 429
        assert r.json()["error"] == "slow_down" and r.json()["retry_after"] == r.headers["Retry-After"]
        assert r.headers["RateLimit"].startswith('"inside";r=0;t=')


def test_repeated_header_lines_are_one_key_under_every_server(mixed: list[int]) -> None:
    # Two X-API-Key lines: gunicorn joins them with "," and uvicorn passes both lines (joined
    # with ", "); they were two buckets (a%2Cb, a%2C%20b). Now one request has one key
    # whichever server ran it, and a single line "a,b" is the same value.
    u, g = mixed
    two = [("X-API-Key", "rep-a"), ("X-API-Key", "rep-b")]
    with httpx.Client(timeout=5) as http:
        seen = [
            http.get(f"http://127.0.0.1:{u}/api/thing", headers=two),
            http.get(f"http://127.0.0.1:{g}/api/thing", headers=two),
            http.get(f"http://127.0.0.1:{g}/api/thing", headers={"X-API-Key": "rep-a,rep-b"}),
            http.get(f"http://127.0.0.1:{u}/api/thing", headers={"X-API-Key": "rep-a ,  rep-b"}),
        ]
    assert [r.status_code for r in seen] == [200] * 4
    assert [r.headers["RateLimit"].split(", ")[0].split(";t=")[0] for r in seen] == [
        f'"api";r={n}' for n in (9, 8, 7, 6)
    ], [r.headers["RateLimit"] for r in seen]


# -- no usable client address (docs/clients.md#client-ip) -------------------------------------------


def _unknown_warnings(log: Path) -> int:
    return log.read_text().count("has no usable client address")


def test_a_forged_forwarded_for_rewritten_by_uvicorn_is_one_bucket(server: RedisServer, tmp_path: Path) -> None:
    # uvicorn's default proxy headers trust 127.0.0.1 and make the ASGI client whatever
    # X-Forwarded-For held: 150 requests with "x<i>" (and a new API key each) were 150
    # buckets ip:{ip:x<i>}, all admitted. A peer that is not an IP address is the one value
    # "unknown" now: the per-IP limit (100 per minute) holds, counted, logged once.
    env = app_env(server)
    log = tmp_path / "uvicorn.log"
    port = free_port()
    proc = start_app("uvicorn", port, env, log)
    try:
        with http_client() as http:
            got = [http.get(f"http://127.0.0.1:{port}/api/thing",
                            headers={"X-API-Key": f"uv-{i}", "X-Forwarded-For": f"x{i}"}).status_code
                   for i in range(150)]
            m = http.get(f"http://127.0.0.1:{port}/metrics").json()
        assert got.count(200) == 100 and got[100:] == [429] * 50, got
        assert m["peer_unknown"] == 150 and m["skipped"] == 0
    finally:
        stop_apps([proc])
    assert _unknown_warnings(log) == 1, log.read_text()


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # A short path: a Unix socket's path is at most 107 bytes.
    d = tempfile.mkdtemp(prefix="rl-uds-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("kind", ["uvicorn", "gunicorn"])
def test_requests_over_a_unix_socket_are_limited_not_skipped(
    server: RedisServer, tmp_path: Path, socket_dir: str, kind: str
) -> None:
    # Over a Unix socket there is no peer address: every IP-keyed limit was skipped (1,200
    # requests, 1,200 × 200). Now they share the bucket ip:unknown, limited.
    uds = os.path.join(socket_dir, "app.sock")
    log = tmp_path / f"{kind}.log"
    proc = start_app(kind, 0, app_env(server), log, uds=uds)
    try:
        with http_client(uds) as http:
            got = [http.get("http://app/api/thing", headers={"X-API-Key": f"s-{i}"}).status_code
                   for i in range(120)]
            big = http.post("http://app/upload", headers={"X-Units": "6"})  # GCRA(5,…) per IP
            m = http.get("http://app/metrics").json()
        assert got.count(200) == 100 and got[100:] == [429] * 20, got
        assert big.status_code == 413  # the per-IP upload limit applies too (it was skipped)
        assert m["peer_unknown"] == 121 and m["skipped"] == 0
    finally:
        stop_apps([proc])
    assert _unknown_warnings(log) == 1, log.read_text()


@pytest.mark.parametrize("kind", ["uvicorn", "gunicorn"])
def test_a_proxy_on_a_unix_socket_is_trusted_with_unix(
    server: RedisServer, tmp_path: Path, socket_dir: str, kind: str
) -> None:
    # A proxy in front of the socket writes X-Forwarded-For: trusted_proxies=["unix"] makes
    # the socket's peer a trusted proxy, so each client has its own bucket; a request the
    # proxy sent without the header is "unknown".
    uds = os.path.join(socket_dir, "app.sock")
    log = tmp_path / f"{kind}.log"
    proc = start_app(kind, 0, app_env(server, RL_TRUSTED="unix"), log, uds=uds)
    try:
        with http_client(uds) as http:
            def ip_remaining(**headers: str) -> str:
                r = http.get("http://app/api/thing", headers={"X-API-Key": "px", **headers})
                assert r.status_code == 200
                return r.headers["RateLimit"].split(", ")[1].split(";t=")[0]

            seen = [ip_remaining(**{"X-Forwarded-For": "6.6.6.6, 203.0.113.5"}) for _ in range(3)]
            other = ip_remaining(**{"X-Forwarded-For": "203.0.113.6"})
            bare = ip_remaining()
            m = http.get("http://app/metrics").json()
        assert seen == ['"ip";r=99', '"ip";r=98', '"ip";r=97'] and other == '"ip";r=99'
        assert bare == '"ip";r=99' and m["peer_unknown"] == 1
    finally:
        stop_apps([proc])
