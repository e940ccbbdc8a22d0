#!/usr/bin/env bash
# Run the test suite N times while BUSY busy loops compete for the CPUs (issue 10: the suite
# must pass on a loaded machine, not only an idle one).
#
#   scripts/suite_under_load.sh N BUSY [PYTEST ARGS...]
#
# Starts BUSY busy loops, records their PIDs, and ends exactly those PIDs on exit (trap EXIT,
# also on Ctrl-C). Runs the README's test command (python3 -m pytest -q, plus any extra args,
# e.g. a test folder) N times from the repository root, prints one line per run (exit code,
# pytest's closing line, seconds) and exits 1 if any run failed.
set -u

if [ "$#" -lt 2 ] || ! [ "$1" -ge 1 ] 2>/dev/null || ! [ "$2" -ge 0 ] 2>/dev/null; then
    echo "usage: $0 N BUSY [PYTEST ARGS...]  (N >= 1 runs, BUSY >= 0 busy loops)" >&2
    exit 64
fi
runs=$1
busy=$2
shift 2
cd "$(dirname "$0")/.." || exit 1

pids=()
stop_busy() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
}
trap stop_busy EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 "$busy"); do
    sh -c 'while :; do :; done' &
    pids+=("$!")
done
echo "busy loops: ${pids[*]:-none}"

failed=0
log=$(mktemp)
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    python3 -m pytest -q "$@" >"$log" 2>&1
    code=$?
    seconds=$(( $(date +%s) - start ))
    closing=$(grep -E '^=* ?[0-9]+ (passed|failed|error|skipped|deselected)|^=* ?no tests ran' "$log" | tail -n 1)
    [ -n "$closing" ] || closing=$(tail -n 1 "$log")
    echo "run $i: exit $code, $closing, ${seconds}s"
    if [ "$code" -ne 0 ]; then
        failed=1
        cp "$log" "suite_under_load.run$i.log" 2>/dev/null && echo "  output kept in suite_under_load.run$i.log"
    fi
done
rm -f "$log"
exit "$failed"
