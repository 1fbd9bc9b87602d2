#!/usr/bin/env python3
"""`make bench-cost`: the server's instructions per call, next to INCR, SET PX and the floor.

Runs redis-server (Debian's 7.0 here) under `valgrind --tool=callgrind
--toggle-collect=processCommand`, with redis-rl and the floor module (`bench/floor/floor.c`,
built here into target/bench/floor.so) loaded and no persistence, and drives one command at a
time with `redis-benchmark -n 20000 -P 16 -r 100000` (50 clients, random keys). Around each
command: FLUSHALL and CONFIG RESETSTAT, `callgrind_control --zero`, the load,
`callgrind_control --dump`. Only instructions executed inside processCommand are counted, so
the count does not depend on what else the machine is doing, nor on the server's timers
(serverCron, active expiry) or its network reads and writes.

Each redis-benchmark run also sends two CONFIG GET commands (`save` and `appendonly`) when it
starts. Each server run measures those two alone (redis-cli, zero, dump) and that cost is
subtracted; the count of calls comes from INFO commandstats and is checked against the calls
of processCommand in the callgrind file.

The whole step runs ROUNDS times (COST_ROUNDS, default 2), each on a new server, so the table
shows how well the count repeats. Callgrind files of every command are kept under
target/bench/callgrind/round-N/ and the figures in target/bench/cost.json. For RL.GCRA against
the floor (run 1) it prints where the instructions go: by step (each function outside the
module that the module calls, with everything it calls; the module's own code; Redis before
and around the module), the functions by inclusive cost, and every function whose own cost
differs; the step and self tables add up to the totals.

Then the Lua fallback (issue 25): each algorithm's `FCALL` of scripts/lua/redis_rl.lua and the
project's reference script for it (`EVALSHA` of bench/lua/<name>.lua: gcra, fixed_window,
sliding_window_two_keys, sliding_log_zset, lease_zset), and RL.ALL of a GCRA and a FIXED
limit against the sum of two scripts, with the module rows' parameters, each row on a fresh
server with the library or the script loaded before the counters are zeroed; plus a Function
doing only TIME, SET ... PXAT and the reply (bench/lua/fallback_floor.lua), the floor of an
exact FIXED call. It prints their table and where each call's instructions go, and (one run)
the same table on keys that already exist (WARM_CALLS calls over WARM_KEYS keys before the
counters are zeroed).

Nothing here asserts: it measures and prints. Needs valgrind (callgrind_control and
callgrind_annotate come with it), gcc, redis-server, redis-cli, redis-benchmark.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "target", "release", "libredis_rl.so")
FLOOR_SRC = os.path.join(ROOT, "bench", "floor", "floor.c")
OUT_DIR = os.path.join(ROOT, "target", "bench")
FLOOR_SO = os.path.join(OUT_DIR, "floor.so")
ROUNDS = int(os.environ.get("COST_ROUNDS", "2"))
REQUESTS = 20_000
PIPELINE = 16
CLIENTS = 50
KEYSPACE = 100_000
# Keys that already exist (one run): WARM_CALLS calls over WARM_KEYS keys before the counters
# are zeroed, then WARM_MEASURED calls on the same keys (the usual case of a live limiter).
WARM_KEYS = 1_000
WARM_CALLS = 5_000
WARM_MEASURED = 2_000
TIMEOUT_S = 300  # any single child process
TOP = 15

FLOOR = "FL.GCRA (floor)"
GCRA = "RL.GCRA"

# (label, argv with KEY placeholder, INFO commandstats name). Every key has the same length, so
# hashing the key costs every command the same. The parameters keep every key alive through the
# run (GCRA: one request holds a key 60 s; windows of an hour), as INCR's and SET PX's keys are:
# keys that expire during the run are deleted either inside a command (counted) or by the
# server's timer (not counted), depending on timing, which makes the count vary by a few percent.
COMMANDS = [
    ("INCR", ["INCR", "KEY"], "incr"),
    ("SET k v PX 60000", ["SET", "KEY", "v", "PX", "60000"], "set"),
    (FLOOR, ["FL.GCRA", "KEY", "100", "1", "60"], "fl.gcra"),
    (GCRA, ["RL.GCRA", "KEY", "100", "1", "60"], "rl.gcra"),
    ("RL.WINDOW FIXED", ["RL.WINDOW", "KEY", "100", "3600", "FIXED"], "rl.window"),
    ("RL.WINDOW SLIDING", ["RL.WINDOW", "KEY", "100", "3600", "SLIDING"], "rl.window"),
    ("RL.WINDOW LOG", ["RL.WINDOW", "KEY", "100", "3600", "LOG"], "rl.window"),
    ("CL.THROTTLE", ["CL.THROTTLE", "KEY", "99", "1", "60"], "cl.throttle"),
    ("RL.LEASE", ["RL.LEASE", "KEY", "100", "3600", "tok"], "rl.lease"),
    ("RL.ALL GCRA + FIXED", ["RL.ALL", "2", "{KEY}a", "{KEY}b", "GCRA", "100", "1", "60", "WINDOW",
                             "100", "3600", "FIXED"], "rl.all"),
]
KEY = "k:__rand_int__"
LIBRARY = os.path.join(ROOT, "scripts", "lua", "redis_rl.lua")
LUA_DIR = os.path.join(ROOT, "bench", "lua")

# A Function doing only what an exact FIXED call must: TIME, SET ... PXAT, a five-integer reply
# (bench/lua/fallback_floor.lua).
FLOOR_FN = "TIME + SET PXAT + reply (a Function's floor)"

# The Lua fallback (FCALL) and the project's reference script of each algorithm (EVALSHA of
# bench/lua/<name>.lua), with the same parameters as the module's row, each row on a fresh
# server with the library or the script loaded and the counters zeroed after the load (issue
# 25): (algorithm, the module's row, the fallback's argv, the reference script or scripts, the
# reference's arguments). RL.ALL of two limits is compared with the sum of the two scripts.
LUA_ROWS = [
    ("GCRA", GCRA, ["FCALL", "rl_gcra", "1", "KEY", "100", "1", "60"], ["gcra"],
     [["100", "1", "60"]]),
    ("FIXED", "RL.WINDOW FIXED", ["FCALL", "rl_window", "1", "KEY", "100", "3600", "FIXED"],
     ["fixed_window"], [["100", "3600"]]),
    ("SLIDING", "RL.WINDOW SLIDING",
     ["FCALL", "rl_window", "1", "KEY", "100", "3600", "SLIDING"],
     ["sliding_window_two_keys"], [["100", "3600"]]),
    ("LOG", "RL.WINDOW LOG", ["FCALL", "rl_window", "1", "KEY", "100", "3600", "LOG"],
     ["sliding_log_zset"], [["100", "3600"]]),
    ("LEASE", "RL.LEASE", ["FCALL", "rl_lease", "1", "KEY", "100", "3600", "tok"], ["lease_zset"],
     [["100", "3600", "tok"]]),
    ("RL.ALL of GCRA + FIXED", "RL.ALL GCRA + FIXED",
     ["FCALL", "rl_all", "2", "{KEY}a", "{KEY}b", "GCRA", "100", "1", "60", "WINDOW", "100",
      "3600", "FIXED"], ["gcra", "fixed_window"], [["100", "1", "60"], ["100", "3600"]]),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def redismodule_h_dir():
    """The include directory of the redismodule.h that the `redis-module` crate vendors (the
    crate is already in the cargo registry once the module has been built)."""
    for extra in (["--offline"], []):
        try:
            out = subprocess.run(["cargo", "metadata", "--format-version", "1"] + extra, cwd=ROOT,
                                 capture_output=True, check=True, timeout=TIMEOUT_S).stdout
        except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
            continue
        for package in json.loads(out)["packages"]:
            if package["name"] == "redis-module":
                inc = os.path.join(os.path.dirname(package["manifest_path"]), "src", "include")
                if os.path.exists(os.path.join(inc, "redismodule.h")):
                    return inc
    sys.exit("cannot find redismodule.h: `cargo metadata` names no redis-module package "
             "with src/include/redismodule.h (run `cargo build --release` first)")


def floor_module():
    """Builds target/bench/floor.so from bench/floor/floor.c when missing or older."""
    if os.path.exists(FLOOR_SO) and os.path.getmtime(FLOOR_SO) >= os.path.getmtime(FLOOR_SRC):
        return FLOOR_SO
    os.makedirs(OUT_DIR, exist_ok=True)
    cmd = ["gcc", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-std=gnu11",
           "-I", redismodule_h_dir(), "-o", FLOOR_SO, FLOOR_SRC]
    log("building the floor: " + " ".join(cmd))
    subprocess.run(cmd, check=True, timeout=TIMEOUT_S)
    return FLOOR_SO


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CallgrindServer:
    """redis-server under callgrind, counting only inside processCommand."""

    def __init__(self):
        # A free port can be taken by another process before the server binds it: try again.
        for attempt in range(3):
            if self.start(attempt == 2):
                return

    def start(self, last):
        """Starts the server; False (and cleaned up) when its port was taken and not last."""
        self.dir = tempfile.mkdtemp(prefix="redis-rl-cost-")
        self.port = free_port()
        self.out = os.path.join(self.dir, "callgrind.out")
        argv = [
            "valgrind", "--tool=callgrind", "--toggle-collect=processCommand",
            "--callgrind-out-file=" + self.out,
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"),
            "--loadmodule", MODULE, "--loadmodule", floor_module(),
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=open(os.path.join(self.dir, "valgrind.log"), "wb"),
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self.cli("PING") == "PONG":
                    return True
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.2)
        with open(os.path.join(self.dir, "redis.log"), errors="replace") as f:
            taken = "Address already in use" in f.read()
        if taken and not last:
            self.stop()
            return False
        self.stop(keep=True)
        sys.exit("redis-server under callgrind did not start; see " + self.dir)

    def cli(self, *args):
        out = subprocess.run(["redis-cli", "-p", str(self.port)] + list(args),
                             capture_output=True, check=True, timeout=TIMEOUT_S)
        return out.stdout.decode(errors="replace").strip()

    def commandstats(self):
        """{lower-case command name: calls}."""
        calls = {}
        for line in self.cli("INFO", "commandstats").splitlines():
            m = re.match(r"cmdstat_([^:]+):calls=(\d+)", line)
            if m:
                calls[m.group(1).lower()] = int(m.group(2))
        return calls

    def control(self, *args):
        subprocess.run(["callgrind_control"] + list(args) + [str(self.proc.pid)],
                       capture_output=True, check=True, timeout=TIMEOUT_S)

    def dump(self, tag):
        """Dumps the counts since the last zero; returns the file's path."""
        self.control("--dump=" + tag)
        marker = "desc: Trigger: dump " + tag + "\n"
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.startswith("callgrind.out.") and os.path.getsize(path):
                with open(path) as f:
                    head = "".join(f.readline() for _ in range(40))
                if marker in head:
                    return path
        raise RuntimeError("callgrind dump " + tag + " not found in " + self.dir)

    def stop(self, keep=False):
        # Only our own server: once it has exited, its port may be another process's.
        if self.proc.poll() is None:
            try:
                self.cli("SHUTDOWN", "NOSAVE")
            except Exception:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def parse_callgrind(path):
    """(Ir in the file, calls of processCommand recorded in it)."""
    names = {}
    total = None
    calls = 0
    current_cfn = None
    with open(path) as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    current_cfn = m.group(1) if line.startswith("cfn=") else None
            elif line.startswith("calls=") and current_cfn is not None:
                if names.get(current_cfn) == "processCommand":
                    calls += int(line[6:].split()[0])
            elif line.startswith("summary:"):
                total = int(line.split()[1])
    if total is None:
        raise RuntimeError("no summary line in " + path)
    return total, calls


