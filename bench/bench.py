#!/usr/bin/env python3
"""`make bench`: speed and memory of redis-rl next to INCR, Lua limiters, PING and the floor.

Starts its own redis-server with the release module and the floor module (`bench/floor/floor.c`:
the least any native GCRA limiter must do per call; built by `cost.py` into target/bench/),
pinned to CPU 0 with taskset when there are at least two cores (redis-benchmark runs on CPU 1),
then:

* speed: redis-benchmark (50 clients) for every command, without pipelining and with -P 16,
  on random keys (-r 100000) and on one hot key, in at least three rounds of shuffled order;
  reports the median ops/s, the median per-round ratios to INCR and to the floor (FL.GCRA)
  under the same settings, p50/p99 latency, and the server's own microseconds per call from
  INFO commandstats; then, for INCR, SET PX and every RL command, the ratio to the floor
  from runs next to each other in time (groups of floor, command, command, floor);
* memory: bytes per key from used_memory over N keys (1,000,000; 100,000 with BENCH_QUICK)
  for each limiter and the Lua baselines, and bytes per recorded request of a LOG key with
  10,000 requests against a sorted set with the same;
* cost: instructions per call under callgrind (`cost.py`, also `make bench-cost`), skipped
  with a note when valgrind is not installed.

Writes BENCHMARKS.md and prints the same tables. Benchmarks are not tests: nothing here
asserts. Only the Python standard library, redis-cli, redis-benchmark, gcc and valgrind are
used.
"""

import datetime
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ from importing cost.py
import cost  # noqa: E402
import fallback_bench  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "target", "release", "libredis_rl.so")
LUA_DIR = os.path.join(ROOT, "bench", "lua")
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
ROUNDS = 3
CLIENTS = 50
KEYSPACE = 100_000
N_PLAIN = 20_000 if QUICK else 100_000  # requests per run without pipelining
N_PIPE = 50_000 if QUICK else 400_000  # requests per run with -P 16
MEM_KEYS = 100_000 if QUICK else 1_000_000
LOG_REQUESTS = 10_000
TIMEOUT_S = 120  # any single child process
FLOOR = "floor: FL.GCRA (burst 100, 10/s)"
QUADS = 3 if QUICK else 4  # floor/command/command/floor groups per command, paired throughput
# RL.GCRA has a throughput target against the floor; on this shared machine one group's ratio
# varies by about ±5 %, so its median needs more groups than the others' to be read to ±0.02.
QUADS_GCRA = 4 if QUICK else 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpu, argv):
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(cpu)] + argv
    return argv


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="redis-rl-bench-")
        self.port = free_port()
        argv = pinned(0, [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"),
            "--loadmodule", MODULE, "--loadmodule", cost.floor_module(),
        ])
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.cli("PING") == "PONG":
                    return
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        self.stop()
        sys.exit("redis-server did not start; see " + self.dir)

    def cli(self, *args, stdin=None):
        out = subprocess.run(["redis-cli", "-p", str(self.port)] + list(args), input=stdin,
                             capture_output=True, check=True, timeout=TIMEOUT_S)
        return out.stdout.decode(errors="replace").strip()

    def info(self, section):
        fields = {}
        for line in self.cli("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        return fields

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


def load_scripts(server):
    shas = {}
    for name in ("fixed_window", "gcra", "sliding_log_zset", "sliding_window_two_keys"):
        with open(os.path.join(LUA_DIR, name + ".lua")) as f:
            shas[name] = server.cli("SCRIPT", "LOAD", f.read())
    return shas


def commands(shas):
    """(label, argv with KEY placeholder, commandstats name)."""
    return [
        ("PING", ["PING"], "ping"),
        ("INCR", ["INCR", "KEY"], "incr"),
        ("SET key v PX 60000", ["SET", "KEY", "v", "PX", "60000"], "set"),
        (FLOOR, ["FL.GCRA", "KEY", "100", "10", "1"], "fl.gcra"),
        ("RL.GCRA (burst 100, 10/s)", ["RL.GCRA", "KEY", "100", "10", "1"], "rl.gcra"),
        ("RL.WINDOW FIXED (100/60 s)", ["RL.WINDOW", "KEY", "100", "60", "FIXED"], "rl.window"),
        ("RL.WINDOW SLIDING (100/60 s)", ["RL.WINDOW", "KEY", "100", "60", "SLIDING"], "rl.window"),
        ("RL.WINDOW LOG (100/60 s)", ["RL.WINDOW", "KEY", "100", "60", "LOG"], "rl.window"),
        ("CL.THROTTLE (max_burst 99, 10/s)", ["CL.THROTTLE", "KEY", "99", "10", "1"], "cl.throttle"),
        ("Lua fixed window (INCR+EXPIRE)", ["EVALSHA", shas["fixed_window"], "1", "KEY", "100", "60"], "evalsha"),
        ("Lua GCRA (TIME+GET+PSETEX)", ["EVALSHA", shas["gcra"], "1", "KEY", "100", "10", "1"], "evalsha"),
        ("Lua sliding log (sorted set)", ["EVALSHA", shas["sliding_log_zset"], "1", "KEY", "100", "60"], "evalsha"),
        ("Lua sliding window (two keys)", ["EVALSHA", shas["sliding_window_two_keys"], "1", "KEY", "100", "60"], "evalsha"),
    ]


def bench_one(server, index, label, argv, stat, pipeline, random_keys):
    # Keys of one length for every command (hashing a longer key costs more).
    prefix = "b:%02d:" % index
    key = prefix + ("__rand_int__" if random_keys else "hot")
    args = [key if a == "KEY" else a for a in argv]
    n = N_PIPE if pipeline > 1 else N_PLAIN
    cmd = pinned(1, ["redis-benchmark", "-p", str(server.port), "-c", str(CLIENTS), "-n", str(n),
                     "-P", str(pipeline), "--csv"])
    if random_keys:
        cmd += ["-r", str(KEYSPACE)]
    server.cli("CONFIG", "RESETSTAT")
    out = subprocess.run(cmd + args, capture_output=True, check=True, timeout=TIMEOUT_S).stdout.decode()
    row = None
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0] not in ("test", ""):
            row = cells
    if row is None:
        raise RuntimeError("no result from redis-benchmark for " + label + ":\n" + out)
    rps, p50, p99 = float(row[1]), float(row[4]), float(row[6])
    info = {k.lower(): v for k, v in server.info("commandstats").items()}
    stats = info.get("cmdstat_" + stat, "")
    usec = None
    for part in stats.split(","):
        if part.startswith("usec_per_call="):
            usec = float(part.split("=", 1)[1])
    return {"rps": rps, "p50": p50, "p99": p99, "usec": usec}


