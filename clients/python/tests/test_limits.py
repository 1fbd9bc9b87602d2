"""Limits are validated values with the module's rules and messages; Decision reads replies."""

from __future__ import annotations

import math
import re
import time
from datetime import timedelta
from decimal import Decimal

import pytest
import redis

from redis_rl import GCRA, NEVER, Algorithm, InvalidLimit, Lease, Source, Window, parse_limits, tag
from redis_rl._decision import decision_from_reply
from redis_rl._limits import U64_MAX, format_seconds
from redis_rl._protocol import max_wait_ms
from redis_rl._local import DenyCache

from .conftest import RedisServer


@pytest.mark.parametrize(
    ("period", "wire"),
    [
        (60, "60"),
        ("0.25", "0.25"),
        (0.1, "0.1"),
        (timedelta(milliseconds=1500), "1.5"),
        (Decimal("0.000000001"), "0.000000001"),
        ("315360000", "315360000"),
        ("007", "7"),
    ],
)
def test_durations_are_kept_exactly(period: object, wire: str) -> None:
    assert GCRA(1, 1, period).args()[2] == wire  # type: ignore[arg-type]


def test_emission_interval_and_window() -> None:
    g = GCRA(10, 3, 1)
    assert g.emission_interval_ns == 333_333_333
    assert g.window == timedelta(seconds=3.333334)
    assert Window(5, 60).window == timedelta(seconds=60)
    assert Lease(3, "0.5").lease == timedelta(milliseconds=500)
    assert tag("user42", "api") == "{user42}:api"


BAD = [
    (lambda: GCRA(0, 1, 1), "burst must be a positive integer"),
    (lambda: GCRA(True, 1, 1), "burst must be a positive integer"),
    (lambda: GCRA(2**64, 1, 1), "burst must be a positive integer"),
    (lambda: GCRA(1, -1, 1), "rate must be a positive integer"),
    (lambda: GCRA(1, 3, "0.000000001"), "rate is too high for period"),
    (lambda: GCRA(2**63, 1, 4), "burst is too large"),
    (lambda: Window(1, 0), "window must be seconds as a plain decimal"),
    (lambda: Window(0, 1), "limit must be a positive integer"),
    (lambda: Window(1, 1, "HOURLY"), "algorithm must be FIXED, SLIDING or LOG"),
    (lambda: Lease(1, "1e3"), "lease must be seconds as a plain decimal"),
]


@pytest.mark.parametrize(("build", "message"), BAD)
def test_bad_limits_fail_when_built(build: object, message: str) -> None:
    with pytest.raises(InvalidLimit, match=message):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("text", ["1e3", "-1", "+1", "0x10", "inf", "nan", "1,5", ".5", "5.", "", "0",
                                  "1.0000000001", "315360000.000000001", " 1"])
def test_period_grammar_matches_the_module(text: str, module_server: RedisServer) -> None:
    with pytest.raises(InvalidLimit) as ours:
        GCRA(1, 1, text)
    c = module_server.client()
    try:
        with pytest.raises(redis.ResponseError) as theirs:
            c.execute_command("RL.GCRA", "grammar", 1, 1, text)
    finally:
        c.close()
    assert str(theirs.value) == str(ours.value)  # same text, without the "ERR " prefix


@pytest.mark.parametrize(("args", "build"), [
    ((0, 1, "1"), lambda: GCRA(0, 1, 1)),
    ((1, 3, "0.000000001"), lambda: GCRA(1, 3, "0.000000001")),
    ((2**63, 1, "4"), lambda: GCRA(2**63, 1, 4)),
])
def test_count_messages_match_the_module(args: tuple[object, ...], build: object, module_server: RedisServer) -> None:
    with pytest.raises(InvalidLimit) as ours:
        build()  # type: ignore[operator]
    c = module_server.client()
    try:
        with pytest.raises(redis.ResponseError) as theirs:
            c.execute_command("RL.GCRA", "grammar", *args)
    finally:
        c.close()
    assert str(theirs.value) == str(ours.value)


def test_format_seconds_round_trips() -> None:
    for ns in (1, 10, 999_999_999, 1_000_000_000, 1_500_000_000, 315_360_000 * 10**9):
        text = format_seconds(ns)
        assert GCRA(1, 1, text).period_ns == ns


def test_reply_to_decision() -> None:
    allowed = decision_from_reply([1, 10, 9, -1, 100], policy=None, key="k", source=Source.MODULE)
    assert allowed.allowed and allowed.retry_after == timedelta(0) and bool(allowed)
    denied = decision_from_reply([0, 10, 0, 1234, 5000], policy=None, key="k", source=Source.MODULE)
    assert denied.retry_after == timedelta(milliseconds=1234) and not denied
    never = decision_from_reply([0, 10, 3, -1, 0], policy=None, key="k", source=Source.MODULE)
    assert never.retry_after is NEVER and never.never
    reserved = decision_from_reply([1, 1, 0, 950, 2000], policy=None, key="k", source=Source.MODULE,
                                   reservation=True)
    assert reserved.allowed and reserved.retry_after == timedelta(milliseconds=950)


