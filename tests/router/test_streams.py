#!/usr/bin/env python3
"""tests/router/test_streams.py: many streams through one router (issue 44): the fake worker in step mode sends each
step's tokens as one `token_batch` message (protocol version 3) and every stream still gets exactly its own text; a client
that stops reading its stream is ended and counted (dserve:streams_ended_slow_total) while the other streams finish.

Usage: test_streams.py DSERVE_BINARY. No timed asserts: every wait is on an observable, with a generous bound.
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fake_worker  # noqa: E402
import router_proc  # noqa: E402
from test_openai import tiny_gguf  # noqa: E402 (the byte-level tiny GGUF the router tokenizes with)

DSERVE = sys.argv[1] if len(sys.argv) > 1 else "build/dserve"
ROUTER = WORKER = TMP = PORT = None
QUEUE_BYTES = 65536  # router.stream_queue_bytes: a few of the flood's 64 KiB pieces


def setUpModule():
    try:
        start()
    except BaseException:
        tearDownModule()  # (not called when setUpModule fails) no process outlives the test
        raise


def start():
    global ROUTER, WORKER, TMP, PORT
    TMP = tempfile.mkdtemp(prefix="dserve-streams-")
    tiny_gguf(os.path.join(TMP, "tiny.gguf"))
    env = dict(os.environ, FAKE_WORKER_RECORD=os.path.join(TMP, "generate.jsonl"), FAKE_WORKER_STEP_MS="5",
               FAKE_WORKER_BATCH="1", FAKE_WORKER_FLOOD_BYTES="65536")
    WORKER = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_worker.py"), "0", "2048"],
                              stdout=subprocess.PIPE, text=True, env=env)
    wport = int(WORKER.stdout.readline().split()[1])
    cfg = {"model": "tiny.gguf", "model_name": "tiny", "secret": fake_worker.SECRET,
           "nodes": {"local": {"host": "127.0.0.1"}},
           "router": {"node": "local", "host": "127.0.0.1", "port": 0, "queue_limit": 256,
                      "stream_queue_bytes": QUEUE_BYTES},
           "workers": [{"name": "w0", "node": "local", "role": "both", "host": "127.0.0.1", "port": wport,
                        "max_seqs": 64}]}
    with open(os.path.join(TMP, "cluster.json"), "w") as f:
        json.dump(cfg, f)
    ROUTER, base = router_proc.start_router(DSERVE, os.path.join(TMP, "cluster.json"))
    PORT = int(base.rsplit(":", 1)[1])


def tearDownModule():
    for p in (ROUTER, WORKER):
        if p:
            p.terminate()
            p.wait()


def stream(prompt, seed, max_tokens):
    """(request id, text, saw [DONE]) of a streamed completion, read to its end."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": prompt, "seed": seed,
                                                     "max_tokens": max_tokens, "stream": True}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    rid, text, done = None, "", False
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        o = json.loads(line[6:])
        rid = o["id"]
        text += "".join(ch["text"] for ch in o["choices"])
    c.close()
    return rid, text, done


def sent_to_worker(rid):
    with open(os.path.join(TMP, "generate.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m["id"] == rid + "-0":
                return m
    raise AssertionError("no generate for " + rid)


def metric(name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % PORT, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def run_streams(n, tag):
    """n concurrent streams; each checked against what the fake worker makes for its prompt and seed."""
    out = [None] * n

    def one(i):
        out[i] = stream("%s %d" % (tag, i), 100 + i, 6)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


class Streams(unittest.TestCase):
    def check(self, results):
        for rid, text, done in results:
            self.assertTrue(done, rid)
            m = sent_to_worker(rid)
            want, _, _ = fake_worker.expected(m["prompt"], m["sampling"]["seed"], 6)
            self.assertEqual(text, want, rid)

    def test_batched_steps_reach_each_stream(self):
        # 24 generations advance together: each step's 24 tokens come as one `token_batch` message
        self.check(run_streams(24, "many"))

    def test_slow_reader_ended_and_counted(self):
        before = metric("dserve:streams_ended_slow_total")
        self.assertEqual(before, 0.0)  # the series exists from the start
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it reads nothing: let little pile up
        slow.connect(("127.0.0.1", PORT))
        body = json.dumps({"model": "tiny", "prompt": "FLOOD", "max_tokens": 400, "stream": True}).encode()
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        # while it is blocked, other streams go on and finish, each with its own text
        self.check(run_streams(8, "fast"))
        deadline = time.time() + 60
        while time.time() < deadline and metric("dserve:streams_ended_slow_total") != 1.0:
            time.sleep(0.05)
        self.assertEqual(metric("dserve:streams_ended_slow_total"), 1.0)
        # its connection was closed: what it can still read ends without the trailer
        slow.settimeout(30)
        got = b""
        try:
            while True:
                b = slow.recv(65536)
                if not b:
                    break
                got += b
        except ConnectionResetError:
            pass
        slow.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
        self.assertNotIn(b"[DONE]", got)
        self.assertLess(len(got), 400 * 65536)  # not the whole flood: it was cut
        self.check(run_streams(4, "after"))  # and the router serves on


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
