#!/usr/bin/env bash
# Runs every test: the pure core without the Redis crate, the reference check, the integration
# suites against a real redis-server (release module; the panic test uses the debug build) and
# README.md's examples (tests/readme.rs), rl-replay, then the Rust client package's tests,
# the gateway service's (gateway/), then the Python, Go and Node client packages' tests.
#
# Everything is built first, once: a build that fails stops the run there, with a line that
# names it ("build failed: …"). Then every suite runs, whatever happened to the ones before it
# (cargo's --no-fail-fast: each test binary runs even after another failed), and the last line
# counts what passed, what failed and the suites that could not run or stopped before their
# summary, and names them:
#   1203 passed, 2 failed, 0 suites not run (failed: tests/hostile.rs::one_call_…, …)
# The exit status is 0 only when nothing failed and every suite ran.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/go-results.sh
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
results="$work/results" # one line per outcome: "pass N", "fail NAME", "notrun NAME: WHY" ("skip N" not counted)
: >"$results"

export RL_MODULE="$PWD/target/release/libredis_rl.so"
# The debug module, as the integration suites' own build left it (a separate `cargo build`
# resolves the host crates' features without the dev-dependencies, so it and
# `cargo test --test '*'` would rebuild the crate over each other).
export RL_DEBUG_MODULE="$PWD/target/debug/deps/libredis_rl.so"

# build CMD…: runs one build step; a failure ends the run.
build() {
    echo "+ $*"
    "$@" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo
        echo "build failed: $* (exit $rc): no suite ran"
        exit "$rc"
    fi
}

# cargo_suites PREFIX CARGO-ARGS…: runs `cargo test --no-fail-fast CARGO-ARGS…` and records
# each test binary's counts and failed tests, named PREFIX + the binary's source path (as
# cargo prints it, relative to the package); a binary that printed no summary did not run
# to its end.
cargo_suites() {
    local prefix=$1
    shift
    local log="$work/cargo.log"
    echo "+ cargo test --no-fail-fast $*"
    cargo test --no-fail-fast "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    awk -v prefix="$prefix" '
        function close_suite() {
            if (suite != "" && !done) print "notrun " suite ": stopped before its summary"
            suite = ""; done = 0
        }
        /^ +Running / {
            close_suite()
            path = ($2 == "unittests") ? $3 : $2
            suite = prefix path
            next
        }
        /^ +Doc-tests / { close_suite(); suite = prefix "doc-tests " $2; next }
        /^test .* \.\.\. FAILED$/ {
            name = $0
            sub(/^test /, "", name)
            sub(/ \.\.\. FAILED$/, "", name)
            print "fail " suite "::" name
            next
        }
        /^test result: / {
            for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^passed/) print "pass " $i
            done = 1
            next
        }
        END { close_suite() }
    ' "$log" >>"$results"
    # A failing cargo that printed no test binary at all (e.g. it could not start).
    if [ "$rc" -ne 0 ] && ! grep -Eq '^ +(Running|Doc-tests) ' "$log"; then
        echo "notrun ${prefix:-$*}: cargo test exited $rc before running a test" >>"$results"
    fi
}

# ---- Builds: the module once in release, every test binary once.
started=$SECONDS
build cargo build --release
build cargo test --no-run --lib --no-default-features
build cargo test --no-run --test '*'
build cargo test --no-run --profile replay -p rl-replay
# The Rust client in its own profile (the release settings in target/clients/: see Cargo.toml),
# and README.md's Rust examples compiled as written against it (docs/snippets/), which
# tests/readme.rs runs.
build cargo test --no-run --profile clients -p redis-rl-client
build cargo build --profile clients -p readme-snippets
# The gateway service (gateway/, rl-gateway) in the same profile: it links the client.
build cargo test --no-run --profile clients -p rl-gateway

# ---- The Python package (clients/python): installed (not editable, as users get it) into the
# virtualenv .venv-py with its test extras, before the suites: its own tests and
# tests/readme.rs (the README's Python examples) run with it.
PYVENV=.venv-py
py_ready=1
if [ ! -x "$PYVENV/bin/pip" ]; then
    echo "+ python3 -m venv $PYVENV"
    python3 -m venv "$PYVENV" || py_ready=0
fi
if [ "$py_ready" -eq 1 ]; then
    echo "+ $PYVENV/bin/pip install ./clients/python[test]"
    "$PYVENV/bin/pip" install -q --disable-pip-version-check "./clients/python[test]" || py_ready=0
fi
export RL_PYTHON="$PWD/$PYVENV/bin/python"

