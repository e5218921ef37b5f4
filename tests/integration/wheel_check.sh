#!/usr/bin/env bash
# The gpumem Python package from pip's side: scripts/build-wheel.sh builds the
# wheel carrying BUILD_DIR's libgpumem and libgpumem_torch; it goes into a
# fresh stdlib venv (unzipped into site-packages: no pip needed), and, where
# pip is at hand, `pip install --no-index ./python` goes into a second one.
# In each, with no PYTHONPATH and no GPUMEM_LIBRARY_DIR, a script loads the
# venv's own libraries and allocates through a running gpumemd.
# Usage: wheel_check.sh BUILD_DIR SOURCE_DIR PYTHON3 [PYTHON_ENV]
# (PYTHON_ENV: VAR=value words for the venv's python, e.g. the sanitizer
# runtimes an ASan build's libraries need preloaded.)
set -euo pipefail
build="$1"
src="$2"
python="$3"
pyenv="${4:-}"
work="$(mktemp -d)"
trap '[ -z "${daemon:-}" ] || kill "${daemon}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${work}"' EXIT

wheel="$(PYTHON="${python}" sh "${src}/scripts/build-wheel.sh" "${build}" "${work}/wheel")"
[ -f "${work}/wheel/${wheel}" ] || { echo "build-wheel.sh made no ${wheel}" >&2; exit 1; }

sock="${work}/gpu0.sock"
"${build}/daemon/gpumemd" --backend host --capacity 256M --socket "${sock}" --config /dev/null \
        --metrics-listen none 2>"${work}/log" &
daemon=$!
for _ in $(seq 200); do [ -S "${sock}" ] && break; sleep 0.05; done

# Allocates 8 MiB through the daemon with the venv's package and libraries.
allocates() { # VENV
        local venv="$1" out
        # shellcheck disable=SC2086
        out="$(cd "${work}" && env -u PYTHONPATH -u GPUMEM_LIBRARY_DIR -u GPUMEM_SOCKET_TEMPLATE ${pyenv} \
                GPUMEM_SOCKET="${sock}" "${venv}/bin/python" -c '
import os, sys
import gpumem
from gpumem import _lib
venv = os.path.realpath(sys.argv[1])
for path in (gpumem.__file__, _lib.LIBRARY_PATH, _lib.TORCH_LIBRARY_PATH):
    assert os.path.realpath(path).startswith(venv + os.sep), f"{path} is not the venv'"'"'s"
size = 8 << 20
ptr = _lib.torch_lib.gpumem_torch_alloc(size, 0, None)
assert ptr, "no allocation"
allocated = gpumem.memory_allocated(0)
_lib.torch_lib.gpumem_torch_free(ptr, size, 0, None)
print(allocated)' "${venv}")" || { echo "${venv}: the script failed" >&2; exit 1; }
        [ "${out}" = 8388608 ] || { echo "${venv}: memory_allocated() says ${out}" >&2; exit 1; }
}

# 1. The wheel, unzipped into a venv made without pip.
"${python}" -m venv --without-pip "${work}/venv-wheel"
purelib="$("${work}/venv-wheel/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"${python}" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "${work}/wheel/${wheel}" "${purelib}"
chmod +x "${purelib}"/gpumem/_libs/*
allocates "${work}/venv-wheel"
echo "wheel ${wheel}: installed into a fresh venv, allocated through gpumemd"

# 2. pip install ./python (the in-tree backend, no network), where pip runs.
if "${python}" -m pip --version >/dev/null 2>&1; then
        "${python}" -m venv --without-pip "${work}/venv-pip"
        GPUMEM_WHEEL_LIBDIR="${build}/lib" "${python}" -m pip --python "${work}/venv-pip/bin/python" \
                install --quiet --no-index --no-cache-dir "${src}/python" >"${work}/pip.log" 2>&1 ||
                { cat "${work}/pip.log" >&2; exit 1; }
        allocates "${work}/venv-pip"
        echo "pip install ./python: installed into a fresh venv, allocated through gpumemd"
else
        echo "pip not found for ${python}: pip install ./python not checked"
fi
