"""tests/e2e/test_observe.py: what a 1P1D cluster tells of its work: the router's access-log line per request (read back
against the response), its stats lines, /metrics parsed as Prometheus text (labels, histograms, metrics_public), the
Grafana dashboard's queries against what /metrics exports, and a traced request's OTLP spans collected by a receiver
the test runs: they link up across the three processes and tile the client's latency within 5% (and a colocated
worker's request's too)."""

import http.client
import http.server
import json
import os
import re
import subprocess
import threading
import time
import unittest

import e2e_util as u

API_KEY = "observe-key"
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
          "metal type, oil-based ink and a wooden press. Tell the story in a few sentences:")


class Receiver(http.server.ThreadingHTTPServer):
    """A small OTLP/HTTP JSON collector: keeps every span posted to /v1/traces with its service.name."""

    def __init__(self):
        self.spans, self.posts, self.lock = [], 0, threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/json"
                if ok:
                    req = json.loads(body)
                    with outer.lock:
                        outer.posts += 1
                        for rs in req["resourceSpans"]:
                            svc = [a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                                   if a["key"] == "service.name"][0]
                            for ss in rs["scopeSpans"]:
                                for sp in ss["spans"]:
                                    outer.spans.append(dict(sp, service=svc))
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def trace(self, trace_id):
        with self.lock:
            return [s for s in self.spans if s["traceId"] == trace_id]