# ---- The gateway's Python gRPC client test (gateway/tests/python.rs: stubs compiled at test
# time from the .proto files envoy-types ships): grpcio and grpcio-tools in a virtualenv of
# their own, .venv-gateway. Without them that test skips, recorded here as not run.
GWVENV=.venv-gateway
if { [ -x "$GWVENV/bin/pip" ] || python3 -m venv "$GWVENV"; } &&
    "$GWVENV/bin/pip" install -q --disable-pip-version-check grpcio grpcio-tools; then
    export RL_GATEWAY_PYTHON="$PWD/$GWVENV/bin/python"
else
    echo "notrun gateway/tests/python.rs: grpcio and grpcio-tools did not install" >>"$results"
fi

# ---- The Go package (clients/go): its modules downloaded, its tests compiled. No go generate:
# the suite runs on the committed copy of the Lua library (clients/go/redis_rl.lua), so
# TestLibraryIsTheRepositoryCopy fails when that copy is stale.
build go -C clients/go test -count=1 -run '^$' ./...
build go -C clients/go/rlgin test -count=1 -run '^$' ./...

# ---- The Node package (clients/node): its dev dependencies from the lock file (npm ci, when
# not installed yet), then built as it is packed (dist/: ESM, CommonJS, the Lua fallback from
# scripts/lua/redis_rl.lua) and its tests compiled (build/).
if [ ! -d clients/node/node_modules ]; then
    build npm --prefix clients/node ci --no-audit --no-fund
fi
build npm --prefix clients/node run --silent build
build npm --prefix clients/node run --silent build:test

# ---- Suites.
built=$SECONDS
# The pure core, without the Redis crate.
cargo_suites "" --lib --no-default-features
# docs/reference.md: every named file, function and test exists.
echo "+ python3 scripts/check-reference.py"
if python3 scripts/check-reference.py; then
    echo "pass 1" >>"$results"
else
    echo "fail scripts/check-reference.py" >>"$results"
fi
# The integration suites against a real server, and README.md's examples run as written
# (tests/readme.rs).
cargo_suites "" --test '*'
# rl-replay (workspace crate replay/): parsers, engine, CLI end to end, and the comparison
# with a real server running the release module.
cargo_suites "replay/" --profile replay -p rl-replay
# The Rust client crate (clients/rust): limits, decisions, fast path, leases, failure policy
# (servers stopped and paused mid-run), a three-master cluster and two axum servers sharing
# one limit, each against real servers with the module and without it (the Lua fallback).
cargo_suites "clients/rust/" --profile clients -p redis-rl-client
# The gateway (gateway/): its configuration (envoyproxy/ratelimit's format, a fuzz of the
# parser), Envoy's rate limit service over gRPC and the forward-auth endpoint, each with the
# binary run against real servers with the module and without it, Redis stopped mid-run,
# reloads under load, and real nginx and Caddy in front of an upstream (make gateway-deps
# installs them, and a proxy test fails without its proxy).
cargo_suites "gateway/" --profile clients -p rl-gateway
# The Python client package's pytest suite against real servers (mypy --strict is one of its
# tests), in the virtualenv installed above.
pylog="$work/pytest.log"
if [ "$py_ready" -eq 0 ]; then
    echo "notrun clients/python/tests: the package and its test dependencies did not install" >>"$results"
else
    echo "+ pytest clients/python/tests"
    "$PYVENV/bin/python" -m pytest -q -rfE -p no:cacheprovider clients/python/tests 2>&1 | tee "$pylog"
    pyrc=${PIPESTATUS[0]}
    summary=$(grep -E '[0-9]+ (passed|failed|errors?)' "$pylog" | grep -E ' in [0-9.]+s' | tail -1)
    if [ -z "$summary" ]; then
        echo "notrun clients/python/tests: pytest exited $pyrc before its summary" >>"$results"
    else
        grep -Eo '[0-9]+ passed' <<<"$summary" | awk '{print "pass " $1}' >>"$results"
        grep -E '^(FAILED|ERROR) ' "$pylog" | awk '{print "fail " $2}' >>"$results"
        # Failures pytest counted but did not name (should not happen with -rfE).
        counted=$(grep -Eo '[0-9]+ (failed|errors?)' <<<"$summary" | awk '{s += $1} END {print s + 0}')
        named=$(grep -cE '^(FAILED|ERROR) ' "$pylog")
        for _ in $(seq $((counted - named))); do echo "fail clients/python/tests (unnamed)" >>"$results"; done
    fi
fi

