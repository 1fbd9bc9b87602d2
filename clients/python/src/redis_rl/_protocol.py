"""Commands and replies, shared by the sync and the asyncio client.

The module's commands and the Lua fallback take the same arguments and give the same
replies; only the framing differs: `RL.GCRA key a b c …` becomes
`FCALL rl_gcra 1 key a b c …`, `RL.ALL n k1 … spec …` becomes `FCALL rl_all n k1 … spec …`.
"""

from __future__ import annotations

import enum
import math
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Union

from redis.exceptions import (
    NoPermissionError,
    OutOfMemoryError,
    RedisClusterException,
    SlotNotCoveredError,
)

from ._decision import Source
from ._limits import GCRA, U64_MAX, Lease, Limit, non_negative

__all__ = ["Mode", "PoolState", "library_code", "pool_state"]

Arg = Union[str, bytes, int]

#: The Functions library's name (`#!lua name=redis_rl`).
LIBRARY_NAME = "redis_rl"


class Mode(str, enum.Enum):
    """Mode chooses the module's commands, the Lua fallback, or detection (AUTO)."""

    AUTO = "auto"
    MODULE = "module"
    FALLBACK = "fallback"


_MODULE_COMMAND = {
    "gcra": "RL.GCRA",
    "window": "RL.WINDOW",
    "all": "RL.ALL",
    "refund": "RL.REFUND",
    "lease": "RL.LEASE",
    "release": "RL.RELEASE",
}


def frame(
    mode: Mode, op: str, keys: Sequence[str], args: Sequence[Arg], script: str | None = None
) -> list[Arg]:
    """frame builds the wire command for `op` in MODULE or FALLBACK mode. In FALLBACK mode
    `script` picks the scripts form where the server allows no Functions library: "eval"
    sends the text (`EVAL body numkeys key … rl_<op> arg …`), "evalsha" its SHA1 once the
    server is known to have it cached; None is `FCALL rl_<op> numkeys key … arg …`."""
    if mode is Mode.FALLBACK:
        if script == "evalsha":
            return ["EVALSHA", script_sha(), len(keys), *keys, f"rl_{op}", *args]
        if script == "eval":
            return ["EVAL", script_body(), len(keys), *keys, f"rl_{op}", *args]
        return ["FCALL", f"rl_{op}", len(keys), *keys, *args]
    if op == "all":
        return [_MODULE_COMMAND[op], len(keys), *keys, *args]
    return [_MODULE_COMMAND[op], *keys, *args]


#: The fallback's writing functions that may grow memory. Since library 1.3.0 they carry no
#: allow-oom flag, so the server refuses their FCALL whole when out of memory, and each has a
#: no-writes twin `rl_<op>_ro` (FCALL_RO) that answers what writes nothing: a denial, PEEK,
#: QUANTITY 0, an error, and the module's OOM error where the call would write
#: (docs/clients.md#out-of-memory).
TWIN_OPS = frozenset({"gcra", "window", "lease", "all"})


def twin_frame(op: str, keys: Sequence[str], args: Sequence[Arg]) -> list[Arg]:
    """twin_frame: `FCALL_RO rl_<op>_ro numkeys key … arg …`, the no-writes twin."""
    return ["FCALL_RO", f"rl_{op}_ro", len(keys), *keys, *args]


def is_oom(exc: BaseException) -> bool:
    """is_oom: the server is out of memory (`OOM command not allowed …`)."""
    return isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM")


def twin_missing(exc: BaseException) -> bool:
    """twin_missing: the twin cannot answer (a library older than 1.3.0 has none, or FCALL_RO
    is refused: unknown, or a NOPERM on the command): the writing function's OOM error stands.
    A NOPERM on one of the keys (the user's key patterns) is the server's answer to the call,
    reported as it is (functions_refused leaves it out)."""
    return is_missing_function(exc) or functions_refused(exc)


def check_command(
    limit: Limit,
    *,
    cost: int,
    peek: bool,
    max_wait: timedelta | float | None,
    force: bool,
) -> tuple[str, list[Arg]]:
    """check_command gives (op, arguments after the key) for one check."""
    non_negative(cost, "QUANTITY")
    if isinstance(limit, Lease):
        raise TypeError("a Lease is taken with acquire(), not check()")
    op = "gcra" if isinstance(limit, GCRA) else "window"
    args: list[Arg] = list(limit.args())
    if cost != 1:
        args += ["QUANTITY", cost]
    if peek:
        args.append("PEEK")
    if max_wait is not None:
        if not isinstance(limit, GCRA):
            raise TypeError("max_wait (MAXWAIT) is offered by GCRA limits only")
        args += ["MAXWAIT", max_wait_ms(max_wait)]
    if force:
        args.append("FORCE")
    return op, args


