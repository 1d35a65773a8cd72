"""bench/kvquant_serve.py: bench/kvquant.sh's serving figures for one model: per kv_type (f16, q8_0), a 1P1D cluster
(tests/e2e's Cluster: `dserve launch` on free loopback ports, kvxfer shm, the shipped kv_budget_mb) and the bytes one
handoff of a prompt of N random tokens moves (the router's dserve:kv_transfer_bytes_total) and the KV blocks the decode
worker's pool holds (its "listening ... (N KV blocks" line). usage: kvquant_serve.py DSERVE MODEL N THREADS; prints
progress, then one JSON line: {"tokens": N, "budget_mb": ..., "f16": {"handoff_bytes", "blocks"}, "q8_0": {...}}."""
import json
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["DSERVE_BINARY"] = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import e2e_util as u  # noqa: E402

model, n_tokens, threads = os.path.abspath(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
# the shipped pool size (config/config.h's CFG_DEF_KV_BUDGET_MB): the e2e helper would otherwise give its workers 32 MiB
budget = int(re.search(r"CFG_DEF_KV_BUDGET_MB = (\d+)", open(os.path.join(HERE, "..", "config", "config.h")).read())[1])


def measure(kv_type):
    w = {"threads": threads, "kv_type": kv_type, "kv_budget_mb": budget, "kvxfer": {"backend": "shm"}}
    c = u.Cluster([dict(w, name="p0", role="prefill"), dict(w, name="d0", role="decode")], disagg_threshold=0,
                  model=model, tag="kvquant-" + kv_type)
    try:
        c.start(timeout=120)  # serves one request first: wait until its handoff is counted
        count = lambda: u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"]
        u.wait_until(lambda: count() >= 1, 30)
        m0 = u.metrics(c.port)
        rng = random.Random(1)
        got = u.complete(c.port, "completions", {"prompt": [rng.randrange(100, 49000) for _ in range(n_tokens)],
                                                 "max_tokens": 1}, timeout=600)
        if got["status"] != 200:
            sys.exit("kvquant_serve: %s: %s" % (kv_type, got))
        # a handoff is counted when the decode worker's `done` comes
        u.wait_until(lambda: count() >= m0["dserve:kv_transfer_time_seconds_count"] + 1, 30)
        m1 = u.metrics(c.port)
        if m1["dserve:kv_transfer_time_seconds_count"] != m0["dserve:kv_transfer_time_seconds_count"] + 1:
            sys.exit("kvquant_serve: %s: the prompt was not handed off" % kv_type)
        m = re.search(r"d0: decode worker listening on \S+ \((\d+) KV blocks", c.node.text())
        if not m:
            sys.exit("kvquant_serve: %s: the decode worker did not say its pool's blocks" % kv_type)
        out = {"handoff_bytes": m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"],
               "blocks": int(m.group(1))}
        print("  %s: %s" % (kv_type, out), flush=True)
        return out
    finally:
        c.close()


res = {"tokens": n_tokens, "budget_mb": budget}
for t in ("f16", "q8_0"):
    res[t] = measure(t)
print(json.dumps(res))
