#!/usr/bin/env bash
# bench/compare.sh: dserve (colocated, 1P1D) vs llama.cpp's llama-server, same GGUF and workload at several rates; one ratio table.
#
# Usage: bench/compare.sh            (from anywhere; takes roughly 15 minutes on a quiet machine)
# Knobs (environment): RATES=0.25,0.5,0.75,1 (inf = all at once)  SECS_PER_RATE=40  MIN_REQ=16  MAX_REQ=60
#   NUM_REQ (requests per rate, overrides the three before)  MAX_CONC=0 (requests in flight at most; 0 = no limit)
#   INPUT_LEN=32  OUTPUT_LEN=32  IGNORE_EOS=0  SLO=ttft:1000,tpot:100
#   SERVERS="llama.cpp dserve dserve-1p1d" (also dserve-tpot: configs/local.json with tpot_target_ms=TPOT_TARGET_MS,
#   and dserve-tpotMS, e.g. dserve-tpot200: the same with tpot_target_ms=MS; dserve-1p1d-always and
#   dserve-1p1d-never: configs/1p1d.json with every prompt handed off, or none: dserve-1p1d follows its policy;
#   dserve-chunkN, e.g. dserve-chunk512: configs/local.json with max_batch_tokens=N, the prefill chunk;
#   dserve-1p1d-tcp and dserve-1p1d-tcp-plain: configs/1p1d.json over kvxfer tcp, KV sealed (the default) or not
#   (kvxfer.encrypt false); dserve-1p1d-tcp-base: the same config run by BASE_BIN, a build from before sealing, so
#   nothing is sealed: the cost of sealing is dserve-1p1d-tcp against it)
#   TPOT_TARGET_MS=100  HEALTH_TIMEOUT=120  REQ_TIMEOUT=120
#   RUN_LIMIT=180 (s per loadgen run; requests still in flight then count as timeouts)  DSERVE_BIN=build/dserve
#   LLAMA_PORT=18480  LLAMA_THREADS=2  LLAMA_NP=8 (llama-server slots)  LLAMA_CTX_PER_SLOT=1024
#   LLAMA_ARGS="" (more llama-server options, e.g. "--poll 0" so its threads do not spin on a shared machine)
#   COMPARE_OUT=<dir for logs and JSON>  MODEL=<GGUF> (default SmolLM2; a gemma* GGUF takes MODEL_CONFIG=configs/gemma.json)
# The peer is llama.cpp's own llama-server, built once by bench/peer.sh (cached outside the repo), with
# -np LLAMA_NP parallel slots and continuous batching: the configuration a llama.cpp user serves with.
# Exit status: 0 when every server ran, 1 when one did not become healthy (the table is printed anyway).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

RATES=${RATES:-0.25,0.5,0.75,1}
SECS_PER_RATE=${SECS_PER_RATE:-40}
MIN_REQ=${MIN_REQ:-16}
MAX_REQ=${MAX_REQ:-60}
INPUT_LEN=${INPUT_LEN:-32}
OUTPUT_LEN=${OUTPUT_LEN:-32}
SLO=${SLO:-ttft:1000,tpot:100}
NUM_REQ=${NUM_REQ:-}
MAX_CONC=${MAX_CONC:-0}
IGNORE_EOS=${IGNORE_EOS:-0}
TPOT_TARGET_MS=${TPOT_TARGET_MS:-100}
SERVERS=${SERVERS:-llama.cpp dserve dserve-1p1d}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-120}
REQ_TIMEOUT=${REQ_TIMEOUT:-120}
RUN_LIMIT=${RUN_LIMIT:-180}
DSERVE_BIN=${DSERVE_BIN:-build/dserve}
BASE_BIN=${BASE_BIN:-}
LLAMA_PORT=${LLAMA_PORT:-18480}
LLAMA_THREADS=${LLAMA_THREADS:-2}
LLAMA_NP=${LLAMA_NP:-8}
LLAMA_CTX_PER_SLOT=${LLAMA_CTX_PER_SLOT:-1024}
LLAMA_ARGS=${LLAMA_ARGS:-}
MODEL=${MODEL:-models/weights/SmolLM2-135M-Instruct.Q4_1.gguf}
# another model's dserve configs are local.json / 1p1d.json with MODEL and MODEL_CONFIG's model_name, chat_template
# and sampling (MODEL_CONFIG defaults to configs/gemma.json for a gemma* GGUF)
case $(basename "$MODEL") in gemma*) MODEL_CONFIG=${MODEL_CONFIG:-configs/gemma.json} ;; *) MODEL_CONFIG=${MODEL_CONFIG:-} ;; esac
[ "$MODEL" = models/weights/SmolLM2-135M-Instruct.Q4_1.gguf ] && [ -z "$MODEL_CONFIG" ] || export COMPARE_MODEL=$MODEL
export COMPARE_MODEL_CONFIG=$MODEL_CONFIG
OUT=${COMPARE_OUT:-$(mktemp -d /tmp/dserve-compare.XXXXXX)}
mkdir -p "$OUT" || exit 1

log() { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
  for _ in $(seq 1 20); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null || kill -KILL "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}
trap stop_server EXIT
trap 'log "interrupted"; exit 130' INT TERM

# port_busy PORT: true when something already listens on 127.0.0.1:PORT
port_busy() {
  python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
EOF
}

# healthy URL: true when GET URL/health or URL/v1/models answers 200
healthy() {
  python3 - "$1" <<'EOF'
import sys, urllib.request
for path in ("/health", "/v1/models"):
    try:
        with urllib.request.urlopen(sys.argv[1] + path, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
sys.exit(1)
EOF
}

# start_server NAME URL CMD...: start CMD in its own process group, wait until URL is healthy; 0 ok, 1 not healthy
start_server() {
  local name=$1 url=$2
  shift 2
  local port=${url##*:}
  if port_busy "$port"; then
    log "$name: port $port is already in use; $name did not become healthy (not started)"
    return 1
  fi
  log "$name: starting: $*  (log: $OUT/$name.server.log)"
  setsid "$@" >"$OUT/$name.server.log" 2>&1 &
  SERVER_PID=$!
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$HEALTH_TIMEOUT" ]; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      wait "$SERVER_PID" 2>/dev/null
      log "$name: exited with status $? before becoming healthy; $name did not become healthy. Last log lines:"
      tail -n 5 "$OUT/$name.server.log" >&2
      SERVER_PID=""
      return 1
    fi
    if healthy "$url"; then
      log "$name: healthy after $((SECONDS - t0)) s"
      return 0
    fi
    sleep 1
  done
  log "$name: $name did not become healthy within $HEALTH_TIMEOUT s (log: $OUT/$name.server.log)"
  stop_server
  return 1
}

# derived_config SRC OUT SECTION.KEY=JSON...: config SRC with the given router or workers (every worker) keys set,
# the model path made absolute, written to OUT
derived_config() {
  python3 - "$@" <<'EOF'
import json, os, sys
src, dst, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
c = json.load(open(src))
c["model"] = os.path.abspath(os.path.join(os.path.dirname(src), c["model"]))
if os.environ.get("COMPARE_MODEL"):  # the MODEL knob
    c["model"] = os.path.abspath(os.environ["COMPARE_MODEL"])
    mc = json.load(open(os.environ["COMPARE_MODEL_CONFIG"])) if os.environ.get("COMPARE_MODEL_CONFIG") else {}
    for key in ("model_name", "chat_template", "sampling"):
        if key in mc:
            c[key] = mc[key]
for kv in sets:
    key, val = kv.split("=", 1)
    section, name = key.split(".", 1)
    for obj in (c["workers"] if section == "workers" else [c.setdefault(section, {})]):
        *path, last = name.split(".")  # workers.kvxfer.backend: a key inside each worker's kvxfer object
        for p in path:
            obj = obj.setdefault(p, {})
        obj[last] = json.loads(val)
json.dump(c, open(dst, "w"), indent=1)
EOF
}

# config_port FILE: the router's port in a dserve cluster config (default 8000)
config_port() {
  python3 - "$1" <<'EOF'
import json, sys
try:
    print(int(json.load(open(sys.argv[1])).get("router", {}).get("port", 8000)))
except Exception:
    print(8000)
EOF
}

PLOT_OK=0
python3 -c "import matplotlib" 2>/dev/null && PLOT_OK=1

# drive NAME URL: the same workload at every rate; JSON in $OUT/NAME.rate-R.json
drive() {
  local name=$1 url=$2 first=1 rate n warm seed=0
  IFS=',' read -r -a rate_list <<<"$RATES"
  for rate in "${rate_list[@]}"; do
    seed=$((seed + 1)) # new prompts at every rate (no prefix-cache hits across runs), the same for every server
    if [ -n "$NUM_REQ" ]; then
      n=$NUM_REQ
    else
      n=$(python3 -c "import math,sys; r=float(sys.argv[1]); print(max($MIN_REQ, min($MAX_REQ, math.ceil(r*$SECS_PER_RATE))) if r != math.inf else $MAX_REQ)" "$rate")
    fi
    warm=0
    [ $first = 1 ] && warm=2
    first=0
    local js="$OUT/$name.rate-$rate.json"
    local extra=()
    [ $PLOT_OK = 1 ] && extra+=(--plot "$OUT/$name.rate-$rate.png")
    [ "$IGNORE_EOS" = 1 ] && extra+=(--ignore-eos)
    log "$name: rate $rate req/s, $n requests"
    timeout $((RUN_LIMIT + 30)) python3 bench/loadgen.py --max-time "$RUN_LIMIT" --base-url "$url" --endpoint /v1/completions \
      --dataset random --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --seed "$seed" \
      --num-requests "$n" --request-rate "$rate" --max-concurrency "$MAX_CONC" --warmup "$warm" --timeout "$REQ_TIMEOUT" \
      --slo "$SLO" --json-out "$js" --quiet "${extra[@]}" 2>>"$OUT/$name.loadgen.log"
    local rc=$?
    if [ -f "$js" ]; then
      python3 - "$js" <<'EOF' >&2
import json, sys
d = json.load(open(sys.argv[1]))
f = lambda v: "n/a" if v is None else "%.0f" % v
print("    ok %d/%d  %.3f req/s  goodput %.2f req/s  TTFT median %s p99 %s ms  TPOT median %s p99 %s ms  out tok %d  %s" % (
    d["successful_requests"], d["num_requests_sent"], d["request_throughput"], d["goodput"] or 0,
    f(d["ttft_ms"]["median"]), f(d["ttft_ms"]["p99"]), f(d["tpot_ms"]["median"]), f(d["tpot_ms"]["p99"]),
    d["total_output_tokens"],
    " ".join("%s=%d" % kv for kv in d["status_histogram"].items())))
EOF
    else
      log "$name: loadgen at rate $rate produced no report (status $rc; log: $OUT/$name.loadgen.log)"
    fi
  done
}

STATUS=0
for srv in $SERVERS; do
  case $srv in
    llama.cpp)
      if [ ! -f "$MODEL" ]; then
        log "llama.cpp: $MODEL is missing (run scripts/setup.sh); skipped"; STATUS=1; continue
      fi
      if ! peer=$(bench/peer.sh); then
        log "llama.cpp: bench/peer.sh could not build llama-server; skipped"; STATUS=1; continue
      fi
      url="http://127.0.0.1:$LLAMA_PORT"
      # -np slots share one context of np x per-slot tokens; continuous batching (on by default) named anyway
      if start_server llama.cpp "$url" "$peer/llama-server" -m "$MODEL" -t "$LLAMA_THREADS" -tb "$LLAMA_THREADS" \
          -np "$LLAMA_NP" -c $((LLAMA_NP * LLAMA_CTX_PER_SLOT)) --cont-batching --host 127.0.0.1 --port "$LLAMA_PORT" $LLAMA_ARGS; then
        drive llama.cpp "$url"
      else
        STATUS=1
      fi
      stop_server
      ;;
    dserve|dserve-1p1d|dserve-1p1d-always|dserve-1p1d-never|dserve-tpot|dserve-tpot[0-9]*|dserve-chunk[0-9]*|dserve-1p1d-tcp*)
      cfg=configs/local.json
      bin=$DSERVE_BIN
      [ "$srv" = dserve-1p1d ] && cfg=configs/1p1d.json
      case $srv in
        dserve-tpot*)
          target=${srv#dserve-tpot}
          cfg=$OUT/$srv.json
          derived_config configs/local.json "$cfg" "workers.tpot_target_ms=${target:-$TPOT_TARGET_MS}"
          ;;
        dserve-chunk*)
          cfg=$OUT/$srv.json
          derived_config configs/local.json "$cfg" "workers.max_batch_tokens=${srv#dserve-chunk}"
          ;;
        dserve-1p1d-always)
          cfg=$OUT/$srv.json
          derived_config configs/1p1d.json "$cfg" router.disagg_policy='"threshold"' router.disagg_threshold=0
          ;;
        dserve-1p1d-never)
          cfg=$OUT/$srv.json
          derived_config configs/1p1d.json "$cfg" router.disagg_policy='"threshold"' router.disagg_threshold=1000000000
          ;;
        dserve-1p1d-tcp|dserve-1p1d-tcp-base)
          cfg=$OUT/$srv.json
          derived_config configs/1p1d.json "$cfg" workers.kvxfer.backend='"tcp"'
          if [ "$srv" = dserve-1p1d-tcp-base ]; then
            [ -x "$BASE_BIN" ] || { log "$srv: BASE_BIN (a build from before sealing) is not set"; STATUS=1; continue; }
            bin=$BASE_BIN
          fi
          ;;
        dserve-1p1d-tcp-plain)
          cfg=$OUT/$srv.json
          derived_config configs/1p1d.json "$cfg" workers.kvxfer.backend='"tcp"' workers.kvxfer.encrypt=false
          ;;
      esac
      case $cfg in # the MODEL knob: the repository's configs with the other model (derived ones have it already)
        configs/*) [ -n "${COMPARE_MODEL:-}" ] && derived_config "$cfg" "$OUT/$srv.json" && cfg=$OUT/$srv.json ;;
      esac
      if [ ! -x "$bin" ]; then
        log "$srv: $bin is not built; dserve did not become healthy (not started)"; STATUS=1; continue
      fi
      url="http://127.0.0.1:$(config_port "$cfg")"
      if start_server "$srv" "$url" "$bin" launch --config "$cfg" --node local; then
        drive "$srv" "$url"
      else
        log "$srv: dserve did not become healthy"
        STATUS=1
      fi
      stop_server
      ;;
    *)
      log "unknown server '$srv' in SERVERS (known: llama.cpp dserve dserve-1p1d dserve-1p1d-always dserve-1p1d-never dserve-tpot dserve-tpotMS dserve-chunkN dserve-1p1d-tcp dserve-1p1d-tcp-plain dserve-1p1d-tcp-base)"; STATUS=1
      ;;
  esac
done

echo
echo "== dserve vs llama.cpp (llama-server -np $LLAMA_NP): random $INPUT_LEN words in, $OUTPUT_LEN tokens out, SLO $SLO, rates $RATES, max in flight $MAX_CONC =="
SLO="$SLO" python3 - "$OUT" "$RATES" $SERVERS <<'EOF'
import json, os, sys
sys.path.insert(0, "bench")
import loadgen
out, rates, servers = sys.argv[1], [float(r) for r in sys.argv[2].split(",")], sys.argv[3:]
runs = {}
for s in servers:
    runs[s] = {}
    for r, text in zip(rates, sys.argv[2].split(",")):
        path = os.path.join(out, "%s.rate-%s.json" % (s, text))
        try:
            with open(path) as f:
                runs[s][r] = json.load(f)
        except (OSError, ValueError):
            runs[s][r] = None
if "llama.cpp" not in runs:
    runs["llama.cpp"] = {r: None for r in rates}
print(loadgen.compare_table(runs, "llama.cpp")[0])
svg = os.path.join(out, "goodput.svg")
if loadgen.goodput_svg(runs, svg, "goodput (SLO %s) against rate" % os.environ.get("SLO", "")):
    print("goodput against rate plotted: %s" % svg)
# Throughput and token latency per server and rate, each with its ratio to llama.cpp at the same rate.
print()
f = lambda v, p=0: "n/a" if v is None else "%.*f" % (p, v)
def get(rep, key, stat=None):
    if rep is None or not rep.get("successful_requests"):
        return None
    return rep[key] if stat is None else rep[key][stat]
cols = [("req/s", "request_throughput", None, 3), ("TPOT med", "tpot_ms", "median", 0),
        ("TPOT p99", "tpot_ms", "p99", 0), ("ITL p99", "itl_ms", "p99", 0), ("TTFT med", "ttft_ms", "median", 0)]
hdr = ["rate", "server"] + [c[0] for c in cols] + ["x " + c[0] for c in cols]
rows = []
for r, text in zip(rates, sys.argv[2].split(",")):
    for s in [x for x in runs if x != "llama.cpp"] + ["llama.cpp"]:
        rep, base = runs[s].get(r), runs["llama.cpp"].get(r)
        vals = [get(rep, k, st) for _, k, st, _ in cols]
        bases = [get(base, k, st) for _, k, st, _ in cols]
        rows.append([text, s] + [f(v, p) for v, (_, _, _, p) in zip(vals, cols)] +
                    [f(v / b if v is not None and b else None, 2) for v, b in zip(vals, bases)])
w = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(hdr)]
print("  ".join(h.rjust(w[i]) for i, h in enumerate(hdr)))
for row in rows:
    print("  ".join(c.rjust(w[i]) for i, c in enumerate(row)))
print("(TPOT/ITL/TTFT in ms; x = server/llama.cpp at the same rate)")
EOF
echo "(logs and per-run JSON: $OUT)"
exit $STATUS
