#!/usr/bin/env bash
# /metrics scrape cost with many local sessions against one, as a ratio within
# one run: a fresh gpumemd (host backend, metrics on a unix socket), then
# gpumem-bench-metrics with 1 and with SESSIONS local sessions, alternately,
# ROUNDS times each; prints every run's median and the ratio of the medians
# of the two (median and range over the rounds).
# Usage: bench/scrape.sh [BUILD_DIR] [SESSIONS] [ROUNDS]   (defaults: build, 256, 3)
set -euo pipefail
build="${1:-build}"
sessions="${2:-256}"
rounds="${3:-3}"
dir="$(mktemp -d)"
trap 'kill "${daemon:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${dir}"' EXIT
"${build}/daemon/gpumemd" --backend host --capacity 8G --socket "${dir}/gpu0.sock" \
        --config /dev/null --metrics-listen "unix:${dir}/metrics.sock" 2>"${dir}/log" &
daemon=$!
for _ in $(seq 100); do [ -S "${dir}/gpu0.sock" ] && [ -S "${dir}/metrics.sock" ] && break; sleep 0.05; done
median_of() { # N -> the scrape median (µs) of one run with N local sessions
        GPUMEM_HEAP=local "${build}/bench/gpumem-bench-metrics" --socket "${dir}/gpu0.sock" \
                --metrics "unix:${dir}/metrics.sock" --sessions "$1" --scrapes 500 |
                awk '/median/ { for (i = 1; i <= NF; i++) if ($i ~ /median/) { v = $(i + 1); gsub("[^0-9.]", "", v); print v; exit } }'
}
ratios=()
for _ in $(seq "${rounds}"); do
        one=$(median_of 1)
        many=$(median_of "${sessions}")
        r=$(awk -v a="${many}" -v b="${one}" 'BEGIN { printf "%.2f", a / b }')
        echo "scrape median: 1 session ${one} us, ${sessions} sessions ${many} us, ratio ${r}"
        ratios+=("${r}")
done
printf '%s\n' "${ratios[@]}" | sort -n | awk -v s="${sessions}" '{ v[NR] = $1 } END {
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "scrape %s local sessions / 1 session: median %.2f (%.2f-%.2f)\n", s, m, v[1], v[NR] }'
