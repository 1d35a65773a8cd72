#!/usr/bin/env bash
# scripts/fuzz.sh: builds the libFuzzer targets (clang, build-fuzz) and runs each for SECONDS over a copy of its seed corpus.
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]     SECONDS default 60; TARGET default: every tests/fuzz/fuzz_*.c
# FUZZ_PARALLEL: targets fuzzed at once (default: the number of cores); FUZZ_JOBS: build jobs (default 2).
# Prints one line per target; exits non-zero when any target crashed, leaked, hung or failed to build, with the
# reproducer's path (artifacts and logs in build-fuzz/fuzz-artifacts/). The committed corpus is never modified.
set -u
cd "$(dirname "$0")/.."
root=$PWD
secs=60
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
for t in "${targets[@]}"; do
  [ -f "tests/fuzz/$t.c" ] || { echo "fuzz.sh: no target $t (tests/fuzz/$t.c)"; exit 2; }
done
command -v clang >/dev/null && command -v clang++ >/dev/null || { echo "fuzz.sh: clang is missing (scripts/setup.sh installs clang and libclang-rt-14-dev)"; exit 2; }
bdir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${FUZZ_JOBS:-2}
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSERVE_FUZZ=ON -DDSERVE_CUDA=OFF >"$bdir.configure.log" 2>&1 \
    || { echo "fuzz.sh: configure failed (see $bdir.configure.log)"; exit 2; }
else
  cmake -S . -B "$bdir" >/dev/null 2>&1 || { echo "fuzz.sh: re-configure failed"; exit 2; }
fi
art="$bdir/fuzz-artifacts"
mkdir -p "$art"
fail=0
# Every target first in one build (a failure is then pinned to its target), then up to FUZZ_PARALLEL at once (default:
# one per core; each fuzzer is one process), results printed in the order of the targets.
built=()
if cmake --build "$bdir" --target "${targets[@]}" -j"$jobs" >"$art/build.log" 2>&1; then
  built=("${targets[@]}")
else
  for t in "${targets[@]}"; do
    if cmake --build "$bdir" --target "$t" -j"$jobs" >"$art/$t.build.log" 2>&1; then
      built+=("$t")
    else
      echo "$t: FAIL build (see $art/$t.build.log)"
      grep -m3 -E 'error' "$art/$t.build.log" | sed "s/^/  $t: /"
      fail=1
    fi
  done
fi
par=${FUZZ_PARALLEL:-$(nproc)}
[[ "$par" =~ ^[1-9][0-9]*$ ]] || par=1
rm -f "$art"/*.result "$art"/*.rc
running=0
for t in "${built[@]}"; do
  if [ "$running" -ge "$par" ]; then wait -n; running=$((running - 1)); fi
  (tests/fuzz/run_fuzz.sh "$bdir/tests/fuzz/$t" "tests/fuzz/corpus/$t" "$art" "$secs" >"$art/$t.result" 2>&1
   echo $? >"$art/$t.rc") &
  running=$((running + 1))
done
wait
for t in "${built[@]}"; do
  cat "$art/$t.result"
  [ "$(cat "$art/$t.rc" 2>/dev/null)" = 0 ] || fail=1
done
[ $fail -eq 0 ] && echo "fuzz.sh: all ${#targets[@]} targets clean for ${secs}s each" || echo "fuzz.sh: FAILURES (artifacts in $art)"
exit $fail