def speed(server, shas):
    cmds = commands(shas)
    configs = [(p, r) for p in (1, 16) for r in (True, False)]
    runs = {}  # (label, p, r) -> list of result dicts with "ratio"
    for rnd in range(ROUNDS):
        order = [(i, c, p, r) for i, c in enumerate(cmds) for (p, r) in configs]
        random.shuffle(order)
        results = {}
        for i, (label, argv, stat), p, r in order:
            results[(label, p, r)] = bench_one(server, i, label, argv, stat, p, r)
            server.cli("FLUSHALL")
        for (label, p, r), res in results.items():
            res["ratio"] = res["rps"] / results[("INCR", p, r)]["rps"]
            res["ratio_floor"] = res["rps"] / results[(FLOOR, p, r)]["rps"]
            runs.setdefault((label, p, r), []).append(res)
        print(f"round {rnd + 1}/{ROUNDS} done", file=sys.stderr)
    summary = []
    for label, _argv, _stat in cmds:
        for p, r in configs:
            rs = runs[(label, p, r)]
            usecs = [x["usec"] for x in rs if x["usec"] is not None]
            summary.append({
                "label": label, "pipeline": p, "keys": "random" if r else "hot",
                "rps": statistics.median(x["rps"] for x in rs),
                "ratio": statistics.median(x["ratio"] for x in rs),
                "ratio_floor": statistics.median(x["ratio_floor"] for x in rs),
                "ratios_floor": [x["ratio_floor"] for x in rs],
                "p50": statistics.median(x["p50"] for x in rs),
                "p99": statistics.median(x["p99"] for x in rs),
                "usec": statistics.median(usecs) if usecs else None,
            })
    return summary


