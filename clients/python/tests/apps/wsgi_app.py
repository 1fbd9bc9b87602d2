"""Flask app for the end-to-end tests, run under gunicorn (configured by environment)."""

from __future__ import annotations

import os

from flask import Flask, jsonify, request

from redis_rl import GCRA, Limiter, Window
from redis_rl.flask import RateLimits, rate_limit
from redis_rl.http import Rule, client_ip, header
from redis_rl.wsgi import RateLimitMiddleware

# The proxies the app trusts ("unix": a Unix socket's peer, which has no address).
TRUSTED = os.environ.get("RL_TRUSTED", "127.0.0.1").split(",")
limiter = Limiter.from_url(
    os.environ["RL_REDIS_URL"],
    mode=os.environ.get("RL_MODE", "auto"),
    on_error=os.environ.get("RL_ON_ERROR", "open"),
    prefix=os.environ.get("RL_PREFIX", "e2e:"),
)
app = Flask(__name__)
app.wsgi_app = RateLimitMiddleware(  # type: ignore[method-assign]
    app.wsgi_app,
    limiter,
    rules=[
        Rule("/api/", {
            "api": (GCRA(10, 1, 60), header("X-API-Key")),
            "ip": (Window(100, 60, "LOG"), client_ip(TRUSTED)),
        }),
        Rule("/upload", GCRA(5, 1, 60), key=client_ip(TRUSTED), name="upload",
             cost=lambda info: max(1, int(info.headers.get("x-units", "1")))),
        Rule("/maybe", "2/minute", key=header("X-API-Key"), name="maybe",
             deduct_when=lambda status: status < 400),
    ],
    exempt=["/health"],
    trusted_proxies=TRUSTED,
)
# Inside the app: denials are werkzeug exceptions, answered by the app's errorhandler(429).
RateLimits(app, limiter, [Rule("/inside", "1/minute", key=header("X-API-Key"), name="inside")])


@app.errorhandler(429)
def too_many(e):  # type: ignore[no-untyped-def]
    return jsonify(error="slow_down", by="errorhandler", retry_after=e.denial.headers.get("Retry-After")), 429


@app.get("/api/thing")
def thing():  # type: ignore[no-untyped-def]
    return jsonify(ok="thing", pid=str(os.getpid()))


@app.post("/upload")
def upload():  # type: ignore[no-untyped-def]
    return jsonify(ok="upload")


@app.get("/reports")
@rate_limit(limiter, GCRA(2, 1, 60, name="reports"), key=header("X-API-Key", "anonymous"))
def report():  # type: ignore[no-untyped-def]
    return jsonify(ok="report")


@app.get("/maybe")
def maybe():  # type: ignore[no-untyped-def]
    status = int(request.args.get("status", "200"))
    return jsonify(status=status), status


@app.get("/inside")
def inside():  # type: ignore[no-untyped-def]
    return jsonify(ok="inside")


@app.get("/health")
def health():  # type: ignore[no-untyped-def]
    return jsonify(ok="healthy")


@app.get("/metrics")
def metrics():  # type: ignore[no-untyped-def]
    return jsonify(limiter.counters.snapshot())
