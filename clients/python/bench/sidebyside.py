"""Side by side: one FastAPI app and one Flask app, limited by redis_rl, by the anchors
(slowapi, Flask-Limiter: both on `limits`, Redis storage) and by nothing, two processes each.

    python clients/python/bench/sidebyside.py [--quick] [--readme] [--out FILE]
        [--frameworks fastapi,flask] [--limit 100] [--window 10] [--rounds 5] [--seconds 3]

Run it with the bench's own virtualenv, which `make bench` makes (target/bench-venv-sidebyside:
sidebyside/requirements.txt from PyPI, then this package from ./clients/python, not editable).
The apps are in sidebyside/apps.py: `GET /api/item`, limited to LIMIT requests per WINDOW
seconds per client IP as a fixed window by every limiter. FastAPI runs under uvicorn (no access
log), Flask under gunicorn (one sync worker); each configuration is two such processes on two
loopback ports, sharing a fresh redis-server of its own (started here on a free port, with the
module RL_MODULE for redis_rl, without it for the Lua fallback and the anchors). Every load is
made here with aiohttp over loopback, bounded in requests and time, spread evenly over both
processes. Each phase sends from client addresses of its own (127.1.x.y, loopback), so no phase
meets another's limit or deny cache. Measured, per framework:

* Redis commands per admitted and per denied request: one window's LIMIT requests from a
  fresh window, then requests past the limit, one at a time, with the server's MONITOR feed
  read: top-level commands (sent by the apps) and the inner calls of scripts and functions
  (the feed's `lua` lines) counted apart; INFO commandstats deltas (which count both) as a check;
* latency: each configuration in turn under the same closed-loop loads (CONCURRENCY requests
  in flight per process), ROUNDS rounds of SECONDS per load, the order rotated every round; p50
  and p99 as ratios to the app without a limiter under the same load. Two loads: under the
  limit (each client address sends at most half of it, so every request is admitted) and over
  it (one client address: nearly every request is denied);
* admitted per window: every limited configuration of the framework under load at once for
  2.5 windows; admitted requests grouped into windows by the gaps between them (a fixed window
  admits its LIMIT in a burst, then nothing until the next one);
* outages: a steady open-loop load (RATE requests/s, by default 0.8 × the limit's rate, so any
  answer but 200 is the outage's) while the redis-server is killed (SIGKILL), started again on
  its port, stopped (SIGSTOP: a hung server, connections accepted and never answered) and
  continued: status codes, time to answer, when the apps first send the new server a command,
  and the lines and tracebacks written to the apps' stderr. redis_rl runs with its default
  failure policy (`on_error="open"`) and with `"closed"`; the anchors with their defaults and
  with `in_memory_fallback_enabled`.

Every figure printed comes from the run. The script exits 1 if redis_rl admitted more than the
limit in a window, or if a phase could not be measured. `--readme` writes the tables into the
package README (between its sidebyside markers). Every process started is stopped by its PID
at the end, and the temporary directory removed, on error too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import aiohttp
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HERE = Path(__file__).resolve().parent
APPS = HERE / "sidebyside"
ROOT = HERE.parents[2]
README = HERE.parent / "README.md"
MARK_START, MARK_END = "<!-- sidebyside:start -->\n", "<!-- sidebyside:end -->"
ANCHOR = {"fastapi": "slowapi", "flask": "Flask-Limiter"}
SERVER = {"fastapi": "uvicorn", "flask": "gunicorn (sync)"}
#: Commands the bench itself sends to the servers; never counted.
OWN = {"info", "echo", "monitor", "client", "ping", "config"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(deadline: float, what: str, ok: Callable[[], bool]) -> None:
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- processes ------------------------------------------------------------------------------


class RedisServer:
    """RedisServer is a redis-server of the bench's own, on a free loopback port."""

    def __init__(self, tmp: Path, module: str | None) -> None:
        self.port = free_port()
        self.module = module
        self.dir = tmp / f"redis-{self.port}"
        self.dir.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False  # SIGSTOPped

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(self.dir), "--logfile", "redis.log"]
        if self.module:
            cmd += ["--loadmodule", self.module]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(time.monotonic() + 20, f"redis-server on {self.port}", self.answers)

    def answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server on {self.port} exited: {(self.dir / 'redis.log').read_text()}")
        try:
            return bool(self.client(timeout=0.5).ping())
        except redis.RedisError:
            return False

    def client(self, timeout: float = 5) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout,
                           retry=Retry(NoBackoff(), 0), decode_responses=True)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        if self.stopped:
            self.resume()
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@dataclass
class Config:
    """Config is one way of limiting the app: what the table calls it and how it is run."""

    name: str
    limiter: str  # BENCH_LIMITER: none, redis_rl, anchor
    module: bool = True  # its redis-server has the module loaded
    env: dict[str, str] = field(default_factory=dict)
    outage: bool = True  # run through the outages
    outage_only: bool = False  # and nothing else


