"""tests/fault/test_kill.py: kill -9 of the prefill worker, the decode worker (1P1D and 1P2D, with the router's retry) and the router, under 16 streams."""

import re
import signal
import time
import unittest

import fault_util as f
from fault_util import u


class KillPrefill(f.FaultCase):
    def test_kill_prefill_mid_prefill(self):
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode")], "kill-p0")
        load = f.Load(c.port)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + prefilling + queued")
        t = time.time()
        f.signal_role(c, "p0", signal.SIGKILL)
        # The streams that were decoding hold all their KV on d0: they finish with the reference answer. The requests
        # in p0 fail at once (worker_failure); the queued ones are prefilled on d0 itself or on the restarted p0.
        ok, err = self.check_streams(load, t, must_ok=m["streaming"])
        self.assertGreaterEqual(len(err), 1, "p0 held %r requests, none failed" % m["p0"])
        c.node.wait_for("p0 (pid ", 5)
        c.node.wait_for("p0 is up again", 30)
        self.assertIn("was killed by signal 9", c.node.text())
        self.check_idle(c, ["p0", "d0"])
        self.check_serves(c)


class KillDecode(f.FaultCase):
    def test_kill_decode_1p1d(self):
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode")], "kill-d0")
        load = f.Load(c.port)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + prefilling + queued")
        t = time.time()
        f.signal_role(c, "d0", signal.SIGKILL)
        midway = load.midway()
        # Every admitted request was on d0 (the only decode worker): an error event for those that streamed, 503 or
        # an answer (after the restart) for the rest; p0 drops the handoffs to the dead worker.
        ok, err = self.check_streams(load, t)
        for i in midway:
            self.assertIn(i, err, "stream %d was decoding on the killed worker but did not fail" % i)
        c.node.wait_for("d0 is up again", 30)
        self.check_idle(c, ["p0", "d0"])
        self.check_serves(c)

    def test_kill_decode_1p2d_retries_before_first_token(self):
        # Restarts are delayed 5 s, so a retry can only go to d1.
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode", max_seqs=4), f.worker("d1", "decode", max_seqs=4)],
                       "kill-d0-2d", backoff_ms=5000)
        ports = c.ports()
        load = f.Load(c.port)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load, "d0"), "d0 decoding and receiving a handoff")
        t = time.time()
        f.signal_role(c, "d0", signal.SIGKILL)
        ok, err = self.check_streams(load, t)
        # Only requests d0 held can fail; the handoffs to d0 (no token streamed yet) went to d1 instead.
        held = m["d0"]["running"] + m["d0"]["waiting"]
        self.assertLessEqual(len(err), held, "more streams failed than d0 held (%r)" % m["d0"])
        self.assertGreaterEqual(len(ok), f.N_STREAMS - held)
        retried = re.findall(r"(\S+)-0: worker d0 went away before the first token; retrying on d1", c.node.text())
        self.assertGreaterEqual(len(retried), 1, "the router retried none of d0's handoffs:\n" + c.node.text()[-3000:])
        for rid in retried:  # each retried request is a client's stream, and it got the whole reference answer
            self.assertIn(rid, load.ids, "retried %s is no client's stream" % rid)
            self.assertIn(load.ids.index(rid), ok, "retried %s did not finish correctly" % rid)
        self.check_idle(c, ["p0", "d1"])
        c.node.wait_for("d0 is up again", 30)
        c.node.wait_count("router: worker d0 (decode, ", 2, 30)
        self.check_idle(c, ["p0", "d0", "d1"])
        self.check_serves(c)
        self.assertGreater(u.worker_stats(ports["d1"])["finished"], 0)


class KillRouter(f.FaultCase):
    def test_kill_router(self):
        c = self.start([f.worker("p0", "prefill"), f.worker("d0", "decode")], "kill-router")
        load = f.Load(c.port)
        self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + prefilling + queued")
        t = time.time()
        f.signal_role(c, "router", signal.SIGKILL)
        midway = load.midway()
        # No OpenAI error is possible: every client sees its connection drop, at once.
        ok, err = self.check_streams(load, t, conn_ok=True)
        self.assertEqual(set(ok) & set(midway), set(), "a stream finished although the router was killed mid-run")
        # The workers drop what the dead router had routed and free its blocks; the launcher restarts the router.
        c.node.wait_for("router is up again", 30)
        self.check_idle(c, ["p0", "d0"])
        u.wait_workers(c.port, 30)
        self.check_serves(c)


if __name__ == "__main__":
    unittest.main()
