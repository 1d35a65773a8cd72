"""tests/attack/test_attack.py: issue 17's attacks, replayed by a process on the same host against the shipped configs.

configs/local.json and configs/1p1d.json (and 1p1d with kvxfer over tcp) are copied to a temp dir with free ports and
the model path made absolute, and started with `dserve launch` with no secret anywhere, as a user would: the
launcher's per-launch secret applies. Then, as an attacker who knows the ports but not the secret:
  - `hello` without `auth`, with a wrong proof and with an empty-key proof, and `generate` sent first: no hello_ok
    (which would carry the KV pool's address and kvxfer region keys), the connection closed;
  - kvxfer over tcp: the handshake with an empty or a wrong secret, and a WRITE frame instead of a handshake: refused;
  - kvxfer over shm: the socket is 0600 in a 0700 folder; another user cannot connect; this user without the secret
    is refused at the handshake, and asking for the pool's memfd first is refused too;
and the decode worker's KV memory is unchanged (a repeated long prompt, served from its prefix cache, gives the same
greedy answer before and after), every refusal was logged with the peer and counted (`auth_failures` in the
workers' stats_ok read over a properly authenticated connection, and `dserve:auth_failures_total` on the router
once /metrics exposes it). Configs that must not start (a non-loopback host with an inline, short or missing secret,
placeholders) exit non-zero with a clear message.
"""

import glob
import hashlib
import hmac
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import ctl_wire  # noqa: E402
import e2e_util as u  # noqa: E402  (free ports, `dserve launch` nodes, HTTP and control clients)

SCALE = u.SCALE
LONG = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a wooden press adapted from those used for wine. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell sharply. "
        "Summarize the consequences of this invention in one sentence:")


def clean_env():
    """This environment without any secret (e2e_util puts the tests' one in it): the shipped set-up."""
    env = dict(os.environ)
    env.pop("DSERVE_SECRET", None)
    env.pop("DSERVE_SECRET_FILE", None)
    return env


# ---- the control protocol, spoken by hand ----

def send_frame(s, obj):
    b = json.dumps(obj).encode()
    s.sendall(struct.pack(">I", len(b)) + b)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        c = s.recv(n - len(buf))
        if not c:
            return None
        buf += c
    return buf


def recv_frame(s):
    """The next message, or None when the other side closed (or reset) the connection."""
    try:
        h = recv_exact(s, 4)
        if h is None:
            return None
        b = recv_exact(s, struct.unpack(">I", h)[0])
        return None if b is None else json.loads(b)
    except (ConnectionResetError, BrokenPipeError):
        return None


