#!/usr/bin/env bash
# `make run`: gpumemd in the foreground on the host backend, plus a short demo
# workload from a few client processes once it listens.
set -euo pipefail
: "${GPUMEMD:?}" "${GPUMEMCTL:?}" "${DEMO:?}"
if [ -n "${XDG_RUNTIME_DIR:-}" ] && [ -d "${XDG_RUNTIME_DIR}" ]; then
        sock="${XDG_RUNTIME_DIR}/gpumem/gpu0.sock"
else
        sock="$(pwd)/build/run/gpu0.sock"
fi
backend="${GPUMEM_BACKEND:-host}"
echo "gpumemd: starting on ${sock} (backend ${backend}); Ctrl-C stops it."
echo "  in another shell:  GPUMEM_SOCKET=${sock} ${GPUMEMCTL} stats"
echo "                     ${GPUMEMCTL} -s ${sock} stats --json"
"${GPUMEMD}" --backend "${backend}" --socket "${sock}" "$@" &
daemon=$!
trap 'kill -TERM ${daemon} 2>/dev/null || true; wait ${daemon} 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 100); do
        [ -S "${sock}" ] && break
        sleep 0.1
done
"${DEMO}" "${sock}" 3 2000 || echo "demo failed" >&2
"${GPUMEMCTL}" -s "${sock}" stats || true
echo "gpumemd keeps serving on ${sock}; Ctrl-C to stop."
wait ${daemon}
