#!/usr/bin/env bash
# gpu-check.sh: gpumemd's cuda backend end to end on a real GPU, in one
# command of under 8 minutes, on a machine that cannot build or install.
#
# Method. The binaries are built elsewhere and carried in a bundle made by
# scripts/gpu-check-bundle.sh (bin/: gpumemd, gpumemctl, gpu_client; lib/:
# libgpumem and the shared libraries they need, collected with ldd, put on
# LD_LIBRARY_PATH; kernels.ptx: the check's kernels, JIT-compiled by the
# driver, so no compiler is needed here). The host's glibc, driver and GPU are
# printed first. Then each stage prints one PASS/FAIL/SKIP line with its
# figures:
#   daemon        gpumemd --backend cuda starts, holds no CUDA context, reads
#                 memory figures through NVML; its own device memory
#                 (nvidia-smi: used over the baseline, compute processes)
#   clients       two exec'd client processes write and verify their blocks
#                 with kernels while both hold memory; the daemon's stats agree
#   expandable    expandable segments: 1500 MiB of pages, partial frees, trim
#   streams       record_stream/free_async on real streams with kernels running
#   early reuse   a record_stream'd block freed while a kernel on the recorded
#                 stream runs is not handed out again meanwhile (or keeps its data)
#   reclaim       a trim reclaims an idle client's cache; a trim while a kernel
#                 writes a live block leaves that block intact
#   reclaim is real  while that trimmed client still lives, nvidia-smi's used
#                 memory falls by the trimmed bytes and `gpumemctl quota list`
#                 shows no unverified bytes (where NVML cannot verify: what it
#                 attributes to the client, and why the bytes stayed held)
#   queued free   a free with a kernel still queued, then gpumem_trim and an
#                 admin trim's Reclaim: cuStreamSynchronize still succeeds, the
#                 trimmed bytes are released
#   oom ladder    (a daemon with per_process_memory_fraction:0.05) two cached
#                 blocks freed with a kernel still queued on them, then a
#                 request only the retry ladder's release of them can serve:
#                 one retry, cuStreamSynchronize succeeds, a live block intact
#   context       a non-primary context current in the caller stays current
#                 through alloc, free and trim, on a page-reuse daemon
#   oom           a cuMemCreate out-of-memory (memory held outside gpumemd by
#                 cuMemAlloc) and its diagnosis
#   restart       SIGKILL and restart under an fd-store harness playing
#                 systemd (gpu-check/restart_stage.py); the client keeps data
#   shared weights  (a daemon of its own) process A fills a shared object with
#                 a kernel, publishes it to every tenant and exits; two readers
#                 started after A exited map it read-only and verify it with
#                 kernels; a third one's write kernel through its mapping must
#                 fault; nvidia-smi: the object's bytes are held once (by the
#                 daemon, after A exited), the readers' mappings add none, and
#                 unpublishing gives them back to the device
#   sleep/wake    (a daemon of its own) a client fills blocks and sleeps keeping
#                 them all (nvidia-smi used falls by the slept bytes); a
#                 neighbour allocates, fills, verifies, frees and trims as much;
#                 the sleeper wakes and verifies every block at its address;
#                 the line gives the rates and whether the kept data was in
#                 page-locked host memory (pinned, partly pinned, pageable)
#   bench         cached alloc+free through the daemon vs cuMemAlloc+cuMemFree
#                 vs PyTorch's caching allocator (medians of interleaved rounds)
#   torch         gpu-check/torch_train.py, when present: training steps with
#                 the gpumemd allocator and PyTorch's own
#   baseline      device memory back to its baseline once everything stopped
#                 (what would show leaked pages, unacknowledged unmaps, a
#                 wrong disconnect)
#
# --emulator runs the same stages over the emulated driver (tests/lib/fakecuda:
# GPUMEM_LIBCUDA, GPUMEM_LIBNVML, a device pool file) with a stand-in
# nvidia-smi (gpu-check/nvidia-smi) reading that pool, to know the check
# works up to the hardware. The emulator is asynchronous: its kernels (fill,
# verify, spin) run later on per-stream workers, the CPU cannot touch its
# device memory, and unmapping memory under a queued kernel faults it; the
# lines say "emulated kernels", and figures are the emulator's, not a GPU's.
#
# usage: scripts/gpu-check.sh [--emulator] [--bundle DIR | --build DIR]
#   --bundle DIR  the bundle (default: gpu-check-bundle/ in the repository)
#   --build DIR   a build tree instead (its daemon/, ctl/, lib/, tests/)
# Environment: GPUMEM_CHECK_KEEP=1 keeps the work directory. Exit status 0
# when no stage failed. The torch stage runs torch_train.py with
# GPUMEM_SOCKET (the daemon's socket) and GPUMEM_LIBRARY_DIR (libgpumem and
# its libraries, also on its LD_LIBRARY_PATH). Trimming other clients' caches
# needs admin rights: run as root (or in the daemon's admin group).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$REPO/scripts/gpu-check
EMULATOR=0
BUNDLE=$REPO/gpu-check-bundle
BUILD=
while [ $# -gt 0 ]; do
        case $1 in
        --emulator) EMULATOR=1 ;;
        --bundle) BUNDLE=$2; shift ;;
        --build) BUILD=$2; shift ;;
        *) echo "usage: $0 [--emulator] [--bundle DIR | --build DIR]" >&2; exit 2 ;;
        esac
        shift
