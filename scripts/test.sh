#!/usr/bin/env bash
# scripts/test.sh: the whole test suite on a new machine: set-up, build, ctest.
# --sanitize builds into build-asan with ASan+UBSan instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=$root/build; args=()
if [ "${1:-}" = "--sanitize" ]; then build=$root/build-asan; args=(-DDSERVE_SANITIZE=ON); export BUILD_TYPE=Debug; shift; fi
BUILD_DIR=$build "$root/scripts/build.sh" "${args[@]}"
export DSERVE_VENV=${DSERVE_CACHE:-$HOME/.cache/dserve}/venv
cd "$build" && ctest --output-on-failure -j"$(nproc)" "$@"
