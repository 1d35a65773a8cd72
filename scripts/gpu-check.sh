#!/usr/bin/env bash
# scripts/gpu-check.sh: on a fresh GPU machine, builds the cuda backend, runs the `gpu` tests and cuda_bench, prints a summary (< 8 min).
# Usage: scripts/gpu-check.sh  (env: CUDA_ARCH=90 to force an architecture, BUILD_DIR=build-gpu, JOBS=N)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
logs=$build/gpu-check-logs
t0=$(date +%s)
say() { echo "gpu-check: $*"; }
elapsed() { echo $(( $(date +%s) - t0 ))s; }

# 1. The device.
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu-check: device: /'
else
  say "nvidia-smi not found"
fi
arch=${CUDA_ARCH:-}
if [ -z "$arch" ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
  [ -n "$arch" ] || arch=90
fi
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null || { say "FAILED: nvcc not found (install the CUDA toolkit)"; exit 1; }

# 2. Set-up: packages and the model when the network allows; without apt or PyPI, go on with what is here.
mkdir -p "$logs"
if timeout 180 "$root/scripts/setup.sh" >"$logs/setup.log" 2>&1; then
  say "setup ok ($(elapsed))"
else
  say "setup did not complete (no network?), continuing with what is installed: $(tail -n1 "$logs/setup.log")"
fi
[ -f "$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf" ] || say "model weights absent: the forward-pass checks skip"

# 3. Build only what the check needs.
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$logs/cmake.log" 2>&1; then
  say "FAILED: cmake configure (see $logs/cmake.log):"; tail -n 15 "$logs/cmake.log"; exit 1
fi
grep -q "CUDA backend enabled" "$logs/cmake.log" || { say "FAILED: CUDA backend not enabled:"; grep dserve "$logs/cmake.log"; exit 1; }
if ! timeout 300 cmake --build "$build" --target test_cuda cuda_bench -j"$jobs" >"$logs/build.log" 2>&1; then
  say "FAILED: build (see $logs/build.log):"; grep -E "error|Error" "$logs/build.log" | head -n 20; exit 1
fi
say "built for sm_$arch ($(elapsed))"

# 4. The gpu tests.
( cd "$build" && timeout 240 ctest -L gpu --output-on-failure --timeout 200 ) >"$logs/ctest.log" 2>&1
test_rc=$?
grep -E "tests passed|FAILED|Failed|\*\*\*" "$logs/ctest.log" | grep -v "^ *[0-9]*/[0-9]* Test.*Passed" | tail -n 25
skipped=$(grep -c "Skipped" "$logs/ctest.log" || true)
say "ctest -L gpu: rc=$test_rc, $skipped skipped ($(elapsed))"

# 5. The benchmark.
timeout 150 "$build/tests/cuda/cuda_bench" >"$logs/bench.log" 2>&1
bench_rc=$?

echo "==================== gpu-check summary ($(elapsed)) ===================="
grep -E "tests passed|tests failed" "$logs/ctest.log" | sed 's/^/tests: /'
[ "$skipped" = 0 ] || echo "tests: $skipped skipped (see $logs/ctest.log)"
sed 's/^/bench: /' "$logs/bench.log"
[ $bench_rc = 0 ] || echo "bench: exited with $bench_rc"
echo "logs: $logs"
[ $test_rc = 0 ] && [ $bench_rc = 0 ]
