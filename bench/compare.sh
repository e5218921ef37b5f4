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
#     the growth 1k -> 1M and of core / torch.
# Usage: bench/compare.sh [BUILD_DIR] [PAIRS] [ROUNDS]   (defaults: build, 100000, 9)
set -euo pipefail
build="${1:-build}"
pairs="${2:-100000}"
rounds="${3:-9}"
bin="${build}/bench/gpumem-bench-alloc"
dir="$(mktemp -d)"
trap 'rm -rf "${dir}"' EXIT
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
