#!/usr/bin/env bash
# bench/ppl.sh: dserve's correctness against llama.cpp on real text: perplexity side by side, and the KL divergence of
# dserve's next-token distributions from llama.cpp's at every scored position, on the same GGUF, text and context.
# For each run: `llama-perplexity --kl-divergence-base FILE` scores the text and writes its log-probabilities, then
# `dserve perplexity --kl-base FILE --file TEXT` scores the same tokens (and checks that its own tokenization of the
# text gives them) and compares. Both score the second half of each chunk of CTX tokens.
# The text: /usr/share/common-licenses/GPL-3 (bench/ppl_common.sh).
# The peer is llama.cpp's llama-perplexity, built once by bench/peer.sh (cached outside the repo).
# Env: TEXT, THREADS (2), BUILD (build-bench), KERNELS (auto) as bench/ppl_common.sh says, and
#      RUNS (space-separated MODEL_FILE:CTX:CHUNKS, model files in models/weights; default below: both bundled models
#      at 512, and both at 2048, which is past Gemma 3's 512-token sliding window).
set -euo pipefail
# shellcheck source=bench/ppl_common.sh
. "$(dirname "$0")/ppl_common.sh"
runs=${RUNS:-"$smol:512:4 $gemma:512:4 $smol:2048:2 $gemma:2048:2"}
ppl_prepare ppl

# The base files are large (chunks x ctx/2 x vocabulary x 2 bytes: 1 GiB for Gemma's 262k vocabulary at 2048 x 2).
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rows=()
for run in $runs; do
  IFS=: read -r file ctx chunks <<<"$run"
  model=$root/models/weights/$file
  [ -f "$model" ] || { echo "ppl: missing $model" >&2; exit 1; }
  base=$tmp/base.kld
  echo "ppl: $file ctx $ctx, $chunks chunks: llama-perplexity --kl-divergence-base" >&2
  lc=$("$peer/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
       --kl-divergence-base "$base" 2>&1) || { echo "$lc" | tail -20 >&2; echo "ppl: llama-perplexity failed" >&2; exit 1; }
  echo "ppl: $file ctx $ctx: dserve perplexity --kl-base ($kernels kernels)" >&2
  ds=$("$build/dserve" perplexity --model "$model" --file "$text" --kl-base "$base" --threads "$threads" \
       --kernels "$kernels") || { echo "ppl: dserve perplexity failed" >&2; exit 1; }
  echo "$ds" >&2
  rm -f "$base"
  rows+=("$(PYTHONPATH=$root/bench python3 - "$file" "$ctx" "$chunks" "$lc" "$ds" <<'PY'
# One table row from llama-perplexity's "Final estimate" and dserve perplexity's summary.
import sys
from ppl_figures import figure, tokens, LABELS
name, ctx, chunks, lc, ds = sys.argv[1:]
lc_ppl, ds_ppl = figure("ppl", lc), figure("ppl", ds)
kld, kld_err, p99, top = (figure(w, ds) for w in ("kld", "kld_err", "p99", "top"))
print(f"{LABELS.get(name, name):<20} {ctx:>5} {chunks:>6} {lc_ppl:>13.4f} {ds_ppl:>11.4f} {ds_ppl / lc_ppl:>7.4f}"
      f" {kld:>9.6f} ± {kld_err:.6f} {p99:>9.6f} {top:>8.2f} {tokens(ds):>7}")
PY
)")
done

echo "text: $text; $threads threads; dserve $kernels kernels; KLD of dserve from llama.cpp (llama.cpp as the base)"
printf '%-20s %5s %6s %13s %11s %7s %20s %9s %8s %7s\n' model ctx chunks "PPL llama.cpp" "PPL dserve" ratio \
  "mean KLD" "p99 KLD" "same top%" tokens
printf '%s\n' "${rows[@]}"
