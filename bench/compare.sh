#!/usr/bin/env bash
# Every row of issue 26's Goals table in one command, each with its goal and
# "met" or "missed by X" (the figure less the goal, and by how many per cent
# it is over), the table again at the end. Ratios are taken within one run:
#  1. core instructions per op against the PyTorch-style peer
#     (bench/torch_peer.cpp), both driven through one loop
#     (bench/alloc_core.c): callgrind, --toggle-collect=timed_pairs (only the
#     timed loop), less the same loop with no allocator (--impl none); one op
#     = one alloc or one free: that difference / (2 x PAIRS); at 1k, 10k, 100k
#     and 1M live blocks (--quick: 1k and 1M), native and expandable, and
#     their ratio core / torch (load cannot change these); the goal is judged
#     on the largest ratio;
#  2. core wall growth 1k -> 1M live, interleaved rounds
#     (gpumem-bench-alloc --interleave): core and torch at 1k and 1M, median
#     and range over the rounds of the growth and of core / torch;
#  3. the local cached pair (gpumem_alloc + gpumem_free in a local session)
#     against the peer's pair of the same size (torch_pairs in
#     gpumem-bench-local), 4 KiB, 1 MiB and 24 MiB, and a replay of each
#     trace (bench/traces: train_loop and convnet, training; infer_kv,
#     inference) in a local session against the same replay on the peer
#     (step_client / step_torch): instructions from gpumem-bench-local under
#     callgrind (--rounds 2 less --rounds 1, inclusive Ir of each loop), and
#     the interleaved wall medians and ranges of gpumem-bench-local; judged
#     on the instructions;
#  4. the steady training step (train_loop.csv) local / in process
#     (step_client / step_core), the same runs; judged on the instructions;
#  5. the central cached pair (4 KiB and 1 MiB; --quick: 4 KiB) against the
#     bare SOCK_SEQPACKET ping-pong, frees sent on their own and carried
#     (GPUMEM_CARRY_FREES=1): instructions per pair on both sides (client
#     and daemon under callgrind, gpumem-bench-roundtrip with 2,000 and
#     12,000 pairs (--quick: 1,000 and 6,000), per pair the difference /
#     10,000 (5,000); the daemon's is
#     on_conn_event, inclusive) and the interleaved wall median and range of
#     central / ping-pong (gpumem-bench-local); judged on the wall medians
#     (a ping-pong is almost all kernel time, which callgrind does not count);
#  6. the /metrics scrape at 256 local sessions / 1 session (bench/scrape.sh);
#     judged on its median.
# Every gpumem-bench-local run gets a fresh gpumemd (host backend).
# Usage: bench/compare.sh [--quick] [BUILD_DIR] [PAIRS] [ROUNDS]
#   (defaults: build, 100000, 9; --quick: 20000 pairs, 5 rounds, fewer live
#   sizes, traces and central sizes: about 5 minutes on the 2 shared cores
#   at load average 6-8; the full run about three times that)
set -euo pipefail
quick=0
if [ "${1:-}" = --quick ]; then
        quick=1
        shift
fi
build="${1:-build}"
pairs="${2:-$([ "${quick}" = 1 ] && echo 20000 || echo 100000)}"
rounds="${3:-$([ "${quick}" = 1 ] && echo 5 || echo 9)}"
if [ "${quick}" = 1 ]; then
        lives="1000 1000000" local_pairs=2000 wall_pairs=50000 central_sizes=4096 central_iters="1000 6000"
        traces="train_loop infer_kv"
else
        lives="1000 10000 100000 1000000" local_pairs=5000 wall_pairs=200000 central_sizes="4096 1048576"
        central_iters="2000 12000"
        traces="train_loop convnet infer_kv"
