#!/usr/bin/env bash
# Runs every test: the pure core without the Redis crate, then the integration suites against
# a real redis-server (release module; the panic test uses the debug build), then the Rust
# and Python client packages' tests. Ends with one summary line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
run() {
    echo "+ $*"
    "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || status=$rc
}
run cargo build --release
[ "$status" -eq 0 ] || { echo "build failed"; exit "$status"; }
run cargo test --lib --no-default-features
run python3 scripts/check-reference.py  # docs/reference.md: every named file, function and test exists
RL_MODULE="$PWD/target/release/libredis_rl.so" RL_DEBUG_MODULE="$PWD/target/debug/deps/libredis_rl.so" \
    run cargo test --test '*'
# rl-replay (workspace crate replay/): parsers, engine, CLI end to end, and the comparison
# with a real server running the release module.
RL_MODULE="$PWD/target/release/libredis_rl.so" run cargo test --profile replay -p rl-replay
# The Rust client crate (clients/rust): limits, decisions, fast path, leases, failure policy
# (servers stopped and paused mid-run), a three-master cluster and two axum servers sharing
# one limit, each against real servers with the module and without it (the Lua fallback).
RL_MODULE="$PWD/target/release/libredis_rl.so" run cargo test --release -p redis-rl-client
# The Python client package (clients/python): installed (not editable, as users get it) into
# the virtualenv .venv-py with its test extras, then its pytest suite against real servers
# (mypy --strict is one of its tests).
pylog="$(mktemp)"
trap 'rm -f "$log" "$pylog"' EXIT
PYVENV=.venv-py
if [ ! -x "$PYVENV/bin/pip" ]; then
    run python3 -m venv "$PYVENV"
fi
run "$PYVENV/bin/pip" install -q --disable-pip-version-check "./clients/python[test]"
echo "+ pytest clients/python/tests"
RL_MODULE="$PWD/target/release/libredis_rl.so" "$PYVENV/bin/python" -m pytest -q -p no:cacheprovider \
    clients/python/tests 2>&1 | tee "$pylog"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
passed=$(grep -Eo '^test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s += $1} END {print s + 0}')
pysummary=$(grep -E '[0-9]+ (passed|failed|error)' "$pylog" | grep -E ' in [0-9.]+s' | tail -1)
pypassed=$(grep -Eo '[0-9]+ passed' <<<"$pysummary" | awk '{print $1 + 0}')
pyfailed=$(grep -Eo '[0-9]+ (failed|errors?)' <<<"$pysummary" | awk '{s += $1} END {print s + 0}')
[ -n "$pysummary" ] || pyfailed=$((pyfailed + 1))  # pytest did not run to its summary
passed=$((passed + ${pypassed:-0}))
failed=$((failed + pyfailed))
echo
echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ] && [ "$status" -eq 0 ]; then status=1; fi
exit "$status"
