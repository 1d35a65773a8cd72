#!/usr/bin/env python3
"""tests/router/test_drain.py: SIGTERM drain of `dserve router` against a slow fake worker (stdlib HTTP only).

Usage: test_drain.py DSERVE_BINARY. Each case starts tests/router/fake_worker.py with a per-token delay and a router
with a given `drain_timeout_s`, opens a streaming request, SIGTERMs the router once the first token arrived, and
checks: the running stream still completes (within the bound) or, past the bound, ends with an SSE error event; a new request during the
drain gets 503 with an OpenAI error (code shutting_down) and /health says draining; the router exits 0 within the
bound plus slack.
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fake_worker  # noqa: E402
from test_openai import tiny_gguf  # noqa: E402

DSERVE = None
SLACK = float(os.environ.get("DSERVE_TIMEOUT_SCALE", "1")) * 10  # seconds allowed beyond the drain bound


class Cluster:
    """A fake worker (delay s per token) and a router with drain_timeout_s = drain."""

    def __init__(self, tmp, delay, drain):
        tiny_gguf(os.path.join(tmp, "tiny.gguf"))
        self.worker = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_worker.py"), "0", "512", str(delay)],
                                       stdout=subprocess.PIPE, text=True)
        wport = int(self.worker.stdout.readline().split()[1])
        cfg = {"model": "tiny.gguf", "secret": fake_worker.SECRET, "router": {"port": 0, "drain_timeout_s": drain},
               "workers": [{"name": "w0", "role": "both", "port": wport}]}
        path = os.path.join(tmp, "cluster.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self.log = []
        self.router = subprocess.Popen([DSERVE, "router", "--config", path], stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.time() + 30 + SLACK
        while time.time() < deadline and port is None:
            line = self.router.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        if port is None:
            self.close()
            raise RuntimeError("the router did not start: %s" % "".join(self.log))
        threading.Thread(target=lambda: self.log.extend(self.router.stderr), daemon=True).start()
        self.port = port
        while time.time() < deadline:
            if self.get("/health")[0] == 200:
                return
            time.sleep(0.05)
        self.close()
        raise RuntimeError("the router never became healthy")

    def get(self, path):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            c.request("GET", path)
            r = c.getresponse()
            out = (r.status, r.read())
            c.close()
            return out
        except OSError:
            return (0, b"")

    def post(self, body, path="/v1/completions"):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return c, c.getresponse()

    def close(self):
        for p in (self.router, self.worker):
            if p.poll() is None:
                p.kill()
            p.wait()
        self.worker.stdout.close()
        self.router.stderr.close()


def read_events(resp, events):
    """Appends each SSE data payload of resp to events until the stream ends."""
    try:
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
    except (OSError, http.client.HTTPException):
        events.append("<cut>")


class DrainTest(unittest.TestCase):
    def run_case(self, delay, drain):
        """Starts a stream, SIGTERMs the router after its first token; returns (events, exit code, seconds to exit,
        the refused request's status and body, /health status during the drain, the prompt's token ids)."""
        tmp = tempfile.mkdtemp(prefix="dserve-drain-")
        self.addCleanup(shutil.rmtree, tmp, True)
        cl = Cluster(tmp, delay, drain)
        try:
            c0, r0 = cl.post({"prompt": "drain me"}, "/tokenize")
            ids = json.loads(r0.read())["tokens"]
            c0.close()
            conn, resp = cl.post({"model": "tiny", "prompt": "drain me", "max_tokens": 8, "stream": True, "seed": 5})
            self.assertEqual(resp.status, 200)
            events = []
            first = resp.readline()  # the first data line: a token has been relayed
            self.assertTrue(first.startswith(b"data: "), first)
            events.append(first.decode().strip()[6:])
            reader = threading.Thread(target=read_events, args=(resp, events))
            reader.start()
            t0 = time.time()
            cl.router.send_signal(signal.SIGTERM)
            # the router has taken the signal once /health says so (it is 200 until the drain starts)
            health = cl.get("/health")[0]
            deadline = time.monotonic() + SLACK
            while health == 200 and time.monotonic() < deadline:
                time.sleep(0.02)
                health = cl.get("/health")[0]
            c2, r2 = cl.post({"model": "tiny", "prompt": "too late", "max_tokens": 2})
            refused = (r2.status, r2.read())
            c2.close()
            rc = cl.router.wait(timeout=drain + SLACK)
            took = time.time() - t0
            reader.join(timeout=SLACK)
            self.assertFalse(reader.is_alive(), "the stream never ended")
            conn.close()
            return events, rc, took, refused, health, ids
        finally:
            cl.close()

    def check_refused(self, refused, health):
        status, body = refused
        self.assertEqual(status, 503, body)
        err = json.loads(body)["error"]
        self.assertEqual(err["code"], "shutting_down")
        self.assertIn("message", err)
        self.assertEqual(health, 503)

    def test_running_stream_finishes_new_request_refused(self):
        delay = 0.4  # 8 tokens: about 3 s of stream, well inside the 30 s bound
        events, rc, took, refused, health, ids = self.run_case(delay, 30)
        self.assertEqual(rc, 0)
        self.check_refused(refused, health)
        self.assertEqual(events[-1], "[DONE]", events)
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        want, finish, n = fake_worker.expected(ids, 5, 8)
        self.assertEqual(text, want)  # every token arrived
        self.assertEqual(json.loads(events[-2])["choices"][0]["finish_reason"], finish)
        self.assertLess(took, 30 + SLACK)

    def test_drain_bound_cuts_a_stream_that_runs_too_long(self):
        delay = 3.0  # 8 tokens: 24 s of stream against a 1 s bound
        events, rc, took, refused, health, _ = self.run_case(delay, 1)
        self.assertEqual(rc, 0)
        self.check_refused(refused, health)
        self.assertLess(took, 1 + SLACK)
        self.assertLess(len(events), 9, events)  # not every token arrived
        self.assertEqual(events[-1], "[DONE]", events)  # the cut stream still ends with an OpenAI error event
        self.assertEqual(json.loads(events[-2])["error"]["code"], "shutting_down", events)


if __name__ == "__main__":
    DSERVE = sys.argv.pop(1)
    unittest.main(verbosity=2)