# The Go package (clients/go): the behaviour suite against real servers with the module and
# without it (the Lua fallback), the failure policies (servers stopped and paused mid-run),
# leases, a three-master cluster, the net/http middleware and the gin adapter, and its README's
# go blocks compiled and vetted as written (readme_test.go); each top-level test counts once. Then each fuzz target
# (escaping, the limit and seconds grammars, client IP, paths, key functions) for a bounded
# time.
golog="$work/go.log"
echo "+ go test -v ./... (clients/go)"
# (rlgin, the gin adapter, is a module of its own so that the core does not depend on gin.)
(cd clients/go && go test -count=1 -v ./...; cd rlgin && go test -count=1 -v ./...) 2>&1 | tee "$golog" | grep -E '^(--- |ok |FAIL|panic)'
# Each top-level test counts once; no ok/FAIL line is a suite not run (scripts/go-results.sh,
# which test-compat.sh counts its Go runs with too).
go_results "$golog" >>"$results"
# A failing input (Go writes it under testdata/fuzz and says so) always fails the target. A run
# that ends without one (the engine lost a worker: seen once on a host loaded by other work) is
# shown and run once more, and fails the target if it fails again.
fuzzlog=$(mktemp)
fuzz_once() {
    (cd clients/go && go test -run '^$' -fuzz "^$1\$" -fuzztime "${GO_FUZZ_TIME:-10s}" "$2") >"$fuzzlog" 2>&1
}
for target in .:FuzzSafeKeyPart .:FuzzParseLimits .:FuzzParseSeconds ./rlhttp:FuzzClientIP ./rlhttp:FuzzNormalizePath ./rlhttp:FuzzKeyFunctions; do
    pkg=${target%%:*} fuzz=${target#*:}
    echo "+ go test -fuzz $fuzz -fuzztime ${GO_FUZZ_TIME:-10s} $pkg (clients/go)"
    if fuzz_once "$fuzz" "$pkg"; then
        tail -3 "$fuzzlog"
        echo "pass 1" >>"$results"
        continue
    fi
    grep -v '^fuzz: elapsed' "$fuzzlog" | tail -30
    if ! grep -q 'Failing input written to' "$fuzzlog"; then
        echo "+ go test -fuzz $fuzz again: it stopped without a failing input (clients/go)"
        if fuzz_once "$fuzz" "$pkg"; then
            tail -3 "$fuzzlog"
            echo "pass 1" >>"$results"
            continue
        fi
        grep -v '^fuzz: elapsed' "$fuzzlog" | tail -30
    fi
    echo "fail clients/go::$fuzz" >>"$results"
done
rm -f "$fuzzlog"

# The Node package (clients/node): node --test over its compiled tests, against real servers
# with the module and without it (the Lua fallback), through ioredis and node-redis, with the
# failure policies (servers stopped and paused mid-run), a three-master cluster, and the packed
# package loaded by import and require. Each test counts once (suites do not); its reporter
# (clients/node/scripts/results-reporter.mjs) writes the outcomes in this file's format and
# a "notrun" line when the run stopped before node's summary.
noderesults="$work/node.results"
: >"$noderesults"
echo "+ node --test build/test/*.test.js (clients/node)"
(cd clients/node && node --test --test-concurrency=1 --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=./scripts/results-reporter.mjs --test-reporter-destination="$noderesults" build/test/*.test.js) 2>&1
if [ -s "$noderesults" ]; then
    cat "$noderesults" >>"$results"
else
    echo "notrun clients/node: node --test wrote no results" >>"$results"
fi

# ---- Summary.
passed=$(awk '$1 == "pass" {s += $2} END {print s + 0}' "$results")
failed=$(grep -c '^fail ' "$results")
notrun=$(grep -c '^notrun ' "$results")
# names KIND: the recorded names of one kind, joined by ", ".
names() { awk -v kind="$1" '$1 == kind { sub(/^[a-z]+ /, ""); out = out (n++ ? ", " : "") $0 } END { print out }' "$results"; }
details=""
[ "$failed" -eq 0 ] || details="failed: $(names fail)"
[ "$notrun" -eq 0 ] || details="${details:+$details; }not run: $(names notrun)"
line="$passed passed, $failed failed, $notrun suite$([ "$notrun" -eq 1 ] || echo s) not run"
[ -z "$details" ] || line="$line ($details)"
echo
# How long it took (README.md's build and test times are read from this line).
echo "builds and installs $((built - started)) s, suites $((SECONDS - built)) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
echo "$line"
[ "$failed" -eq 0 ] && [ "$notrun" -eq 0 ]
