#!/usr/bin/env bash
# Instruction counts behind BENCHMARKS.md's ratios (round trip and local
# heaps), which load cannot change: gpumem-bench-local and a fresh gpumemd
# (host backend), both under valgrind --tool=callgrind, once with --rounds 1
# and once with --rounds 2; one timed round is the difference of the two.
# Prints Ir per alloc+free pair (core, local, central client side, central
# daemon's packet handling) and per trace step (in process, local), and their ratios.
# Usage: bench/callgrind.sh [BUILD_DIR] [PAIRS]   (defaults: build, 20000)
set -euo pipefail
build="${1:-build}"
pairs="${2:-20000}"
dir="$(mktemp -d)"
trap 'kill "${daemon:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${dir}"' EXIT
for rounds in 1 2; do
        valgrind --tool=callgrind --callgrind-out-file="${dir}/daemon.${rounds}.%p" "${build}/daemon/gpumemd" \
                --backend host --capacity 8G --socket "${dir}/s.sock" --config /dev/null --metrics-listen none \
                2>"${dir}/daemon.${rounds}.log" &
        daemon=$!
        for _ in $(seq 400); do [ -S "${dir}/s.sock" ] && break; sleep 0.05; done
        # %p: the bench forks its ping-pong echo process, which writes a profile of its own.
        valgrind --tool=callgrind --callgrind-out-file="${dir}/bench.${rounds}.%p" "${build}/bench/gpumem-bench-local" \
                --socket "${dir}/s.sock" --rounds "${rounds}" --pairs "${pairs}" \
                --trace bench/traces/train_loop.csv >"${dir}/bench.${rounds}.txt" 2>"${dir}/bench.${rounds}.log"
        kill -TERM "${daemon}"
        wait "${daemon}" || true
        rm -f "${dir}/s.sock"
done
profile() { ls -S "${dir}/$1.$2".* | head -1; } # the largest: not the echo child
inclusive() { # FILE FUNCTION -> inclusive Ir of the function
        callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$1" |
                awk -v fn="$2" '!done && $0 ~ (":" fn " ") { gsub(",", "", $1); print $1; done = 1 }'
}
per_round() { # FUNCTION -> Ir of one timed round
        echo $(($(inclusive "$(profile bench 2)" "$1") - $(inclusive "$(profile bench 1)" "$1")))
}
central_pairs=$((pairs / 10))
core=$(($(per_round core_pairs) / pairs))
local_pair=$(($(per_round local_pairs) / pairs))
central=$(($(per_round central_pairs) / central_pairs))
pingpong=$(($(per_round pingpong) / central_pairs))
step_core=$(per_round step_core)
step_local=$(per_round step_client)
# The daemon's work for its connections' packets (on_conn_event, inclusive); its
# whole-process total also counts timer ticks, which grow with the run's wall time.
daemon_pair=$((($(inclusive "$(profile daemon 2)" on_conn_event) - $(inclusive "$(profile daemon 1)" on_conn_event)) / central_pairs))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
echo "# Ir per pair (callgrind, one timed round: --rounds 2 minus --rounds 1, ${pairs} local pairs)"
echo "core pair (gm_heap_alloc + gm_heap_free)         ${core}"
echo "local pair (gpumem_alloc + gpumem_free)          ${local_pair}   local / core $(ratio "${local_pair}" "${core}")"
echo "trace step in process                            ${step_core}"
echo "trace step local                                 ${step_local}   local / in process $(ratio "${step_local}" "${step_core}")"
echo "central pair, client process                     ${central}"
echo "central pair, daemon (reading and handling)     ${daemon_pair}"
echo "bare ping-pong, client process (user space only) ${pingpong}"
grep -h 'daemon messages per step' "${dir}/bench.2.txt" || true