class Fleet:
    """Fleet is a configuration's two app processes (and its redis-server)."""

    def __init__(self, framework: str, cfg: Config, tmp: Path, python: str, module: str,
                 limit: int, window: int) -> None:
        self.framework = framework
        self.cfg = cfg
        self.server: RedisServer | None = None
        if cfg.limiter != "none":
            self.server = RedisServer(tmp, module if cfg.module else None)
        self.ports = [free_port(), free_port()]
        self.logs = [tmp / f"{framework}-{cfg.name.replace(' ', '_').replace('=', '-')}-{i}.stderr".replace('"', "")
                     for i in range(2)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.python = python
        self.limit = limit
        self.window = window

    def start(self) -> None:
        if self.server is not None:
            self.server.start()
        env = dict(os.environ, BENCH_LIMITER=self.cfg.limiter, BENCH_LIMIT=str(self.limit),
                   BENCH_WINDOW=str(self.window), **self.cfg.env)
        if self.server is not None:
            env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{self.server.port}/0"
        for port, log in zip(self.ports, self.logs):
            if self.framework == "fastapi":
                cmd = [self.python, "-m", "uvicorn", "--factory", "apps:fastapi_app", "--app-dir", str(APPS),
                       "--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
            else:
                cmd = [self.python, "-m", "gunicorn", "--chdir", str(APPS), "-w", "1", "-b", f"127.0.0.1:{port}",
                       "--no-control-socket", "apps:flask_app()"]
            with open(log, "wb") as err:
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))

    def wait_ready(self) -> None:
        for port, proc, log in zip(self.ports, self.procs, self.logs):
            def up(port: int = port, proc: subprocess.Popen[bytes] = proc, log: Path = log) -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"app exited: {log.read_text()}")
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        return s.recv(16).startswith(b"HTTP/1.1 200")
                except OSError:
                    return False
            wait_until(time.monotonic() + 60, f"{self.framework} app on {port}", up)

    def log_lines(self) -> tuple[int, int]:
        """log_lines is (lines, tracebacks) written to both processes' stderr so far."""
        lines = tracebacks = 0
        for log in self.logs:
            text = log.read_text(errors="replace")
            lines += text.count("\n")
            tracebacks += text.count("Traceback (most recent call last)")
        return lines, tracebacks

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        if self.server is not None:
            self.server.stop()


# -- load -----------------------------------------------------------------------------------


@dataclass
class Sample:
    sent: float  # time.time() when sent
    latency: float  # seconds to the whole answer (or to the error)
    status: int  # HTTP status; 0: connection error, -1: no answer within the timeout
    port: int