def max_wait_ms(max_wait: timedelta | float) -> int:
    """max_wait_ms gives MAXWAIT's whole milliseconds (rounded down). The module takes up to
    2^64 − 1 ms (beyond 2^64 ns it means any wait): a longer wait, `float("inf")` included,
    is sent as that most, which means the same, not as a number the module refuses."""
    if isinstance(max_wait, timedelta):
        ms = max_wait // timedelta(milliseconds=1)
    elif isinstance(max_wait, int):
        ms = max_wait * 1000
    else:
        seconds = float(max_wait)
        if math.isnan(seconds) or seconds < 0:
            raise ValueError("max_wait must be a non-negative duration")
        ms = U64_MAX if seconds * 1000 >= U64_MAX else int(seconds * 1000)
    if ms < 0:
        raise ValueError("max_wait must be a non-negative duration")
    return min(ms, U64_MAX)


def all_command(
    items: Sequence[tuple[str, Limit, int | None, bytes | None]],
    *,
    cost: int,
    peek: bool,
    force: bool,
) -> list[Arg]:
    """all_command gives the arguments of RL.ALL after the keys.

    Each item is (key, limit, per-limit cost or None, lease token or None). A per-limit
    cost different from `cost` is sent as the spec's `COST n`.
    """
    non_negative(cost, "QUANTITY")
    args: list[Arg] = []
    for key, limit, own_cost, token in items:
        args += limit.spec()
        if isinstance(limit, Lease):
            if token is None:
                raise TypeError(f"the Lease for {key!r} needs a token (tokens={{key: token}})")
            args.append(token)
        if own_cost is not None and own_cost != cost:
            args += ["COST", non_negative(own_cost, "COST")]
    if cost != 1:
        args += ["QUANTITY", cost]
    if peek:
        args.append("PEEK")
    if force:
        args.append("FORCE")
    return args


def cluster_route(client: Any, command: Arg, keys: Sequence[str]) -> dict[str, Any]:
    """cluster_route gives `execute_command`'s `target_nodes` for a call on a cluster client:
    the master of the keys' slot, from the client's slot table.

    redis-py finds the keys of a command with movable keys (FCALL, RL.ALL, and the module's
    commands, whose key-specs are declared with keywords) by asking a server `COMMAND GETKEYS`
    on every call: one more round trip per decision, to another node. The limiter knows its
    keys, so it routes the call itself; MOVED and ASK are still followed by redis-py. Keys
    in several slots raise redis-py's cross-slot error. An empty result (a slot the table
    does not cover yet) leaves the routing to redis-py.
    """
    slots = {client.keyslot(k) for k in keys}
    if len(slots) != 1:
        raise RedisClusterException(f"{text(command)} - all keys must map to the same key slot")
    try:
        return {"target_nodes": client.get_node_from_key(keys[0])}
    except SlotNotCoveredError:
        return {}


def ints(reply: Any) -> list[int]:
    """ints reads a flat integer reply."""
    return [int(x) for x in reply]


def source_of(mode: Mode) -> Source:
    return Source.FALLBACK if mode is Mode.FALLBACK else Source.MODULE


def is_unknown_command(exc: BaseException) -> bool:
    """is_unknown_command: the module is not (or no longer) loaded on this server."""
    msg = str(exc).lower()
    return "unknown command" in msg and "rl." in msg


def is_noscript(exc: BaseException) -> bool:
    """is_noscript: EVALSHA of a script the server does not have cached (a restart, a
    failover, SCRIPT FLUSH, a node added to a cluster)."""
    return str(exc).startswith("NOSCRIPT") or type(exc).__name__ == "NoScriptError"


def functions_refused(exc: BaseException) -> bool:
    """functions_refused: the server has no Functions (Redis 6.x) or does not let this
    client use them (FUNCTION / FCALL renamed away, or denied by ACL)."""
    msg = str(exc).lower()
    if "unknown command" in msg and ("fcall" in msg or "function" in msg):
        return True
    return is_command_denied(exc) or is_lua_off(exc)


def scripting_refused(exc: BaseException) -> bool:
    """scripting_refused: the EVAL, EVALSHA or SCRIPT just sent is not there (renamed away)
    or not allowed for this client by its ACL."""
    msg = str(exc).lower()
    return (
        ("unknown command" in msg and ("eval" in msg or "script" in msg))
        or is_command_denied(exc)
        or is_lua_off(exc)
    )


def is_lua_off(exc: BaseException) -> bool:
    """is_lua_off: the server runs no Lua at all (Valkey 9.1 with its `lua` engine module
    unloaded: "Could not find scripting engine 'lua'", "Engine 'lua' not found")."""
    msg = str(exc).lower()
    return "engine 'lua'" in msg or "scripting engine" in msg


