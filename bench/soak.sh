#!/usr/bin/env bash
# bench/soak.sh: soak test: 1P1D on loopback at 80% of its saturation rate for N minutes; errors, p99 drift, RSS growth.
#
# usage: bench/soak.sh [--minutes N] [--rate R] [--dserve PATH] [--out DIR] [--input-len W] [--output-len T]
#                      [--warmup-minutes M]
# Starts configs/1p1d.json (router + prefill p0 + decode d0, KV over shm) with `dserve launch` on free 127.0.0.1 ports
# and disagg_threshold 0 (every prompt goes through p0 and is handed off to d0). Unless --rate is given, the
# saturation rate is measured first: bench/loadgen.py with every request sent at once at max concurrency 4 and 16
# (3 x concurrency requests each); the best request throughput is the saturation rate. Then loadgen sends a Poisson
# stream at 80% of it for N minutes (default 15; at most rate*60*N*1.5 + 10 requests, every request cut off at
# 300 s, the whole run at N minutes + 3), while the RSS of the launcher, the router, p0 and d0 is sampled every 5 s.
# Report (stdout and DIR/soak-report.json): errors (any non-200, dropped stream or timeout; target 0); p99 TTFT and
# E2E of the requests sent in the first and in the last minute (a third of the run when shorter than 3 minutes) and
# their drift; each process's RSS growth from the end of the warm-up (default: the first third of the run) to the end
# (target < 5%; also over the last half); any child the launcher restarted.
# Exit status 0 when errors = 0, no restart and every RSS growth < 5%; 1 otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
dserve="$root/build/dserve"
minutes=15
rate=""
out=""
input_len=64
output_len=32
warmup=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --dserve) dserve="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --input-len) input_len="$2"; shift 2 ;;
    --output-len) output_len="$2"; shift 2 ;;
    --warmup-minutes) warmup="$2"; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$minutes" in ''|*[!0-9]*|0) echo "soak.sh: --minutes must be a whole number >= 1, got '$minutes'" >&2; exit 2 ;; esac
[ -x "$dserve" ] || { echo "soak.sh: no dserve binary at $dserve (build it or pass --dserve)" >&2; exit 1; }
[ -n "$out" ] || out="$(mktemp -d /tmp/dserve-soak.XXXXXX)"
mkdir -p "$out"

exec python3 - "$root" "$dserve" "$minutes" "$rate" "$out" "$input_len" "$output_len" "$warmup" <<'PY'
import json, os, subprocess, sys, threading, time

root, dserve, minutes, rate, out, input_len, output_len, warmup = sys.argv[1:9]
minutes, input_len, output_len = int(minutes), int(input_len), int(output_len)
warmup_s = float(warmup) * 60 if warmup else minutes * 60 / 3.0
os.environ["DSERVE_BINARY"] = dserve
sys.path.insert(0, os.path.join(root, "tests", "e2e"))
sys.path.insert(0, os.path.join(root, "bench"))
import e2e_util as u  # config on free ports, `dserve launch`, the launcher's children
import loadgen        # percentile()

if not os.path.exists(u.MODEL):
    sys.exit("soak.sh: the model %s is missing: run scripts/setup.sh" % u.MODEL)

# configs/1p1d.json on free loopback ports, every prompt disaggregated.
with open(os.path.join(root, "configs", "1p1d.json")) as f:
    base = json.load(f)
workers = [{k: v for k, v in w.items() if k not in ("port", "node")} for w in base["workers"]]
for w in workers:
    w["kvxfer"] = {"backend": w.get("kvxfer", {}).get("backend", "shm")}
config = os.path.join(out, "1p1d.json")
port = u.local_config(config, workers, disagg_threshold=0)
node = u.Node(config, log=os.path.join(out, "launch.log"))


def say(msg):
    print("soak: " + msg, flush=True)


def loadgen_run(name, *extra):
    path = os.path.join(out, name + ".json")
    cmd = [sys.executable, os.path.join(root, "bench", "loadgen.py"), "--base-url", "http://127.0.0.1:%d" % port,
           "--endpoint", "/v1/completions", "--dataset", "random", "--input-len", str(input_len),
           "--output-len", str(output_len), "--range-ratio", "0.2", "--ignore-eos", "--quiet", "--json-out", path] + list(extra)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    with open(path) as f:
        return json.load(f)


def procs():
    """{name: pid} of the launcher and its children (router, p0, d0)."""
    d = {"launcher": node.proc.pid}
    for c in u._children(node.proc.pid):
        argv = u._cmdline(c)
        if b"--name" in argv:
            d[argv[argv.index(b"--name") + 1].decode()] = c
        elif argv[1:2] == [b"router"]:
            d["router"] = c
    return d


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


