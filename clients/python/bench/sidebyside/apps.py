"""The side-by-side bench's apps: one route, `GET /api/item`, three ways per framework.

Run by `clients/python/bench/sidebyside.py`, configured by environment:

* `BENCH_LIMITER`: `none` (the baseline), `redis_rl` (this package), or `anchor` (slowapi for
  FastAPI, Flask-Limiter for Flask, both on `limits` with its Redis storage);
* `BENCH_LIMIT`, `BENCH_WINDOW`: the limit, `BENCH_LIMIT` requests per `BENCH_WINDOW` seconds
  per client IP, as a fixed window everywhere (redis_rl `Window(..., "FIXED")`, aligned to the
  Unix epoch; `limits`' "fixed-window", which starts at a window's first hit);
* `BENCH_REDIS_URL`; `BENCH_ON_ERROR` (redis_rl's `on_error`, unset: its default);
  `BENCH_FALLBACK=1`: the anchor's `in_memory_fallback_enabled`.

Each limiter is set up the way its README shows, with its defaults otherwise (no Redis
timeout is set for the anchors: `limits` leaves redis-py's). `GET /health` is never limited.

    uvicorn --factory apps:fastapi_app        gunicorn 'apps:flask_app()'
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, Request
from flask import Flask, jsonify

LIMITER = os.environ.get("BENCH_LIMITER", "none")
LIMIT = int(os.environ.get("BENCH_LIMIT", "100"))
WINDOW = int(os.environ.get("BENCH_WINDOW", "10"))
URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
ANCHOR_FALLBACK = os.environ.get("BENCH_FALLBACK") == "1"


def redis_rl_options() -> dict[str, Any]:
    on_error = os.environ.get("BENCH_ON_ERROR")
    return {"on_error": on_error} if on_error else {}


# -- redis_rl: the package under test (the only place the bench uses its API) --------------


def redis_rl_fastapi(app: FastAPI) -> None:
    from redis_rl import AsyncLimiter, Window
    from redis_rl.asgi import RateLimitMiddleware
    from redis_rl.http import Rule, client_ip

    limiter = AsyncLimiter.from_url(URL, **redis_rl_options())
    app.add_middleware(RateLimitMiddleware, limiter=limiter,
                       rules=[Rule("/api/", Window(LIMIT, WINDOW, "FIXED"), key=client_ip())])


def redis_rl_flask_view(view: Any) -> Any:
    from redis_rl import Limiter, Window
    from redis_rl.flask import rate_limit
    from redis_rl.http import client_ip

    limiter = Limiter.from_url(URL, **redis_rl_options())
    return rate_limit(limiter, Window(LIMIT, WINDOW, "FIXED"), key=client_ip())(view)


# -- the apps -------------------------------------------------------------------------------


def fastapi_app() -> FastAPI:
    """fastapi_app is the FastAPI app (`uvicorn --factory apps:fastapi_app`)."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    if LIMITER == "anchor":
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.util import get_remote_address

        slow = Limiter(key_func=get_remote_address, storage_uri=URL, strategy="fixed-window",
                       in_memory_fallback_enabled=ANCHOR_FALLBACK)
        app.state.limiter = slow
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

        @app.get("/api/item")
        @slow.limit(f"{LIMIT}/{WINDOW} seconds")
        async def item_slowapi(request: Request) -> dict[str, bool]:
            return {"ok": True}

        return app

    if LIMITER == "redis_rl":
        redis_rl_fastapi(app)

    @app.get("/api/item")
    async def item() -> dict[str, bool]:
        return {"ok": True}

    return app


def flask_app() -> Flask:
    """flask_app is the Flask app (`gunicorn 'apps:flask_app()'`)."""
    app = Flask(__name__)

    @app.get("/health")
    def health() -> Any:
        return jsonify(ok=True)

    def item() -> Any:
        return jsonify(ok=True)

    if LIMITER == "anchor":
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address

        fl = Limiter(get_remote_address, app=app, storage_uri=URL, strategy="fixed-window",
                     in_memory_fallback_enabled=ANCHOR_FALLBACK)
        app.get("/api/item")(fl.limit(f"{LIMIT} per {WINDOW} seconds")(item))
    elif LIMITER == "redis_rl":
        app.get("/api/item")(redis_rl_flask_view(item))
    else:
        app.get("/api/item")(item)
    return app
