"""tests/e2e/test_cluster_view.py: refusals seen from both sides, and the membership view (issue 45 items 9, 10), with
real router, worker and etcd processes. A worker with another shared secret, listed in the router's config: the router
dials it again and again, yet each side logs the refusal once (once a minute per member), the worker as an ERROR that
names the router; GET /v1/cluster (behind the API key) and `dserve members` show it refused, with why, beside a linked
worker's load and KV use. A worker of another model registered in etcd: the router refuses it and tells it, and the
worker logs why; the view lists it until its record goes."""

import http.client
import json
import os
import signal
import subprocess
import shutil
import tempfile
import unittest

import e2e_util as u
from test_discovery import Cluster

S = u.SCALE
KEY = "cluster-view-key"
OTHER_SECRET = "7f1d2c3b4a5968778695a4b3c2d1e0f00112233445566778899aabbccddeeff0"


def cluster(port, key=KEY):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", "/v1/cluster", headers={"Authorization": "Bearer " + key} if key else {})
        r = c.getresponse()
        body = r.read().decode()
        return r.status, (json.loads(body) if body.startswith("{") else body)
    finally:
        c.close()


def by_name(view):
    return {m["name"]: m for m in view["members"]}


class StaticWrongSecret(unittest.TestCase):
    def setUp(self):
        u.require_env(self)
        self.dir = tempfile.mkdtemp(prefix="dserve-cluster-view-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.port, self.wport, bport = u.free_ports(3)
        ws = [{"name": n, "role": "both", "host": "127.0.0.1", "port": p, "threads": 1, "kv_budget_mb": 32}
              for n, p in (("w0", self.wport), ("bad", bport))]
        cfg = os.path.join(self.dir, "cluster.json")
        with open(cfg, "w") as f:
            json.dump({"model": u.MODEL, "router": {"port": self.port, "api_keys": [KEY]}, "workers": ws}, f)
        self.procs = []
        self.addCleanup(lambda: [p.stop() for p in self.procs])

        def start(argv, log, env=None):
            p = u.Proc(argv, os.path.join(self.dir, log), env=env)
            self.procs.append(p)
            return p
        self.router = start(["router", "--config", cfg], "router.log")
        self.w0 = start(["both", "--config", cfg, "--name", "w0"], "w0.log")
        self.bad = start(["both", "--config", cfg, "--name", "bad"], "bad.log",
                         env=dict(os.environ, DSERVE_SECRET=OTHER_SECRET))

    def test_refused_worker_is_told_and_shown_once(self):
        seen = {}

        def settled():  # w0 linked and bad dialled (and refused) at least 4 times: the router's retries are on
            try:
                st, v = cluster(self.port)
            except OSError:
                return False
            seen.update(by_name(v) if st == 200 else {})
            return (seen.get("w0", {}).get("state") == "linked" and seen["w0"].get("running") is not None and
                    seen.get("bad", {}).get("state") == "refused" and seen["bad"]["failures"] >= 4)
        self.assertTrue(u.wait_until(settled, 30 * S, 0.1), seen)
        self.assertEqual(cluster(self.port, key=None)[0], 401)  # behind the API key like the other /v1 routes
        st, view = cluster(self.port)
        self.assertEqual(st, 200)
        self.assertEqual(view["object"], "cluster")
        self.assertEqual(view["counts"]["linked"], 1)
        self.assertEqual(view["counts"]["refused"], 1)
        w0, bad = by_name(view)["w0"], by_name(view)["bad"]
        self.assertEqual((w0["role"], w0["source"], w0["reason"]), ("both", "config", None))
        self.assertEqual(w0["address"], "127.0.0.1:%d" % self.wport)
        for k in ("running", "waiting", "kv_running_perc", "kv_cached_perc", "kv_blocks"):
            self.assertIsInstance(w0[k], (int, float), k)
        self.assertIn("shared secret", bad["reason"])
        self.assertIsNone(bad["running"])
        # each side said it once, however often the router dialled (once a minute per member)
        router_lines = [l for l in self.router.text().splitlines() if "member bad" in l and "WARN" in l]
        self.assertEqual(len(router_lines), 1, router_lines)
        self.assertIn("another shared secret", router_lines[0])
        bad_lines = [l for l in self.bad.text().splitlines() if "router" in l and ("WARN" in l or "ERROR" in l)]
        self.assertEqual(len(bad_lines), 1, bad_lines)
        self.assertIn("ERROR", bad_lines[0])
        self.assertIn("REFUSED by a secret mismatch: router 'router'", bad_lines[0])
        # the CLI: its key from --api-key or $OPENAI_API_KEY, a table, or the JSON
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        run = lambda *a, **kw: subprocess.run([u.DSERVE, "members", "--router", "http://127.0.0.1:%d/v1" % self.port]
                                              + list(a), capture_output=True, text=True, timeout=30, **kw)
        p = run(env=env)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("HTTP 401", p.stderr)
        self.assertIn("--api-key", p.stderr)
        p = run(env=dict(env, OPENAI_API_KEY=KEY))
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = {l.split()[0]: l.split() for l in p.stdout.splitlines()[2:]}
        self.assertEqual(p.stdout.splitlines()[1].split()[:5], ["NAME", "ROLE", "ADDRESS", "INCARNATION", "STATE"])
        self.assertEqual(rows["w0"][4], "linked")
        self.assertEqual(rows["bad"][4], "refused")
        self.assertIn("shared secret", p.stdout)
        p = run("--api-key", KEY, "--json", env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(set(by_name(json.loads(p.stdout))), {"w0", "bad"})
        p = run("--bogus", env=env)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown or incomplete option '--bogus'", p.stderr)


class AnotherModelInEtcd(Cluster, unittest.TestCase):
    def test_refused_worker_is_told_why_and_listed_until_it_goes(self):
        self.start_cluster({})
        self.router.line_time(r"watching etcd", 30 * S)
        d0 = self.worker("d0", role="both")
        self.linked("d0", role="both")
        cfg = {"model": u.GEMMA, "discovery": self.discovery,
               "workers": [{"name": "g0", "role": "both", "host": "127.0.0.1", "port": 0, "threads": 1,
                            "kv_budget_mb": 32}]}
        g0 = self._start(["both", "--config", self._write("g0.json", cfg), "--name", "g0"], "g0.log")
        self.router.line_time(r"REFUSING worker g0 ", 60 * S)
        t = g0.line_time(r"ERROR g0: REFUSED by router 'router': it serves model gemma3 .*this router serves llama",
                         30 * S)
        self.assertTrue(t)
        st, view = cluster(self.port, key="")
        self.assertEqual(st, 200, view)
        g = by_name(view)["g0"]
        self.assertEqual((g["state"], g["source"], g["role"]), ("refused", "etcd", "both"))
        self.assertIn("this router serves llama", g["reason"])
        self.assertIsInstance(g["incarnation"], (int, float))
        self.assertEqual(by_name(view)["d0"]["state"], "linked")
        self.assertEqual(u.metrics(self.port).get('dserve:members{state="refused"}'), 1.0)
        # a linked member's record rewritten to another model: its link goes, it is refused too, g0 stays as it was
        prefix = "/dserve/e2e/workers/"
        rec = self.etcd.keys(prefix)[prefix + "both/d0"]
        self.etcd.put(prefix + "both/d0", dict(rec, model=dict(rec["model"], file_hash="1-0")))
        self.router.line_time(r"REFUSING worker d0 ", 30 * S)
        d0.line_time(r"ERROR d0: REFUSED by router 'router'", 30 * S)
        view = cluster(self.port, key="")[1]
        self.assertEqual({n: m["state"] for n, m in by_name(view).items()}, {"d0": "refused", "g0": "refused"})
        self.assertIn("this router serves llama", by_name(view)["g0"]["reason"])
        self.assertEqual(by_name(view)["g0"]["etcd_key"], prefix + "both/g0")
        self.assertEqual(u.metrics(self.port).get('dserve:members{state="refused"}'), 2.0)
        self.etcd.put(prefix + "both/d0", rec)  # and back: linked again
        self.assertTrue(u.wait_until(lambda: by_name(cluster(self.port, key="")[1])["d0"]["state"] == "linked",
                                     30 * S, 0.1))
        g0.signal(signal.SIGTERM)  # its lease revoked: its record goes, and with it the refused entry
        self.assertTrue(u.wait_until(lambda: "g0" not in by_name(cluster(self.port, key="")[1]), 30 * S, 0.1))
        self.assertEqual(u.metrics(self.port).get('dserve:members{state="refused"}'), 0.0)
        self.assertTrue(d0.alive())


if __name__ == "__main__":
    unittest.main()