try:
    node.wait_ready(120)
    node.wait_connected(["p0", "d0"], 60)
    u.wait_workers(port, 60)
    say("1P1D up on 127.0.0.1:%d (log %s)" % (port, node.log_path))
    if rate:
        rate = float(rate)
        sat = None
        say("rate %.3f req/s (given)" % rate)
    else:
        sat = 0.0
        for conc in (4, 16):
            rep = loadgen_run("sweep-c%d" % conc, "--request-rate", "inf", "--max-concurrency", str(conc),
                              "--num-requests", str(3 * conc), "--warmup", "1" if conc == 4 else "0", "--seed", str(conc))
            say("saturation sweep: concurrency %2d: %.3f req/s, %d failed" % (conc, rep["request_throughput"],
                                                                           rep["failed_requests"]))
            sat = max(sat, rep["request_throughput"])
        if sat <= 0:
            sys.exit("soak.sh: the saturation sweep completed no request (see %s)" % out)
        rate = 0.8 * sat
        say("saturation %.3f req/s; soaking at 80%%: %.3f req/s" % (sat, rate))

    dur = minutes * 60
    start_pids = procs()
    samples = []  # (t, {name: rss_kb})
    stop = threading.Event()

    def sampler():
        t0 = time.time()
        while not stop.is_set():
            samples.append((time.time() - t0, {n: rss_kb(p) for n, p in procs().items()}))
            stop.wait(5.0)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    say("%d min at %.3f req/s (at most %d requests)" % (minutes, rate, int(rate * dur * 1.5) + 10))
    rep = loadgen_run("soak", "--request-rate", "%.6f" % rate, "--duration", str(dur),
                      "--num-requests", str(int(rate * dur * 1.5) + 10), "--max-concurrency", "64",
                      "--timeout", "300", "--max-time", str(dur + 180), "--seed", "7")
    stop.set()
    th.join(10)
    end_pids = procs()
finally:
    node.stop()

reqs = rep["requests"]
errors = [r for r in reqs if r["status"] != "200"]
sent_dur = max((r["start"] for r in reqs), default=0.0)


def window(lo, hi):
    w = [r for r in reqs if r["status"] == "200" and lo <= r["start"] < hi]
    return {"n": len(w), "p99_ttft_ms": loadgen.percentile([r["ttft"] * 1000 for r in w if r["ttft"] is not None], 99),
            "p99_e2e_ms": loadgen.percentile([r["e2e"] * 1000 for r in w if r["e2e"] is not None], 99)}


win = min(60.0, sent_dur / 3)  # a minute; a third of the run for runs under 3 minutes
first, last = window(0, win), window(sent_dur - win, sent_dur + 1)
drift = {k: (last[k] / first[k] - 1) * 100 if first[k] and last[k] else None for k in ("p99_ttft_ms", "p99_e2e_ms")}
rss = {}
after = [s for s in samples if s[0] >= warmup_s] or samples[-1:]
for name in start_pids:
    a = next((s[1].get(name) for s in after if s[1].get(name)), None)
    b = next((s[1].get(name) for s in reversed(samples) if s[1].get(name)), None)
    peak = max((s[1].get(name) or 0) for s in samples) if samples else None
    half = [s for s in samples if s[0] >= samples[-1][0] / 2] if samples else []
    h = next((s[1].get(name) for s in half if s[1].get(name)), None)
    rss[name] = {"after_warmup_kb": a, "end_kb": b, "peak_kb": peak,
                 "growth_pct": (b / a - 1) * 100 if a and b else None,
                 "last_half_growth_pct": (b / h - 1) * 100 if h and b else None}
restarted = sorted(n for n in start_pids if end_pids.get(n) != start_pids[n])
report = {"minutes": minutes, "saturation_rps": sat, "rate_rps": rate, "input_len_words": input_len,
          "output_len": output_len, "requests": len(reqs), "errors": len(errors),
          "status_histogram": rep["status_histogram"], "first_minute": first, "last_minute": last,
          "p99_drift_pct": drift, "window_s": win, "warmup_s": warmup_s, "rss": rss, "restarted": restarted,
          "throughput_rps": rep["request_throughput"], "out": out}
with open(os.path.join(out, "soak-report.json"), "w") as f:
    json.dump(report, f, indent=1)

fmt = lambda v, spec="%.0f": "n/a" if v is None else spec % v  # noqa: E731
print()
print("soak report: %d min, %d requests at %.3f req/s (saturation %s req/s), %d-word prompts, %d tokens out" %
      (minutes, len(reqs), rate, fmt(sat, "%.3f"), input_len, output_len))
print("  errors: %d (target 0)  statuses %s" % (len(errors), rep["status_histogram"]))
for e in errors[:5]:
    print("    %s at %.0f s: %s" % (e["status"], e["start"], e.get("error")))
print("  p99 TTFT: first %.0f s %s ms (%d req), last %.0f s %s ms (%d req), drift %s%%" %
      (win, fmt(first["p99_ttft_ms"]), first["n"], win, fmt(last["p99_ttft_ms"]), last["n"],
       fmt(drift["p99_ttft_ms"], "%+.1f")))
print("  p99 E2E:  first %.0f s %s ms, last %.0f s %s ms, drift %s%%" %
      (win, fmt(first["p99_e2e_ms"]), win, fmt(last["p99_e2e_ms"]), fmt(drift["p99_e2e_ms"], "%+.1f")))
print("  RSS after %.0f s warm-up -> end (target < 5%% growth):" % warmup_s)
for name, v in rss.items():
    print("    %-8s %s -> %s KiB (peak %s): %s%% (over the last half of the run: %s%%)" %
          (name, fmt(v["after_warmup_kb"]), fmt(v["end_kb"]), fmt(v["peak_kb"]), fmt(v["growth_pct"], "%+.2f"),
           fmt(v["last_half_growth_pct"], "%+.2f")))
if restarted:
    print("  restarted during the run: %s" % ", ".join(restarted))
print("  files: %s" % out)
bad = errors or restarted or any(v["growth_pct"] is None or v["growth_pct"] >= 5 for v in rss.values())
sys.exit(1 if bad else 0)
PY
