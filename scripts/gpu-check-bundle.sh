#!/usr/bin/env bash
# gpu-check-bundle.sh: builds what scripts/gpu-check.sh runs on a GPU machine
# that cannot build or install anything, into one ignored folder (default
# gpu-check-bundle/, a few tens of MiB) to carry there:
#   libexec/   gpumemd, gpumemctl, gpu_client (Release build)
#   bin/       wrappers that run them with lib/ on LD_LIBRARY_PATH, or, when
#              the machine's glibc is older than the bundle needs, through the
#              bundled dynamic loader and glibc (glibc/)
#   lib/       libgpumem, libgpumem_torch and every shared library the binaries need (ldd),
#              except glibc's own and the driver's (libcuda, libnvidia-ml:
#              always the machine's)
#   gpumem-lib/  libgpumem and libgpumem_torch with only their own libraries, for PyTorch to load
#              (GPUMEM_LIBRARY_DIR) without the rest of lib/ in its way
#   glibc/     this machine's loader and glibc, used only by that fallback
#   emulator/  the emulated driver and NVML, for gpu-check.sh --emulator
#   kernels.ptx  the check's kernels (nvcc -ptx), JIT-compiled by the driver
#   MANIFEST   what was built, from which commit, the glibc it needs
# usage: scripts/gpu-check-bundle.sh [OUT_DIR]   (needs cmake, a C compiler,
# the build dependencies, cuda.h and nvcc from the CUDA toolkit)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/gpu-check-bundle}
BUILD=$REPO/build-gpucheck
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

# Release warnings are not errors here: this build is for carrying, not for review.
cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEMD_WERROR=OFF -DGPUMEMD_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target gpumemd gpumemctl gpumem gpumem_torch gpu_check_client fakecuda fakenvml >/dev/null

rm -rf "$OUT"
mkdir -p "$OUT"/{bin,libexec,lib,gpumem-lib,glibc,emulator}
install -m755 "$BUILD/daemon/gpumemd" "$BUILD/ctl/gpumemctl" "$OUT/libexec/"
install -m755 "$BUILD/tests/gpu_check_client" "$OUT/libexec/gpu_client"
cp -P "$BUILD"/lib/libgpumem.so* "$BUILD"/lib/libgpumem_torch.so* "$OUT/lib/"
cp -P "$BUILD"/tests/fakecuda/lib*.so* "$OUT/emulator/"

# glibc's libraries must come from one glibc: the machine's, or all of ours.
is_glibc() {
        case $(basename "$1") in
        ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|libmvec.so.*) return 0 ;;
        esac
        return 1
}
for bin in "$OUT"/libexec/* "$OUT"/lib/libgpumem.so.*[0-9]; do
        ldd "$bin" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | while read -r lib; do
                case $(basename "$lib") in libcuda.so*|libnvidia-ml.so*|libgpumem.so*) continue ;; esac
                if is_glibc "$lib"; then cp -L "$lib" "$OUT/glibc/"; else cp -L "$lib" "$OUT/lib/"; fi
        done
done
cp -P "$BUILD"/lib/libgpumem.so* "$BUILD"/lib/libgpumem_torch.so* "$OUT/gpumem-lib/"
ldd "$BUILD"/lib/libgpumem.so.*[0-9] | awk '/=> \//{print $3}' | while read -r lib; do
        is_glibc "$lib" || cp -L "$lib" "$OUT/gpumem-lib/"
done
NEEDS=$(for f in "$OUT"/libexec/* "$OUT"/lib/*; do objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*'; done |
        sort -t. -k2 -n -u | tail -1 | sed 's/GLIBC_//')

for name in gpumemd gpumemctl gpu_client; do
        cat >"$OUT/bin/$name" <<WRAP
#!/bin/sh
# Runs libexec/$name with the bundle's libraries (see scripts/gpu-check-bundle.sh).
here=\$(dirname "\$(readlink -f "\$0")")/..
export LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
have=\$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/glibc 2\\.//')
if [ -n "\$have" ] && [ "\$have" -ge $(echo "$NEEDS" | sed 's/^2\.//') ]; then
        exec "\$here/libexec/$name" "\$@"
fi
# An older glibc than the bundle needs: the bundle's own loader and glibc.
exec "\$here/glibc/$(basename "$(ls "$OUT"/glibc/ld-linux* | head -1)")" --library-path "\$here/glibc:\$here/lib" "\$here/libexec/$name" "\$@"
WRAP
        chmod 755 "$OUT/bin/$name"
done

if [ -x "$NVCC" ]; then
        "$NVCC" -ptx -arch=compute_90 -o "$OUT/kernels.ptx" "$REPO/scripts/gpu-check/kernels.cu"
else
        echo "warning: no nvcc: the bundle has no kernels.ptx and can only run --emulator" >&2
fi
cat >"$OUT/MANIFEST" <<EOF2
gpumemd GPU-check bundle
commit: $(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet || echo " (with uncommitted changes)")
built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION)
needs: glibc 2.$(echo "$NEEDS" | sed 's/^2\.//') (older: the bundled glibc/ is used)
kernels: $([ -f "$OUT/kernels.ptx" ] && echo "kernels.ptx (compute_90)" || echo none)
EOF2
du -sh "$OUT" | awk '{print "bundle: " $2 ", " $1}'
cat "$OUT/MANIFEST"
