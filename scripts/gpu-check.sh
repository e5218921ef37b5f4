#!/usr/bin/env bash
# gpu-check.sh: end-to-end check of gpumemd's cuda backend on a real GPU.
#
# Needs the CUDA toolkit (nvcc, cuda.h) and driver, cmake and the build
# dependencies of gpumemd; downloads nothing. Builds in a temporary directory,
# starts `gpumemd --backend cuda`, runs two client processes whose kernels
# write and verify patterns in their blocks (isolation: both write before
# either verifies), checks the daemon's statistics while they hold memory and
# after they leave, and times create+export+import+map of a segment, a cached
# alloc+free through the daemon and cuMemAlloc+cuMemFree. Finishes within
# ~5 minutes; results are printed last. Exit status 0 when every check passed.
#
# Environment: GPUMEM_CHECK_DEVICE (ordinal, default 0), GPUMEM_CHECK_KEEP=1
# keeps the work directory.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=${GPUMEM_CHECK_DEVICE:-0}
WORK=$(mktemp -d /tmp/gpumem-gpu-check.XXXXXX)
BUILD=$WORK/build
SOCK=$WORK/gpu$DEVICE.sock
RESULTS=$WORK/results.txt
TABLE=$WORK/table.txt
DEADLINE=$((SECONDS + 280)) # every step's timeout comes out of this
DAEMON_PID=
: >"$RESULTS"
: >"$TABLE"

note() { printf '[gpu-check %3ds] %s\n' "$SECONDS" "$*"; }
pass() { printf 'PASS  %s\n' "$*" >>"$RESULTS"; }
fail() { printf 'FAIL  %s\n' "$*" >>"$RESULTS"; }
left() { # seconds left before the deadline (at least 1)
        local n=$((DEADLINE - SECONDS))
        echo $((n > 0 ? n : 1))
}
json_number() { # json_number KEY JSON: the number after "KEY": in flat JSON
        sed -n "s/.*\"$1\": *\(-\{0,1\}[0-9][0-9]*\).*/\1/p" <<<"$2"
}

finish() {
        local status=0
        if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
                kill -TERM "$DAEMON_PID"
                if wait "$DAEMON_PID"; then pass "gpumemd exits cleanly on SIGTERM"; else fail "gpumemd exit status $? on SIGTERM (log: $WORK/gpumemd.log)"; fi
        fi
        if [ -s "$WORK/gpumemd.log" ] && grep -q '^<[0-3]>' "$WORK/gpumemd.log"; then
                fail "gpumemd logged errors:"
                grep '^<[0-3]>' "$WORK/gpumemd.log" | head -5 | sed 's/^/        /' >>"$RESULTS"
        fi
        grep -q '^FAIL' "$RESULTS" && status=1
        [ -s "$RESULTS" ] || { echo "FAIL  no check ran" >>"$RESULTS"; status=1; }
        echo
        echo "================ gpumemd GPU check: $(nvidia-smi -i "$DEVICE" --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "device $DEVICE") ================"
        cat "$RESULTS"
        if [ -s "$TABLE" ]; then
                echo
                echo "median time per operation (us), device $DEVICE:"
                cat "$TABLE"
        fi
        echo
        if [ "$status" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL (work directory: $WORK)"; fi
        if [ "$status" = 0 ] && [ "${GPUMEM_CHECK_KEEP:-0}" != 1 ]; then rm -rf "$WORK"; fi
        exit "$status"
}
trap finish EXIT

# ---- prerequisites ----
NVCC=$(command -v nvcc || true)
[ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; }
for tool in cmake nvidia-smi "$NVCC"; do
        if [ -z "$tool" ] || ! command -v "$tool" >/dev/null; then
                fail "prerequisite missing: ${tool:-nvcc} (needs the CUDA toolkit, the driver and cmake)"
                exit 1
        fi
done
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}
export CUDA_HOME
note "device $DEVICE: $(nvidia-smi -i "$DEVICE" --query-gpu=name,uuid,memory.total --format=csv,noheader)"

# ---- build ----
note "building gpumemd in $BUILD"
if timeout "$(left)" cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEMD_WITH_CUDA=ON -DGPUMEMD_WERROR=OFF \
        -DGPUMEMD_BUILD_TESTS=OFF >"$WORK/build.log" 2>&1 &&
        timeout "$(left)" cmake --build "$BUILD" -j "$(nproc)" --target gpumemd gpumemctl gpumem >>"$WORK/build.log" 2>&1; then
        pass "build with the cuda backend"
else
        fail "build (log: $WORK/build.log)"
        tail -20 "$WORK/build.log"
        exit 1
