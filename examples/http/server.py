"""A small HTTP service limited by API key and client IP together, through redis-rl.

    python3 server.py --port 8080 --redis-url redis://127.0.0.1:6379/0 \
        --fail-mode open --replicas 2

Every request to /api/... is checked with one RL.ALL call (one round trip, atomic): a GCRA
limit per API key (header X-API-Key, default "anonymous") and an exact sliding-log limit per
client IP under that key. The two keys share a hash tag, so the call also works on a Redis
Cluster. A denied request gets 429 with Retry-After; every reply carries the IETF
RateLimit-Policy / RateLimit fields and the common RateLimit-Limit/-Remaining/-Reset.

When Redis is unreachable, --fail-mode decides: "open" lets requests through, "closed"
answers 503; both log a line and count it (GET /metrics). With --replicas N > 0, a local
token bucket sized quota / N (per API key) answers obvious floods without asking Redis;
Redis stays the authority for everything it lets through.
"""
import argparse
import json
import logging
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis

log = logging.getLogger("rl-example")


class LocalBucket:
    """A plain in-process token bucket (capacity, refill per second), per key."""

    def __init__(self, capacity, per_second):
        self.capacity = capacity
        self.per_second = per_second
        self.state = {}
        self.lock = threading.Lock()

    def take(self, key):
        now = time.monotonic()
        with self.lock:
            tokens, last = self.state.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.per_second)
            if tokens < 1:
                self.state[key] = (tokens, now)
                return False
            self.state[key] = (tokens - 1, now)
            return True


class Limiter:
    def __init__(self, args):
        self.redis = redis.Redis.from_url(args.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self.fail_open = args.fail_mode == "open"
        self.burst, self.rate, self.period = args.key_limit
        self.ip_limit, self.ip_window = args.ip_limit
        self.local = None
        if args.replicas > 0:
            share = args.replicas
            self.local = LocalBucket(max(1, self.burst / share), self.rate / self.period / share)
        self.metrics = {"requests": 0, "allowed": 0, "limited": 0, "local_limited": 0,
                        "redis_errors": 0, "fail_open_allowed": 0, "fail_closed_denied": 0}
        self.lock = threading.Lock()

    def count(self, name):
        with self.lock:
            self.metrics[name] += 1

    def policy(self):
        return f'"api";q={self.burst};w={self.period:g}, "ip";q={self.ip_limit};w={self.ip_window:g}'

    def check(self, api_key, ip):
        """Returns (status, headers)."""
        self.count("requests")
        if self.local is not None and not self.local.take(api_key):
            self.count("local_limited")
            retry = max(1, math.ceil(1 / (self.rate / self.period)))
            return 429, {"Retry-After": str(retry), "RateLimit-Policy": self.policy()}
        keys = [f"rl:{{{api_key}}}:api", f"rl:{{{api_key}}}:ip:{ip}"]
        try:
            combined, per_key = self.redis.execute_command(
                "RL.ALL", 2, *keys,
                "GCRA", self.burst, self.rate, self.period,
                "WINDOW", self.ip_limit, self.ip_window, "LOG")
        except redis.RedisError as e:
            self.count("redis_errors")
            if self.fail_open:
                self.count("fail_open_allowed")
                log.warning("redis unreachable (%s): failing open", e)
                return 200, {}
            self.count("fail_closed_denied")
            log.warning("redis unreachable (%s): failing closed", e)
            return 503, {"Retry-After": "1"}
        allowed, limit, remaining, retry_after_ms, reset_after_ms = combined
        binding = "api" if per_key[0][2] <= per_key[1][2] else "ip"
        reset_s = math.ceil(reset_after_ms / 1000)
        headers = {
            "RateLimit-Policy": self.policy(),
            "RateLimit": f'"{binding}";r={remaining};t={reset_s}',
            "RateLimit-Limit": str(limit),
            "RateLimit-Remaining": str(remaining),
            "RateLimit-Reset": str(reset_s),
        }
        if allowed:
            self.count("allowed")
            return 200, headers
        self.count("limited")
        if retry_after_ms >= 0:
            headers["Retry-After"] = str(math.ceil(retry_after_ms / 1000))
            return 429, headers
        return 413, headers  # a request larger than any limit can never pass


def make_handler(limiter):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/metrics":
                body = json.dumps(limiter.metrics).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            api_key = self.headers.get("X-API-Key", "anonymous")
            status, headers = limiter.check(api_key, self.client_address[0])
            body = {200: b"ok\n", 429: b"too many requests\n", 503: b"limiter unavailable\n"}.get(status, b"no\n")
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            pass

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--fail-mode", choices=["open", "closed"], default="closed")
    p.add_argument("--replicas", type=int, default=0, help="fleet size for the local fast path (0: off)")
    p.add_argument("--key-limit", type=float, nargs=3, default=[10, 1, 1], metavar=("BURST", "RATE", "PERIOD"))
    p.add_argument("--ip-limit", type=float, nargs=2, default=[20, 60], metavar=("LIMIT", "WINDOW"))
    args = p.parse_args()
    args.key_limit = [int(args.key_limit[0]), int(args.key_limit[1]), args.key_limit[2]]
    args.ip_limit = [int(args.ip_limit[0]), args.ip_limit[1]]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(Limiter(args)))
    log.info("listening on 127.0.0.1:%d (fail-%s)", args.port, args.fail_mode)
    server.serve_forever()


if __name__ == "__main__":
    main()
