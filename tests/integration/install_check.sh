#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds tests/integration/install/example.c
# against it twice (pkg-config, and CMake's find_package), runs both against
# the installed gpumemd, and checks the figures in the installed gpumemctl.
# Usage: install_check.sh BUILD_DIR SOURCE_DIR [EXTRA_CFLAGS [PYTHON_ENV]]
# (EXTRA_CFLAGS: the sanitizer flags of an ASan build, which the installed
# library needs in its programs too; PYTHON_ENV: VAR=value words for the
# python3 that loads it, e.g. the sanitizer runtimes to preload.)
set -euo pipefail
build="$1"
src="$2"
extra="${3:-}"
pyenv="${4:-}"
work="$(mktemp -d)"
trap 'for p in "${daemon:-}" "${EX_PID:-}"; do [ -z "${p}" ] || kill "${p}" 2>/dev/null || true; done
      wait 2>/dev/null || true; rm -rf "${work}"' EXIT
prefix="${work}/prefix"
cmake --install "${build}" --prefix "${prefix}" >/dev/null
for f in bin/gpumemd bin/gpumemctl include/gpumem/gpumem.h include/gpumem/torch.h etc/gpumem/gpumemd.conf \
        lib/systemd/system/gpumemd.service lib/systemd/system/gpumemd@.service lib/systemd/system/gpumemd@.socket \
        libexec/gpumemd/gpumemd-instances; do
        [ -e "${prefix}/${f}" ] || { echo "missing ${f} in the install" >&2; exit 1; }
done
# The units, gpumemd-instances and the config agree with the prefix given at
# install time; staged (DESTDIR) installs for another prefix and for /usr
# write nothing outside PREFIX but /etc for /usr (never the host's /etc).
units_agree() { # ROOT PREFIX SYSCONFDIR
        local root="$1" p="$2" etc="$3"
        grep -qx "ExecStart=${p}/bin/gpumemd --device %i --config ${etc}/gpumem/gpumemd.conf" \
                "${root}${p}/lib/systemd/system/gpumemd@.service" ||
                { echo "gpumemd@.service does not name ${p}'s gpumemd and ${etc}" >&2; exit 1; }
        grep -qx "ExecStart=${p}/libexec/gpumemd/gpumemd-instances start" "${root}${p}/lib/systemd/system/gpumemd.service" ||
                { echo "gpumemd.service does not name ${p}'s gpumemd-instances" >&2; exit 1; }
        grep -q "^config=\${GPUMEM_CONFIG:-${etc}/gpumem/gpumemd.conf}$" "${root}${p}/libexec/gpumemd/gpumemd-instances" ||
                { echo "gpumemd-instances does not read ${etc}'s config" >&2; exit 1; }
        [ -x "${root}${p}/libexec/gpumemd/gpumemd-instances" ] && [ -f "${root}${etc}/gpumem/gpumemd.conf" ] ||
                { echo "no gpumemd-instances or config under ${root}" >&2; exit 1; }
}
units_agree "" "${prefix}" "${prefix}/etc"
DESTDIR="${work}/opt" cmake --install "${build}" --prefix /opt/gpumem >/dev/null
units_agree "${work}/opt" /opt/gpumem /opt/gpumem/etc
[ "$(ls -A "${work}/opt")" = opt ] && [ "$(ls -A "${work}/opt/opt")" = gpumem ] ||
        { echo "an install for /opt/gpumem wrote outside it: $(ls -A "${work}/opt")" >&2; exit 1; }
DESTDIR="${work}/usr" cmake --install "${build}" --prefix /usr >/dev/null
units_agree "${work}/usr" /usr /etc
[ "$(ls -A "${work}/usr" | tr '\n' ' ')" = "etc usr " ] ||
        { echo "an install for /usr wrote outside /usr and /etc: $(ls -A "${work}/usr")" >&2; exit 1; }

pcdir="$(dirname "$(find "${prefix}" -name gpumem.pc | head -n1)")"
libdir="$(PKG_CONFIG_PATH="${pcdir}" pkg-config --variable=libdir gpumem)"
ls "${libdir}"/libgpumem.so* "${libdir}"/libgpumem_torch.so.0 >/dev/null
# The Python package, in the prefix's purelib (PREFIX/lib/python3.N/
# site-packages), which a venv made at the prefix searches with no PYTHONPATH.
pydir="$(/usr/bin/python3 -c 'import sys, sysconfig
print(sysconfig.get_path("purelib", "posix_prefix", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "${prefix}")"
[ -f "${pydir}/gpumem/__init__.py" ] ||
        { echo "missing the gpumem Python package in ${pydir}: $(find "${prefix}" -name __init__.py)" >&2; exit 1; }
/usr/bin/python3 -m venv --without-pip "${prefix}"
[ "$("${prefix}/bin/python3" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib"))')" = "${pydir}" ] ||
        { echo "a venv at ${prefix} does not search ${pydir}" >&2; exit 1; }

# 1. pkg-config
# shellcheck disable=SC2046
# shellcheck disable=SC2086
cc -Wall -Werror ${extra} -o "${work}/example-pc" "${src}/tests/integration/install/example.c" \
        $(PKG_CONFIG_PATH="${pcdir}" pkg-config --cflags --libs gpumem) -Wl,-rpath,"${libdir}"
# 2. find_package(gpumem)
cmake -S "${src}/tests/integration/install" -B "${work}/consumer" -DCMAKE_PREFIX_PATH="${prefix}" \
        -DCMAKE_BUILD_RPATH="${libdir}" -DCMAKE_C_FLAGS="${extra}" >/dev/null
cmake --build "${work}/consumer" >/dev/null

sock="${work}/gpu0.sock"
"${prefix}/bin/gpumemd" --backend host --capacity 256M --socket "${sock}" --config /dev/null \
        --metrics-listen none 2>"${work}/log" &
daemon=$!
for _ in $(seq 200); do [ -S "${sock}" ] && break; sleep 0.05; done

for example in "${work}/example-pc" "${work}/consumer/example"; do
        coproc EX { "${example}" "${sock}"; }
        read -r line <&"${EX[0]}"
        [ "${line}" = ready ] || { echo "${example}: no ready line" >&2; exit 1; }
        stats="$("${prefix}/bin/gpumemctl" -s "${sock}" stats --json)"
        grep -q '"allocated_bytes.all.current": 8388608' <<<"${stats}" ||
                { echo "${example}: stats do not show its block: ${stats}" >&2; exit 1; }
        # The installed Python package, imported by the prefix's python3 with
        # no PYTHONPATH, loads the installed libraries and reads the same
        # figure (device 0 of the socket template is this daemon).
        # shellcheck disable=SC2086
        py="$(env -u GPUMEM_LIBRARY_DIR -u PYTHONPATH ${pyenv} GPUMEM_SOCKET_TEMPLATE="${work}/gpu%d.sock" "${prefix}/bin/python3" -c '
import gpumem, gpumem.torch
print(gpumem._lib.TORCH_LIBRARY_PATH, gpumem.memory_stats(0, scope="device")["allocated_bytes.all.current"])')"
        [ "${py}" = "$(realpath "${libdir}")/libgpumem_torch.so.0 8388608" ] ||
                { echo "${example}: the installed Python package says '${py}'" >&2; exit 1; }
        exec {EX[1]}>&-
        wait "${EX_PID}"
done
echo "install check passed: pkg-config and find_package consumers and the Python package ran against ${prefix}"
