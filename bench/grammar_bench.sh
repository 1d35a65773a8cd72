#!/usr/bin/env bash
# bench/grammar_bench.sh: what grammar-constrained decoding (response_format json_schema) costs in TPOT at batch 8, against the same requests unconstrained.
#
# Usage: bench/grammar_bench.sh      (a few minutes on a quiet machine)
# Env:   MODEL (GGUF; default the bundled SmolLM2, 49k tokens; the Gemma 3 GGUF has 262k)  NUM_REQ=24  CONC=8
#        OUTPUT_LEN=64  INPUT_LEN=64  PORT=18490  DSERVE_BIN=build/dserve (built when missing)  ROUNDS=2
# One dserve (configs/local.json, the model swapped in) serves both runs, alternated ROUNDS times: the same random
# chat prompts, CONC in flight, at the server's default sampling (temperature 0.8, top-k 40, ...). The constrained
# run asks for a schema whose output never ends before max_tokens (an array of at least 64 strings), the plain one
# sends ignore_eos, so both generate OUTPUT_LEN tokens per request and keep the batch full. Prints TPOT and ITL per
# run and the ratio constrained/plain (issue 18's target: at most 1.10).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
MODEL=${MODEL:-$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf}
NUM_REQ=${NUM_REQ:-24}; CONC=${CONC:-8}; OUTPUT_LEN=${OUTPUT_LEN:-64}; INPUT_LEN=${INPUT_LEN:-64}
PORT=${PORT:-18490}; ROUNDS=${ROUNDS:-2}
DSERVE_BIN=${DSERVE_BIN:-build/dserve}
out=$(mktemp -d /tmp/grammar-bench.XXXXXX)
log() { echo "grammar_bench: $*" >&2; }

[ -f "$MODEL" ] || { log "$MODEL is missing (scripts/setup.sh fetches the bundled models)"; exit 1; }
if [ ! -x "$DSERVE_BIN" ]; then
  log "building dserve in build"
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j"$(nproc)" --target dserve; } \
    >"$out/build.log" 2>&1 || { log "dserve did not build (see $out/build.log)"; exit 1; }
  DSERVE_BIN=build/dserve
fi
python3 - "$root/configs/local.json" "$out/config.json" "$MODEL" "$PORT" <<'EOF'
import json, sys
src, dst, model, port = sys.argv[1:5]
c = json.load(open(src))
c["model"], c["model_name"] = model, "bench"
c["router"]["port"] = int(port)
for i, w in enumerate(c["workers"]):
    w["port"] = int(port) + 1 + i  # the router dials the workers at the ports the config names
json.dump(c, open(dst, "w"), indent=1)
EOF
"$DSERVE_BIN" launch --config "$out/config.json" --node local >"$out/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
url="http://127.0.0.1:$PORT"
for _ in $(seq 120); do
  curl -sf "$url/health" >/dev/null 2>&1 && break  # 200 once a worker can generate
  kill -0 $pid 2>/dev/null || { log "dserve exited: $(tail -n 3 "$out/server.log")"; exit 1; }
  sleep 1
done
curl -sf "$url/health" >/dev/null || { log "dserve did not become healthy (log: $out/server.log)"; exit 1; }

schema='{"response_format": {"type": "json_schema", "json_schema": {"name": "notes", "strict": true, "schema":
  {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
   "required": ["notes"], "additionalProperties": false}}}}'
run() {  # NAME ROUND ARGS...
  local name=$1 round=$2; shift 2
  python3 bench/loadgen.py --base-url "$url" --endpoint /v1/chat/completions --dataset random \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --num-requests "$NUM_REQ" --max-concurrency "$CONC" \
    --request-rate inf --warmup 2 --temperature 0.8 --seed "$round" --json-out "$out/$name-$round.json" --quiet "$@" \
    2>>"$out/loadgen.log" || { log "loadgen ($name) failed: $(tail -n 2 "$out/loadgen.log")"; return 1; }
}
status=0
for r in $(seq "$ROUNDS"); do
  log "round $r: plain"
  run plain "$r" --ignore-eos || status=1
  log "round $r: json_schema"
  run schema "$r" --extra-body "$schema" || status=1
done
python3 - "$out" "$ROUNDS" "$MODEL" "$CONC" <<'EOF'
import json, os, statistics, sys
out, rounds, model, conc = sys.argv[1], int(sys.argv[2]), os.path.basename(sys.argv[3]), sys.argv[4]
def load(name):
    reps = []
    for r in range(1, rounds + 1):
        try:
            reps.append(json.load(open(os.path.join(out, "%s-%d.json" % (name, r)))))
        except (OSError, ValueError):
            pass
    return reps
print("== grammar-constrained decoding vs plain: %s, %s in flight ==" % (model, conc))
med = {}
for name in ("plain", "schema"):
    reps = load(name)
    tp = [r["tpot_ms"]["median"] for r in reps if r.get("successful_requests")]
    for i, r in enumerate(reps):
        print("%-6s round %d: ok %d/%d  TPOT median %.1f p99 %.1f ms  ITL p99 %.1f ms  out tok %d" % (
            name, i + 1, r["successful_requests"], r["num_requests_sent"], r["tpot_ms"]["median"] or 0,
            r["tpot_ms"]["p99"] or 0, r["itl_ms"]["p99"] or 0, r["total_output_tokens"]))
    med[name] = statistics.median(tp) if tp else None
if med["plain"] and med["schema"]:
    x = med["schema"] / med["plain"]
    print("TPOT json_schema/plain: %.3f (median over rounds; target <= 1.10: %s)" % (x, "meets" if x <= 1.10 else "misses"))
else:
    print("TPOT json_schema/plain: n/a (a run failed)")
EOF
echo "(logs: $out)"
exit $status