def test_huge_replies_saturate_instead_of_raising() -> None:
    # timedelta stops at 999,999,999 days: a longer wait reads as timedelta.max, and its
    # Retry-After (and the deny cache's local answer) saturate rather than raise.
    u64 = 2**64 - 1
    d = decision_from_reply([0, 1, 0, u64, u64], policy=None, key="k", source=Source.MODULE)
    assert d.retry_after == timedelta.max and d.reset_after == timedelta.max
    h = d.headers()
    assert h["Retry-After"] == "86400000000000"
    assert h["RateLimit"] == '"default";r=0;t=86400000000000'
    reserved = decision_from_reply([1, 1, 0, u64, 0], policy=None, key="k", source=Source.MODULE,
                                   reservation=True)
    assert reserved.retry_after == timedelta.max
    cache = DenyCache()
    cache.store("k", 1, d, time.monotonic())
    local = cache.lookup("k", 1, time.monotonic())
    assert local is not None and not local.allowed
    assert timedelta(days=999_999_998) < local.retry_after <= timedelta.max  # type: ignore[operator]
    assert local.headers()["Retry-After"] in ("86400000000000", "86399999999999")


def test_max_wait_saturates_at_the_most_the_module_takes() -> None:
    assert max_wait_ms(timedelta(seconds=2, microseconds=1500)) == 2001
    assert max_wait_ms(0.5) == 500
    assert max_wait_ms(timedelta.max) == timedelta.max // timedelta(milliseconds=1)
    assert max_wait_ms(U64_MAX // 1000) == U64_MAX // 1000 * 1000
    for forever in (U64_MAX, 1e300, math.inf, 10**400):
        assert max_wait_ms(forever) == U64_MAX
    for bad in (-1, -0.001, timedelta(microseconds=-1), math.nan, -math.inf):
        with pytest.raises(ValueError):
            max_wait_ms(bad)


def test_limits_are_hashable_values() -> None:
    assert GCRA(1, 1, 60) == GCRA(1, 1, "60") == GCRA(1, 1, timedelta(minutes=1))
    assert len({Window(1, 1), Window(1, "1"), Window(1, 1, "FIXED")}) == 2
    assert repr(GCRA(10, 5, "0.5", name="api")) == "GCRA(10, 5, '0.5', name='api')"


# -- limits as users write them (docs/clients.md#limits-as-users-write-them) ------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10/minute", [Window(10, 60)]),
        ("10/MINUTE", [Window(10, 60)]),
        ("100 per hour", [Window(100, 3600)]),
        ("100 per hour; 1000 per day", [Window(100, 3600), Window(1000, 86400)]),
        ("5/10s", [Window(5, 10)]),
        ("5 per 10 seconds", [Window(5, 10)]),
        ("20/minute, 200 per hour", [Window(20, 60), Window(200, 3600)]),
        ("1/s;2/sec;3/second;4/m;5/min;6/h;7/hr;8/d;9/days", [
            Window(1, 1), Window(2, 1), Window(3, 1), Window(4, 60), Window(5, 60),
            Window(6, 3600), Window(7, 3600), Window(8, 86400), Window(9, 86400),
        ]),
        (" 3 / 2 h ", [Window(3, 7200)]),
    ],
)
def test_limit_strings(text: str, expected: list[object]) -> None:
    assert parse_limits(text) == expected


def test_limit_strings_take_an_algorithm() -> None:
    assert parse_limits("10/minute", "FIXED") == [Window(10, 60, "FIXED")]
    assert parse_limits("10/minute", Algorithm.LOG) == [Window(10, 60, "LOG")]
    # GCRA: a burst of 10, refilled at 10 per minute.
    assert parse_limits("10/minute", "gcra") == [GCRA(10, 10, 60)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "limit string is empty"),
        ("10/fortnight", "unknown unit 'fortnight'"),
        ("ten/minute", "'ten/minute' is not"),
        ("10 minutes", "'10 minutes' is not"),
        ("0/minute", "'0/minute': limit must be a positive integer"),
        ("10/0s", "'10/0s': window must be from 1 to 315360000 seconds"),
        ("1/3650d;1/3651d", "'1/3651d': window must be from 1 to 315360000 seconds"),
        (f"{2**64}/s", "limit must be a positive integer"),
        ("10/minute;", "'' is not"),
    ],
)
def test_bad_limit_strings_name_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(InvalidLimit, match=re.escape(message)):
        parse_limits(text)
    with pytest.raises(InvalidLimit):
        parse_limits("10/minute", "HOURLY")
