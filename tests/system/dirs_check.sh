#!/bin/sh
# Where the built gpumemd puts its socket and persistent quotas:
#   dirs_check.sh GPUMEMD GPUMEMCTL
# started by hand (next to its socket, never the system's /var/lib/gpumem)
# and as systemd starts it (RUNTIME_DIRECTORY, STATE_DIRECTORY, no --socket).
# Exit 0 pass, 1 fail.
set -u

gpumemd=$1 gpumemctl=$2
tmp=$(mktemp -d /tmp/gpumem-dirs-XXXXXX) || exit 1
daemon=
trap '[ -z "$daemon" ] || kill -INT "$daemon" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT

fail() {
        echo "FAIL: $*" >&2
        [ ! -f "$tmp/daemon.log" ] || cat "$tmp/daemon.log" >&2
        exit 1
}

# run_daemon SOCKET [VAR=VALUE...]: starts gpumemd with those variables and
# the flags in $GM_FLAGS, and waits (at most 30 s) for SOCKET.
run_daemon() {
        sock=$1
        shift
        env "$@" "$gpumemd" --backend host --capacity 64M --metrics-listen none --config "$tmp/gpumemd.conf" \
                ${GM_FLAGS:-} 2>"$tmp/daemon.log" &
        daemon=$!
        i=0
        until [ -S "$sock" ]; do
                kill -0 "$daemon" 2>/dev/null || fail "gpumemd exited"
                [ $i -lt 600 ] || fail "gpumemd does not listen on $sock"
                sleep 0.05
                i=$((i + 1))
        done
}

stop_daemon() {
        kill -INT "$daemon"
        wait "$daemon" || fail "gpumemd exited with $?"
        daemon=
}

printf '[daemon]\n' >"$tmp/gpumemd.conf"
system_quotas=$(stat -c %Y /var/lib/gpumem/quotas 2>/dev/null || echo none)

# By hand: quotas next to the socket.
GM_FLAGS="--socket $tmp/hand/gpu0.sock" run_daemon "$tmp/hand/gpu0.sock"
"$gpumemctl" -s "$tmp/hand/gpu0.sock" quota set dirs-check 8M >/dev/null || fail "quota set by hand"
stop_daemon
grep -q '^dirs-check ' "$tmp/hand/quotas" || fail "no quotas next to the socket of a daemon started by hand"
[ "$(stat -c %Y /var/lib/gpumem/quotas 2>/dev/null || echo none)" = "$system_quotas" ] ||
        fail "a daemon started by hand wrote /var/lib/gpumem/quotas"

# As systemd starts it: RUNTIME_DIRECTORY (the first of a list) and STATE_DIRECTORY.
mkdir -p "$tmp/state"
run_daemon "$tmp/runtime/gpu0.sock" RUNTIME_DIRECTORY="$tmp/runtime:$tmp/other" STATE_DIRECTORY="$tmp/state"
"$gpumemctl" -s "$tmp/runtime/gpu0.sock" quota set dirs-check 8M >/dev/null || fail "quota set under systemd's directories"
stop_daemon
grep -q '^dirs-check ' "$tmp/state/quotas" || fail "no quotas in STATE_DIRECTORY"
[ ! -e "$tmp/runtime/quotas" ] || fail "quotas next to the socket despite STATE_DIRECTORY"

# The configuration's state_dir wins over both.
printf '[daemon]\nstate_dir = %s/configured\n' "$tmp" >"$tmp/gpumemd.conf"
run_daemon "$tmp/runtime/gpu0.sock" RUNTIME_DIRECTORY="$tmp/runtime" STATE_DIRECTORY="$tmp/state"
"$gpumemctl" -s "$tmp/runtime/gpu0.sock" quota set dirs-check 16M >/dev/null || fail "quota set with state_dir"
stop_daemon
grep -q '^dirs-check 16777216$' "$tmp/configured/quotas" || fail "no quotas in the configured state_dir"
echo "PASS"