fi
here="$(cd "$(dirname "$0")" && pwd)"
bin="${build}/bench/gpumem-bench-alloc"
dir="$(mktemp -d)"
daemon=0
# (daemon 0 is no daemon: kill 0 would signal this whole process group)
trap '[ "${daemon}" = 0 ] || kill "${daemon}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${dir}"' EXIT
goals=()
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
verdict() { # VALUE GOAL -> "met" or "missed by X (P % over)"
        awk -v v="$1" -v g="$2" 'BEGIN { if (v <= g) print "met"; else printf "missed by %.2f (%.0f %% over)\n", v - g, 100 * (v - g) / g }'
}
goal() { # ROW FIGURE GOAL VALUE: prints the row's verdict and keeps it for the table
        local v
        v=$(verdict "$4" "$3")
        echo "=> goal: $1: $2; goal <= $3: ${v}"
        goals+=("| $1 | $2 | <= $3 | ${v} |")
}
max_of() { printf '%s\n' "$@" | sort -g | tail -1; }
min_of() { printf '%s\n' "$@" | sort -g | head -1; }
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

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
echo
echo "# 1. core instructions per op (callgrind, ${pairs} timed pairs, the loop's own ${loop} Ir left out)"
printf '%-11s %9s %9s %9s %7s\n' mode live core torch ratio
for mode in native expandable; do
        mode_ratios=()
        for live in ${lives}; do
                c=$(ops_ir core "${live}" "${mode}")
                t=$(ops_ir torch "${live}" "${mode}")
                mode_ratios+=("$(ratio "${c}" "${t}")")
                printf '%-11s %9s %9s %9s %7s\n' "${mode}" "${live}" "${c}" "${t}" "${mode_ratios[-1]}"
        done
        goal "core Ir per op / PyTorch-style core, ${mode}, live $(echo "${lives}" | tr ' ' ,)" \
                "$(min_of "${mode_ratios[@]}")-$(max_of "${mode_ratios[@]}")" 0.9 "$(max_of "${mode_ratios[@]}")"
done

echo
echo "# 2. core wall time per op (interleaved rounds)"
"${bin}" --interleave "${rounds}" $((pairs * 5)) 1000000 | tee "${dir}/interleave.txt"
for mode in native expandable; do
        read -r growth spread < <(awk -v m="${mode}," '$1 == m { on = 1 } on && /core wall growth/ {
                v = $(NF - 1); sub("x", "", v); print v, $NF; exit }' "${dir}/interleave.txt")
        goal "core wall growth 1k -> 1M live, ${mode}" "x${growth} ${spread}" 3 "${growth}"
done

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
local_ir() { # NAME ARGS... -> gpumem-bench-local under callgrind, --rounds 1 and 2; profiles ${dir}/l.NAME.R
        local name="$1"
        shift
        for r in 1 2; do
                daemon_start
                # %p: the bench forks its ping-pong echo process, which writes a profile of its own.
                valgrind --tool=callgrind --callgrind-out-file="${dir}/l.${name}.${r}.%p" "${build}/bench/gpumem-bench-local" \
                        --socket "${dir}/s.sock" --rounds "${r}" --pairs "${local_pairs}" "$@" >/dev/null 2>&1
                daemon_stop
        done
}
per_round() { # NAME FUNCTION -> Ir of one timed round of the function
        local one two
        one=$(ls -S "${dir}/l.$1.1".* | head -1) # the largest: not the echo child
        two=$(ls -S "${dir}/l.$1.2".* | head -1)
        echo $(($(inclusive "${two}" "$2") - $(inclusive "${one}" "$2")))
}
local_wall() { # ARGS... -> gpumem-bench-local's output, interleaved, against a fresh daemon
        daemon_start
        "${build}/bench/gpumem-bench-local" --socket "${dir}/s.sock" --rounds "${rounds}" --pairs "${wall_pairs}" "$@"
        daemon_stop
}
summary_of() { # FILE LABEL -> "MEDIAN (LO-HI)" of gpumem-bench-local's summary line
        awk -v l="$2" 'index($0, l " ") == 1 && $(NF - 7) == "median" {
                print $(NF - 6), "(" $(NF - 4) "-" $(NF - 2) ")"; exit }' "$1"
}

echo
echo "# 3. local cached pair / PyTorch-style pair (Ir: callgrind, ${local_pairs} pairs a round; wall: ${rounds} interleaved rounds of ${wall_pairs})"
printf '%-9s %8s %8s %8s %12s %26s %26s\n' size core_Ir torch_Ir local_Ir local/torch "wall local/torch" "wall local/torch, CPU"
pair_ratios=()
for size in 4096 1048576 25165824; do
        local_ir "pair${size}" --size "${size}"
        c=$(($(per_round "pair${size}" core_pairs) / local_pairs))
        t=$(($(per_round "pair${size}" torch_pairs) / local_pairs))
        l=$(($(per_round "pair${size}" local_pairs) / local_pairs))
        local_wall --size "${size}" >"${dir}/wall.${size}.txt"
        pair_ratios+=("$(ratio "${l}" "${t}")")
        printf '%-9s %8s %8s %8s %12s %26s %26s\n' "${size}" "${c}" "${t}" "${l}" "${pair_ratios[-1]}" \
                "$(summary_of "${dir}/wall.${size}.txt" "local / torch (pair)")" \
                "$(summary_of "${dir}/wall.${size}.txt" "local / torch (pair), CPU time")"