class Clients:
    """Clients hands out loopback addresses (127.1.0.0 upwards) to send from: each is a client
    IP the limiters have not seen, so phases do not share a limit (or a deny cache)."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> str:
        self.n += 1
        return f"127.{1 + self.n // 65536}.{self.n // 256 % 256}.{self.n % 256}"


def session(timeout: float, ip: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=(ip, 0)),
                                 timeout=aiohttp.ClientTimeout(total=timeout))


async def request(s: aiohttp.ClientSession, port: int) -> Sample:
    sent = time.time()
    t0 = time.perf_counter()
    try:
        async with s.get(f"http://127.0.0.1:{port}/api/item") as r:
            await r.read()
            status = r.status
    except asyncio.TimeoutError:
        status = -1
    except aiohttp.ClientError:
        status = 0
    return Sample(sent, time.perf_counter() - t0, status, port)


async def closed_loop(ports: Sequence[int], per_port: int, seconds: float, cap: int, ip: Callable[[], str],
                      per_ip: int = 0) -> list[Sample]:
    """closed_loop keeps per_port requests in flight on each port for `seconds` (at most cap
    requests). All from one client address, or with `per_ip`, each worker from a new address
    after every per_ip requests (so that no client reaches a limit above per_ip)."""
    out: list[Sample] = []
    end = time.monotonic() + seconds
    shared = ip()

    async def worker(port: int) -> None:
        while time.monotonic() < end and len(out) < cap:
            async with session(30, ip() if per_ip else shared) as s:
                for _ in range(per_ip or cap):
                    if time.monotonic() >= end or len(out) >= cap:
                        break
                    out.append(await request(s, port))

    await asyncio.gather(*(worker(p) for p in ports for _ in range(per_port)))
    return out


async def sequential(ports: Sequence[int], n: int, ip: str) -> list[Sample]:
    async with session(30, ip) as s:
        return [await request(s, ports[i % len(ports)]) for i in range(n)]


async def open_loop(ports: Sequence[int], rate: float, seconds: float, timeout: float, ip: str,
                    events: Sequence[tuple[float, str, Callable[[], None]]]) -> tuple[list[Sample], dict[str, float]]:
    """open_loop sends `rate` requests/s for `seconds` whatever the answers, running each
    event (offset, name, action) in a thread at its offset; returns the samples and when each
    event's action started (time.time())."""
    marks: dict[str, float] = {}
    start = time.monotonic()

    async def run_events() -> None:
        for offset, name, action in events:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            marks[name] = time.time()
            await asyncio.to_thread(action)

    async with session(timeout, ip) as s:
        ev = asyncio.create_task(run_events())
        tasks: list[asyncio.Task[Sample]] = []
        for k in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))
            tasks.append(asyncio.create_task(request(s, ports[k % len(ports)])))
        samples = list(await asyncio.gather(*tasks))
        await ev
    return samples, marks


def pct(values: Sequence[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, max(0, round(q * len(v)) - 1))]


def statuses(samples: Sequence[Sample]) -> str:
    names = {0: "conn. error", -1: "no answer"}
    c = Counter(s.status for s in samples)
    return ", ".join(f"{n}× {names.get(st, str(st))}" for st, n in sorted(c.items(), key=lambda kv: -kv[1]))


# -- Redis commands -------------------------------------------------------------------------


