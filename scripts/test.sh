#!/usr/bin/env bash
# Runs every test: the pure core without the Redis crate, then the integration suites against
# a real redis-server (release module; the panic test uses the debug build). Ends with one
# summary line: "N passed, N failed".
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
run cargo build
[ "$status" -eq 0 ] || { echo "build failed"; exit "$status"; }
run cargo test --lib --no-default-features
RL_MODULE="$PWD/target/release/libredis_rl.so" RL_DEBUG_MODULE="$PWD/target/debug/libredis_rl.so" \
    run cargo test --test '*'
# rl-replay (workspace crate replay/): parsers, engine, CLI end to end, and the comparison
# with a real server running the release module.
RL_MODULE="$PWD/target/release/libredis_rl.so" run cargo test --release -p rl-replay
passed=$(grep -Eo '^test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s += $1} END {print s + 0}')
echo
echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ] && [ "$status" -eq 0 ]; then status=1; fi
exit "$status"
