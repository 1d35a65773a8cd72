#!/usr/bin/env python3
"""bench/router_load.py: the router's own cost under many concurrent streams with short outputs (docs/scale.md, "router").

Starts tests/router/fake_worker.py in step mode (every --step-ms one token per running generation, sent as one
`token_batch` message per step, or one `token` message each with --no-batch), `dserve router` in front of it, and drives
bench/loadgen.py through the router. Prints delivered tokens, the router's CPU seconds (from /proc) and its CPU
microseconds per delivered token; with --perf FILE, records the router with `perf record -g` for the run and writes
`perf report` (flat, by symbol) to FILE.

Usage: router_load.py DSERVE [--streams 400] [--requests 2000] [--tokens 32] [--step-ms 20] [--no-batch] [--perf F]
Run it with the venv's python (loadgen needs no package; the harness imports the tests' tiny GGUF writer).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "router"))


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dserve")
    ap.add_argument("--streams", type=int, default=400)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--step-ms", type=float, default=20)
    ap.add_argument("--no-batch", action="store_true")
    ap.add_argument("--perf", default="")
    a = ap.parse_args()
    import resource  # thousands of sockets: the router, the worker and loadgen inherit the raised limit
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import fake_worker
    import router_proc
    from test_openai import tiny_gguf  # noqa: E402 (the tests' tiny byte-level GGUF)
    tmp = tempfile.mkdtemp(prefix="dserve-router-load-")
    tiny_gguf(os.path.join(tmp, "tiny.gguf"))
    env = dict(os.environ, FAKE_WORKER_STEP_MS=str(a.step_ms), FAKE_WORKER_LEN=str(a.tokens),
               FAKE_WORKER_BATCH="0" if a.no_batch else "1")
    worker = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "router", "fake_worker.py"), "0", "4096"],
                              stdout=subprocess.PIPE, text=True, env=env)
    wport = int(worker.stdout.readline().split()[1])
    cfg = {"model": "tiny.gguf", "model_name": "tiny", "secret": fake_worker.SECRET,
           "nodes": {"local": {"host": "127.0.0.1"}},
           "router": {"node": "local", "host": "127.0.0.1", "port": 0, "queue_limit": 100000,
                      "max_connections": 100000, "max_connections_per_client": 100000},
           "workers": [{"name": "w0", "node": "local", "role": "both", "host": "127.0.0.1", "port": wport,
                        "max_seqs": 65536}]}
    with open(os.path.join(tmp, "cluster.json"), "w") as f:
        json.dump(cfg, f)
    router, base = router_proc.start_router(a.dserve, os.path.join(tmp, "cluster.json"))
    perf = None
    if a.perf:
        perf = subprocess.Popen(["perf", "record", "-g", "-o", os.path.join(tmp, "perf.data"), "-p", str(router.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    out = os.path.join(tmp, "loadgen.json")
    c0, t0 = cpu_s(router.pid), time.time()
    subprocess.run([sys.executable, os.path.join(HERE, "loadgen.py"), "--base-url", base, "--model", "tiny",
                    "--endpoint", "/v1/completions", "--num-requests", str(a.requests), "--max-concurrency",
                    str(a.streams), "--input-len", "4", "--output-len", str(a.tokens), "--json-out", out, "--quiet"],
                   check=True)
    c1, t1 = cpu_s(router.pid), time.time()
    if perf:
        perf.send_signal(2)
        perf.wait()
    s = json.load(open(out))
    if s["failed_requests"]:
        print("failures:", s["status_histogram"])
    toks = s["total_output_tokens"]
    print("streams %d requests %d ok %d failed %d | %d tokens in %.1f s = %.0f tok/s | router CPU %.2f s = %.1f%% of a "
          "core, %.1f us/token | itl p50 %.1f p99 %.1f ms" %
          (a.streams, a.requests, s["successful_requests"], s["failed_requests"], toks, t1 - t0, toks / (t1 - t0),
           c1 - c0, 100 * (c1 - c0) / (t1 - t0), 1e6 * (c1 - c0) / max(toks, 1), s["itl_ms"]["median"] or 0,
           s["itl_ms"]["p99"] or 0))
    router.terminate()
    worker.terminate()
    router.wait()
    if perf:
        rep = subprocess.run(["perf", "report", "-i", os.path.join(tmp, "perf.data"), "--no-children", "--stdio",
                              "--sort", "symbol", "-g", "none", "--percent-limit", "0.8"],
                             capture_output=True, text=True)
        with open(a.perf, "w") as f:
            f.write(rep.stdout)


if __name__ == "__main__":
    main()