def config_get_cost(server):
    """Ir of the two CONFIG GET commands that redis-benchmark sends at start, measured alone."""
    server.cli("CONFIG", "RESETSTAT")
    server.control("--zero")
    server.cli("CONFIG", "GET", "save")
    server.cli("CONFIG", "GET", "appendonly")
    ir, calls = parse_callgrind(server.dump("config-get"))
    if calls != 2:
        log(f"warning: CONFIG GET baseline saw {calls} calls of processCommand, expected 2")
    return ir / max(calls, 1)


def measure(server, label, argv, stat, keep_dir, index, warm=False):
    """One command's count. warm: on keys that already exist (WARM_KEYS keys, each called
    about WARM_CALLS / WARM_KEYS times before the counters are zeroed)."""
    server.cli("FLUSHALL")
    args = [KEY if a == "KEY" else a.replace("{KEY}", "{" + KEY + "}") for a in argv]

    def bench(n, keyspace):
        subprocess.run(["redis-benchmark", "-p", str(server.port), "-c", str(CLIENTS),
                        "-n", str(n), "-P", str(PIPELINE), "-r", str(keyspace), "--csv"] + args,
                       capture_output=True, check=True, timeout=TIMEOUT_S)
    if warm:
        bench(WARM_CALLS, WARM_KEYS)
    server.cli("CONFIG", "RESETSTAT")
    server.control("--zero")
    if warm:
        bench(WARM_MEASURED, WARM_KEYS)
    else:
        bench(REQUESTS, KEYSPACE)
    path = server.dump("cmd-%d" % index)
    stats = server.commandstats()
    ir, pc_calls = parse_callgrind(path)
    calls = stats.get(stat, 0)
    config_calls = stats.get("config|get", 0)
    if pc_calls != calls + config_calls:
        log(f"warning: {label}: processCommand ran {pc_calls} times; commandstats has "
            f"{calls} + {config_calls} CONFIG GET")
    kept = os.path.join(keep_dir, slug(label) + ".out")
    shutil.copyfile(path, kept)
    return {"ir": ir, "calls": calls, "config_calls": config_calls, "file": kept}


