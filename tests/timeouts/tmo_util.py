"""tests/timeouts/tmo_util.py: helpers for the timeout tests: configs with an inline secret, roles as separate processes, a control-protocol client that proves the secret, a fake worker listener."""

import json
import os
import secrets
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import ctl_wire as w  # noqa: E402  (the control protocol)
import e2e_util as u  # noqa: E402  (HTTP/SSE clients, free ports, the model path, SCALE)

SCALE = u.SCALE
HOST = "127.0.0.1"
SLACK_S = 3.0 * SCALE  # how late (seconds) a timeout's error may come after the bound on a loaded 2-core machine
EARLY_S = 0.05         # how early it may seem to come (clocks, the worker's receipt is after our send)


def clean_env():
    """This environment without the secret overrides (DSERVE_SECRET*), so that each role uses the config's secret."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DSERVE_SECRET")}


def write_config(path, workers, router=None, secret=None):
    """A one-node config on 127.0.0.1 with an inline secret: every worker gets a free control port, 1 thread, 32 MiB
    of KV, no prefix cache (so idle = every block free) and KV over tcp unless it says otherwise; router (a dict) gets a
    free port. Returns the config dict (its "secret" is the one the processes use)."""
    ports = u.free_ports(1 + len(workers))
    ws = []
    for w, p in zip(workers, ports[1:]):
        w = dict(w)
        w.setdefault("host", HOST)
        w.setdefault("port", p)
        w.setdefault("threads", 1)
        w.setdefault("kv_budget_mb", 32)
        w.setdefault("prefix_cache_mb", 0)
        w.setdefault("kvxfer", {"backend": "tcp"})
        ws.append(w)
    cfg = {"model": u.MODEL, "secret": secret or secrets.token_hex(32), "workers": ws}
    if router is not None:
        cfg["router"] = dict(router, host=HOST, port=ports[0])
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return cfg


class Proc(u.Proc):
    """One `dserve ROLE --config F [--name N]` process (e2e_util.Proc: its log, waits and stop) that uses the config's
    secret."""

    def __init__(self, config, role, name=None, log=None):
        self.role, self.name = role, name or role
        super().__init__([role, "--config", config] + (["--name", name] if name else []),
                         log or "%s.%s.log" % (config, self.name), env=clean_env())


# ---- the control protocol (docs/protocol.md): ctl_wire.py, the tests' one copy of it ----

Conn = w.Conn


def connect(port, secret, role="router", name="probe", timeout=10.0):
    """A control connection to a worker on 127.0.0.1:port that has proved the secret; .hello is its hello_ok."""
    return w.connect(socket.create_connection((HOST, port), timeout=timeout), secret, role=role, name=name,
                     timeout=timeout)


def stats(port, secret):
    c = connect(port, secret)
    try:
        c.send({"op": "stats"})
        return c.recv_op({"stats_ok"}, 10.0 * SCALE)
    finally:
        c.close()


def is_idle(st):
    return st["running"] == 0 and st["waiting"] == 0 and st["free_blocks"] == st["total_blocks"]


def wait_idle(port, secret, timeout):
    """The worker's stats once it has nothing running or waiting and every KV block free; else its last stats."""
    last = {}

    def f():
        try:
            last["st"] = stats(port, secret)
        except (OSError, AssertionError, ValueError) as e:
            last["st"] = repr(e)
            return None
        return last["st"] if is_idle(last["st"]) else None
    return u.wait_until(f, timeout, 0.05) or last["st"]


def wait_listening(port, secret, proc, timeout):
    """Waits until the worker on port answers a hello (it has loaded the model)."""
    end = time.time() + timeout
    while time.time() < end:
        if not proc.alive():
            raise AssertionError("%s exited with %s:\n%s" % (proc.name, proc.proc.returncode, proc.text()[-3000:]))
        try:
            connect(port, secret, timeout=2.0).close()
            return
        except (OSError, AssertionError, ValueError):
            time.sleep(0.05)
    raise AssertionError("%s did not answer on port %d within %.0f s:\n%s" %
                         (proc.name, port, timeout, proc.text()[-3000:]))


class FakeWorker:
    """A control listener that speaks the handshake (challenge, then hello_ok = hello_ok(name), a dict) and then only
    records what it is sent: it answers nothing. .msgs: every message received after the hello, in order."""

    def __init__(self, port, hello_ok, secret):
        self.hello_ok = hello_ok
        self.secret = secret  # it proves it back in hello_ok, as a worker does (a connector refuses it otherwise)
        self.msgs = []
        self.peers = []  # (role, name) of each hello
        self.conns = []
        self.lock = threading.Lock()
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind((HOST, port))
        self.ls.listen(16)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        try:
            c, h = w.accept(s, self.secret, self.hello_ok["name"], self.hello_ok)
            if c is None:
                return
            with self.lock:
                self.conns.append(c)
                self.peers.append((h.get("role"), h.get("name")))
            while True:
                m = c.recv(3600.0)
                with self.lock:
                    self.msgs.append(m)
        except (OSError, ValueError, TimeoutError, struct.error, w.InvalidTag):
            pass

    def received(self, op):
        with self.lock:
            return [m for m in self.msgs if m.get("op") == op]

    def close(self):
        self.closed = True
        self.ls.close()
        with self.lock:
            for c in self.conns:
                c.close()


class Cluster:
    """A temp dir, a config (inline secret, every host 127.0.0.1) and its roles as separate processes (not under
    `dserve launch`, so that a test can signal one role and read its exit status). Close with close() (addCleanup)."""

    def __init__(self, tag, workers, router=None):
        self.dir = tempfile.mkdtemp(prefix="dserve-tmo-%s-" % tag)
        self.config = os.path.join(self.dir, "c.json")
        self.cfg = write_config(self.config, workers, router)
        self.secret = self.cfg["secret"]
        self.port = self.cfg["router"]["port"] if router is not None else None
        self.procs = {}

    def wport(self, name):
        return next(w["port"] for w in self.cfg["workers"] if w["name"] == name)

    def start_worker(self, name, timeout=60.0):
        w = next(w for w in self.cfg["workers"] if w["name"] == name)
        p = self.procs[name] = Proc(self.config, w.get("role", "both"), name)
        wait_listening(w["port"], self.secret, p, timeout * SCALE)
        return p

    def start(self, workers=None, timeout=60.0):
        """Starts the named workers (default all), then the router (when the config has one) and waits until it
        serves a one-token completion."""
        for w in self.cfg["workers"]:
            if workers is None or w["name"] in workers:
                self.start_worker(w["name"], timeout)
        if self.port is not None:
            self.procs["router"] = Proc(self.config, "router")
            u.wait_workers(self.port, timeout * SCALE)
        return self

    def stats(self, name):
        return stats(self.wport(name), self.secret)

    def wait_idle(self, name, timeout):
        return wait_idle(self.wport(name), self.secret, timeout)

    def logs(self):
        return "".join("---- %s log:\n%s\n" % (n, p.text()[-4000:]) for n, p in self.procs.items())

    def close(self):
        for p in self.procs.values():
            p.stop()
        if os.environ.get("DSERVE_E2E_KEEP"):
            print("kept", self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
