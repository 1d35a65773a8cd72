"""tests/e2e/test_null_churn.py: membership churn on null workers (issue 44 item 3, scaled down for CI): a burst of
workers registering in etcd at once, then, while streams run, workers leaving (drained with SIGTERM, or killed)
and new ones joining: every stream ends with all its tokens and the text it would have had without the churn,
and each joiner is linked. Real etcd, router and worker processes; the null model needs no weights."""

import re
import signal
import threading
import time
import unittest

import e2e_util as u

S = u.SCALE
N_BURST = 12   # workers registering in one burst
N_STREAMS = 24
TOKENS = 200   # at 10 ms a step: about 2 s a stream, long enough to be running when the churn comes
BODY = {"prompt": " togo guse", "max_tokens": TOKENS}


class NullChurn(u.DiscoCluster, unittest.TestCase):
    model = "null"

    def start_worker(self, name):
        return self.worker(name, role="both", null_step_ms=10, max_seqs=8, spec="off")

    def test_burst_then_leaves_and_joins_while_streaming(self):
        # moves only on a closed link or a drain: a loaded CI machine may leave a worker silent a while
        self.start_cluster({"migration_limit": 4, "migrate_silent_ms": 0})
        ws = {"w%d" % i: self.start_worker("w%d" % i) for i in range(N_BURST)}
        for name in ws:
            self.linked(name, timeout=60, role="both")
        want = u.stream(self.port, "completions", BODY)  # the text every stream must end with
        self.assertIsNone(want["error"], want)
        self.assertEqual(want["completion_tokens"], TOKENS)

        started = threading.Event()
        streaming = set()  # the streams that have had a token
        lock = threading.Lock()

        def one():
            me = object()

            def on_event(i, obj):
                with lock:
                    streaming.add(me)
                    if len(streaming) == N_STREAMS:
                        started.set()
                return False
            return u.stream(self.port, "completions", BODY, on_event=on_event)

        results = []
        t = threading.Thread(target=lambda: results.extend(u.run_threads([one] * N_STREAMS, 120 * S)), daemon=True)
        t.start()
        self.assertTrue(started.wait(60 * S), "the streams never all started")
        # leaves: two drained, one killed; joins: three new workers, while the streams run
        ws["w0"].signal(signal.SIGTERM)
        ws["w1"].signal(signal.SIGTERM)
        ws["w2"].signal(signal.SIGKILL)
        joiners = ["j%d" % i for i in range(3)]
        for name in joiners:
            ws[name] = self.start_worker(name)
        t.join(150 * S)
        self.assertFalse(t.is_alive(), "the streams did not end")
        for name in joiners:
            self.linked(name, timeout=30, role="both")
        self.assertEqual(len(results), N_STREAMS)
        failed = [r for r in results if r is None or r["error"] or r["completion_tokens"] != TOKENS]
        self.assertEqual(failed, [], "%d of %d streams failed" % (len(failed), N_STREAMS))
        for r in results:
            self.assertEqual(r["text"], want["text"])  # a moved stream continues where it was
        # the leavers had streams, and those went on elsewhere (not a churn that missed every stream)
        moved = re.findall(r"worker (w[012]) is gone after \d+ tokens; continuing on", self.router.text())
        self.assertIn("w2", moved)
        self.assertGreaterEqual(len(moved), 2)


if __name__ == "__main__":
    unittest.main()
