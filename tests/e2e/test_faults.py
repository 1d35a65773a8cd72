"""tests/e2e/test_faults.py: kill -9 of a decode worker mid-stream (its stream moves on) and of the prefill worker mid-transfer, under `dserve launch`."""

import os
import signal
import threading
import time
import unittest

import e2e_util as u

LONG_GEN = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True}
SHORT = {"prompt": "The capital of France is", "max_tokens": 8}
S = u.SCALE  # every wait and time bound below: longer in the sanitize build


wait_until = u.wait_until


class DecodeDeath(unittest.TestCase):
    def setUp(self):
        u.require_env(self)

    def test_kill_decode_mid_stream(self):
        # Restarts are delayed 3 s so that the requests right after the kill can only go to the survivor.
        tcp = {"backend": "tcp"}
        c = u.Cluster([{"name": "p0", "role": "prefill", "kvxfer": tcp}, {"name": "d0", "role": "decode", "kvxfer": tcp},
                       {"name": "d1", "role": "decode", "kvxfer": tcp}], disagg_threshold=0, tag="kill-decode", backoff_ms=3000)
        self.addCleanup(c.close)
        c.start()
        ports = c.ports()
        ref = u.complete(c.port, "completions", SHORT)
        self.assertEqual(ref["status"], 200, ref)
        # The router balances on the workers' stats (polled every second): let it see both idle after ref.
        self.assertTrue(wait_until(lambda: all(u.worker_stats(ports[d])["running"] == 0 for d in ("d0", "d1")), 10 * S))
        u.wait_router_sees_idle(c.port, ("d0", "d1"), 10 * S)

        # Two long streams: the router puts them on different decode workers (least in flight).
        state = {"kill_at": None, "stop": threading.Event(), "error_seen": threading.Event()}
        counts = [0, 0]
        after_kill = [0, 0]

        def on_event(k):
            def f(i, o):
                counts[k] = i
                if state["kill_at"] is not None:
                    after_kill[k] += 1
                if "error" in o:
                    state["error_seen"].set()
                return state["stop"].is_set()
            return f

        results = [None, None]
        threads = []
        for k in range(2):
            def run(k=k):
                results[k] = u.stream(c.port, "completions", LONG_GEN, timeout=60 * S, on_event=on_event(k))
            t = threading.Thread(target=run, daemon=True)
            t.start()
            threads.append(t)
            self.assertTrue(wait_until(lambda: counts[k] >= 2, 30 * S), "stream %d produced no tokens" % k)
        running = {d: u.worker_stats(ports[d])["running"] for d in ("d0", "d1")}
        self.assertEqual(running, {"d0": 1, "d1": 1}, "the two streams should run on different decode workers")

        victim = c.node.child_pid("d0")
        state["kill_at"] = time.time()
        os.kill(victim, signal.SIGKILL)
        # The victim's stream moves to d1 (the only decode worker up: restarts are delayed) and goes on from the
        # tokens it had: no error event; its client sees one stream.
        c.node.wait_for("worker d0 is gone after", 5 * S)
        # New requests, once the router knows: they complete (on d1) with the same text.
        d1_before = u.worker_stats(ports["d1"])["finished"]
        news = u.run_threads([lambda: u.complete(c.port, "completions", SHORT, timeout=60 * S)] * 3, timeout=60 * S)
        for r in news:
            self.assertIsNotNone(r)
            self.assertEqual(r["status"], 200, r)
            self.assertEqual(r["text"], ref["text"])
        self.assertEqual(u.worker_stats(ports["d1"])["finished"] - d1_before, 3)
        # Both streams keep streaming well past the kill; then hang up.
        self.assertTrue(wait_until(lambda: min(after_kill) > 5, 30 * S), "a stream stopped after the kill: %r" % after_kill)
        state["stop"].set()
        for t in threads:
            t.join(30)
        self.assertTrue(all(r is not None for r in results), "a stream did not end")
        self.assertFalse(state["error_seen"].is_set(), results)
        for r in results:
            self.assertIsNone(r["error"], r["error"])
            self.assertTrue(r["stopped"])
        self.assertTrue(wait_until(lambda: u.worker_stats(ports["d1"])["running"] == 0, 10 * S),
                        "d1 kept a stream its client left")

        # The launcher restarts d0 and the router uses it again.
        c.node.wait_for("d0 is up again", 30 * S)
        c.node.wait_count("router: worker d0 (decode, ", 2, 30 * S)
        r = u.complete(c.port, "completions", SHORT)
        self.assertEqual(r["text"], ref["text"])