def slug(label):
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def measure_fresh(label, argv, stat, keep_dir, index, script=None, library=LIBRARY, warm=False):
    """One command on its own fresh server: a Functions library loaded (script None) or the
    script bench/lua/<script>.lua loaded (its sha replaces "SHA" in argv), then measured as
    `measure` does (FLUSHALL, CONFIG RESETSTAT and the zeroed counters come after the load)."""
    server = CallgrindServer()
    try:
        config_ir = config_get_cost(server)
        if script is None:
            with open(library, "rb") as f:
                out = subprocess.run(["redis-cli", "-p", str(server.port), "-x", "FUNCTION", "LOAD",
                                      "REPLACE"], input=f.read(), capture_output=True, check=True,
                                     timeout=TIMEOUT_S).stdout.decode().strip()
            if out not in ("redis_rl", "rl_floor"):
                raise RuntimeError("FUNCTION LOAD failed: " + out)
        else:
            with open(os.path.join(LUA_DIR, script + ".lua")) as f:
                sha = server.cli("SCRIPT", "LOAD", f.read())
            argv = [sha if a == "SHA" else a for a in argv]
        r = measure(server, label, argv, stat, keep_dir, index, warm)
        r["config_ir"] = config_ir
        r["per_call"] = (r["ir"] - r["config_calls"] * config_ir) / max(r["calls"], 1)
    finally:
        server.stop()
    return r


