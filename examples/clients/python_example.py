"""redis-rl from Python (redis-py): a per-user limit with HTTP-style handling.

Run: REDIS_URL=redis://127.0.0.1:6379/0 python3 python_example.py
"""
import os

import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))


def ceil_div(a, b):
    return -(-a // b)


def check(user_id):
    """Returns (HTTP status, headers) for one request of `user_id`: burst 10, 5 per second."""
    allowed, limit, remaining, retry_after_ms, reset_after_ms = r.execute_command(
        "RL.GCRA", f"user:{user_id}", 10, 5, 1)
    headers = {
        "RateLimit-Limit": str(limit),
        "RateLimit-Remaining": str(remaining),
        "RateLimit-Reset": str(ceil_div(reset_after_ms, 1000)),
    }
    if allowed:
        return 200, headers
    if retry_after_ms >= 0:
        headers["Retry-After"] = str(ceil_div(retry_after_ms, 1000))
    return 429, headers


if __name__ == "__main__":
    user = f"py-example-{os.getpid()}"
    statuses = [check(user)[0] for _ in range(11)]
    status, headers = check(user)
    print(statuses, status, headers)
    assert statuses == [200] * 10 + [429], statuses
    assert status == 429 and headers["Retry-After"] == "1" and headers["RateLimit-Remaining"] == "0"
    print("python example: ok")
