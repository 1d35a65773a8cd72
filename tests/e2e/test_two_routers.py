"""tests/e2e/test_two_routers.py: two routers, one cluster (issue 44, item 4). Both routers watch the same etcd
membership and link every worker; each hears every worker's kv_events, so a prompt one router placed is sent to the
same worker by the other; nginx (Debian's, started here with its own config on loopback) in front of both: one router
killed under load, new requests go to the other with none failed from 2 s after the kill (streams in flight on the
dead router end). Real etcd, routers, workers (SmolLM2) and nginx."""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

import e2e_util as u

S = u.SCALE
NGINX = "/usr/sbin/nginx"
N_STREAMS = 4
PROMPT = ("The history of the lighthouse begins with fires on hills, then towers of stone with open flames, and "
          "later lenses that bend the light into a beam seen far out at sea by every passing ship")
NGINX_CONF = """
worker_processes 1;
pid %(dir)s/nginx.pid;
error_log %(dir)s/nginx-error.log info;
events { worker_connections 256; }
http {
  access_log %(dir)s/nginx-access.log;
  client_body_temp_path %(dir)s/body; proxy_temp_path %(dir)s/proxy; fastcgi_temp_path %(dir)s/fcgi;
  uwsgi_temp_path %(dir)s/uwsgi; scgi_temp_path %(dir)s/scgi;
  upstream dserve {
    server 127.0.0.1:%(a)d max_fails=1 fail_timeout=30s;
    server 127.0.0.1:%(b)d max_fails=1 fail_timeout=30s;
  }
  server {
    listen 127.0.0.1:%(port)d;
    location / {
      proxy_pass http://dserve;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_next_upstream error timeout non_idempotent;
      proxy_connect_timeout 1s;
      proxy_read_timeout 120s;
    }
  }
}
"""


