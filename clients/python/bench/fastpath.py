"""Benchmark of the local fast path: N client processes hammer one key above its limit.

    python clients/python/bench/fastpath.py [--procs 4] [--seconds 3] [--batch 10]
        [--modes module,fallback] [--out FILE] [--readme]

Starts its own redis-server with the module (RL_MODULE, default target/release/
libredis_rl.so) on a free loopback port, unless --redis-url is given. Each process runs a
sync Limiter in a tight loop on one GCRA key for the given time, three ways: no fast path,
the deny cache, and the deny cache with batching; with the module's commands and with the
Lua fallback (mode="fallback": the Functions library, on the same server). Reports, per
configuration: requests admitted against what the limit allows over the run (burst + rate ×
elapsed), Redis calls per admitted request, and decisions per second per process. Batching
must never admit more than the limit: the script exits 1 if any configuration does.
`--readme` writes the table into the package README (between its bench markers).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from redis_rl import GCRA, Limiter

ROOT = Path(__file__).resolve().parents[3]
PERIOD = 1
#: (burst, rate per second): a low limit (most requests denied), a higher one, both far below
#: what the processes ask for; and one the processes cannot reach (where batching pays).
SCENARIOS = [(20, 100), (200, 2000), (1000, 100_000)]


def worker(url: str, key: str, limit: tuple[int, int], options: dict[str, Any], start_at: float,
           seconds: float, out: Any) -> None:
    lim = Limiter(redis.Redis.from_url(url), **options)
    g = GCRA(limit[0], limit[1], PERIOD)
    while time.time() < start_at:
        time.sleep(0.0005)
    t0 = time.time()
    end = t0 + seconds
    decisions = admitted = 0
    while time.time() < end:
        if lim.check(key, g).allowed:
            admitted += 1
        decisions += 1
    t1 = time.time()
    lim.close()  # refunds held batch units
    snap = lim.counters.snapshot()
    out.put({"t0": t0, "t1": t1, "decisions": decisions, "admitted": admitted, **snap})


def run(url: str, procs: int, seconds: float, limit: tuple[int, int], options: dict[str, Any]) -> dict[str, float]:
    key = f"bench:{uuid.uuid4().hex[:8]}"
    q: Any = mp.Queue()
    start_at = time.time() + 0.5
    ps = [mp.Process(target=worker, args=(url, key, limit, options, start_at, seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    results = [q.get(timeout=seconds + 60) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    admitted = sum(r["admitted"] for r in results)
    calls = sum(r["redis_calls"] for r in results)
    bound = limit[0] + int((t1 - t0) * limit[1] / PERIOD) + 1
    return {
        "admitted": admitted,
        "bound": bound,
        "calls": calls,
        "calls_per_admitted": calls / admitted if admitted else float("inf"),
        "decisions_per_s": sum(r["decisions"] / (r["t1"] - r["t0"]) for r in results) / procs,
        "local_denials": sum(r["denied_locally"] for r in results),
        "local_admissions": sum(r["allowed_locally"] for r in results),
        "refunded": sum(r["refunded"] for r in results),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_FASTPATH_SECONDS", 3)))
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--redis-url")
    p.add_argument("--modes", default="module,fallback", help="comma-separated: module, fallback")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--readme", action="store_true", help="write the table into clients/python/README.md")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]

    server = None
    tmp = None
    url = args.redis_url
    if url is None:
        module = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_rl.so"))
        tmp = tempfile.mkdtemp(prefix="rl-bench-py-")
        port = free_port()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", tmp, "--logfile", "redis.log", "--loadmodule", module],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.time() + 20
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
    configs = [
        ("no fast path", {"deny_cache": False}),
        ("deny cache", {}),
        (f"deny cache + batch {args.batch}", {"batch": args.batch, "batch_hold": 0.1}),
    ]
    rows = []
    ok = True
    try:
        for mode in modes:
            for limit in SCENARIOS:
                for name, options in configs:
                    r = run(url, args.procs, args.seconds, limit, {**options, "mode": mode})
                    ok &= r["admitted"] <= r["bound"]
                    rows.append((mode, f"burst {limit[0]}, {limit[1]}/s", name, r))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"{args.procs} processes on one GCRA key for {args.seconds:g} s each configuration, each "
        f"process a sync Limiter in a tight loop (far above the limit); redis-server with the "
        f"module on loopback; {os.cpu_count()} CPUs shared by everything.",
        "",
        "| answered by | limit | configuration | admitted / limit allows | Redis calls per admitted | decisions/s per process | local denials | local admissions | refunded |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, lim_name, name, r in rows:
        lines.append(
            f"| {mode} | {lim_name} | {name} | {r['admitted']:.0f} / {r['bound']:.0f} | {r['calls_per_admitted']:.2f} | "
            f"{r['decisions_per_s']:,.0f} | {r['local_denials']:,.0f} | {r['local_admissions']:,.0f} | "
            f"{r['refunded']:.0f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.readme:
        readme = Path(__file__).resolve().parents[1] / "README.md"
        start, end = "<!-- bench:start -->\n", "<!-- bench:end -->"
        old = readme.read_text()
        a, b = old.index(start) + len(start), old.index(end)
        readme.write_text(old[:a] + text + "\n" + old[b:])
    if not ok:
        print("FAILED: a configuration admitted more than the limit allows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
