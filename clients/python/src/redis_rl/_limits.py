"""Limits as validated values: GCRA, Window and Lease.

Every limit is checked when it is built, with the module's rules and the module's error texts
(`burst must be a positive integer`, ...), so a bad limit fails where it is written, not on
the first request. Durations (`period`, `window`, `lease`) accept a `datetime.timedelta`, an
`int` or `float` number of seconds, a `decimal.Decimal`, or a string in the module's grammar
(`"60"`, `"0.25"`); they are kept exactly, in nanoseconds, and read back as `timedelta`.
"""

from __future__ import annotations

import enum
import math
import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Union

__all__ = [
    "GCRA",
    "Algorithm",
    "InvalidLimit",
    "Lease",
    "Limit",
    "Seconds",
    "Window",
    "parse_limits",
]

NANOS_PER_SEC = 1_000_000_000
MAX_SECONDS = 315_360_000
MAX_PERIOD_NS = MAX_SECONDS * NANOS_PER_SEC
U64_MAX = 2**64 - 1

#: What a duration argument accepts: a timedelta, seconds as a number, or the module's
#: plain-decimal string.
Seconds = Union[timedelta, int, float, Decimal, str]

_PLAIN_DECIMAL = re.compile(r"\A([0-9]+)(?:\.([0-9]{1,9}))?\Z")


class InvalidLimit(ValueError):
    """InvalidLimit is raised when a limit or a request argument breaks the module's rules.

    Its message is the module's error text without the `ERR ` prefix.
    """


def _seconds_message(name: str) -> str:
    return (
        f"{name} must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 more "
        f"digits), > 0 and <= {MAX_SECONDS}"
    )


def seconds_to_ns(value: Seconds, name: str) -> int:
    """seconds_to_ns converts a duration argument to whole nanoseconds, validating it.

    Strings follow the module's grammar exactly; timedelta and Decimal are exact; floats are
    rounded to the nearest nanosecond. The result is in 1..=315360000 s.
    """
    if isinstance(value, bool):
        raise InvalidLimit(_seconds_message(name))
    ns: int
    if isinstance(value, timedelta):
        ns = (value.days * 86_400 + value.seconds) * NANOS_PER_SEC + value.microseconds * 1000
    elif isinstance(value, int):
        ns = value * NANOS_PER_SEC
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidLimit(_seconds_message(name))
        ns = round(Decimal(repr(value)) * NANOS_PER_SEC)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidLimit(_seconds_message(name))
        scaled = value * NANOS_PER_SEC
        try:
            if scaled != scaled.to_integral_value():
                raise InvalidLimit(_seconds_message(name))
        except InvalidOperation as e:  # pragma: no cover - huge exponents
            raise InvalidLimit(_seconds_message(name)) from e
        ns = int(scaled)
    elif isinstance(value, str):
        m = _PLAIN_DECIMAL.match(value)
        if m is None:
            raise InvalidLimit(_seconds_message(name))
        frac = (m.group(2) or "").ljust(9, "0")
        ns = int(m.group(1)) * NANOS_PER_SEC + int(frac)
    else:
        raise InvalidLimit(_seconds_message(name))
    if ns <= 0 or ns > MAX_PERIOD_NS:
        raise InvalidLimit(_seconds_message(name))
    return ns


def format_seconds(ns: int) -> str:
    """format_seconds writes nanoseconds as the module's plain decimal seconds (exact)."""
    whole, frac = divmod(ns, NANOS_PER_SEC)
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:09d}".rstrip("0")