def lua_round(rnd):
    """The fallback's and the reference scripts' rows of LUA_ROWS, each on a fresh server:
    {label: result}, labels "<algorithm> fallback" and "<script> script"."""
    keep_dir = os.path.join(OUT_DIR, "callgrind", "round-%d" % rnd)
    os.makedirs(keep_dir, exist_ok=True)
    results = {}
    index = 100
    for algo, _module, fb_argv, scripts, script_args in LUA_ROWS:
        label = algo + " fallback"
        results[label] = measure_fresh(label, fb_argv, "fcall", keep_dir, index)
        log(f"cost round {rnd}: {label}: {results[label]['per_call']:,.0f} Ir/call")
        index += 1
        for script, sargs in zip(scripts, script_args):
            slabel = script + " script"
            if slabel in results:
                continue
            argv = ["EVALSHA", "SHA", "1", "KEY"] + sargs
            results[slabel] = measure_fresh(slabel, argv, "evalsha", keep_dir, index, script)
            log(f"cost round {rnd}: {slabel}: {results[slabel]['per_call']:,.0f} Ir/call")
            index += 1
    results[FLOOR_FN] = measure_fresh(FLOOR_FN, ["FCALL", "rl_floor", "1", "KEY"], "fcall",
                                      keep_dir, index,
                                      library=os.path.join(LUA_DIR, "fallback_floor.lua"))
    log(f"cost round {rnd}: {FLOOR_FN}: {results[FLOOR_FN]['per_call']:,.0f} Ir/call")
    return results


def warm_round():
    """The module, the fallback and the reference scripts of LUA_ROWS on keys that already
    exist, each on a fresh server: {label: result}."""
    keep_dir = os.path.join(OUT_DIR, "callgrind", "warm")
    os.makedirs(keep_dir, exist_ok=True)
    commands = {label: (argv, stat) for label, argv, stat in COMMANDS}
    results = {}
    index = 200
    for algo, module, fb_argv, scripts, script_args in LUA_ROWS:
        argv, stat = commands[module]
        rows = [(module, argv, stat, None), (algo + " fallback", fb_argv, "fcall", None)]
        rows += [(sc + " script", ["EVALSHA", "SHA", "1", "KEY"] + sa, "evalsha", sc)
                 for sc, sa in zip(scripts, script_args)]
        for label, argv, stat, script in rows:
            if label in results:
                continue
            results[label] = measure_fresh(label, argv, stat, keep_dir, index, script, warm=True)
            log(f"cost on existing keys: {label}: {results[label]['per_call']:,.0f} Ir/call")
            index += 1
    return results


def warm_table(warm):
    """Markdown lines: the fallback table on keys that already exist."""
    lines = ["| algorithm | module | fallback (`FCALL`) | reference script (`bench/lua/`) "
             "| fallback ÷ reference |", "|---|---:|---:|---:|---:|"]
    for algo, module, _argv, scripts, _args in LUA_ROWS:
        mod = warm[module]["per_call"]
        fb = warm[algo + " fallback"]["per_call"]
        ref = sum(warm[sc + " script"]["per_call"] for sc in scripts)
        names = " + ".join(f"`{sc}.lua`" for sc in scripts)
        lines.append(f"| {algo} | {mod / 1000:.1f} k | **{fb / 1000:.1f} k** | {names} "
                     f"{ref / 1000:.1f} k | {fb / ref:.2f} |")
    return lines


def one_round(rnd):
    keep_dir = os.path.join(OUT_DIR, "callgrind", "round-%d" % rnd)
    shutil.rmtree(keep_dir, ignore_errors=True)
    os.makedirs(keep_dir)
    server = CallgrindServer()
    try:
        config_ir = config_get_cost(server)
        results = {}
        for i, (label, argv, stat) in enumerate(COMMANDS):
            r = measure(server, label, argv, stat, keep_dir, i)
            r["config_ir"] = config_ir
            r["per_call"] = (r["ir"] - r["config_calls"] * config_ir) / max(r["calls"], 1)
            results[label] = r
            log(f"cost round {rnd}: {label}: {r['per_call']:,.0f} Ir/call")
    finally:
        server.stop()
    return results


# ---- callgrind_annotate: functions inside processCommand, per call ----

OUTER = {"processInputBuffer", "readQueryFromClient", "main", "aeMain", "aeProcessEvents",
         "connSocketEventHandler", "(below main)", "__libc_start_main@@GLIBC_2.34",
         "__libc_start_call_main"}


