"""FastAPI app for the end-to-end tests, run under uvicorn (configured by environment)."""

from __future__ import annotations

import os

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from redis_rl import GCRA, AsyncLimiter, Window
from redis_rl.asgi import RateLimitMiddleware
from redis_rl.http import Rule, client_ip, header
from redis_rl.starlette import RateLimit

# The proxies the app trusts ("unix": a Unix socket's peer, which has no address).
TRUSTED = os.environ.get("RL_TRUSTED", "127.0.0.1").split(",")
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
        # Per API key and per IP: each limit keyed by its own identity (a client rotating
        # API keys stays under the per-IP limit); a request without a key is limited by its
        # IP under the "api" limit.
        Rule("/api/", {
            "api": (GCRA(10, 1, 60), header("X-API-Key")),
            "ip": (Window(100, 60, "LOG"), client_ip(TRUSTED)),
        }),
        Rule("/upload", GCRA(5, 1, 60), key=client_ip(TRUSTED), name="upload",
             cost=lambda info: max(1, int(info.headers.get("x-units", "1")))),
        # Only answers below 400 are charged.
        Rule("/maybe", "2/minute", key=header("X-API-Key"), name="maybe",
             deduct_when=lambda status: status < 400),
    ],
    exempt=["/health"],
    trusted_proxies=TRUSTED,
)
reports = RateLimit(limiter, GCRA(2, 1, 60, name="reports"), key=header("X-API-Key", "anonymous"))
inside = RateLimit(limiter, "1/minute", key=header("X-API-Key"), name="inside")


@app.exception_handler(429)
async def too_many(request: Request, exc: Exception) -> JSONResponse:
    # The dependency's denial is an HTTPException: the app's own handler answers it.
    headers = getattr(exc, "headers", None) or {}
    return JSONResponse({"error": "slow_down", "by": "exception_handler",
                         "retry_after": headers.get("Retry-After")}, status_code=429, headers=headers)


@app.get("/inside", dependencies=[Depends(inside)])
async def inside_view() -> dict[str, str]:
    return {"ok": "inside"}


@app.get("/api/thing")
async def thing() -> dict[str, str]:
    return {"ok": "thing", "pid": str(os.getpid())}


@app.post("/upload")
async def upload() -> dict[str, str]:
    return {"ok": "upload"}


@app.get("/reports", dependencies=[Depends(reports)])
async def report() -> dict[str, str]:
    return {"ok": "report"}


@app.get("/maybe")
async def maybe(response: Response, status: int = 200) -> dict[str, int]:
    response.status_code = status
    return {"status": status}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"ok": "healthy"}


@app.get("/metrics")
async def metrics() -> dict[str, int]:
    return limiter.counters.snapshot()