def ns_to_timedelta(ns: int) -> timedelta:
    """ns_to_timedelta converts nanoseconds to a timedelta (rounded up to the microsecond)."""
    return timedelta(microseconds=-(-ns // 1000))


def positive(value: int, name: str) -> int:
    """positive checks a count ≥ 1 that fits the module's 64-bit counts."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= U64_MAX:
        raise InvalidLimit(f"{name} must be a positive integer")
    return value


def non_negative(value: int, name: str) -> int:
    """non_negative checks a count ≥ 0 that fits the module's 64-bit counts."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise InvalidLimit(f"{name} must be a non-negative integer")
    return value


def _check_name(name: str | None) -> str | None:
    if name is None:
        return None
    if not name or any(not (0x20 <= ord(c) < 0x7F) for c in name):
        raise InvalidLimit("name must be non-empty printable ASCII (it is sent in HTTP headers)")
    return name


class Algorithm(str, enum.Enum):
    """Algorithm names a window algorithm of RL.WINDOW."""

    FIXED = "FIXED"
    SLIDING = "SLIDING"
    LOG = "LOG"


class _Limit:
    __slots__ = ("name",)
    name: str | None

    def args(self) -> tuple[str, ...]:
        """args gives the command arguments after the key (module command form)."""
        raise NotImplementedError

    def spec(self) -> tuple[str, ...]:
        """spec gives this limit as an RL.ALL spec (`GCRA …`, `WINDOW …`)."""
        raise NotImplementedError

    @property
    def capacity(self) -> int:
        """capacity is the most requests an idle key admits at once (burst / limit)."""
        raise NotImplementedError

    @property
    def window(self) -> timedelta | None:
        """window is the `w` of the IETF RateLimit-Policy field: the span `capacity` is for."""
        raise NotImplementedError

    def _ident(self) -> tuple[str, ...]:
        return (type(self).__name__, *self.args())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Limit):
            return NotImplemented
        return self._ident() == other._ident() and self.name == other.name

    def __hash__(self) -> int:
        return hash((self._ident(), self.name))


class GCRA(_Limit):
    """GCRA is a token bucket: `burst` at once, refilled at `rate` per `period`.

    The emission interval `T = period / rate` (rounded to the nearest nanosecond, ≥ 1 ns)
    is the cost of one request; an idle key admits exactly `burst` requests at once, then one
    more every `T`. Raises InvalidLimit with the module's messages.
    """

    __slots__ = ("burst", "emission_interval_ns", "period_ns", "rate")

    def __init__(self, burst: int, rate: int, period: Seconds, *, name: str | None = None) -> None:
        self.burst = positive(burst, "burst")
        self.rate = positive(rate, "rate")
        self.period_ns = seconds_to_ns(period, "period")
        interval = (self.period_ns + self.rate // 2) // self.rate
        if interval == 0:
            raise InvalidLimit(
                "rate is too high for period: the emission interval period/rate is below 1 ns"
            )
        if self.burst * interval > U64_MAX:
            raise InvalidLimit(
                "burst is too large: burst * period / rate overflows 64-bit nanoseconds"
            )
        self.emission_interval_ns = interval
        self.name = _check_name(name)

    @property
    def period(self) -> timedelta:
        """period is the span `rate` requests are spread over."""
        return ns_to_timedelta(self.period_ns)

    @property
    def emission_interval(self) -> timedelta:
        """emission_interval is `T = period / rate`, the time one request costs."""
        return ns_to_timedelta(self.emission_interval_ns)

    def args(self) -> tuple[str, ...]:
        return (str(self.burst), str(self.rate), format_seconds(self.period_ns))

    def spec(self) -> tuple[str, ...]:
        return ("GCRA", *self.args())

    @property
    def capacity(self) -> int:
        return self.burst

    @property
    def window(self) -> timedelta:
        # The time an empty bucket takes to fill again: `burst` requests per `burst * T`.
        return ns_to_timedelta(self.burst * self.emission_interval_ns)

    def __repr__(self) -> str:
        extra = f", name={self.name!r}" if self.name else ""
        return f"GCRA({self.burst}, {self.rate}, {format_seconds(self.period_ns)!r}{extra})"


class Window(_Limit):
    """Window allows at most `limit` requests in any `window` (FIXED, SLIDING or LOG).

    SLIDING is the default, as in the module. Raises InvalidLimit with the module's messages
    (the server's `rl.log-max-limit` cap on LOG is checked by the server).
    """

    __slots__ = ("algorithm", "limit", "window_ns")

    def __init__(
        self,
        limit: int,
        window: Seconds,
        algorithm: Algorithm | str = Algorithm.SLIDING,
        *,
        name: str | None = None,
    ) -> None:
        self.limit = positive(limit, "limit")
        self.window_ns = seconds_to_ns(window, "window")
        try:
            self.algorithm = Algorithm(algorithm.upper() if isinstance(algorithm, str) else algorithm)
        except ValueError:
            raise InvalidLimit(
                f"algorithm must be FIXED, SLIDING or LOG, not {algorithm!r}"
            ) from None
        self.name = _check_name(name)

    @property
    def window(self) -> timedelta:
        return ns_to_timedelta(self.window_ns)

    def args(self) -> tuple[str, ...]:
        return (str(self.limit), format_seconds(self.window_ns), self.algorithm.value)

    def spec(self) -> tuple[str, ...]:
        return ("WINDOW", *self.args())

    @property
    def capacity(self) -> int:
        return self.limit

    def __repr__(self) -> str:
        extra = f", name={self.name!r}" if self.name else ""
        return (
            f"Window({self.limit}, {format_seconds(self.window_ns)!r}, "
            f"Algorithm.{self.algorithm.name}{extra})"
        )


class Lease(_Limit):
    """Lease is a concurrency limit: at most `limit` slots held at once, each for `lease`.

    A holder renews before `lease` runs out (the client's `acquire` does it in the
    background); a crashed holder's slots come back when its lease ends. Raises InvalidLimit
    (the server's `rl.lease-max-limit` cap is checked by the server).
    """

    __slots__ = ("lease_ns", "limit")

    def __init__(self, limit: int, lease: Seconds, *, name: str | None = None) -> None:
        self.limit = positive(limit, "limit")
        self.lease_ns = seconds_to_ns(lease, "lease")
        self.name = _check_name(name)

    @property
    def lease(self) -> timedelta:
        """lease is the longest a holder keeps its slots without renewing."""
        return ns_to_timedelta(self.lease_ns)

    def args(self) -> tuple[str, ...]:
        return (str(self.limit), format_seconds(self.lease_ns))

    def spec(self) -> tuple[str, ...]:
        return ("LEASE", *self.args())

    @property
    def capacity(self) -> int:
        return self.limit

    @property
    def window(self) -> None:
        return None

    def __repr__(self) -> str:
        extra = f", name={self.name!r}" if self.name else ""
        return f"Lease({self.limit}, {format_seconds(self.lease_ns)!r}{extra})"


#: Any limit value.
Limit = Union[GCRA, Window, Lease]


def check_token(token: str | bytes) -> bytes:
    """check_token validates a lease token: 1 to 64 bytes (str is UTF-8 encoded)."""
    raw = token.encode() if isinstance(token, str) else token
    if not isinstance(raw, bytes) or not 1 <= len(raw) <= 64:
        raise InvalidLimit("token must be 1 to 64 bytes")
    return raw


# -- limits as users write them -------------------------------------------------------------

#: The units of the limit-string grammar, in seconds.
_UNITS = {
    "s": 1, "sec": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}

_LIMIT_PART = re.compile(
    r"\A\s*(?P<count>[0-9]+)\s*(?:/|per(?![a-z]))\s*(?P<mult>[0-9]+)?\s*(?P<unit>[a-z]+)\s*\Z",
    re.IGNORECASE,
)

#: What `parse_limits` accepts as its algorithm: a window algorithm, or "GCRA".
StringAlgorithm = Union[Algorithm, str]


def parse_limits(text: str, algorithm: StringAlgorithm = Algorithm.SLIDING) -> list[Limit]:
    """parse_limits reads limits written as users write them.

    Grammar (case-insensitive, spaces optional around the separators): one or more
    `<count> ("/" | "per") [<multiplier>] <unit>` joined by `;` or `,`, with units `s`,
    `sec`, `second(s)`, `m`, `min`, `minute(s)`, `h`, `hr`, `hour(s)`, `d`, `day(s)`:
    `"10/minute"`, `"100 per hour"`, `"5/10s"`, `"5 per 10 seconds"`,
    `"20/minute; 200 per hour"`.

    Each part becomes `Window(count, multiplier · unit, algorithm)` (SLIDING by default, the
    module's default window); `algorithm` may be "FIXED", "SLIDING", "LOG", or "GCRA" for
    `GCRA(count, count, window)` (a burst of `count`, refilled at `count` per window). The
    limits are unnamed: a Rule names them (`<rule>-<window seconds>s` when there are several).

    Raises InvalidLimit naming the bad part: an empty string, a part that does not follow the
    grammar, an unknown unit, a count outside 1..2^64 − 1 or a window outside
    1..315,360,000 s (the module's rules).
    """
    if not isinstance(text, str):
        raise InvalidLimit(f"a limit string must be a str, not {type(text).__name__}")
    alg = algorithm.upper() if isinstance(algorithm, str) else algorithm.value
    if alg not in ("GCRA", "FIXED", "SLIDING", "LOG"):
        raise InvalidLimit(f"algorithm must be FIXED, SLIDING, LOG or GCRA, not {algorithm!r}")
    parts = re.split(r"[;,]", text)
    if not text.strip():
        raise InvalidLimit("limit string is empty: write e.g. '10/minute' or '100 per hour'")
    out: list[Limit] = []
    for part in parts:
        shown = part.strip()
        m = _LIMIT_PART.match(part)
        if m is None:
            raise InvalidLimit(
                f"limit string {text!r}: {shown!r} is not '<count>/<unit>', "
                "'<count> per <unit>' or '<count>/<n><unit>' (e.g. '10/minute', '5/10s')"
            )
        unit = m.group("unit").lower()
        if unit not in _UNITS:
            raise InvalidLimit(
                f"limit string {text!r}: unknown unit {m.group('unit')!r} in {shown!r} "
                "(s, sec, second, m, min, minute, h, hr, hour, d, day)"
            )
        count = int(m.group("count"))
        mult = int(m.group("mult")) if m.group("mult") is not None else 1
        window = mult * _UNITS[unit]
        try:
            positive(count, "limit")
            if not 1 <= window <= MAX_SECONDS:
                raise InvalidLimit(f"window must be from 1 to {MAX_SECONDS} seconds")
            if alg == "GCRA":
                out.append(GCRA(count, count, window))
            else:
                out.append(Window(count, window, alg))
        except InvalidLimit as e:
            raise InvalidLimit(f"limit string {text!r}: {shown!r}: {e}") from None
    return out


def scaled(limit: Limit, fleet_size: int) -> Limit:
    """scaled is `limit` divided by a fleet of `fleet_size` processes, each count rounded down
    and at least 1 (a GCRA's burst and rate, a Window's or a Lease's limit); the name stays."""
    if fleet_size == 1:
        return limit
    if isinstance(limit, GCRA):
        return GCRA(
            max(1, limit.burst // fleet_size), max(1, limit.rate // fleet_size),
            Decimal(limit.period_ns) / NANOS_PER_SEC, name=limit.name,
        )
    if isinstance(limit, Window):
        return Window(
            max(1, limit.limit // fleet_size), Decimal(limit.window_ns) / NANOS_PER_SEC,
            limit.algorithm, name=limit.name,
        )
    return Lease(max(1, limit.limit // fleet_size), Decimal(limit.lease_ns) / NANOS_PER_SEC,
                 name=limit.name)
