#!/usr/bin/env bash
# bench/engine_bench.sh: dserve's CPU engine side by side with llama.cpp on the same GGUF and thread count.
# Prints prompt processing (512 tokens), decode at batch 1 (128 tokens) and decode summed over 8 sequences,
# each as a dserve/llama.cpp ratio, and dserve's batch-8 aggregate over its own batch 1.
# Env: MODEL (GGUF), THREADS (2), BUILD (build folder, default build-bench), REFVENV (/work/.cache/refvenv),
#      KERNELS (auto), PP (512), TG (128), BATCH (8).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2}
build=${BUILD:-$root/build-bench}
refvenv=${REFVENV:-/work/.cache/refvenv}
kernels=${KERNELS:-auto}
pp=${PP:-512}; tg=${TG:-128}; batch=${BATCH:-8}

[ -f "$model" ] || "$root/scripts/setup.sh"
if [ ! -x "$build/dserve" ]; then
  echo "engine_bench: building dserve in $build" >&2
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" --target dserve -j2 >/dev/null
fi
if ! "$refvenv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "engine_bench: creating $refvenv with llama-cpp-python (compiles llama.cpp; takes minutes)" >&2
  python3 -m venv "$refvenv"
  "$refvenv/bin/pip" install -q llama-cpp-python
fi

echo "engine_bench: dserve generate --bench ($kernels kernels, $threads threads)" >&2
ds=$("$build/dserve" generate --model "$model" --bench --threads "$threads" --kernels "$kernels" \
     --bench-prompt "$pp" --bench-gen "$tg" --bench-batch "$batch")
echo "$ds" >&2

echo "engine_bench: llama.cpp (llama-cpp-python) with $threads threads" >&2
lclog=$(mktemp); trap 'rm -f "$lclog"' EXIT
lc=$("$refvenv/bin/python" - "$model" "$threads" "$pp" "$tg" "$batch" 2>"$lclog" <<'PY'
# llama.cpp through llama-cpp-python's low-level API: the same measurements as dserve generate --bench.
import sys, time
import numpy as np
import llama_cpp
path, threads, PP, TG, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
P0 = 16
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
cp = llama_cpp.llama_context_default_params()
cp.n_ctx = B * max(1024, PP + 64, P0 + TG + 16)  # each sequence gets n_ctx / n_seq_max cells
cp.n_batch = cp.n_ubatch = max(PP, B * P0)
cp.n_threads = cp.n_threads_batch = threads
cp.n_seq_max = B
ctx = llama_cpp.llama_init_from_model(model, cp)
vocab = llama_cpp.llama_model_get_vocab(model)
V = llama_cpp.llama_vocab_n_tokens(vocab)
mem = llama_cpp.llama_get_memory(ctx)
batch = llama_cpp.llama_batch_init(cp.n_batch, 0, B)
x = 12345
toks = []
for i in range(max(PP, P0 * B)):  # the same pseudo-random tokens as dserve's --bench
    x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    toks.append((x >> 33) % (V - 256) + 256)

def decode(items):  # items: (token, seq, pos, want_logits)
    batch.n_tokens = len(items)
    for i, (t, s, p, l) in enumerate(items):
        batch.token[i] = t; batch.pos[i] = p; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = s; batch.logits[i] = l
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")

def argmax(i):
    return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(V,)).argmax())

best = 1e30
for rep in range(3):
    llama_cpp.llama_memory_clear(mem, True)
    t0 = time.perf_counter()
    decode([(toks[i], 0, i, i == PP - 1) for i in range(PP)])
    best = min(best, time.perf_counter() - t0)
print(f"pp{PP} tok/s: {PP / best:.2f}")
for n in (1, B):
    llama_cpp.llama_memory_clear(mem, True)
    items = []
    for s in range(n):
        items += [(toks[s * P0 + i], s, i, i == P0 - 1) for i in range(P0)]
    decode(items)
    last = [argmax(s * P0 + P0 - 1) for s in range(n)]
    dt = 0.0
    for step in range(TG):
        t0 = time.perf_counter()
        decode([(last[s], s, P0 + step, True) for s in range(n)])
        dt += time.perf_counter() - t0
        last = [argmax(s) for s in range(n)]
    print(f"tg{TG} batch {n} tok/s: {TG * n / dt:.2f}")
PY
) || { tail -20 "$lclog" >&2; echo "engine_bench: llama.cpp side failed" >&2; exit 1; }
echo "$lc" >&2

get() { echo "$1" | sed -n "s/^$2 tok\/s: //p"; }
ds_pp=$(get "$ds" "pp$pp"); lc_pp=$(get "$lc" "pp$pp")
ds_t1=$(get "$ds" "tg$tg batch 1"); lc_t1=$(get "$lc" "tg$tg batch 1")
ds_tb=$(get "$ds" "tg$tg batch $batch"); lc_tb=$(get "$lc" "tg$tg batch $batch")
awk -v a="$ds_pp" -v b="$lc_pp" -v c="$ds_t1" -v d="$lc_t1" -v e="$ds_tb" -v f="$lc_tb" -v pp="$pp" -v tg="$tg" -v B="$batch" -v th="$threads" 'BEGIN {
  printf "engine_bench: %s threads            dserve     llama.cpp   ratio   target\n", th
  printf "prompt processing (%d tok)   %9.1f   %9.1f   %5.2fx   >= 0.8x\n", pp, a, b, a / b
  printf "decode batch 1 (%d tok)      %9.1f   %9.1f   %5.2fx   >= 1.0x\n", tg, c, d, c / d
  printf "decode batch %d aggregate    %9.1f   %9.1f   %5.2fx\n", B, e, f, e / f
  printf "dserve batch %d / batch 1    %9.2fx                        >= 3x\n", B, e / c
}'