def is_command_denied(exc: BaseException) -> bool:
    """is_command_denied: the ACL refuses the command itself (`NOPERM … run the 'eval'
    command`), not one of its keys (`NOPERM … access one of the keys`, a misuse to report
    as it is, not a server without scripting)."""
    return is_no_permission(exc) and "command" in str(exc).lower()


def is_unknown_renew(exc: BaseException) -> bool:
    """is_unknown_renew: the server's RL.LEASE (an older module or library) has no RENEW."""
    return "unknown argument 'renew'" in str(exc).lower()


def is_no_permission(exc: BaseException) -> bool:
    """is_no_permission: the user's ACL refuses the command (NOPERM)."""
    return isinstance(exc, NoPermissionError) or str(exc).startswith("NOPERM")


def is_missing_function(exc: BaseException) -> bool:
    """is_missing_function: the Functions library is not (or no longer) loaded."""
    msg = str(exc).lower()
    return "function not found" in msg or "no such function" in msg


def library_path() -> Path | None:
    """library_path finds the Lua library: the packaged copy (`redis_rl/lua/redis_rl.lua`,
    put there by the build from the repository's one copy), or, when the package runs from
    its source directory (an editable install, `clients/python/src/redis_rl`), the
    repository's `scripts/lua/redis_rl.lua` itself."""
    try:
        packaged = resources.files("redis_rl").joinpath("lua", "redis_rl.lua")
        if packaged.is_file():
            return Path(str(packaged))
    except (FileNotFoundError, ModuleNotFoundError):  # pragma: no cover
        pass
    here = Path(__file__).resolve().parent
    if here.parent.name == "src" and here.parent.parent.name == "python":
        candidate = here.parents[3] / "scripts" / "lua" / "redis_rl.lua"
        if candidate.is_file():
            return candidate
    return None


_code_lock = threading.Lock()
_code: str | None = None


def library_code() -> str:
    """library_code gives the Functions library's source; raises if it was not packaged."""
    global _code
    with _code_lock:
        if _code is None:
            path = library_path()
            if path is None:
                from ._policy import LimiterError

                raise LimiterError(
                    "the Lua fallback library (redis_rl/lua/redis_rl.lua) is not in this "
                    "installation: reinstall the package from the repository or its sdist"
                )
            _code = path.read_text(encoding="utf-8")
        return _code


@dataclass
class PoolState:
    """PoolState is what a client learned about one connection pool, once.

    `mode` is the resolved mode (MODULE or FALLBACK) once detected; `library_ready` says the
    Functions library was checked or loaded; `lease` whether RL.LEASE exists; `renew`
    False once the server said its RL.LEASE has no RENEW (None: not known yet); `scripts`
    that the fallback runs as scripts (the server allows no Functions library), and
    `script_cached` that the servers were sent the text (EVALSHA from then on).
    """

    mode: Mode | None = None
    library_ready: bool = False
    lease: bool | None = None
    renew: bool | None = None
    scripts: bool = False
    script_cached: bool = False
    #: EVAL is refused (renamed away, denied by ACL): the text goes by SCRIPT LOAD, calls by
    #: EVALSHA.
    eval_refused: bool = False
    #: EVALSHA is refused: every call sends the text (EVAL).
    evalsha_refused: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def script_form(self) -> str | None:
        """script_form is frame's `script` for this pool."""
        if not self.scripts:
            return None
        if self.eval_refused:
            return "evalsha"
        if self.evalsha_refused:
            return "eval"
        return "evalsha" if self.script_cached else "eval"


class ScriptStep(str, enum.Enum):
    """ScriptStep is how a scripts-mode call goes on after an error (script_recovery)."""

    RETRY = "retry"  # send the call again, in the pool's (updated) form
    LOAD = "load"  # SCRIPT LOAD the text on the key's node, then send it again by SHA1


def script_recovery(state: PoolState, form: str, exc: BaseException) -> ScriptStep | None:
    """script_recovery decides, from the error a scripts-mode call (`form` "eval" or
    "evalsha") got, how the call goes on, and records what the server refuses in `state`:
    NOSCRIPT (a node without the text: a restart, a failover, a node added to a Cluster)
    sends the text there (EVAL, or SCRIPT LOAD where EVAL is refused); a refused EVAL moves
    to SCRIPT LOAD + EVALSHA, a refused EVALSHA to EVAL. None: not a scripting problem (or
    nothing is left to try: the caller raises the one clear error when scripting_refused).

    Concurrent first calls (asyncio tasks, threads) are sent EVAL (or EVALSHA) together and
    refused together: the refusal another call recorded first sends this one again in the
    form that is left (by SHA1 after a refused EVAL: the first call's SCRIPT LOAD sent the
    text, or NOSCRIPT loads it here). Only a call that was refused and knows the other form
    is refused too (it saw it, or another call recorded it) gets None."""
    if form == "evalsha" and is_noscript(exc):
        if state.eval_refused:
            return ScriptStep.LOAD
        state.script_cached = False
        return ScriptStep.RETRY
    if not scripting_refused(exc):
        return None
    if form == "eval":
        first = not state.eval_refused
        state.eval_refused = True
        if state.evalsha_refused:
            return None
        return ScriptStep.LOAD if first else ScriptStep.RETRY
    if form == "evalsha":
        state.evalsha_refused = True
        return None if state.eval_refused else ScriptStep.RETRY
    return None


