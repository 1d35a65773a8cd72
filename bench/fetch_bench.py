#!/usr/bin/env python3
"""bench/fetch_bench.py: prefix fetch between prefill workers (router.prefix_fetch): latency of a prompt whose prefix another prefill worker holds, fetched versus recomputed.

Starts a one-node cluster twice (p1, p0 prefill, d0 decode; routing by free blocks only, so the prefix lands on one and the
next prompt on the other), fetch off then on, and prints the end-to-end latency of a max_tokens=1 completion of
prefix + suffix there. Usage: python3 bench/fetch_bench.py [--prefix-len 1024] [--suffix-len 50] [--backend shm] [--threads 1]
(needs build/dserve, or DSERVE_BINARY, and the model of scripts/setup.sh)."""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DSERVE_BINARY", os.path.join(HERE, "..", "build", "dserve"))
os.environ.setdefault("DSERVE_SOURCE_DIR", os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import e2e_util as u  # noqa: E402


def run(a, fetch):
    prefix = [(i * 37) % 4000 + 100 for i in range(a.prefix_len)]
    suffix = [(i * 53) % 3000 + 200 for i in range(a.suffix_len)]
    w = {"kvxfer": {"backend": a.backend}, "threads": a.threads, "max_batch_tokens": 512, "kv_budget_mb": 128}
    c = u.Cluster([dict(w, name="p1", role="prefill"), dict(w, name="p0", role="prefill"),
                   dict(w, name="d0", role="decode")], disagg_threshold=0, tag="fetch-bench",
                  router={"prefix_fetch": fetch, "routing": {"overlap": 0, "queue": 0, "free": 1}})
    try:
        c.start(120)
        t0 = time.time()
        r = u.complete(c.port, "completions", {"prompt": prefix, "max_tokens": 1})
        t_prefix = time.time() - t0
        assert r["status"] == 200, r
        time.sleep(3.5)  # the router's stats (every second) show the kept blocks: the next prompt goes to the other
        t0 = time.time()
        r = u.complete(c.port, "completions", {"prompt": prefix + suffix, "max_tokens": 1})
        t = time.time() - t0
        assert r["status"] == 200, r
        fetched = [u.worker_stats(c.ports()[n])["prefix_fetched_blocks"] for n in ("p0", "p1")]
        return t_prefix, t, int(max(fetched))
    finally:
        c.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix-len", type=int, default=1024)
    p.add_argument("--suffix-len", type=int, default=50)
    p.add_argument("--backend", default="shm")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    for fetch in (False, True):
        t_prefix, t, blocks = run(a, fetch)
        print("prefix_fetch=%-5s  prefix %.2f s   prefix+suffix on the other prefill worker %.2f s   blocks fetched %d"
              % (fetch, t_prefix, t, blocks))


if __name__ == "__main__":
    main()
