#!/usr/bin/env bash
# The latency table of BENCHMARKS.md: alloc+free round trip through a fresh
# gpumemd (host backend) against a bare SOCK_SEQPACKET ping-pong, the
# fresh-segment-per-allocation analogue of cudaMalloc, and 1..256 clients, central and
# local heaps.
# Usage: bench/latency.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build="${1:-build}"
dir="$(mktemp -d)"
trap 'kill "${daemon:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${dir}"' EXIT
"${build}/daemon/gpumemd" --backend host --capacity 8G --socket "${dir}/gpu0.sock" \
        --config /dev/null --metrics-listen none 2>"${dir}/log" &
daemon=$!
for _ in $(seq 100); do [ -S "${dir}/gpu0.sock" ] && break; sleep 0.05; done
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, kernel $(uname -r)"
"${build}/bench/gpumem-bench-pingpong" --size 64 --iters 50000
for size in 4096 1048576 16777216; do
        for _ in 1 2 3; do
                "${build}/bench/gpumem-bench-roundtrip" --socket "${dir}/gpu0.sock" --size "${size}" --iters 20000
        done
done
for size in 4096 16777216; do
        "${build}/bench/gpumem-bench-roundtrip" --socket "${dir}/gpu0.sock" --size "${size}" --iters 2000 --mode fresh
done
for clients in 1 4 16 64 256; do
        "${build}/bench/gpumem-bench-roundtrip" --socket "${dir}/gpu0.sock" --size 4096 --iters 1000 --clients "${clients}"
done
# Local heaps: the same loops with the heap in the client (no message once cached).
for clients in 1 4 16 64 256; do
        "${build}/bench/gpumem-bench-roundtrip" --socket "${dir}/gpu0.sock" --size 4096 --iters 100000 \
                --clients "${clients}" --heap local
done
# Ratios within one run, interleaved: local / allocator core, central / ping-pong, a trace step.
"${build}/bench/gpumem-bench-local" --socket "${dir}/gpu0.sock" --rounds 9 --trace bench/traces/train_loop.csv
