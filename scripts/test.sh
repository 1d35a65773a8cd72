#!/usr/bin/env bash
# scripts/test.sh: the whole test suite on a new machine: set-up, build, ctest.
# --sanitize builds into build-asan with ASan+UBSan instead (-O2 -g, no CUDA) and fails on any sanitizer report,
# including one from a child process that its test did not check (build-asan/sanitizer-logs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=$root/build; args=(); sanitize=0
if [ "${1:-}" = "--sanitize" ]; then
  build=$root/build-asan; args=(-DDSERVE_SANITIZE=ON -DDSERVE_CUDA=OFF); sanitize=1; shift
fi
BUILD_DIR=$build "$root/scripts/build.sh" "${args[@]}"
export DSERVE_VENV=${DSERVE_CACHE:-$HOME/.cache/dserve}/venv
cd "$build"
if [ $sanitize -eq 0 ]; then exec ctest --output-on-failure -j"$(nproc)" "$@"; fi
logs=$build/sanitizer-logs # the ASan options come from the build (tests/CMakeLists.txt); UBSan's are these
rm -rf "$logs" && mkdir -p "$logs"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan:log_exe_name=1"
export LSAN_OPTIONS="max_leaks=20:suppressions=$root/tests/lsan/suppressions.txt" # the gtests get no LSAN_OPTIONS of their own
rc=0
ctest --output-on-failure -j"$(nproc)" "$@" || rc=$?
if [ -n "$(ls -A "$logs")" ]; then
  echo "test.sh: sanitizer reports ($logs):"
  for f in "$logs"/*; do echo "==== $f"; head -n 60 "$f"; done
  rc=1
fi
exit $rc
