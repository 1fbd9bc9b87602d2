"""redis-rl from Python: the command on the wire with plain redis-py, then the same limit
through the redis_rl package (clients/python), which builds the HTTP answer.

Run: REDIS_URL=redis://127.0.0.1:6379/0 python3 python_example.py
(with `pip install ./clients/python`).
"""
import os

import redis
from redis_rl import GCRA, Limiter

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))

# With the package: a Decision, its HTTP status and headers, a failure policy.
limiter = Limiter(r, on_error="open")
per_user = GCRA(burst=10, rate=5, period=1, name="api")


def handle(user_id):
    """Returns (HTTP status, headers) for one request of `user_id`: burst 10, 5 per second."""
    d = limiter.check(f"user:{user_id}", per_user)
    status = 200 if d.allowed else 413 if d.never else 429
    return status, d.headers(x_headers=True)


if __name__ == "__main__":
    user = f"py-example-{os.getpid()}"
    # On the wire: one command, five integers back.
    allowed, limit, remaining, retry_after_ms, reset_after_ms = r.execute_command(
        "RL.GCRA", f"raw:{user}", 10, 5, 1)
    assert (allowed, limit, remaining, retry_after_ms) == (1, 10, 9, -1)
    statuses = [handle(user)[0] for _ in range(11)]
    status, headers = handle(user)
    print(statuses, status, headers)
    assert statuses == [200] * 10 + [429], statuses
    assert status == 429 and headers["Retry-After"] == "1", headers
    assert headers["RateLimit-Policy"] == '"api";q=10;w=2' and headers["X-RateLimit-Remaining"] == "0"
    print("python example: ok")
