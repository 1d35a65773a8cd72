"""tests/timeouts/test_timeouts.py: each timeout docs/reliability.md and docs/protocol.md promise, forced by config values with real processes.

Cases ("Timeouts and what each failure frees"): the decode worker's KV-arrival bound (handoff_timeout_ms, from the
prefill worker's kv_started; the queue bound before it; the block hold after its kv_fail), the
prefill worker's block-table bound (table_timeout_ms), the request deadline (router.request_timeout_ms) while the
request runs and while it waits in the router's queue, a queued request whose client left (499), and a worker's
SIGTERM drain bound (drain_timeout_s).

Every case asserts the error (status and code), when it came (not before the configured bound, at most SLACK_S after
it), and that the worker that held the request has every KV block free and nothing running or waiting afterwards.
Waits and bounds scale by DSERVE_TIMEOUT_SCALE (the sanitize build: 4; its workers also multiply handoff_timeout_ms
and table_timeout_ms by 4, while request_timeout_ms and drain_timeout_s are scaled here, in the config)."""

import http.client
import json
import signal
import socket
import sys
import threading
import time
import unittest

import tmo_util as t
from tmo_util import u

SCALE = t.SCALE
PROMPT = list(range(300, 308))  # 8 token ids: the decode worker's KV bound is handoff_timeout_ms + 8 x 50 ms
HANDOFF_MS = 400                # workers[d0].handoff_timeout_ms (the worker scales it)
TABLE_MS = 500                  # workers[p0].table_timeout_ms (the worker scales it)
DEADLINE_MS = int(1500 * SCALE)  # router.request_timeout_ms (not scaled by the router: scaled here)
DRAIN_S = int(2 * SCALE)        # workers[w0].drain_timeout_s
LONG = 2000                     # max_tokens of a generation that outlives every bound above (ignore_eos)
SHORT = 16                      # max_tokens of a stream well within DRAIN_S (about 0.4 s on 2 loaded cores)
NO_DEAD_LINK = {"link_dead_ms": 600000}  # the router never gives up on a stopped worker during a case


