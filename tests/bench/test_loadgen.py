"""tests/bench/test_loadgen.py: bench/loadgen.py against a fake OpenAI server with fixed delays, plus its statistics."""

import contextlib
import io
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
LOADGEN = os.path.normpath(os.path.join(HERE, "..", "..", "bench", "loadgen.py"))
sys.path.insert(0, os.path.dirname(LOADGEN))
import loadgen  # noqa: E402


class FakeServer:
    """OpenAI-ish streaming server on 127.0.0.1:0: waits `ttft` s, then `n_tokens` chunks `gap` s apart, usage, [DONE].

    statuses: HTTP statuses handed out in turn (non-200 answers carry a JSON error body)."""

    def __init__(self, ttft=0.05, n_tokens=5, gap=0.02, statuses=(200,), chunked=True, usage=True):
        self.ttft, self.n_tokens, self.gap = ttft, n_tokens, gap
        self.statuses, self.chunked, self.usage = list(statuses), chunked, usage
        self.lock = threading.Lock()
        self.count = 0
        self.bodies = []  # received request bodies (parsed JSON), in arrival order
        self.gets = 0  # GET requests (GET /v1/models)
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if chunked else "HTTP/1.0"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def _send(self, data):
                if srv.chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                else:
                    self.wfile.write(data)
                self.wfile.flush()

            def do_GET(self):
                srv.gets += 1
                body = json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n))
                with srv.lock:
                    status = srv.statuses[srv.count % len(srv.statuses)]
                    srv.count += 1
                    srv.bodies.append(req)
                self.close_connection = True
                try:
                    if status != 200:
                        body = json.dumps({"error": {"message": "fake %d" % status}}).encode()
                        self.send_response(status)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(body)))
                        self.send_header("Connection", "close")
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    if srv.chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    chat = "messages" in req
                    time.sleep(srv.ttft)
                    for i in range(srv.n_tokens):
                        if i:
                            time.sleep(srv.gap)
                        piece = "tok%d " % i
                        choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                        self._send(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
                    if srv.usage:
                        u = {"prompt_tokens": 7, "completion_tokens": srv.n_tokens, "total_tokens": 7 + srv.n_tokens}
                        self._send(b"data: " + json.dumps({"choices": [], "usage": u}).encode() + b"\n\n")
                    self._send(b"data: [DONE]\n\n")
                    if srv.chunked:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_main(argv):
    """loadgen.main(argv) in-process -> (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = loadgen.main(argv)
    return rc, out.getvalue(), err.getvalue()


def loadgen_json(path):
    with open(path) as f:
        return json.load(f)


def free_port():
    """A loopback port with nothing listening on it (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class TestStatistics(unittest.TestCase):
    def test_percentile_hand_values(self):
        self.assertIsNone(loadgen.percentile([], 50))
        self.assertEqual(loadgen.percentile([7], 99), 7.0)
        xs = list(range(1, 11))
        self.assertAlmostEqual(loadgen.percentile(xs, 50), 5.5)
        self.assertAlmostEqual(loadgen.percentile(xs, 90), 9.1)
        self.assertAlmostEqual(loadgen.percentile(xs, 99), 9.91)
        self.assertAlmostEqual(loadgen.percentile([40, 10, 30, 20], 90), 37.0)  # unsorted input

    def fixed_results(self):
        def ok(ttft, tpot, e2e, itl, out, inp, start):
            return {"success": True, "status": "200", "ttft": ttft, "tpot": tpot, "e2e": e2e, "itl": itl,
                    "output_tokens": out, "input_tokens": inp, "start": start, "end": start + e2e,
                    "token_times": [start + ttft]}
        return [ok(0.1, 0.02, 0.5, [0.01, 0.03], 10, 5, 0.0),
                ok(0.2, 0.04, 0.9, [0.05], 20, 7, 0.1),
                ok(0.3, None, 0.3, [], 1, 3, 0.2),
                ok(0.4, 0.01, 1.4, [0.02, 0.02, 0.02], 5, 4, 0.6),
                {"success": False, "status": "500", "start": 0.3, "end": 0.35, "itl": []},
                {"success": False, "status": "conn_error", "start": 0.4, "end": 0.4, "itl": []}]

    def test_summary_hand_values(self):
        rep = loadgen.summarize(self.fixed_results(), 2.0, {"ttft": 250, "tpot": 30})
        self.assertEqual(rep["successful_requests"], 4)
        self.assertEqual(rep["failed_requests"], 2)
        self.assertEqual(rep["status_histogram"], {"200": 4, "500": 1, "conn_error": 1})
        self.assertEqual(rep["connection_errors"], 1)
        self.assertEqual(rep["total_output_tokens"], 36)
        self.assertEqual(rep["total_input_tokens"], 19)
        self.assertAlmostEqual(rep["request_throughput"], 2.0)
        self.assertAlmostEqual(rep["output_throughput"], 18.0)
        self.assertAlmostEqual(rep["total_token_throughput"], 27.5)
        t = rep["ttft_ms"]
        self.assertAlmostEqual(t["mean"], 250)
        self.assertAlmostEqual(t["median"], 250)
        self.assertAlmostEqual(t["p90"], 370)
        self.assertAlmostEqual(t["p99"], 397)
        t = rep["tpot_ms"]  # the one-token request has no TPOT
        self.assertEqual(t["count"], 3)
        self.assertAlmostEqual(t["mean"], 70 / 3)
        self.assertAlmostEqual(t["median"], 20)
        self.assertAlmostEqual(t["p90"], 36)
        self.assertAlmostEqual(t["p99"], 39.6)
        t = rep["itl_ms"]  # all ITLs of all requests pooled
        self.assertEqual(t["count"], 6)
        self.assertAlmostEqual(t["mean"], 25)
        self.assertAlmostEqual(t["median"], 20)
        self.assertAlmostEqual(t["p90"], 40)
        self.assertAlmostEqual(t["p99"], 49)
        self.assertAlmostEqual(rep["e2e_ms"]["mean"], 775)
        self.assertAlmostEqual(rep["e2e_ms"]["median"], 700)
        # only request 1 meets ttft<=250 and tpot<=30
        self.assertEqual(rep["good_requests"], 1)
        self.assertAlmostEqual(rep["goodput"], 0.5)
        self.assertEqual(rep["peak_concurrency"], 4)  # at t=0.3: requests 1, 2, 3 and the 500

    def test_goodput_variants(self):
        res = self.fixed_results()
        self.assertAlmostEqual(loadgen.summarize(res, 2.0, {"ttft": 350})["goodput"], 1.5)
        self.assertAlmostEqual(loadgen.summarize(res, 2.0, {"e2e": 600})["goodput"], 1.0)
        # a one-token request has TPOT 0 and meets any TPOT SLO
        self.assertAlmostEqual(loadgen.summarize(res, 2.0, {"tpot": 15})["goodput"], 1.0)
        self.assertIsNone(loadgen.summarize(res, 2.0, {})["goodput"])
        self.assertEqual(loadgen.parse_slo("ttft:500, tpot:50,e2e:2000"), {"ttft": 500, "tpot": 50, "e2e": 2000})
        for bad in ("ttft", "foo:1", "ttft:x", "ttft:-5"):
            with self.assertRaises(loadgen.LoadgenError):
                loadgen.parse_slo(bad)

    def test_empty_summary(self):
        rep = loadgen.summarize([], 0.0, {"ttft": 100})
        self.assertEqual(rep["successful_requests"], 0)
        self.assertIsNone(rep["ttft_ms"]["p99"])
        self.assertIn("n/a", loadgen.format_report(rep | {"notes": []}))

    def test_compare_table(self):
        def rep(gp, p99):
            return {"goodput": gp, "successful_requests": 5, "ttft_ms": {"p99": p99}}
        runs = {"llama.cpp": {0.5: rep(0.5, 200), 1.0: rep(1.0, 800), 2.0: rep(0.8, 1500), 4.0: rep(0.5, 5000)},
                "dserve": {0.5: rep(0.5, 100), 1.0: rep(1.0, 200), 2.0: rep(1.6, 300), 4.0: rep(2.0, 900)},
                "dserve-1p1d": {0.5: None, 1.0: None, 2.0: None, 4.0: None}}
        text, knee = loadgen.compare_table(runs, "llama.cpp")
        self.assertEqual(knee, 2.0)
        self.assertIn("first exceeds 1000 ms: 2 req/s", text)
        self.assertIn("dserve/llama.cpp goodput at 2 req/s: 2.00 (target >= 1.5: meets)", text)
        self.assertIn("dserve-1p1d/llama.cpp goodput at 2 req/s: n/a", text)
        row2 = [ln for ln in text.splitlines() if ln.strip().startswith("2 ")][0].split()
        self.assertEqual(row2[:7], ["2", "0.80", "1500", "1.60", "300", "2.00", "0.20"])


    def test_goodput_svg(self):
        def rep(gp):
            return {"goodput": gp, "successful_requests": 5, "ttft_ms": {"p99": 1}}
        runs = {"llama.cpp": {0.5: rep(0.5), 1.0: rep(0.9), math.inf: rep(1.2)},
                "dserve <1p1d>": {0.5: rep(0.5), 1.0: None}}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "g.svg")
            self.assertEqual(loadgen.goodput_svg(runs, path, "t"), 3)  # inf and missing reports left out
            root = ET.parse(path).getroot()  # well-formed XML, names escaped
        ns = "{http://www.w3.org/2000/svg}"
        self.assertEqual(len(root.findall(ns + "polyline")), 1)  # a line needs two points
        self.assertEqual(len(root.findall(ns + "circle")), 3)
        self.assertIn("dserve <1p1d>", [t.text for t in root.findall(ns + "text")])


class TestArrivals(unittest.TestCase):
    def stats(self, xs):
        m = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
        return m, sd / m

    def test_poisson(self):
        xs = loadgen.arrival_intervals(10.0, 1.0, 20000, random.Random(7))
        m, cv = self.stats(xs)
        self.assertAlmostEqual(m, 0.1, delta=0.003)
        self.assertAlmostEqual(cv, 1.0, delta=0.03)
        # exponential: P(gap < mean) = 1 - 1/e
        frac = sum(1 for x in xs if x < 0.1) / len(xs)
        self.assertAlmostEqual(frac, 1 - math.exp(-1), delta=0.015)
        self.assertEqual(xs, loadgen.arrival_intervals(10.0, 1.0, 20000, random.Random(7)))  # seeded

    def test_gamma_burstiness(self):
        for b in (0.25, 4.0):
            xs = loadgen.arrival_intervals(5.0, b, 20000, random.Random(3))
            m, cv = self.stats(xs)
            self.assertAlmostEqual(m, 0.2, delta=0.2 * 0.05)
            self.assertAlmostEqual(cv, 1 / math.sqrt(b), delta=0.06 / math.sqrt(b))

    def test_inf_and_bad(self):
        self.assertEqual(loadgen.arrival_intervals(float("inf"), 1.0, 3, random.Random(0)), [0.0] * 3)
        with self.assertRaises(loadgen.LoadgenError):
            loadgen.arrival_intervals(1.0, 0.0, 3, random.Random(0))

    def test_dispatch_follows_schedule(self):
        srv = FakeServer(ttft=0.0, n_tokens=1, gap=0.0)
        try:
            with tempfile.TemporaryDirectory() as d:
                js = os.path.join(d, "r.json")
                rc, _, _ = run_main(["--base-url", srv.url, "--num-requests", "30", "--request-rate", "40",
                                     "--seed", "5", "--input-len", "4", "--json-out", js, "--quiet"])
                self.assertEqual(rc, 0)
                rep = loadgen_json(js)
        finally:
            srv.close()
        gaps = loadgen.arrival_intervals(40.0, 1.0, 30, random.Random(6))  # loadgen uses seed + 1
        starts = sorted(r["start"] for r in rep["requests"])
        want = 0.0
        for i, s in enumerate(starts):
            self.assertAlmostEqual(s, want, delta=0.05, msg="request %d" % i)
            want += gaps[i]


class TestAgainstFakeServer(unittest.TestCase):
    def run_fake(self, srv, extra):
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "r.json")
            rc, out, err = run_main(["--base-url", srv.url, "--json-out", js, "--input-len", "8"] + extra)
            with open(js) as f:
                return rc, out, err, json.load(f)

    def check_timings(self, rep, n_req, usage=True):
        self.assertEqual(rep["successful_requests"], n_req)
        self.assertEqual(rep["status_histogram"], {"200": n_req})
        self.assertEqual(rep["total_output_tokens"], 5 * n_req)
        self.assertEqual(rep["total_input_tokens"], 7 * n_req if usage else 0)
        # From the fake's delays: TTFT 50 ms, 4 gaps of 20 ms, TPOT (130-50)/4 = 20 ms, E2E 130 ms. Its sleeps never
        # end early, so each figure is checked tightly from below; a loaded machine stretches them by any amount, so
        # from above only within 10x (which still catches a unit mistake: seconds or microseconds for milliseconds).
        t = rep["ttft_ms"]
        self.assertGreaterEqual(t["mean"], 49.0)
        self.assertGreaterEqual(t["median"], 49.0)
        self.assertLess(t["p99"], 50 * 10)
        i = rep["itl_ms"]
        self.assertEqual(i["count"], 4 * n_req)
        self.assertGreaterEqual(i["mean"], 15)  # a late client may read two events close together
        self.assertGreaterEqual(i["median"], 15)
        self.assertLess(i["p99"], 20 * 10)
        p = rep["tpot_ms"]
        self.assertEqual(p["count"], n_req)
        self.assertGreaterEqual(p["mean"], 19)
        self.assertLess(p["mean"], 20 * 10)
        self.assertAlmostEqual(p["mean"], i["mean"], delta=1)  # TPOT is the mean gap, whatever the load made them
        e = rep["e2e_ms"]
        self.assertGreaterEqual(e["mean"], 129)
        self.assertLess(e["p90"], 130 * 10)
        self.assertAlmostEqual(e["mean"], t["mean"] + 4 * p["mean"], delta=1)  # E2E = TTFT + 4 gaps, per request
        for r in rep["requests"]:  # TPOT = (E2E - TTFT) / (tokens - 1), exactly
            self.assertAlmostEqual(r["tpot"], (r["e2e"] - r["ttft"]) / 4, places=9)

    def test_completions_chunked_with_usage(self):
        srv = FakeServer()
        try:
            rc, out, err, rep = self.run_fake(srv, ["--num-requests", "8", "--max-concurrency", "4",
                                                    "--warmup", "2", "--slo", "ttft:1000,tpot:1000"])
        finally:
            srv.close()
        self.assertEqual(rc, 0, err)
        self.check_timings(rep, 8)
        self.assertEqual(srv.count, 10)  # 2 warm-up + 8 counted
        self.assertEqual(rep["good_requests"], 8)
        self.assertEqual(rep["peak_concurrency"], 4)
        self.assertIn("=== Serving Benchmark Result ===", out)
        self.assertIn("Successful requests:                     8", out)
        body = srv.bodies[-1]
        self.assertEqual(body["model"], "fake-model")  # from GET /v1/models
        self.assertTrue(body["stream"])
        self.assertEqual(body["stream_options"], {"include_usage": True})
        self.assertEqual(len(body["prompt"].split()), 8)

    def test_chat_close_delimited_without_usage(self):
        srv = FakeServer(chunked=False, usage=False)
        try:
            rc, out, err, rep = self.run_fake(srv, ["--endpoint", "/v1/chat/completions", "--num-requests", "4",
                                                    "--model", "m1"])
        finally:
            srv.close()
        self.assertEqual(rc, 0, err)
        self.check_timings(rep, 4, usage=False)  # tokens counted from chunks
        self.assertEqual(rep["input_tokens_unknown"], 4)
        self.assertEqual(srv.bodies[0]["model"], "m1")
        self.assertIn("usage", out)

    def test_http_errors_in_histogram(self):
        srv = FakeServer(ttft=0.0, n_tokens=2, gap=0.0, statuses=(200, 429, 500, 429))
        try:
            rc, out, err, rep = self.run_fake(srv, ["--num-requests", "8", "--max-concurrency", "2"])
        finally:
            srv.close()
        self.assertEqual(rc, 0)
        self.assertEqual(rep["status_histogram"], {"200": 2, "429": 4, "500": 2})
        self.assertEqual(rep["successful_requests"], 2)
        self.assertEqual(rep["failed_requests"], 6)
        self.assertEqual(rep["connection_errors"], 0)
        self.assertIn("200=2 429=4 500=2", out)
        self.assertTrue(any("fake 429" in (r["error"] or "") for r in rep["requests"]))

    def test_multi_turn_appends_answers(self):
        srv = FakeServer(ttft=0.0, n_tokens=3, gap=0.0)
        try:
            rc, _, err, rep = self.run_fake(srv, ["--endpoint", "/v1/chat/completions", "--dataset", "multi-turn",
                                                  "--turns", "3", "--num-requests", "6", "--request-rate", "inf"])
        finally:
            srv.close()
        self.assertEqual(rc, 0, err)
        self.assertEqual(rep["successful_requests"], 6)
        lens = sorted(len(b["messages"]) for b in srv.bodies)
        self.assertEqual(lens, [1, 1, 3, 3, 5, 5])
        last = [b for b in srv.bodies if len(b["messages"]) == 5][0]["messages"]
        self.assertEqual([m["role"] for m in last], ["user", "assistant", "user", "assistant", "user"])
        self.assertEqual(last[1]["content"], "tok0 tok1 tok2 ")

    def test_extra_body(self):
        args = loadgen.parse_args(["--extra-body", '{"response_format": {"type": "json_object"}, "top_k": 5}'])
        body = loadgen.make_payload(args, "m", [{"role": "user", "content": "hi", "_max_tokens": 4}])
        self.assertEqual(body["response_format"], {"type": "json_object"})
        self.assertEqual((body["top_k"], body["max_tokens"], body["stream"]), (5, 4, True))
        for bad in ("[1]", "{nope"):
            with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
                loadgen.parse_args(["--extra-body", bad])
            self.assertIn("--extra-body", err.getvalue())

    def test_shared_prefix_and_sharegpt(self):
        args = loadgen.parse_args(["--dataset", "shared-prefix", "--prefix-len", "20", "--suffix-len", "5",
                                   "--num-prefixes", "2"])
        items = loadgen.build_dataset(args, 6, random.Random(1))
        words = [it[0]["prompt"].split() for it in items]
        self.assertTrue(all(len(w) == 25 for w in words))
        self.assertEqual(words[0][:20], words[2][:20])
        self.assertEqual(words[1][:20], words[5][:20])
        self.assertNotEqual(words[0][:20], words[1][:20])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "sg.json")
            with open(path, "w") as f:
                json.dump([{"conversations": [{"from": "human", "value": "hello there"},
                                              {"from": "gpt", "value": "one two three four five six"}]},
                           {"conversations": [{"from": "human", "value": "only one turn"}]},
                           {"bad": 1}], f)
            items = loadgen.load_sharegpt(path, 3, random.Random(0), None)
            self.assertEqual([it[0]["prompt"] for it in items], ["hello there"] * 3)
            self.assertEqual(items[0][0]["max_tokens"], 8)  # 6 words * 4/3
            rc, _, err = run_main(["--dataset", "sharegpt", "--dataset-path", os.path.join(d, "missing.json"),
                                   "--base-url", "http://127.0.0.1:%d" % free_port(), "--model", "m"])
            self.assertEqual(rc, 1)
            self.assertIn("cannot read dataset", err)

    def test_duration_and_timeout_bounds(self):
        srv = FakeServer(ttft=0.0, n_tokens=1, gap=0.0)
        try:
            t0 = time.monotonic()
            rc, _, _, rep = self.run_fake(srv, ["--num-requests", "1000", "--request-rate", "20",
                                                "--duration", "0.5"])
            self.assertLess(time.monotonic() - t0, 5)
            self.assertEqual(rc, 0)
            self.assertLess(rep["num_requests_sent"], 40)
            self.assertGreater(rep["num_requests_sent"], 2)
        finally:
            srv.close()
        slow = FakeServer(ttft=3.0, n_tokens=1)
        try:
            t0 = time.monotonic()
            rc, _, _, rep = self.run_fake(slow, ["--num-requests", "2", "--timeout", "0.3", "--model", "m"])
            self.assertLess(time.monotonic() - t0, 2.5)
            t0 = time.monotonic()  # the hard limit on the whole run cuts off requests in flight
            rc2, out2, _, rep2 = self.run_fake(slow, ["--num-requests", "3", "--max-time", "0.4", "--model", "m"])
            self.assertLess(time.monotonic() - t0, 2.5)
        finally:
            slow.close()
        self.assertEqual(rc, 1)
        self.assertEqual(rep["status_histogram"], {"timeout": 2})
        self.assertEqual(rc2, 1)
        self.assertEqual(rep2["status_histogram"], {"timeout": 3})
        self.assertIn("--max-time limit", out2)


