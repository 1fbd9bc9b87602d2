#!/usr/bin/env bash
# make test-loaded: runs scripts/test.sh (make test) while CPU-bound processes, one per core
# (LOAD_PROCS overrides), run beside it for the whole run: `stress --cpu N` (Debian's stress,
# installed by install-deps.sh when apt-get can), else one shell busy loop per core. Proves
# that no test depends on an idle machine. The load is stopped by its process group's id when
# the run ends, fails or is interrupted. Exits with make test's status; its summary line
# stays the last line but one, the last says whether the load ran throughout.
set -uo pipefail
cd "$(dirname "$0")/.."
procs=${LOAD_PROCS:-$(nproc)}
scripts/install-deps.sh stress >/dev/null 2>&1 || true
# Each load runs in a session (and process group) of its own, so that stopping it by that id
# also stops stress's workers.
pgids=()
if command -v stress >/dev/null 2>&1; then
    setsid stress --cpu "$procs" --quiet &
    pgids+=($!)
    what="stress --cpu $procs"
else
    for _ in $(seq "$procs"); do
        setsid sh -c 'while :; do :; done' &
        pgids+=($!)
    done
    what="$procs shell busy loops"
fi
stop_load() {
    for pgid in "${pgids[@]}"; do
        kill -TERM -- "-$pgid" 2>/dev/null
    done
    for pgid in "${pgids[@]}"; do
        wait "$pgid" 2>/dev/null
        # stress's workers leave after their parent: give them 5 s, then SIGKILL the group.
        for _ in $(seq 50); do
            kill -0 -- "-$pgid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pgid" 2>/dev/null
    done
    pgids=()
}
trap stop_load EXIT
trap 'stop_load; exit 130' INT
trap 'stop_load; exit 143' TERM
started=$(date +%s)
echo "test-loaded: $what beside make test (process groups ${pgids[*]}; load average $(cut -d' ' -f1-3 /proc/loadavg))"
scripts/test.sh
status=$?
alive=0
for pgid in "${pgids[@]}"; do
    kill -0 -- "-$pgid" 2>/dev/null && alive=$((alive + 1))
done
echo "test-loaded: $what ran beside the whole run: $alive of ${#pgids[@]} still running at its end, after $(( $(date +%s) - started )) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
[ "$alive" -eq "${#pgids[@]}" ] || status=1
exit "$status"
