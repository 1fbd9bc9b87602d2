#!/usr/bin/env bash
# make fuzz: coverage-guided fuzzing (libFuzzer through cargo-fuzz) of the pure parts that
# read untrusted bytes: the state/effect decoders and the number parsers. Each target runs
# for FUZZ_TIME seconds (default 60) from the committed corpus in fuzz/corpus/ (which holds
# every past finding); new interesting inputs go to fuzz/work/, not into the repository.
# cargo-fuzz needs nightly-only compiler flags; on the stable toolchain they are enabled with
# RUSTC_BOOTSTRAP=1, for this build only.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_TIME="${FUZZ_TIME:-60}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
for target in decode_state parse_numbers; do
    echo "== fuzzing $target for ${FUZZ_TIME}s"
    mkdir -p "fuzz/work/$target"
    # A finding is written to fuzz/artifacts/<target>/ and makes this fail: add it to
    # fuzz/corpus/<target>/ and a regression test once fixed.
    cargo fuzz run "$target" "fuzz/work/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$FUZZ_TIME" -max_len=4096 -timeout=10
done
echo "fuzz: no crash, no panic, no hang in ${FUZZ_TIME}s per target"
