"""The README's examples run as written, against a real server in both modes: every
```python block reads REDIS_URL, which points at the test server (only a key prefix is added
to each limiter, to keep the examples' keys apart).
Every block is run; the ones below also have their behaviour checked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import RedisServer

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    """blocks is every ```python block of the README with the heading it is under."""
    text = README.read_text()
    out: list[tuple[str, str]] = []
    for m in BLOCK.finditer(text):
        headings = re.findall(r"^#{2,3} (.+)$", text[: m.start()], re.M)
        out.append((headings[-1] if headings else "", m.group(1)))
    return out


def block(heading: str, index: int = 0) -> str:
    """block is the `index`-th ```python block under `heading` (a ## or ### heading)."""
    found = [code for h, code in blocks() if h == heading]
    assert len(found) > index, heading
    return found[index]


def run(code: str, server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("REDIS_URL", server.url)
    # Keep the examples' keys apart from other tests' (and from each other's runs).
    code = re.sub(r"(Limiter(?:\.from_url)?\((?:[^()]|\([^()]*\))*)\)", rf"\1, prefix={prefix!r})", code)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def server_seconds(server: RedisServer) -> float:
    """server_seconds reads the server's clock (TIME): the one its limits decide by, so a
    bound on what they admitted is a bound on the server's work, whatever this process's
    scheduling."""
    c = server.client()
    try:
        sec, usec = c.time()
        return sec + usec / 1e6
    finally:
        c.close()


def test_every_example_reads_redis_url_and_says_its_failure_policy() -> None:
    for heading, code in blocks():
        if "Limiter" in code:
            assert 'os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")' in code, heading
            assert "on_error=" in code, heading


@pytest.mark.parametrize("index", range(len(blocks())), ids=[h for h, _ in blocks()])
async def test_every_example_runs(index: int, server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(blocks()[index][1], server, prefix, monkeypatch)
    for value in list(ns.values()):
        close = getattr(value, "aclose", None) if type(value).__name__ == "AsyncLimiter" else None
        if close is not None:
            await close()
            await value.redis.aclose()


async def test_five_lines_of_fastapi(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block("Five lines of FastAPI"), server, prefix, monkeypatch)
    app = ns["app"]

    @app.get("/api/thing")
    async def thing() -> dict[str, str]:
        return {"ok": "thing"}

    transport = httpx.ASGITransport(app=app)
    got: list[httpx.Response] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://readme") as client:
        start = server_seconds(server)
        while len(got) < 200 and (not got or got[-1].status_code == 200):
            got.append(await client.get("/api/thing"))
        elapsed = server_seconds(server) - start
    await ns["limiter"].redis.aclose()
    # A burst of 10, then 1 per second: 10 at once, and one more per second of the server's
    # clock the loop spanned.
    statuses = [r.status_code for r in got]
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200}
    assert 10 <= len(got) - 1 <= 10 + int(elapsed) + 1
    assert got[0].headers["RateLimit-Policy"] == '"api";q=10;w=10'
    assert got[-2].headers["RateLimit"].startswith('"api";r=0;')
    assert got[-1].headers["Retry-After"] == "1"
    assert got[-1].json()["error"] == "rate_limited"


def test_flask(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block("Flask"), server, prefix, monkeypatch)
    client = ns["app"].test_client()
    got = [client.post("/login") for _ in range(6)]
    assert [r.status_code for r in got] == [200] * 5 + [429]
    assert got[0].headers["RateLimit-Policy"] == '"login";q=5;w=60'
    assert 1 <= int(got[5].headers["Retry-After"]) <= 60


def test_the_client(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block("The client"), server, prefix, monkeypatch)
    d = ns["d"]
    assert d.allowed and d.limit == 10 and d.remaining == 9
    limiter, limit = ns["limiter"], ns["GCRA"](burst=10, rate=5, period=1)
    start = server_seconds(server)
    admitted = 1
    while (d := limiter.check("user:42", limit)).allowed and admitted < 100:
        admitted += 1
    elapsed = server_seconds(server) - start
    # Burst 10, then 5 per second of the server's clock the loop spanned.
    assert 10 <= admitted <= 10 + int(elapsed * 5) + 1
    assert not d.allowed and d.headers("api")["Retry-After"] == "1"


async def test_per_api_key_and_per_ip(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block("Per API key and per IP"), server, prefix, monkeypatch)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ns["app"]), base_url="http://readme") as c:
        got = [(await c.get("/api/thing", headers={"X-API-Key": f"k{i}"})).status_code for i in range(120)]
    await ns["limiter"].redis.aclose()
    assert got.count(200) == 100  # a new API key per request: still 100 per minute per IP


