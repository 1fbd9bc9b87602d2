"""FastAPI app for the end-to-end tests, run under uvicorn (configured by environment)."""

from __future__ import annotations

import os

from fastapi import Depends, FastAPI

from redis_rl import GCRA, AsyncLimiter, Window
from redis_rl.asgi import RateLimitMiddleware
from redis_rl.http import Rule, client_ip, header
from redis_rl.starlette import RateLimit

limiter = AsyncLimiter.from_url(
    os.environ["RL_REDIS_URL"],
    mode=os.environ.get("RL_MODE", "auto"),
    on_error=os.environ.get("RL_ON_ERROR", "open"),
    prefix=os.environ.get("RL_PREFIX", "e2e:"),
)
app = FastAPI()
app.add_middleware(
    RateLimitMiddleware,
    limiter=limiter,
    rules=[
        Rule("/api/", {
            "api": (GCRA(10, 1, 60), header("X-API-Key", "anonymous")),
            "ip": (Window(100, 60, "LOG"), client_ip(["127.0.0.1"])),
        }),
        Rule("/upload", GCRA(5, 1, 60), key=client_ip(["127.0.0.1"]), name="upload",
             cost=lambda info: int(info.headers.get("x-units", "1"))),
    ],
    exempt=["/health"],
)
reports = RateLimit(limiter, GCRA(2, 1, 60, name="reports"), key=header("X-API-Key", "anonymous"))


@app.get("/api/thing")
async def thing() -> dict[str, str]:
    return {"ok": "thing", "pid": str(os.getpid())}


@app.post("/upload")
async def upload() -> dict[str, str]:
    return {"ok": "upload"}


@app.get("/reports", dependencies=[Depends(reports)])
async def report() -> dict[str, str]:
    return {"ok": "report"}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"ok": "healthy"}


@app.get("/metrics")
async def metrics() -> dict[str, int]:
    return limiter.counters.snapshot()