def paired(server, shas):
    """Throughput against the floor with the two runs next to each other in time: for each
    command, QUADS groups (QUADS_GCRA for RL.GCRA) of four runs (floor, command, command,
    floor; pipeline 16, random keys), each group giving one ratio (sum of the command's ops/s
    over the floor's). On a shared machine the load changes between the rounds of `speed`;
    within a group of four runs it changes less, and the ABBA order cancels a steady drift."""
    cmds = commands(shas)
    index = {c[0]: i for i, c in enumerate(cmds)}
    floor = next(c for c in cmds if c[0] == FLOOR)
    chosen = [c for c in cmds if c[0].split(" ")[0] in ("INCR", "SET", "RL.GCRA", "RL.WINDOW",
                                                        "CL.THROTTLE")]
    out = {}
    for c in chosen:
        ratios = []
        for _ in range(QUADS_GCRA if c[0].startswith("RL.GCRA") else QUADS):
            rps = {"floor": 0.0, "cmd": 0.0}
            for which in ("floor", "cmd", "cmd", "floor"):
                label, argv, stat = floor if which == "floor" else c
                rps[which] += bench_one(server, index[label], label, argv, stat, 16, True)["rps"]
                server.cli("FLUSHALL")
            ratios.append(rps["cmd"] / rps["floor"])
        out[c[0]] = ratios
        print(f"paired: {c[0]}: " + ", ".join(f"{r:.3f}" for r in ratios), file=sys.stderr)
    return out


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def pipe(server, payload):
    subprocess.run(["redis-cli", "-p", str(server.port), "--pipe"], input=payload,
                   capture_output=True, check=True, timeout=600)


def bytes_per_key(server, make):
    server.cli("FLUSHALL")
    time.sleep(0.2)
    before = int(server.info("memory")["used_memory"])
    chunk = 100_000
    for start in range(0, MEM_KEYS, chunk):
        pipe(server, b"".join(make("m:%d" % i) for i in range(start, min(start + chunk, MEM_KEYS))))
    keys = int(server.cli("DBSIZE"))
    after = int(server.info("memory")["used_memory"])
    server.cli("FLUSHALL")
    return (after - before) / keys, keys


def memory(server, shas):
    rows = []
    cases = [
        ("RL.GCRA", lambda k: resp("RL.GCRA", k, 100, 10, 3600)),
        ("RL.WINDOW FIXED", lambda k: resp("RL.WINDOW", k, 100, 3600, "FIXED")),
        ("RL.WINDOW SLIDING", lambda k: resp("RL.WINDOW", k, 100, 3600, "SLIDING")),
        ("RL.WINDOW LOG (1 request)", lambda k: resp("RL.WINDOW", k, 100, 3600, "LOG")),
        ("Lua GCRA: integer string key + TTL", lambda k: resp("EVALSHA", shas["gcra"], 1, k, 100, 10, 3600)),
        ("Lua fixed window: INCR + EXPIRE key", lambda k: resp("EVALSHA", shas["fixed_window"], 1, k, 100, 3600)),
        ("SET key v PX (reference)", lambda k: resp("SET", k, "v", "PX", 3600000)),
    ]
    for label, make in cases:
        per_key, keys = bytes_per_key(server, make)
        rows.append((label, per_key, keys))
        print(f"memory: {label}: {per_key:.1f} B/key over {keys} keys", file=sys.stderr)
    return rows


def per_request(server, shas):
    """LOG key vs sorted set, 10,000 requests each, one round trip per request (so each
    request has its own instant, as in real traffic)."""
    server.cli("FLUSHALL")
    lines = "\n".join(f"RL.WINDOW memlog {LOG_REQUESTS} 3600 LOG" for _ in range(LOG_REQUESTS))
    server.cli(stdin=lines.encode())
    log_total = int(server.cli("MEMORY", "USAGE", "memlog", "SAMPLES", "0"))
    lines = "\n".join(f"EVALSHA {shas['sliding_log_zset']} 1 memzset {LOG_REQUESTS} 3600"
                      for _ in range(LOG_REQUESTS))
    server.cli(stdin=lines.encode())
    zset_total = int(server.cli("MEMORY", "USAGE", "memzset", "SAMPLES", "0"))
    zset_count = int(server.cli("ZCARD", "memzset"))
    log_left = server.cli("RL.WINDOW", "memlog", str(LOG_REQUESTS), "3600", "LOG", "QUANTITY", "0").split()
    log_count = LOG_REQUESTS - int(log_left[2])
    server.cli("FLUSHALL")
    return [("RL.WINDOW LOG", log_total, log_count), ("Lua sorted set (ZADD)", zset_total, zset_count)]


LEASES = 1_000


