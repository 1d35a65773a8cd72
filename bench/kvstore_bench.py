#!/usr/bin/env python3
"""bench/kvstore_bench.py: issue 43's targets for the shared KV tier on Redis, on one host (bench/kvstore_bench.sh runs them all).

  ttft    a DOC-token document: TTFT on a freshly started 1P1D cluster with an empty store (recompute), then with every
          worker restarted and the store warm (never seen by the new processes); also with no kvstore section at all.
  outage  8 streams of shared-prefix prompts on a both worker without a local prefix cache (every reuse is the store's);
          the store is killed (SIGKILL, after a SAVE) for DOWN seconds and started again on its snapshot: failed
          requests, latency before / during / after, and how long after the store's return store-speed TTFT is back.
  share   a shared-prefix chat workload (one system prompt, conversations of several turns, each pasting its own document
          first) on two prefill workers with
          KV-aware routing off, with and without the store, against one prefill worker alone: prompt tokens served from a
          tier (usage.prompt_tokens_details.cached_tokens).
  cluster a three-master Redis Cluster: how a document's blocks spread over the masters; one master killed.

TTFT is the client's latency of a max_tokens=1 completion. Needs build/dserve (or DSERVE_BINARY), the models of
scripts/setup.sh and redis-server. Usage: python3 bench/kvstore_bench.py ttft|outage|share|cluster [--model M] [options]."""

import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DSERVE_BINARY", os.path.join(HERE, "..", "build", "dserve"))
os.environ.setdefault("DSERVE_SOURCE_DIR", os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import e2e_util as u  # noqa: E402
from redis_util import Redis  # noqa: E402

MODELS = {"smollm2": u.MODEL, "gemma3": u.GEMMA}


def doc_tokens(n, seed):
    """n token ids valid in both bundled models' vocabularies, a document no other of this run shares."""
    return [(seed * 7919 + i * 131) % 40000 + 100 for i in range(n)]


def kvstore_section(redis):
    return {"kvstore": {"type": "redis", "endpoints": ["127.0.0.1:%d" % redis.port]}}


def latency(port, body):
    """(seconds, HTTP status, usage) of one non-streaming completion."""
    t0 = time.time()
    st, b = u.post(port, "/v1/completions", dict(body, temperature=0), timeout=600)
    return time.time() - t0, st, (b.get("usage", {}) if isinstance(b, dict) else {})


def cached(usage):
    return usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)


def store_blocks(redis):
    return len([k for k in redis.run("--scan", "--pattern", "dsv:*").split() if k])


def cmd_ttft(a):
    model = MODELS[a.model]
    w = {"threads": a.threads, "kv_budget_mb": 256, "max_batch_tokens": 512, "kvxfer": {"backend": "shm"}}
    workers = [dict(w, name="p0", role="prefill"), dict(w, name="d0", role="decode")]
    rows = []
    for rep in range(a.reps):
        doc = doc_tokens(a.doc_len, 100 + rep)
        body = {"prompt": doc, "max_tokens": 1}
        redis = Redis()
        try:
            times = {}
            for phase, extra in (("no kvstore", None), ("store empty", kvstore_section(redis)),
                                 ("restarted, store warm", kvstore_section(redis))):
                c = u.Cluster(workers, disagg_threshold=0, tag="kvs-bench", model=model, extra=extra)
                try:
                    c.start(300)
                    t, st, usage = latency(c.port, body)
                    assert st == 200, (phase, st)
                    times[phase] = (t, cached(usage))
                    if phase == "store empty":  # every block written before the workers stop
                        want = (a.doc_len - 1) // 16
                        if not u.wait_until(lambda: store_blocks(redis) >= want, 120, 0.2):
                            raise SystemExit("the store holds %d of %d blocks" % (store_blocks(redis), want))
                finally:
                    c.close()
            rows.append(times)
            print("rep %d: %s" % (rep, json.dumps(times)), flush=True)
        finally:
            redis.close()
    print("\nmodel %s, %d-token document, 1P1D, %d thread(s) a worker (median of %d)" % (a.model, a.doc_len, a.threads,
                                                                                      a.reps))
    base = statistics.median(r["store empty"][0] for r in rows)
    for phase in ("no kvstore", "store empty", "restarted, store warm"):
        t = statistics.median(r[phase][0] for r in rows)
        print("| %-22s | %8.3f s | cached %5d | ratio to the first %.3f |" % (phase, t, rows[-1][phase][1], t / base))


