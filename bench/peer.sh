#!/usr/bin/env bash
# bench/peer.sh: builds the llama.cpp peer (llama-server, llama-bench, ..., and llama-embedding, an example: the
# embeddings golden, scripts/golden/make_embeddings_golden.py) once, outside the repo, and prints its bin dir.
# The sources are the llama.cpp that llama-cpp-python's sdist vendors (PyPI is reachable here, GitHub is not), built
# for this machine's ISA without -march=native and without AMX: the CPU may report AMX but AMX instructions trap.
# The ISA options are the ones /proc/cpuinfo lists (an Intel machine here has AVX-VNNI, an AMD one only AVX512-VNNI,
# and a build with the other's options dies of SIGILL); each option set gets its own build folder.
# Idempotent: when $dir/bin holds every binary and passes the smoke check, nothing is downloaded or built.
# Env: PEER_VERSION (llama-cpp-python version, pinned so a second run needs no network; default below),
#      PEER_CACHE ($HOME/.cache/dserve/llama.cpp), PEER_JOBS (2), PIP (pip3), MODEL (GGUF for the smoke run).
# stdout: only the bin dir (callers do `bin=$(bench/peer.sh)`); progress goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${PEER_VERSION:-0.3.36}
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
isa_opts=() isa_tag=""
# ggml option : cpuinfo flag; AMX stays off whatever the CPU says
for pair in AVX2:avx2 FMA:fma F16C:f16c BMI2:bmi2 AVX512:avx512f AVX512_VNNI:avx512_vnni AVX512_VBMI:avx512vbmi \
            AVX512_BF16:avx512_bf16 AVX_VNNI:avx_vnni; do
  opt=${pair%%:*} flag=${pair#*:}
  if [[ $cpu_flags == *" $flag "* ]]; then isa_opts+=("-DGGML_$opt=ON") isa_tag+="-$flag"; else isa_opts+=("-DGGML_$opt=OFF"); fi
done
dir=${PEER_CACHE:-$HOME/.cache/dserve/llama.cpp}/$version${isa_tag}
jobs=${PEER_JOBS:-2}
pip=${PIP:-pip3}
model=${MODEL:-$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf}
targets=(llama-server llama-bench llama-batched-bench llama-perplexity llama-tokenize llama-quantize llama-embedding)

have_all() {
  for t in "${targets[@]}"; do [ -x "$dir/bin/$t" ] || return 1; done
}

# llama-bench --help exercises the loader and the CPU backend's feature probe; a tiny real run also executes the
# quantized matmul kernels, which is where an instruction the CPU does not execute (AMX) would trap.
smoke() {
  "$dir/bin/llama-bench" --help >/dev/null 2>&1 || { echo "peer: llama-bench --help failed" >&2; return 1; }
  if [ -f "$model" ]; then
    "$dir/bin/llama-bench" -m "$model" -p 16 -n 4 -t 2 -r 1 >"$dir/smoke.log" 2>&1 ||
      { echo "peer: llama-bench on $model failed (status $?); see $dir/smoke.log" >&2; return 1; }
  fi
}

if have_all && [ -f "$dir/ok" ]; then
  echo "$dir/bin"
  exit 0
fi

mkdir -p "$dir"
src=$dir/src/vendor/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
  echo "peer: downloading the llama-cpp-python $version sdist" >&2
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  "$pip" download -q --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$dl" >&2
  tarball=$(ls "$dl"/llama_cpp_python-*.tar.gz)
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  tar xzf "$tarball" -C "$dir/src" --strip-components=1 "llama_cpp_python-$version/vendor/llama.cpp"
fi

# Option names checked against this version's ggml/CMakeLists.txt. GGML_NATIVE=OFF turns every ISA option off
# by default, so each one this CPU runs is named. LLAMA_CURL is deprecated (ignored) in recent versions but
# still meaningful in older ones. No UI: the server's web page would be downloaded from Hugging Face.
echo "peer: configuring llama.cpp in $dir/build (log: $dir/build.log)" >&2
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON "${isa_opts[@]}" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$dir/build.log" 2>&1 ||
  { tail -20 "$dir/build.log" >&2; exit 1; }
start=$(date +%s)
echo "peer: building ${targets[*]} with -j$jobs (tens of minutes on 2 busy cores)" >&2
cmake --build "$dir/build" -j"$jobs" --target "${targets[@]}" >>"$dir/build.log" 2>&1 ||
  { tail -30 "$dir/build.log" >&2; exit 1; }
mkdir -p "$dir/bin"
for t in "${targets[@]}"; do cp "$dir/build/bin/$t" "$dir/bin/$t"; done
echo "peer: built in $(( $(date +%s) - start )) s" >&2
smoke
echo "llama-cpp-python $version" >"$dir/ok"
echo "$dir/bin"
