#!/usr/bin/env bash
# Configures the tree (configure only, nothing built) against a fake PyTorch
# given as GPUMEM_TORCH_DIR, the files torch/CMakeLists.txt reads and nothing
# else, and checks that libgpumem_torch's C++ sources get that PyTorch's
# std::string ABI: the one its share/cmake/Torch/TorchConfig.cmake records
# (before what importing it would say), else the one its torch._C reports to
# python3, else none (the compiler's default) with a configure message.
# ABI 0 is the fake's: GCC's default is 1, so a left-out define reads wrong.
# Usage: torch_abi_check.sh SOURCE_DIR WORK_DIR CMAKE GENERATOR C_COMPILER CXX_COMPILER
set -euo pipefail
src="$1"
work="$2"
cmake="$3"
generator="$4"
cc="$5"
cxx="$6"
rm -rf "${work}"
torch="${work}/site-packages/torch"
mkdir -p "${torch}/include/c10/util" "${torch}/lib" "${torch}/share/cmake/Torch"
: >"${torch}/include/c10/util/Exception.h"
: >"${torch}/lib/libc10.so"
build="${work}/build"

# configure: (re)configures ${build} against ${torch}, its output in ${work}/out.
configure() {
        "${cmake}" -S "${src}" -B "${build}" -G "${generator}" -DCMAKE_C_COMPILER="${cc}" -DCMAKE_CXX_COMPILER="${cxx}" \
                -DGPUMEMD_BUILD_TESTS=OFF -DGPUMEMD_BUILD_BENCH=OFF -DGPUMEMD_WITH_CUDA=OFF \
                -DGPUMEM_TORCH_DIR="${torch}" >"${work}/out" 2>&1 || {
                cat "${work}/out" >&2
                echo "FAIL: configure failed" >&2
                exit 1
        }
}
# expect CASE ABI MESSAGE: torch_oom.cpp is compiled with -D_GLIBCXX_USE_CXX11_ABI=ABI
# (none: without one) and the configure output has MESSAGE.
expect() {
        local entry
        entry="$(grep -F '"command"' "${build}/compile_commands.json" | grep -F torch_oom.cpp)" || {
                echo "FAIL ($1): torch_oom.cpp is not in compile_commands.json" >&2
                exit 1
        }
        if [ "$2" = none ]; then
                if grep -q -- '-D_GLIBCXX_USE_CXX11_ABI=' <<<"${entry}"; then
                        echo "FAIL ($1): an ABI was chosen: ${entry}" >&2
                        exit 1
                fi
        elif ! grep -q -- "-D_GLIBCXX_USE_CXX11_ABI=$2 " <<<"${entry}"; then
                echo "FAIL ($1): not compiled with _GLIBCXX_USE_CXX11_ABI=$2: ${entry}" >&2
                exit 1
        fi
        grep -qF -- "$3" "${work}/out" || {
                grep -i 'torch' "${work}/out" >&2 || true
                echo "FAIL ($1): the configure output lacks '$3'" >&2
                exit 1
        }
        echo "ok ($1)"
}

# 1. TorchConfig.cmake's TORCH_CXX_FLAGS, torch._C not imported (it would say 1).
printf 'if(CMAKE_SYSTEM_NAME STREQUAL "Linux")\n  set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")\nendif()\n' \
        >"${torch}/share/cmake/Torch/TorchConfig.cmake"
printf 'class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n' >"${torch}/__init__.py"
configure
grep -qF -- "-- gpumemd: PyTorch at ${torch}: gpumem_torch_malloc throws c10::OutOfMemoryError" "${work}/out" || {
        cat "${work}/out" >&2
        echo "FAIL: the fake PyTorch was not taken" >&2
        exit 1
}
expect TorchConfig.cmake 0 "_GLIBCXX_USE_CXX11_ABI=0 (from ${torch}/share/cmake/Torch/TorchConfig.cmake)"

# 2. No TorchConfig.cmake: python3 importing torch from the given directory's parent.
rm "${torch}/share/cmake/Torch/TorchConfig.cmake"
printf 'class _C:\n    _GLIBCXX_USE_CXX11_ABI = False\n' >"${torch}/__init__.py"
configure
expect python3 0 "_GLIBCXX_USE_CXX11_ABI=0 (from torch._C of ${torch} (python3))"

# 3. Neither: no define, and the configure says the default is assumed.
rm "${torch}/__init__.py"
configure
expect neither none "the compiler's default ABI is assumed"
rm -rf "${work}"