def call(port, path, body, headers=None, key=API_KEY):
    """POSTs JSON with the API key; returns (status, body, client seconds)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), h)
    r = c.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    c.close()
    return r.status, json.loads(data), dt


LABELS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def parse_prometheus(text):
    """Parses the text exposition format strictly: {family: {"type", "help", "samples": [(name, labels, value)]}}."""
    fam, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            fam.setdefault(name, {"samples": []})["help"] = help_
        elif line.startswith("# TYPE "):
            name, _, t = line[7:].partition(" ")
            assert t in ("counter", "gauge", "histogram"), line
            fam.setdefault(name, {"samples": []})["type"] = types[name] = t
        elif line:
            m = SAMPLE.match(line)
            assert m, "not a sample line: %r" % line
            name, labels, value = m.group(1), {}, float(m.group(4))
            body = m.group(3) or ""
            pos = 0
            while pos < len(body):
                lm = LABELS.match(body, pos)
                assert lm, "bad labels in %r" % line
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            family = name if name in types else base
            assert family in types, "sample before its # TYPE: %r" % line
            if family != name:
                assert types[family] == "histogram", line
            fam[family]["samples"].append((name, labels, value))
    return fam


def spans_by_name(spans):
    out = {}
    for s in spans:
        out.setdefault(s["name"], []).append(s)
    return out


class Observe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        cls.rx = Receiver()
        cls.addClassCleanup(cls.rx.shutdown)
        endpoint = "http://127.0.0.1:%d/v1/traces" % cls.rx.server_address[1]
        cls.c = u.Cluster([{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}], disagg_threshold=0,
                          tag="observe", router={"metrics_public": True, "api_keys": [API_KEY]},
                          extra={"logging": {"format": "json", "stats_interval_s": 1},
                                 "tracing": {"endpoint": endpoint, "flush_ms": 100}})
        cls.addClassCleanup(cls.c.close)
        cls.port = cls.c.port
        # Cluster.start reads text lines and has no API key: here the log is JSON lines and every call needs the key

        def up():
            try:
                return call(cls.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})[0] == 200
            except OSError:
                return False
        if not u.wait_until(up, 60 * u.SCALE, 0.2):
            raise AssertionError("the cluster did not serve:\n" + cls.c.node.text()[-3000:])
        cls.c.node.wait_ready(10 * u.SCALE)  # the launcher's ready line on stdout stays text (scripts wait for it)
        for line in cls.c.node.text().splitlines():  # every other line is one JSON object
            assert line.startswith("dserve: node local ready") or json.loads(line)["component"], line

    def log_events(self, event):
        out = []
        for line in self.c.node.text().splitlines():
            if line.startswith("{"):
                o = json.loads(line)  # every line of a JSON-lines log is one object
                if o.get("event") == event:
                    out.append(o)
        return out

    def access_line(self, rid, timeout=10):
        found = []
        u.wait_until(lambda: found.extend(o for o in self.log_events("access") if o["id"] == rid) or found,
                     timeout * u.SCALE)
        self.assertEqual(len(found), 1, "expected one access line for %s" % rid)
        return found[0]

    def test_log_format_flag(self):
        """--log-format sets logging.format (the override flags of dserve serve and launch); a bad one is refused."""
        run = lambda *a: subprocess.run([u.DSERVE, "launch", "--config", self.c.config] + list(a),
                                        capture_output=True, text=True, timeout=30)
        p = run("--print-config", "--log-format", "text")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["logging"]["format"], "text")
        p = run("--node", "local", "--log-format", "xml")  # refused while the config is read: nothing starts
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn('logging.format: "xml" is not one of: text, json', p.stderr)

    def test_access_line_matches_the_response(self):
        st, b, dt = call(self.port, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0})
        self.assertEqual(st, 200, b)
        a = self.access_line(b["id"])
        self.assertEqual(a["component"], "router")
        self.assertEqual(a["level"], "INFO")
        self.assertEqual(a["route"], "/v1/chat/completions")
        self.assertEqual(a["status"], 200)
        self.assertEqual(a["prompt_tokens"], b["usage"]["prompt_tokens"])
        self.assertEqual(a["completion_tokens"], b["usage"]["completion_tokens"])
        self.assertEqual(a["cached_tokens"], b["usage"]["prompt_tokens_details"]["cached_tokens"])
        self.assertEqual(a["finish"], b["choices"][0]["finish_reason"])
        self.assertEqual(a["workers"], "p0>d0")  # disagg_threshold 0: every prompt is handed off
        self.assertGreater(a["kv_bytes"], 0)
        self.assertEqual(a["migrations"], 0)
        self.assertLessEqual(0, a["queue_ms"])
        self.assertLessEqual(a["queue_ms"], a["ttft_ms"])
        self.assertLessEqual(a["ttft_ms"], a["total_ms"])
        self.assertLessEqual(a["total_ms"], dt * 1000 + 1)  # the router's view is inside the client's
        self.assertEqual(len(a["trace_id"]), 32)  # sample_ratio 1: every request is traced

        # a refused request has its line too, with the error's status and code
        st, b, _ = call(self.port, "/v1/completions", {"prompt": "x", "max_tokens": -3})
        self.assertEqual(st, 400, b)
        # the line is written once the answer has gone out: the client may read the 400 first
        bad = u.wait_until(lambda: [o for o in self.log_events("access")
                                    if o["status"] == 400 and o["route"] == "/v1/completions"], 10 * u.SCALE)
        self.assertTrue(bad, "no access line for the 400")
        self.assertEqual(bad[-1]["error"], b["error"]["code"] or "")
        self.assertIsNone(bad[-1]["ttft_ms"])  # no token: null, not a made-up number

    def test_stats_lines_while_there_is_work(self):
        for _ in range(3):
            st, b, _ = call(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
            self.assertEqual(st, 200, b)
        busy = lambda: [o for o in self.log_events("stats") if o["worker"] == "router" and o["gen_tok_s"] > 0]
        self.assertTrue(u.wait_until(busy, 5 * u.SCALE), "no router stats line with generated tokens")
        lines = self.log_events("stats")
        keys = {"worker", "role", "prompt_tok_s", "gen_tok_s", "running", "waiting", "kv_usage_pct",
                "prefix_hit_pct", "handoffs"}
        for o in lines:
            self.assertTrue(keys <= set(o), o)
        roles = {(o["worker"], o["role"]) for o in lines}
        self.assertTrue({("router", "router"), ("p0", "prefill"), ("d0", "decode")} <= roles, roles)
        self.assertTrue(any(o["worker"] == "p0" and o["prompt_tok_s"] > 0 for o in lines), lines)
        self.assertTrue(any(o["worker"] == "d0" and o["gen_tok_s"] > 0 for o in lines), lines)
        self.assertTrue(any(o["worker"] == "router" and o["handoffs"] > 0 for o in lines), lines)

    def scrape(self):
        st, text = u.get(self.port, "/metrics")  # no API key: router.metrics_public
        self.assertEqual(st, 200, text[:200])
        return parse_prometheus(text)

    def test_metrics_parse_with_labels_and_phases(self):
        n = 2
        for _ in range(n):
            st, b, _ = call(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
            self.assertEqual(st, 200, b)
        st, models = u.get(self.port, "/v1/models")
        self.assertEqual(st, 401)  # only /metrics is public
        m = self.scrape()
        model = call(self.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})[1]["model"]
        for name, f in m.items():
            self.assertTrue(name.startswith("dserve:"), name)
            self.assertTrue(f.get("help"), name)
            for sname, labels, value in f["samples"]:
                self.assertEqual(labels.get("model_name"), model, sname)
            if f["type"] == "histogram":  # cumulative buckets ending at +Inf == count, per label set
                series = {}
                for sname, labels, value in f["samples"]:
                    key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                    series.setdefault(key, []).append((sname, labels.get("le"), value))
                for key, ss in series.items():
                    buckets = [v for s, le, v in ss if s.endswith("_bucket")]
                    self.assertEqual(buckets, sorted(buckets), name)
                    self.assertEqual([le for s, le, v in ss if s.endswith("_bucket")][-1], "+Inf")
                    self.assertEqual(buckets[-1], [v for s, le, v in ss if s.endswith("_count")][0])
        for phase in ("queue", "prefill", "transfer", "decode"):
            fam = m["dserve:request_%s_time_seconds" % phase]
            count = [v for s, l, v in fam["samples"] if s.endswith("_count")][0]
            self.assertGreaterEqual(count, n, phase)
        self.assertIn("Includes the prefill worker's queue and compute", m["dserve:kv_transfer_time_seconds"]["help"])

        def worker_value(family, worker, role):
            vals = [v for s, l, v in m[family]["samples"] if l.get("worker") == worker and l.get("role") == role]
            self.assertEqual(len(vals), 1, (family, worker, m[family]["samples"]))
            return vals[0]
        for fam in ("dserve:worker_num_requests_running", "dserve:worker_num_requests_waiting",
                    "dserve:worker_kv_cache_usage_perc"):
            worker_value(fam, "p0", "prefill")
            worker_value(fam, "d0", "decode")
        self.assertGreater(worker_value("dserve:worker_prompt_tokens_total", "p0", "prefill"), 0)
        self.assertGreater(worker_value("dserve:worker_generation_tokens_total", "d0", "decode"), 0)
        self.assertGreaterEqual(worker_value("dserve:worker_kv_handoffs_total", "p0", "prefill"), n)
        for worker, role in (("router", "router"), ("p0", "prefill"), ("d0", "decode")):  # every process, none lost
            self.assertEqual(worker_value("dserve:trace_spans_dropped_total", worker, role), 0)

    def test_kv_gauges_split_running_from_cached(self):
        """An idle worker after a request: its sequences hold no KV block (running 0), its prefix cache does (cached >
        0); the old usage gauge counts both, which is why autoscaling reads the running one (issue 45 item 8)."""
        st, b, _ = call(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        self.assertEqual(st, 200, b)
        want = {'dserve:worker_kv_running_perc{worker="p0",role="prefill"}': lambda v: v == 0,
                'dserve:worker_kv_cached_perc{worker="p0",role="prefill"}': lambda v: v > 0,
                'dserve:role_kv_running_perc{role="prefill"}': lambda v: v == 0,
                'dserve:role_kv_cached_perc{role="prefill"}': lambda v: v > 0,
                'dserve:worker_kv_running_perc{worker="d0",role="decode"}': lambda v: v == 0,
                'dserve:role_kv_running_perc{role="decode"}': lambda v: v == 0}
        seen = {}

        def idle():  # the gauges follow the workers' stats, once a second
            seen.update(u.metrics(self.port))
            return all(k in seen and ok(seen[k]) for k, ok in want.items())
        self.assertTrue(u.wait_until(idle, 10 * u.SCALE, 0.1), {k: seen.get(k) for k in want})
        used = seen['dserve:worker_kv_cache_usage_perc{worker="p0",role="prefill"}']
        cached = seen['dserve:worker_kv_cached_perc{worker="p0",role="prefill"}']
        self.assertAlmostEqual(used, cached, 6)  # idle: what the old gauge counts is the cache
        self.assertNotIn("dserve:role_kv_usage_perc", "\n".join(seen))  # replaced by the split

    def test_dashboard_queries_name_exported_metrics(self):
        call(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        exported = set(self.scrape())
        with open(os.path.join(u.SOURCE_DIR, "docs", "grafana", "dserve.json")) as f:
            dash = json.load(f)
        exprs = []

        def walk(o):
            if isinstance(o, dict):
                for k, v in o.items():
                    if k == "expr" and isinstance(v, str):
                        exprs.append(v)
                    walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(dash)
        self.assertGreaterEqual(len(exprs), 10)
        named = set()
        for e in exprs:
            for name in re.findall(r"dserve:[a-zA-Z0-9_:]+", e):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                named.add(base if base in exported else name)
        # exported only by a router with a "discovery" section (etcd membership): named in members.c instead
        with open(os.path.join(u.SOURCE_DIR, "router", "members.c")) as f:
            members_c = f.read()
        discovery_only = {n for n in named - exported if '"%s"' % n in members_c}
        self.assertEqual(discovery_only, {"dserve:members", "dserve:member_dial_failures_total"})
        missing = sorted(named - exported - discovery_only)
        self.assertEqual(missing, [], "the dashboard queries metrics /metrics does not export")
        self.assertGreaterEqual(len(named), 12)
        for want in ("dserve:role_kv_running_perc", "dserve:role_kv_cached_perc", "dserve:auth_failures_total",
                     "dserve:worker_kv_running_perc", "dserve:worker_kv_cached_perc"):
            self.assertIn(want, named)
        # Grafana's import asks for the data source (__inputs), which becomes the datasource variable's default;
        # every panel and query reads that variable
        self.assertEqual([(i["name"], i["type"], i["pluginId"]) for i in dash["__inputs"]],
                         [("DS_PROMETHEUS", "datasource", "prometheus")])
        var = [v for v in dash["templating"]["list"] if v["name"] == "datasource"][0]
        self.assertEqual(var["current"]["value"], "${DS_PROMETHEUS}")
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        for p in dash["panels"]:
            self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"]["uid"], "${datasource}", p["title"])
        cells = set()  # no two panels overlap on the 24-column grid
        for p in dash["panels"]:
            g = p["gridPos"]
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            self.assertFalse(mine & cells, p["title"])
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            cells |= mine
        titles = " ".join(p["title"] for p in dash["panels"])
        for want in ("KV per role", "per role", "refusals and auth failures"):
            self.assertIn(want, titles)

    def test_trace_of_a_1p1d_request(self):
        trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
        st, b, dt = call(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 48, "temperature": 0,
                                                        "ignore_eos": True},
                         headers={"traceparent": "00-%s-%s-01" % (trace_id, parent)})
        self.assertEqual(st, 200, b)
        want = {"request", "queue", "prefill", "kv_push", "kv_transfer", "decode"}
        got = lambda: want <= set(spans_by_name(self.rx.trace(trace_id)))
        self.assertTrue(u.wait_until(got, 10 * u.SCALE), spans_by_name(self.rx.trace(trace_id)).keys())
        by = spans_by_name(self.rx.trace(trace_id))
        for name in want:
            self.assertEqual(len(by[name]), 1, (name, by[name]))
        sp = {k: v[0] for k, v in by.items()}
        # who sent what: three processes, one trace
        self.assertEqual(sp["request"]["service"], "dserve-router")
        self.assertEqual(sp["queue"]["service"], "dserve-router")
        self.assertEqual(sp["prefill"]["service"], "dserve-p0")
        self.assertEqual(sp["kv_push"]["service"], "dserve-p0")
        self.assertEqual(sp["kv_transfer"]["service"], "dserve-d0")
        self.assertEqual(sp["decode"]["service"], "dserve-d0")
        # the links: the client's span -> the router's request span -> every other span
        self.assertEqual(sp["request"]["parentSpanId"], parent)
        rid = sp["request"]["spanId"]
        for name in want - {"request"}:
            self.assertEqual(sp[name]["parentSpanId"], rid, name)
        ids = [s["spanId"] for s in self.rx.trace(trace_id)]
        self.assertEqual(len(ids), len(set(ids)))
        self.assertEqual(self.access_line(b["id"])["trace_id"], trace_id)

        def dur(name):
            return (int(sp[name]["endTimeUnixNano"]) - int(sp[name]["startTimeUnixNano"])) / 1e9
        # the timeline: queue, prefill, transfer and decode follow each other and add up to what the client saw
        order = ["queue", "prefill", "kv_transfer", "decode"]
        for a, b_ in zip(order, order[1:]):
            self.assertLessEqual(int(sp[a]["endTimeUnixNano"]), int(sp[b_]["startTimeUnixNano"]) + 2000000, (a, b_))
        total = sum(dur(n) for n in order)
        self.assertLess(abs(total - dt) / dt, 0.05, "spans add up to %.1f ms, the client saw %.1f ms (%s)" % (
            total * 1e3, dt * 1e3, {n: round(dur(n) * 1e3, 2) for n in order}))
        self.assertLessEqual(dur("request"), dt)


class ObserveColocated(unittest.TestCase):
    """One `both` worker: a request's prefill and decode spans come from that worker, and tile the latency too."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        cls.rx = Receiver()
        cls.addClassCleanup(cls.rx.shutdown)
        endpoint = "http://127.0.0.1:%d/v1/traces" % cls.rx.server_address[1]
        cls.c = u.Cluster([{"name": "w0", "role": "both"}], tag="observe-coloc",
                          extra={"tracing": {"endpoint": endpoint, "flush_ms": 100, "service_name": "svc"}})
        cls.addClassCleanup(cls.c.close)
        cls.c.start()

    def test_trace_of_a_colocated_request(self):
        trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
        st, b, dt = call(self.c.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 48, "temperature": 0,
                                                          "ignore_eos": True},
                         headers={"traceparent": "00-%s-%s-01" % (trace_id, parent)}, key=None)
        self.assertEqual(st, 200, b)
        want = {"request", "queue", "prefill", "decode"}
        self.assertTrue(u.wait_until(lambda: want <= set(spans_by_name(self.rx.trace(trace_id))), 10 * u.SCALE))
        sp = {k: v[0] for k, v in spans_by_name(self.rx.trace(trace_id)).items()}
        self.assertEqual(set(sp), want)  # no handoff: no kv_push, no kv_transfer
        self.assertEqual(sp["request"]["service"], "svc-router")
        self.assertEqual(sp["prefill"]["service"], "svc-w0")
        self.assertEqual(sp["decode"]["service"], "svc-w0")
        for name in ("queue", "prefill", "decode"):
            self.assertEqual(sp[name]["parentSpanId"], sp["request"]["spanId"], name)
        dur = lambda n: (int(sp[n]["endTimeUnixNano"]) - int(sp[n]["startTimeUnixNano"])) / 1e9
        total = sum(dur(n) for n in ("queue", "prefill", "decode"))
        self.assertLess(abs(total - dt) / dt, 0.05, (total, dt))
        # the colocated worker reports its prefill phase in done: the router's histogram counts it
        fam = parse_prometheus(u.get(self.c.port, "/metrics")[1])["dserve:request_prefill_time_seconds"]
        self.assertGreaterEqual([v for s, l, v in fam["samples"] if s.endswith("_count")][0], 1)


if __name__ == "__main__":
    unittest.main()