class Profile:
    """One callgrind file, by function name: self cost, object file, and the cost of each
    caller→callee edge (inclusive of the callee's own calls).

    callgrind_annotate --inclusive=yes counts the same way, but lists a Rust function once per
    source file its inlined code comes from, each time with the whole inclusive cost, so its
    list cannot be summed by function; this reads the file itself. Functions are keyed by name
    (instances of a generic Rust function with one demangled name are added up)."""

    def __init__(self, path):
        ids = {}  # ("fn" | "ob", id) -> name
        self.self_cost, self.objects, self.edges = {}, {}, {}
        self.total = None
        fn = ob = callee = None
        pending_call = False
        with open(path) as f:
            for line in f:
                c = line[0]
                if c.isdigit() or c in "+-*":
                    parts = line.split()
                    ir = int(parts[1]) if len(parts) > 1 else 0
                    if pending_call:
                        pending_call = False
                        if callee != fn:
                            self.edges[(fn, callee)] = self.edges.get((fn, callee), 0) + ir
                    elif fn is not None:
                        self.self_cost[fn] = self.self_cost.get(fn, 0) + ir
                    continue
                if line.startswith(("fn=", "cfn=", "ob=", "cob=")):
                    kind, _, rest = line.rstrip("\n").partition("=")
                    m = re.match(r"\((\d+)\)(?: (.*))?", rest)
                    space = "fn" if kind in ("fn", "cfn") else "ob"
                    name = rest
                    if m:
                        key = (space, m.group(1))
                        if m.group(2):
                            ids[key] = m.group(2)
                        name = ids.get(key, rest)
                    if kind == "fn":
                        fn = name
                        self.objects.setdefault(fn, object_label(os.path.basename(ob or "")))
                    elif kind == "cfn":
                        callee = name
                    elif kind == "ob":
                        ob = name
                elif line.startswith("calls="):
                    pending_call = True
                elif line.startswith("summary:"):
                    self.total = int(line.split()[1])
        if self.total is None:
            raise RuntimeError("no summary line in " + path)

    def inclusive(self):
        """{function: Ir including its calls}, without the callers of processCommand (outside
        the counted range, they carry its whole cost)."""
        inc = dict(self.self_cost)
        for (caller, _callee), ir in self.edges.items():
            inc[caller] = inc.get(caller, 0) + ir
        return {n: c for n, c in inc.items()
                if c and (n == "processCommand" or (c < self.total and n not in OUTER))}

    def module_view(self, module_object):
        """(the module's own self cost, {function outside the module: Ir of the module's calls
        to it}, Ir of the calls from Redis into the module)."""
        own = sum(c for n, c in self.self_cost.items() if self.objects.get(n) == module_object)
        out, into = {}, 0
        for (caller, callee), ir in self.edges.items():
            inside_caller = self.objects.get(caller) == module_object
            inside_callee = self.objects.get(callee) == module_object
            if inside_caller and not inside_callee:
                out[callee] = out.get(callee, 0) + ir
            elif inside_callee and not inside_caller:
                into += ir
        return own, out, into


def object_label(obj):
    if obj in ("redis-server", "redis-check-rdb"):  # Debian links one to the other
        return "redis-server"
    return obj or "?"


def steps(result, module_object):
    """{step: Ir per call} for one command's file (rows add up to the total), and the total."""
    calls = result["calls"] + result["config_calls"]
    prof = Profile(result["file"])
    inc = prof.inclusive()
    own, out, into = prof.module_view(module_object)
    rows = {
        "Redis: processCommand before call() (command lookup, checks)":
            inc.get("processCommand", 0) - inc.get("call", 0),
        "Redis: call() around the module (stats, propagation)":
            inc.get("call", 0) - inc.get("RedisModuleCommandDispatcher", 0),
        "Redis: module context (RedisModuleCommandDispatcher)":
            inc.get("RedisModuleCommandDispatcher", 0) - into,
    }
    rows.update({f"`{n}`": ir for n, ir in out.items()})
    rows[OWN_CODE] = own
    return {k: v / calls for k, v in rows.items()}, inc.get("processCommand", 0) / calls


OWN_CODE = "the module's own code (self)"


def breakdown(round_results):
    """Markdown lines: Ir per call by step for the floor and every RL command (one column
    each): Redis before and around the module, every function outside the module that the
    module calls (with all it calls), the module's own code. Each column adds up to its total."""
    cols = [(FLOOR, "floor.so")] + [(label, "libredis_rl.so") for label, _a, _s in COMMANDS
                                    if label.startswith(("RL.", "CL."))]
    data = [steps(round_results[label], obj) for label, obj in cols]
    names = []
    for rows, _total in data:
        names += [r for r in rows if r not in names]
    first = names[:3]
    middle = sorted((r for r in names if r not in first and r != OWN_CODE),
                    key=lambda r: -max(rows.get(r, 0) for rows, _t in data))
    short = {FLOOR: "floor", "RL.WINDOW FIXED": "FIXED", "RL.WINDOW SLIDING": "SLIDING",
             "RL.WINDOW LOG": "LOG"}
    lines = ["| step | " + " | ".join(short.get(label, label) for label, _o in cols)
             + " | RL.GCRA − floor |",
             "|---|" + "---:|" * (len(cols) + 1)]
    for r in first + middle + [OWN_CODE]:
        vals = [rows.get(r, 0) for rows, _t in data]
        if all(abs(v) < 0.5 for v in vals):
            continue
        lines.append(f"| {r} | " + " | ".join(f"{v:,.0f}" for v in vals)
                     + f" | {vals[1] - vals[0]:+,.0f} |")
    totals = [t for _r, t in data]
    lines.append("| **total (processCommand)** | " + " | ".join(f"{t:,.0f}" for t in totals)
                 + f" | {totals[1] - totals[0]:+,.0f} |")
    return lines


