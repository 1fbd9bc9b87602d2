#!/usr/bin/env python3
"""The Lua fallback next to the module: memory per key, memory per LOG request, server time.

Standalone (Python standard library and redis-cli only). Starts its own redis-server with the
release module loaded and the fallback library (scripts/lua/redis_rl.lua) loaded with
FUNCTION LOAD, then measures, for the module's command and the fallback's FCALL on distinct
keys in the same server:

* bytes per key: used_memory before and after creating N keys with one request each
  (100,000; 20,000 with BENCH_QUICK=1), divided by the number of keys;
* bytes per recorded request of a LOG key holding 10,000 requests, each at its own instant
  (one command per request): MEMORY USAGE of the key divided by the requests it holds;
* the server's own time per call (INFO commandstats, usec_per_call) over the key creation
  runs above, and on one hot key.

`python3 bench/fallback_bench.py` prints a Markdown table; `markdown()` returns the same text
(bench/bench.py calls it). Nothing here asserts: benchmarks are not tests.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "target", "release", "libredis_rl.so")
LIBRARY = os.path.join(ROOT, "scripts", "lua", "redis_rl.lua")
TIMEOUT_S = 600


def _quick():
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class _Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="redis-rl-fallback-bench-")
        self.port = _free_port()
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir,
                "--logfile", os.path.join(self.dir, "redis.log")]
        if os.path.exists(MODULE):
            argv += ["--loadmodule", MODULE]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.cli("PING") == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("redis-server did not start; see " + self.dir)
        with open(LIBRARY, "rb") as f:
            out = self.cli("-x", "FUNCTION", "LOAD", "REPLACE", stdin=f.read())
        if out != "redis_rl":
            self.stop()
            raise RuntimeError("FUNCTION LOAD failed: " + out)

    def cli(self, *args, stdin=None):
        out = subprocess.run(["redis-cli", "-p", str(self.port)] + list(args), input=stdin,
                             capture_output=True, check=True, timeout=TIMEOUT_S)
        return out.stdout.decode(errors="replace").strip()

    def pipe(self, payload):
        subprocess.run(["redis-cli", "-p", str(self.port), "--pipe"], input=payload,
                       capture_output=True, check=True, timeout=TIMEOUT_S)

    def info(self, section):
        fields = {}
        for line in self.cli("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        return fields

    def has(self, command):
        return self.cli("COMMAND", "INFO", command).strip() not in ("", "(nil)")

    def stop(self):
        try:
            self.cli("SHUTDOWN", "NOSAVE")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _usec_per_call(server, stat):
    stats = {k.lower(): v for k, v in server.info("commandstats").items()}
    for part in stats.get("cmdstat_" + stat, "").split(","):
        if part.startswith("usec_per_call="):
            return float(part.split("=", 1)[1])
    return None


def _per_key(server, make, stat, n):
    """Bytes per key and server µs per call over n fresh keys."""
    server.cli("FLUSHALL")
    time.sleep(0.2)
    server.cli("CONFIG", "RESETSTAT")
    before = int(server.info("memory")["used_memory"])
    chunk = 20_000
    for start in range(0, n, chunk):
        server.pipe(b"".join(make("k:%d" % i) for i in range(start, min(start + chunk, n))))
    keys = int(server.cli("DBSIZE"))
    after = int(server.info("memory")["used_memory"])
    usec = _usec_per_call(server, stat)
    server.cli("FLUSHALL")
    return (after - before) / max(keys, 1), keys, usec


def _hot(server, make, stat, n):
    """Server µs per call on one key (a limiter with a large capacity, so calls are admitted)."""
    server.cli("FLUSHALL")
    server.cli("CONFIG", "RESETSTAT")
    server.pipe(b"".join(make("hot") for _ in range(n)))
    usec = _usec_per_call(server, stat)
    server.cli("FLUSHALL")
    return usec


def _log_requests(server, command, key, requests):
    """MEMORY USAGE of a LOG key after `requests` requests, each its own command."""
    lines = "\n".join(command.format(key=key, n=requests) for _ in range(requests))
    server.cli(stdin=lines.encode())
    total = int(server.cli("MEMORY", "USAGE", key, "SAMPLES", "0"))
    return total


def measure():
    """Runs the measurements; returns a dict of results."""
    n = 20_000 if _quick() else 100_000
    hot_n = 20_000 if _quick() else 50_000
    server = _Server()
    try:
        version = server.info("server").get("redis_version", "?")
        module = server.has("RL.GCRA")
        lease = server.has("RL.LEASE")
        cases = [
            ("GCRA", lambda k: _resp("RL.GCRA", k, 100, 10, 3600), "rl.gcra",
             lambda k: _resp("FCALL", "rl_gcra", 1, k, 100, 10, 3600), module),
            ("WINDOW FIXED", lambda k: _resp("RL.WINDOW", k, 100, 3600, "FIXED"), "rl.window",
             lambda k: _resp("FCALL", "rl_window", 1, k, 100, 3600, "FIXED"), module),
            ("WINDOW SLIDING", lambda k: _resp("RL.WINDOW", k, 100, 3600, "SLIDING"), "rl.window",
             lambda k: _resp("FCALL", "rl_window", 1, k, 100, 3600, "SLIDING"), module),
            ("WINDOW LOG (1 request)", lambda k: _resp("RL.WINDOW", k, 100, 3600, "LOG"), "rl.window",
             lambda k: _resp("FCALL", "rl_window", 1, k, 100, 3600, "LOG"), module),
            ("LEASE (1 lease)", lambda k: _resp("RL.LEASE", k, 100, 3600, "t"), "rl.lease",
             lambda k: _resp("FCALL", "rl_lease", 1, k, 100, 3600, "t"), lease),
        ]
        rows = []
        for label, mod_make, mod_stat, fb_make, has_module in cases:
            if has_module:
                m_bytes, m_keys, m_usec = _per_key(server, mod_make, mod_stat, n)
            else:
                m_bytes = m_keys = m_usec = None
            f_bytes, f_keys, f_usec = _per_key(server, fb_make, "fcall", n)
            print(f"fallback bench: {label}: module {m_bytes} B/key, fallback {f_bytes:.1f} B/key",
                  file=sys.stderr)
            rows.append({"label": label, "module_bytes": m_bytes, "fallback_bytes": f_bytes,
                         "keys": f_keys, "module_usec": m_usec, "fallback_usec": f_usec})
        hot_cases = [
            ("GCRA, one hot key", lambda k: _resp("RL.GCRA", k, 10**9, 10**9, 1), "rl.gcra",
             lambda k: _resp("FCALL", "rl_gcra", 1, k, 10**9, 10**9, 1), module),
            ("SLIDING, one hot key", lambda k: _resp("RL.WINDOW", k, 10**9, 60), "rl.window",
             lambda k: _resp("FCALL", "rl_window", 1, k, 10**9, 60), module),
            ("LOG (limit 100000, 60 s), one hot key",
             lambda k: _resp("RL.WINDOW", k, 100000, 60, "LOG"), "rl.window",
             lambda k: _resp("FCALL", "rl_window", 1, k, 100000, 60, "LOG"), module),
        ]
        hot = []
        for label, mod_make, mod_stat, fb_make, has_module in hot_cases:
            m_usec = _hot(server, mod_make, mod_stat, hot_n) if has_module else None
            f_usec = _hot(server, fb_make, "fcall", hot_n)
            hot.append({"label": label, "module_usec": m_usec, "fallback_usec": f_usec})
        requests = 10_000
        server.cli("FLUSHALL")
        log = []
        if module:
            total = _log_requests(server, "RL.WINDOW {key} {n} 3600 LOG", "mlog", requests)
            left = int(server.cli("RL.WINDOW", "mlog", str(requests), "3600", "LOG",
                                  "QUANTITY", "0").split()[2])
            log.append(("module (RL.WINDOW … LOG)", total, requests - left))
        total = _log_requests(server, "FCALL rl_window 1 {key} {n} 3600 LOG", "flog", requests)
        left = int(server.cli("FCALL", "rl_window", "1", "flog", str(requests), "3600", "LOG",
                              "QUANTITY", "0").split()[2])
        entries = (int(server.cli("STRLEN", "flog")) - 31) // 10
        log.append(("fallback (FCALL rl_window … LOG)", total, requests - left))
        server.cli("FLUSHALL")
        return {"version": version, "keys": n, "hot_calls": hot_n, "rows": rows, "hot": hot,
                "log": log, "log_entries": entries, "requests": requests}
    finally:
        server.stop()


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def markdown(results=None):
    """The fallback's memory and time next to the module's, as Markdown."""
    r = results or measure()
    lines = []
    w = lines.append
    w("## The Lua fallback next to the module")
    w("")
    w(f"Measured by `bench/fallback_bench.py` on redis-server {r['version']}: the module's "
      "command and the fallback's `FCALL` on distinct keys in one server. Bytes per key: "
      f"`used_memory` delta over {r['keys']:,} fresh keys, one request each. Server µs/call: "
      "`INFO commandstats` `usec_per_call` over the same calls (for the fallback, the whole "
      "`FCALL`).")
    w("")
    w("| key | module bytes/key | fallback bytes/key | module µs/call | fallback µs/call |")
    w("|---|---:|---:|---:|---:|")
    for row in r["rows"]:
        w(f"| {row['label']} | {_fmt(row['module_bytes'], '.1f')} | "
          f"{_fmt(row['fallback_bytes'], '.1f')} | {_fmt(row['module_usec'], '.2f')} | "
          f"{_fmt(row['fallback_usec'], '.2f')} |")
    for row in r["hot"]:
        w(f"| {row['label']} ({r['hot_calls']:,} calls) | | | "
          f"{_fmt(row['module_usec'], '.2f')} | {_fmt(row['fallback_usec'], '.2f')} |")
    w("")
    w(f"Memory per recorded request: one LOG key, {r['requests']:,} requests, one command each "
      f"(the fallback stored them as {r['log_entries']:,} entries: requests at the same "
      "microsecond share one).")
    w("")
    w("| LOG key | requests held | `MEMORY USAGE` bytes | bytes per request |")
    w("|---|---:|---:|---:|")
    for label, total, count in r["log"]:
        w(f"| {label} | {count:,} | {total:,} | {total / max(count, 1):.1f} |")
    return "\n".join(lines)


def main():
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        sys.exit("redis-server and redis-cli are needed")
    if not os.path.exists(MODULE):
        print("note: no module build (cargo build --release): measuring the fallback only",
              file=sys.stderr)
    print(markdown())


if __name__ == "__main__":
    main()
