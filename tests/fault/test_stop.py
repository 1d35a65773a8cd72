"""tests/fault/test_stop.py: SIGSTOP of the decode worker (then SIGCONT) and of the prefill worker (then kill -9) under 16 streams; the router's link_dead_ms bounds the wait."""

import os
import re
import signal
import time
import unittest

import fault_util as f
from fault_util import u


class StopWorker(f.FaultCase):
    def stop(self, c, name):
        pid = f.signal_role(c, name, signal.SIGSTOP)
        self.addCleanup(lambda: os.kill(pid, signal.SIGCONT) if u._cmdline(pid) else None)
        return pid

    def test_stop_decode_then_continue(self):
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode")], "stop-d0")
        load = f.Load(c.port)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + prefilling + queued")
        t = time.time()
        pid = self.stop(c, "d0")
        midway = load.midway()
        # The router hears nothing from d0 for link_dead_ms, closes the link and fails every request on it at once
        # (the queued ones then find no decode worker: 503 no_worker).
        ok, err = self.check_streams(load, t, bound=f.STOP_ERROR_S)
        for i in midway:
            self.assertIn(i, err, "stream %d was decoding on the stopped worker but did not fail" % i)
        self.assertTrue(err)
        self.assertGreaterEqual(min(f.end_time(load.res[i]) for i in err) - t, f.LINK_DEAD_MS / 1000.0 - 1.5,  # stats go every 1 s
                                "a request failed before the link_dead_ms timeout")
        c.node.wait_for("router: worker d0 answered nothing for %d ms; closing its link" % f.LINK_DEAD_MS, 5)
        # p0 dropped the handoffs (the router cancelled them); d0, continued, drops what the closed link had routed.
        self.check_idle(c, ["p0"])
        os.kill(pid, signal.SIGCONT)
        c.node.wait_count("router: worker d0 (decode, ", 2, 30)
        self.check_idle(c, ["p0", "d0"])
        self.check_serves(c)
        self.assertNotIn("restarted d0", c.node.text(), "the launcher restarted a stopped (not dead) worker")

    def test_stop_decode_1p2d_retries(self):
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode", max_seqs=4), f.worker("d1", "decode", max_seqs=4)],
                       "stop-d0-2d")
        load = f.Load(c.port)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load, "d0"), "d0 decoding and receiving a handoff")
        t = time.time()
        pid = self.stop(c, "d0")
        # After link_dead_ms the router gives d0 up: d0's streams that had a token fail, its handoffs (no token yet)
        # go to d1 and their clients get the whole answer.
        ok, err = self.check_streams(load, t, bound=f.STOP_ERROR_S)
        held = m["d0"]["running"] + m["d0"]["waiting"]
        self.assertLessEqual(len(err), held, "more streams failed than d0 held (%r)" % m["d0"])
        retried = re.findall(r"(\S+)-0: worker d0 went away before the first token; retrying on d1", c.node.text())
        self.assertGreaterEqual(len(retried), 1, "the router retried none of d0's handoffs\n" + self.logs())
        for rid in retried:
            self.assertIn(rid, load.ids, "retried %s is no client's stream" % rid)
            self.assertIn(load.ids.index(rid), ok, "retried %s did not finish correctly" % rid)
        self.check_idle(c, ["p0", "d1"])
        os.kill(pid, signal.SIGCONT)
        c.node.wait_count("router: worker d0 (decode, ", 2, 30)
        self.check_idle(c, ["p0", "d0", "d1"])
        self.check_serves(c)

    def test_stop_prefill_then_kill(self):
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode")], "stop-p0")
        load = f.Load(c.port)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + prefilling + queued")
        t = time.time()
        pid = self.stop(c, "p0")
        # The decoding streams have their KV on d0: they finish. The requests in p0 fail once the router gives up on
        # it (link_dead_ms); the router cancels them at d0, which frees their reserved blocks; the queued ones are
        # then prefilled on d0 itself.
        ok, err = self.check_streams(load, t, must_ok=m["streaming"], bound=f.STOP_ERROR_S)
        self.assertGreaterEqual(len(err), 1, "p0 held %r requests, none failed" % m["p0"])
        c.node.wait_for("router: worker p0 answered nothing for %d ms; closing its link" % f.LINK_DEAD_MS, 5)
        self.check_idle(c, ["d0"])
        os.kill(pid, signal.SIGKILL)
        c.node.wait_for("p0 is up again", 30)
        c.node.wait_count("router: worker p0 (prefill, ", 2, 30)
        self.check_idle(c, ["p0", "d0"])
        self.check_serves(c)


if __name__ == "__main__":
    unittest.main()