class TestServerDown(unittest.TestCase):
    def test_clean_error_summary(self):
        port = free_port()
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "r.json")
            p = subprocess.run([sys.executable, LOADGEN, "--base-url", "http://127.0.0.1:%d" % port, "--model", "m",
                                "--num-requests", "5", "--json-out", js], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 1)
            self.assertNotIn("Traceback", p.stderr + p.stdout)
            self.assertIn("all 5 requests failed", p.stderr)
            self.assertIn("conn_error=5", p.stdout)
            self.assertRegex(p.stdout, r"Failed requests:\s+5")
            with open(js) as f:
                rep = json.load(f)
        self.assertEqual(rep["successful_requests"], 0)
        self.assertEqual(rep["failed_requests"], 5)
        self.assertEqual(rep["connection_errors"], 5)

    def test_stops_after_consecutive_connection_errors(self):
        port = free_port()
        rc, out, err = run_main(["--base-url", "http://127.0.0.1:%d" % port, "--model", "m", "--num-requests",
                                 "200", "--request-rate", "200", "--max-conn-errors", "3"])
        self.assertEqual(rc, 1)
        self.assertIn("connection errors in a row", out)
        sent = int(out.split("Failed requests:")[1].split()[0])
        self.assertLess(sent, 200)
        self.assertGreaterEqual(sent, 3)

    def test_models_failure_stops_before_sending(self):
        """Without --model, a failed GET /v1/models ends the run with a message (no model 'default' guessed)."""
        port = free_port()
        rc, out, err = run_main(["--base-url", "http://127.0.0.1:%d/v1" % port, "--num-requests", "5"])
        self.assertEqual(rc, 1)
        self.assertIn("cannot reach http://127.0.0.1:%d/v1/models" % port, err)
        self.assertIn("--model", err)
        self.assertNotIn("Failed requests", out)  # nothing was sent

    def test_bad_arguments(self):
        for argv in (["--base-url", "ftp://x"], ["--request-rate", "-1"], ["--range-ratio", "2"]):
            rc, _, err = run_main(argv + ["--num-requests", "1"])
            self.assertNotEqual(rc, 0, argv)
            self.assertNotIn("Traceback", err)


