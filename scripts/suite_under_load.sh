#!/usr/bin/env bash
# Run the test suite RUNS times on a machine made busy on purpose: BUSY_PER_CPU busy loops per
# CPU, and a memory-hungry neighbour that keeps a share of the RAM in use and re-writes it
# (page faults, cache and memory bandwidth taken from the suite). The suite must pass there,
# not only on an idle machine (the README's test section).
#
#   scripts/suite_under_load.sh RUNS BUSY_PER_CPU [PYTEST ARGS...]
#   scripts/suite_under_load.sh 5 3                  # three busy loops per CPU, five runs
#   scripts/suite_under_load.sh 1 1 tests/wire       # one run of one folder
#
# XSTAGE_LOAD_MEMORY_SHARE (default 0.25): the neighbour's share of MemAvailable at the start.
# XSTAGE_LOAD_RECORDS (default docs/records/suite-under-load): where each run's log goes.
#
# Starts the neighbours, records their PIDs, and ends exactly those PIDs on exit (trap EXIT,
# also on Ctrl-C). Runs the README's test command (python3 -m pytest -q, plus any extra args)
# RUNS times from the repository root and writes one log per run: its start (UTC), duration,
# load average (at the start, at the end, and the highest of samples every 10 s), the
# neighbours, pytest's closing line and every failure. Prints one line per run and exits 1 if
# any run failed.
set -u

if [ "$#" -lt 2 ] || ! [ "$1" -ge 1 ] 2>/dev/null || ! [ "$2" -ge 0 ] 2>/dev/null; then
    echo "usage: $0 RUNS BUSY_PER_CPU [PYTEST ARGS...]  (RUNS >= 1, BUSY_PER_CPU >= 0 busy loops per CPU)" >&2
    exit 64
fi
runs=$1
per_cpu=$2
shift 2
cd "$(dirname "$0")/.." || exit 1

cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
busy=$((per_cpu * cpus))
share=${XSTAGE_LOAD_MEMORY_SHARE:-0.25}
records=${XSTAGE_LOAD_RECORDS:-docs/records/suite-under-load}
mkdir -p "$records" || exit 1

pids=()
stop_neighbours() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
}
trap stop_neighbours EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 "$busy"); do
    sh -c 'while :; do :; done' &
    pids+=("$!")
done
# The memory-hungry neighbour: holds SHARE of MemAvailable and writes every page again, forever.
python3 - "$share" <<'EOF' &
import sys
share = float(sys.argv[1])
avail = 0
with open("/proc/meminfo") as f:
    for line in f:
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
size = max(64 << 20, int(avail * share))
block = bytearray(size)
print(f"memory neighbour: {size >> 20} MiB", flush=True)
step = 4096
while True:
    for i in range(0, size, step * 64):
        block[i:i + step] = b"\x5a" * step
EOF
pids+=("$!")
mem_pid=$!
echo "busy loops: $busy ($per_cpu per CPU x $cpus CPUs); memory neighbour pid $mem_pid (${share} of MemAvailable)"

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

failed=0
out=$(mktemp)
samples=$(mktemp)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " (with uncommitted changes)")
for i in $(seq 1 "$runs"); do
    start_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    start=$(date +%s)
    load_start=$(loadavg)
    : >"$samples"
    ( while :; do loadavg >>"$samples"; sleep 10; done ) &
    sampler=$!
    python3 -m pytest -q "$@" >"$out" 2>&1
    code=$?
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    seconds=$(( $(date +%s) - start ))
    load_end=$(loadavg)
    load_max=$(awk 'BEGIN { m = 0 } { if ($1 > m) m = $1 } END { print m }' "$samples")
    closing=$(grep -E '^=* ?[0-9]+ (passed|failed|error|skipped|deselected)|^=* ?no tests ran' "$out" | tail -n 1)
    [ -n "$closing" ] || closing=$(tail -n 1 "$out")
    log="$records/$(date -u -d "@$start" +%Y%m%dT%H%M%SZ)-run$i.log"
    {
        echo "suite under load: run $i of $runs"
        echo "command: python3 -m pytest -q $*"
        echo "commit: $commit$dirty"
        echo "start: $start_utc"
        echo "duration: ${seconds}s"
        echo "cpus: $cpus"
        echo "busy loops: $busy ($per_cpu per CPU)"
        echo "memory neighbour: ${share} of MemAvailable"
        echo "load average at start: $load_start"
        echo "load average at end: $load_end"
        echo "load average, highest 1-minute sample: $load_max"
        echo "exit: $code"
        echo "closing line: $closing"
        echo "failures:"
        grep -E '^(FAILED|ERROR) ' "$out" || echo "  none"
    } >"$log"
    echo "run $i: exit $code, $closing, ${seconds}s, load $load_start -> $load_end (max $load_max); log $log"
    if [ "$code" -ne 0 ]; then
        failed=1
        cp "$out" "${log%.log}.output" && echo "  full output kept in ${log%.log}.output (not for committing)"
    fi
done
rm -f "$out" "$samples"
exit "$failed"
