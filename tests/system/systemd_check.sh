#!/bin/sh
# The shipped packages under a real systemd (252, Debian 12), as an operator
# uses them: systemd boots as PID 1 in its own PID, mount, cgroup and network namespace
# over an overlay of this machine's root, chrooted, with its own /proc, /sys,
# /dev, /run and /tmp and every unit it does not need masked, so nothing on
# the host changes (booted in the host's mount tree, systemd-tmpfiles --boot
# would empty the host's /tmp and its services would bind the host's ports).
#   systemd_check.sh SOURCE_DIR BUILD_DIR
# The .deb files: $GM_SYSTEM_DEBS (a directory, e.g. "make deb"'s), else
# those built earlier for the same sources (BUILD_DIR/tests/system/debs),
# else built now with packaging/build-deb.sh.
# Exit 0 pass, 1 fail, 77 skipped (the namespace cannot be made: the reason
# is printed). Every wait is bounded; the namespace and everything in it go
# when the script exits, however it exits.
set -u

src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
here=$src/tests/system
systemd_bin=/lib/systemd/systemd

skip() {
        echo "SKIP: $*"
        exit 77
}

fail() {
        echo "FAIL: $*" >&2
        exit 1
}

step() {
        echo "== $*"
}

# ---- inside the new namespaces (PID 1 until it execs systemd) ----------------------------
if [ "${GM_SYSTEM_INNER:-}" = 1 ]; then
        root=$3 console=$4 stage=$5
        set -e
        # Its own loopback: the daemons' metrics ports are not the host's.
        ip link set lo up 2>/dev/null || true
        # The overlay: the machine's root below, writes to a tmpfs of ours.
        mount -t tmpfs -o mode=0755 gm-system "$root"
        mkdir -p "$root/upper" "$root/work" "$root/root"
        mount -t overlay -o lowerdir=/,upperdir="$root/upper",workdir="$root/work" gm-system-root "$root/root"
        r=$root/root
        mount -t proc proc "$r/proc"
        mount -t sysfs -o ro sysfs "$r/sys"
        mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup"
        mount -t tmpfs -o mode=0755 run "$r/run"
        mount -t tmpfs -o mode=1777 tmp "$r/tmp"
        mount -t tmpfs -o mode=0755 dev "$r/dev"
        for node in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
                set -- $node
                mknod -m 0666 "$r/dev/$1" c "$2" "$3"
        done
        mkdir -p "$r/dev/pts" "$r/dev/shm"
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$r/dev/pts"
        ln -s pts/ptmx "$r/dev/ptmx"
        mount -t tmpfs -o mode=1777 shm "$r/dev/shm"
        # The console is a log file of the test's.
        touch "$r/dev/console"
        mount --bind "$console" "$r/dev/console"
        # Only what the test needs: journald, and the units it installs.
        # Every other unit and every generator (fstab, getty, ...) is masked.
        etc=$r/etc/systemd/system
        mkdir -p "$etc" "$r/etc/systemd/system-generators"
        for dir in /lib/systemd/system /usr/lib/systemd/system /etc/systemd/system; do
                [ -d "$dir" ] || continue
                for unit in "$dir"/*.service "$dir"/*.socket "$dir"/*.timer "$dir"/*.path "$dir"/*.mount \
                        "$dir"/*.automount "$dir"/*.swap; do
                        name=${unit##*/}
                        [ -e "$unit" ] || continue
                        case $name in
                        systemd-journald.service | systemd-journald.socket | systemd-journald-dev-log.socket | \
                                systemd-journal-flush.service | gpumemd*) continue ;;
                        esac
                        rm -rf "${etc:?}/$name"
                        ln -s /dev/null "$etc/$name"
                done
        done
        for dir in /lib/systemd/system-generators /usr/lib/systemd/system-generators /etc/systemd/system-generators; do
                for gen in "$dir"/*; do
                        [ -e "$gen" ] || [ -L "$gen" ] || continue
                        ln -sf /dev/null "$r/etc/systemd/system-generators/${gen##*/}"
                done
        done
        cat >"$etc/gm-system.target" <<'EOF'
