#!/usr/bin/env bash
# bench/prefix_bench.sh: mean TTFT with prefix reuse on against off (same run) on a shared-prefix and a multi-turn workload.
#
# usage: bench/prefix_bench.sh [--dserve PATH] [--prefix-len 2000] [--suffix-len 50] [--requests N] [--turns T]
#                              [--threads T]
# Starts `dserve launch` twice on free loopback ports with the same one-node config (router + one `both` worker, T
# threads): "off" with prefix_cache_mb 0 (no reuse) and "on" with the default prefix cache. Each is driven by
# bench/loadgen.py, sequentially (--max-concurrency 1), on
#   shared-prefix: one PREFIX_LEN-word shared prefix + a SUFFIX_LEN-word unique suffix, max_tokens 8, N requests
#                  after 1 warm-up (which, with reuse on, puts the prefix in the cache),
#   multi-turn:    N/T chat conversations of T turns (120 words each, max_tokens 32), every turn the whole history,
# and prints mean TTFT of each (ms), the ratio on/off, and the router's prefix-cache hit rate (hits / queried tokens).
# Target (issue 7): ratio <= 0.4 on shared-prefix. Words are about one token each for SmolLM2's vocabulary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
dserve="$root/build/dserve"
prefix_len=2000
suffix_len=50
requests=6
turns=3
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --dserve) dserve="$2"; shift 2 ;;
    --prefix-len) prefix_len="$2"; shift 2 ;;
    --suffix-len) suffix_len="$2"; shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --turns) turns="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "prefix_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
model="$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -x "$dserve" ] || { echo "prefix_bench.sh: no dserve binary at $dserve (build it or pass --dserve)" >&2; exit 1; }
[ -f "$model" ] || { echo "prefix_bench.sh: the model $model is missing: run scripts/setup.sh" >&2; exit 1; }

exec python3 - "$dserve" "$model" "$here/loadgen.py" "$prefix_len" "$suffix_len" "$requests" "$turns" "$threads" <<'PY'
import json, os, shutil, signal, socket, subprocess, sys, tempfile, time, urllib.request

dserve, model, loadgen = sys.argv[1:4]
prefix_len, suffix_len, requests, turns, threads = (int(x) for x in sys.argv[4:9])
tmp = tempfile.mkdtemp(prefix="dserve-prefix-bench-")
procs = []


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(name, prefix_mb):
    rport, wport = free_ports(2)
    w = {"name": "w0", "node": "local", "role": "both", "port": wport, "threads": threads, "kv_budget_mb": 256,
         "max_seqs": 16}
    if prefix_mb is not None:
        w["prefix_cache_mb"] = prefix_mb
    cfg = {"model": model, "model_name": "smollm2", "router": {"node": "local", "port": rport}, "workers": [w]}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen([dserve, "launch", "--config", path, "--node", "local"], stdout=log, stderr=log,
                         start_new_session=True)
    procs.append(p)
    base = "http://127.0.0.1:%d" % rport
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return p, base
        except Exception:
            time.sleep(0.3)
    sys.exit("prefix_bench.sh: cluster %s never became healthy; log:\n%s" % (name, open(log.name).read()[-3000:]))


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
    except Exception:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except Exception:
            pass


def prefix_counters(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    v = {}
    for line in text.splitlines():
        for k in ("dserve:prefix_cache_hits_total", "dserve:prefix_cache_queries_total"):
            if line.startswith(k + " ") or line.startswith(k + "{"):  # {model_name="..."}
                v[k] = float(line.rsplit(" ", 1)[1])
    return v.get("dserve:prefix_cache_hits_total", 0.0), v.get("dserve:prefix_cache_queries_total", 0.0)


def drive(base, name, work):
    out = os.path.join(tmp, "%s-%s.json" % (name, work))
    common = ["--base-url", base, "--max-concurrency", "1", "--seed", "7", "--quiet", "--json-out", out,
              "--timeout", "600"]
    if work == "shared-prefix":
        args = ["--dataset", "shared-prefix", "--endpoint", "/v1/completions", "--num-prefixes", "1",
                "--prefix-len", str(prefix_len), "--suffix-len", str(suffix_len), "--output-len", "8",
                "--num-requests", str(requests), "--warmup", "1"]
    else:
        args = ["--dataset", "multi-turn", "--endpoint", "/v1/chat/completions", "--turns", str(turns),
                "--input-len", "120", "--output-len", "32", "--num-requests", str(requests)]
    h0, q0 = prefix_counters(base)
    rc = subprocess.run([sys.executable, loadgen] + common + args, stdout=subprocess.DEVNULL).returncode
    time.sleep(1.5)  # stats reach the router every second
    h1, q1 = prefix_counters(base)
    if rc != 0 or not os.path.exists(out):
        sys.exit("prefix_bench.sh: loadgen failed on %s/%s (rc %d)" % (name, work, rc))
    rep = json.load(open(out))
    if rep["failed_requests"]:
        sys.exit("prefix_bench.sh: %d failed requests on %s/%s" % (rep["failed_requests"], name, work))
    return rep["ttft_ms"]["mean"], rep["successful_requests"], (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0


res = {}
try:
    for name, mb in (("off", 0), ("on", None)):
        p, base = launch(name, mb)
        for work in ("shared-prefix", "multi-turn"):
            res[(name, work)] = drive(base, name, work)
        stop(p)
finally:
    for p in procs:
        if p.poll() is None:
            stop(p)

print("prefix reuse: 1 both worker, %d threads; shared-prefix %d+%d words, %d requests (+1 warm-up); multi-turn %d "
      "turns, %d requests; sequential" % (threads, prefix_len, suffix_len, requests, turns, requests))
print("%-14s %14s %14s %10s %12s" % ("workload", "TTFT off (ms)", "TTFT on (ms)", "on/off", "hit rate on"))
for work in ("shared-prefix", "multi-turn"):
    off, on = res[("off", work)], res[("on", work)]
    print("%-14s %14.1f %14.1f %10.3f %11.0f%%" % (work, off[0], on[0], on[0] / off[0] if off[0] else float("nan"),
                                                   100 * on[2]))
shutil.rmtree(tmp, ignore_errors=True)
PY
