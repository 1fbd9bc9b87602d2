"""The real-server harness: redis-server processes on free loopback ports in temp dirs,
with and without the module, a three-master cluster, stopped by PID.

Every behaviour test runs in both modes: "module" against a server with the module loaded
(mode="auto" must pick the module) and "fallback" against a server without it (mode="auto"
must pick the Lua library, which the installed package carries). Nothing is skipped: a
missing module, library or command fails the run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import AsyncLimiter, Limiter, Mode

ROOT = Path(__file__).resolve().parents[3]
MODULE = Path(os.environ.get("RL_MODULE") or ROOT / "target" / "release" / "libredis_rl.so")
SERVER = os.environ.get("REDIS_SERVER", "redis-server")
START_DEADLINE = 20.0


def _server_major() -> int:
    """_server_major is the major version of $REDIS_SERVER (Redis 6.2, 7.0; Valkey 8, 9)."""
    out = subprocess.run([SERVER, "--version"], capture_output=True, text=True, timeout=30).stdout
    for word in out.split():
        if word.startswith("v="):
            return int(word[2:].split(".")[0])
    raise RuntimeError(f"cannot read the version of {SERVER}: {out!r}")


#: The server's major version: 6 has no Functions and none of the 7.0 switches below.
SERVER_MAJOR = _server_major()

#: Commands a Redis 6.x server does not have: renaming them away is a no-op there.
_NOT_ON_6 = {"FUNCTION", "FCALL", "FCALL_RO"}


def renamed_away(*names: str) -> tuple[str, ...]:
    """renamed_away is the `--rename-command NAME ""` words for `names`, leaving out the
    commands a 6.x server does not have (it refuses to rename them, and lacks them anyway)."""
    out: tuple[str, ...] = ()
    for name in names:
        if SERVER_MAJOR < 7 and name.upper() in _NOT_ON_6:
            continue
        out += ("--rename-command", name, "")
    return out

def free_port(cluster: bool = False) -> int:
    """free_port finds a free loopback port; for a cluster node, one ≤ 55535 whose bus port
    (+10000) is free too."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    import random

    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """RedisServer is one redis-server process; stop/restart keep its port and directory."""

    def __init__(
        self, *, module: bool = True, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> None:
        if module and not MODULE.exists():
            raise RuntimeError(f"no module at {MODULE}: run `cargo build --release`")
        self.module = module
        self.extra = extra
        self.env = None if env is None else {**os.environ, **env}
        self.dir = tempfile.mkdtemp(prefix="redis-rl-py-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        cluster = "--cluster-enabled" in extra
        for _ in range(5):
            self.port = free_port(cluster)
            if self._launch():
                return
        raise RuntimeError(f"redis-server did not start: {self.log()}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return Path(self.dir, "redis.log").read_text()
        except OSError:
            return ""

    def _launch(self) -> bool:
        cmd = [
            SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", self.dir, "--logfile", "redis.log",
        ]
        if SERVER_MAJOR >= 7:
            cmd += ["--enable-module-command", "yes", "--enable-debug-command", "yes"]
        if self.module:
            cmd += ["--loadmodule", str(MODULE)]
        cmd += list(self.extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                if "Address already in use" in self.log():
                    return False
                raise RuntimeError(f"redis-server exited: {self.log()}")
            if ping(self.port):
                return True
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer within {START_DEADLINE} s: {self.log()}")

    def stop(self) -> None:
        """stop ends the server with SIGTERM (SIGKILL after 10 s) and reaps it."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def start(self) -> None:
        """start runs the server again on the same port (after stop)."""
        assert self.proc is None
        if not self._launch():
            raise RuntimeError(f"port {self.port} taken while the server was down")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)


class FrozenClock:
    """FrozenClock is the repository's LD_PRELOAD clock shim (tests/support/clock_shim.c, the
    one the Rust tests use), built here: a server started with `env` reads its real-time
    clock as `freeze_at` sets it, exactly, until it is moved again."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-rl-clock-")
        self.shim = os.path.join(self.dir, "libclockshim.so")
        subprocess.run(
            [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", self.shim,
             str(ROOT / "tests" / "support" / "clock_shim.c")],
            check=True, capture_output=True, timeout=120,
        )
        self.file = os.path.join(self.dir, "offset")
        Path(self.file).write_bytes(bytes(16))

    @property
    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": self.shim, "RL_CLOCK_OFFSET_FILE": self.file}

    def freeze_at(self, ns: int) -> None:
        """freeze_at makes the server's clock read exactly `ns` since the epoch."""
        fd = os.open(self.file, os.O_WRONLY)
        try:
            os.pwrite(fd, max(ns, 1).to_bytes(8, "little"), 8)
        finally:
            os.close(fd)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """RedisCluster is three masters (each with the module, or none) joined by redis-cli;
    add_master, add_replica and fail_over change it under a running test."""

    def __init__(self, *, module: bool = True, extra: tuple[str, ...] = ()) -> None:
        self.nodes = [
            RedisServer(
                module=module,
                extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-node-timeout", "5000", *extra),
            )
            for _ in range(3)
        ]
        out = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )
        if out.returncode != 0:
            self.close()
            raise RuntimeError(f"cluster create failed: {out.stdout} {out.stderr}")
        deadline = time.monotonic() + 30
        for n in self.nodes:
            c = n.client()
            while True:
                info = c.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("cluster did not become ok")
                time.sleep(0.1)
            c.close()

    def add_master(self) -> RedisServer:
        """add_master starts one more master like the others, joins it with CLUSTER MEET
        (it serves no slot yet) and waits until every node knows it."""
        node = RedisServer(module=self.nodes[0].module, extra=self.nodes[0].extra)
        self.nodes.append(node)
        c = self.nodes[0].client()
        c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        c.close()
        new_id = node_id(node)
        deadline = time.monotonic() + 30
        for n in self.nodes:
            nc = n.client()
            while not self._knows(nc, new_id) or "cluster_state:ok" not in text_of(
                nc.execute_command("CLUSTER", "INFO")
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {node.port} did not join: {node.log()}")
                time.sleep(0.05)
            nc.close()
        return node

    @staticmethod
    def _knows(c: redis.Redis, node: str) -> bool:
        """_knows: `c`'s node lists `node` as a connected master (handshake over)."""
        for line in text_of(c.execute_command("CLUSTER", "NODES")).splitlines():
            fields = line.split()
            if fields[0] == node:
                return "master" in fields[2] and "handshake" not in fields[2] and fields[7] == "connected"
        return False

    def owner_of_slot(self, slot: int) -> RedisServer:
        for n in self.nodes:
            c = n.client()
            try:
                if self._serves(c, slot):
                    return n
            finally:
                c.close()
        raise RuntimeError(f"no node serves slot {slot}")

    @staticmethod
    def _serves(c: redis.Redis, slot: int) -> bool:
        me = text_of(c.execute_command("CLUSTER", "MYID"))
        for line in text_of(c.execute_command("CLUSTER", "NODES")).splitlines():
            fields = line.split()
            if fields[0] != me:
                continue
            for r in fields[8:]:
                if r.startswith("["):
                    continue
                lo, _, hi = r.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return True
        return False

    def move_slot(self, slot: int, to: RedisServer) -> None:
        """move_slot moves `slot`, with its keys (MIGRATE), to `to`, as `redis-cli --cluster
        reshard` does: SETSLOT IMPORTING / MIGRATING, MIGRATE, then SETSLOT NODE on every
        master; waits until every node sends the slot's keys to `to`."""
        src = self.owner_of_slot(slot)
        src_c, dst_c = src.client(), to.client()
        src_id, dst_id = node_id(src), node_id(to)
        dst_c.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src_c.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while True:
            keys = src_c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src_c.execute_command("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys)
        for n in [to, src, *[m for m in self.nodes if m is not to and m is not src]]:
            c = n.client()
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            c.close()
        src_c.close()
        dst_c.close()
        deadline = time.monotonic() + 30
        for n in self.nodes:
            c = n.client()
            while not self._knows_owner(c, slot, dst_id):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {n.port} does not see slot {slot} on {to.port}")
                time.sleep(0.05)
            c.close()

    @staticmethod
    def _knows_owner(c: redis.Redis, slot: int, owner_id: str) -> bool:
        for entry in c.execute_command("CLUSTER", "SLOTS"):
            lo, hi, primary = entry[0], entry[1], entry[2]
            if lo <= slot <= hi:
                return len(primary) > 2 and text_of(primary[2]) == owner_id
        return False

    def add_replica(self, of: RedisServer) -> RedisServer:
        """add_replica starts one more node like the others, joins it (add_master), makes it
        a replica of `of` with CLUSTER REPLICATE and waits until every node lists it as
        `of`'s replica and its link to `of` is up (the first sync done)."""
        node = self.add_master()
        master_id, me = node_id(of), node_id(node)
        c = node.client()
        c.execute_command("CLUSTER", "REPLICATE", master_id)
        c.close()
        deadline = time.monotonic() + 30
        for n in self.nodes:
            nc = n.client()
            while self._role(nc, me) != ("slave", master_id):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {n.port} does not see {node.port} as a replica: {node.log()}")
                time.sleep(0.05)
            nc.close()
        c = node.client()
        while c.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {node.port} did not sync: {node.log()}")
            time.sleep(0.05)
        c.close()
        return node

    @staticmethod
    def _role(c: redis.Redis, node: str) -> tuple[str, str]:
        """_role is how `c`'s node lists `node`: ("master" or "slave", its master's id or
        "-"); ("", "") when it does not list it."""
        for line in text_of(c.execute_command("CLUSTER", "NODES")).splitlines():
            fields = line.split()
            if fields[0] == node:
                return ("slave" if "slave" in fields[2].split(",") else "master"), fields[3]
        return "", ""

    #: How long a manual failover is given before TAKEOVER (Redis aborts one after 5 s).
    MANUAL_FAILOVER_DEADLINE = 15.0

    def fail_over(self, replica: RedisServer) -> str:
        """fail_over makes `replica` the master of its master's slots, as an operator does:
        once its copy has caught up (the two replication offsets equal), `CLUSTER FAILOVER`
        on it, and where that manual failover has not completed within
        MANUAL_FAILOVER_DEADLINE, `CLUSTER FAILOVER TAKEOVER` (no vote of the other masters
        needed). Returns once every node lists `replica` as a master with slots and its old
        master as `replica`'s replica, and the cluster is ok: "failover" or "takeover",
        whichever did it."""
        rid = node_id(replica)
        rc = replica.client()
        old_id = self._role(rc, rid)[1]
        old = next(n for n in self.nodes if node_id(n) == old_id)
        oc = old.client()
        deadline = time.monotonic() + 30
        while True:
            info = rc.info("replication")
            if info.get("master_link_status") == "up" and info["master_repl_offset"] == oc.info(
                "replication"
            )["master_repl_offset"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {replica.port} did not catch up: {info}")
            time.sleep(0.05)
        oc.close()
        how = "failover"
        rc.execute_command("CLUSTER", "FAILOVER")
        if not self._promoted(rid, old_id, self.MANUAL_FAILOVER_DEADLINE):
            how = "takeover"
            try:
                rc.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            except redis.ResponseError as e:  # the manual failover finished meanwhile
                if "replica" not in str(e).lower():
                    raise
            if not self._promoted(rid, old_id, 30):
                raise RuntimeError(f"replica {replica.port} not promoted: {replica.log()}")
        rc.close()
        return how

    def _promoted(self, rid: str, old_id: str, within: float) -> bool:
        """_promoted waits up to `within` seconds until every node lists `rid` as a master
        with slots and `old_id` as its replica, and says cluster_state:ok."""
        deadline = time.monotonic() + within
        for n in self.nodes:
            c = n.client()
            try:
                while True:
                    mine = [
                        line.split()
                        for line in text_of(c.execute_command("CLUSTER", "NODES")).splitlines()
                        if line.startswith(rid + " ")
                    ]
                    if (
                        mine
                        and self._role(c, rid)[0] == "master"
                        and len(mine[0]) > 8
                        and self._role(c, old_id) == ("slave", rid)
                        and "cluster_state:ok" in text_of(c.execute_command("CLUSTER", "INFO"))
                    ):
                        break
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
            finally:
                c.close()
        return True

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def node_id(node: RedisServer) -> str:
    c = node.client()
    try:
        return text_of(c.execute_command("CLUSTER", "MYID"))
    finally:
        c.close()


def command_stats(node: RedisServer) -> dict[str, int]:
    """command_stats is a server's `INFO commandstats` calls by command name
    (`function|load`, `evalsha`, …)."""
    c = node.client()
    try:
        return {k.removeprefix("cmdstat_").lower(): v["calls"] for k, v in c.info("commandstats").items()}
    finally:
        c.close()


# -- servers ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def module_server() -> Iterator[RedisServer]:
    s = RedisServer(module=True)
    yield s
    s.close()


@pytest.fixture(scope="session")
def plain_server() -> Iterator[RedisServer]:
    s = RedisServer(module=False)
    yield s
    s.close()


#: The modes the behaviour suite runs in: a 6.x server cannot load the module (it refuses
#: itself there, scripts/test-compat.sh checks that), so it runs the fallback only.
MODES = ["module", "fallback"] if SERVER_MAJOR >= 7 else ["fallback"]


def fallback_call(r: redis.Redis, op: str, keys: list[str], *args: Any) -> Any:
    """fallback_call runs the fallback's `rl_<op>` directly: FCALL, or on a 6.x server (no
    Functions) the script by EVAL."""
    from redis_rl._protocol import frame

    return r.execute_command(*frame(Mode.FALLBACK, op, keys, list(args), "eval" if SERVER_MAJOR < 7 else None))


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server(mode: str, request: pytest.FixtureRequest) -> RedisServer:
    """server is the module server in module mode, a server without the module in fallback."""
    s: RedisServer = request.getfixturevalue("module_server" if mode == "module" else "plain_server")
    return s


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


def retry_after_within(value: str, full: int, since: float) -> bool:
    """retry_after_within: a Retry-After header, for a wait of `full` seconds from an instant
    at or after `since` (time.monotonic()), lies between `full` less the time passed since and
    `full` (bounds on work: a slow host only makes the wait shorter)."""
    passed = time.monotonic() - since
    return full - passed - 1 <= int(value) <= full


def expected_mode(mode: str) -> Mode:
    return Mode.MODULE if mode == "module" else Mode.FALLBACK


class SyncAsAsync:
    """SyncAsAsync gives a sync Limiter the AsyncLimiter's awaitable surface, so every
    behaviour test runs against both implementations."""

    def __init__(self, limiter: Limiter) -> None:
        self.inner = limiter
        self.counters = limiter.counters
        self.prefix = limiter.prefix

    async def check(self, *a: Any, **kw: Any) -> Any:
        return self.inner.check(*a, **kw)

    async def check_all(self, *a: Any, **kw: Any) -> Any:
        return self.inner.check_all(*a, **kw)

    async def force(self, *a: Any, **kw: Any) -> Any:
        return self.inner.force(*a, **kw)

    async def refund(self, *a: Any, **kw: Any) -> Any:
        return self.inner.refund(*a, **kw)

    async def refund_decision(self, *a: Any, **kw: Any) -> Any:
        return self.inner.refund_decision(*a, **kw)

    async def release(self, *a: Any, **kw: Any) -> Any:
        return self.inner.release(*a, **kw)

    async def resolved_mode(self) -> Mode:
        return self.inner.mode

    async def refund_leftovers(self, **kw: Any) -> int:
        return self.inner.refund_leftovers(**kw)

    async def aclose(self) -> None:
        self.inner.close()

    def acquire(self, *a: Any, **kw: Any) -> Any:
        inner = self.inner

        class _Ctx:
            async def __aenter__(self) -> Any:
                self.held = inner.acquire(*a, **kw)
                return self.held

            async def __aexit__(self, *exc: object) -> None:
                self.held.release()

        return _Ctx()


@pytest.fixture(params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_limiter(
    server: RedisServer, flavor: str, prefix: str
) -> AsyncIterator[Any]:
    """make_limiter(**options) builds a limiter of the test's flavor on the test's server."""
    made: list[Any] = []

    def make(**options: Any) -> Any:
        options.setdefault("prefix", prefix)
        if flavor == "sync":
            lim: Any = SyncAsAsync(Limiter(server.client(), **options))
        else:
            lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), **options)
        made.append(lim)
        return lim

    yield make
    for lim in made:
        await close_limiter(lim)


async def close_limiter(lim: Any) -> None:
    """close_limiter closes a test's limiter (sync wrapped or async) and its Redis client."""
    await lim.aclose()
    inner = lim.inner if isinstance(lim, SyncAsAsync) else lim
    client = inner.redis
    if isinstance(client, aredis.Redis):
        await client.aclose()
    else:
        client.close()


@pytest.fixture
async def limiter(make_limiter: Any) -> Any:
    return make_limiter()


def run(coro: Any) -> Any:
    return asyncio.run(coro)