done

WORK=$(mktemp -d /tmp/gpumem-gpu-check.XXXXXX)
RESULTS=$WORK/results.txt
SOCK=$WORK/gpu0.sock
DEADLINE=$((SECONDS + 450)) # 7.5 minutes for everything
DAEMON_PID=
: >"$RESULTS"

note() { printf '[gpu-check %3ds] %s\n' "$SECONDS" "$*"; }
result() { printf '%-5s %s\n' "$1" "$2" | tee -a "$RESULTS"; }
pass() { result PASS "$*"; }
fail() { result FAIL "$*"; }
skip() { result SKIP "$*"; }
left() { local n=$((DEADLINE - SECONDS)); echo $((n > 5 ? n : 5)); }
json_number() { sed -n "s/.*\"$1\": *\(-\{0,1\}[0-9][0-9]*\).*/\1/p" <<<"$2" | head -1; }

# ---- the binaries ----
if [ -n "$BUILD" ]; then
        GPUMEMD=$BUILD/daemon/gpumemd GPUMEMCTL=$BUILD/ctl/gpumemctl CLIENT=$BUILD/tests/gpu_check_client
        LIBDIR=$BUILD/lib FAKELIB=$BUILD/tests/fakecuda PTX=
else # the bundle's bin/ wrappers put its lib/ on LD_LIBRARY_PATH for themselves only
        GPUMEMD=$BUNDLE/bin/gpumemd GPUMEMCTL=$BUNDLE/bin/gpumemctl CLIENT=$BUNDLE/bin/gpu_client
        LIBDIR=$BUNDLE/gpumem-lib FAKELIB=$BUNDLE/emulator PTX=$BUNDLE/kernels.ptx
        [ -f "$BUNDLE/MANIFEST" ] && sed 's/^/[bundle] /' "$BUNDLE/MANIFEST"
fi
for f in "$GPUMEMD" "$GPUMEMCTL" "$CLIENT"; do
        [ -x "$f" ] || { echo "FAIL  missing $f (make the bundle with scripts/gpu-check-bundle.sh)"; exit 1; }
done
export GM_CHECK_PTX=$PTX
unset GPUMEM_HEAP
if [ "$EMULATOR" = 1 ]; then
        export GPUMEM_LIBCUDA=$FAKELIB/libcuda.so.1 GPUMEM_LIBNVML=$FAKELIB/libnvidia-ml.so.1
        export FAKECUDA_POOL=$WORK/device-pool FAKECUDA_CAPACITY=8G FAKECUDA_CONTEXT_BYTES=256M GM_CHECK_SMALL=1
        export PATH=$HERE:$PATH # the stand-in nvidia-smi
        MODE="emulator (tests/lib/fakecuda, asynchronous; figures are not a GPU's)"
else
        unset GPUMEM_LIBCUDA GPUMEM_LIBNVML FAKECUDA_POOL
        MODE="hardware"
fi

