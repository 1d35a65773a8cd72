"""bench/kvquant_serve.py: bench/kvquant.sh's serving figures for one model: per kv_type (f16, q8_0), a 1P1D cluster
(`dserve launch`, kvxfer shm, kv_budget_mb as shipped) on free loopback ports, the bytes one handoff of a prompt of N
random tokens moves (the router's dserve:kv_transfer_bytes_total) and the KV blocks the decode worker's pool holds
(its "listening ... (N KV blocks" line). usage: kvquant_serve.py DSERVE MODEL N THREADS; prints progress, then one
JSON line: {"tokens": N, "budget_mb": ..., "f16": {"handoff_bytes", "blocks"}, "q8_0": {...}}."""
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

dserve, model = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])  # the config is read from a temp dir
n_tokens, threads = int(sys.argv[3]), int(sys.argv[4])


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            # every series carries model_name: kept under its name without it too ('dserve:x', 'dserve:x{worker="d0"}')
            out.setdefault(re.sub(r'model_name="(?:[^"\\]|\\.)*",?', "", k, count=1).replace("{}", ""), float(v))
            out[k] = float(v)
    c.close()
    return out


def complete(port, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


def measure(tmp, kv_type):
    ports = free_ports(3)
    workers = [{"name": "p0", "role": "prefill", "port": ports[1], "threads": threads, "kv_type": kv_type,
                "kvxfer": {"backend": "shm"}},
               {"name": "d0", "role": "decode", "port": ports[2], "threads": threads, "kv_type": kv_type,
                "kvxfer": {"backend": "shm"}}]
    cfg = {"model": model, "router": {"port": ports[0], "disagg_threshold": 0, "disagg_policy": "threshold"},
           "workers": workers}
    path = os.path.join(tmp, kv_type + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    logpath = os.path.join(tmp, kv_type + ".log")
    log = open(logpath, "wb")
    p = subprocess.Popen([dserve, "launch", "--config", path, "--node", "local"], stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.time() + 120
        while b"ready (" not in open(logpath, "rb").read():
            if p.poll() is not None or time.time() > end:
                sys.exit("kvquant_serve: %s cluster did not start:\n%s" % (kv_type, open(logpath).read()[-2000:]))
            time.sleep(0.1)
        rng = random.Random(1)
        while True:  # the router serves once it has both workers
            st, body = complete(ports[0], [rng.randrange(100, 49000) for _ in range(8)])
            if st == 200:
                break
            if time.time() > end:
                sys.exit("kvquant_serve: %s: HTTP %d %s" % (kv_type, st, body[:300]))
            time.sleep(0.2)
        count = lambda: metrics(ports[0])["dserve:kv_transfer_time_seconds_count"]
        end = time.time() + 30
        while count() < 1 and time.time() < end:
            time.sleep(0.1)
        m0 = metrics(ports[0])
        st, body = complete(ports[0], [rng.randrange(100, 49000) for _ in range(n_tokens)])
        if st != 200:
            sys.exit("kvquant_serve: %s: HTTP %d %s" % (kv_type, st, body[:300]))
        end = time.time() + 30  # a handoff is counted when the decode worker's `done` comes
        while count() < m0["dserve:kv_transfer_time_seconds_count"] + 1 and time.time() < end:
            time.sleep(0.1)
        m1 = metrics(ports[0])
        if m1["dserve:kv_transfer_time_seconds_count"] != m0["dserve:kv_transfer_time_seconds_count"] + 1:
            sys.exit("kvquant_serve: %s: the prompt was not handed off" % kv_type)
        m = re.search(r"d0: decode worker listening on \S+ \((\d+) KV blocks", open(logpath).read())
        if not m:
            sys.exit("kvquant_serve: %s: the decode worker did not say its pool's blocks" % kv_type)
        out = {"handoff_bytes": m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"],
               "blocks": int(m.group(1))}
        print("  %s: %s" % (kv_type, out), flush=True)
        return out
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


tmp = tempfile.mkdtemp(prefix="dserve-kvquant-")
try:
    res = {"tokens": n_tokens, "budget_mb": None}
    for t in ("f16", "q8_0"):
        res[t] = measure(tmp, t)
    m = re.search(r"CFG_DEF_KV_BUDGET_MB = (\d+)", open(os.path.join(os.path.dirname(__file__), "..", "config",
                                                                        "config.h")).read())
    res["budget_mb"] = int(m.group(1)) if m else "default"
    print(json.dumps(res))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