def body(max_tokens, **kw):
    return dict({"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}, **kw)


def error_of(status, b):
    """The OpenAI error object of a non-200 JSON reply (an AssertionError when it is none)."""
    if not (isinstance(b, dict) and isinstance(b.get("error"), dict)):
        raise AssertionError("HTTP %s without an OpenAI error object: %r" % (status, b))
    return b["error"]


class StreamThread:
    """u.stream in a thread; .first is set once its first event has come, .res is its result once it ended."""

    def __init__(self, port, b, timeout):
        self.first = threading.Event()
        self.hang_up = False  # set: the client hangs up at its next event (the router cancels the request)
        self.res = None
        self.t = threading.Thread(target=self._run, args=(port, b, timeout), daemon=True)
        self.t.start()

    def _run(self, port, b, timeout):
        def on_event(k, o):
            self.first.set()
            return self.hang_up
        self.res = u.stream(port, "completions", b, timeout=timeout, on_event=on_event)

    def join(self, timeout):
        self.t.join(timeout)
        return self.res


class Timeouts(unittest.TestCase):
    def setUp(self):
        u.require_env(self)

    def cluster(self, tag, workers, router=None, start=True):
        c = self.c = t.Cluster(tag, workers, router)
        self.addCleanup(c.close)
        if start:
            c.start()
        return c

    def logs(self):
        return self.c.logs()

    def assert_idle(self, name, timeout=5.0 * SCALE):
        st = self.c.wait_idle(name, timeout)
        self.assertTrue(isinstance(st, dict) and t.is_idle(st),
                        "%s did not free everything within %.0f s: %r\n%s" % (name, timeout, st, self.logs()))
        return st

    def assert_when(self, dt, bound, what):
        """dt (seconds from our send) is not before bound and at most SLACK_S after it."""
        print("%s: after %.2f s (bound %.2f s)" % (what, dt, bound), file=sys.stderr)
        self.assertGreaterEqual(dt, bound - t.EARLY_S, "%s came after %.2f s: before its bound %.2f s\n%s"
                                % (what, dt, bound, self.logs()))
        self.assertLessEqual(dt, bound + t.SLACK_S, "%s came after %.2f s: bound %.2f s + %.1f s\n%s"
                             % (what, dt, bound, t.SLACK_S, self.logs()))

    # ---- (a) the decode worker's KV-arrival bound ----

    def test_handoff_timeout_frees_decode_blocks(self):
        """The decode worker's KV-arrival timer starts at the prefill worker's kv_started: a prefill worker (a fake:
        this test, connected to d0 as p0) that sends kv_started and then nothing gets the request failed with `timeout`
        handoff_timeout_ms + 50 ms per prompt token after its kv_started, and a `kv_fail` for it. d0 keeps the
        blocks reserved (the prefill worker may hold the table and still write) until it answers `kv_freed`, or at
        most min(handoff_timeout_ms, 5 s). Before kv_started, a request without a deadline waits 10 x
        handoff_timeout_ms (one with a deadline: until its deadline)."""
        c = self.cluster("handoff", [{"name": "p0", "role": "prefill"},
                                     {"name": "d0", "role": "decode", "handoff_timeout_ms": HANDOFF_MS}], start=False)
        c.start(["d0"])
        rd = t.connect(c.wport("d0"), c.secret, name="router")
        self.addCleanup(rd.close)
        fp = t.connect(c.wport("d0"), c.secret, role="prefill", name="p0")
        self.addCleanup(fp.close)

        def generate(id, deadline=600000):
            g = {"op": "generate", "id": id, "prompt": PROMPT, "max_tokens": 4, "sampling": {"temperature": 0},
                 "stop": [], "stop_ids": [], "ignore_eos": True, "mode": "decode", "prefill": "p0"}
            if deadline:
                g["deadline_ms"] = deadline
            return g

        def held():
            st = c.stats("d0")
            return st["running"] == 0 and st["waiting"] == 0 and st["free_blocks"] < st["total_blocks"]

        bound = (HANDOFF_MS * SCALE + 50 * len(PROMPT)) / 1000.0
        hold = HANDOFF_MS * SCALE / 1000.0
        for answer in (True, False):
            id = "tmo-handoff-%d" % answer
            rd.send(generate(id))
            self.assertEqual(fp.recv_op({"kv_table"}, 5 * SCALE).get("id"), id)
            time.sleep(2 * bound)  # queued at the prefill worker longer than the bound: no timeout before kv_started
            t0 = time.time()
            fp.send({"op": "kv_started", "id": id})
            m = rd.recv_op({"error", "token", "done"}, bound + t.SLACK_S)
            dt = time.time() - t0
            self.assertEqual((m.get("op"), m.get("id"), m.get("code")), ("error", id, "timeout"),
                             "%r\n%s" % (m, self.logs()))
            self.assertIn("KV did not arrive", m.get("message", ""), m)  # not the client's deadline
            self.assert_when(dt, bound, "the handoff timeout after kv_started")
            f = fp.recv_op({"kv_fail"}, 1.0 * SCALE)
            self.assertEqual(f.get("id"), id, f)
            t1 = time.time()
            self.assertTrue(held(), "d0 did not hold the blocks the prefill worker may still write\n" + self.logs())
            if answer:
                fp.send({"op": "kv_freed", "id": id})
                self.assert_idle("d0", 1.0 * SCALE)
                print("kv_freed to free: %.3f s" % (time.time() - t1), file=sys.stderr)
            else:  # no answer: released after min(handoff_timeout_ms, 5 s) (KV_HOLD_MS)
                st = c.wait_idle("d0", hold + t.SLACK_S)
                self.assertTrue(isinstance(st, dict) and t.is_idle(st), "%r\n%s" % (st, self.logs()))
                self.assert_when(time.time() - t1, hold, "the hold bound")
        # No kv_started and no deadline: the queue bound, 10 x handoff_timeout_ms.
        qbound = 10 * HANDOFF_MS * SCALE / 1000.0
        t0 = time.time()
        rd.send(generate("tmo-handoff-q", deadline=0))
        m = rd.recv_op({"error", "token", "done"}, qbound + t.SLACK_S)
        self.assertEqual((m.get("id"), m.get("code")), ("tmo-handoff-q", "timeout"), "%r\n%s" % (m, self.logs()))
        self.assert_when(time.time() - t0, qbound, "the handoff timeout before kv_started")
        self.assertEqual(fp.recv_op({"kv_fail"}, 1.0 * SCALE).get("id"), "tmo-handoff-q")
        fp.send({"op": "kv_freed", "id": "tmo-handoff-q"})
        self.assert_idle("d0", 1.0 * SCALE)

    # ---- (b) the prefill worker's block-table bound ----

    def test_table_timeout_fails_to_router_and_decode(self):
        """A prefill worker whose decode worker never sends the block table (a fake decode worker that accepts the
        control connection and sends nothing) gives up after table_timeout_ms: `kv_fail` to the decode worker,
        `error` (worker_failure) to the router, every block free. The same request to a real decode worker succeeds.
        This test is the router (a control connection to each worker)."""
        c = self.cluster("table", [{"name": "p0", "role": "prefill", "table_timeout_ms": TABLE_MS},
                                   {"name": "d0", "role": "decode"},   # the fake: nothing runs this config entry
                                   {"name": "d1", "role": "decode"}], start=False)
        c.start(["p0", "d1"])
        rd = t.connect(c.wport("d1"), c.secret, name="router")
        self.addCleanup(rd.close)
        # The fake d0 answers hello with d1's hello_ok (its KV layout and kvxfer metadata load fine in p0).
        fake = t.FakeWorker(c.wport("d0"), dict(rd.hello, name="d0"), c.secret)
        self.addCleanup(fake.close)
        rp = t.connect(c.wport("p0"), c.secret, name="router")
        self.addCleanup(rp.close)

        def generate(id, mode, **peer):
            return dict({"op": "generate", "id": id, "prompt": PROMPT, "max_tokens": 4,
                         "sampling": {"temperature": 0, "logprobs": -1}, "stop": [], "stop_ids": [],
                         "ignore_eos": True, "deadline_ms": 600000, "mode": mode}, **peer)
        bound = TABLE_MS * SCALE / 1000.0
        t0 = time.time()
        rp.send(generate("tmo-table-0", "prefill", decode="d0"))
        m = rp.recv_op({"error", "token", "done"}, bound + t.SLACK_S)
        dt = time.time() - t0
        self.assertEqual((m.get("op"), m.get("id"), m.get("code")), ("error", "tmo-table-0", "worker_failure"),
                         "%r\n%s" % (m, self.logs()))
        self.assertIn("decode worker d0 never sent its block table", m.get("message", ""))
        self.assert_when(dt, bound, "the table timeout")
        self.assertIn(("prefill", "p0"), fake.peers, "p0 never connected to the fake decode worker d0")
        fails = u.wait_until(lambda: fake.received("kv_fail"), 2.0 * SCALE)
        self.assertEqual([f.get("id") for f in fails], ["tmo-table-0"], "kv_fail to d0: %r" % fake.msgs)
        self.assertEqual(fake.received("kv_first"), [])
        self.assert_idle("p0", 1.0 * SCALE)
        # The control: with a decode worker that sends its table the same request is served.
        rd.send(generate("tmo-table-1", "decode", prefill="p0"))
        rp.send(generate("tmo-table-1", "prefill", decode="d1"))
        m = rd.recv_op({"error", "done"}, 60 * SCALE)
        self.assertEqual((m.get("op"), m.get("completion_tokens")), ("done", 4), "%r\n%s" % (m, self.logs()))
        self.assert_idle("p0")
        self.assert_idle("d1")

    # ---- (c) the request deadline while the request runs ----

    def test_request_deadline_running(self):
        """router.request_timeout_ms small and a long generation: 504 `timeout` (an SSE `error` event for a stream)
        at the deadline, and the worker frees the sequences."""
        c = self.cluster("deadline", [{"name": "w0", "role": "both"}], {"request_timeout_ms": DEADLINE_MS})
        bound = DEADLINE_MS / 1000.0
        t0 = time.time()
        s = StreamThread(c.port, body(LONG), bound + t.SLACK_S + 10)
        st, b = u.post(c.port, "/v1/completions", body(LONG), timeout=bound + t.SLACK_S + 10)
        dt = time.time() - t0
        e = error_of(st, b)
        self.assertEqual((st, e.get("code"), e.get("type")), (504, "timeout", "server_error"),
                         "%r\n%s" % (b, self.logs()))
        self.assert_when(dt, bound, "the deadline (non-streaming)")
        r = s.join(bound + t.SLACK_S + 10)
        self.assertIsNotNone(r, "the stream did not end")
        self.assertEqual(r["status"], 200, r)
        self.assertGreater(r["events"], 1, "the stream had no token before its deadline: %r" % r)
        self.assertTrue(isinstance(r["error"], dict) and r["error"].get("code") == "timeout", r)
        self.assertTrue(r["done"], "no [DONE] after the error event: %r" % r)
        self.assertLess(r["events"], LONG, "the generation was not cut short")  # events: one per token, + the error
        self.assert_when(r["t_error"] - t0, bound, "the deadline (stream)")
        self.assert_idle("w0", 1.0 * SCALE)

    # ---- (d) the request deadline while the request waits in the router's queue ----

    def test_request_deadline_queued(self):
        """max_seqs 1 and the worker SIGSTOPped while it runs request A, so A's slot stays taken; request B waits in
        the router's queue past router.request_timeout_ms and is removed then with the documented error (499/503)
        without ever reaching a worker."""
        c = self.cluster("queued", [{"name": "w0", "role": "both", "max_seqs": 1}],
                         dict(NO_DEAD_LINK, request_timeout_ms=DEADLINE_MS))
        w0 = c.procs["w0"]
        a = StreamThread(c.port, body(LONG), 60 * SCALE)
        self.assertTrue(a.first.wait(30 * SCALE), "stream A never started: %r" % (a.res,))
        w0.signal(signal.SIGSTOP)
        self.addCleanup(w0.signal, signal.SIGCONT)
        m0 = u.metrics(c.port)
        bound = DEADLINE_MS / 1000.0
        t0 = time.time()
        res = {}

        def b_request():
            try:
                res["r"] = u.post(c.port, "/v1/completions", body(4), timeout=bound + t.SLACK_S + 10)
            except (OSError, http.client.HTTPException) as ex:
                res["r"] = ex
            res["t"] = time.time()
        th = threading.Thread(target=b_request, daemon=True)
        th.start()
        self.assertTrue(u.wait_until(lambda: u.metrics(c.port)["dserve:num_requests_waiting"] == 1, 2 * SCALE),
                        "request B was not queued")
        th.join(bound + t.SLACK_S + 10)
        self.assertIn("r", res, "request B did not end")
        self.assertTrue(u.wait_until(lambda: u.metrics(c.port)["dserve:num_requests_waiting"] == 0, 1 * SCALE))
        m1 = u.metrics(c.port)
        # Never admitted (the queue-time histogram counts admissions), never sent to a worker, counted as failed.
        self.assertEqual(m1["dserve:request_queue_time_seconds_count"], m0["dserve:request_queue_time_seconds_count"])
        self.assertEqual(m1["dserve:prompt_tokens_total"], m0["dserve:prompt_tokens_total"])
        self.assertEqual(m1["dserve:request_failure_total"], m0["dserve:request_failure_total"] + 1)
        self.assert_when(res["t"] - t0, bound, "the queued request's end")
        r = res["r"]
        self.assertNotIsInstance(r, Exception, "request B's connection was dropped without an HTTP answer (%r); "
                                 "docs/reliability.md: a queued request past its deadline gets 499/503" % (r,))
        st, b = r
        e = error_of(st, b)
        self.assertIn((st, e.get("code")), [(499, "cancelled"), (503, "shutting_down"), (504, "timeout")], b)
        # A is released once the worker resumes (it is past its deadline too); the worker ends idle.
        w0.signal(signal.SIGCONT)
        self.assertIsNotNone(a.join(t.SLACK_S + 10), "stream A did not end")
        self.assert_idle("w0")

    # ---- (e) a queued request whose client left ----

    def test_queued_client_gone(self):
        """max_seqs 1, a long stream A running; request B waits in the router's queue and its client disconnects: the
        router removes it (499 `cancelled`: counted in dserve:request_failure_total), it never reaches the worker, and
        A runs on."""
        c = self.cluster("gone", [{"name": "w0", "role": "both", "max_seqs": 1}], {})
        a = StreamThread(c.port, body(LONG), 60 * SCALE)
        self.assertTrue(a.first.wait(30 * SCALE), "stream A never started: %r" % (a.res,))
        m0 = u.metrics(c.port)
        fin0 = c.stats("w0")["finished"]
        data = json.dumps(body(4)).encode()
        s = socket.create_connection((t.HOST, c.port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        self.assertTrue(u.wait_until(lambda: u.metrics(c.port)["dserve:num_requests_waiting"] == 1, 2 * SCALE),
                        "request B was not queued")
        s.close()
        t0 = time.time()
        self.assertTrue(u.wait_until(lambda: u.metrics(c.port)["dserve:num_requests_waiting"] == 0, 2 * SCALE),
                        "the router kept the queued request of a client that left")
        m1 = u.metrics(c.port)
        print("queued request removed %.2f s after its client left" % (time.time() - t0))
        self.assertEqual(m1["dserve:request_failure_total"], m0["dserve:request_failure_total"] + 1)
        self.assertEqual(m1["dserve:request_queue_time_seconds_count"], m0["dserve:request_queue_time_seconds_count"])
        self.assertEqual(m1["dserve:prompt_tokens_total"], m0["dserve:prompt_tokens_total"])
        st = c.stats("w0")
        self.assertEqual((st["running"], st["waiting"], st["finished"]), (1, 0, fin0), st)  # only A, still running
        self.assertIsNone(a.res, "stream A ended: %r" % (a.res,))
        # A's client hangs up too: the router cancels it and the worker frees it.
        a.hang_up = True
        self.assertIsNotNone(a.join(10 * SCALE), "stream A did not end")
        self.assert_idle("w0")

    # ---- (f) a worker's SIGTERM drain bound ----

    def test_worker_drain_bound(self):
        """drain_timeout_s small, a long and a short stream on a `both` worker at SIGTERM: a new request gets 503
        (`no_worker`), the short stream finishes, the long one gets an SSE `error` (`unavailable`) at the bound, and the
        worker exits 0. (router.migration_wait_ms 0: with no other worker, what w0 refuses or gives up fails at once
        instead of waiting for a restart; tests/fault moves drained streams to another worker.)"""
        c = self.cluster("drain", [{"name": "w0", "role": "both", "drain_timeout_s": DRAIN_S}], {"migration_wait_ms": 0})
        w0 = c.procs["w0"]
        long_s = StreamThread(c.port, body(LONG), 60 * SCALE)
        short_s = StreamThread(c.port, body(SHORT), 60 * SCALE)
        self.assertTrue(long_s.first.wait(30 * SCALE) and short_s.first.wait(30 * SCALE),
                        "the streams never started: %r %r" % (long_s.res, short_s.res))
        self.assertIsNone(short_s.res, "the short stream ended before SIGTERM; make it longer")
        t0 = time.time()
        w0.signal(signal.SIGTERM)
        self.assertTrue(u.wait_until(lambda: "draining" in w0.text(), 5 * SCALE), w0.text()[-2000:])
        st, b = u.post(c.port, "/v1/completions", body(4), timeout=30 * SCALE)
        e = error_of(st, b)
        # the router knows w0 drains (its `draining`): no_worker; in the instant before, w0 refuses it: unavailable
        self.assertIn((st, e.get("code")), ((503, "no_worker"), (503, "unavailable")), b)
        rc = w0.wait(DRAIN_S + t.SLACK_S + 5)
        t_exit = time.time()
        self.assertEqual(rc, 0, "w0 exit status %r\n%s" % (rc, self.logs()))
        self.assert_when(t_exit - t0, DRAIN_S, "w0's exit")
        r = short_s.join(10 * SCALE)
        self.assertTrue(r and r["status"] == 200 and r["error"] is None and r["done"] and
                        r["completion_tokens"] == SHORT and r["finish_reason"] == "length", "short stream: %r" % (r,))
        r = long_s.join(10 * SCALE)
        self.assertIsNotNone(r, "the long stream did not end")
        self.assertTrue(isinstance(r["error"], dict) and r["error"].get("code") == "unavailable",
                        "long stream: %r\n%s" % (r, self.logs()))
        self.assertLess(r["events"], LONG, "the generation was not cut short")  # events: one per token, + the error
        self.assert_when(r["t_error"] - t0, DRAIN_S, "the long stream's error")
        print("long stream: %d events in %.2f s" % (r["events"], r["t_error"] - r["t_events"][0]), file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
