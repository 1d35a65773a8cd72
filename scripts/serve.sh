#!/usr/bin/env bash
# scripts/serve.sh: set-up, build the dserve binary (only it: no test is compiled), then serve the bundled model on
# a node of a cluster config (default: configs/local.json, node "local", http://127.0.0.1:8000).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
BUILD_TARGET=dserve "$root/scripts/build.sh"
exec "$root/build/dserve" launch --config "${1:-$root/configs/local.json}" --node "${2:-local}"
