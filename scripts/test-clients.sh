#!/usr/bin/env bash
# Runs the Python (redis-py) and Node (node-redis) examples of docs/internals.md (From any
# language) and the HTTP service example's end-to-end test (examples/http/test_http.py, built
# on the redis_rl package in clients/python), against real redis-servers with the module.
# Needs the virtualenv made by test-compat.sh (or makes it) and npm. Prints one
# "test … ok/FAILED" line per example; exit status 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-compat
[ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" || exit 1
"$VENV/bin/pip" install -q --disable-pip-version-check "redis==8.1.0" ./clients/python || exit 1
(cd examples/clients/node && npm ci --no-audit --no-fund --silent) || { echo "npm ci failed"; exit 1; }
dir="$(mktemp -d)"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --dir "$dir" --logfile "$dir/log" --daemonize yes \
    --loadmodule "$PWD/target/release/libredis_rl.so"
trap 'redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
status=0
if REDIS_URL="redis://127.0.0.1:$port/0" timeout 60 "$VENV/bin/python" examples/clients/python_example.py >"$dir/py.out" 2>&1; then
    echo "test python_example ... ok"
else
    echo "test python_example ... FAILED"; cat "$dir/py.out"; status=1
fi
if (cd examples/clients/node && REDIS_URL="redis://127.0.0.1:$port" timeout 60 node example.mjs) >"$dir/node.out" 2>&1; then
    echo "test node_example ... ok"
else
    echo "test node_example ... FAILED"; cat "$dir/node.out"; status=1
fi
# The HTTP example: two service instances, fleet-wide limit, 429 headers, fail-open/closed.
http_out="$(RL_MODULE="$PWD/target/release/libredis_rl.so" timeout 300 "$VENV/bin/python" examples/http/test_http.py 2>&1)" || status=1
grep '^test ' <<<"$http_out"
exit "$status"
