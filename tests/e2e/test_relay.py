"""tests/e2e/test_relay.py: a process that knows no secret copies a live worker's etcd record under a new name and its
own port and relays bytes to the real worker (issue 39 item 1). The router must refuse it (the proof covers the member
it dialled and the address it reached), the relay must see no prompt and no generated text, and every request is
served by the real worker. Real etcd, real router and worker processes, loopback."""

import select
import socket
import threading
import unittest

import e2e_util as u

S = u.SCALE
PROMPT = "The relay must never read this sentence about lighthouse keepers and bottles:"


class Relay:
    """Listens on a loopback port of its own and forwards every connection to target, keeping a copy of each byte."""

    def __init__(self, target_port):
        self.target = target_port
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.seen = bytearray()
        self.conns = 0
        self.mu = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                a, _ = self.ls.accept()
            except OSError:
                return
            with self.mu:
                self.conns += 1
            threading.Thread(target=self._pipe, args=(a,), daemon=True).start()

    def _pipe(self, a):
        try:
            b = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            a.close()
            return
        socks = [a, b]
        try:
            while not self.closed:
                r, _, _ = select.select(socks, [], [], 0.2)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    with self.mu:
                        self.seen += data
                    (b if s is a else a).sendall(data)
        except OSError:
            pass
        finally:
            a.close()
            b.close()

    def bytes_seen(self):
        with self.mu:
            return bytes(self.seen)

    def close(self):
        self.closed = True
        self.ls.close()


class RelayTest(u.DiscoCluster, unittest.TestCase):
    def setUp(self):
        self.start_cluster({}, tag="relay")

    def test_relay_under_another_name_is_refused_and_reads_nothing(self):
        cfg = {"model": u.MODEL, "discovery": self.discovery,
               "workers": [{"name": "w0", "role": "both", "host": "127.0.0.1", "port": 0, "threads": 1,
                            "kv_budget_mb": 32, "max_seqs": 8}]}
        self._start(["both", "--config", self._write("w0.json", cfg), "--name", "w0"], "w0.log")
        self.router.line_time(r"router: worker w0 \(both, [^)]*\) connected", 60 * S)
        recs = self.etcd.keys("/dserve/e2e/workers/")
        key, rec = next((k, v) for k, v in recs.items() if v.get("name") == "w0")
        relay = Relay(rec["port"])
        self.addCleanup(relay.close)
        # The copy: the same record (model fingerprint included) under a new key and name, at the relay's port.
        self.etcd.put(key.rsplit("/", 1)[0] + "/evil", dict(rec, name="evil", port=relay.port))
        self.router.line_time(r"member evil\) refused the hello: it dialled member 'evil' at 127\.0\.0\.1:%d, but "
                              r"this is 'w0'" % relay.port, 30 * S)
        body = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}
        res = u.run_threads([lambda: u.complete(self.port, "completions", body) for _ in range(6)], 120 * S)
        self.assertEqual([r["status"] for r in res], [200] * 6, res)
        seen = relay.bytes_seen()
        self.assertGreater(relay.conns, 0, "the router never dialled the copied record")
        self.assertIn(b'"challenge"', seen)  # it did relay the handshake
        for r in res:
            self.assertNotIn(r["text"].strip().encode(), seen)
        for marker in (b"lighthouse", b"generate", b"hello_ok", b"kv_layout"):
            self.assertNotIn(marker, seen)
        self.assertNotRegex(self.router.text(), r"worker evil \(both, [^)]*\) connected")


if __name__ == "__main__":
    unittest.main()