def cmd_outage(a):
    redis = Redis()
    stop = threading.Event()
    log, lock = [], threading.Lock()
    shared = doc_tokens(a.doc_len, 7)
    c = u.Cluster([{"name": "w0", "role": "both", "threads": a.threads, "kv_budget_mb": 256, "prefix_cache_mb": 0,
                    "max_batch_tokens": 512}], tag="kvs-outage", model=MODELS[a.model],
                  extra={"kvstore": {"type": "redis", "endpoints": ["127.0.0.1:%d" % redis.port]}})
    try:
        c.start(300)
        latency(c.port, {"prompt": shared + [5], "max_tokens": 1})  # the shared part computed once, written behind
        u.wait_until(lambda: store_blocks(redis) >= a.doc_len // 16, 60, 0.2)

        def stream(k):
            i = 0
            while not stop.is_set():
                t0 = time.time()
                try:
                    t, st, usage = latency(c.port, {"prompt": shared + [1000 + k, 2000 + i], "max_tokens": 1})
                except OSError as e:
                    t, st, usage = time.time() - t0, repr(e), {}
                with lock:
                    log.append((t0, t, st, cached(usage)))
                i += 1
        th = [threading.Thread(target=stream, args=(k,)) for k in range(a.streams)]
        for t in th:
            t.start()
        time.sleep(a.before_s)
        redis.run("SAVE")
        t_kill = time.time()
        redis.kill()
        time.sleep(a.down_s)
        redis.start()  # loads the SAVE's snapshot: the blocks are back with the store
        t_back = time.time()
        time.sleep(a.after_s)
        stop.set()
        for t in th:
            t.join(600)
    finally:
        c.close()
        redis.close()
    failed = [x for x in log if x[2] != 200]
    before = [x[1] for x in log if x[0] + x[1] < t_kill]
    during = [x[1] for x in log if t_kill + 3 < x[0] < t_back]
    after = sorted(x for x in log if x[0] >= t_back)
    fast = statistics.median(before) * 1.5
    # When the store served again: the first request sent after its return that read from it (cached > 0), and the
    # first answer after its return at the latency of before the outage.
    hit = next((x[0] - t_back for x in after if x[3] > 0), None)
    quick = next((x[0] + x[1] - t_back for x in after if x[1] <= fast), None)
    print("model %s, %d streams, %d-token shared prefix, store down %d s: %d requests, %d failed" %
          (a.model, a.streams, a.doc_len, a.down_s, len(log), len(failed)))
    print("| median latency before | during the outage | after | first read from the store after its return (sent at) "
          "| first answer at the earlier latency (done at) |")
    print("| %.3f s (%d) | %.3f s (%d) | %.3f s (%d) | %s | %s |" % (
        statistics.median(before), len(before), statistics.median(during) if during else float("nan"), len(during),
        statistics.median([x[1] for x in after]) if after else float("nan"), len(after),
        "+%.2f s" % hit if hit is not None else "never", "+%.2f s" % quick if quick is not None else "never"))
    print("after the store's return (sent at, latency, cached tokens):")
    for x in after[:40]:
        print("  +%6.2f s  %6.3f s  %5d" % (x[0] - t_back, x[1], x[3]))


WORDS = ("store block prefix worker cache token layer shared cluster redis prompt answer request model chat turn value "
         "key write read tier pool host disk fetch peer route decode prefill stream batch queue time").split()


def system_prompt(a):
    """The one system prompt every conversation starts with (about system_words words)."""
    return "You answer questions about the documents users paste. " + " ".join(
        WORDS[(i * 7) % len(WORDS)] for i in range(a.system_words))


def pasted_doc(a, k):
    """Conversation k's own document (doc_words words), pasted in its first turn."""
    return " ".join(WORDS[(k * 31 + i * i * 17 + i) % len(WORDS)] for i in range(a.doc_words))


def run_share(a, workers, extra, routing):
    c = u.Cluster(workers, disagg_threshold=0, tag="kvs-share", model=MODELS[a.model], extra=extra,
                  router={"routing": routing})
    system = system_prompt(a)
    totals = {"prompt": 0, "cached": 0, "failed": 0}
    lock = threading.Lock()
    try:
        c.start(300)

        def conv(k):
            msgs = [{"role": "system", "content": system}]
            for turn in range(a.turns):
                q = ("Here is my document:\n" + pasted_doc(a, k) + "\nWhat is it about?") if turn == 0 else \
                    "And what does word %d of it mean?" % (turn * 3 + k)
                msgs.append({"role": "user", "content": q})
                st, b = u.post(c.port, "/v1/chat/completions",
                               {"messages": msgs, "max_tokens": a.max_tokens, "temperature": 0}, timeout=600)
                with lock:
                    if st != 200:
                        totals["failed"] += 1
                        return
                    totals["prompt"] += b["usage"]["prompt_tokens"]
                    totals["cached"] += cached(b["usage"])
                msgs.append({"role": "assistant", "content": b["choices"][0]["message"]["content"]})

        def lane(j):  # a.parallel conversations at a time
            for k in range(j, a.convs, a.parallel):
                conv(k)
        u.run_threads([lambda j=j: lane(j) for j in range(a.parallel)], 3600)
        # What the prefill workers did not compute: their prefix hits, every tier (the store's included). The usage's
        # cached_tokens says less here: a decode worker reports the blocks it held itself, whoever prefilled.
        for name, port in c.ports().items():
            if name.startswith("p"):
                st = u.worker_stats(port)
                totals["hits"] = totals.get("hits", 0) + st.get("prefix_hits", 0)
                totals["queries"] = totals.get("queries", 0) + st.get("prefix_queries", 0)
                store = st.get("prefix_tiers", {}).get("store")
                totals["store"] = totals.get("store", 0) + (store["hits"] if store else 0)
    finally:
        c.close()
    return totals


def cmd_share(a):
    w = {"threads": a.threads, "kv_budget_mb": 256, "max_batch_tokens": 512, "kvxfer": {"backend": "shm"}}
    off = {"overlap": 0}  # KV-aware routing off: the default weights of queue (0.5) and free blocks (0.2) alone
    two = [dict(w, name="p0", role="prefill"), dict(w, name="p1", role="prefill"), dict(w, name="d0", role="decode")]
    one = [dict(w, name="p0", role="prefill"), dict(w, name="d0", role="decode")]
    redis = Redis()
    try:
        res = {"one prefill worker, no store": run_share(a, one, None, off),
               "two prefill workers, no store": run_share(a, two, None, off),
               "two prefill workers, store": run_share(a, two, kvstore_section(redis), off)}
    finally:
        redis.close()
    alone = res["one prefill worker, no store"]["hits"]
    print("model %s, %d conversations x %d turns (%d at a time), a %d-word system prompt, a %d-word document pasted in "
          "each first turn, routing overlap 0" % (a.model, a.convs, a.turns, a.parallel, a.system_words, a.doc_words))
    print("| setup | prompt tokens | prefill workers' tier hits (tokens) | of which the store | % of one worker alone "
          "| usage cached_tokens | failed |")
    for k, v in res.items():
        print("| %s | %d | %d | %d | %.1f%% | %d | %d |" % (k, v["prompt"], v["hits"], v["store"],
                                                           100.0 * v["hits"] / alone if alone else float("nan"),
                                                           v["cached"], v["failed"]))


def cmd_cluster(a):
    """Three masters (redis-server --cluster-enabled yes, slots by redis-cli --cluster create): a document's blocks
    spread over them; one master killed: the run stops at its first block (misses only), no request fails."""
    nodes = [Redis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"])
             for _ in range(3)]
    try:
        nodes[0].run("--cluster", "create", *["127.0.0.1:%d" % n.port for n in nodes], "--cluster-replicas", "0",
                     "--cluster-yes")
        u.wait_until(lambda: "cluster_state:ok" in nodes[0].run("CLUSTER", "INFO"), 30, 0.2)
        c = u.Cluster([{"name": "w0", "role": "both", "threads": a.threads, "kv_budget_mb": 256, "prefix_cache_mb": 0,
                        "max_batch_tokens": 512}], tag="kvs-cluster", model=MODELS[a.model],
                      extra={"kvstore": {"type": "redis", "cluster": True, "endpoints": ["127.0.0.1:%d" % nodes[0].port]}})
        try:
            c.start(300)
            doc = doc_tokens(a.doc_len, 11)
            t_cold, st, usage = latency(c.port, {"prompt": doc, "max_tokens": 1})
            want = (a.doc_len - 1) // 16
            u.wait_until(lambda: sum(store_blocks(n) for n in nodes) >= want, 60, 0.2)
            spread = [store_blocks(n) for n in nodes]
            t_warm, st2, usage2 = latency(c.port, {"prompt": doc, "max_tokens": 1})
            nodes[1].kill()
            res = [latency(c.port, {"prompt": doc, "max_tokens": 1}) for _ in range(3)]
        finally:
            c.close()
    finally:
        for n in nodes:
            n.close()
    print("model %s, %d-token document, a three-master Redis Cluster: blocks per master %s" % (a.model, a.doc_len, spread))
    print("| cold %.3f s (cached %d) | warm %.3f s (cached %d) | one master killed: %s |" % (
        t_cold, cached(usage), t_warm, cached(usage2),
        ", ".join("%.3f s status %s cached %d" % (t, st, cached(us)) for t, st, us in res)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("ttft", "outage", "share", "cluster"))
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--doc-len", type=int, default=None, help="tokens of the document (ttft 3000, outage 512)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--down-s", type=int, default=30)
    p.add_argument("--before-s", type=int, default=15)
    p.add_argument("--after-s", type=int, default=30)
    p.add_argument("--convs", type=int, default=12)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--system-words", type=int, default=100)
    p.add_argument("--doc-words", type=int, default=300)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=8)
    a = p.parse_args()
    if a.doc_len is None:
        a.doc_len = {"ttft": 3000, "cluster": 1024}.get(a.what, 256)
    {"ttft": cmd_ttft, "outage": cmd_outage, "share": cmd_share, "cluster": cmd_cluster}[a.what](a)


if __name__ == "__main__":
    main()
