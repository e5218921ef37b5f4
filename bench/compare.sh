#!/usr/bin/env bash
# The allocator core against its PyTorch-style peer (bench/torch_peer.cpp),
# both driven through one loop (bench/alloc_core.c), in one command:
#  1. instructions per op (callgrind, --toggle-collect=timed_pairs: only the
#     timed loop, less the same loop with no allocator, --impl none; one op =
#     one alloc or one free: that difference / (2 x PAIRS)) at 1k,
#     10k, 100k and 1M live blocks, native and expandable, and their ratio
#     core / torch (load cannot change these);
#  2. wall time per op, interleaved rounds (gpumem-bench-alloc --interleave):
#     core and torch at 1k and 1M live, median and range over the rounds of
#     the growth 1k -> 1M and of core / torch;
#  3. the central cached pair (gpumem_alloc + gpumem_free, 4 KiB and 1 MiB)
#     against the bare SOCK_SEQPACKET ping-pong, through a fresh gpumemd
#     (host backend), frees sent on their own and carried
#     (GPUMEM_CARRY_FREES=1): instructions per pair on both sides (client
#     and daemon under callgrind, gpumem-bench-roundtrip with 2,000 and
#     12,000 pairs, per pair the difference / 10,000; the daemon's is
#     on_conn_event, inclusive) and the interleaved wall median and range of
#     central / ping-pong (gpumem-bench-local, ROUNDS rounds).
# Usage: bench/compare.sh [BUILD_DIR] [PAIRS] [ROUNDS]   (defaults: build, 100000, 9)
set -euo pipefail
build="${1:-build}"
pairs="${2:-100000}"
rounds="${3:-9}"
bin="${build}/bench/gpumem-bench-alloc"
dir="$(mktemp -d)"
daemon=0
trap 'kill "${daemon}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${dir}"' EXIT
collected() { # IMPL LIVE MODE -> Ir of the timed loop (callgrind's total with --toggle-collect)
        local out="${dir}/cg.$1.$2.$3"
        valgrind --tool=callgrind --toggle-collect=timed_pairs --callgrind-out-file="${out}" \
                "${bin}" --impl "$1" "$2" "${pairs}" "$3" >/dev/null 2>"${out}.log"
        callgrind_annotate --auto=no "${out}" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
}
ops_ir() { # IMPL LIVE MODE -> Ir per op, the loop's own share (impl none) left out
        echo $((($(collected "$1" "$2" "$3") - loop) / (2 * pairs)))
}
loop=$(collected none 1000 native)
echo "# instructions per op (callgrind, ${pairs} timed pairs, the loop's own ${loop} Ir left out)"
printf '%-11s %9s %9s %9s %7s\n' mode live core torch ratio
for mode in native expandable; do
        for live in 1000 10000 100000 1000000; do
                c=$(ops_ir core "${live}" "${mode}")
                t=$(ops_ir torch "${live}" "${mode}")
                printf '%-11s %9s %9s %9s %7s\n' "${mode}" "${live}" "${c}" "${t}" \
                        "$(awk -v a="${c}" -v b="${t}" 'BEGIN { printf "%.3f", a / b }')"
        done
done
echo
echo "# wall time per op (interleaved rounds)"
"${bin}" --interleave "${rounds}" $((pairs * 5)) 1000000

daemon_start() { # [VALGRIND...] -> a fresh gpumemd on ${dir}/s.sock, its pid in ${daemon}
        rm -f "${dir}/s.sock"
        "$@" "${build}/daemon/gpumemd" --backend host --capacity 8G --socket "${dir}/s.sock" --config /dev/null \
                --metrics-listen none 2>>"${dir}/daemon.log" &
        daemon=$!
        for _ in $(seq 400); do [ -S "${dir}/s.sock" ] && break; sleep 0.05; done
}
daemon_stop() {
        kill -TERM "${daemon}"
        wait "${daemon}" || true
        daemon=0
}
inclusive() { # FILE FUNCTION -> inclusive Ir of the function
        callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$1" |
                awk -v fn="$2" '!done && $0 ~ (":" fn " ") { gsub(",", "", $1); print $1; done = 1 }'
}
central_ir() { # SIZE ITERS -> "client_Ir daemon_Ir" of one run, frees as GPUMEM_CARRY_FREES says
        daemon_start valgrind --tool=callgrind --callgrind-out-file="${dir}/d.$1.$2"
        # %p: the pairs run in a forked client process, the largest profile.
        valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="${dir}/c.$1.$2.%p" \
                "${build}/bench/gpumem-bench-roundtrip" --socket "${dir}/s.sock" --size "$1" --iters "$2" >/dev/null 2>&1
        daemon_stop
        local prof
        prof=$(ls -S "${dir}/c.$1.$2".* | head -1)
        local client=$(($(inclusive "${prof}" gpumem_alloc) + $(inclusive "${prof}" gpumem_free)))
        echo "${client} $(inclusive "${dir}/d.$1.$2" on_conn_event)"
}
pingpong_ir() { # ITERS -> Ir of the bouncing process's sends and receives (not its echo child's)
        valgrind --tool=callgrind --callgrind-out-file="${dir}/p.$1.%p" "${build}/bench/gpumem-bench-pingpong" \
                --iters "$1" >/dev/null 2>&1 &
        local pid=$!
        wait "${pid}"
        echo $(($(inclusive "${dir}/p.$1.${pid}" gm_ipc_send) + $(inclusive "${dir}/p.$1.${pid}" gm_ipc_recv)))
}
echo
echo "# central cached pair / bare ping-pong (fresh gpumemd, host backend)"
echo "bare ping-pong, client process (user space only): $((($(pingpong_ir 12000) - $(pingpong_ir 2000)) / 10000)) Ir per round trip"
printf '%-8s %-8s %10s %10s %s\n' size frees client_Ir daemon_Ir "wall central / ping-pong (interleaved, ${rounds} rounds)"
for size in 4096 1048576; do
        for carry in 0 1; do
                export GPUMEM_CARRY_FREES="${carry}"
                read -r c1 d1 < <(central_ir "${size}" 2000)
                read -r c2 d2 < <(central_ir "${size}" 12000)
                daemon_start
                wall=$("${build}/bench/gpumem-bench-local" --socket "${dir}/s.sock" --size "${size}" \
                        --rounds "${rounds}" --pairs 100000 | awk '/^central \/ pingpong/ { sub(/^central \/ pingpong \(pair\) +/, ""); print }')
                daemon_stop
                printf '%-8s %-8s %10s %10s %s\n' "${size}" "$([ "${carry}" = 1 ] && echo carried || echo own)" \
                        $(((c2 - c1) / 10000)) $(((d2 - d1) / 10000)) "${wall}"
        done
done
unset GPUMEM_CARRY_FREES