class MonitorTap:
    """MonitorTap reads a server's MONITOR feed in a thread until a marker is seen."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(b"MONITOR\r\n")
        self.lines: list[str] = []
        self.done = threading.Event()
        self.marker = ""
        self.buf = b""
        first = self._line()
        if first != "+OK":
            raise RuntimeError(f"MONITOR answered {first!r}")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _line(self) -> str:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("MONITOR connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode(errors="replace")

    def _read(self) -> None:
        try:
            while True:
                line = self._line()
                self.lines.append(line)
                if self.marker and self.marker in line:
                    break
        except (OSError, RuntimeError):
            pass
        self.done.set()

    def until(self, marker: str, send: Callable[[], None]) -> list[str]:
        self.marker = marker
        send()
        if not self.done.wait(30):
            raise RuntimeError("MONITOR feed did not show the marker")
        return self.lines

    def close(self) -> None:
        self.sock.close()  # ends the reading thread


@dataclass
class Commands:
    top: Counter[str]  # top-level commands the apps sent, by name
    inner: Counter[str]  # calls made by scripts and functions, by name
    stats: int  # INFO commandstats delta, the bench's own commands left out
    n: int  # requests

    def counted(self) -> int:
        """counted is what MONITOR showed, less the names commandstats is read without."""
        return sum(v for c in (self.top, self.inner) for k, v in c.items() if k not in OWN)

    def per(self, c: Counter[str]) -> float:
        return sum(c.values()) / self.n

    def text(self) -> str:
        def names(c: Counter[str]) -> str:
            return ", ".join(f"{k} {v / self.n:.2f}" for k, v in c.most_common())
        s = f"{self.per(self.top):.2f}"
        if self.top:
            s += f" ({names(self.top)})"
        if self.inner:
            s += f" + {self.per(self.inner):.2f} inner ({names(self.inner)})"
        return s


def split_monitor(lines: Sequence[str], own: str, markers: Sequence[str]) -> list[tuple[Counter[str], Counter[str]]]:
    """split_monitor counts the feed's commands between markers (sent from `own`, the bench's
    address): [(top-level, inner)] per segment, by lower-case command name."""
    out: list[tuple[Counter[str], Counter[str]]] = []
    top: Counter[str] = Counter()
    inner: Counter[str] = Counter()
    want = list(markers)
    for line in lines:
        # +1733000000.123456 [0 127.0.0.1:5555] "RL.WINDOW" "k" ...   (scripts: [0 lua])
        try:
            head, rest = line.split("] ", 1)
            addr = head.rsplit(" ", 1)[1]
            name = rest.split('"', 2)[1].lower()
        except (IndexError, ValueError):
            continue
        if addr == own:
            if want and want[0] in rest:
                out.append((top, inner))
                top, inner = Counter(), Counter()
                want.pop(0)
            continue
        (inner if addr == "lua" else top)[name] += 1
    if want:
        raise RuntimeError(f"markers {want} not in the MONITOR feed")
    return out


def commandstats(c: redis.Redis) -> int:
    return sum(command_calls(c).values())


def command_calls(c: redis.Redis) -> Counter[str]:
    """command_calls is INFO commandstats: calls by command name, the bench's own left out."""
    stats = cast(dict[str, dict[str, Any]], c.info("commandstats"))
    calls: Counter[str] = Counter()
    for k, v in stats.items():
        name = k.removeprefix("cmdstat_").lower()
        if name.split("|")[0] not in OWN:  # subcommands are counted as "config|get"
            calls[name] = int(v["calls"])
    return calls


def mark(c: redis.Redis, text: str) -> None:
    """mark puts `text` in the MONITOR feed (from the bench's own connection)."""
    c.echo(text)


def count_commands(fleet: Fleet, limit: int, window: int, denied: int,
                   clients: Clients) -> tuple[Commands, Commands]:
    """count_commands sends `limit` requests from a fresh window (all admitted), then `denied`
    more (all denied), one at a time from one new client, and counts what the server executed
    for each part."""
    assert fleet.server is not None
    c = fleet.server.client()
    for _attempt in range(4):
        ip = clients.next()
        # Not across a window's end: redis_rl's windows are aligned to the epoch.
        left = window - time.time() % window
        if left < 0.5 + (limit + denied) * 0.02:
            time.sleep(left + 0.05)
        own = str(cast(dict[str, Any], c.client_info())["addr"])
        tap = MonitorTap(fleet.server.port)
        try:
            s0 = commandstats(c)
            adm = asyncio.run(sequential(fleet.ports, limit, ip))
            mark(c, "bench:mark:admitted")
            s1 = commandstats(c)
            den = asyncio.run(sequential(fleet.ports, denied, ip))
            s2 = commandstats(c)
            lines = tap.until("bench:mark:denied", lambda: mark(c, "bench:mark:denied"))
        finally:
            tap.close()
        if all(s.status == 200 for s in adm) and all(s.status == 429 for s in den):
            (t1, i1), (t2, i2) = split_monitor(lines, own, ["bench:mark:admitted", "bench:mark:denied"])
            return Commands(t1, i1, s1 - s0, limit), Commands(t2, i2, s2 - s1, denied)
        print(f"  ({fleet.cfg.name}: answers not all as expected, {statuses(adm)} / {statuses(den)}; again)",
              file=sys.stderr)
    raise RuntimeError(f"{fleet.framework} {fleet.cfg.name}: could not count the commands")


