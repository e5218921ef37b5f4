#!/usr/bin/env bash
# The tree follows .clang-format: fails naming every C file clang-format would change.
# Usage: check-format.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
mapfile -t files < <(find allocator backend bench broker common ctl daemon examples ipc libgpumem tests torch -name '*.[ch]' | sort)
clang-format --dry-run --Werror "${files[@]}"
