"""tests/e2e/test_prefix_snapshot.py: a router that starts after a worker filled its prefix store learns the store from the hello snapshot, routes the repeated prompt there, and shows per-tier counters."""

import json
import os
import shutil
import tempfile
import time
import unittest

import e2e_util as u

BS = 16  # the workers' KV block size (tokens)


def prompt(seed, n=200):
    """n token ids that no other prompt of this test shares (12 full blocks for n = 200)."""
    return [(seed * 7919 + i * 131) % 40000 + 100 for i in range(n)]


def generate(ctl, rid, toks):
    """Runs one request on a worker over its control connection; returns the done message."""
    ctl.send({"op": "generate", "id": rid, "prompt": toks, "max_tokens": 1, "mode": "local",
              "sampling": {"temperature": 0}})
    while True:
        m = ctl.recv(120)  # a loaded machine or a sanitizer build computes slowly
        if m.get("id") == rid and m.get("op") in ("done", "error"):
            if m["op"] == "error":
                raise AssertionError("generate %s failed: %r" % (rid, m))
            return m


def snapshot(ctl):
    """The kv_events messages a worker sends a router right after hello_ok: [kind, key] events, up to the last key."""
    evs = []
    m = ctl.recv(60)
    while m.get("op") == "kv_events":
        evs += m["events"]
        try:
            m = ctl.recv(0.5)  # the snapshot's messages follow one another at once
        except (OSError, TimeoutError):
            break
    return evs


class LateRouter(unittest.TestCase):
    def setUp(self):
        u.require_env(self)
        self.dir = tempfile.mkdtemp(prefix="dserve-snapshot-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.config = os.path.join(self.dir, "c.json")
        # w2 first: with an empty index the router's tie-break (and w1's store holding pool blocks) picks w2, so
        # only the snapshot can send the repeated prompt to w1. w1 keeps 2 blocks in the pool, the rest in host DRAM.
        ports = u.free_ports(3)
        cfg = {"model": u.MODEL,
               "nodes": {"workers": {"host": "127.0.0.1"}, "front": {"host": "127.0.0.1"}},
               "router": {"node": "front", "port": ports[0], "disagg_threshold": 100000},
               "workers": [
                   {"name": "w2", "node": "workers", "role": "both", "port": ports[1], "threads": 1, "kv_budget_mb": 32},
                   {"name": "w1", "node": "workers", "role": "both", "port": ports[2], "threads": 1, "kv_budget_mb": 32,
                    "prefix_cache_mb": 1, "prefix_host_mb": 12}]}
        with open(self.config, "w") as f:
            json.dump(cfg, f, indent=1)
        self.port = ports[0]
        self.w1 = ports[2]
        self.nodes = []

    def tearDown(self):
        for n in self.nodes:
            n.stop()

    def start(self, node):
        n = u.Node(self.config, node=node)
        self.nodes.append(n)
        n.wait_ready(60)
        return n

    def test_snapshot_routes_to_the_holder_and_tiers_count(self):
        self.start("workers")
        a, b = prompt(1), prompt(2)
        # Fill w1 before any router exists: A, then B, whose insert pushes A's blocks out to host DRAM.
        ctl = u.Control("127.0.0.1", self.w1, name="filler")
        self.assertEqual([e[0] for e in snapshot(ctl)], [3], "an empty store's snapshot is one clear")
        generate(ctl, "fill-a", a)
        generate(ctl, "fill-b", b)
        tiers = ctl.stats()["prefix_tiers"]
        ctl.close()
        self.assertEqual(sorted(tiers), ["host", "pool"])  # no disk tier configured
        self.assertEqual(tiers["pool"]["queries"], 2 * len(a))
        self.assertEqual(tiers["host"]["queries"], 2 * len(a))
        self.assertEqual(tiers["pool"]["hits"] + tiers["host"]["hits"], 0)
        held = tiers["pool"]["blocks"] + tiers["host"]["blocks"]
        self.assertEqual(held, 24)
        self.assertGreaterEqual(tiers["host"]["blocks"], 12)

        # A later router-role connection gets the whole store: a clear, then every key of both tiers.
        late = u.Control("127.0.0.1", self.w1, name="late")
        self.addCleanup(late.close)
        evs = snapshot(late)
        self.assertEqual(evs[0][0], 3)
        self.assertEqual([e[0] for e in evs[1:]], [1] * held)
        self.assertEqual(len({e[1] for e in evs[1:]}), held)

        # Now the router starts: its index of w1 comes from the snapshot alone.
        front = self.start("front")
        front.wait_connected(["w1", "w2"], 60)
        u.wait_workers(self.port, 60)
        base = late.stats()["prefix_tiers"]
        # A: routed to w1 (its host tier holds A), read back from host DRAM.
        self.complete(a)
        now = late.stats()["prefix_tiers"]
        self.assertEqual(delta(now, base), {"pool": (0, len(a)), "host": (12 * BS, len(a))})
        self.wait_router_sees(now)
        # A again: a pool hit now; the host tier is asked only for the token the pool lacks.
        self.complete(a)
        again = late.stats()["prefix_tiers"]
        self.assertEqual(delta(again, now), {"pool": (12 * BS, len(a)), "host": (0, len(a) - 12 * BS)})
        mt = self.wait_router_sees(again)
        self.assertIsNone(mt.get('dserve:prefix_cache_tier_hits_total{worker="w1",tier="disk"}'))
        self.assertIsNotNone(mt.get('dserve:prefix_cache_tier_queries_total{worker="w2",tier="pool"}'))
        self.assertEqual(mt['dserve:prefix_cache_blocks{worker="w1",tier="host"}'], again["host"]["blocks"])
        self.assertGreaterEqual(mt["dserve:prefix_cache_hits_total"], 2 * 12 * BS)

    def complete(self, toks):
        st, body = u.post(self.port, "/v1/completions", {"prompt": toks, "max_tokens": 1, "temperature": 0})
        self.assertEqual(st, 200, body)
        cached = body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        self.assertEqual(cached, 12 * BS, "not routed to w1, which holds the prompt: %r" % body["usage"])

    def wait_router_sees(self, tiers, timeout=20.0):
        """Waits until the router's per-tier series for w1 show tiers (a stats_ok prefix_tiers); returns /metrics."""
        want = {}
        for t, v in tiers.items():
            want['dserve:prefix_cache_tier_hits_total{worker="w1",tier="%s"}' % t] = v["hits"]
            want['dserve:prefix_cache_tier_queries_total{worker="w1",tier="%s"}' % t] = v["queries"]
        end = time.time() + timeout
        while True:
            mt = u.metrics(self.port)
            got = {k: mt.get(k) for k in want}
            if got == want:
                return mt
            if time.time() > end:
                raise AssertionError("the router's /metrics show %r, the worker counted %r" % (got, want))
            time.sleep(0.2)


def delta(now, base):
    """{tier: (hits grown, queries grown)} between two stats_ok prefix_tiers."""
    return {t: (now[t]["hits"] - base[t]["hits"], now[t]["queries"] - base[t]["queries"]) for t in now}


if __name__ == "__main__":
    unittest.main()