# -- phases ---------------------------------------------------------------------------------


@dataclass
class Latency:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    def p(self, q: float) -> float:
        return pct([s.latency for s in self.samples], q)

    def rate(self) -> float:
        return len(self.samples) / self.seconds if self.seconds else float("nan")

    def share(self, status: int) -> float:
        return sum(s.status == status for s in self.samples) / max(1, len(self.samples))


LOADS = ("under", "over")


def measure_latency(fleets: Sequence[Fleet], rounds: int, seconds: float, per_port: int, limit: int,
                    clients: Clients) -> dict[tuple[str, str], Latency]:
    """measure_latency: for each round, each configuration (the order rotated) under two
    closed-loop loads in turn: `under` the limit (each client address used for at most half
    the limit, so every request is admitted) and `over` it (one client address, so nearly all
    are denied). Keyed by (configuration, load)."""
    out = {(f.cfg.name, load): Latency() for f in fleets for load in LOADS}
    for r in range(rounds):
        order = list(fleets[r % len(fleets):]) + list(fleets[:r % len(fleets)])
        for f in order:
            for load in LOADS:
                per_ip = max(1, limit // 2) if load == "under" else 0
                t0 = time.monotonic()
                got = asyncio.run(closed_loop(f.ports, per_port, seconds, 200_000, clients.next, per_ip))
                lat = out[(f.cfg.name, load)]
                lat.seconds += time.monotonic() - t0
                lat.samples += got
                bad = [s for s in got if s.status != 200 and (load == "under" or s.status != 429)]
                if bad:
                    raise RuntimeError(f"{f.framework} {f.cfg.name}, {load} the limit: {statuses(bad)}")
    return out


@dataclass
class Windows:
    counts: list[tuple[int, int]]  # per window: admitted by each process
    requests: int

    def text(self, limit: int) -> str:
        return ", ".join(str(a + b) for a, b in self.counts) + f" (limit {limit})"


def group_windows(samples: Sequence[Sample], ports: Sequence[int], window: float) -> Windows:
    admitted = sorted((s for s in samples if s.status == 200), key=lambda s: s.sent)
    groups: list[list[Sample]] = []
    for s in admitted:
        if not groups or s.sent - groups[-1][-1].sent > window / 2:
            groups.append([])
        groups[-1].append(s)
    return Windows([(sum(s.port == ports[0] for s in g), sum(s.port == ports[1] for s in g)) for g in groups],
                   len(samples))


async def gather_loads(fleets: Sequence[Fleet], per_port: int, seconds: float,
                       clients: Clients) -> list[list[Sample]]:
    return list(await asyncio.gather(*(closed_loop(f.ports, per_port, seconds, 500_000, clients.next)
                                       for f in fleets)))


def measure_windows(fleets: Sequence[Fleet], window: int, per_port: int, clients: Clients) -> dict[str, Windows]:
    """measure_windows loads every limited configuration at once, one new client each, for
    2.5 windows."""
    # Start a quarter into an epoch window, so that neither kind of window (redis_rl's on the
    # epoch, limits' from its first hit) ends near the start or the end of the load.
    time.sleep((window * 0.25 - time.time() % window) % window)
    loads = asyncio.run(gather_loads(fleets, per_port, window * 2.5, clients))
    return {f.cfg.name: group_windows(got, f.ports, window) for f, got in zip(fleets, loads)}


@dataclass
class Period:
    name: str
    samples: list[Sample]
    seconds: float
    log: tuple[int, int] = (0, 0)  # (lines, tracebacks) written while this period lasted
    back: float | None = None  # after a restart: seconds until the apps used Redis again
    first: Counter[str] = field(default_factory=Counter)  # and the commands first seen
    watched: float = 0.0  # for how long it was watched

    def text(self) -> str:
        if not self.samples:
            return "no requests"
        lat = [s.latency * 1000 for s in self.samples]
        return f"{statuses(self.samples)}; {pct(lat, 0.5):.0f} / {max(lat):.0f} ms"

    def used_again(self) -> str:
        return f"after {self.back:.2f} s" if self.back is not None else f"not within {self.watched:.1f} s"


def measure_outage(fleet: Fleet, rate: float, down: float, pause: float, settle: float, ip: str) -> list[Period]:
    """measure_outage: `settle` s of normal load, the server killed for `down` s, started again
    (`settle` s), stopped (SIGSTOP) for `pause` s, continued (`settle` s)."""
    srv = fleet.server
    assert srv is not None
    logs: dict[str, tuple[int, int]] = {}

    def snap(name: str, action: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            logs[name] = fleet.log_lines()
            action()
        return run

    marks_up: list[float] = []
    back: list[float] = []
    first: list[Counter[str]] = []

    def watch(deadline: float) -> None:
        # When do the apps use the new server? Its first command that is not the bench's own
        # (nor a PING: a health check decides nothing).
        c = srv.client(timeout=0.2)
        while time.time() < deadline:
            try:
                calls = command_calls(c)
                if calls:
                    back.append(time.time())
                    first.append(calls)
                    return
            except redis.RedisError:
                pass
            time.sleep(0.02)

    watcher = threading.Thread(target=lambda: None)

    def restart() -> None:
        nonlocal watcher
        srv.start()
        marks_up.append(time.time())  # the "started again" period: from when it answers
        watcher = threading.Thread(target=watch, args=(marks_up[0] + settle - 0.1,), daemon=True)
        watcher.start()

    t_kill = settle
    t_restart = t_kill + down
    t_pause = t_restart + settle
    t_resume = t_pause + pause
    events = [(t_kill, "killed", snap("killed", srv.kill)),
              (t_restart, "restarted", restart),
              (t_pause, "paused", snap("paused", srv.pause)),
              (t_resume, "resumed", srv.resume)]
    samples, marks = asyncio.run(open_loop(fleet.ports, rate, t_resume + settle, pause + 15, ip, events))
    watcher.join(timeout=settle + 1)
    time.sleep(0.5)  # the last answers' log lines
    end = fleet.log_lines()
    bounds = [("before", 0.0), ("stopped", marks["killed"]), ("restarted", marks_up[0]),
              ("paused", marks["paused"]), ("resumed", marks["resumed"]), ("", float("inf"))]
    t0 = min(s.sent for s in samples)
    t1 = max(s.sent for s in samples)
    periods = [Period(name, [s for s in samples if lo <= s.sent < hi], min(hi, t1) - max(lo, t0))
               for (name, lo), (_, hi) in itertools.pairwise(bounds)]
    # Log lines: from the kill to the pause (stopped and restarted), from the pause to the end.
    by = {p.name: p for p in periods}
    by["stopped"].log = (logs["paused"][0] - logs["killed"][0], logs["paused"][1] - logs["killed"][1])
    by["paused"].log = (end[0] - logs["paused"][0], end[1] - logs["paused"][1])
    by["restarted"].back = back[0] - marks_up[0] if back else None
    by["restarted"].first = first[0] if first else Counter()
    by["restarted"].watched = settle - 0.1
    return periods


# -- the run --------------------------------------------------------------------------------


def configs(framework: str) -> list[Config]:
    anchor = ANCHOR[framework]
    return [
        Config("no limiter", "none", outage=False),
        Config("redis_rl", "redis_rl"),
        Config("redis_rl, Lua fallback", "redis_rl", module=False, outage=False),
        Config(anchor, "anchor", module=False),
        Config('redis_rl on_error="closed"', "redis_rl", env={"BENCH_ON_ERROR": "closed"}, outage_only=True),
        Config(f"{anchor}, in-memory fallback", "anchor", module=False, env={"BENCH_FALLBACK": "1"},
               outage_only=True),
    ]


@dataclass
class Result:
    framework: str
    commands: dict[str, tuple[Commands, Commands]]
    latency: dict[tuple[str, str], Latency]
    windows: dict[str, Windows]
    outages: dict[str, list[Period]]


def run_framework(framework: str, args: argparse.Namespace, tmp: Path, module: str) -> Result:
    clients = Clients()
    fleets = [Fleet(framework, c, tmp, sys.executable, module, args.limit, args.window) for c in configs(framework)]
    try:
        for f in fleets:
            f.start()
        for f in fleets:
            f.wait_ready()
        main = [f for f in fleets if not f.cfg.outage_only]
        limited = [f for f in main if f.server is not None]
        for f in fleets:  # warm up: connections, script loads, mode detection
            asyncio.run(sequential(f.ports, 4, clients.next()))
        print(f"{framework}: Redis commands", file=sys.stderr)
        commands = {f.cfg.name: count_commands(f, args.limit, args.window, args.denied, clients) for f in limited}
        print(f"{framework}: latency, {args.rounds} rounds of {args.seconds:g} s per load", file=sys.stderr)
        latency = measure_latency(main, args.rounds, args.seconds, args.concurrency, args.limit, clients)
        print(f"{framework}: admitted per window, {args.window * 2.5:g} s", file=sys.stderr)
        windows = measure_windows(limited, args.window, args.concurrency, clients)
        outages: dict[str, list[Period]] = {}
        for f in fleets:
            if f.cfg.outage:
                print(f"{framework}: outage, {f.cfg.name}", file=sys.stderr)
                outages[f.cfg.name] = measure_outage(f, args.rate, args.down, args.pause, args.settle,
                                                     clients.next())
    finally:
        for f in fleets:
            f.stop()
    for name, (adm, den) in commands.items():
        print(f"  {framework}, {name}: commandstats delta {adm.stats} / {den.stats} against MONITOR "
              f"{adm.counted()} / {den.counted()} (admitted / denied part; {', '.join(sorted(OWN))} left out)")
    for name, w in windows.items():
        print(f"  {framework}, {name}: admitted per window by process {w.counts}, of {w.requests} requests")
    for name, periods in outages.items():
        print(f"  {framework}, {name}: outage: " + "; ".join(f"{p.name} {p.seconds:.2f} s: {p.text()}" for p in periods))
        r = next(p for p in periods if p.name == "restarted")
        print(f"  {framework}, {name}: the restarted server used {r.used_again()}: {dict(r.first)}")
    return Result(framework, commands, latency, windows, outages)


def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}× ({x * 1000:.1f} ms)"


def render(results: Sequence[Result], args: argparse.Namespace, started: datetime, load: tuple[float, ...],
           load_end: tuple[float, ...]) -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fw = " and ".join(f"{r.framework.replace('fastapi', 'FastAPI').replace('flask', 'Flask')} under "
                      f"{SERVER[r.framework]}" for r in results)
    lines = [
        (f"From one run of `clients/python/bench/sidebyside.py`, {started:%Y-%m-%d %H:%M} UTC, on "
         f"{platform.machine()} with {os.cpu_count()} CPUs ({cpu}) shared with other work: load average "
         f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start, {load_end[0]:.2f} at the end. "
         f"Limit: {args.limit} requests per {args.window} s per client IP, a fixed window in every limiter. "
         f"{fw}, two processes per configuration, one redis-server {redis_version()} each."),
        "",
        "| framework | limiter | admitted per window | Redis commands per admitted request | per denied request |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        for name, w in r.windows.items():
            adm, den = r.commands[name]
            lines.append(f"| {r.framework} | {name} | {w.text(args.limit)} | {adm.text()} | {den.text()} |")
    lines += [
        "",
        (f"Latency, {args.concurrency} requests in flight per process, {args.rounds} rounds of "
         f"{args.seconds:g} s per configuration and load (the order rotated every round): as a ratio "
         "to the app without a limiter under the same load (its absolute time beside). Under the "
         "limit every request is admitted (a client address sends at most half the limit); over it, "
         "one client sends them all and nearly all are denied."),
        "",
        "| framework | limiter | under: p50 | under: p99 | under: requests/s | over: p50 | over: p99 | over: requests/s | over: denied |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        names = list(dict.fromkeys(name for name, _ in r.latency))
        for name in names:
            cells = []
            for kind in LOADS:
                lat, base = r.latency[(name, kind)], r.latency[("no limiter", kind)]
                cells += [ratio(lat.p(0.5), base.p(0.5)), ratio(lat.p(0.99), base.p(0.99)),
                          f"{lat.rate() / base.rate():.2f}×"]
            denied = r.latency[(name, "over")].share(429)
            lines.append(f"| {r.framework} | {name} | " + " | ".join(cells) + f" | {denied:.1%} |")
    lines += [
        "",
        (f"Outages, {args.rate:g} requests/s from one client (under the limit: every answer but 200 "
         f"is the outage's): the redis-server killed (SIGKILL) for {args.down:g} s, started again, "
         f"stopped (SIGSTOP, a hung server) for {args.pause:g} s, continued. Answers by when the "
         "request was sent, then the median / slowest time to answer; \"Redis used again\": from when "
         "the new server answered to the first command (not PING) the apps sent it; log lines (tracebacks) are "
         "what the two processes wrote to stderr from the kill to the SIGSTOP, and from the SIGSTOP "
         "to the end."),
        "",
        "| framework | limiter | Redis killed | started again | Redis used again | log lines (tracebacks) | Redis stopped | continued | log lines (tracebacks) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, periods in r.outages.items():
            by = {p.name: p for p in periods}
            lines.append(
                f"| {r.framework} | {name} | {by['stopped'].text()} | {by['restarted'].text()} "
                f"| {by['restarted'].used_again()} | {by['stopped'].log[0]} ({by['stopped'].log[1]}) | {by['paused'].text()} | {by['resumed'].text()} "
                f"| {by['paused'].log[0]} ({by['paused'].log[1]}) |")
    return "\n".join(lines)


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run: 20 per 2 s, 1 round of 1 s, short outages")
    p.add_argument("--frameworks", default="fastapi,flask")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--window", type=int, default=10, help="seconds")
    p.add_argument("--denied", type=int, default=50, help="requests past the limit counted for commands")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3, help="per configuration per latency round")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight per process")
    p.add_argument("--rate", type=float, default=0, help="requests/s through the outages (default: 0.8 × the limit's rate)")
    p.add_argument("--down", type=float, default=3, help="seconds Redis is killed")
    p.add_argument("--pause", type=float, default=3, help="seconds Redis is stopped (SIGSTOP)")
    p.add_argument("--settle", type=float, default=2, help="seconds before, and after each outage")
    p.add_argument("--out", help="also write the tables to this file")
    p.add_argument("--readme", action="store_true", help="write the tables into clients/python/README.md")
    args = p.parse_args()
    if args.quick:
        args.limit, args.window, args.denied, args.rounds, args.seconds = 20, 2, 20, 1, 1.0
        args.down, args.pause, args.settle = 1.5, 1.5, 1.0
    if not args.rate:
        args.rate = 0.8 * args.limit / args.window
    module = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_rl.so"))
    if not Path(module).exists():
        print(f"no module at {module}: build it with `cargo build --release`", file=sys.stderr)
        return 1
    started = datetime.now(timezone.utc)
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="rl-sidebyside-"))
    results = []
    try:
        for framework in [f.strip() for f in args.frameworks.split(",") if f.strip()]:
            results.append(run_framework(framework, args, tmp, module))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = render(results, args, started, load, os.getloadavg())
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.readme:
        old = README.read_text()
        a, b = old.index(MARK_START) + len(MARK_START), old.index(MARK_END)
        README.write_text(old[:a] + text + "\n" + old[b:])
    over = [(r.framework, name, w.counts) for r in results for name, w in r.windows.items()
            if name.startswith("redis_rl") and any(a + b > args.limit for a, b in w.counts)]
    if over:
        print(f"FAILED: redis_rl admitted more than the limit in a window: {over}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
