#!/bin/sh
# What diagnosis's sampling costs the daemon: a fresh gpumemd (host backend)
# under valgrind --tool=callgrind and SESSIONS clients that each hold cached
# memory, idle for about 12 s, once with central and once with local heaps.
# Prints, per session sample (one per session and tick), the instructions of
# the sampler (gm_diag_tick, ring included), of the ring alone
# (gm_sample_ring_record) and of the statistics-page reads the same tick
# already does for local sessions (gm_local_tick).
# Usage: bench/diag_tick.sh [BUILD_DIR] [SESSIONS]   (defaults: build, 32)
build="${1:-build}"
sessions="${2:-32}"
dir="$(mktemp -d)"
[ -n "${KEEP:-}" ] || trap 'rm -rf "${dir}"' EXIT
inclusive() { # FILE FUNCTION -> inclusive Ir of the function (0 when absent)
        callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$1" | grep -E ":$2 \[" | head -1 | awk '{gsub(",", "", $1); print $1}' |
                grep . || echo 0
}
calls() { # FILE FUNCTION -> times it was called (from its caller's annotated source line)
        callgrind_annotate --inclusive=yes "$1" | grep -E "=> .*:$2 \(" | sed -n 1p |
                sed -E 's/.*\(([0-9,]+)x\).*/\1/; s/,//g'
}
for mode in central local; do
        GPUMEM_HEAP="${mode}" valgrind --tool=callgrind --callgrind-out-file="${dir}/cg.${mode}" \
                "${build}/daemon/gpumemd" --backend host --capacity 4G --socket "${dir}/s.${mode}.sock" \
                --metrics-listen none >"${dir}/daemon.${mode}.log" 2>&1 &
        daemon=$!
        for _ in $(seq 600); do grep -q "listening on" "${dir}/daemon.${mode}.log" && break; sleep 0.05; done
        pids=""
        for _ in $(seq "${sessions}"); do
                (sleep 12) | GPUMEM_HEAP="${mode}" "${build}/tests/gm-test-client" "${dir}/s.${mode}.sock" cache \
                        4194304 2 >/dev/null &
                pids="${pids} $!"
        done
        sleep 14
        wait ${pids}
        kill -TERM "${daemon}"
        wait "${daemon}"
        f="${dir}/cg.${mode}"
        samples=$(calls "${f}" gm_sample_ring_record)
        tick=$(inclusive "${f}" gm_diag_tick)
        ring=$(inclusive "${f}" gm_sample_ring_record)
        pages=$(inclusive "${f}" gm_local_tick)
        [ -n "${KEEP:-}" ] && echo "${dir}"
        echo "${mode}: ${samples:-0} session samples; Ir per session sample: sampler $((tick / ${samples:-1}))," \
                "ring $((ring / ${samples:-1})), page reads of the same ticks $((pages / ${samples:-1}))"
done
