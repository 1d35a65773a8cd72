#!/usr/bin/env python3
"""bench/trace_bench.py: what tracing costs at saturation: requests/s of a 1P1D cluster with tracing off and on.

Starts a one-node 1P1D cluster (p0 prefill, d0 decode, every prompt handed off) once per run, tracing off or on (every
request traced, sample_ratio 1, spans posted to a small OTLP/HTTP receiver this script runs), and drives it at
saturation with bench/loadgen.py (all requests at once, --concurrency in flight, ignore_eos). The runs alternate
(off, on, on, off, ...) so that a machine that gets busier or quieter weighs on both; prints each run's requests/s,
the median of each mode and the cost of tracing (1 - on/off). Usage: python3 bench/trace_bench.py [--rounds 3]
[--requests 64] [--concurrency 16] [--input-len 64] [--output-len 32] [--threads 1] (needs build/dserve, or
DSERVE_BINARY, and the model of scripts/setup.sh)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DSERVE_BINARY", os.path.join(HERE, "..", "build", "dserve"))
os.environ.setdefault("DSERVE_SOURCE_DIR", os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import e2e_util as u  # noqa: E402
from test_observe import Receiver  # noqa: E402  (an OTLP/HTTP receiver that keeps the spans)


def cpu_s(pids):
    """User + system CPU seconds the processes pids have used so far."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


def run(a, rx, traced):
    w = {"threads": a.threads, "kv_budget_mb": 128, "max_seqs": a.concurrency}
    extra = {"logging": {"stats_interval_s": 0}}
    if traced:
        extra["tracing"] = {"endpoint": "http://127.0.0.1:%d/v1/traces" % rx.server_address[1]}
    c = u.Cluster([dict(w, name="p0", role="prefill"), dict(w, name="d0", role="decode")], disagg_threshold=0,
                  tag="trace-bench", extra=extra)
    try:
        c.start(120)
        pids = [c.node.child_pid(n) for n in ("router", "p0", "d0")]
        spans0, cpu0 = len(rx.spans), cpu_s(pids)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([sys.executable, os.path.join(HERE, "loadgen.py"), "--base-url",
                            "http://127.0.0.1:%d" % c.port, "--endpoint", "/v1/completions", "--dataset", "random",
                            "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--range-ratio", "0",
                            "--ignore-eos", "--temperature", "0", "--request-rate", "inf", "--max-concurrency",
                            str(a.concurrency), "--num-requests", str(a.requests), "--warmup", "2", "--seed", "7",
                            "--json-out", out.name, "--quiet"], check=True)
            rep = json.load(open(out.name))
        cpu = cpu_s(pids) - cpu0
        if rep["successful_requests"] != a.requests:
            raise SystemExit("trace_bench: %d of %d requests succeeded" % (rep["successful_requests"], a.requests))
        m = u.metrics(c.port)
    finally:
        c.close()
    n = a.requests + 2  # the warm-up's too
    dropped = m.get("dserve:trace_spans_dropped_total", 0)
    return rep["request_throughput"], 1000 * cpu / n, len(rx.spans) - spans0, dropped


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    rx = Receiver()
    res, cpu = {False: [], True: []}, {False: [], True: []}
    print("run  tracing  req/s   CPU ms/request (router+p0+d0)  spans received  dropped")
    for r in range(a.rounds):
        for traced in ((False, True) if r % 2 == 0 else (True, False)):
            rps, ms, spans, dropped = run(a, rx, traced)
            res[traced].append(rps)
            cpu[traced].append(ms)
            print("%3d  %-7s  %6.3f  %29.1f  %14d  %7d" % (r + 1, "on" if traced else "off", rps, ms, spans, dropped),
                  flush=True)
    off, on = statistics.median(res[False]), statistics.median(res[True])
    c_off, c_on = statistics.median(cpu[False]), statistics.median(cpu[True])
    print("median req/s: off %.3f, on %.3f; on/off %.4f; tracing costs %.2f%% of requests/s (target <= 3%%)" % (
        off, on, on / off, 100 * (1 - on / off)))
    print("median CPU ms/request: off %.1f, on %.1f; on/off %.4f (%+.2f%% CPU per request; the machine's other load "
          "moves req/s, much less the CPU a request costs)" % (c_off, c_on, c_on / c_off, 100 * (c_on / c_off - 1)))


if __name__ == "__main__":
    main()
