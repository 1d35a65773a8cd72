"""tests/e2e/test_kvstore.py: the shared KV tier on a real redis-server: a fresh worker reads a prompt's blocks another
worker wrote (tier store, identical output), a forged value is a counted MAC failure and recomputed, a killed store
only means recompute."""

import json
import os
import re
import shutil
import subprocess
import unittest

import e2e_util as u
from redis_util import Redis
from test_observe import Receiver  # an OTLP/HTTP JSON collector

BS = 16  # the workers' KV block size (tokens)
N_BLOCKS = 12


def prompt(seed, n=N_BLOCKS * BS + 8):
    """n token ids no other prompt of this test shares (N_BLOCKS full blocks and a tail)."""
    return [(seed * 7919 + i * 131) % 40000 + 100 for i in range(n)]


class SharedTier(unittest.TestCase):
    def setUp(self):
        u.require_env(self)
        if not shutil.which("redis-server") or not shutil.which("redis-cli"):
            self.fail("redis-server and redis-cli are needed (scripts/setup.sh installs redis-server and redis-tools)")
        self.redis = Redis()
        self.addCleanup(self.redis.close)

    def cluster(self, tag, model=u.MODEL, workers=None, disagg_threshold=1000, extra=None):
        """A fresh router and both worker w1 with the store (an empty pool: nothing of an earlier worker's)."""
        c = u.Cluster(workers or [{"name": "w1", "role": "both"}], tag=tag, model=model,
                      disagg_threshold=disagg_threshold,
                      extra=dict(extra or {}, kvstore={"type": "redis", "endpoints": ["127.0.0.1:%d" % self.redis.port],
                                                       "read_timeout_ms": int(2000 * u.SCALE)}))
        self.addCleanup(c.close)
        return c.start()

    def complete(self, c, toks):
        st, body = u.post(c.port, "/v1/completions", {"prompt": toks, "max_tokens": 8, "temperature": 0})
        self.assertEqual(st, 200, body)
        return body["choices"][0]["text"], body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)

    def wait_metric(self, c, name, cond, timeout=30.0):
        """The router's /metrics value of name once cond(value) holds (the workers' stats arrive every second)."""
        last = [None]

        def ok():
            last[0] = u.metrics(c.port).get(name)  # None: no such series (yet)
            return last[0] is not None and cond(last[0])
        if not u.wait_until(ok, timeout * u.SCALE, 0.2):
            raise AssertionError("%s stayed %r" % (name, last[0]))
        return last[0]

    def stored_keys(self, n):
        """The store's keys once the write-behind queue has written at least n."""
        keys = []

        def enough():
            keys[:] = [k for k in self.redis.run("--scan", "--pattern", "dsv:*").split() if k]
            return len(keys) >= n
        self.assertTrue(u.wait_until(enough, 30 * u.SCALE, 0.1), "only %d keys written" % len(keys))
        return keys

    def test_fresh_worker_reads_the_store_forged_values_and_a_dead_store_recompute(self):
        doc = prompt(1)
        a = self.cluster("kvs-a")
        text, cached = self.complete(a, doc)
        self.assertEqual(cached, 0)
        keys = self.stored_keys(N_BLOCKS)
        self.wait_metric(a, 'dserve:kvstore_write_blocks_total{worker="w1",role="both"}', lambda v: v >= N_BLOCKS)
        a.close()

        # A fresh worker (nothing in its pool, host or disk tiers) reads the run from the store: identical output.
        b = self.cluster("kvs-b")
        text_b, cached_b = self.complete(b, doc)
        self.assertEqual(text_b, text)
        self.assertEqual(cached_b, N_BLOCKS * BS)
        self.wait_metric(b, 'dserve:prefix_cache_tier_hits_total{worker="w1",tier="store"}', lambda v: v == N_BLOCKS * BS)
        self.wait_metric(b, 'dserve:kvstore_read_blocks_total{worker="w1",role="both"}', lambda v: v == N_BLOCKS)
        self.wait_metric(b, 'dserve:kvstore_up{worker="w1",role="both"}', lambda v: v == 1)
        access = u.wait_until(lambda: re.search(r"cached_tokens=%d cached_store_tokens=%d" % (N_BLOCKS * BS, N_BLOCKS * BS),
                                                b.node.text()), 10 * u.SCALE)
        self.assertTrue(access, "no access line names the store's tokens:\n" + b.node.text()[-2000:])
        b.close()

        # Every value moved onto another block's key (a mix-up, or a replay by someone who can write the store): its
        # MAC holds, its header names another block: a mismatch, counted, recomputed, the same output.
        self.redis.run("COPY", keys[0], "swap")
        for i in range(len(keys) - 1):
            self.redis.run("COPY", keys[i + 1], keys[i], "REPLACE")
        self.redis.run("COPY", "swap", keys[-1], "REPLACE")
        self.redis.run("DEL", "swap")
        m = self.cluster("kvs-m")
        text_m, cached_m = self.complete(m, doc)
        self.assertEqual(text_m, text)
        self.assertEqual(cached_m, 0)
        self.wait_metric(m, 'dserve:kvstore_mismatches_total{worker="w1",role="both"}', lambda v: v >= 1)
        self.assertEqual(u.metrics(m.port).get('dserve:kvstore_mac_failures_total{worker="w1",role="both"}'), 0)
        m.close()

        # Every value rewritten by a process without the secret (one payload byte changed): a MAC failure, counted,
        # recomputed, the same output.
        for k in keys:
            self.redis.run("SETRANGE", k, "300", "X")
        c = self.cluster("kvs-c")
        text_c, cached_c = self.complete(c, doc)
        self.assertEqual(text_c, text)
        self.assertEqual(cached_c, 0)
        self.wait_metric(c, 'dserve:kvstore_mac_failures_total{worker="w1",role="both"}', lambda v: v >= 1)
        self.assertEqual(u.metrics(c.port).get('dserve:kvstore_read_blocks_total{worker="w1",role="both"}', 0), 0)

        # The store killed: requests still succeed, recomputed; the failures are counted, never a failed request.
        self.redis.kill()
        for seed in (2, 3):
            other = prompt(seed)
            t1, cached1 = self.complete(c, other)
            self.assertEqual(cached1, 0)
        text_d, _ = self.complete(c, doc)
        self.assertEqual(text_d, text)
        self.wait_metric(c, 'dserve:kvstore_errors_total{worker="w1",role="both"}', lambda v: v >= 1)
        self.wait_metric(c, 'dserve:kvstore_up{worker="w1",role="both"}', lambda v: v == 0)
        self.assertEqual(u.metrics(c.port).get("dserve:request_failure_total", 0), 0)

    def test_prefill_worker_reads_the_store_and_hands_off(self):
        """1P1D: a restarted pair's prefill worker reads the blocks, pushes them with the rest; kv_first and done say
        which tokens came from the store."""
        pd = [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]
        doc = prompt(6)
        a = self.cluster("kvs-pa", workers=pd, disagg_threshold=0)
        text, _ = self.complete(a, doc)
        self.stored_keys(N_BLOCKS)
        a.close()
        rx = Receiver()
        self.addCleanup(rx.shutdown)
        b = self.cluster("kvs-pb", workers=pd, disagg_threshold=0, extra={"tracing": {
            "endpoint": "http://127.0.0.1:%d/v1/traces" % rx.server_address[1], "flush_ms": 100}})
        text_b, cached_b = self.complete(b, doc)
        self.assertEqual(cached_b, N_BLOCKS * BS)
        self.assertEqual(text_b, text)
        self.assertTrue(u.wait_until(lambda: re.search(r"cached_store_tokens=%d .*workers=p0>d0" % (N_BLOCKS * BS),
                                                       b.node.text()), 10 * u.SCALE), b.node.text()[-2000:])
        self.wait_metric(b, 'dserve:prefix_cache_tier_hits_total{worker="p0",tier="store"}', lambda v: v == N_BLOCKS * BS)
        self.assertIsNone(u.metrics(b.port).get('dserve:kvstore_up{worker="d0",role="decode"}'))  # decode: no store

        def read_span():  # the prefill worker's span of the read, with the tokens it brought
            with rx.lock:
                return [sp for sp in rx.spans if sp["name"] == "kvstore_read" and sp["service"] == "dserve-p0"]
        spans = u.wait_until(read_span, 10 * u.SCALE)
        self.assertTrue(spans, "no kvstore_read span")
        attrs = {a["key"]: a["value"] for a in spans[-1]["attributes"]}
        self.assertEqual(float(list(attrs["dserve.kvstore_tokens"].values())[0]), N_BLOCKS * BS)

    def test_serve_flag(self):
        """dserve serve --kvstore redis://HOST:PORT is the kvstore section; anything else is refused, naming it."""
        def serve(*args):  # a bad value is refused before anything starts (--print-config prints without checking)
            p = subprocess.run([u.DSERVE, "serve", u.MODEL] + list(args), capture_output=True, text=True, timeout=60)
            return p.returncode, p.stdout + p.stderr
        rc, out = serve("--print-config", "--kvstore", "redis://127.0.0.1:%d" % self.redis.port)
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(out)["kvstore"], {"type": "redis", "endpoints": ["127.0.0.1:%d" % self.redis.port]})
        for bad, why in (("127.0.0.1:6379", "expected redis://HOST:PORT"), ("redis://h", "expected redis://HOST:PORT"),
                         ("redis://user@h:1", "expected redis://HOST:PORT"),
                         ("redis://h:99999", "kvstore.endpoints[0]: expected \"host:port\"")):
            rc, out = serve("--kvstore", bad)
            self.assertEqual(rc, 2, bad)
            self.assertIn(why, out, bad)

    def test_unreachable_store_at_start_is_a_warning(self):
        """A store nobody listens on: the worker starts and serves (recomputing), the store is named in a warning."""
        dead = u.free_ports(1)[0]
        c = u.Cluster([{"name": "w1", "role": "both"}], tag="kvs-dead",
                      extra={"kvstore": {"type": "redis", "endpoints": ["127.0.0.1:%d" % dead]}})
        self.addCleanup(c.close)
        c.start()
        text, cached = self.complete(c, prompt(5))
        self.assertEqual(cached, 0)
        c.node.wait_for("store 127.0.0.1:%d unavailable" % dead, 10 * u.SCALE)
        self.assertEqual(u.metrics(c.port).get("dserve:request_failure_total", 0), 0)

    def test_sliding_window_and_q8_0_store_whole_blocks(self):
        """Gemma 3's pool keeps window pages apart: a block is written whole right after its step, read whole; a q8_0
        pool's blocks carry their scales. Each: written by one worker, read by a fresh one, the same output."""
        if not os.path.exists(u.GEMMA):
            self.fail("the model %s is missing: run scripts/setup.sh" % u.GEMMA)
        for seed, model, kv_type in ((4, u.GEMMA, "f16"), (8, u.MODEL, "q8_0")):
            with self.subTest(model=os.path.basename(model), kv_type=kv_type):
                doc, w = prompt(seed), [{"name": "w1", "role": "both", "kv_type": kv_type}]
                before = len(self.stored_keys(0))
                a = self.cluster("kvs-wa", model=model, workers=w)
                text, _ = self.complete(a, doc)
                self.stored_keys(before + N_BLOCKS)
                a.close()
                b = self.cluster("kvs-wb", model=model, workers=w)
                text_b, cached_b = self.complete(b, doc)
                self.assertEqual(cached_b, N_BLOCKS * BS)
                self.assertEqual(text_b, text)
                b.close()