def per_lease(server):
    """A LEASE key holding LEASES leases, one per holder, for two token lengths: MEMORY USAGE
    over the leases held (the fixed part of the key included)."""
    rows = []
    for token_len in (8, 64):
        server.cli("FLUSHALL")
        lines = "\n".join(
            f"RL.LEASE memlease {LEASES} 3600 {str(i).rjust(token_len, 't')}"
            for i in range(LEASES))
        server.cli(stdin=lines.encode())
        total = int(server.cli("MEMORY", "USAGE", "memlease", "SAMPLES", "0"))
        left = server.cli("RL.LEASE", "memlease", str(LEASES), "3600", "probe", "PEEK",
                          "QUANTITY", "0").split()
        held = LEASES - int(left[2])
        rows.append((f"RL.LEASE, {token_len}-byte tokens", total, held))
        print(f"memory: lease ({token_len}-byte tokens): {total} B for {held} leases",
              file=sys.stderr)
    server.cli("FLUSHALL")
    return rows


def kept_section(name):
    """The section of the current BENCHMARKS.md between `<!-- name:begin -->` and
    `<!-- name:end -->` (written by another benchmark), or None."""
    try:
        with open(os.path.join(ROOT, "BENCHMARKS.md")) as f:
            text = f.read()
    except OSError:
        return None
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        return None
    return text[text.index(begin):text.index(end) + len(end)]


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}"


def fmt_ms(v):
    return f"{v:.3f}"


def include(name, w):
    path = os.path.join(ROOT, "bench", name)
    if os.path.exists(path):
        with open(path) as f:
            w(f.read().rstrip())
        w("")


def status(values, ok):
    """Met / not met from the figures measured in this run, as a phrase."""
    hits = [ok(v) for v in values]
    if all(hits):
        return "met in this run"
    if not any(hits):
        return "**not met** in this run"
    return "met in some runs only"


def targets(summary, pairs, cost_rounds):
    """Issue 12's targets against this run's figures (markdown lines)."""
    lines = []
    w = lines.append
    w("## Targets against the floor (this run)")
    w("")
    w("| target | measured | status |")
    w("|---|---|---|")
    gcra = next(r for r in summary
                if r["label"].startswith("RL.GCRA") and r["pipeline"] == 16 and r["keys"] == "random")
    rounds = ", ".join(f"{x:.3f}" for x in gcra["ratios_floor"])
    quads = pairs[gcra["label"]]
    w(f"| RL.GCRA ≥ 0.97 × the floor's throughput (pipeline 16, random keys) | paired: median "
      f"{statistics.median(quads):.3f} (groups: {', '.join(f'{x:.3f}' for x in quads)}); "
      f"rounds: median {gcra['ratio_floor']:.3f} ({rounds}) | "
      f"{status([statistics.median(quads)], lambda v: v >= 0.97)} (paired median) |")
    if cost_rounds:
        def ir_ratios(label):
            return [r[label]["per_call"] / r[cost.FLOOR]["per_call"] for r in cost_rounds]
        g = ir_ratios(cost.GCRA)
        w(f"| RL.GCRA ≤ 1.05 × the floor's instructions per call | "
          + ", ".join(f"{x:.3f}" for x in g) + f" (runs 1–{len(g)}) | {status(g, lambda v: v <= 1.05)} |")
        for label in ("RL.WINDOW FIXED", "RL.WINDOW SLIDING", "RL.WINDOW LOG"):
            r = ir_ratios(label)
            w(f"| {label} ≤ 1.15 × the floor's instructions per call | "
              + ", ".join(f"{x:.3f}" for x in r) + f" | {status(r, lambda v: v <= 1.15)} |")
    else:
        w("| instruction targets | not measured (valgrind missing) | – |")
    w("")
    return lines