def compare(gcra, floor):
    """Markdown lines: RL.GCRA against the floor, by function, per call."""
    g_calls = gcra["calls"] + gcra["config_calls"]
    f_calls = floor["calls"] + floor["config_calls"]
    g_prof, f_prof = Profile(gcra["file"]), Profile(floor["file"])
    lines = []
    w = lines.append
    g_inc, f_inc = g_prof.inclusive(), f_prof.inclusive()
    top = sorted(g_inc, key=lambda n: -g_inc[n])[:TOP]
    top += [n for n in sorted(f_inc, key=lambda n: -f_inc[n])[:TOP] if n not in top]
    w(f"Inclusive Ir per call inside processCommand, the top {TOP} of each (RL.GCRA first). "
      "Inclusive costs nest, so they do not add up; Rust code is named after the function it "
      "was inlined into.")
    w("")
    w("| function | RL.GCRA | floor | RL.GCRA − floor |")
    w("|---|---:|---:|---:|")
    for n in top:
        g = g_inc.get(n, 0) / g_calls
        f = f_inc.get(n, 0) / f_calls
        w(f"| `{n}` | {g:,.0f} | {f:,.0f} | {g - f:+,.0f} |")
    g_self, f_self = g_prof.self_cost, f_prof.self_cost
    objects = {**f_prof.objects, **g_prof.objects}
    names = set(g_self) | set(f_self)
    diff = {n: g_self.get(n, 0) / g_calls - f_self.get(n, 0) / f_calls for n in names}
    shown = [n for n in sorted(names, key=lambda n: -abs(diff[n])) if abs(diff[n]) >= 5][:40]
    rest = sum(diff.values()) - sum(diff[n] for n in shown)
    w("")
    w("Exclusive (self) Ir per call of every function whose cost differs by 5 or more; with the "
      f"rest ({rest:+,.0f}) they add up to the difference in total.")
    w("")
    w("| function | object | RL.GCRA | floor | RL.GCRA − floor |")
    w("|---|---|---:|---:|---:|")
    for n in shown:
        w(f"| `{n}` | {objects.get(n, '?')} | {g_self.get(n, 0) / g_calls:,.0f} | "
          f"{f_self.get(n, 0) / f_calls:,.0f} | {diff[n]:+,.0f} |")
    w(f"| all | | {sum(g_self.values()) / g_calls:,.0f} | {sum(f_self.values()) / f_calls:,.0f} | "
      f"{sum(diff.values()):+,.0f} |")
    return lines


def runs(values, unit=1000.0):
    """Figures of every round, as '55.5 k / 55.6 k'."""
    return " / ".join(f"{v / unit:.1f} k" for v in values)


def fallback_table(rounds):
    """Markdown lines: per algorithm, the module, the fallback and the reference script(s),
    instructions per call in every round, and the fallback over the reference."""
    lines = ["| algorithm | module | fallback (`FCALL`) | reference script (`bench/lua/`) "
             "| fallback ÷ reference |", "|---|---:|---:|---:|---:|"]
    for algo, module, _argv, scripts, _args in LUA_ROWS:
        mod = [r[module]["per_call"] for r in rounds]
        fb = [r[algo + " fallback"]["per_call"] for r in rounds]
        ref = [sum(r[sc + " script"]["per_call"] for sc in scripts) for r in rounds]
        names = " + ".join(f"`{sc}.lua`" for sc in scripts)
        ratio = " / ".join(f"{f / x:.2f}" for f, x in zip(fb, ref))
        lines.append(f"| {algo} | {runs(mod)} | **{runs(fb)}** | {names} {runs(ref)} | {ratio} |")
    return lines


# The commands the fallback and the scripts call from Lua, by their Redis function.
LUA_COMMANDS = [("TIME", "timeCommand"), ("GET", "getCommand"), ("GETRANGE", "getrangeCommand"),
                ("EXISTS", "existsCommand"), ("SET", "setCommand"), ("PSETEX", "psetexCommand"),
                ("INCR", "incrCommand"), ("EXPIRE", "expireCommand"), ("PEXPIRE", "pexpireCommand"),
                ("PEXPIREAT", "pexpireatCommand"), ("PTTL", "pttlCommand"),
                ("ZADD", "zaddCommand"), ("ZRANGE", "zrangeCommand"), ("ZCARD", "zcardCommand"),
                ("ZREMRANGEBYSCORE", "zremrangebyscoreCommand"), ("INFO", "infoCommand")]


def lua_steps(result):
    """{step: Ir per call} of one FCALL or EVALSHA file; the rows add up to its total."""
    calls = result["calls"] + result["config_calls"]
    prof = Profile(result["file"])
    inc = prof.inclusive()
    total = inc.get("processCommand", 0)
    lua = inc.get("luaCallFunction", 0)
    run_ = inc.get("lua_pcall", 0)
    gc = inc.get("lua_gc", 0)
    called = inc.get("scriptCall", 0)
    parse = inc.get("parseReply", 0)
    rows = {"Redis around the script (command lookup, dispatch, stats)": total - lua,
            "the KEYS and ARGV tables, and the reply table turned into RESP":
                lua - run_ - gc,
            "Redis's Lua GC step (every 50th call)": gc}
    named = 0
    for name, fn in LUA_COMMANDS:
        if inc.get(fn, 0):
            rows[f"`{name}` (the command itself)"] = inc[fn]
            named += inc[fn]
    rows["redis.call: look-up, ACL and propagation of each command"] = called - named
    rows["redis.call: each reply turned into Lua values"] = parse
    rows["the script's own Lua (the VM, string and struct helpers, GC steps of its "
         "allocations)"] = run_ - called - parse
    return {k: v / calls for k, v in rows.items()}, total / calls


