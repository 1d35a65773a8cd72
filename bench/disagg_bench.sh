#!/usr/bin/env bash
# bench/disagg_bench.sh: TTFT through 1 prefill + 1 decode worker against the colocated worker (same run), plus KV bytes/transfer time per request.
#
# usage: bench/disagg_bench.sh [--dserve PATH] [--model GGUF] [--lengths "256 1024 2048"] [--requests N] [--threads T]
#                               [--backend shm|tcp] [--against coloc|plain|base:DSERVE] [--kv-budget MB]
# Starts two clusters with `dserve launch` on free loopback ports: "coloc" (one `both` worker) and "1p1d" (prefill p0 +
# decode d0, disagg_threshold 0, kvxfer BACKEND), each worker with T threads and a KV pool of MB (128; a 16k-token prompt
# of a wide model needs more). For each prompt length it sends N
# sequential streaming /v1/completions requests to each, alternating, which goes first alternating too (after one
# warm-up each), every prompt a fresh
# random token sequence (no prefix-cache hits), max_tokens 1, and prints the median TTFT of both, the ratio
# 1p1d/coloc, the KV bytes and transfer time per request from the 1p1d router's /metrics, and the bytes per 16-token
# block against the most any length moved per block: a model with sliding-window layers (Gemma 3, --model) sends
# those layers only the blocks they read again, so prompts longer than the window move less per block (the
# "saved" column; use one length inside the window, e.g. --lengths "256 2048", for the all-layer figure)
# (dserve:kv_transfer_bytes_total, dserve:kv_transfer_time_seconds_sum/_count: the decode worker's kv_ms, measured
# from its receipt of the request to the handoff's completion, so it includes the prefill compute it overlaps).
# Last, the CPU time per request of the reference's workers and of the pair's (both workers, handoff included; from
# /proc/PID/task/*/schedstat, the mean over the cell's requests): on a machine shared with other work the TTFTs
# also hold the time a worker waited for a core, the CPU times do not.
# --against plain: the reference is the same 1P1D cluster with kvxfer.encrypt false (KV bytes unsealed) instead of
# the colocated worker; --against base:DSERVE: the same 1P1D config run by another binary (a build from before
# sealing: nothing sealed). Then the ratio is the cost of sealing. DSERVE_BENCH_SAMPLES=1 prints every request's TTFT;
# DSERVE_BENCH_KEEP=1 keeps the clusters' configs and logs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
dserve="$root/build/dserve"
lengths="256 1024 2048"
model="$root/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf"
requests=3
threads=1
backend=shm
against=coloc
kv_budget=128
while [ $# -gt 0 ]; do
  case "$1" in
    --dserve) dserve="$2"; shift 2 ;;
    --model) model="$(realpath -m "$2")"; shift 2 ;;
    --lengths) lengths="$2"; shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --against) against="$2"; shift 2 ;;
    --kv-budget) kv_budget="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "disagg_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$dserve" ] || { echo "disagg_bench.sh: no dserve binary at $dserve (build it or pass --dserve)" >&2; exit 1; }
[ -f "$model" ] || { echo "disagg_bench.sh: the model $model is missing: run scripts/setup.sh" >&2; exit 1; }

exec python3 - "$dserve" "$model" "$lengths" "$requests" "$threads" "$backend" "$against" "$kv_budget" <<'PY'
import json, os, random, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time, http.client

dserve, model, lengths, requests, threads, backend, against, kv_budget = sys.argv[1:9]
lengths = [int(x) for x in lengths.split()]
requests, threads = int(requests), int(threads)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


tmp = tempfile.mkdtemp(prefix="dserve-disagg-bench-")
procs = []
worker_pids = {}


def launch(name, workers, threshold, binary=None):
    ports = free_ports(1 + len(workers))
    for w, p in zip(workers, ports[1:]):
        w.update(port=p, threads=threads, kv_budget_mb=float(kv_budget))
    cfg = {"model": model, "router": {"port": ports[0], "disagg_threshold": threshold, "disagg_policy": "threshold",
                                      "request_timeout_ms": 1800000}, "workers": workers}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(tmp, name + ".log"), "wb")
    p = subprocess.Popen([binary or dserve, "launch", "--config", path, "--node", "local"], stdout=log,
                         stderr=subprocess.STDOUT)
    procs.append(p)
    end = time.time() + 60
    while b"ready (" not in open(log.name, "rb").read():
        if p.poll() is not None or time.time() > end:
            sys.exit("disagg_bench.sh: %s did not start:\n%s" % (name, open(log.name).read()[-2000:]))
        time.sleep(0.1)
    # the workers' pids ("started router (pid N), w0 (pid M)"), for their CPU time
    text = open(log.name, errors="replace").read()
    worker_pids[ports[0]] = [int(pid) for name, pid in re.findall(r"(\S+) \(pid (\d+)\)", text) if name != "router"]
    return ports[0]


def cpu_s(port):
    """CPU seconds the cluster's workers have run (every thread, /proc/PID/task/*/schedstat); None where unreadable."""
    total = 0
    try:
        for pid in worker_pids[port]:
            for t in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                    total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
            out.setdefault(re.sub(r'model_name="[^"]*",?', "", k, count=1).replace("{}", ""), float(v))
    c.close()
    return out