_states: weakref.WeakKeyDictionary[Any, PoolState] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def pool_state(client: Any) -> PoolState:
    """pool_state gives the shared state of `client`'s connection pool (or the cluster)."""
    owner = getattr(client, "connection_pool", None) or client
    with _states_lock:
        state = _states.get(owner)
        if state is None:
            state = PoolState()
            _states[owner] = state
        return state


#: What redis-py's COMMAND reply parser raises on the nil entry of a missing command.
PARSE_ERRORS = (TypeError, IndexError, AttributeError, KeyError)


def command_exists(reply: Any) -> bool:
    """command_exists reads a `COMMAND INFO name` reply (raw or parsed by redis-py).

    redis-py's parser fails on the nil a server sends for a missing command; callers treat
    PARSE_ERRORS from that call as "missing".
    """
    if reply is None:
        return False
    if isinstance(reply, dict):
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(x is not None for x in reply)
    return bool(reply)


def text(value: Any) -> str:
    """text decodes a bulk-string reply."""
    return value.decode() if isinstance(value, bytes) else str(value)


_body_sha: tuple[str, str] | None = None


def script_body() -> str:
    """script_body is the library's text as a script: without its first line (`#!lua
    name=redis_rl`), it dispatches on ARGV[1], the function's name (R-FB-4)."""
    return _script()[0]


def script_sha() -> str:
    """script_sha is the SHA1 the server knows the script by (EVALSHA)."""
    return _script()[1]


def _script() -> tuple[str, str]:
    global _body_sha
    if _body_sha is None:
        import hashlib

        body = library_code().split("\n", 1)[1]
        _body_sha = (body, hashlib.sha1(body.encode()).hexdigest())
    return _body_sha


_VERSION_LINE = re.compile(r"^local VERSION = '([^'\n]+)'$", re.M)

#: The library's configuration lines (`local LOG_MAX_LIMIT = 100000`), by rl_config name.
_CONFIG_LINES = {
    "log-max-limit": "LOG_MAX_LIMIT",
    "lease-max-limit": "LEASE_MAX_LIMIT",
    "all-max-keys": "ALL_MAX_KEYS",
}


def library_version(code: str) -> str:
    """library_version is the version the library's code declares (`local VERSION = '1.0.0'`),
    the one its `rl_version` function answers."""
    m = _VERSION_LINE.search(code)
    if m is None:
        raise ValueError("the packaged Lua library declares no VERSION")
    return m.group(1)


def _version_key(version: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return None


class LibraryPlan(str, enum.Enum):
    """LibraryPlan is what to do with one server's redis_rl library."""

    KEEP = "keep"  # the server runs our version
    LOAD = "load"  # not loaded: load ours
    REPLACE = "replace"  # an older (or unreadable) version: replace it with ours
    NEWER = "newer"  # a newer version, loaded by a newer client: leave it


def library_plan(server_version: str | None, ours: str) -> LibraryPlan:
    """library_plan compares the server's `rl_version` (None: no library) with ours."""
    if server_version is None:
        return LibraryPlan.LOAD
    if server_version == ours:
        return LibraryPlan.KEEP
    theirs, mine = _version_key(server_version), _version_key(ours)
    if theirs is not None and mine is not None and theirs > mine:
        return LibraryPlan.NEWER
    return LibraryPlan.REPLACE


def parse_config(reply: Any) -> dict[str, int]:
    """parse_config reads `FCALL_RO rl_config 0`: a flat list of names and values."""
    out: dict[str, int] = {}
    items = list(reply) if isinstance(reply, (list, tuple)) else []
    for name, value in zip(items[::2], items[1::2]):
        if isinstance(value, int) and not isinstance(value, bool):
            out[text(name)] = value
    return out


def configured_code(code: str, config: dict[str, int]) -> str:
    """configured_code is our library's code with the server's settings kept.

    An operator sets the fallback's limits (rl.log-max-limit, rl.lease-max-limit,
    rl.all-max-keys) by editing
    their lines and loading the text; replacing an older library keeps those values rather
    than resetting them to the defaults.
    """
    for name, variable in _CONFIG_LINES.items():
        value = config.get(name)
        if value is None or value < 1:
            continue
        code = re.sub(
            rf"^local {variable} = \d+$", f"local {variable} = {value}", code, count=1, flags=re.M
        )
    return code
