#!/usr/bin/env bash
# bench/mla_model.sh: writes issue 41's benchmark models (random weights) into a cache folder and prints their paths.
# A synthetic deepseek2 with DeepSeek-V2-Lite's attention (hidden 2048, 16 heads, plain attn_q, kv_lora_rank 512,
# rope 64, nope 128, v 128, YaRN) and its MoE form (softmax gating, 2 shared experts, one leading dense layer), but
# few layers and experts so that it runs on 2 cores; and a GQA llama of the same hidden size (16 heads, 4 KV heads of
# 128, V2-Lite's head count) for the KV-bytes comparison. Both are written F32 by scripts/make_tiny_gguf.py and
# quantized by llama.cpp's llama-quantize (bench/peer.sh), so dserve and llama.cpp run the same file.
# Usage: bench/mla_model.sh        prints "deepseek2 PATH" and "gqa PATH" (existing files are reused)
# Env: MLA_CACHE (folder, default ~/.cache/dserve/mla-bench), QTYPE (Q4_K_M), LAYERS (6), EXPERTS (16), USED (4),
#      EXPERT_FF (704), DENSE_FF (5632), PY (python with numpy and gguf; default the venv's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${MLA_CACHE:-$HOME/.cache/dserve/mla-bench}
qtype=${QTYPE:-Q4_K_M}
layers=${LAYERS:-6}; experts=${EXPERTS:-16}; used=${USED:-4}; eff=${EXPERT_FF:-704}; dff=${DENSE_FF:-5632}
py=${PY:-$HOME/.cache/dserve/venv/bin/python}
[ -x "$py" ] || py=python3
mkdir -p "$cache"
peer=$("$root/bench/peer.sh") || { echo "mla_model: bench/peer.sh could not build llama.cpp" >&2; exit 1; }

# V2-Lite keeps the attention and FFN shape per layer: 27 layers of 64 experts of 1408, 6 used, dense FFN 10944.
tag="L${layers}-E${experts}x${eff}u${used}-D${dff}"
ds="$cache/deepseek2-v2lite-$tag"
gq="$cache/llama-gqa2048-L${layers}-F${dff}"
if [ ! -f "$ds-$qtype.gguf" ]; then
  "$py" "$root/scripts/make_tiny_gguf.py" --out "$ds-F32.gguf" --arch deepseek2 --type F32 --hidden 2048 \
    --layers "$layers" --heads 16 --ff "$dff" --experts "$experts" --used "$used" --expert-ff "$eff" \
    --q-lora-rank 0 --kv-lora-rank 512 --rope-dim 64 --nope-dim 128 --v-dim 128 --kv-b split --dense-lead 1 \
    --gating softmax --groups 0 --shared 2 --wscale 1 --wnorm 0 --yarn 1 >&2
  "$peer/llama-quantize" "$ds-F32.gguf" "$ds-$qtype.gguf" "$qtype" 2 >&2 2>"$cache/quantize.log" ||
    { tail -20 "$cache/quantize.log" >&2; exit 1; }
  rm -f "$ds-F32.gguf"
fi
if [ ! -f "$gq-$qtype.gguf" ]; then
  "$py" "$root/scripts/make_tiny_gguf.py" --out "$gq-F32.gguf" --arch llama --type F32 --hidden 2048 \
    --layers "$layers" --heads 16 --kv-heads 4 --head-dim 128 --ff "$dff" >&2
  "$peer/llama-quantize" "$gq-F32.gguf" "$gq-$qtype.gguf" "$qtype" 2 >&2 2>"$cache/quantize.log" ||
    { tail -20 "$cache/quantize.log" >&2; exit 1; }
  rm -f "$gq-F32.gguf"
fi
echo "deepseek2 $ds-$qtype.gguf"
echo "gqa $gq-$qtype.gguf"
