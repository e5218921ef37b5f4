#!/bin/sh
# Packaging checks, one per ctest entry (tests/sd.cmake):
#   packaging_check.sh units|security|man|deb|k8s SOURCE_DIR BUILD_DIR GPUMEMD_BIN
# Exit 0 pass, 1 fail, 77 skipped (a tool is missing). Works offline, in a
# container without a running systemd.
set -u

check=$1 src=$2 build=$3 gpumemd=$4
pkg=$src/packaging
tmp=$(mktemp -d /tmp/gpumem-pkgcheck-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT

fail() {
        echo "FAIL: $*" >&2
        exit 1
}

need() {
        for tool in "$@"; do
                command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool not installed"; exit 77; }
        done
}

# Runs a command; fails on a non-zero status or on any output (systemd-analyze
# verify and groff only warn about unknown settings and bad macros).
quiet() {
        out=$("$@" 2>&1)
        status=$?
        [ $status -eq 0 ] && [ -z "$out" ] || fail "$* (status $status):
$out"
}

case $check in
units)
        need systemd-analyze systemd-sysusers systemd-tmpfiles
        # verify checks that ExecStart= exists: point it at the built binary.
        # Documentation= must name real pages: give man(1) ours.
        sed "s#^ExecStart=/usr/bin/gpumemd #ExecStart=$gpumemd #" "$pkg/systemd/gpumemd@.service" \
                >"$tmp/gpumemd@.service"
        grep -q "^ExecStart=$gpumemd " "$tmp/gpumemd@.service" || fail "no ExecStart=/usr/bin/gpumemd in the service"
        cp "$pkg/systemd/gpumemd@.socket" "$tmp/"
        man_opt=--man=no
        if command -v man >/dev/null 2>&1; then
                man_opt=--man=yes
                for section in 1 3 8; do
                        mkdir -p "$tmp/man/man$section"
                        cp "$pkg"/man/*."$section" "$tmp/man/man$section/"
                done
        fi
        export MANPATH="$tmp/man"
        quiet systemd-analyze verify $man_opt "$tmp/gpumemd@.service" "$tmp/gpumemd@.socket"
        # An instance too: specifiers expanded, socket and service paired.
        (cd "$tmp" && quiet systemd-analyze verify $man_opt gpumemd@0.service gpumemd@0.socket) || exit 1

        # sysusers.d and tmpfiles.d applied to an empty root.
        root=$tmp/root
        mkdir -p "$root/etc" "$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d"
        cp "$pkg/sysusers.d/gpumem.conf" "$root/usr/lib/sysusers.d/"
        cp "$pkg/tmpfiles.d/gpumem.conf" "$root/usr/lib/tmpfiles.d/"
        out=$(systemd-sysusers --root="$root" 2>&1) || fail "systemd-sysusers: $out"
        uid=$(awk -F: '$1 == "gpumem" { print $3 }' "$root/etc/passwd")
        [ -n "$uid" ] || fail "sysusers created no gpumem user"
        for group in gpumem video render; do
                grep -q "^$group:" "$root/etc/group" || fail "sysusers created no group $group"
        done
        out=$(systemd-tmpfiles --root="$root" --create 2>&1) || fail "systemd-tmpfiles: $out"
        for dir in run/gpumem var/lib/gpumem; do
                [ "$(stat -c %u "$root/$dir")" = "$uid" ] || fail "/$dir is not owned by gpumem"
        done
        # The fd store bound the daemon keeps to (see daemon/sd.h).
        store_max=$(sed -n 's/^FileDescriptorStoreMax=//p' "$pkg/systemd/gpumemd@.service")
        daemon_max=$(sed -n 's/^#define GM_SD_FDSTORE_MAX //p' "$src/daemon/sd.h")
        [ -n "$store_max" ] && [ "$store_max" = "$daemon_max" ] ||
                fail "FileDescriptorStoreMax=$store_max differs from GM_SD_FDSTORE_MAX $daemon_max"
        # The units use what sysusers creates.
        grep -q '^User=gpumem$' "$pkg/systemd/gpumemd@.service" || fail "service does not run as gpumem"
        grep -q '^SocketGroup=gpumem$' "$pkg/systemd/gpumemd@.socket" || fail "socket group is not gpumem"
        ;;

security)
        need systemd-analyze
        out=$(systemd-analyze security --offline=true --no-pager "$pkg/systemd/gpumemd@.service" 2>&1) ||
                fail "systemd-analyze security: $out"
        # "→ Overall exposure level for gpumemd@i.service: 1.8 OK 🙂"
        exposure=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
        [ -n "$exposure" ] || fail "no overall exposure in: $out"
        echo "exposure $exposure"
        awk -v e="$exposure" 'BEGIN { exit !(e <= 3.0) }' ||
                fail "exposure $exposure is above 3.0 (OK):
$(printf '%s\n' "$out" | grep '✗')"
        ;;

man)
        command -v groff >/dev/null 2>&1 || command -v man >/dev/null 2>&1 || need groff
        for page in "$pkg"/man/*.[138]; do
                if command -v groff >/dev/null 2>&1; then
                        quiet groff -man -ww -z "$page"
                fi
                if command -v man >/dev/null 2>&1; then
                        # man -l renders to stdout; its warnings go to stderr.
                        err=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
                        [ -z "$err" ] || fail "man --warnings $page: $err"
                fi
                name=$(basename "$page")
                grep -q "^\.TH $(echo "${name%.*}" | tr a-z A-Z) ${name##*.} " "$page" ||
                        fail "$name: .TH does not match the file name"
        done
        ;;

deb)
        need cpack dpkg-deb
        [ -f "$build/CPackConfig.cmake" ] || fail "no CPackConfig.cmake in $build"
        (cd "$build" && cpack -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1) || {
                cat "$tmp/cpack.log" >&2
                fail "cpack -G DEB"
        }
        deb=$(ls "$tmp"/out/gpumemd_*.deb 2>/dev/null | head -n 1)
        [ -n "$deb" ] || fail "cpack produced no gpumemd_*.deb"
        dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's#^\./#/#' >"$tmp/contents"
        want="/usr/bin/gpumemd /usr/bin/gpumemctl
/usr/lib/systemd/system/gpumemd@.service /usr/lib/systemd/system/gpumemd@.socket
/usr/lib/sysusers.d/gpumem.conf /usr/lib/tmpfiles.d/gpumem.conf
/usr/include/gpumem/gpumem.h
/usr/share/man/man8/gpumemd.8 /usr/share/man/man1/gpumemctl.1 /usr/share/man/man3/libgpumem.3"
        [ -f "$src/etc/gpumemd.conf" ] && want="$want /etc/gpumem/gpumemd.conf"
        for path in $want; do
                grep -qx "$path" "$tmp/contents" || fail "$path missing from the .deb"
        done
        for pattern in '/libgpumem\.so\.0$' '/pkgconfig/gpumem\.pc$' '/cmake/gpumem/gpumemConfig\.cmake$'; do
                grep -q "$pattern" "$tmp/contents" || fail "nothing matching $pattern in the .deb"
        done
        [ "$(dpkg-deb -f "$deb" Package)" = gpumemd ] || fail "package name"
        depends=$(dpkg-deb -f "$deb" Depends)
        for dep in libuv1 libprotobuf-c1 libsystemd0 libinih1 libmicrohttpd12; do
                printf '%s\n' "$depends" | grep -qw "$dep" || fail "Depends lacks $dep: $depends"
        done
        mkdir "$tmp/ctrl"
        dpkg-deb -e "$deb" "$tmp/ctrl"
        [ -x "$tmp/ctrl/postinst" ] || fail "no executable postinst"
        grep -q systemd-sysusers "$tmp/ctrl/postinst" || fail "postinst does not run systemd-sysusers"
        if [ -f "$src/etc/gpumemd.conf" ]; then
                grep -qx /etc/gpumem/gpumemd.conf "$tmp/ctrl/conffiles" || fail "config is not a conffile"
        fi

        # What it installs works from where it lands: the daemon starts, and a
        # program builds and runs against the header, gpumem.pc and the library.
        root=$tmp/root
        dpkg-deb -x "$deb" "$root"
        "$root/usr/bin/gpumemd" --help >/dev/null || fail "installed gpumemd --help"
        if command -v cc >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1; then
                pc=$(find "$root/usr/lib" -name gpumem.pc | head -n 1)
                libdir=$(dirname "$(find "$root/usr/lib" -name 'libgpumem.so.0' | head -n 1)")
                cat >"$tmp/use.c" <<'EOF'
#include <errno.h>
#include <gpumem/gpumem.h>
#include <stdio.h>
#include <string.h>
int main(void) {
        gpumem_client *c = NULL;
        /* No daemon there: a clean error, not a crash. */
        int r = gpumem_connect("/nonexistent/gpumem.sock", &c);
        printf("%s\n", gpumem_strerror(r));
        return r < 0 && c == NULL && strlen(gpumem_strerror(-EDQUOT)) > 0 ? 0 : 1;
}
EOF
                flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs gpumem) ||
                        fail "pkg-config gpumem"
                case $flags in *"$root"*) ;; *) fail "gpumem.pc does not point into the install: $flags" ;; esac
                # A sanitizer build's library needs its runtime loaded first.
                san=
                readelf -d "$libdir/libgpumem.so.0" 2>/dev/null | grep -q libasan && san=-fsanitize=address,undefined
                cc $san -o "$tmp/use" "$tmp/use.c" $flags || fail "building against the installed library"
                LD_LIBRARY_PATH=$libdir "$tmp/use" >/dev/null || fail "program linked to libgpumem"
        fi
        ;;

