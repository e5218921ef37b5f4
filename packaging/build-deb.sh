#!/bin/sh
# Builds the Debian packages the Debian way: dpkg-buildpackage over
# packaging/debian (debhelper, CMake build system), in a copy of the source
# tree, so the working tree is never written.
#   packaging/build-deb.sh SOURCE_DIR OUT_DIR
# Leaves the source package (.dsc, orig and debian tarballs), the .deb files
# (the -dbgsym ones hold the debug symbols), .buildinfo and .changes in
# OUT_DIR. Needs dpkg-dev and debhelper (Debian packages).
set -eu

src=$(cd "$1" && pwd) out=$2
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(dpkg-parsechangelog -l "$src/packaging/debian/changelog" -S Version)
upstream=${version%-*}
tree=$out/gpumemd-$upstream
rm -rf "$tree"
mkdir -p "$tree"
# The files of the source tree: what git tracks (and untracked files it does
# not ignore), else everything but build directories.
if git -C "$src" rev-parse --show-toplevel >/dev/null 2>&1; then
        (cd "$src" && git ls-files -z --cached --others --exclude-standard) |
                (cd "$src" && xargs -0 cp --parents -t "$tree" 2>/dev/null || true)
else
        (cd "$src" && tar --exclude='./build*' --exclude=./.git -cf - .) | (cd "$tree" && tar -xf -)
fi
# The upstream tarball of that tree, so the source package is built (and
# checked by lintian) too.
(cd "$out" && tar --sort=name -czf "gpumemd_$upstream.orig.tar.gz" "gpumemd-$upstream")
cp -rL "$src/packaging/debian" "$tree/debian"
cd "$tree"
# nocheck: see debian/rules.
# The cuda backend's cuda.h (debian/rules explains the profiles): Debian's
# nvidia-cuda-dev, else NVIDIA's toolkit, else none. Say which.
profiles=${DEB_BUILD_PROFILES:-}
if [ -z "$profiles" ]; then
        if dpkg-query -W -f='${Status}' nvidia-cuda-dev 2>/dev/null | grep -q "install ok installed"; then
                :
        elif [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda.h" ]; then
                profiles=pkg.gpumemd.cudahome
        else
                profiles=pkg.gpumemd.nocuda
        fi
fi
echo "build-deb: build profiles '${profiles}'"
# Upstream is strict where Debian warns: a symbol added to libgpumem without
# a line in debian/libgpumem0.symbols fails the build.
DPKG_GENSYMBOLS_CHECK_LEVEL=4 DEB_BUILD_OPTIONS="nocheck parallel=${GM_DEB_JOBS:-2} ${DEB_BUILD_OPTIONS:-}" \
        DEB_BUILD_PROFILES="$profiles" dpkg-buildpackage --no-sign
