#!/usr/bin/env bash
# scripts/build.sh: configures and builds dserve into build/ (BUILD_DIR and extra cmake args may be given).
# BUILD_TARGET builds one target only (scripts/serve.sh: dserve, so serving never waits for the tests to compile).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
