"""The README's examples run as written (only the Redis address is changed, and the Flask
view's `...` body filled in), against a real server in both modes."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx

from .conftest import RedisServer

README = Path(__file__).resolve().parents[1] / "README.md"


def block(heading: str) -> str:
    """block is the first ```python block after `heading` in the package README."""
    text = README.read_text()
    start = text.index(f"\n## {heading}\n")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, heading
    return m.group(1)


def run(code: str, server: RedisServer, prefix: str) -> dict[str, Any]:
    code = code.replace("redis://localhost:6379/0", server.url)
    code = code.replace("redis.Redis()", f"redis.Redis(port={server.port})")
    # Keep the examples' keys apart from other tests' (and from each other's runs).
    code = re.sub(r"(Limiter(?:\.from_url)?\((?:[^()]|\([^()]*\))*)\)", rf"\1, prefix={prefix!r})", code, count=1)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


async def test_five_lines_of_fastapi(server: RedisServer, prefix: str) -> None:
    ns = run(block("Five lines of FastAPI"), server, prefix)
    app = ns["app"]

    @app.get("/api/thing")
    async def thing() -> dict[str, str]:
        return {"ok": "thing"}

    transport = httpx.ASGITransport(app=app)
    got: list[httpx.Response] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://readme") as client:
        start = time.monotonic()
        while len(got) < 200 and (not got or got[-1].status_code == 200):
            got.append(await client.get("/api/thing"))
        elapsed = time.monotonic() - start
    await ns["app"].user_middleware[0].kwargs["limiter"].redis.aclose()
    # A burst of 20, then 10 per second: 20 at once, and one more per 100 ms the loop took.
    statuses = [r.status_code for r in got]
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200}
    assert 20 <= len(got) - 1 <= 20 + int(elapsed * 10) + 1
    assert got[0].headers["RateLimit-Policy"] == '"api";q=20;w=2'
    assert got[-2].headers["RateLimit"].startswith('"api";r=0;')
    assert got[-1].headers["Retry-After"] == "1"
    assert got[-1].json()["error"] == "rate_limited"


def test_flask(server: RedisServer, prefix: str) -> None:
    code = block("Flask").replace("    ...", '    return "welcome"')
    ns = run(code, server, prefix)
    client = ns["app"].test_client()
    got = [client.post("/login") for _ in range(6)]
    assert [r.status_code for r in got] == [200] * 5 + [429]
    assert got[0].headers["RateLimit-Policy"] == '"login";q=5;w=60'
    assert 1 <= int(got[5].headers["Retry-After"]) <= 60


def test_the_client(server: RedisServer, prefix: str) -> None:
    ns = run(block("The client"), server, prefix)
    d = ns["d"]
    assert d.allowed and d.limit == 10 and d.remaining == 9
    limiter, limit = ns["limiter"], ns["GCRA"](burst=10, rate=5, period=1)
    start = time.monotonic()
    admitted = 1
    while (d := limiter.check("user:42", limit)).allowed and admitted < 100:
        admitted += 1
    elapsed = time.monotonic() - start
    assert 10 <= admitted <= 10 + int(elapsed * 5) + 1  # burst 10, then 5 per second
    assert not d.allowed and d.headers("api")["Retry-After"] == "1"
