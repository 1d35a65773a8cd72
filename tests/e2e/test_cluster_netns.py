"""tests/e2e/test_cluster_netns.py: configs/cluster.json's three nodes in three network namespaces; KV crosses veth links over tcp.
The same three nodes again with no worker in any config: they find each other through etcd (config "discovery")."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import e2e_util as u
import etcd_util as eu

ADDR = {"router": "10.77.0.1", "prefill": "10.77.0.2", "decode": "10.77.0.3"}
REQ = {"prompt": "The capital of France is", "max_tokens": 12}


class ThreeNamespaces(unittest.TestCase):
    def setUp(self):
        u.require_env(self)
        if os.geteuid() != 0:
            self.skipTest("needs root to create network namespaces (ip netns add)")
        if not shutil.which("ip"):
            self.skipTest("the ip tool (iproute2) is missing")
        self.created = []
        self.addCleanup(u.netns_delete, self.created)
        self.ns = u.netns_star("dsv%d" % os.getpid(), ADDR, self.created)
        self.dir = tempfile.mkdtemp(prefix="dserve-netns-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def in_ns(self, node):
        return ["ip", "netns", "exec", self.ns[node]]

    def client(self, node, *args):
        r = subprocess.run(self.in_ns(node) + [sys.executable, os.path.join(u.HERE, "e2e_util.py")] + list(args),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout) if r.stdout.strip() else None

    def test_three_node_cluster(self):
        # Colocated reference on loopback (root namespace, 127.0.0.1 only).
        co = u.Cluster([{"name": "w0", "role": "both"}], tag="coloc")
        self.addCleanup(co.close)
        co.start()
        want = u.complete(co.port, "completions", REQ)
        co.close()
        self.assertEqual(want["status"], 200, want)

        # The shipped cluster config, with the model made absolute, smaller KV pools and every prompt disaggregated.
        with open(os.path.join(u.SOURCE_DIR, "configs", "cluster.json")) as f:
            cfg = json.load(f)
        self.assertEqual({k: v["host"] for k, v in cfg["nodes"].items()}, ADDR)
        cfg["model"] = u.MODEL
        cfg["router"].update(disagg_threshold=0, disagg_policy="threshold")
        for w in cfg["workers"]:
            w["kv_budget_mb"] = 32
            w["threads"] = 1
            self.assertEqual(w["kvxfer"]["backend"], "tcp")
        path = os.path.join(self.dir, "cluster.json")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        # Its secret_file (relative: next to the copy), 0600 as the config's README says to make it.
        sf = os.path.join(self.dir, cfg["secret_file"])
        with open(os.open(sf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(u.TEST_SECRET + "\n")

        nodes = {}
        for node in ("decode", "prefill", "router"):
            n = u.Node(path, node, os.path.join(self.dir, node + ".log"), prefix=self.in_ns(node))
            self.addCleanup(n.stop)
            nodes[node] = n
        for node in ("decode", "prefill", "router"):
            nodes[node].wait_ready(60)
        nodes["router"].wait_connected([w["name"] for w in cfg["workers"]], 30)

        rport = cfg["router"]["port"]
        rx = lambda: int(subprocess.run(self.in_ns("decode") + ["cat", "/sys/class/net/eth0/statistics/rx_bytes"],
                                        capture_output=True, text=True, timeout=20).stdout)
        self.client("router", "wait", ADDR["router"], str(rport))
        m0 = self.client("router", "metrics", ADDR["router"], str(rport))
        rx0 = rx()
        got = self.client("router", "request", ADDR["router"], str(rport), "completions", json.dumps(REQ))
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["text"], want["text"])
        self.assertEqual(got["completion_tokens"], want["completion_tokens"])
        m1 = self.client("router", "metrics", ADDR["router"], str(rport))
        kv = m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"]
        self.assertGreater(kv, 0, "no KV was transferred")
        # The KV bytes arrived at the decode namespace over its veth link.
        self.assertGreaterEqual(rx() - rx0, kv)
        self.assertIn("linked to decode worker", nodes["prefill"].text())
        self.assertIn("kvxfer tcp", nodes["prefill"].text())

    def test_three_nodes_from_etcd_alone(self):
        # etcd in the router's namespace; each node's file names only its own roles and the discovery section.
        eu.require_etcd()
        etcd = eu.Etcd(host=ADDR["router"], prefix=self.in_ns("router"))
        self.addCleanup(etcd.close)
        etcd.start(wait=False)  # (not reachable from here; every role retries until it answers)
        disc = {"etcd": [etcd.url], "cluster": "netns", "lease_ttl_s": 3}
        rport = 8000
        files = {
            "router": {"router": {"node": "router", "host": ADDR["router"], "port": rport, "disagg_threshold": 0,
                                  "disagg_policy": "threshold"}},
            "prefill": {"workers": [{"name": "p0", "node": "prefill", "role": "prefill", "host": ADDR["prefill"],
                                     "port": 9100, "threads": 1, "kv_budget_mb": 32,
                                     "kvxfer": {"backend": "tcp", "port": 9200}}]},
            "decode": {"workers": [{"name": "d0", "node": "decode", "role": "decode", "host": ADDR["decode"],
                                    "port": 9100, "threads": 1, "kv_budget_mb": 32,
                                    "kvxfer": {"backend": "tcp", "port": 9200}}]},
        }
        nodes = {}
        for node, extra in files.items():  # the secret comes from the environment (DSERVE_SECRET, e2e_util)
            path = os.path.join(self.dir, node + ".json")
            with open(path, "w") as f:
                json.dump(dict({"model": u.MODEL, "discovery": disc}, **extra), f, indent=1)
            n = u.Node(path, node, os.path.join(self.dir, node + ".log"), prefix=self.in_ns(node))
            self.addCleanup(n.stop)
            nodes[node] = n
        nodes["router"].wait_connected(["p0", "d0"], 90 * u.SCALE)
        self.client("router", "wait", ADDR["router"], str(rport))
        got = self.client("router", "request", ADDR["router"], str(rport), "completions", json.dumps(REQ))
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["completion_tokens"], REQ["max_tokens"])
        m = self.client("router", "metrics", ADDR["router"], str(rport))
        self.assertGreater(m["dserve:kv_transfer_bytes_total"], 0, "no KV was transferred")
        self.assertIn("linked to decode worker d0 (kvxfer tcp)", nodes["prefill"].text())
        self.assertIn("registered in etcd", nodes["decode"].text())


if __name__ == "__main__":
    unittest.main()
