#!/bin/sh
# Builds the gpumem wheel that carries the libraries of a cmake build:
#   scripts/build-wheel.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, BUILD_DIR/wheel)
# BUILD_DIR/lib's libgpumem.so.0 and libgpumem_torch.so.0 go into the wheel
# as gpumem/_libs (python/build_backend/gpumem_build.py, stdlib only, no
# network); install it with `pip install --no-index OUT_DIR/gpumem-*.whl`.
# Prints the wheel's file name.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-$build/wheel}
mkdir -p "$out"
libdir=$(cd "$build/lib" && pwd)
out=$(cd "$out" && pwd)
cd "$src/python"
GPUMEM_WHEEL_LIBDIR=$libdir ${PYTHON:-python3} -c 'import sys
sys.path.insert(0, "build_backend")
import gpumem_build
print(gpumem_build.build_wheel(sys.argv[1]))' "$out"