done
goal "local cached pair / PyTorch-style pair, 4 KiB, 1 MiB, 24 MiB (Ir)" "$(
        IFS=' '
        echo "${pair_ratios[*]}"
)" 1.1 "$(max_of "${pair_ratios[@]}")"
echo
echo "# 3b, 4. trace replays: local / PyTorch-style, and local / in process (Ir: one replay; wall: ${rounds} interleaved rounds)"
printf '%-11s %10s %10s %10s %11s %11s %24s %24s\n' trace core_Ir torch_Ir local_Ir local/torch local/core \
        "wall local/torch" "wall local/core"
replay_ratios=()
for trace in ${traces}; do
        local_ir "${trace}" --trace "${here}/traces/${trace}.csv"
        c=$(per_round "${trace}" step_core)
        t=$(per_round "${trace}" step_torch)
        l=$(per_round "${trace}" step_client)
        local_wall --trace "${here}/traces/${trace}.csv" >"${dir}/wall.${trace}.txt"
        replay_ratios+=("$(ratio "${l}" "${t}")")
        printf '%-11s %10s %10s %10s %11s %11s %24s %24s\n' "${trace}" "${c}" "${t}" "${l}" "${replay_ratios[-1]}" \
                "$(ratio "${l}" "${c}")" "$(summary_of "${dir}/wall.${trace}.txt" "step local / torch")" \
                "$(summary_of "${dir}/wall.${trace}.txt" "step local / in process")"
        if [ "${trace}" = train_loop ]; then
                step_ratio=$(ratio "${l}" "${c}")
                step_wall=$(summary_of "${dir}/wall.${trace}.txt" "step local / in process")
                grep -h 'daemon messages per step' "${dir}/wall.${trace}.txt" || true
        fi
done
goal "local replay / PyTorch-style replay, $(echo "${traces}" | tr ' ' ,) (Ir)" "$(
        IFS=' '
        echo "${replay_ratios[*]}"
)" 1.1 "$(max_of "${replay_ratios[@]}")"
goal "steady training step (train_loop), local / in process (Ir)" "${step_ratio} (wall ${step_wall})" 1.05 "${step_ratio}"

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
echo "# 5. central cached pair / bare ping-pong (fresh gpumemd, host backend)"
read -r iters_lo iters_hi <<<"${central_iters}"
echo "bare ping-pong, client process (user space only): $((($(pingpong_ir "${iters_hi}") - $(pingpong_ir "${iters_lo}")) / (iters_hi - iters_lo))) Ir per round trip"
printf '%-8s %-8s %10s %10s %s\n' size frees client_Ir daemon_Ir "wall central / ping-pong (interleaved, ${rounds} rounds)"
own_medians=() carried_medians=()
for size in ${central_sizes}; do
        for carry in 0 1; do
                export GPUMEM_CARRY_FREES="${carry}"
                read -r c1 d1 < <(central_ir "${size}" "${iters_lo}")
                read -r c2 d2 < <(central_ir "${size}" "${iters_hi}")
                wall=$(local_wall --size "${size}" --pairs 100000 | awk '/^central \/ pingpong/ { sub(/^central \/ pingpong \(pair\) +/, ""); print }')
                if [ "${carry}" = 1 ]; then carried_medians+=("$(echo "${wall}" | awk '{ print $2 }')"); else own_medians+=("$(echo "${wall}" | awk '{ print $2 }')"); fi
                printf '%-8s %-8s %10s %10s %s\n' "${size}" "$([ "${carry}" = 1 ] && echo carried || echo own)" \
                        $(((c2 - c1) / (iters_hi - iters_lo))) $(((d2 - d1) / (iters_hi - iters_lo))) "${wall}"
        done
done
unset GPUMEM_CARRY_FREES
goal "central cached pair / bare ping-pong, frees on their own (default), $(echo "${central_sizes}" | tr ' ' ,) (wall medians)" \
        "$(
                IFS=' '
                echo "${own_medians[*]}"
        )" 1.5 "$(max_of "${own_medians[@]}")"
goal "central cached pair / bare ping-pong, frees carried (GPUMEM_CARRY_FREES=1) (wall medians)" "$(
        IFS=' '
        echo "${carried_medians[*]}"
)" 1.5 "$(max_of "${carried_medians[@]}")"

echo
echo "# 6. /metrics scrape, 256 local sessions / 1 session (bench/scrape.sh, ${rounds} rounds)"
"${here}/scrape.sh" "${build}" 256 "${rounds}" | tee "${dir}/scrape.txt"
read -r scrape scrape_spread < <(awk '/local sessions \/ 1 session: median/ { print $(NF - 1), $NF }' "${dir}/scrape.txt")
goal "/metrics scrape, 256 local sessions / 1 session (wall median)" "${scrape} ${scrape_spread}" 1.5 "${scrape}"

echo
echo "# Goals (issue 26), this run; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| row | figure | goal | |"
echo "|---|---|---|---|"
printf '%s\n' "${goals[@]}"
