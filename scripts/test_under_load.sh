#!/usr/bin/env bash
# scripts/test_under_load.sh: the whole test suite (or ctest's -R PATTERN ...) while a CPU hog takes N cores, to
# find tests that wait on time instead of on something observable (docs/design.md, "Writing tests"). Not in CI.
# Usage: scripts/test_under_load.sh [--hog N] [--build DIR] [ctest args...]; the log is DIR/test_under_load.log.
# The hog is stress-ng --cpu N (Debian's stress-ng; scripts/setup.sh installs it), else N shell busy loops.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
hog=2
build=$root/build
while [ $# -gt 0 ]; do
  case "$1" in
    --hog) hog=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -f "$build/CTestTestfile.cmake" ] || { echo "test_under_load: no build in $build (scripts/build.sh)" >&2; exit 2; }
export DSERVE_VENV=${DSERVE_VENV:-${DSERVE_CACHE:-$HOME/.cache/dserve}/venv}
pids=()
stop_hog() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop_hog EXIT
if command -v stress-ng >/dev/null; then
  stress-ng --cpu "$hog" --timeout 3h --quiet & pids+=($!)
else
  for _ in $(seq "$hog"); do (while :; do :; done) & pids+=($!); done
fi
log=$build/test_under_load.log
echo "test_under_load: $hog hog(s) on $(nproc) core(s); ctest -j2 $*; log $log"
rc=0
(cd "$build" && ctest -j2 --output-on-failure "$@") >"$log" 2>&1 || rc=$?
grep -E "tests passed|tests failed out of" "$log" || true
sed -n '/The following tests FAILED/,$p' "$log"
exit $rc