class TwoRouters(u.DiscoCluster, unittest.TestCase):
    def setUp(self):
        if not os.access(NGINX, os.X_OK):
            self.skipTest("nginx is not installed (scripts/setup.sh installs it)")
        self.start_cluster({}, tag="tworouters")
        # router B: the same membership, its own port
        self.port_b = u.free_ports(1)[0]
        cfg = {"model": u.MODEL, "discovery": self.discovery, "router": {"port": self.port_b}}
        self.router_b = self._start(["router", "--config", self._write("router_b.json", cfg)], "router_b.log")

    def linked_both(self, name):
        pat = r"router: worker %s \(both, [^)]*\) connected" % name
        self.router.line_time(pat, 60 * S)
        self.router_b.line_time(pat, 60 * S)

    def served_by(self, router, rid):
        """The worker(s) of request rid from router's access log ("w0", "w1")."""
        t = u.wait_until(lambda: re.search(r"id=%s .*workers=(\S+)" % re.escape(rid), router.text()), 10 * S)
        self.assertTrue(t, "no access line for %s" % rid)
        return re.search(r"id=%s .*workers=(\S+)" % re.escape(rid), router.text()).group(1).strip('"')

    def running_on(self, port, name):
        return u.metrics(port).get('dserve:worker_num_requests_running{worker="%s",role="both"}' % name)

    def test_prefix_affinity_and_failover(self):
        # w1's pool is the larger: on load alone (free KV fraction, then queue, then link order) a router picks w1
        w = {"w1": self.worker("w1", role="both", prefix_cache_mb=16, kv_budget_mb=64)}
        self.linked_both("w1")  # w1 first: on both routers it is the first link, the one a tie goes to
        w["w0"] = self.worker("w0", role="both", prefix_cache_mb=16)
        self.linked_both("w0")
        # 1. prefix affinity across routers. A's long stream holds w1, so A places PROMPT on w0; with w1 idle again
        # (as B sees it), B sends PROMPT to w0 only because w0's kv_events told it w0 holds the prompt's blocks (on
        # load alone it would pick w1, its first link).
        started, release, held = threading.Event(), threading.Event(), {}

        def on_event(i, o):
            started.set()
            return release.is_set()  # hung up once PROMPT is placed: w1 caches few blocks of it

        def hold():
            held["r"] = u.stream(self.port, "completions", {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True},
                                 on_event=on_event)
        th = threading.Thread(target=hold)
        th.start()
        self.assertTrue(started.wait(60 * S), "the long stream never started")
        st, a = u.post(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
        self.assertEqual(st, 200, a)
        self.assertEqual(self.served_by(self.router, a["id"]), "w0")
        release.set()
        th.join(120 * S)
        self.assertEqual(held["r"]["status"], 200, held["r"])
        self.assertTrue(u.wait_until(lambda: re.search(r"id=cmpl-\S+ .*status=499 .*workers=w1", self.router.text()),
                                     10 * S), "the long stream did not run on w1 (or was not cancelled)")
        self.assertTrue(u.wait_until(lambda: self.running_on(self.port_b, "w1") == 0.0 and
                                     self.running_on(self.port_b, "w0") == 0.0, 30 * S))
        st, b = u.post(self.port_b, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
        self.assertEqual(st, 200, b)
        self.assertEqual(self.served_by(self.router_b, b["id"]), "w0", "B did not follow w0's kv_events")
        self.assertGreater(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(b["choices"][0]["text"], a["choices"][0]["text"])

        # 2. nginx in front of both; router A killed under load
        nport = u.free_ports(1)[0]
        ndir = os.path.join(self.dir, "nginx")
        os.makedirs(ndir)
        os.chmod(self.dir, 0o755)
        os.chmod(ndir, 0o777)  # its workers run as nobody: their temp paths are here
        conf = os.path.join(ndir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF % {"dir": ndir, "a": self.port, "b": self.port_b, "port": nport})
        nlog = open(os.path.join(ndir, "nginx.out"), "wb")
        ng = subprocess.Popen([NGINX, "-p", ndir, "-c", conf, "-g", "daemon off;"], stdout=nlog,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.addCleanup(_stop, ng, nlog)
        self.assertTrue(u.wait_until(lambda: _up(nport) and u.get(nport, "/health")[0] == 200, 20 * S),
                        "nginx does not answer")
        results, mu, stop = [], threading.Lock(), threading.Event()

        def client(i):
            while not stop.is_set():
                t0 = time.time()
                r = u.stream(nport, "completions", {"prompt": "Story %d:" % i, "max_tokens": 6}, timeout=60)
                with mu:
                    results.append((t0, r))

        cs = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(N_STREAMS)]
        for c in cs:
            c.start()
        self.assertTrue(u.wait_until(lambda: len(results) >= 2 * N_STREAMS, 120 * S), "the load does not run")
        t_kill = time.time()
        self.router.signal(signal.SIGKILL)
        self.router.wait(10)
        n_at_kill = len(results)
        self.assertTrue(u.wait_until(lambda: len([x for x in results if x[0] > t_kill + 2.0]) >= 2 * N_STREAMS,
                                     120 * S), "the load stopped after the kill")
        stop.set()
        for c in cs:
            c.join(90 * S)
        self.assertIsNone(ng.poll())
        ok = lambda r: r["status"] == 200 and r["done"] and not r["error"]  # noqa: E731
        late = [r for t0, r in results if t0 > t_kill + 2.0]
        early = [r for t0, r in results if t_kill < t0 <= t_kill + 2.0]
        before = [(t0, r) for t0, r in results if t0 <= t_kill]
        print("FIGURE router killed: %d requests before (%d failed: in flight on the dead router), %d in the first 2 s "
              "after (%d failed), %d later (%d failed; target 0)" % (
                  len(before), sum(1 for _, r in before if not ok(r)), len(early), sum(1 for r in early if not ok(r)),
                  len(late), sum(1 for r in late if not ok(r))), file=sys.stderr)
        self.assertEqual([r for r in late if not ok(r)], [])
        # the streams in flight on the dead router ended (an error or a cut stream), none hung
        self.assertTrue(all(r["t_end"] is not None and r["t_end"] < t_kill + 60 * S for _, r in before))
        self.assertGreaterEqual(n_at_kill, 2 * N_STREAMS)
        for p in w.values():
            self.assertTrue(p.alive())


def _stop(proc, log):
    proc.terminate()  # nginx's master stops its workers
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def _up(port):
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    if not shutil.which("etcd"):
        print("etcd is not installed", file=sys.stderr)
    unittest.main()
