"""A small HTTP service limited by API key and client IP together, built on the redis_rl
package (clients/python).

    pip install ./clients/python
    python3 server.py --port 8080 --redis-url redis://127.0.0.1:6379/0 --fail-mode open

Every request to /api/... is checked with one atomic call (RL.ALL, or the Lua fallback where
the module is not loaded): a GCRA limit per API key (header X-API-Key, default "anonymous")
and an exact sliding-log limit per client IP, one bucket per address whatever the API key
(changing keys does not dodge it). Denied requests get 429 with
Retry-After and a JSON body, requests that can never pass 413, and every reply carries the
IETF RateLimit-Policy / RateLimit fields. When Redis is unreachable, --fail-mode decides:
"open" lets requests through, "closed" answers 503 with Retry-After; both log once per
outage and count it (GET /metrics). The package's deny cache answers a denied key locally
until its retry_after, so a flood costs Redis one call.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from redis_rl import GCRA, Limiter, Window
from redis_rl.http import Rule, client_ip, header
from redis_rl.wsgi import RateLimitMiddleware


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def build_app(args: argparse.Namespace) -> tuple[Any, Limiter]:
    limiter = Limiter.from_url(
        args.redis_url, timeout=0.5, on_error=args.fail_mode, prefix="rl:",
    )
    burst, rate, period = args.key_limit
    ip_limit, ip_window = args.ip_limit
    rules = [
        Rule("/api/", {
            "api": (GCRA(int(burst), int(rate), period), header("X-API-Key", "anonymous")),
            "ip": (Window(int(ip_limit), ip_window, "LOG"), client_ip(args.trusted_proxy)),
        }, cost=lambda info: int(info.headers.get("x-cost", "1"))),
    ]

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/metrics":
            body = json.dumps(limiter.counters.snapshot()).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        body = b"ok\n"
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return RateLimitMiddleware(app, limiter, rules, exempt=["/metrics"]), limiter


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--fail-mode", choices=["open", "closed"], default="closed")
    p.add_argument("--trusted-proxy", action="append", default=[],
                   help="address or CIDR of a proxy whose X-Forwarded-For is trusted (repeatable)")
    p.add_argument("--key-limit", type=float, nargs=3, default=[10, 1, 1], metavar=("BURST", "RATE", "PERIOD"))
    p.add_argument("--ip-limit", type=float, nargs=2, default=[20, 60], metavar=("LIMIT", "WINDOW"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app, _ = build_app(args)
    server = make_server("127.0.0.1", args.port, app, server_class=ThreadingWSGIServer,
                         handler_class=QuietHandler)
    logging.getLogger("rl-example").info("listening on 127.0.0.1:%d (fail-%s)", args.port, args.fail_mode)
    server.serve_forever()


if __name__ == "__main__":
    main()
