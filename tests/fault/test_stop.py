"""tests/fault/test_stop.py: SIGSTOP of the decode worker (then SIGCONT) and of the prefill worker (then kill -9), SIGTERM of a decode worker, under 16 streams; the router's link_dead_ms and migrate_silent_ms bound the waits."""

import os
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
        # The router hears nothing from d0 for link_dead_ms and closes the link; with no other decode worker, d0's
        # streams wait migration_wait_ms for one, then fail (the queued ones find no decode worker: 503 no_worker).
        ok, err = self.check_streams(load, t, bound=f.STOP_MOVE_ERROR_S)
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

    def test_stop_decode_1p2d_moves_streams(self):
        c, load = self.start_1p2d_decoding("stop-d0-2d")
        t = time.time()
        pid = self.stop(c, "d0")
        # After migrate_silent_ms without a pong the router moves d0's streams to d1 (cancelling them at d0, which
        # reads the cancels when it continues); every client gets the whole answer.
        ok, err = self.check_streams(load, t)
        self.assertEqual(err, [], "streams failed although d1 was up")
        c.node.wait_for("router: worker d0 answered nothing for %d ms; moving its streams" % f.MIGRATE_SILENT_MS, 5)
        self.check_moves(c, load, t, "d0", ("d1",))
        self.check_idle(c, ["p0", "d1"])
        os.kill(pid, signal.SIGCONT)
        self.check_idle(c, ["p0", "d0", "d1"])
        self.check_serves(c)
        self.assertNotIn("restarted d0", c.node.text(), "the launcher restarted a stopped (not dead) worker")

    def test_term_decode_1p2d_moves_streams(self):
        # A rolling restart: SIGTERM to d0 mid-generation. d0 tells the router it drains; the router moves its
        # streams to d1; d0 exits once they are gone and the launcher starts it again.
        c, load = self.start_1p2d_decoding("term-d0-2d")
        t = time.time()
        f.signal_role(c, "d0", signal.SIGTERM)
        ok, err = self.check_streams(load, t)
        self.assertEqual(err, [], "streams failed although d1 was up")
        c.node.wait_for("router: worker d0 is draining; moving its streams", 5)
        self.check_moves(c, load, t, "d0", ("d1",))
        c.node.wait_for("d0 (pid ", 30)
        self.assertIn("exited with status 0", c.node.text())
        c.node.wait_for("d0 is up again", 30)
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