smi() { timeout 20 nvidia-smi "$@" 2>/dev/null; }
used_mib() { smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }
free_mib() { smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | tr -d ' '; }
stats() { timeout 10 "$GPUMEMCTL" -s "$1" stats --json 2>/dev/null; }

finish() {
        local status=0
        if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
                kill -TERM "$DAEMON_PID"
                wait "$DAEMON_PID" || fail "gpumemd exit status $? on SIGTERM"
        fi
        grep -q '^FAIL' "$RESULTS" && status=1
        [ -s "$RESULTS" ] || { echo "FAIL  no stage ran" >>"$RESULTS"; status=1; }
        echo
        echo "================ gpumemd GPU check ($MODE) ================"
        cat "$RESULTS"
        echo
        if [ "$status" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL (work directory: $WORK)"; fi
        if [ "$status" = 0 ] && [ "${GPUMEM_CHECK_KEEP:-0}" != 1 ]; then rm -rf "$WORK"; fi
        exit "$status"
}
trap finish EXIT

start_daemon() { # start_daemon SOCKET LOG [ARGS...]: the pid in STARTED_PID
        local sock=$1 log=$2
        shift 2
        "$GPUMEMD" --backend cuda --socket "$sock" --metrics-listen none -v "$@" >"$log" 2>&1 &
        STARTED_PID=$!
        for _ in $(seq 300); do
                [ -S "$sock" ] && stats "$sock" >/dev/null && return 0
                kill -0 "$STARTED_PID" 2>/dev/null || break
                sleep 0.1
        done
        return 1
}

stop_daemon() { # stop_daemon PID: SIGTERM and a clean exit
        kill -TERM "$1" 2>/dev/null && wait "$1"
}

# ---- the machine ----
note "mode: $MODE"
note "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -1)"
if ! command -v nvidia-smi >/dev/null; then
        fail "nvidia-smi is missing: no device memory figures"
        exit 1
fi
probe=$("$CLIENT" probe - 2>&1)
probe_rc=$?
note "driver: $(smi --query-gpu=driver_version --format=csv,noheader -i 0 || echo unknown); $probe"
note "GPU 0: $(smi --query-gpu=name,uuid,memory.total --format=csv,noheader -i 0 || echo unknown)"
if [ "$probe_rc" != 0 ]; then
        fail "driver: $(tail -1 <<<"$probe")"
        exit 1
fi
BASELINE=$(used_mib)
note "device memory used before the check: ${BASELINE} MiB"

# ---- daemon ----
if ! start_daemon "$SOCK" "$WORK/gpumemd.log"; then
        fail "daemon: gpumemd --backend cuda did not start: $(tail -3 "$WORK/gpumemd.log" | tr '\n' ' ')"
        exit 1
fi
DAEMON_PID=$STARTED_PID
detail=$(sed -n 's/.*cuda backend: //p' "$WORK/gpumemd.log" | head -1)
sleep 1
daemon_used=$(( $(used_mib) - BASELINE ))
apps=$(smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits)
if grep -q "no CUDA context held" <<<"$detail" && ! grep -q "^$DAEMON_PID," <<<"$apps" && [ "$daemon_used" -lt 64 ]; then
        pass "daemon: $detail; its own device memory +${daemon_used} MiB, not among compute processes"
else
        fail "daemon: '$detail'; +${daemon_used} MiB over the baseline; compute processes: $(tr '\n' ' ' <<<"$apps")"
fi

# ---- two clients ----
note "two clients write and verify their blocks"
mkdir -p "$WORK/meet"
timeout "$(left)" "$CLIENT" pattern "$SOCK" 1 "$WORK/meet" >"$WORK/client1.log" 2>&1 &
C1=$!
timeout "$(left)" "$CLIENT" pattern "$SOCK" 2 "$WORK/meet" >"$WORK/client2.log" 2>&1 &
C2=$!
for _ in $(seq 600); do
        [ -f "$WORK/meet/held-1" ] && [ -f "$WORK/meet/held-2" ] && break
        kill -0 "$C1" 2>/dev/null && kill -0 "$C2" 2>/dev/null || break
        sleep 0.1
done
if [ -f "$WORK/meet/held-1" ] && [ -f "$WORK/meet/held-2" ]; then
        held=$(($(cat "$WORK/meet/held-1") + $(cat "$WORK/meet/held-2")))
        json=$(stats "$SOCK")
        allocated=$(json_number 'allocated_bytes.all.current' "$json")
        # What NVML attributes to the daemon (the exporter) and to an importer:
        # the evidence for release_check's default (verify needs the importer's
        # figure to count imported memory).
        apps=$(smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits)
        listed=$(sed 's/, */=/' <<<"$apps" | tr '\n' ' ')
        pass "nvml: per-process used memory (measured, for release_check's default) while two importers hold $((held / 1048576)) MiB: daemon (the exporter, pid $DAEMON_PID) $(sed -n "s/^$DAEMON_PID, *//p" <<<"$apps" | head -1 | grep . || echo 'not listed'); compute apps pid=MiB: ${listed:-none}"
        if [ "${allocated:-x}" = "$held" ]; then
                pass "clients: both hold memory at once, the daemon counts $allocated bytes allocated"
        else
                fail "clients: they hold $held bytes, the daemon counts ${allocated:-nothing}"
        fi
fi
touch "$WORK/meet/go"
for c in 1 2; do
        pid=$C1
        [ "$c" = 2 ] && pid=$C2
        if wait "$pid"; then pass "clients: $(tail -1 "$WORK/client$c.log")"; else fail "clients: $(tail -1 "$WORK/client$c.log")"; fi
done

# ---- expandable segments (a second daemon) ----
note "expandable segments"
if start_daemon "$WORK/exp.sock" "$WORK/gpumemd-exp.log" --alloc-conf expandable_segments:True; then
        EXP_PID=$STARTED_PID
        if out=$(timeout "$(left)" "$CLIENT" expandable "$WORK/exp.sock" 2>&1); then pass "$(tail -1 <<<"$out")"; else fail "expandable: $(tail -1 <<<"$out")"; fi
        # The cost of growing in 2 MiB pages: 16 GiB on a GPU, 1 GiB over the emulator.
        grow_bytes=$(( EMULATOR == 1 ? 1073741824 : 17179869184 ))
        for g in "expandable $WORK/exp.sock" "plain $SOCK"; do
                if out=$(timeout "$(left)" "$CLIENT" grow "${g#* }" "$grow_bytes" 2>&1); then pass "${g%% *} $(tail -1 <<<"$out")"; else fail "grow (${g%% *}): $(tail -1 <<<"$out")"; fi
        done
        stop_daemon "$EXP_PID" || fail "expandable: its gpumemd did not exit cleanly"
else
        fail "expandable: gpumemd with expandable segments did not start"
fi

# ---- streams ----
note "stream-ordered frees"
if out=$(timeout "$(left)" "$CLIENT" streams "$SOCK" 2>&1); then
        pass "$(tail -1 <<<"$out")"
else
        fail "streams: $(tail -1 <<<"$out")"
fi

# ---- early reuse after record_stream ----
note "early reuse after record_stream"
if out=$(timeout "$(left)" "$CLIENT" early-reuse "$SOCK" 2>&1); then pass "$(tail -1 <<<"$out")"; else fail "early reuse: $(tail -1 <<<"$out")"; fi

# ---- reclaim and trim while kernels run ----
note "reclaim and trim"
rm -f "$WORK/meet/go" "$WORK/meet/go2" "$WORK/meet/cached" "$WORK/meet/released"
timeout "$(left)" "$CLIENT" cache "$SOCK" "$WORK/meet" >"$WORK/cache.log" 2>&1 &
CC=$!
for _ in $(seq 600); do [ -f "$WORK/meet/cached" ] || ! kill -0 "$CC" 2>/dev/null && break; sleep 0.1; done
used_cached=$(used_mib)
trim=$(timeout 30 "$GPUMEMCTL" -s "$SOCK" trim 2>&1)
touch "$WORK/meet/go"
for _ in $(seq 300); do [ -f "$WORK/meet/released" ] || ! kill -0 "$CC" 2>/dev/null && break; sleep 0.1; done
if [ -f "$WORK/meet/released" ]; then
        # Reclaim is real: while the trimmed client still lives, the device's
        # used memory drops by the trimmed bytes and the daemon verified the
        # release (quota list: no unverified bytes left). Measured, with
        # what NVML attributes to the client when it could not verify.
        read -r trimmed_bytes client_pid <"$WORK/meet/released"
        trimmed_mib=$((trimmed_bytes / 1048576))
        unverified=
        for _ in $(seq 50); do
                quotas=$(timeout 10 "$GPUMEMCTL" -s "$SOCK" quota list --json 2>/dev/null)
                unverified=$(grep -o '"release_unverified_bytes": *[0-9]*' <<<"$quotas" | grep -o '[0-9]*$' | awk '{s += $1} END {if (NR) print s}')
                [ "${unverified:-x}" = 0 ] && break
                sleep 0.1
        done
        used_after=$(used_mib)
        dropped=$((used_cached - used_after))
        apps=$(smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits)
        client_nvml=$(sed -n "s/^$client_pid, *\(.*\)/\1 MiB/p" <<<"$apps" | head -1 | grep . || echo 'not listed')
        if [ "$dropped" -ge $((trimmed_mib * 9 / 10)) ] && [ "${unverified:-x}" = 0 ]; then
                pass "reclaim is real: while the trimmed client lives, device memory used fell by ${dropped} MiB (${used_cached} -> ${used_after} MiB) for ${trimmed_mib} MiB trimmed; unverified bytes 0 (NVML attributes to the client: ${client_nvml})"
        else
                why="the daemon verifies a release by the importer's NVML figure (release_check=verify)"
                [ "${unverified:-x}" != 0 ] && why="$why, and NVML attributes to the client (pid $client_pid): ${client_nvml}: its bytes stay held until the session ends (release_check=trust releases them at once)"
                fail "reclaim is real: device memory used fell by ${dropped} MiB (${used_cached} -> ${used_after} MiB) for ${trimmed_mib} MiB trimmed; unverified bytes ${unverified:-unknown}; $why"
        fi
fi
touch "$WORK/meet/go2"
if wait "$CC"; then pass "$(tail -1 "$WORK/cache.log") ($(tr '\n' ' ' <<<"$trim"))"; else fail "reclaim: $(tail -1 "$WORK/cache.log")"; fi
if out=$(timeout "$(left)" "$CLIENT" trim-busy "$SOCK" 2>&1); then pass "$(tail -1 <<<"$out")"; else fail "reclaim: $(tail -1 <<<"$out")"; fi

rm -f "$WORK/meet/go" "$WORK/meet/queued"
timeout "$(left)" "$CLIENT" queued-free "$SOCK" "$WORK/meet" >"$WORK/queued.log" 2>&1 &
QF=$!
for _ in $(seq 600); do [ -f "$WORK/meet/queued" ] || ! kill -0 "$QF" 2>/dev/null && break; sleep 0.1; done
trim=$(timeout 30 "$GPUMEMCTL" -s "$SOCK" trim 2>&1)
touch "$WORK/meet/go"
if wait "$QF"; then pass "$(tail -1 "$WORK/queued.log") ($(tr '\n' ' ' <<<"$trim"))"; else fail "queued free: $(tail -1 "$WORK/queued.log")"; fi

# ---- the OOM retry ladder under a queued kernel (a daemon with a memory fraction) ----
note "oom ladder"
total=$(smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
block_mib=$(( ${total:-0} * 5 / 400 / 2 * 2 )) # a quarter of the fraction's 5 %, in 2 MiB
if [ "$block_mib" -lt 8 ]; then
        fail "oom ladder: no device total from nvidia-smi (${total:-none})"
elif start_daemon "$WORK/ladder.sock" "$WORK/gpumemd-ladder.log" --alloc-conf per_process_memory_fraction:0.05; then
        LADDER_PID=$STARTED_PID
        if out=$(timeout "$(left)" "$CLIENT" oom-ladder "$WORK/ladder.sock" $((block_mib * 1048576)) 2>&1); then pass "$(tail -1 <<<"$out")"; else fail "oom ladder: $(tail -1 <<<"$out")"; fi
        stop_daemon "$LADDER_PID" || fail "oom ladder: its gpumemd did not exit cleanly"
else
        fail "oom ladder: gpumemd with a memory fraction did not start: $(tail -3 "$WORK/gpumemd-ladder.log" | tr '\n' ' ')"
fi

# ---- a non-primary context, page reuse on (a third daemon) ----
note "the caller's context"
if start_daemon "$WORK/reuse.sock" "$WORK/gpumemd-reuse.log" --alloc-conf expandable_segments:True,gpumemd_page_reuse:True; then
        REUSE_PID=$STARTED_PID
        if out=$(timeout "$(left)" "$CLIENT" context "$WORK/reuse.sock" 2>&1); then pass "$(tail -1 <<<"$out")"; else fail "context: $(tail -1 <<<"$out")"; fi
        stop_daemon "$REUSE_PID" || fail "context: its gpumemd did not exit cleanly"
else
        fail "context: gpumemd with page reuse did not start: $(tail -3 "$WORK/gpumemd-reuse.log" | tr '\n' ' ')"
fi

# ---- out of memory ----
note "out of memory"
free=$(free_mib)
hog=$(( free > 4096 ? free - 3072 : 0 ))
if [ "$hog" -gt 0 ]; then
        rm -f "$WORK/meet/go" "$WORK/meet/hog"
        timeout "$(left)" "$CLIENT" hog $((hog * 1048576)) "$WORK/meet" >"$WORK/hog.log" 2>&1 &
        HOG=$!
        for _ in $(seq 600); do [ -f "$WORK/meet/hog" ] || ! kill -0 "$HOG" 2>/dev/null && break; sleep 0.1; done
        out=$(timeout "$(left)" "$CLIENT" oom "$SOCK" 2>&1)
        rc=$?
        touch "$WORK/meet/go"
        wait "$HOG"
        if [ $rc = 0 ] && grep -q "diagnosis: memory used outside gpumemd" <<<"$out"; then
                pass "oom: ${hog} MiB held outside gpumemd; $(tail -1 <<<"$out")"
        else
                fail "oom: $(tail -1 <<<"$out") [$(grep 'oom message' <<<"$out" | cut -c1-300)]"
        fi
else
        fail "oom: only ${free} MiB free on the device"
fi

# ---- restart ----
note "SIGKILL restart under the fd-store harness"
mkdir -p "$WORK/restart"
out=$(timeout "$(left)" python3 "$HERE/restart_stage.py" "$GPUMEMD" "$CLIENT" "$WORK/restart" 2>&1)
line=$(grep -E '^(PASS|FAIL) ' <<<"$out" | tail -1)
if [ -n "$line" ]; then result "${line%% *}" "${line#* }"; else fail "restart: $(tail -1 <<<"$out")"; fi

# ---- shared weights (a daemon of its own, so the device figures are its own) ----
note "shared weights"
SHARED_MIB=$(( EMULATOR == 1 ? 128 : 512 ))
both_readers() { # both_readers DIR WORD PID1 PID2: until DIR/WORD-* are two, or a reader ended
        for _ in $(seq 600); do
                [ "$(find "$1" -name "$2-*" | wc -l)" -ge 2 ] && return 0
                kill -0 "$3" 2>/dev/null && kill -0 "$4" 2>/dev/null || return 1
                sleep 0.1
        done
        return 1
}
shared_stage() { # one PASS/FAIL line; every figure in MiB of nvidia-smi's used memory
        local sock=$WORK/shared.sock dir=$WORK/shared name=gpucheck/weights seed=4242 out u0 u1 ua ub u3 r1 r2
        mkdir -p "$dir"
        start_daemon "$sock" "$WORK/gpumemd-shared.log" || { fail "shared weights: gpumemd did not start: $(tail -3 "$WORK/gpumemd-shared.log" | tr '\n' ' ')"; return; }
        SHARED_PID=$STARTED_PID
        u0=$(used_mib)
        if ! out=$(timeout "$(left)" "$CLIENT" publish "$sock" "$name" $((SHARED_MIB * 1048576)) "$seed" 2>&1); then
                fail "shared weights: $(tail -1 <<<"$out")"; stop_daemon "$SHARED_PID"; return
        fi
        local published=$(tail -1 <<<"$out")
        sleep 0.5
        u1=$(used_mib) # the publisher has exited: the daemon holds the object
        timeout "$(left)" "$CLIENT" open-verify "$sock" "$name" "$seed" "$dir" >"$dir/reader1.log" 2>&1 &
        r1=$!
        timeout "$(left)" "$CLIENT" open-verify "$sock" "$name" "$seed" "$dir" >"$dir/reader2.log" 2>&1 &
        r2=$!
        both_readers "$dir" ready "$r1" "$r2"
        sleep 0.5
        ua=$(used_mib) # both readers connected, nothing mapped yet
        touch "$dir/open"
        both_readers "$dir" mapped "$r1" "$r2"
        ub=$(used_mib) # both map it
        local listed=$(timeout 10 "$GPUMEMCTL" -s "$sock" shared list 2>/dev/null | grep -- "$name" | tr -s ' ' | head -1)
        touch "$dir/go"
        local ok=1 why=
        wait "$r1" || { ok=0; why="$why; reader 1: $(tail -1 "$dir/reader1.log")"; }
        wait "$r2" || { ok=0; why="$why; reader 2: $(tail -1 "$dir/reader2.log")"; }
        local write
        write=$(timeout "$(left)" "$CLIENT" open-write "$sock" "$name" 2>"$dir/write.err") || { ok=0; why="$why; write: $(tail -1 <<<"$write")"; }
        local again
        again=$(timeout "$(left)" "$CLIENT" open-verify "$sock" "$name" "$seed" 2>&1) || { ok=0; why="$why; after the write: $(tail -1 <<<"$again")"; }
        out=$(timeout "$(left)" "$CLIENT" unpublish "$sock" "$name" 2>&1) || { ok=0; why="$why; $(tail -1 <<<"$out")"; }
        for _ in $(seq 50); do
                u3=$(used_mib)
                [ "$u3" -le $((u0 + SHARED_MIB / 10)) ] && break
                sleep 0.1
        done
        local held=$((u1 - u0)) mapped=$((ub - ua)) back=$((u3 - u0))
        [ "$held" -ge $((SHARED_MIB * 9 / 10)) ] || { ok=0; why="$why; held after the publisher's exit ${held} MiB, not ~${SHARED_MIB}"; }
        [ "$mapped" -lt $((SHARED_MIB / 2)) ] || { ok=0; why="$why; two readers' mappings added ${mapped} MiB (a copy each?)"; }
        [ "$back" -le $((SHARED_MIB / 10)) ] || { ok=0; why="$why; ${back} MiB still used after unpublish"; }
        local figures="${published#publish: }; device used ${u0} -> ${u1} MiB after the publisher exited (+${held} MiB, held once by the daemon), +${mapped} MiB while two readers map it (${ua} -> ${ub} MiB; gpumemctl shared list: ${listed:-nothing}); $(tail -1 "$dir/reader1.log" | sed 's/^open-verify: //'); ${write#open-write: }; intact after it; unpublished: used ${u3} MiB (${back} over the start)"
        if [ "$ok" = 1 ]; then pass "shared weights: $figures"; else fail "shared weights:${why#;} [$figures]"; fi
        stop_daemon "$SHARED_PID" || fail "shared weights: its gpumemd did not exit cleanly"
}
shared_stage

# ---- sleep and wake (a daemon of its own) ----
note "sleep and wake"
sleep_stage() {
        local sock=$WORK/sleep.sock dir=$WORK/sleep out u_filled u_asleep u_neighbour sl
        mkdir -p "$dir"
        start_daemon "$sock" "$WORK/gpumemd-sleep.log" || { fail "sleep/wake: gpumemd did not start: $(tail -3 "$WORK/gpumemd-sleep.log" | tr '\n' ' ')"; return; }
        SLEEP_PID=$STARTED_PID
        timeout "$(left)" "$CLIENT" sleeper "$sock" "$dir" >"$dir/sleeper.log" 2>&1 &
        sl=$!
        for _ in $(seq 600); do [ -f "$dir/filled" ] || ! kill -0 "$sl" 2>/dev/null && break; sleep 0.1; done
        u_filled=$(used_mib)
        touch "$dir/sleep"
        for _ in $(seq 600); do [ -f "$dir/asleep" ] || ! kill -0 "$sl" 2>/dev/null && break; sleep 0.1; done
        if [ ! -f "$dir/asleep" ]; then
                touch "$dir/wake"; wait "$sl"
                fail "sleep/wake: $(tail -1 "$dir/sleeper.log")"; stop_daemon "$SLEEP_PID"; return
        fi
        local released slept_ns
        read -r released slept_ns <"$dir/asleep"
        local released_mib=$((released / 1048576)) ok=1 why=
        for _ in $(seq 50); do
                u_asleep=$(used_mib)
                [ $((u_filled - u_asleep)) -ge $((released_mib * 9 / 10)) ] && break
                sleep 0.1
        done
        local dropped=$((u_filled - u_asleep))
        [ "$dropped" -ge $((released_mib * 9 / 10)) ] || { ok=0; why="$why; used fell by ${dropped} MiB for ${released_mib} MiB slept"; }
        timeout "$(left)" "$CLIENT" neighbour "$sock" "$released" "$dir" >"$dir/neighbour.log" 2>&1 &
        local nb=$!
        for _ in $(seq 600); do [ -f "$dir/holding" ] || ! kill -0 "$nb" 2>/dev/null && break; sleep 0.1; done
        u_neighbour=$(used_mib) # the neighbour holds the slept bytes
        touch "$dir/release"
        wait "$nb" || { ok=0; why="$why; $(tail -1 "$dir/neighbour.log")"; }
        touch "$dir/wake"
        wait "$sl" || { ok=0; why="$why; $(tail -1 "$dir/sleeper.log")"; }
        local figures="device used ${u_filled} -> ${u_asleep} MiB while asleep (-${dropped} MiB); a neighbour in the freed memory (used ${u_neighbour} MiB while it held it): $(tail -1 "$dir/neighbour.log" | sed 's/^neighbour: //'); $(tail -1 "$dir/sleeper.log" | sed 's/^sleep\/wake: //')"
        if [ "$ok" = 1 ]; then pass "sleep/wake: $figures"; else fail "sleep/wake:${why#;} [$figures]"; fi
        stop_daemon "$SLEEP_PID" || fail "sleep/wake: its gpumemd did not exit cleanly"
}
sleep_stage

# ---- bench ----
note "timing"
if out=$(timeout "$(left)" "$CLIENT" bench "$SOCK" 2>&1); then
        sed -n '1,4p' <<<"$out" | sed 's/^/        /' >>"$RESULTS"
        torch_line=
        if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
                torch_out=$(timeout "$(left)" python3 "$HERE/torch_bench.py" 2>&1) && torch_line="; PyTorch's caching allocator (torch.empty+del): $(tr '\n' ' ' <<<"$torch_out")"
        else
                torch_line="; PyTorch's caching allocator: not measured (no torch with CUDA here)"
        fi
        pass "$(tail -1 <<<"$out")$torch_line"
else
        fail "bench: $(tail -1 <<<"$out")"
fi

# ---- torch training ----
note "torch training"
if [ ! -f "$HERE/torch_train.py" ]; then
        skip "torch: scripts/gpu-check/torch_train.py is not here (the PyTorch entry points' stage)"
elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        skip "torch: no PyTorch with CUDA in this python3"
elif out=$(GPUMEM_SOCKET=$SOCK GPUMEM_LIBRARY_DIR=$LIBDIR LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        timeout "$(left)" python3 "$HERE/torch_train.py" 2>&1); then
        pass "torch: $(tail -1 <<<"$out")"
else
        fail "torch: $(tail -1 <<<"$out")"
fi

# ---- back to the baseline ----
note "device memory back to its baseline"
stop_daemon "$DAEMON_PID" || fail "gpumemd did not exit cleanly on SIGTERM"
DAEMON_PID=
if grep -q '^<[0-3]>' "$WORK/gpumemd.log"; then
        fail "gpumemd logged errors: $(grep '^<[0-3]>' "$WORK/gpumemd.log" | head -3 | tr '\n' ' ')"
fi
end=
for _ in $(seq 100); do
        end=$(used_mib)
        [ "$end" -le "$BASELINE" ] && break
        sleep 0.1
done
if [ "$end" -le "$BASELINE" ]; then
        pass "baseline: device memory used ${BASELINE} MiB before, ${end} MiB after everything stopped"
else
        fail "baseline: device memory used ${BASELINE} MiB before, ${end} MiB after everything stopped ($((end - BASELINE)) MiB leaked)"
fi
