#!/usr/bin/env bash
# bench/spec_bench.sh: speculative decoding's targets (issue 42): completion tok/s with --spec auto against --spec off, and every text identical.
#
# Usage: bench/spec_bench.sh        (about 10 minutes per model on a quiet 2-core machine)
# Env:   MODELS (GGUFs, space-separated; default both bundled: SmolLM2-135M and Gemma 3 270M)  STREAMS="1 8"
#        ROUNDS=1  THREADS (compute threads; default the server's: the CPUs)  PROMPTS=bench/spec_prompts.json
#        DSERVE_BIN=build/dserve (built when missing)  DSERVE_VENV (its python runs the openai client;
#        default ~/.cache/dserve/venv)  OUT (a folder for the logs and JSON; default a new /tmp folder)
# For each model, each stream count and each round, the same binary serves with `dserve serve --spec off`, then a
# fresh one with `--spec auto` (fresh servers: neither side finds the other's outputs in its prefix cache or suffix
# index). bench/spec_run.py sends every prompt of bench/spec_prompts.json, one kind at a time (extractive: copy,
# quote, edit a given text or code, reformat a config; chat: open-ended; replay: the tests' conversations), at
# temperature 0 with that many requests in flight. Prints per model, kind and stream count: completion tok/s off and
# auto, their ratio against the target (extractive: >= 2x at 1 stream, >= 1.3x at 8; chat and replay: >= 0.97x), the
# drafts' acceptance, and whether every text is identical to off. Exit status 1 when a text differs or a run fails.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
MODELS=${MODELS:-"$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf $root/models/weights/gemma-3-270m-q4_k_m.gguf"}
STREAMS=${STREAMS:-"1 8"}; ROUNDS=${ROUNDS:-1}; THREADS=${THREADS:-}
PROMPTS=${PROMPTS:-$root/bench/spec_prompts.json}
DSERVE_BIN=${DSERVE_BIN:-build/dserve}
py=${DSERVE_VENV:-$HOME/.cache/dserve/venv}/bin/python
out=${OUT:-$(mktemp -d /tmp/spec-bench.XXXXXX)}
mkdir -p "$out"
log() { echo "spec_bench: $*" >&2; }

"$py" -c 'import openai' 2>/dev/null || { log "$py cannot import openai (scripts/setup.sh makes the venv)"; exit 1; }
for m in $MODELS; do [ -f "$m" ] || { log "$m is missing (scripts/setup.sh fetches the bundled models)"; exit 1; }; done
if [ ! -x "$DSERVE_BIN" ]; then
  log "building dserve in build"
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j"$(nproc)" --target dserve; } \
    >"$out/build.log" 2>&1 || { log "dserve did not build (see $out/build.log)"; exit 1; }
  DSERVE_BIN=build/dserve
fi
if ! "$DSERVE_BIN" serve --help 2>&1 | grep -q -- "--spec"; then
  log "$DSERVE_BIN has no --spec option (speculative decoding, issue 42, is not in this build)"
  exit 1
fi

pid=
stop() { [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }; pid=; }
trap stop EXIT
serve() {  # MODEL MODE LOG: starts one server, sets url; 1 when it does not become healthy
  local port tpl=
  case "$(basename "$1")" in gemma-3-270m*) tpl=gemma ;; esac # the bundled Gemma 3 270M GGUF has no chat template
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$DSERVE_BIN" serve "$1" --port "$port" --spec "$2" ${THREADS:+--threads "$THREADS"} \
    ${tpl:+--chat-template "$tpl"} >"$3" 2>&1 &
  pid=$!
  url="http://127.0.0.1:$port"
  for _ in $(seq 240); do
    curl -sf "$url/health" >/dev/null 2>&1 && return 0  # 200 once the worker can generate
    kill -0 "$pid" 2>/dev/null || { log "dserve exited: $(tail -n 3 "$3")"; pid=; return 1; }
    sleep 0.5
  done
  log "dserve did not become healthy (log: $3)"
  return 1
}

status=0
for m in $MODELS; do
  name=$(basename "$m" .gguf)
  for s in $STREAMS; do
    for r in $(seq "$ROUNDS"); do
      for mode in off auto; do
        tag="$name-s$s-r$r-$mode"
        log "$name, $s streams, round $r: --spec $mode"
        serve "$m" "$mode" "$out/$tag.log" || { status=1; continue; }
        "$py" bench/spec_run.py --base-url "$url" --prompts "$PROMPTS" --streams "$s" --out "$out/$tag.json" \
          2>>"$out/runs.log" || { log "spec_run failed ($tag): $(tail -n 2 "$out/runs.log")"; status=1; }
        stop
      done
    done
  done
done

"$py" - "$out" "$ROUNDS" "$STREAMS" $MODELS <<'PYEOF' || status=1
import json, os, statistics, sys
out, rounds, streams, models = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
TARGET = {("extractive", "1"): 2.0, ("extractive", "8"): 1.3}
bad = 0
for m in models:
    name = os.path.basename(m)[:-5]
    print("== speculative decoding, %s: completion tok/s, --spec auto against off (median of %d round%s) ==" %
          (name, rounds, "s" if rounds > 1 else ""))
    print("| kind | streams | off tok/s | auto tok/s | auto/off | target | drafted | accepted | accepted/draft | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in streams:
        runs = {}
        for mode in ("off", "auto"):
            runs[mode] = []
            for r in range(1, rounds + 1):
                try:
                    runs[mode].append(json.load(open(os.path.join(out, "%s-s%s-r%d-%s.json" % (name, s, r, mode)))))
                except (OSError, ValueError):
                    bad += 1
        if not runs["off"] or not runs["auto"]:
            print("| (runs missing for %s streams: see %s) |" % (s, out))
            continue
        for kind in runs["off"][0]["kinds"]:
            off = statistics.median(x["kinds"][kind]["tok_s"] for x in runs["off"])
            auto = statistics.median(x["kinds"][kind]["tok_s"] for x in runs["auto"])
            ref = [q["text"] for q in runs["off"][0]["kinds"][kind]["requests"]]
            same = total = 0
            for x in runs["off"][1:] + runs["auto"]:
                for q, want in zip(x["kinds"][kind]["requests"], ref):
                    total += 1
                    same += q["text"] == want
            bad += same != total
            sp = {}
            for x in runs["auto"]:
                for k, v in x["kinds"][kind]["spec"].items():
                    sp[k] = sp.get(k, 0) + v
            drafts = sp.get("spec_decode_num_drafts_total")
            drafted = sp.get("spec_decode_num_draft_tokens_total")
            acc = sp.get("spec_decode_num_accepted_tokens_total")
            tgt = TARGET.get((kind, s), 0.97)
            ratio = auto / off if off > 0 else 0
            print("| %s | %s | %.1f | %.1f | %.2fx | >= %.2fx %s | %s | %s | %s | %d/%d%s |" % (
                kind, s, off, auto, ratio, tgt, "met" if ratio >= tgt else "MISSED",
                "%d" % drafted if drafted is not None else "-", "%d" % acc if acc is not None else "-",
                "%.2f" % (acc / drafts) if drafts else "-", same, total, "" if same == total else " DIFFERENT"))
    print()
if bad:
    print("spec_bench: %d run(s) missing or text(s) different from --spec off (logs and JSON: %s)" % (bad, out))
    sys.exit(1)
print("spec_bench: logs and JSON in %s" % out)
PYEOF
exit $status