class PrefillDeath(unittest.TestCase):
    def setUp(self):
        u.require_env(self)

    def test_kill_prefill_mid_transfer_frees_decode_blocks(self):
        tcp = {"backend": "tcp"}
        c = u.Cluster([{"name": "p0", "role": "prefill", "max_batch_tokens": 16, "threads": 1, "kvxfer": tcp},
                       {"name": "d0", "role": "decode", "kvxfer": tcp}], disagg_threshold=0, tag="kill-prefill", backoff_ms=3000)
        self.addCleanup(c.close)
        c.start()
        ports = c.ports()
        st0 = u.worker_stats(ports["d0"])
        self.assertEqual(st0["running"] + st0["waiting"], 0, st0)
        free0 = st0["free_blocks"]
        self.assertEqual(wait_until(lambda: u.metrics(c.port)["dserve:kv_cache_usage_perc"] == 0, 5 * S), True)

        prompt = [100 + (i * 7919) % 20000 for i in range(1000)]  # 1000 tokens: 63 blocks of 16
        res = {}
        t = threading.Thread(target=lambda: res.update(
            u.stream(c.port, "completions", {"prompt": prompt, "max_tokens": 8}, timeout=60 * S)), daemon=True)
        t.start()
        # The decode worker reserves the prompt's blocks, then the prefill worker pushes into them layer by layer.
        # The moment the reservation shows, p0 is frozen (SIGSTOP) so the kill lands mid-handoff however fast this
        # CPU prefills: left running, p0 finished the prompt before the router's /metrics could show the blocks.
        p0 = c.node.child_pid("p0")

        def reserved():
            s = u.worker_stats(ports["d0"])
            if s["free_blocks"] >= free0:
                return None
            os.kill(p0, signal.SIGSTOP)
            return s

        st = wait_until(reserved, 20 * S)
        self.assertIsNotNone(st, "the decode worker never reserved blocks")
        self.assertGreaterEqual(free0 - st["free_blocks"], 63, st)
        time.sleep(0.3)
        st = u.worker_stats(ports["d0"])
        self.assertEqual((st["running"], st["waiting"]), (0, 1), "the handoff should still be in progress: %r" % st)
        used = wait_until(lambda: u.metrics(c.port)["dserve:kv_cache_usage_perc"], 3 * S)
        self.assertGreater(used, 0, "the router's /metrics never showed the reserved blocks")

        t_kill = time.time()
        os.kill(p0, signal.SIGKILL)
        freed = wait_until(lambda: u.worker_stats(ports["d0"])["free_blocks"] == free0, 3 * S)
        self.assertTrue(freed, "the decode worker kept the reserved blocks: %r" % u.worker_stats(ports["d0"]))
        self.assertLess(time.time() - t_kill, 3 * S)
        # The router's /metrics (stats every second) shows the KV cache empty again.
        self.assertTrue(wait_until(lambda: u.metrics(c.port)["dserve:kv_cache_usage_perc"] == 0, 4 * S),
                        u.metrics(c.port)["dserve:kv_cache_usage_perc"])
        t.join(20 * S)
        self.assertIsNotNone(res.get("error"), res)
        self.assertEqual(res["error"].get("code"), "worker_failure", res["error"])
        st = u.worker_stats(ports["d0"])
        self.assertEqual((st["running"], st["waiting"], st["free_blocks"]), (0, 0, free0), st)

        # After the launcher restarts p0, the same prompt goes through.
        c.node.wait_for("p0 is up again", 30 * S)
        c.node.wait_count("router: worker p0 (prefill, ", 2, 30 * S)
        r = u.complete(c.port, "completions", {"prompt": prompt, "max_tokens": 8}, timeout=60 * S)
        self.assertEqual(r["status"], 200, r)
        self.assertEqual(r["completion_tokens"], 8)


if __name__ == "__main__":
    unittest.main()