def report(server_version, summary, pairs, mem_rows, req_rows, lease_rows, elapsed, cost_lines,
           cost_rounds, fallback_text):
    lines = []
    w = lines.append
    w("# Benchmarks")
    w("")
    w("Generated by `make bench` (`bench/bench.py`); do not edit by hand." + (" **Quick run (`BENCH_QUICK=1`): fewer requests and keys, indicative only.**" if QUICK else ""))
    w("")
    w(f"* Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    w(f"* Machine: {machine()}")
    w(f"* Server: redis-server {server_version}, pinned to CPU 0; redis-benchmark pinned to CPU 1"
      if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else f"* Server: redis-server {server_version} (not pinned)")
    w(f"* Load: redis-benchmark, {CLIENTS} clients, {N_PLAIN} requests per run without pipelining, "
      f"{N_PIPE} with `-P 16`; random keys over {KEYSPACE} (`-r {KEYSPACE}`) or one hot key; "
      f"{ROUNDS} rounds in shuffled order; medians over rounds")
    w(f"* Reproduce: `make bench` (full) or `BENCH_QUICK=1 make bench`; this run took {elapsed:.0f} s")
    w("")
    w("")
    include("FLOOR.md", w)
    lines.extend(targets(summary, pairs, cost_rounds))
    w("## Throughput")
    w("")
    w("`× INCR` and `× floor` are ops/s divided by INCR's and by the floor's (FL.GCRA) ops/s under "
      "the same settings in the same round (median over rounds). `µs/call` is the server's own "
      "time per call from `INFO commandstats` (for Lua, the whole EVALSHA). The machine is shared "
      "and noisy: compare ratios, not absolute numbers.")
    w("")
    w("### Pipeline 16, random keys, paired with the floor")
    w("")
    w(f"Each command in {QUADS} groups (RL.GCRA, whose target is this ratio, in {QUADS_GCRA}) of "
      "four runs next to each other in time (floor, command, "
      "command, floor; the settings of the table below); one ratio per group, the command's "
      "ops/s over the floor's. Less exposed to the machine's changing load than the rounds "
      "below, which run every command in shuffled order before the next round.")
    w("")
    w("| command | × floor (median) | min | max | groups |")
    w("|---|---:|---:|---:|---|")
    for label, ratios in pairs.items():
        w(f"| {label} | {statistics.median(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | "
          + ", ".join(f"{r:.3f}" for r in ratios) + " |")
    for p in (16, 1):
        for keys in ("random", "hot"):
            w("")
            w(f"### {'Pipeline 16' if p == 16 else 'No pipelining'}, {keys} key{'s' if keys == 'random' else ''}")
            w("")
            w("| command | ops/s | × INCR | × floor | p50 ms | p99 ms | server µs/call |")
            w("|---|---:|---:|---:|---:|---:|---:|")
            for row in summary:
                if row["pipeline"] == p and row["keys"] == keys:
                    usec = f"{row['usec']:.2f}" if row["usec"] is not None else "–"
                    w(f"| {row['label']} | {row['rps']:,.0f} | {row['ratio']:.2f} | {row['ratio_floor']:.3f} | {fmt_ms(row['p50'])} | {fmt_ms(row['p99'])} | {usec} |")
    w("")
    lines.extend(cost_lines)
    w("")
    w(f"## Memory per key ({MEM_KEYS:,} keys, `used_memory` delta / keys)")
    w("")
    w("| key | bytes per key |")
    w("|---|---:|")
    for label, per_key, keys in mem_rows:
        w(f"| {label} | {per_key:.1f} |")
    w("")
    w(f"## Memory per recorded request ({LOG_REQUESTS:,} requests on one key, one round trip each)")
    w("")
    w("| structure | requests held | `MEMORY USAGE` bytes | bytes per request |")
    w("|---|---:|---:|---:|")
    for label, total, count in req_rows:
        w(f"| {label} | {count:,} | {total:,} | {total / max(count, 1):.1f} |")
    w("")
    w(f"## Memory per lease ({LEASES:,} holders on one key, one lease each)")
    w("")
    w("A lease is a packed record of 17 bytes plus its token (expiry, slots, token length); "
      "the key's fixed part is included in the figure.")
    w("")
    w("| key | leases held | `MEMORY USAGE` bytes | bytes per lease |")
    w("|---|---:|---:|---:|")
    for label, total, count in lease_rows:
        w(f"| {label} | {count:,} | {total:,} | {total / max(count, 1):.1f} |")
    w("")
    if fallback_text:
        lines.append(fallback_text)
        w("")
    include("ANALYSIS.md", w)
    replay = kept_section("rl-replay")
    if replay:
        w("")
        w(replay)
    return "\n".join(lines)


def main():
    if not os.path.exists(MODULE):
        sys.exit("build the module first: cargo build --release")
    started = time.time()
    server = Server()
    try:
        version = server.info("server").get("redis_version", "?")
        shas = load_scripts(server)
        summary = speed(server, shas)
        pairs = paired(server, shas)
        mem_rows = memory(server, shas)
        req_rows = per_request(server, shas)
        lease_rows = per_lease(server)
    finally:
        server.stop()
    fallback_text = fallback_bench.markdown()
    if shutil.which("valgrind"):
        cost_lines, cost_rounds = cost.run()
    else:
        print("valgrind is not installed: skipping the instruction counts", file=sys.stderr)
        cost_lines = ["## Instructions per call (callgrind)", "",
                      "Not measured: valgrind is not installed (Debian: `apt-get install valgrind`).",
                      ""]
        cost_rounds = None
    text = report(version, summary, pairs, mem_rows, req_rows, lease_rows,
                  time.time() - started, cost_lines, cost_rounds, fallback_text)
    with open(os.path.join(ROOT, "BENCHMARKS.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