k8s)
        need python3
        python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: python3-yaml not installed"; exit 77; }
        python3 - "$pkg/kubernetes/gpumemd-daemonset.yaml" <<'EOF' || fail "DaemonSet manifest"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]
spec = pod["spec"]
assert ds["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), "selector"
assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, "nodeSelector"
ann = pod["metadata"]["annotations"]
assert ann["prometheus.io/scrape"] == "true", "scrape annotation"
port = int(ann["prometheus.io/port"])
(c,) = spec["containers"]
assert port in [p["containerPort"] for p in c["ports"]], "annotated port is not a container port"
assert c["livenessProbe"]["httpGet"]["port"] == port, "liveness probe is not on the metrics port"
assert "nvidia.com/gpu" not in str(c.get("resources")), "requesting GPUs would take them from workloads"
volumes = {v["name"]: v for v in spec["volumes"]}
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
assert volumes[mounts["/run/gpumem"]]["hostPath"]["path"] == "/run/gpumem", "/run/gpumem is not the host's"
assert "/etc/gpumem" in mounts, "no configuration"
script = c["args"][0]
assert "/usr/bin/gpumemd" in script and "--metrics-listen" in script and "9470 + i" in script, "daemon command"
EOF
        ;;

*)
        fail "unknown check '$check'"
        ;;
esac
exit 0
