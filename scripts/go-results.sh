# Sourced by scripts/test.sh and scripts/test-compat.sh: how a run of Go tests is counted.
#
# go_results LOG [PREFIX]: the outcomes in LOG, the output of `go test -v` (or of a test
# binary run with -test.v), one a line: "pass N" (its top-level --- PASS lines), "fail
# PREFIX<TestName>" for each top-level --- FAIL, "skip N" (top-level --- SKIP), and
# "notrun <PREFIX without ::>: go test stopped before its summary" when no line ends the run
# (go test's "ok"/"FAIL <package>", a test binary's "PASS"/"FAIL": a panic or a timeout
# prints neither). PREFIX defaults to clients/go::.
go_results() {
    local log=$1 prefix=${2:-clients/go::}
    if ! grep -Eq '^((ok|FAIL)[[:space:]]|(PASS|FAIL)$)' "$log"; then
        echo "notrun ${prefix%::}: go test stopped before its summary"
    fi
    awk '/^--- PASS: / {n++} END {if (n) print "pass " n}' "$log"
    awk -v prefix="$prefix" '/^--- FAIL: / {print "fail " prefix $3}' "$log"
    awk '/^--- SKIP: / {n++} END {if (n) print "skip " n}' "$log"
}

# go_tests FILE…: a -run pattern of the top-level tests defined in the Go test files FILE…
# ("^(TestA|TestB)$"), to choose tests by file as the Python and Rust suites are chosen.
go_tests() {
    echo "^($(grep -ho '^func Test[A-Za-z0-9_]*' "$@" | sed 's/^func //' | paste -sd'|'))\$"
}
