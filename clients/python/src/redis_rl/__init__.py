"""redis_rl: rate limiting in Redis for Python services.

    import redis, redis_rl
    limiter = redis_rl.Limiter(redis.Redis(), on_error="open")
    d = limiter.check("user:42", redis_rl.GCRA(burst=10, rate=5, period=1))
    if not d.allowed:
        return 429, d.headers("api")

Decisions come from the redis-rl module when the server has it, else from the project's Lua
Functions library (same replies). See the package README for the failure policy, the local
fast path and the ASGI/WSGI middleware.
"""

from ._base import Refund, Release
from ._decision import NEVER, Decision, Never, RetryAfter, Source
from ._limits import GCRA, Algorithm, InvalidLimit, Lease, Limit, Seconds, Window, parse_limits
from ._policy import (
    Counters,
    FailurePolicy,
    LeaseLost,
    LimiterError,
    LimiterUnavailable,
    RateLimitExceeded,
)
from ._protocol import Mode
from .aio import AsyncHeld, AsyncLimiter
from .client import Held, Limiter

__version__ = "0.1.0"

__all__ = [
    "GCRA",
    "NEVER",
    "Algorithm",
    "AsyncHeld",
    "AsyncLimiter",
    "Counters",
    "Decision",
    "FailurePolicy",
    "Held",
    "InvalidLimit",
    "Lease",
    "LeaseLost",
    "Limit",
    "Limiter",
    "LimiterError",
    "LimiterUnavailable",
    "Mode",
    "Never",
    "RateLimitExceeded",
    "Refund",
    "Release",
    "RetryAfter",
    "Seconds",
    "Source",
    "Window",
    "parse_limits",
    "tag",
]


def tag(hash_tag: str, *parts: str) -> str:
    """tag builds a cluster-safe key: tag("user42", "rpm") == "{user42}:rpm".

    Keys built with one hash tag live in one Redis Cluster slot, as check_all and a lease
    with other limits need.
    """
    if not hash_tag or "{" in hash_tag or "}" in hash_tag:
        raise ValueError("hash tag must be non-empty and hold no braces")
    return ":".join(["{" + hash_tag + "}", *parts])
