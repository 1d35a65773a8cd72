#!/usr/bin/env bash
# bench/kvstore_bench.sh: issue 43's targets for the shared KV tier on Redis, on one host, both bundled models
# (bench/kvstore_bench.py does each; bench/README.md, "Issue 43", has the table). Needs build/dserve, redis-server.
# Usage: bench/kvstore_bench.sh [--threads N] [--reps N]   (each run starts and stops its own clusters and redis)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2
reps=1
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--reps N]" >&2; exit 2 ;;
  esac
done
py=bench/kvstore_bench.py
for m in smollm2 gemma3; do
  echo "== ttft: a 3000-token document, fresh workers, store empty / warm ($m)"
  python3 $py ttft --model $m --threads "$threads" --reps "$reps"
done
echo "== outage: the store killed for 30 s under 8 streams (smollm2)"
python3 $py outage --model smollm2 --threads "$threads"
echo "== share: two prefill workers, KV-aware routing off, shared-prefix chats (smollm2)"
python3 $py share --model smollm2 --threads "$threads"
echo "== cluster: a three-master Redis Cluster, one master killed (smollm2)"
python3 $py cluster --model smollm2 --threads "$threads"
