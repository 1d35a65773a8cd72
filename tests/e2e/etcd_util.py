"""tests/e2e/etcd_util.py: a real etcd (Debian's etcd-server) for the discovery tests: loopback, free ports, a temp data
dir; killed and started again on the same ports and data to play an outage; keys read and written over its gateway."""

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

import e2e_util as u


def etcd_binary():
    """The etcd binary, or None."""
    for p in (os.environ.get("DSERVE_ETCD", ""), "/usr/bin/etcd", "/usr/local/bin/etcd"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def require_etcd():
    if not etcd_binary():
        raise unittest.SkipTest("no etcd binary (Debian package etcd-server; scripts/setup.sh installs it)")


def _b64(s):
    return base64.b64encode(s.encode()).decode()


class Etcd:
    def __init__(self, host="127.0.0.1", prefix=()):
        """host: the client address; prefix: a command prefix (`ip netns exec NS`: then start(wait=False), since
        this namespace cannot reach it)."""
        self.dir = tempfile.mkdtemp(prefix="dserve-etcd-")
        self.client_port, self.peer_port = u.free_ports(2)
        self.url = "http://%s:%d" % (host, self.client_port)
        self.prefix = list(prefix)
        self.proc = None
        self.log = open(os.path.join(self.dir, "etcd.log"), "ab")

    def start(self, timeout=20.0, wait=True):
        """Starts it (same ports and data as before after kill) and returns once it answers: time.time() then."""
        peer = "http://127.0.0.1:%d" % self.peer_port
        self.proc = subprocess.Popen(self.prefix + [etcd_binary(), "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
                                      "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                                      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                      "--initial-cluster", "t=" + peer, "--log-level", "error"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not wait:
            return None
        end = time.time() + timeout * u.SCALE
        while time.time() < end:
            try:
                self.call("/v3/kv/range", {"key": _b64("/probe")}, timeout=1)
                return time.time()
            except OSError:
                time.sleep(0.05)
        raise AssertionError("etcd did not answer within %.0f s" % timeout)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self):
        self.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, path, body, timeout=5):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def keys(self, prefix):
        """{key: value (parsed JSON)} of every key under prefix."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        r = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return {base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv.get("value", "")) or b"null")
                for kv in r.get("kvs", [])}

    def put(self, key, value):
        self.call("/v3/kv/put", {"key": _b64(key), "value": _b64(json.dumps(value))})

    def delete(self, key):
        self.call("/v3/kv/deleterange", {"key": _b64(key)})

    def put_many(self, items):
        """Puts every (key, value) of items, 100 to a transaction (etcd's default limit is 128 operations)."""
        items = list(items)
        for i in range(0, len(items), 100):
            ops = [{"request_put": {"key": _b64(k), "value": _b64(json.dumps(v))}} for k, v in items[i:i + 100]]
            self.call("/v3/kv/txn", {"success": ops})

    def delete_prefix(self, prefix):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        self.call("/v3/kv/deleterange", {"key": _b64(prefix), "range_end": _b64(end)})