def control_attack(port, first):
    """Connects to a worker's control port, reads the challenge, sends first(nonce) and returns what came back (None
    = the connection was closed without a word)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10 * SCALE)
    try:
        ch = recv_frame(s)
        assert ch and ch.get("op") == "challenge", ch
        try:
            send_frame(s, first(ch["nonce"]))
        except (BrokenPipeError, ConnectionResetError):
            return None
        return recv_frame(s)
    finally:
        s.close()


# ---- kvxfer's handshake, spoken by hand (kvxfer/kvx_wire.c) ----
# Version 2: "KVH2" greeting, "KVC2" hello with the seal setting, "KVS2" reply of 44 bytes.
HS_S, HS_C, HS_R, FRAME = 0x3248564B, 0x3243564B, 0x3253564B, 0x4658564B
HS_REPLY = 44


def kvx_client_hello(nonce_s, key, name=b"attacker", seal=1):
    nc = os.urandom(32)
    sc = bytes([seal])
    mac = hmac.new(key, b"kvx-client-2" + nonce_s + nc + name + sc, hashlib.sha256).digest()
    return struct.pack("<IH", HS_C, len(name)) + name + nc + sc + mac


def kvx_attack(sock, key=None, frame=None):
    """Reads the agent's greeting on sock, then sends a client hello with key (bytes), or the raw frame instead.
    Returns (greeted, status: 0 ok / 1 refused / None nothing, closed: the agent closed the connection after)."""
    sock.settimeout(10 * SCALE)
    g = recv_exact(sock, 36)
    if g is None or struct.unpack("<I", g[:4])[0] != HS_S:
        return False, None, True
    try:
        sock.sendall(frame if frame is not None else kvx_client_hello(g[4:], key))
        r = recv_exact(sock, HS_REPLY)
    except (ConnectionResetError, BrokenPipeError):
        r = None
    status = None if r is None else struct.unpack("<II", r[:8])[1]
    try:
        closed = sock.recv(1) == b""
    except (ConnectionResetError, socket.timeout):
        closed = True
    return True, status, closed


def kvx_write_frame():
    """A WRITE of 64 zero bytes to address 0x1000 with region key 1, as the first thing on the connection."""
    return struct.pack("<IHHQQQQ", FRAME, 1, 0, 0, 0x1000, 64, 1) + bytes(64)


def kvx_fds_req_frame():
    return struct.pack("<IHHQQQQ", FRAME, 9, 0, 0, 0, 0, 0)


class Shipped:
    """A shipped config (configs/NAME), copied with free ports and an absolute model path, under `dserve launch`
    with no secret in the config or the environment."""

    def __init__(self, name, backend=None):
        with open(os.path.join(u.SOURCE_DIR, "configs", name)) as f:
            cfg = json.load(f)
        assert "secret" not in cfg and "secret_file" not in cfg, "%s ships a secret: %r" % (name, cfg)
        self.dir = tempfile.mkdtemp(prefix="dserve-attack-")
        ports = u.free_ports(1 + 2 * len(cfg["workers"]))
        cfg["model"] = u.MODEL
        cfg["router"]["port"] = ports[0]
        for i, w in enumerate(cfg["workers"]):
            w["port"] = ports[1 + 2 * i]
            w["kv_budget_mb"] = min(w.get("kv_budget_mb", 256), 64)
            if "kvxfer" in w:
                w["kvxfer"]["port"] = ports[2 + 2 * i]
                if backend:
                    w["kvxfer"]["backend"] = backend
        self.cfg = cfg
        self.port = ports[0]
        self.config = os.path.join(self.dir, name)
        with open(self.config, "w") as f:
            json.dump(cfg, f, indent=1)
        self.node = u.Node(self.config, env=clean_env())

    def start(self):
        u.wait_serving([self.node], self.node, [w["name"] for w in self.cfg["workers"]], self.port, 120)
        return self

    def worker(self, name):
        return next(w for w in self.cfg["workers"] if w["name"] == name)

    def secret(self):
        """The per-launch secret, as the launcher handed it to a child: the file named by DSERVE_SECRET_FILE in its
        environment (readable by this same user, as it must be for the children)."""
        pid = self.node.child_pid(self.cfg["workers"][0]["name"])
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        path = env[b"DSERVE_SECRET_FILE"].decode()
        with open(path) as f:
            return path, f.read().strip()

    def stats(self, name):
        _, secret = self.secret()
        return u.worker_stats(self.worker(name)["port"], secret=secret)

    def close(self):
        self.node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def connect_as_nobody(path):
    """Whether a process of user nobody can connect to the unix socket path: True, or the errno that stopped it."""
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try, report in the exit status
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            code = 100
        except OSError as e:
            code = min(e.errno or 1, 99)
        os._exit(code)
    _, st = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(st)
    return True if code == 100 else code


class AttackCase:
    """The attacks against one shipped config (a mixin: each subclass is also a unittest.TestCase)."""
    CONFIG, BACKEND = None, None

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        cls.c = Shipped(cls.CONFIG, cls.BACKEND)
        cls.addClassCleanup(cls.c.close)
        cls.c.start()

    def greedy(self):
        r = u.complete(self.c.port, "completions", {"prompt": LONG, "max_tokens": 16, "temperature": 0})
        self.assertEqual(r["status"], 200, r)
        return r["text"]

    def test_per_launch_secret_is_private(self):
        path, secret = self.c.secret()
        self.assertRegex(secret, r"^[0-9a-f]{64}$")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode), 0o700)
        for w in self.c.cfg["workers"]:  # never on a command line
            argv = u._cmdline(self.c.node.child_pid(w["name"]))
            self.assertNotIn(secret.encode(), b" ".join(argv))
        self.assertIn("made a per-launch secret", self.c.node.text())

    def control_attacks(self, name):
        """Every control-port attack against worker name; returns how many were made."""
        port = self.c.worker(name)["port"]
        addr = "127.0.0.1:%d" % port

        def hello(auth_key):  # a hello of this protocol version for this member, with a proof under auth_key or none
            def make(n):
                h = {"op": "hello", "role": "router", "name": "attacker", "proto": ctl_wire.PROTO, "nonce": "ab" * 16,
                     "member": name, "addr": addr}
                if auth_key is not None:
                    h["auth"] = ctl_wire.proof(auth_key, n, h["nonce"], "attacker", name, addr)
                return h
            return make
        attacks = {
            "hello without auth": hello(None),
            "hello with a wrong proof": hello("change-me"),
            "hello with an empty-key proof": hello(""),
            "generate straight to the worker": lambda n: {"op": "generate", "id": "evil-1", "prompt": [1, 2, 3],
                                                          "max_tokens": 4, "sampling": {"temperature": 0}},
        }
        for what, first in attacks.items():
            got = control_attack(port, first)
            self.assertIsNone(got, "%s on %s answered %r" % (what, name, got))
        return len(attacks)

    def check_counted(self, expected, before_metric):
        """Each worker counted its refusals (stats_ok auth_failures) and logged them with the peer's address; the
        router's /metrics total grew as much, when /metrics has it."""
        total = 0
        for name, n in expected.items():
            st = self.c.stats(name)
            self.assertGreaterEqual(st.get("auth_failures", -1), n, "%s: %r" % (name, st))
            total += n
        log = self.c.node.text()
        self.assertIn("refused a control peer from 127.0.0.1:", log)
        if before_metric is not None:
            got = u.wait_until(lambda: (lambda m: m if m >= before_metric + total else None)(
                u.metrics(self.c.port).get("dserve:auth_failures_total", 0)), 10 * SCALE)
            self.assertTrue(got, "dserve:auth_failures_total did not grow by %d: %r" % (
                total, u.metrics(self.c.port).get("dserve:auth_failures_total")))

    def metric_before(self):
        return u.metrics(self.c.port).get("dserve:auth_failures_total")  # None until the router exposes it