class BenchError(Exception):
    pass


def ttft(port, prompt):
    """Seconds from sending the request to the first streamed token; BenchError when the request fails."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)  # a 16k prompt on one loaded core: minutes
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise BenchError("HTTP %d: %s" % (r.status, r.read()[:300]))
    t1 = None
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: {"):
            o = json.loads(line[6:])
            if "error" in o:
                raise BenchError("stream error: %s" % o["error"].get("message"))
            if t1 is None and o.get("choices"):
                t1 = time.perf_counter()
    c.close()
    if t1 is None:
        raise BenchError("no token streamed")
    return t1 - t0


failed = 0
try:
    pair = lambda kvx: [{"name": "p0", "role": "prefill", "kvxfer": dict(kvx, backend=backend)},
                        {"name": "d0", "role": "decode", "kvxfer": dict(kvx, backend=backend)}]
    if against == "coloc":
        co = launch("coloc", [{"name": "w0", "role": "both"}], 1000000)
    elif against == "plain":
        co = launch("plain", pair({"encrypt": False}), 0)
    elif against.startswith("base:"):
        co = launch("base", pair({}), 0, binary=against[5:])
    else:
        sys.exit("disagg_bench.sh: --against is coloc, plain or base:DSERVE, not '%s'" % against)
    pd = launch("1p1d", pair({}), 0)
    rng = random.Random(1)
    fresh = lambda n: [rng.randrange(100, 49000) for _ in range(n)]
    for port in (co, pd):  # warm up (and wait until the router has its workers)
        end = time.time() + 30
        while True:
            try:
                ttft(port, fresh(16))
                break
            except (BenchError, OSError):
                if time.time() > end:
                    raise
                time.sleep(0.2)
    ref = {"coloc": "1 colocated worker", "plain": "the same pair with kvxfer.encrypt false"}.get(
        against, "the same pair run by " + against[5:])
    print("dserve disagg_bench: %s, 1 prefill + 1 decode (kvxfer %s) vs %s, %d thread(s) per worker, "
          "%d requests per cell (median), max_tokens 1" % (os.path.basename(model), backend, ref, threads, requests))
    print("%8s %12s %12s %8s %12s %12s %10s %12s %7s %10s %10s %8s" % ("prompt", against.split(":")[0] + " ms", "1p1d ms", "ratio", "KV MiB/req",
                                                         "xfer ms/req", "xfer/ttft", "KiB/block", "saved", "cpu ms", "1p1d cpu", "ratio"))
    rows = []
    for n in lengths:
        tc, tp = [], []
        m0 = metrics(pd)
        c0 = (cpu_s(co), cpu_s(pd))
        errs = []
        for i in range(requests):
            # which cluster goes first alternates: the one after the other's request ran slower (up to 1.6x on a
            # loaded 2-core machine, deepseek2 at 1024 tokens), whichever it was
            for port, out in ((co, tc), (pd, tp))[::-1 if i % 2 else 1]:
                try:
                    out.append(ttft(port, fresh(n)))
                except BenchError as e:
                    errs.append("%s: %s" % ("coloc" if port == co else "1p1d", e))
        end = time.time() + 10  # a handoff is counted when the decode worker's `done` comes, after the first token
        while (metrics(pd)["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"]
               < len(tp) and time.time() < end):
            time.sleep(0.1)
        m1 = metrics(pd)
        c1 = (cpu_s(co), cpu_s(pd))
        cpu = [(b - a) / requests if a is not None and b is not None else float("nan") for a, b in zip(c0, c1)]
        if errs:
            failed = 1
            print("%8d  %d of %d requests failed: %s" % (n, len(errs), 2 * requests, "; ".join(sorted(set(errs)))))
        if not tc or not tp:
            continue
        cnt = m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"]
        kvb = (m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"]) / max(cnt, 1)
        kvs = (m1["dserve:kv_transfer_time_seconds_sum"] - m0["dserve:kv_transfer_time_seconds_sum"]) / max(cnt, 1)
        mc, mp = statistics.median(tc), statistics.median(tp)
        if os.environ.get("DSERVE_BENCH_SAMPLES"):  # every request's TTFT, to see the spread behind the medians
            print("%8d samples ms: %s %s; 1p1d %s" % (n, against.split(":")[0], " ".join("%.0f" % (x * 1e3) for x in tc),
                                                      " ".join("%.0f" % (x * 1e3) for x in tp)))
        rows.append((n, mc, mp, kvb, kvs, kvb / ((n + 15) // 16), cpu))
    full = max([r[5] for r in rows] or [0])
    for n, mc, mp, kvb, kvs, per_block, cpu in rows:
        print("%8d %12.1f %12.1f %7.3fx %12.2f %12.1f %10.2f %12.1f %6.1f%% %10.0f %10.0f %7.3fx" % (
            n, mc * 1e3, mp * 1e3, mp / mc, kvb / 2**20, kvs * 1e3, kvs / mp, per_block / 1024,
            100 * (1 - per_block / full) if full else 0, cpu[0] * 1e3, cpu[1] * 1e3, cpu[1] / cpu[0]))
        sys.stdout.flush()
finally:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    if os.environ.get("DSERVE_BENCH_KEEP"):
        print("logs kept in", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
sys.exit(failed)
PY
