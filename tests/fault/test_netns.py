"""tests/fault/test_netns.py: router, prefill and decode nodes in three network namespaces, KV over tcp across veth: a link cut mid-transfer, a rate-limited (tbf) link, netem delay/loss where the kernel has it."""

import json
import os
import re
import shutil
import tempfile
import time
import unittest

import fault_util as f
from fault_util import u

ADDR = {"router": "10.79.0.1", "prefill": "10.79.0.2", "decode": "10.79.0.3"}
RPORT, PPORT, DPORT = 8000, 9100, 9101
TBF_MBIT = 16


class NsCluster:
    """The three nodes (each `dserve launch` in its namespace); port/host/ports()/hosts as FaultCase expects."""

    def __init__(self, dir, ns):
        self.port, self.host = RPORT, ADDR["router"]
        self.hosts = {"p0": ADDR["prefill"], "d0": ADDR["decode"]}
        cfg = {"model": u.MODEL, "nodes": {k: {"host": v} for k, v in ADDR.items()},
               "router": {"node": "router", "port": RPORT, "disagg_threshold": 0, "disagg_policy": "threshold",
                          "link_dead_ms": f.LINK_DEAD_MS},
               "workers": [dict(f.worker("p0", "prefill"), node="prefill", port=PPORT, threads=1, kv_budget_mb=32),
                           dict(f.worker("d0", "decode"), node="decode", port=DPORT, threads=1, kv_budget_mb=32)]}
        for w in cfg["workers"]:
            w["kvxfer"]["port"] = w["port"] + 100
        self.config = os.path.join(dir, "cluster.json")
        with open(self.config, "w") as fp:
            json.dump(cfg, fp, indent=1)
        self.nodes = {}
        for node in ("decode", "prefill", "router"):
            self.nodes[node] = u.Node(self.config, node, os.path.join(dir, node + ".log"),
                                      prefix=["ip", "netns", "exec", ns[node]])
        self.node = self.nodes["router"]  # the router's log

    def ports(self):
        return {"p0": PPORT, "d0": DPORT}

    def start(self):
        u.wait_serving(self.nodes.values(), self.node, ["p0", "d0"], self.port, 60, host=self.host)

    def stop(self):
        for n in self.nodes.values():
            n.stop()


class NetNs(f.FaultCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root to create network namespaces (ip netns add)")
        if not shutil.which("ip") or not shutil.which("tc"):
            raise unittest.SkipTest("the ip and tc tools (iproute2) are missing")
        cls.created = []
        cls.addClassCleanup(u.netns_delete, cls.created)
        cls.ns = u.netns_star("dsf%d" % os.getpid(), ADDR, cls.created)
        cls.dir = tempfile.mkdtemp(prefix="dserve-fault-netns-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        # This thread (and the client threads it starts) talk from the router's namespace.
        home = os.open("/proc/self/ns/net", os.O_RDONLY)
        cls.addClassCleanup(os.close, home)
        cls.addClassCleanup(f.setns, "/proc/self/fd/%d" % home)
        f.setns("/var/run/netns/" + cls.ns["router"])
        cls.c = NsCluster(cls.dir, cls.ns)
        cls.addClassCleanup(cls.c.stop)
        cls.c.start()
        f.references(cls.c.port, cls.c.host)

    def setUp(self):
        self.refs = f.references(self.c.port, self.c.host)
        self.check_idle(self.c, ["p0", "d0"])  # each case starts from (and must leave) an idle, healthy cluster

    def prefill_link(self, state):
        u.ip("-n", self.ns["prefill"], "link", "set", "eth0", state)

    def test_link_cut_mid_transfer(self):
        c = self.c
        load = f.Load(c.port, c.host)
        m = self.wait_moment(load, lambda: f.mixed_moment(c, load), "decoding + KV in transfer + queued")
        t = time.time()
        self.prefill_link("down")
        self.addCleanup(self.prefill_link, "up")
        # The router hears nothing from p0 for link_dead_ms: it fails p0's requests and cancels them at d0 (freeing the
        # blocks reserved for their KV). The decoding streams have their KV on d0 and finish; the queued ones are
        # prefilled on d0 itself (no prefill worker is up).
        ok, err = self.check_streams(load, t, must_ok=m["streaming"], bound=f.STOP_ERROR_S)
        self.assertGreaterEqual(len(err), 1, "p0 held %r requests, none failed" % m["p0"])
        c.node.wait_for("router: worker p0 answered nothing for %d ms; closing its link" % f.LINK_DEAD_MS, 5)
        self.check_idle(c, ["d0"])
        # The link comes back: the router reconnects to p0, which has dropped what the closed link routed.
        n_conn = c.node.text().count("router: worker p0 (prefill, ")
        self.prefill_link("up")
        c.node.wait_count("router: worker p0 (prefill, ", n_conn + 1, 30)
        self.check_idle(c, ["p0", "d0"])
        self.check_serves(c)

    def run_clean(self, what):
        """16 streams that must all finish with the reference answers; returns (seconds, KV bytes moved)."""
        m0 = u.metrics(self.c.port, self.c.host)
        t = time.time()
        load = f.Load(self.c.port, self.c.host)
        ok, err = self.check_streams(load, t)
        self.assertEqual(err, [], "streams failed over a %s link" % what)
        dt = max(f.end_time(r) for r in load.res) - t
        kv = u.metrics(self.c.port, self.c.host)["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"]
        self.assertGreater(kv, 0)
        self.check_idle(self.c, ["p0", "d0"])
        return dt, kv

    def qdisc(self, *spec):
        rc, err = f.tc(self.ns["prefill"], "qdisc", "add", "dev", "eth0", "root", *spec)
        self.assertEqual(rc, 0, "tc qdisc add %s: %s" % (" ".join(spec), err))
        self.addCleanup(f.tc, self.ns["prefill"], "qdisc", "del", "dev", "eth0", "root")

    def test_rate_limited_link(self):
        # tbf on the prefill node's egress: every KV byte to d0 crosses it.
        self.qdisc("tbf", "rate", "%dmbit" % TBF_MBIT, "burst", "32kb", "latency", "1s")
        dt, kv = self.run_clean("rate-limited")
        floor = kv * 8 / (TBF_MBIT * 1e6)
        self.assertGreaterEqual(dt, 0.8 * floor, "%.0f KV bytes in %.1f s: faster than the %d Mbit/s limit" %
                                (kv, dt, TBF_MBIT))
        # The shaper really held packets back (tc counts them as overlimits) and carried at least the KV bytes.
        rc, out = f.tc(self.ns["prefill"], "-s", "qdisc", "show", "dev", "eth0")
        sent = re.search(r"Sent (\d+) bytes .*overlimits (\d+)", out, re.S)
        self.assertTrue(sent, out)
        self.assertGreaterEqual(int(sent.group(1)), kv, out)
        self.assertGreater(int(sent.group(2)), 0, "tbf never throttled: " + out)
        print("tbf %d Mbit/s: %.1f MB of KV, 16 streams in %.1f s (floor %.1f s)" % (TBF_MBIT, kv / 1e6, dt, floor))

    def test_netem_delay_and_loss(self):
        rc, err = f.tc(self.ns["router"], "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        if rc != 0:
            self.skipTest("this kernel has no sch_netem (tc: %s); test_rate_limited_link covers a slow link" % err)
        f.tc(self.ns["router"], "qdisc", "del", "dev", "lo", "root")
        self.qdisc("netem", "delay", "20ms", "5ms", "loss", "1%")
        self.run_clean("lossy, delayed")


if __name__ == "__main__":
    unittest.main()