class ShippedLocal(AttackCase, unittest.TestCase):
    CONFIG = "local.json"

    def test_control_attacks_are_refused_and_counted(self):
        before = self.greedy()
        m0 = self.metric_before()
        n = self.control_attacks("w0")
        self.assertEqual(self.greedy(), before)
        self.check_counted({"w0": n}, m0)


def unix_sockets_of(pid):
    """The paths of the unix sockets process pid holds open (its fds' socket inodes, named in /proc/net/unix)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    with open("/proc/net/unix") as f:
        rows = [ln.split() for ln in f.read().splitlines()[1:]]
    return {r[7] for r in rows if len(r) >= 8 and r[6] in inodes}


class Shipped1P1DShm(AttackCase, unittest.TestCase):
    CONFIG = "1p1d.json"

    def shm_socket(self):
        """The decode worker's kvxfer unix socket: s.sock in its private kvx-PID-XXXXXX folder."""
        pid = self.c.node.child_pid("d0")
        tmp = os.environ.get("TMPDIR") or "/tmp"
        found = glob.glob(os.path.join(tmp, "kvx-%d-*" % pid, "s.sock"))
        if len(found) > 1:  # a process killed earlier with the same pid (pids wrap) left its folder: keep d0's own
            found = [f for f in found if f in unix_sockets_of(pid)]
        self.assertEqual(len(found), 1, "no shm socket of d0 (pid %d) under %s: %r" % (pid, tmp, found))
        return found[0]

    def test_attacks_leave_the_kv_pool_unchanged(self):
        before = self.greedy()
        self.assertEqual(self.greedy(), before)  # the second one is served from d0's prefix cache
        m0 = self.metric_before()
        n = {"p0": self.control_attacks("p0"), "d0": self.control_attacks("d0")}

        path = self.shm_socket()
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode), 0o700)
        if os.geteuid() == 0:  # another user cannot even reach the socket
            got = connect_as_nobody(path)
            self.assertIsNot(got, True, "user nobody connected to %s" % path)
            self.assertEqual(got, 13, "user nobody: errno %r, not EACCES" % got)
        # this user, without the secret: refused at the handshake, and so is asking for the pool's memfd first
        for key in (b"", b"change-me"):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            greeted, status, closed = kvx_attack(s, key=key)
            s.close()
            self.assertTrue(greeted)
            self.assertEqual(status, 1, "shm handshake with secret %r was not refused" % key)
            self.assertTrue(closed)
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        greeted, status, closed = kvx_attack(s, frame=kvx_fds_req_frame())
        s.close()
        self.assertNotEqual(status, 0)
        self.assertTrue(closed)
        n["d0"] += 3

        self.assertEqual(self.greedy(), before, "the decode worker's cached KV changed")
        self.check_counted(n, m0)
        self.assertIn("shm: refused connection from pid", self.c.node.text())


