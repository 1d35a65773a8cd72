# bench/ppl_common.sh: what bench/ppl.sh and bench/accuracy.sh share (sourced, not run): text, models, dserve, peer.
# Env: TEXT (the text file, default /usr/share/common-licenses/GPL-3: the GNU GPL version 3, 35 KB of English that
#      Debian's base-files package installs on every Debian and Ubuntu machine), THREADS (2), BUILD (build folder,
#      default build-bench), KERNELS (dserve's kernels under test, auto).
# After ppl_prepare NAME: $root, $text, $threads, $build, $kernels, $smol, $gemma (model file names in models/weights)
# and $peer (llama.cpp's bin dir, from bench/peer.sh). The figures in the two tools' outputs: bench/ppl_figures.py
# (python3 with PYTHONPATH=$root/bench: from ppl_figures import figure, tokens, LABELS).
# shellcheck shell=bash disable=SC2034 # (the variables are the sourcing script's)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
text=${TEXT:-/usr/share/common-licenses/GPL-3}
threads=${THREADS:-2}
build=${BUILD:-$root/build-bench}
kernels=${KERNELS:-auto}
smol="SmolLM2-135M-Instruct.Q4_1.gguf"
gemma="gemma-3-270m-q4_k_m.gguf"

ppl_prepare() {
  local name=$1
  [ -f "$text" ] || { echo "$name: no text at $text (set TEXT)" >&2; exit 1; }
  [ -f "$root/models/weights/$smol" ] || "$root/scripts/setup.sh"
  if [ ! -x "$build/dserve" ]; then
    echo "$name: building dserve in $build" >&2
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build" --target dserve -j2 >/dev/null
  fi
  peer=$("$root/bench/peer.sh") || { echo "$name: bench/peer.sh could not build llama.cpp" >&2; exit 1; }
}
