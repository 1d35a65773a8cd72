#!/usr/bin/env bash
# bench/kvquant.sh: kv_type q8_0 against f16, in one run, on each bundled model (issue 31's table):
#  - accuracy on real text: `dserve perplexity` with an f16 cache saves its log-probabilities, the q8_0 cache is scored
#    against them (PPL, mean KLD of q8_0 from f16); beside it llama.cpp's own: `llama-perplexity -fa on` with an f16
#    cache as the base, then `-ctk q8_0 -ctv q8_0 -fa on --kl-divergence` against it (llama.cpp quantizes V only
#    under flash attention, so both of its runs use it). Same text, context and chunks on both sides.
#  - bytes per handoff: one 1P1D cluster (kvxfer shm) per type, one prompt of HANDOFF_TOKENS random tokens, the
#    router's dserve:kv_transfer_bytes_total for it.
#  - the default pool (kv_budget_mb as shipped): the KV blocks the decode worker reports, and the sequences of
#    SEQ_CTX tokens they hold (blocks / (SEQ_CTX / 16); a sliding-window model holds more, its local layers give
#    window pages back).
#  - decode speed at batch DECODE_BATCH from DECODE_CTX-token contexts: `dserve generate --bench --bench-ctx`, the two
#    types alternating DECODE_RUNS times, best of each, in wall-clock tok/s and in tokens per thread-second of CPU
#    (on a shared machine the wall clock also counts the other processes' turns on the cores; CPU time does not).
# The peer is llama.cpp built by bench/peer.sh (cached outside the repo); the text /usr/share/common-licenses/GPL-3.
# Env: TEXT, THREADS (2), BUILD (build-bench), KERNELS (auto) as bench/ppl_common.sh says; MODELS (model files in
#      models/weights, default both bundled), CTX (512), CHUNKS (4), HANDOFF_TOKENS (1024), SEQ_CTX (2048),
#      DECODE_BATCH (8), DECODE_CTX (2048), DECODE_GEN (64), DECODE_RUNS (3).
set -euo pipefail
# shellcheck source=bench/ppl_common.sh
. "$(dirname "$0")/ppl_common.sh"
models=${MODELS:-"$smol $gemma"}
ctx=${CTX:-512} chunks=${CHUNKS:-4} handoff=${HANDOFF_TOKENS:-1024} seq_ctx=${SEQ_CTX:-2048}
dbatch=${DECODE_BATCH:-8} dctx=${DECODE_CTX:-2048} dgen=${DECODE_GEN:-64} druns=${DECODE_RUNS:-3}
ppl_prepare kvquant

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rows=()
for file in $models; do
  model=$root/models/weights/$file
  [ -f "$model" ] || { echo "kvquant: missing $model" >&2; exit 1; }
  common=(--model "$model" --file "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads" --kernels "$kernels")
  echo "kvquant: $file: dserve perplexity, f16 cache (base), then q8_0 against it" >&2
  ds16=$("$build/dserve" perplexity "${common[@]}" --save-logits "$tmp/ds.kld" 2>&1) ||
    { echo "$ds16" | tail -5 >&2; echo "kvquant: dserve perplexity failed" >&2; exit 1; }
  ds8=$("$build/dserve" perplexity "${common[@]}" --kv-type q8_0 --kl-base "$tmp/ds.kld" 2>&1) ||
    { echo "$ds8" | tail -5 >&2; echo "kvquant: dserve perplexity --kv-type q8_0 failed" >&2; exit 1; }
  rm -f "$tmp/ds.kld"
  echo "kvquant: $file: llama-perplexity -fa on, f16 cache (base), then -ctk q8_0 -ctv q8_0 against it" >&2
  lc16=$("$peer/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" -fa on \
         --kl-divergence-base "$tmp/lc.kld" 2>&1) || { echo "$lc16" | tail -20 >&2; exit 1; }
  lc8=$("$peer/llama-perplexity" -m "$model" -c "$ctx" -t "$threads" -fa on -ctk q8_0 -ctv q8_0 \
        --kl-divergence-base "$tmp/lc.kld" --kl-divergence 2>&1) || { echo "$lc8" | tail -20 >&2; exit 1; }
  rm -f "$tmp/lc.kld"
  echo "kvquant: $file: 1P1D handoff of $handoff tokens and the default pool, f16 then q8_0" >&2
  serve=$(python3 "$root/bench/kvquant_serve.py" "$build/dserve" "$model" "$handoff" "$threads") ||
    { echo "kvquant: serving failed" >&2; exit 1; }
  echo "$serve" >&2
  echo "kvquant: $file: decode at batch $dbatch from $dctx-token contexts, $druns runs of each type" >&2
  dec16="" dec8=""
  for _ in $(seq "$druns"); do
    for t in f16 q8_0; do
      out=$("$build/dserve" generate --model "$model" --bench --bench-prompt 16 --bench-gen "$dgen" \
            --bench-batch "$dbatch" --bench-ctx "$dctx" --threads "$threads" --kernels "$kernels" --kv-type "$t") ||
        { echo "kvquant: dserve generate --bench failed" >&2; exit 1; }
      # "tok/s: WALL (per thread-second of CPU: CPU)"
      r=$(echo "$out" | sed -n "s/^tg$dgen batch $dbatch ctx $dctx tok\/s: \([0-9.]*\) (per thread-second of CPU: \([0-9.]*\))/\1 \2/p")
      [ -n "$r" ] || { echo "kvquant: no decode figure in: $out" >&2; exit 1; }
      echo "  $t: $r (tok/s wall, per thread-second of CPU)" >&2
      if [ "$t" = f16 ]; then dec16="$dec16 $r"; else dec8="$dec8 $r"; fi
    done
  done
  rows+=("$(PYTHONPATH=$root/bench python3 - "$file" "$ds16" "$ds8" "$lc16" "$lc8" "$serve" "$dec16" "$dec8" \
           "$seq_ctx" <<'PY'
# The model's rows: accuracy (dserve's and llama.cpp's q8_0 cache against their own f16 cache), then serving.
import json, sys
from ppl_figures import figure, LABELS
name, ds16, ds8, lc16, lc8, serve, dec16, dec8, seq_ctx = sys.argv[1:]
s = json.loads(serve.splitlines()[-1])
label = LABELS.get(name, name)
kd, kl = figure("kld", ds8), figure("kld", lc8)
print(f"{label:<20} dserve    PPL f16 {figure('ppl', ds16):8.4f}  q8_0 {figure('ppl', ds8):8.4f}  KLD q8_0 vs f16 "
      f"{kd:.6f} ± {figure('kld_err', ds8):.6f}  p99 {figure('p99', ds8):.6f}  same top {figure('top', ds8):6.2f}%")
print(f"{'':<20} llama.cpp PPL f16 {figure('ppl', lc16):8.4f}  q8_0 {figure('ppl_q', lc8):8.4f}  KLD q8_0 vs f16 "
      f"{kl:.6f} ± {figure('kld_err', lc8):.6f}  p99 {figure('p99', lc8):.6f}  same top {figure('top', lc8):6.2f}%")
print(f"{'':<20} KLD dserve / llama.cpp: {kd / kl:.3f}  (target <= 1)")
b16, b8 = s["f16"]["handoff_bytes"], s["q8_0"]["handoff_bytes"]
n16, n8 = s["f16"]["blocks"], s["q8_0"]["blocks"]
per = (int(seq_ctx) + 15) // 16
print(f"{'':<20} handoff of {s['tokens']} tokens: f16 {b16 / 2**20:.3f} MiB, q8_0 {b8 / 2**20:.3f} MiB: "
      f"{b8 / b16:.4f}x  (target <= 0.55)")
print(f"{'':<20} default pool ({s['budget_mb']} MiB): f16 {n16} blocks = {n16 // per} sequences of {seq_ctx}, q8_0 "
      f"{n8} blocks = {n8 // per}: {n8 / n16:.3f}x  (target >= 1.8)")
# runs: (wall tok/s, tok/s per thread-second of CPU) pairs; the best of each, f16 and q8_0 alternating
w16, c16 = (max(float(x) for x in dec16.split()[i::2]) for i in (0, 1))
w8, c8 = (max(float(x) for x in dec8.split()[i::2]) for i in (0, 1))
print(f"{'':<20} decode tok/s (wall, best): f16 {w16:.2f}, q8_0 {w8:.2f}: {w8 / w16:.3f}x; per thread-second of CPU "
      f"(best): f16 {c16:.2f}, q8_0 {c8:.2f}: {c8 / c16:.3f}x  (target >= 1)")
PY
)")
done

echo "text: $text; ctx $ctx x $chunks chunks; $threads threads; dserve $kernels kernels; decode: batch $dbatch," \
     "$dctx-token contexts, $dgen steps, best of $druns alternating runs"
printf '%s\n' "${rows[@]}"