fi
for bin in "$BUILD/daemon/gpumemd" "$BUILD/client/gpumemctl" "$BUILD/client/libgpumem.so"; do
        if ldd "$bin" | grep -q libcuda; then fail "$(basename "$bin") links libcuda"; else pass "$(basename "$bin") does not link libcuda"; fi
done

note "building the CUDA client with nvcc"
CLIENT=$WORK/gpu_client
NVCC_ARGS=(-O2 -std=c++17 -o "$CLIENT" "$REPO/scripts/gpu-check/gpu_client.cu" -I"$REPO/client/include"
        -L"$BUILD/client" -lgpumem -L"$CUDA_HOME/lib64/stubs" -lcuda -Xlinker "-rpath=$BUILD/client")
if timeout "$(left)" "$NVCC" -arch=native "${NVCC_ARGS[@]}" >"$WORK/nvcc.log" 2>&1 ||
        timeout "$(left)" "$NVCC" "${NVCC_ARGS[@]}" >>"$WORK/nvcc.log" 2>&1; then
        pass "nvcc build of the client"
else
        fail "nvcc build of the client (log: $WORK/nvcc.log)"
        exit 1
fi

# ---- daemon ----
note "starting gpumemd --backend cuda --device $DEVICE"
"$BUILD/daemon/gpumemd" --backend cuda --device "$DEVICE" --socket "$SOCK" -v >"$WORK/gpumemd.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 200); do
        [ -S "$SOCK" ] && break
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
done
if [ -S "$SOCK" ] && grep -q 'cuda backend' "$WORK/gpumemd.log"; then
        pass "gpumemd serves device $DEVICE on the cuda backend"
else
        fail "gpumemd did not start on the cuda backend:"
        tail -5 "$WORK/gpumemd.log" | sed 's/^/        /' >>"$RESULTS"
        exit 1
fi

stats() { timeout 10 "$BUILD/client/gpumemctl" -s "$SOCK" stats --json; }

# ---- two clients ----
note "two clients write and verify patterns"
mkdir "$WORK/meet"
timeout "$(left)" "$CLIENT" check "$SOCK" "$DEVICE" 1 "$WORK/meet" >"$WORK/client1.log" 2>&1 &
C1=$!
timeout "$(left)" "$CLIENT" check "$SOCK" "$DEVICE" 2 "$WORK/meet" >"$WORK/client2.log" 2>&1 &
C2=$!
for _ in $(seq 600); do
        [ -f "$WORK/meet/held-1" ] && [ -f "$WORK/meet/held-2" ] && break
        if ! kill -0 "$C1" 2>/dev/null || ! kill -0 "$C2" 2>/dev/null; then break; fi
        sleep 0.1
done
if [ -f "$WORK/meet/held-1" ] && [ -f "$WORK/meet/held-2" ]; then
        held=$(($(cat "$WORK/meet/held-1") + $(cat "$WORK/meet/held-2")))
        json=$(stats || true)
        allocated=$(json_number 'allocated_bytes.all.current' "$json")
        sessions=$(json_number sessions "$json")
        if [ "${allocated:-x}" = "$held" ] && [ "${sessions:-0}" -ge 2 ]; then
                pass "stats while both clients hold memory: $allocated bytes allocated, $sessions sessions"
        else
                fail "stats while clients hold $held bytes: allocated_bytes.all.current=${allocated:-missing} sessions=${sessions:-missing}"
        fi
else
        fail "clients did not reach the holding point"
fi
touch "$WORK/meet/go"
for c in 1 2; do
        pid=$C1
        [ "$c" = 2 ] && pid=$C2
        if wait "$pid"; then
                pass "client $c: $(tail -1 "$WORK/client$c.log")"
        else
                fail "client $c (exit $?):"
                tail -5 "$WORK/client$c.log" | sed 's/^/        /' >>"$RESULTS"
        fi
done

allocated=
for _ in $(seq 50); do
        json=$(stats || true)
        allocated=$(json_number 'allocated_bytes.all.current' "$json")
        [ "$allocated" = 0 ] && break
        sleep 0.1
done
if [ "$allocated" = 0 ]; then pass "stats after the clients left: nothing allocated"; else fail "stats after the clients left: allocated_bytes.all.current=${allocated:-missing}"; fi

# ---- timing ----
note "timing"
if timeout "$(left)" "$CLIENT" bench "$SOCK" "$DEVICE" >"$TABLE" 2>"$WORK/bench.log"; then
        pass "timing run"
else
        fail "timing run:"
        tail -5 "$WORK/bench.log" | sed 's/^/        /' >>"$RESULTS"
fi
