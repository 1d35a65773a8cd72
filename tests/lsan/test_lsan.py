#!/usr/bin/env python3
"""tests/lsan/test_lsan.py: LeakSanitizer after serving: the ASan build's router and worker serve 1000 requests, then stop.

Run by ctest in the sanitize build only (tests/lsan/CMakeLists.txt; env DSERVE_BINARY, DSERVE_SOURCE_DIR). Starts
`dserve both` (a colocated worker, 2 threads) and `dserve router` as separate processes with ASAN_OPTIONS
detect_leaks=1, sends 1000 short requests from 32 client threads (completions and chat, streamed and not, max_tokens
1..2; every 10th stream is dropped by its client after the first event, so the cancel path is in the mix), then
SIGTERMs the router and the worker and asserts: no process's stderr holds an AddressSanitizer, LeakSanitizer or UBSan
report, each exits 0, and every request got its answer (the dropped ones aside).
(A local worker, not 1P1D: on a loaded 2-core machine the ASan prefill worker falls behind 32 clients by more than the
decode worker's KV-arrival timeout, and those requests fail with `timeout` by design.)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import e2e_util as u  # noqa: E402

N_REQUESTS = 1000
CLIENTS = 32
SCALE = float(os.environ.get("DSERVE_TIMEOUT_SCALE", "1"))
REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


class Proc:
    """One dserve process with its stderr collected by a thread."""

    def __init__(self, args, env):
        self.args = args
        self.p = subprocess.Popen([u.DSERVE] + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=env)
        self.err = []
        self.t = threading.Thread(target=lambda: self.err.extend(l.decode("utf-8", "replace") for l in self.p.stderr),
                                  daemon=True)
        self.t.start()

    def text(self):
        return "".join(self.err)

    def stop(self, timeout):
        """SIGTERM, then the exit status (None when it did not exit within timeout; it is then killed)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            rc = None
        self.t.join(10)
        return rc


def one(port, i):
    """Request i; returns (i, ok, what)."""
    # Mostly one- or two-token id prompts and one or two new tokens: the ASan forward pass is the cost, and the
    # paths (admission, relay, stream, cancel, free) are the same; every 10th is chat, every 10th a text prompt.
    kind = "chat" if i % 10 == 1 else "completions"
    mt = 1 + i % 2
    if kind == "chat":
        body = {"messages": [{"role": "user", "content": "Number %d?" % i}], "max_tokens": mt}
    elif i % 10 == 3:
        body = {"prompt": "Request %d:" % i, "max_tokens": mt}
    else:
        body = {"prompt": [100 + i % 5000, 200 + i % 7][:1 + i % 2], "max_tokens": mt}
    if i % 4 == 0:
        drop = i % 40 == 0
        r = u.stream(port, kind, body, timeout=120 * SCALE,
                     on_event=(lambda n, o: True) if drop else None)
        if drop:
            return i, r["status"] == 200, "dropped stream: %r" % (r,)
        return i, r["status"] == 200 and r["done"] and not r["error"] and r["completion_tokens"] == mt, repr(r)
    r = u.complete(port, kind, body, timeout=120 * SCALE)
    return i, r["status"] == 200 and r["completion_tokens"] == mt, repr(r)


class LeakCheck(unittest.TestCase):
    def test_serve_1000_requests_then_stop_without_leaks(self):
        u.require_env(self)
        tmp = tempfile.mkdtemp(prefix="dserve-lsan-")
        self.addCleanup(shutil.rmtree, tmp, True)
        cfg = os.path.join(tmp, "local.json")
        port = u.local_config(cfg, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 32}])
        env = dict(os.environ)
        # reports on stderr, checked below; intercept_tls_get_addr=0: tests/CMakeLists.txt says why
        env["ASAN_OPTIONS"] = "halt_on_error=1:detect_leaks=1:abort_on_error=0:intercept_tls_get_addr=0"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
        procs = {"w0": Proc(["both", "--config", cfg, "--name", "w0"], env),
                 "router": Proc(["router", "--config", cfg], env)}
        bad, results, n_done = [], [], 0
        try:
            u.wait_workers(port, timeout=120 * SCALE)
            lock = threading.Lock()
            nxt = [0]

            def client():
                while True:
                    with lock:
                        i = nxt[0]
                        nxt[0] += 1
                    if i >= N_REQUESTS:
                        return
                    try:
                        res = one(port, i)
                    except Exception as e:  # noqa: BLE001 - a failed request is reported, not raised in a thread
                        res = (i, False, "exception %r" % (e,))
                    with lock:
                        results.append(res)

            t0 = time.time()
            ts = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(max(1.0, t0 + 600 - time.time()))  # within ctest's 900 s
            took = time.time() - t0
            print("lsan: %d requests in %.1f s (%d clients)" % (len(results), took, CLIENTS), file=sys.stderr)
            with lock:
                bad = [r for r in results if not r[1]]
                n_done = len(results)
        finally:
            rcs = {"router": procs["router"].stop(60 * SCALE), "w0": procs["w0"].stop(60 * SCALE)}
        for name, p in procs.items():
            text = p.text()
            found = [k for k in REPORTS if k in text]
            self.assertEqual(found, [], "%s reported:\n%s" % (name, text[-6000:]))
            self.assertEqual(rcs[name], 0, "%s exit status %r; stderr:\n%s" % (name, rcs[name], text[-3000:]))
        self.assertEqual(n_done, N_REQUESTS, "requests that never finished")
        self.assertEqual(bad, [], "%d failed requests, first: %s" % (len(bad), bad[:3]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