class Password(unittest.TestCase):
    """A store with requirepass: the worker AUTHs with password_file; a wrong one is logged once, naming the store,
    counted, and requests recompute."""

    def setUp(self):
        u.require_env(self)
        self.redis = Redis(["--requirepass", "s3cret-kv"])
        self.addCleanup(self.redis.close)

    def test_password_file_right_and_wrong(self):
        for pw, ok in (("s3cret-kv", True), ("wrong", False)):
            c = u.Cluster([{"name": "w1", "role": "both"}], tag="kvs-auth",
                          extra={"kvstore": {"type": "redis", "endpoints": ["127.0.0.1:%d" % self.redis.port],
                                             "password_file": "redis.pass"}})
            self.addCleanup(c.close)
            with open(os.path.join(c.dir, "redis.pass"), "w") as f:  # relative to the config file's folder
                f.write(pw + "\n")
            c.start()
            st, body = u.post(c.port, "/v1/completions", {"prompt": prompt(7), "max_tokens": 2, "temperature": 0})
            self.assertEqual(st, 200, body)
            name = 'dserve:kvstore_%s{worker="w1",role="both"}' % ("write_blocks_total" if ok else "errors_total")
            self.assertTrue(u.wait_until(lambda: u.metrics(c.port).get(name, 0) >= 1, 30 * u.SCALE),
                            "%s: %s never counted\n%s" % (pw, name, c.node.text()[-2000:]))
            if not ok:
                c.node.wait_for("store 127.0.0.1:%d refused the password" % self.redis.port, 10 * u.SCALE)
                self.assertEqual(c.node.text().count("refused the password"), 1)
            c.close()


if __name__ == "__main__":
    unittest.main()