async def test_a_missing_identity(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block('A missing identity is never "no limit"'), server, prefix, monkeypatch)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ns["app"]), base_url="http://readme") as c:
        denied = await c.get("/partner/feed")
        allowed = await c.get("/partner/feed", headers={"X-API-Key": "p1"})
    await ns["limiter"].redis.aclose()
    assert denied.status_code == 401 and denied.json()["error"] == "identity_required"
    assert allowed.status_code == 200


async def test_limits_by_plan_come_from_what_the_server_trusts(
    server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The by-plan example read the plan from a client-sent X-Plan header: anyone could claim
    # "pro". It looks the API key up in the server's own records.
    ns = run(block("Limits as users write them"), server, prefix, monkeypatch)
    app = ns["app"]

    @app.get("/reports/daily")
    async def daily() -> dict[str, bool]:
        return {"ok": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://readme") as c:
        claimed = await c.get("/reports/daily", headers={"X-API-Key": "anyone", "X-Plan": "pro"})
        pro = await c.get("/reports/daily", headers={"X-API-Key": "key-of-acme"})
    await ns["limiter"].redis.aclose()
    assert claimed.headers["RateLimit-Policy"] == '"reports";q=100;w=3600'
    assert pro.headers["RateLimit-Policy"] == '"reports-3600s";q=1000;w=3600, "reports-86400s";q=10000;w=86400'


def test_the_readme_says_how_to_run_the_tests_on_their_own() -> None:
    tests = README.read_text().split("## Tests", 1)[1]
    assert '"./clients/python[test]"' in tests  # the extra the suite needs outside make test
    assert "RL_MODULE=" in tests and "cargo build --release" in tests


async def test_exemptions_deduct_when_and_reported_costs(
    server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = run(block("Exemptions, `deduct_when` and reported costs"), server, prefix, monkeypatch)
    lim = ns["limiter"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ns["app"]), base_url="http://readme") as c:
        k = {"X-API-Key": "r1"}
        assert (await c.get("/lookup/missing", headers=k)).status_code == 404
        hit = await c.get("/lookup/x", headers=k)
        assert hit.headers["RateLimit"].startswith('"lookup";r=99;')  # the 404 was not charged
        await c.post("/llm", headers=k)
    from redis_rl import Window

    left = await lim.check("tokens:{hdr.x-api-key:r1}", Window(100000, 3600), 0)
    assert left.remaining == 100000 - 1234  # charged 2000 up front, settled to the 1234 used
    await lim.redis.aclose()


def test_denials_the_frameworks_way(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block("Denials the framework's way"), server, prefix, monkeypatch)
    c = ns["app"].test_client()
    got = [c.get("/api/thing", headers={"X-API-Key": "d1"}) for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 429]
    assert got[2].get_json() == {"error": "slow down", "retry_in": got[2].headers["Retry-After"]}
    assert got[2].headers["RateLimit"].startswith('"api";r=0;')


def test_the_local_policy(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block('`on_error="local"`'), server, prefix, monkeypatch)
    assert ns["limiter"].fleet_size == 4 and ns["d"].allowed and not ns["d"].degraded


def test_leases_that_know_they_are_lost(server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = run(block("Leases that know they are lost"), server, prefix, monkeypatch)
    assert ns["lost"] == [] and not ns["held"].lost