def fallback_steps(rounds):
    """Markdown lines: where the instructions of the fallback and of its reference go (run 1)."""
    cols = []
    for algo, _module, _argv, scripts, _args in LUA_ROWS:
        cols.append((algo + " fallback", algo))
        for sc in scripts:
            if (sc + " script", f"`{sc}.lua`") not in cols:
                cols.append((sc + " script", f"`{sc}.lua`"))
    data = [lua_steps(rounds[0][label]) for label, _h in cols]
    names = []
    for rows, _t in data:
        names += [r for r in rows if r not in names]
    lines = ["| step | " + " | ".join(h for _l, h in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for r in names:
        vals = [rows.get(r, 0) for rows, _t in data]
        if all(abs(v) < 0.5 for v in vals):
            continue
        lines.append(f"| {r} | " + " | ".join(f"{v:,.0f}" for v in vals) + " |")
    lines.append("| **total (processCommand)** | " + " | ".join(f"{t:,.0f}" for _r, t in data)
                 + " |")
    return lines


def server_version():
    out = subprocess.run(["redis-server", "--version"], capture_output=True, timeout=60).stdout
    m = re.search(rb"v=(\S+)", out)
    return m.group(1).decode() if m else "?"


def run():
    """Runs every round; returns the markdown section (a list of lines) and the figures."""
    if not os.path.exists(MODULE):
        sys.exit("build the module first: cargo build --release")
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate", "gcc"):
        if not shutil.which(tool):
            sys.exit(f"`{tool}` is needed for the instruction counts (Debian: apt-get install "
                     "valgrind gcc)")
    floor_module()
    started = time.time()
    rounds = [one_round(r + 1) for r in range(ROUNDS)]
    for r, rnd in enumerate(rounds):
        rnd.update(lua_round(r + 1))
    warm = warm_round()
    rounds[0]["warm"] = warm
    elapsed = time.time() - started
    with open(os.path.join(OUT_DIR, "cost.json"), "w") as f:
        json.dump([{label: {k: v for k, v in r.items() if k != "file"} for label, r in rnd.items()
                    if label != "warm"} for rnd in rounds]
                  + [{label: {k: v for k, v in r.items() if k != "file"}
                      for label, r in warm.items()}], f, indent=1)
    lines = []
    w = lines.append
    w("## Instructions per call (callgrind)")
    w("")
    w(f"redis-server {server_version()} under `valgrind --tool=callgrind "
      f"--toggle-collect=processCommand`, both modules loaded, no persistence; each command "
      f"alone after FLUSHALL, `redis-benchmark -c {CLIENTS} -n {REQUESTS} -P {PIPELINE} "
      f"-r {KEYSPACE}` (random keys). Ir = instructions executed inside processCommand, per "
      f"call, less the benchmark's two start-up CONFIG GET commands (measured alone in each run: "
      + ", ".join(f"{r[FLOOR]['config_ir']:,.0f}" for r in rounds)
      + f" Ir each). {ROUNDS} runs, each on a new server (`COST_ROUNDS=n` for more); this "
      f"step took {elapsed:.0f} s. Reproduce: `make bench-cost`. The count does not depend on "
      "the machine's load, but Redis seeds its hash tables at random when it starts, so which "
      "command names and keys share a bucket changes from one start to the next: over ten "
      "starts on 2026-12-01 that moved the floor's count by 1 % (9,211–9,313) and INCR's by "
      "4 % (2,746–2,869), mostly in the command look-ups; RL.GCRA over the floor stayed within "
      "1.097–1.114.")
    w("")
    head = "| command | " + " | ".join(f"Ir/call run {i + 1}" for i in range(ROUNDS))
    head += " | spread | " + " | ".join(f"× floor run {i + 1}" for i in range(ROUNDS)) + " |"
    w(head)
    w("|---|" + "---:|" * (2 * ROUNDS + 1))
    for label, _argv, _stat in COMMANDS:
        per = [r[label]["per_call"] for r in rounds]
        spread = (max(per) - min(per)) / min(per) * 100 if min(per) else 0.0
        ratios = [r[label]["per_call"] / r[FLOOR]["per_call"] for r in rounds]
        w(f"| {label} | " + " | ".join(f"{p:,.0f}" for p in per) + f" | {spread:.1f} % | "
          + " | ".join(f"{x:.3f}" for x in ratios) + " |")
    w("")
    w("Commands: " + ", ".join("`" + " ".join("k" if a == "KEY" else a for a in argv) + "`"
                               for _label, argv, _stat in COMMANDS)
      + "; each `k` is `k:<random 0–99999>`. The parameters keep every key alive through the run, "
      "as INCR's and SET PX's keys are (one GCRA request holds its key 60 s; windows of an "
      "hour): keys expiring mid-run would be deleted inside a command or by the server's timer "
      "depending on timing, and the count would vary by a few percent. CL.THROTTLE's `99` is "
      "a capacity of 100, as the others.")
    w("")
    w("### Where RL.GCRA spends more than the floor (run 1)")
    w("")
    w("Files: `target/bench/callgrind/round-N/<command>.out` (callgrind_annotate or kcachegrind "
      "open them). Here per call = Ir / calls of processCommand in the file, the two CONFIG GET "
      "included (they add under 1 Ir per call, to Redis's own functions only).")
    w("")
    w("By step, for the floor and every RL command: every function outside the module that the "
      "module calls (module API, libc, the dynamic linker), with everything it calls; the "
      "module's own code; and what Redis does before and around the module. Each column adds "
      "up to its total. A step that runs only on some calls (creating a key: about 91 % of "
      "calls here) is averaged over all calls.")
    w("")
    lines += breakdown(rounds[0])
    w("")
    lines += compare(rounds[0][GCRA], rounds[0][FLOOR])
    w("")
    lines += fallback_section(rounds)
    return lines, rounds


def fallback_section(rounds):
    """Markdown lines: the fallback next to its reference scripts (issue 25)."""
    lines = []
    w = lines.append
    w("### The Lua fallback next to the scripts it replaces")
    w("")
    w(f"The same load (`redis-benchmark -c {CLIENTS} -n {REQUESTS} -P {PIPELINE} -r {KEYSPACE}`, "
      "random keys), but each row on a fresh redis-server of its own, with the library "
      "(`FUNCTION LOAD` of `scripts/lua/redis_rl.lua`) or the script (`SCRIPT LOAD` of "
      "`bench/lua/<name>.lua`, called by `EVALSHA`) loaded before the counters are zeroed; the "
      "module's column is its row in the table above, in the same run. Parameters as the "
      "module's rows: GCRA burst 100, 1 per 60 s; windows of 100 per hour; LEASE 100 slots, "
      "leases of an hour, one token per key; RL.ALL of a GCRA and a FIXED limit on two keys, "
      "against the sum of the two scripts. The reference scripts are the shapes teams write "
      "and do less: `fixed_window.lua` counts from a key's first request (INCR + EXPIRE), not "
      "in windows aligned to the epoch; `gcra.lua` and `sliding_window_two_keys.lua` compute "
      "in floating point; none checks its arguments; the sorted sets keep a member per request "
      "or holder. " + ", ".join(f"run {i + 1}" for i in range(len(rounds))) + " in each cell.")
    w("")
    lines += fallback_table(rounds)
    w("")
    w(f"On keys that already exist (one run, each row on a fresh server: {WARM_CALLS:,} calls "
      f"over {WARM_KEYS:,} keys, then the counters zeroed and {WARM_MEASURED:,} calls measured "
      "on the same keys: a GCRA or window state of the same parameters, a LOG of a few "
      "entries, a LEASE key whose one token renews its lease). The fallback's fast paths "
      "take these too; the reference scripts are as cheap here as on fresh keys, and "
      "`fixed_window.lua` cheaper (its INCR finds the key and its EXPIRE is skipped):")
    w("")
    lines += warm_table(rounds[0]["warm"])
    w("")
    w("Where each call's instructions go (run 1, per call; each column adds up to its total):")
    w("")
    lines += fallback_steps(rounds)
    w("")
    lines += fallback_paragraph(rounds[0])
    return lines


def fallback_paragraph(rnd):
    """Markdown lines: what the fallback spends beyond the steps every script pays."""
    own_row = ("the script's own Lua (the VM, string and struct helpers, GC steps of its "
               "allocations)")
    floor = rnd[FLOOR_FN]["per_call"]
    fixed_ref = rnd["fixed_window script"]["per_call"]
    gcra, _t = lua_steps(rnd["GCRA fallback"])
    ref, _t = lua_steps(rnd["gcra script"])
    all_fb = rnd["RL.ALL of GCRA + FIXED fallback"]["per_call"]
    singles = rnd["GCRA fallback"]["per_call"] + rnd["FIXED fallback"]["per_call"]
    return [
        "Where the remaining instructions go: most of a fallback call is the server's own work "
        "that any script pays — running the function with its KEYS and ARGV tables, each "
        "`redis.call` (look-up, ACL, the command, its reply turned into Lua values) and the "
        "five-integer reply turned back into RESP. A fallback call makes the calls its "
        "contract needs: `TIME` (the window or TAT is exact, from the server's clock), one "
        "bounded read (`GETRANGE key 0 63`, never the whole value of a foreign key) and one "
        "`SET … PXAT` (the absolute expiry replicas and the AOF receive). A Function that does "
        f"only `TIME`, `SET … NX PXAT` and the reply ({FLOOR_FN}, "
        f"`bench/lua/fallback_floor.lua`) costs {floor:,.0f}, as much as the whole "
        f"`fixed_window.lua` ({fixed_ref:,.0f}), which reads no clock and lets INCR + EXPIRE "
        "count from a key's first request: no exact, epoch-aligned FIXED reaches it. The "
        f"fallback's own Lua is {gcra[own_row]:,.0f} instructions per GCRA call "
        f"({ref[own_row]:,.0f} for `gcra.lua`): the fast path of plain numbers (no limb "
        "arithmetic, no struct, cached texts instead of number-to-text conversions), plus the "
        "Lua garbage collector, whose steps grow with the live objects of the whole library "
        "(its code and caches) — so the library keeps few cached strings. The memory check "
        "costs nothing: the server refuses the writing functions when out of memory "
        f"(R-FB-9). RL.ALL of two limits ({all_fb:,.0f}) costs about "
        f"its two single calls ({singles:,.0f}): one function call and one `TIME` fewer, but a "
        "reply of four nested tables, and an `EXISTS` for the second missing key so that no "
        "write is ever undone.",
    ]


def main():
    lines, _rounds = run()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