class TestCli(unittest.TestCase):
    def test_base_url_with_or_without_v1(self):
        srv = FakeServer()
        try:
            for url in (srv.url, srv.url + "/v1", srv.url + "/v1/"):
                rc, out, err = run_main(["--base-url", url, "--num-requests", "2", "--input-len", "4", "--quiet"])
                self.assertEqual(rc, 0, url + err)
        finally:
            srv.close()
        self.assertEqual([b["model"] for b in srv.bodies], ["fake-model"] * 6)  # from GET /v1/models

    def test_help_shows_defaults(self):
        p = subprocess.run([sys.executable, LOADGEN, "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0)
        text = " ".join(p.stdout.split())
        # the default base URL is where `dserve serve` listens (its router port in cmd/cmd_serve.c)
        with open(os.path.join(HERE, "..", "..", "cmd", "cmd_serve.c"), encoding="utf-8") as f:
            serve_port = re.search(r'\\"router\\": \{[^}]*\\"port\\": (\d+)', f.read()).group(1)
        for want in ("(default: 100)", "(default: 128)", "(default: 64)",
                     "(default: http://127.0.0.1:%s)" % serve_port):
            self.assertIn(want, text)

    def test_plot_without_matplotlib_stops_before_the_run(self):
        srv = FakeServer()
        try:
            code = ("import sys; sys.modules['matplotlib'] = None; sys.path.insert(0, %r); import loadgen; "
                    "sys.exit(loadgen.main(sys.argv[1:]))" % os.path.dirname(LOADGEN))
            p = subprocess.run([sys.executable, "-c", code, "--base-url", srv.url, "--num-requests", "2",
                                "--plot", "x.png"], capture_output=True, text=True, timeout=60)
        finally:
            srv.close()
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--plot needs matplotlib", p.stderr)
        self.assertIn("scripts/setup.sh", p.stderr)
        self.assertIn(os.path.join("venv", "bin", "python"), p.stderr)
        self.assertEqual((srv.gets, len(srv.bodies)), (0, 0), "the run started")

    def test_plot_draws_a_png(self):
        venv = os.environ.get("DSERVE_VENV", "")
        py = os.path.join(venv, "bin", "python") if venv else ""
        if not py or subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode:
            self.skipTest("matplotlib not in $DSERVE_VENV (scripts/setup.sh installs it)")
        srv = FakeServer()
        try:
            with tempfile.TemporaryDirectory() as d:
                png, js = os.path.join(d, "p.png"), os.path.join(d, "p.json")
                p = subprocess.run([py, LOADGEN, "--base-url", srv.url, "--num-requests", "4", "--input-len", "4",
                                    "--plot", png, "--quiet"], capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("plot written", p.stderr)
                with open(png, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
                # the figure itself: a title that says what ran, a legend on the throughput panel
                code = ("import json, sys; sys.path.insert(0, %r); import loadgen_stats as s; "
                        "f = s.plot_figure(json.load(open(sys.argv[1]))); ax = f.axes; "
                        "print(json.dumps({'title': f._suptitle.get_text(), 'legend': [t.get_text() for a in ax[2:] "
                        "if a.get_legend() for t in a.get_legend().get_texts()]}))" % os.path.dirname(LOADGEN))
                p = subprocess.run([py, LOADGEN, "--base-url", srv.url, "--num-requests", "4", "--input-len", "4",
                                    "--output-len", "5", "--request-rate", "50", "--json-out", js, "--quiet"],
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, p.stderr)
                p = subprocess.run([py, "-c", code, js], capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, p.stderr)
                fig = json.loads(p.stdout)
                for want in ("fake-model", "random", "in 4, out 5", "rate 50 req/s"):
                    self.assertIn(want, fig["title"])
                self.assertEqual(sorted(fig["legend"]), ["output tok/s", "requests done/s"])
        finally:
            srv.close()


if __name__ == "__main__":
    unittest.main()