[Unit]
Description=gpumemd system test
Requires=basic.target
After=basic.target
EOF
        ln -sf gm-system.target "$etc/default.target"
        # A machine gpumemd was never installed on, whatever this one has
        # (a "cmake --install --prefix /usr" writes /etc/gpumem/gpumemd.conf,
        # which would make dpkg ask about its conffile).
        rm -rf "$r/etc/gpumem" "$r/var/lib/gpumem" "$r/usr/local/lib/systemd/system/gpumemd"* \
                "$r/etc/systemd/system/gpumemd"* "$r"/etc/systemd/system/*.wants/gpumemd*
        # Nor a container image's policy-rc.d (Docker's denies every service
        # action), which would keep the packages' maintainer scripts from
        # restarting the daemons on an upgrade as they do on a real machine.
        rm -f "$r/usr/sbin/policy-rc.d"
        # What the test installs, where the chroot sees it.
        mkdir -p "$r/var/tmp/gm-system"
        cp -r "$stage/." "$r/var/tmp/gm-system/"
        : >"$r/etc/fstab"
        rm -f "$r/etc/machine-id"
        : >"$r/etc/machine-id"
        exec chroot "$r" "$systemd_bin"
fi

# ---- on the host ---------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "not root: the namespaces and mounts need root"
[ -x "$systemd_bin" ] || skip "no $systemd_bin (Debian package systemd)"
for tool in unshare nsenter chroot dpkg timeout setpriv python3; do
        command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
done
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || skip "no overlayfs in this kernel"
cgroup2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
[ -n "$cgroup2" ] || skip "no cgroup2 hierarchy mounted: systemd needs one of its own"
unshare --pid --mount --cgroup --net --fork true 2>/dev/null || skip "cannot make PID, mount, cgroup and network namespaces here"

# The packages.
debs=${GM_SYSTEM_DEBS:-}
if [ -z "$debs" ]; then
        debs=$build/tests/system/debs
        mkdir -p "$build/tests/system"
        key=$(cd "$src" && git ls-files -z --cached --others --exclude-standard -- . ':(exclude)tests/system' 2>/dev/null |
                xargs -0 sha256sum 2>/dev/null |
                sha256sum | cut -d' ' -f1)
        if [ ! -f "$debs/key" ] || [ "$(cat "$debs/key")" != "$key" ] || [ -z "$key" ]; then
                step "building the Debian packages (packaging/build-deb.sh)"
                rm -rf "$debs"
                mkdir -p "$debs"
                sh "$src/packaging/build-deb.sh" "$src" "$debs/out" >"$debs/build.log" 2>&1 || {
                        tail -n 40 "$debs/build.log" >&2
                        fail "packaging/build-deb.sh"
                }
                cp "$debs"/out/*.deb "$debs/"
                rm -rf "$debs/out"
                echo "$key" >"$debs/key"
        fi
fi
for p in gpumemd libgpumem0 libgpumem-torch0 python3-gpumem; do
        ls "$debs/${p}_"*.deb >/dev/null 2>&1 || fail "no ${p}_*.deb in $debs"
done

mkdir -p "$build/tests/system"
work=$(mktemp -d "$build/tests/system/run.XXXXXX") || fail "mktemp"
mkdir -p "$work/root" "$work/stage"
: >"$work/console.log"
for p in gpumemd libgpumem0 libgpumem-torch0 python3-gpumem; do
        cp "$debs/${p}_"*.deb "$work/stage/"
done
cp "$here/gm_client.py" "$work/stage/"
cg=$cgroup2/gm-system-$$
unshare_pid= init=

cleanup() {
        status=$?
        trap - EXIT INT TERM
        if [ "$status" -ne 0 ] && [ -n "$init" ]; then
                echo "--- journal (last 60 lines)" >&2
                timeout 10 nsenter -t "$init" -m -p -n -r -w journalctl --sync 2>/dev/null || true
                timeout 10 nsenter -t "$init" -m -p -n -r -w journalctl --no-pager -n 60 >&2 2>/dev/null || true
                echo "--- console" >&2
                tail -n 30 "$work/console.log" >&2
        fi
        # SIGKILL to the namespace's PID 1 ends every process in it; its
        # mounts go with the last of them.
        if [ -n "$init" ]; then
                kill -KILL "$init" 2>/dev/null || true
        fi
        if [ -n "$unshare_pid" ]; then
                i=0
                while kill -0 "$unshare_pid" 2>/dev/null && [ $i -lt 100 ]; do
                        sleep 0.1
                        i=$((i + 1))
                done
        fi
        i=0
        while [ -d "$cg" ] && ! rmdir "$cg" 2>/dev/null && [ $i -lt 100 ]; do
                for leftover in $(find "$cg" -mindepth 1 -depth -type d 2>/dev/null); do
                        rmdir "$leftover" 2>/dev/null || true
                done
                sleep 0.1
                i=$((i + 1))
        done
        rm -rf "$work"
        exit "$status"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# In the namespace: root, no environment of ours.
in_ns() {
        timeout "${T:-60}" nsenter -t "$init" -m -p -n -r -w -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}

# As a user of the namespace, with no environment but PATH and HOME.
as_user() {
        user=$1
        shift
        in_ns setpriv --reuid "$user" --regid "$user" --init-groups env HOME=/ "$@"
}

# wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds.
wait_for() {
        limit=$(($1 * 10)) what=$2 i=0
        shift 2
        until "$@" >/dev/null 2>&1; do
                i=$((i + 1))
                [ $i -lt $limit ] || fail "timed out waiting for $what"
                sleep 0.1
        done
}

step "booting systemd in its own namespaces"
mkdir "$cg" || skip "cannot create a cgroup under $cgroup2"
sh -c 'echo $$ >"$1/cgroup.procs" && exec env -i PATH="$PATH" container=gpumemd-test GM_SYSTEM_INNER=1 \
        unshare --pid --mount --cgroup --net --fork --propagation private sh "$2" "$3" "$4" "$5" "$6" "$7"' \
        sh "$cg" "$0" "$src" "$build" "$work/root" "$work/console.log" "$work/stage" >>"$work/console.log" 2>&1 &
unshare_pid=$!
i=0
while [ -z "$init" ]; do
        init=$(cat "/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null | awk '{ print $1 }')
        i=$((i + 1))
        [ $i -lt 100 ] || fail "unshare started nothing: $(cat "$work/console.log")"
        [ -n "$init" ] || sleep 0.1
done
wait_for 60 "systemd to start" grep -qx systemd "/proc/$init/comm"
wait_for 60 "systemd's control socket" in_ns test -S /run/systemd/private
state=$(T=90 in_ns systemctl is-system-running --wait 2>&1) || true
case $state in
running | degraded) echo "system $state" ;;
*) fail "systemd did not finish booting ($state): $(in_ns systemctl --failed --no-pager 2>&1)" ;;
esac

step "dpkg -i the packages"
out=$(T=180 in_ns sh -c 'dpkg -i /var/tmp/gm-system/*.deb' 2>&1) || fail "dpkg -i: $out"
in_ns systemctl cat gpumemd.service >/dev/null || fail "no gpumemd.service after installing"
in_ns id gpumem >/dev/null || fail "the package created no gpumem user"
in_ns useradd -M -G gpumem alice || fail "useradd alice"
in_ns useradd -M bob || fail "useradd bob"
client=/var/tmp/gm-system/gm_client.py

step "systemctl start gpumemd"
out=$(T=90 in_ns systemctl start gpumemd 2>&1) || fail "systemctl start gpumemd: $out"
for unit in gpumemd.service gpumemd@0.socket gpumemd@0.service; do
        [ "$(in_ns systemctl is-active "$unit")" = active ] || fail "$unit is not active"
done
status=$(in_ns systemctl status --no-pager -n 20 gpumemd 2>&1)
echo "$status" | grep -q 'gpumemd@0.service: active' || fail "systemctl status gpumemd does not show gpumemd@0: $status"
in_ns test -S /run/gpumem/gpu0.sock || fail "no /run/gpumem/gpu0.sock"

step "a user in group gpumem allocates through the default socket"
out=$(as_user alice python3 "$client" once 2>&1) || fail "alice's client: $out"
[ "$out" = ok ] || fail "alice's client said: $out"

step "a user outside the group is told which group admits him"
out=$(as_user bob python3 "$client" once 2>&1) && fail "bob connected: $out"
echo "$out" | grep -q "group 'gpumem'" || fail "bob's error does not name the group: $out"
echo "$out" | grep -q "usermod -aG gpumem USER" || fail "bob's error does not say how to join the group: $out"

step "persistent quotas go to the service's state directory"
out=$(in_ns gpumemctl quota set alice 64M 2>&1) || fail "gpumemctl quota set: $out"
in_ns grep -q '^alice ' /var/lib/gpumem/quotas || fail "no alice in /var/lib/gpumem/quotas: $out"
out=$(in_ns gpumemctl quota set alice 1G --runtime 2>&1) || fail "gpumemctl quota set --runtime: $out"
out=$(in_ns gpumemctl quota set alice 2G 2>&1) || fail "gpumemctl quota set over a runtime quota: $out"
echo "$out" | grep -q 'replaces the runtime quota of 1.0G' || fail "the persistent set does not say it replaced: $out"
echo "$out" | grep -Eq '^alice +2.0G persistent' || fail "the persistent quota is not in force: $out"
out=$(in_ns gpumemctl quota set alice 0 2>&1) || fail "gpumemctl quota set alice 0: $out"

step "journalctl -u shows the daemon's lines, with their priorities"
wait_for 30 "the start line in the journal" sh -c "timeout 10 nsenter -t $init -m -p -n -r -w journalctl -u gpumemd@0.service -p notice --no-pager |
        grep -q 'listening on /run/gpumem/gpu0.sock'"

# reloads: how many SIGHUP reloads gpumemd@0 has logged (every line it wrote
# before is in the journal once "journalctl --sync" returns).
reloads() {
        in_ns journalctl --sync
        in_ns journalctl -u gpumemd@0.service --no-pager | grep -c 'configuration reloaded' || true
}

# reload_once: "systemctl reload gpumemd" reloads gpumemd@0 exactly once. It
# returns once every job it caused is done (each SIGHUP sent); the daemon logs
# each reload before it answers the client that follows, and the count is
# taken again after that client.
reload_once() {
        before=$(reloads)
        out=$(in_ns systemctl reload gpumemd 2>&1) || fail "systemctl reload gpumemd: $out"
        wait_for 30 "the reload in the journal" sh -c "[ \"\$(timeout 10 nsenter -t $init -m -p -n -r -w \
                journalctl -u gpumemd@0.service --no-pager | grep -c 'configuration reloaded')\" -gt $before ]"
}

# reloaded_once: no more than the one reload of reload_once.
reloaded_once() {
        after=$(reloads)
        [ "$after" -eq $((before + 1)) ] ||
                fail "one systemctl reload gpumemd reloaded gpumemd@0 $((after - before)) times"
}

# A GPU added since the start: gpumemd-instances counts the entries of
# GPUMEM_GPU_DIR (a runtime drop-in) instead of /proc/driver/nvidia/gpus,
# here GPU 0's and a second one's.
in_ns mkdir -p /run/gm-gpus/0000:01:00.0 /run/gm-gpus/0000:02:00.0 /run/systemd/system/gpumemd.service.d
in_ns sh -c 'printf "[Service]\nEnvironment=GPUMEM_GPU_DIR=/run/gm-gpus\n" \
        >/run/systemd/system/gpumemd.service.d/gpus.conf'
in_ns systemctl daemon-reload

step "systemctl reload applies a changed configuration, once, and starts a GPU added since"
in_ns cp /etc/gpumem/gpumemd.conf /var/tmp/gm-system/gpumemd.conf.orig
in_ns sh -c 'printf "\n[tenant capped]\nuser = alice\nquota = 4M\n" >>/etc/gpumem/gpumemd.conf'
reload_once
out=$(as_user alice python3 "$client" once 2>&1) && fail "alice allocated 8 MiB past a 4 MiB quota: $out"
echo "$out" | grep -qi 'quota' || fail "the refusal does not name the quota: $out"
reloaded_once
for unit in gpumemd@1.socket gpumemd@1.service; do
        [ "$(in_ns systemctl is-active "$unit")" = active ] || fail "the reload did not start $unit"
done
in_ns test -S /run/gpumem/gpu1.sock || fail "no /run/gpumem/gpu1.sock after the reload"
status=$(in_ns systemctl status --no-pager -n 20 gpumemd 2>&1)
echo "$status" | grep -q 'gpumemd@1.service: active' || fail "systemctl status gpumemd does not show gpumemd@1: $status"
in_ns cp /var/tmp/gm-system/gpumemd.conf.orig /etc/gpumem/gpumemd.conf
reload_once
out=$(as_user alice python3 "$client" once 2>&1) || fail "alice's client after the second reload: $out"
reloaded_once
# Back to one GPU; the next step's "systemctl stop gpumemd" stops gpumemd@1.
in_ns rm -rf /run/systemd/system/gpumemd.service.d /run/gm-gpus
in_ns systemctl daemon-reload

step "socket activation: the first connect starts the service"
out=$(T=90 in_ns systemctl stop gpumemd 2>&1) || fail "systemctl stop gpumemd: $out"
[ "$(in_ns systemctl is-active gpumemd@0.socket)" != active ] || fail "stopping gpumemd left gpumemd@0.socket listening"
out=$(in_ns systemctl start gpumemd@0.socket 2>&1) || fail "systemctl start gpumemd@0.socket: $out"
[ "$(in_ns systemctl is-active gpumemd@0.service)" != active ] || fail "gpumemd@0.service runs before any client"
out=$(as_user alice python3 "$client" once 2>&1) || fail "the first client of the socket: $out"
[ "$(in_ns systemctl is-active gpumemd@0.service)" = active ] || fail "the first client did not start gpumemd@0.service"

# unit_log ARGS...: gpumemd@0's journal (its lines and systemd's about it)
# with every line written before the call in it: journald reads the
# daemons' stderr streams asynchronously, and --sync returns once it has
# taken what was queued (under load that can be seconds behind).
unit_log() {
        in_ns journalctl --sync
        in_ns journalctl -u gpumemd@0.service --no-pager -o short-monotonic "$@"
}

# across DESCRIPTION COMMAND...: a client of alice's holds 8 MiB of written
# memory while COMMAND replaces the daemon; the client then finds its data
# intact and allocates again, and the new daemon logged its re-attach. A
# failure shows the unit's journal from the client's start on.
across() {
        during=$1
        shift
        cursor=$(in_ns journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p')
        in_ns rm -f /var/tmp/gm-system/go
        timeout 150 nsenter -t "$init" -m -p -n -r -w -- env -i PATH=/usr/bin:/bin setpriv --reuid alice --regid alice \
                --init-groups python3 "$client" hold /var/tmp/gm-system/go >"$work/hold.out" 2>&1 &
        holder=$!
        wait_for 30 "the client to allocate" grep -q holding "$work/hold.out"
        before=$(in_ns systemctl show -p MainPID --value gpumemd@0.service)
        reattached=$(unit_log | grep -c 're-attached' || true)
        "$@"
        wait_for 60 "a new daemon after $during" sh -c "[ \"\$(timeout 10 nsenter -t $init -m -p -n -r -w \
                systemctl show -p MainPID --value gpumemd@0.service)\" != $before ] &&
                [ \"\$(timeout 10 nsenter -t $init -m -p -n -r -w systemctl is-active gpumemd@0.service)\" = active ]"
        in_ns touch /var/tmp/gm-system/go
        wait "$holder" || fail "the client across $during: $(cat "$work/hold.out")$(across_log)"
        grep -q intact "$work/hold.out" || fail "the client across $during said: $(cat "$work/hold.out")$(across_log)"
        [ "$(unit_log | grep -c 're-attached' || true)" -gt "$reattached" ] ||
                fail "the daemon after $during logged no re-attached session$(across_log)"
}

# across_log: what the failure of an across step shows after its message.
across_log() {
        printf '\n--- journalctl -u gpumemd@0.service since the client started\n'
        unit_log ${cursor:+--after-cursor="$cursor"} 2>&1 | tail -n 80
}

restart() {
        out=$(T=90 in_ns systemctl restart gpumemd@0.service 2>&1) || fail "systemctl restart: $out"
}

step "systemctl restart with a live client keeps its memory"
across "systemctl restart" restart

# The daemon stops answering the watchdog (SIGSTOP): systemd kills it and
# Restart= starts another, which takes the memory back from the fd store. A
# runtime drop-in shortens the shipped WatchdogSec=30s for the test, and
# kills with SIGKILL rather than a core-dumping SIGABRT.
stop_daemon() {
        in_ns systemctl kill --signal=SIGSTOP gpumemd@0.service
}

step "a watchdog-triggered kill with a live client keeps its memory"
in_ns mkdir -p /run/systemd/system/gpumemd@0.service.d
in_ns sh -c 'printf "[Service]\nWatchdogSec=2s\nWatchdogSignal=SIGKILL\n" \
        >/run/systemd/system/gpumemd@0.service.d/watchdog.conf'
in_ns systemctl daemon-reload
restart
across "a watchdog kill" stop_daemon
in_ns journalctl -u gpumemd@0.service --no-pager | grep -qi 'watchdog timeout' ||
        fail "systemd logged no watchdog timeout: $(in_ns journalctl -u gpumemd@0.service --no-pager -n 20)"
in_ns rm -rf /run/systemd/system/gpumemd@0.service.d
in_ns systemctl daemon-reload

# A rebuilt gpumemd package with a higher version: the same files, repacked
# with dpkg-deb; its postinst restarts the running instances.
upgrade() {
        out=$(T=180 in_ns sh -c 'set -e
                cd /var/tmp/gm-system
                rm -rf upgrade && mkdir upgrade
                dpkg-deb -R gpumemd_*.deb upgrade/pkg
                version=$(sed -n "s/^Version: //p" upgrade/pkg/DEBIAN/control)
                sed -i "s/^Version: .*/Version: ${version}+upgrade1/" upgrade/pkg/DEBIAN/control
                dpkg-deb --root-owner-group -b upgrade/pkg upgrade/gpumemd-upgrade.deb >/dev/null
                dpkg -i upgrade/gpumemd-upgrade.deb
                dpkg-query -W -f "\${Version}" gpumemd' 2>&1) || fail "the upgrade: $out"
        echo "$out" | grep -q '+upgrade1$' || fail "dpkg -i did not upgrade gpumemd: $out"
}

step "an upgrade (dpkg -i of a higher version) with a live client loses nothing"
across "an upgrade" upgrade

step "systemctl stop, then dpkg --purge, leave nothing behind"
out=$(T=90 in_ns systemctl stop gpumemd 2>&1) || fail "systemctl stop gpumemd: $out"
for unit in gpumemd.service gpumemd@0.socket gpumemd@0.service; do
        [ "$(in_ns systemctl is-active "$unit")" != active ] || fail "$unit still active after stop"
done
out=$(T=120 in_ns dpkg --purge python3-gpumem libgpumem-torch0 libgpumem0 gpumemd 2>&1) || fail "dpkg --purge: $out"
left=$(in_ns sh -c 'ls -d /etc/gpumem /var/lib/gpumem /run/gpumem /usr/libexec/gpumemd \
        /usr/lib/systemd/system/gpumemd* /etc/systemd/system/*/gpumemd* 2>/dev/null')
[ -z "$left" ] || fail "purge left: $left"
in_ns id gpumem >/dev/null || fail "the purge removed the gpumem user (Debian keeps system users)"
units=$(in_ns systemctl list-units --all --plain --no-legend 'gpumemd*')
[ -z "$units" ] || fail "systemd still knows: $units"
echo "PASS"
