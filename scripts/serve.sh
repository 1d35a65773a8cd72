#!/usr/bin/env bash
# scripts/serve.sh: set-up, build the dserve binary (only it: no test is compiled), then serve.
#   scripts/serve.sh                          the bundled model: `dserve serve` on http://127.0.0.1:8000
#   scripts/serve.sh MODEL.gguf [FLAGS...]    any GGUF: `dserve serve MODEL.gguf --port 8000 FLAGS` (dserve serve --help)
#   scripts/serve.sh CONFIG.json [NODE] [FLAGS...]  a node of a cluster config: `dserve launch` (node default "local")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
BUILD_TARGET=dserve "$root/scripts/build.sh"
dserve=$root/build/dserve
case "${1:-}" in
  *.json)
    config=$1; shift
    node=local
    if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then node=$1; shift; fi
    exec "$dserve" launch --config "$config" --node "$node" "$@" ;;
  "" | -*)
    exec "$dserve" serve "$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf" --port 8000 \
      --alias smollm2-135m-instruct "$@" ;;
  *)
    model=$1; shift
    exec "$dserve" serve "$model" --port 8000 "$@" ;;
esac
