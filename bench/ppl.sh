#!/usr/bin/env bash
# bench/ppl.sh: dserve's correctness against llama.cpp on real text: perplexity side by side, and the KL divergence of
# dserve's next-token distributions from llama.cpp's at every scored position, on the same GGUF, text and context.
# For each run: `llama-perplexity --kl-divergence-base FILE` scores the text and writes its log-probabilities, then
# `dserve perplexity --kl-base FILE --file TEXT` scores the same tokens (and checks that its own tokenization of the
# text gives them) and compares. Both score the second half of each chunk of CTX tokens.
# The text: /usr/share/common-licenses/GPL-3 (the GNU GPL version 3, 35 KB of English that Debian's base-files
# package installs on every Debian and Ubuntu machine).
# The peer is llama.cpp's llama-perplexity, built once by bench/peer.sh (cached outside the repo).
# Env: TEXT (the text file), THREADS (2), BUILD (build folder, default build-bench), KERNELS (auto),
#      RUNS (space-separated MODEL_FILE:CTX:CHUNKS, model files in models/weights; default below: both bundled models
#      at 512, and both at 2048, which is past Gemma 3's 512-token sliding window).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
text=${TEXT:-/usr/share/common-licenses/GPL-3}
threads=${THREADS:-2}
build=${BUILD:-$root/build-bench}
kernels=${KERNELS:-auto}
smol=SmolLM2-135M-Instruct.Q4_1.gguf
gemma=gemma-3-270m-q4_k_m.gguf
runs=${RUNS:-"$smol:512:4 $gemma:512:4 $smol:2048:2 $gemma:2048:2"}

[ -f "$text" ] || { echo "ppl: no text at $text (set TEXT)" >&2; exit 1; }
[ -f "$root/models/weights/$smol" ] || "$root/scripts/setup.sh"
if [ ! -x "$build/dserve" ]; then
  echo "ppl: building dserve in $build" >&2
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" --target dserve -j2 >/dev/null
fi
peer=$("$root/bench/peer.sh") || { echo "ppl: bench/peer.sh could not build llama.cpp" >&2; exit 1; }

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
  rows+=("$(python3 - "$file" "$ctx" "$chunks" "$lc" "$ds" <<'PY'
# One table row from llama-perplexity's "Final estimate" and dserve perplexity's summary.
import re, sys
name, ctx, chunks, lc, ds = sys.argv[1:]
def num(pat, s):
    m = re.search(pat, s)
    if not m:
        sys.exit(f"ppl: no match for {pat!r}")
    return float(m.group(1))
lc_ppl = num(r"Final estimate: PPL = ([0-9.]+)", lc)
ds_ppl = num(r"Final estimate: PPL = ([0-9.]+)", ds)
kld, kld_err = num(r"Mean +KLD: +(-?[0-9.]+)", ds), num(r"Mean +KLD: +-?[0-9.]+ ± +([0-9.]+)", ds)
p99, top = num(r"99\.0% +KLD: +(-?[0-9.]+)", ds), num(r"Same top p: +([0-9.]+)", ds)
tok = "agree" if re.search(r"^tokens: the first \d+ tokens .* agree", ds, re.M) else "DIFFER"
label = {"SmolLM2-135M-Instruct.Q4_1.gguf": "SmolLM2-135M Q4_1", "gemma-3-270m-q4_k_m.gguf": "Gemma-3-270M Q4_K_M"}
print(f"{label.get(name, name):<20} {ctx:>5} {chunks:>6} {lc_ppl:>13.4f} {ds_ppl:>11.4f} {ds_ppl / lc_ppl:>7.4f}"
      f" {kld:>9.6f} ± {kld_err:.6f} {p99:>9.6f} {top:>8.2f} {tok:>7}")
PY
)")
done

echo "text: $text; $threads threads; dserve $kernels kernels; KLD of dserve from llama.cpp (llama.cpp as the base)"
printf '%-20s %5s %6s %13s %11s %7s %20s %9s %8s %7s\n' model ctx chunks "PPL llama.cpp" "PPL dserve" ratio \
  "mean KLD" "p99 KLD" "same top%" tokens
printf '%s\n' "${rows[@]}"
