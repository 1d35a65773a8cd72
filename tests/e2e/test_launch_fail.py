"""tests/e2e/test_launch_fail.py: `dserve launch` fails fast (issue 29's replays): a missing or truncated model, a busy port, an out-of-range option, a max_model_len the KV pool cannot hold one request of, or a secret file that is a FIFO make it exit non-zero within 5 s with the cause in its output, instead of restarting forever."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import e2e_util as u

BOUND_S = 5.0 * u.SCALE


class LaunchFailsFast(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dserve-launchfail-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def launch(self, cfg, env=None):
        """Runs `dserve launch` on cfg (a dict); returns (exit status, seconds, output). Fails the test past 30 s."""
        path = os.path.join(self.dir, "c.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        t0 = time.time()
        p = subprocess.Popen([u.DSERVE, "launch", "--config", path, "--node", "local", "--grace-s", "3"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            out, _ = p.communicate(timeout=30 * u.SCALE)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            self.fail("dserve launch still ran after 30 s:\n" + out.decode("utf-8", "replace")[-3000:])
        return p.returncode, time.time() - t0, out.decode("utf-8", "replace")

    def config(self, model=u.MODEL, worker=None, router=None):
        ports = u.free_ports(2)
        w = dict({"name": "w0", "role": "both", "port": ports[1], "threads": 1, "kv_budget_mb": 16}, **(worker or {}))
        return {"model": model, "router": dict({"port": ports[0]}, **(router or {})), "workers": [w]}

    def assert_fails_fast(self, cfg, *needles, env=None):
        rc, secs, out = self.launch(cfg, env)
        self.assertNotEqual(rc, 0, out)
        self.assertLess(secs, BOUND_S, out)
        for n in needles:
            self.assertIn(n, out)
        self.assertNotIn("restarting in", out)
        self.assertNotIn("ready (router", out)
        return out

    def test_missing_model(self):
        missing = os.path.join(self.dir, "no-such-model.gguf")
        self.assert_fails_fast(self.config(model=missing), "no-such-model.gguf")

    def test_truncated_model(self):
        cut = os.path.join(self.dir, "cut.gguf")
        with open(u.MODEL, "rb") as src, open(cut, "wb") as dst:
            dst.write(src.read(1 << 20))
        out = self.assert_fails_fast(self.config(model=cut), "w0", "failed at start-up")
        self.assertIn("cut.gguf", out)

    def test_busy_worker_port(self):
        s = socket.socket()  # bound, not listening: the launcher's probe of the port must not find it "up"
        s.bind(("127.0.0.1", 0))
        self.addCleanup(s.close)
        self.assert_fails_fast(self.config(worker={"port": s.getsockname()[1]}), "w0", "failed at start-up",
                               "in use")

    def test_busy_router_port(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.addCleanup(s.close)
        self.assert_fails_fast(self.config(router={"port": s.getsockname()[1]}), "router", "failed at start-up")

    def test_threads_out_of_range(self):
        rc, secs, out = self.launch(self.config(worker={"threads": 4096}))
        self.assertEqual(rc, 2, out)  # the config's range is the workers' range: refused before anything starts
        self.assertIn("threads", out)
        self.assertIn("1..1024", out)

    def test_tiny_kv_budget(self):
        self.assert_fails_fast(self.config(worker={"kv_budget_mb": 0.0001}), "w0", "failed at start-up")

    def test_max_model_len_beyond_the_pool(self):
        # SmolLM2: 23,040 KV bytes a token at f16, so 16 MiB hold 728 tokens: never one request of 4096
        cfg = self.config(worker={"kv_budget_mb": 16})
        cfg["max_model_len"] = 4096
        self.assert_fails_fast(cfg, "w0", "failed at start-up", "max_model_len 4096 needs 256 KV blocks",
                                     "the pool of kv_budget_mb 16 holds 45 (720 tokens)")
        cfg["max_model_len"] = 512  # what it holds: served
        cfg["workers"][0]["port"], cfg["router"]["port"] = u.free_ports(2)
        with open(os.path.join(self.dir, "ok.json"), "w") as f:
            json.dump(cfg, f)
        n = u.Node(os.path.join(self.dir, "ok.json"))
        self.addCleanup(n.stop)
        u.wait_serving([n], n, ["w0"], cfg["router"]["port"])

    def test_secret_file_that_is_a_fifo(self):
        fifo = os.path.join(self.dir, "secret.fifo")
        os.mkfifo(fifo, 0o600)
        cfg = self.config()
        cfg["secret_file"] = fifo
        env = dict(os.environ)
        env.pop("DSERVE_SECRET", None)
        rc, secs, out = self.launch(cfg, env)
        self.assertNotEqual(rc, 0, out)
        self.assertLess(secs, BOUND_S, out)
        self.assertIn("not a regular file", out)


if __name__ == "__main__":
    unittest.main()