class Shipped1P1DTcp(AttackCase, unittest.TestCase):
    CONFIG, BACKEND = "1p1d.json", "tcp"

    def test_kvxfer_tcp_attacks_are_refused(self):
        before = self.greedy()
        self.assertEqual(self.greedy(), before)
        m0 = self.metric_before()
        kport = self.c.worker("d0")["kvxfer"]["port"]
        for key in (b"", b"change-me"):
            with socket.create_connection(("127.0.0.1", kport), timeout=10) as s:
                greeted, status, closed = kvx_attack(s, key=key)
            self.assertTrue(greeted)
            self.assertEqual(status, 1, "tcp handshake with secret %r was not refused" % key)
            self.assertTrue(closed)
        with socket.create_connection(("127.0.0.1", kport), timeout=10) as s:  # WRITE frames without a handshake
            greeted, status, closed = kvx_attack(s, frame=kvx_write_frame())
        self.assertNotEqual(status, 0)
        self.assertTrue(closed)
        n = {"d0": 3 + self.control_attacks("d0")}
        self.assertEqual(self.greedy(), before, "the decode worker's cached KV changed")
        self.check_counted(n, m0)
        self.assertIn("refused connection from 127.0.0.1:", self.c.node.text())


class RefusedConfigs(unittest.TestCase):
    """Configs that must not start: `dserve launch` (and a role started by hand) exits non-zero and says why."""

    def setUp(self):
        u.require_env(self)
        self.dir = tempfile.mkdtemp(prefix="dserve-attack-cfg-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def write(self, name, text, mode=0o600):
        p = os.path.join(self.dir, name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, mode)
        return p

    def local(self, **top):
        with open(os.path.join(u.SOURCE_DIR, "configs", "local.json")) as f:
            cfg = json.load(f)
        cfg["model"] = u.MODEL
        cfg["router"]["port"], cfg["workers"][0]["port"] = u.free_ports(2)
        cfg.update(top)
        return cfg

    def run_dserve(self, args, env_extra=None):
        env = clean_env()
        env.update(env_extra or {})
        r = subprocess.run([u.DSERVE] + args, env=env, capture_output=True, text=True, timeout=60 * SCALE)
        return r.returncode, r.stdout + r.stderr

    def refused(self, cfg, want, env_extra=None, roles=("launch",)):
        path = self.write("c.json", json.dumps(cfg), 0o644)
        for role in roles:
            args = {"launch": ["launch", "--config", path, "--node", "local"],
                    "router": ["router", "--config", path],
                    "both": ["both", "--config", path, "--name", "w0"]}[role]
            rc, out = self.run_dserve(args, env_extra)
            self.assertNotEqual(rc, 0, "%s started with %r:\n%s" % (role, cfg, out))
            self.assertIn(want, out, "%s: %s" % (role, out))

    def test_non_loopback_with_an_inline_secret(self):
        cfg = self.local(secret="0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0")
        cfg["router"]["host"] = "0.0.0.0"
        self.refused(cfg, "an inline secret is refused because router.host \"0.0.0.0\" is not a loopback address",
                     roles=("launch", "router", "both"))

    def test_non_loopback_with_a_short_secret(self):
        cfg = self.local(secret_file=self.write("short.secret", "k2Pq9xZ7mW4nT1vB\n"))
        cfg["workers"][0]["host"] = "0.0.0.0"
        self.refused(cfg, "too weak for a cluster reachable from other hosts", roles=("launch", "both"))
        cfg = self.local()
        cfg["workers"][0]["host"] = "0.0.0.0"
        self.refused(cfg, "DSERVE_SECRET: refused: too weak", env_extra={"DSERVE_SECRET": "k2Pq9xZ7mW4nT1vB"})

    def test_non_loopback_without_a_secret(self):
        cfg = self.local()
        cfg["workers"][0]["kvxfer"] = {"host": "0.0.0.0"}
        self.refused(cfg, "is not a loopback address, so the cluster needs a shared secret from a file")

    def test_placeholders_are_refused_even_on_loopback(self):
        for p in ("change-me", "changeme", "secret", "password", "example", "x" * 40):
            self.refused(self.local(secret=p), "refused:", roles=("launch", "both"))
        self.refused(self.local(), "DSERVE_SECRET: refused:", env_extra={"DSERVE_SECRET": "please-change-me-now-12345"})

    def test_secret_file_must_be_private(self):
        sf = self.write("open.secret", "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0\n", 0o644)
        self.refused(self.local(secret_file=sf), "chmod 600")

    def test_shipped_cluster_needs_its_secret_file(self):
        cfg_path = os.path.join(u.SOURCE_DIR, "configs", "cluster.json")
        if os.path.exists(os.path.join(u.SOURCE_DIR, "configs", "cluster.secret")):
            self.skipTest("configs/cluster.secret exists here")
        rc, out = self.run_dserve(["launch", "--config", cfg_path, "--node", "router"])
        self.assertEqual(rc, 2, out)
        self.assertIn("secret_file: cannot open", out)

    def test_a_role_without_a_secret_does_not_listen(self):
        cfg = self.local()
        port = cfg["workers"][0]["port"]
        self.refused(cfg, "no shared secret", roles=("router", "both"))
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


if __name__ == "__main__":
    unittest.main()
