"""tests/fault/test_kill.py: kill -9 of the prefill worker, the decode worker (1P1D and 1P2D: its streams move) and the router, under 16 streams."""

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
        self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + prefilling + queued")
        t = time.time()
        f.signal_role(c, "d0", signal.SIGKILL)
        # Every admitted request was on d0 (the only decode worker): its streams wait for the launcher's restart
        # (router.migration_wait_ms) and continue there; p0 drops the handoffs to the dead worker.
        ok, err = self.check_streams(load, t)
        self.assertEqual(err, [], "streams failed although d0 came back: %r\n%s" % ([load.res[i] for i in err], self.logs()))
        c.node.wait_for("d0 is up again", 30)
        self.check_moves(c, load, t, "d0", ("d0",))
        self.check_idle(c, ["p0", "d0"])
        self.check_serves(c)

    def test_kill_decode_1p2d_moves_streams(self):
        # Restarts are delayed 5 s, so a move can only go to d1.
        c, load = self.start_1p2d_decoding("kill-d0-2d", backoff_ms=5000)
        ports = c.ports()
        t = time.time()
        f.signal_role(c, "d0", signal.SIGKILL)
        ok, err = self.check_streams(load, t)
        # Every stream d0 held continues on d1: those decoding from the tokens they had, the handoffs from the start.
        self.assertEqual(err, [], "streams failed although d1 was up")
        self.check_moves(c, load, t, "d0", ("d1",))
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
