"""tests/e2e/e2e_util.py: helpers for the end-to-end tests: configs on free ports, `dserve launch` nodes, HTTP/SSE and control-protocol clients."""

import datetime
import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import signal
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import ctl_wire  # the control protocol: handshake and sealed frames

DSERVE = os.environ.get("DSERVE_BINARY", "")
SOURCE_DIR = os.environ.get("DSERVE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODEL = os.path.join(SOURCE_DIR, "models", "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = os.path.join(SOURCE_DIR, "models", "weights", "gemma-3-270m-q4_k_m.gguf")  # sliding-window layers
HERE = os.path.dirname(os.path.abspath(__file__))
SCALE = float(os.environ.get("DSERVE_TIMEOUT_SCALE", "1"))  # the sanitize build sets 4: waits and bounds scale by it

# The shared secret of every cluster these tests start (= tests/test_secret.h): in the environment, so `dserve launch`,
# its children and roles started directly all find it (also the multi-node and network-namespace configs, where an
# inline secret is refused); Control proves it.
TEST_SECRET = "dc3c80b87648d296023e7386aece451e900f9b6bd254473a88a2fe5e7db030af"
os.environ["DSERVE_SECRET"] = TEST_SECRET
os.environ.pop("DSERVE_SECRET_FILE", None)


def wait_until(cond, timeout, step=0.02):
    """cond()'s first truthy value within timeout, else its last value."""
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return cond()


def require_env(test):
    """Skips (with the reason) when the dserve binary or the model is missing."""
    if not DSERVE or not os.access(DSERVE, os.X_OK):
        raise unittest.SkipTest("DSERVE_BINARY is not set to an executable (run through ctest)")
    if not os.path.exists(MODEL):
        raise unittest.SkipTest("the model %s is missing: run scripts/setup.sh" % MODEL)


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (outgoing connections take their local port from it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1, drawn below the kernel's ephemeral range: a port bound to 0 comes
    from that range, where any outgoing connection (another test's client) may take it before the server binds it."""
    lo, hi = 10000, _ephemeral_low()
    if hi - lo < 1000:
        lo, hi = 1024, 65536
    rng = random.SystemRandom()
    ports = []
    while len(ports) < n:
        p = rng.randrange(lo, hi)
        if p in ports:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            s.close()
        ports.append(p)
    return ports


def local_config(path, workers, disagg_threshold=1000, model=MODEL, router=None, extra=None):
    """Writes a one-node config (router + workers on 127.0.0.1, free ports) to path; returns the router port.

    workers: list of dicts with at least name and role; port, threads (1), kv_budget_mb (32) are filled in.
    router: more keys of the router section (e.g. {"prefix_fetch": True}, {"link_dead_ms": 4000}).
    extra: more top-level sections (e.g. {"logging": {"format": "json"}, "tracing": {...}}).
    disagg_policy defaults to "threshold" here: a test that sets disagg_threshold 0 means every prompt to be handed
    off, idle decode worker or not (policy auto, the product default, is tested on its own in test_1p1d.py)."""
    ports = free_ports(1 + len(workers))
    ws = []
    for w, p in zip(workers, ports[1:]):
        w = dict(w)
        w.setdefault("port", p)
        w.setdefault("threads", 1)
        w.setdefault("kv_budget_mb", 32)
        ws.append(w)
    router = dict(router or {}, port=ports[0], disagg_threshold=disagg_threshold)
    router.setdefault("disagg_policy", "threshold")
    cfg = dict(extra or {}, model=model, router=router, workers=ws)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return ports[0]


def _children(pid):
    """Pids whose parent is pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
            if int(st[st.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(d))
        except (OSError, ValueError):
            pass
    return out


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def log_time(line):
    """time.time() of a dserve log line ("2026-12-05T12:42:04.132Z INFO ...")."""
    t = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


class Logged:
    """The waits on a process's log file shared by Proc and Node (self.proc: its Popen; self.log_path: its log).
    Tests wait on such an observable (a log line, /metrics, a stats_ok field), never on a fixed sleep."""

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def _what(self):
        return "the process"

    def wait_for(self, needle, timeout=30.0, after=0):
        """Waits until the log (from offset after) contains needle; raises with the log tail otherwise (at once when
        the process exits first)."""
        end = time.time() + timeout
        while time.time() < end:
            t = self.text()
            if needle in t[after:]:
                return
            if self.proc.poll() is not None:
                raise AssertionError("%s exited %s before '%s':\n%s" % (self._what(), self.proc.returncode, needle,
                                                                        t[-3000:]))
            time.sleep(0.05)
        raise AssertionError("no '%s' within %.0f s:\n%s" % (needle, timeout, self.text()[-3000:]))

    def wait_count(self, needle, n, timeout=30.0):
        """Waits until the log contains needle at least n times."""
        end = time.time() + timeout
        while time.time() < end:
            if self.text().count(needle) >= n:
                return
            time.sleep(0.05)
        raise AssertionError("'%s' not %d times within %.0f s:\n%s" % (needle, n, timeout, self.text()[-3000:]))

    def line_time(self, pattern, timeout):
        """time.time() of the first log line matching the regex pattern, waiting up to timeout; raises with the log
        tail."""
        end = time.time() + timeout
        while True:
            for line in self.text().splitlines():
                if re.search(pattern, line):
                    return log_time(line)
            if time.time() > end:
                raise AssertionError("no log line /%s/ within %.0f s:\n%s" % (pattern, timeout, self.text()[-3000:]))
            time.sleep(0.02)


class Proc(Logged):
    """One `dserve ARGV` process (a role, serve, ...) with its output in the log file log."""

    def __init__(self, argv, log, env=None, cwd=None):
        self.log_path = log
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([DSERVE] + list(argv), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        self.pid = self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        """The exit status, or None when it did not exit within timeout."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, term_s=None):
        """SIGKILL (term_s None), else SIGTERM and SIGKILL after term_s; returns the exit status."""
        if self.alive() and term_s is not None:
            self.proc.terminate()
            self.wait(term_s)
        if self.alive():
            self.proc.kill()
        rc = self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return rc


class Node(Logged):
    """One `dserve launch --config F --node N` process (optionally prefixed, e.g. by `ip netns exec NS`)."""

    def __init__(self, config, node="local", log=None, prefix=(), backoff_ms=100, env=None):
        self.config = config
        self.log_path = log or (config + "." + node + ".log")
        self.log = open(self.log_path, "wb")
        self.seen = set()  # every child pid ever seen (killed in stop)
        self.proc = subprocess.Popen(list(prefix) + [DSERVE, "launch", "--config", config, "--node", node,
                                                     "--grace-s", "3", "--backoff-ms", str(backoff_ms)],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.node = node

    def _what(self):
        return "launcher"

    def wait_ready(self, timeout=60.0):
        self.wait_for("dserve: node %s ready" % self.node, timeout)
        self._scan()

    def wait_connected(self, names, timeout=30.0, after=0):
        """Waits until the router (on this node) has logged a connection to every worker in names."""
        end = time.time() + timeout
        pats = [re.compile(r"router: worker %s \((both|prefill|decode), [^)]*\) connected" % re.escape(n)) for n in names]
        while time.time() < end:
            t = self.text()[after:]
            if all(p.search(t) for p in pats):
                return
            time.sleep(0.05)
        raise AssertionError("the router did not connect to all of %s within %.0f s:\n%s" % (names, timeout, self.text()[-3000:]))

    def _scan(self):
        # The launcher may be a child of `ip netns exec` (which execs, so the pid is the same).
        for c in _children(self.proc.pid):
            self.seen.add(c)

    def child_pid(self, name):
        """The pid of the running child that runs worker name (or the router for name 'router')."""
        for c in _children(self.proc.pid):
            self.seen.add(c)
            argv = _cmdline(c)
            if name == "router" and b"router" in argv[1:2]:
                return c
            if b"--name" in argv and argv[argv.index(b"--name") + 1:][:1] == [name.encode()]:
                return c
        raise AssertionError("no running child %s of the launcher:\n%s" % (name, self.text()[-2000:]))

    def ports(self):
        """{worker name: control port} of this cluster's config."""
        with open(self.config) as f:
            return {w["name"]: w["port"] for w in json.load(f)["workers"]}

    def stop(self):
        """SIGTERM to the launcher (it stops its children), SIGKILL to everything left after 8 s."""
        if self.proc.poll() is None:
            self._scan()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for c in self.seen:
            argv = _cmdline(c)  # only if that pid still runs dserve (not a reused pid)
            if argv and os.path.basename(argv[0]) in (b"dserve", os.path.basename(DSERVE).encode()):
                try:
                    os.kill(c, signal.SIGKILL)
                except OSError:
                    pass
        self.seen.clear()
        if not self.log.closed:
            self.log.close()


def wait_serving(nodes, router, names, port, timeout=60.0, host="127.0.0.1"):
    """The tests' one wait for a started cluster: every launcher in nodes has logged its ready line, the router's
    (router: the Node whose log holds the router's lines) has logged a link to each worker in names, and the router on
    host:port serves a one-token completion. timeout is scaled by SCALE; each wait raises with the logs' tail."""
    timeout *= SCALE
    for n in nodes:
        n.wait_ready(timeout)
    router.wait_connected(names, timeout)
    wait_workers(port, timeout, host=host)


class Cluster:
    """A temp dir with a one-node config and its launcher; cleaned by close() (register it with addCleanup)."""

    def __init__(self, workers, disagg_threshold=1000, tag="e2e", backoff_ms=100, router=None, model=MODEL,
                 extra=None):
        self.dir = tempfile.mkdtemp(prefix="dserve-%s-" % tag)
        self.config = os.path.join(self.dir, "c.json")
        self.port = local_config(self.config, workers, disagg_threshold, model=model, router=router, extra=extra)
        self.closed = False
        self.node = Node(self.config, backoff_ms=backoff_ms)

    def start(self, timeout=60.0):
        with open(self.config) as f:
            names = [w["name"] for w in json.load(f)["workers"]]
        wait_serving([self.node], self.node, names, self.port, timeout)
        return self

    def ports(self):
        return self.node.ports()

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.node.stop()
        if os.environ.get("DSERVE_E2E_KEEP"):
            print("kept", self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class DiscoCluster:
    """A TestCase mixin: a real etcd, a router watching it and workers that register there (no config lists them);
    every process an e2e_util.Proc in self.procs, stopped (and the temp dir removed) by the test's cleanup."""
    model = MODEL  # a subclass may serve another ("null": the null model)

    def start_cluster(self, router, tag="disco", lease_ttl_s=2):
        """etcd and the router (router: its config's "router" section, less the port) in a temp dir."""
        import etcd_util  # here: etcd_util imports this module
        require_env(self)
        etcd_util.require_etcd()
        self.dir = tempfile.mkdtemp(prefix="dserve-%s-" % tag)
        self.etcd = etcd_util.Etcd()
        self.addCleanup(self.etcd.close)
        self.etcd.start()
        self.procs = []
        self.addCleanup(self._cleanup)
        self.discovery = {"etcd": [self.etcd.url], "cluster": "e2e", "lease_ttl_s": lease_ttl_s}
        self.port = free_ports(1)[0]
        cfg = {"model": self.model, "discovery": self.discovery, "router": dict(router, port=self.port)}
        self.router = self._start(["router", "--config", self._write("router.json", cfg)], "router.log")

    def _cleanup(self):
        for p in self.procs:
            p.stop()
        if os.environ.get("DSERVE_E2E_KEEP"):
            print("kept", self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _write(self, name, cfg):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        return path

    def _start(self, argv, log):
        p = Proc(argv, os.path.join(self.dir, log))
        self.procs.append(p)
        return p

    def worker(self, name, role="decode", log=None, **kw):
        """Starts worker name (its own config: itself and the discovery section, an ephemeral port; kw: more keys of
        its entry); its log is log.log (default: name.log)."""
        log = log or name
        w = {"name": name, "role": role, "host": "127.0.0.1", "port": 0, "threads": 1, "kv_budget_mb": 32,
             "max_seqs": 16,
             # no prefix cache: the KV-aware policy would keep the two prompts where they are cached
             "prefix_cache_mb": 0}
        w.update(kw)
        cfg = {"model": self.model, "discovery": self.discovery, "workers": [w]}
        return self._start([role, "--config", self._write(log + ".json", cfg), "--name", name], log + ".log")

    def linked(self, name, timeout=60, role="decode|prefill"):
        """time.time() of the router's log line that links worker name (waits up to timeout, scaled)."""
        return self.router.line_time(r"router: worker %s \((%s), [^)]*\) connected" % (name, role), timeout * SCALE)


# ---- network namespaces ----

def ip(*args):
    """Runs `ip ARGS`; returns its stdout, raises with its stderr on failure."""
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=20)
    if r.returncode:
        raise AssertionError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def netns_star(tag, addrs, created):
    """One namespace TAG-NODE per node of addrs ({node: IPv4}, /24), each with eth0 (veth) plugged into bridge br0 of
    a hub namespace TAG-hub. Every namespace made is appended to created (delete them with netns_delete, also after a
    failure). Returns {node: namespace}."""
    ns = {n: "%s-%s" % (tag, n) for n in addrs}
    hub = tag + "-hub"
    for name in [hub] + list(ns.values()):
        ip("netns", "add", name)
        created.append(name)
        ip("-n", name, "link", "set", "lo", "up")
    ip("-n", hub, "link", "add", "br0", "type", "bridge")
    ip("-n", hub, "link", "set", "br0", "up")
    for i, (node, n) in enumerate(ns.items()):
        port = "p%d" % i
        ip("-n", n, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", hub)
        ip("-n", hub, "link", "set", port, "master", "br0")
        ip("-n", hub, "link", "set", port, "up")
        ip("-n", n, "addr", "add", addrs[node] + "/24", "dev", "eth0")
        ip("-n", n, "link", "set", "eth0", "up")
    return ns


def netns_delete(created):
    for name in reversed(created):
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


# ---- HTTP ----

def post(port, path, body, host="127.0.0.1", timeout=120.0):
    """POSTs JSON; returns (status, parsed body)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data.decode("utf-8", "replace")
    finally:
        c.close()


def get(port, path, host="127.0.0.1", timeout=30.0):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


_MODEL_LABEL = re.compile(r'model_name="(?:[^"\\]|\\.)*",?')


def metrics(port, host="127.0.0.1"):
    """The router's /metrics as {name-with-labels: value}, each series also under its name without the model_name
    label every series carries (one model per router: 'dserve:prompt_tokens_total', 'x{worker="w0"}')."""
    st, text = get(port, "/metrics", host)
    if st != 200:
        raise AssertionError("/metrics: %d %s" % (st, text[:200]))
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
            short = _MODEL_LABEL.sub("", k, count=1).replace("{}", "")
            out.setdefault(short, float(v))
    return out


def wait_workers(port, timeout=30.0, host="127.0.0.1"):
    """Waits until a one-token completion succeeds (the router has connected to its workers)."""
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = post(port, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0}, host, 30)
            if last[0] == 200:
                return
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise AssertionError("the router on %s:%d never served a request: %r" % (host, port, last))


def wait_router_sees_idle(port, names, timeout, host="127.0.0.1"):
    """Waits until the router's /metrics (the workers' last stats, which it balances by) show nothing running or
    waiting on each worker in names; raises with the metrics otherwise. Call it once the workers themselves are idle."""
    def idle():
        m = metrics(port, host)
        seen = {}  # name -> [running, waiting] of its series (role: both, prefill or decode)
        for k, v in m.items():
            g = re.match(r'dserve:worker_num_requests_(running|waiting)\{worker="([^"]*)",role="[a-z]+"\}$', k)
            if g and g.group(2) in names:
                seen.setdefault(g.group(2), []).append(v)
        return all(n in seen and not any(seen[n]) for n in names)
    if not wait_until(idle, timeout, 0.05):
        raise AssertionError("the router's stats of %s never read idle: %r" % (list(names), metrics(port, host)))


def result(kind, status, body):
    """{status, text, finish_reason, completion_tokens, prompt_tokens} of a non-streaming response."""
    if status != 200:
        return {"status": status, "error": body}
    ch = body["choices"][0]
    text = ch["message"]["content"] if kind == "chat" else ch["text"]
    return {"status": 200, "text": text, "finish_reason": ch["finish_reason"],
            "completion_tokens": body["usage"]["completion_tokens"], "prompt_tokens": body["usage"]["prompt_tokens"]}


def path_of(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def complete(port, kind, body, host="127.0.0.1", timeout=120.0):
    st, b = post(port, path_of(kind), dict(body, temperature=0), host, timeout)
    return result(kind, st, b)


def stream(port, kind, body, host="127.0.0.1", timeout=120.0, on_event=None):
    """Streams a request; returns {status, text, finish_reason, completion_tokens, error, events, t_events, t_end}.

    t_events: time.time() of each data event; t_end: when the connection ended. on_event(i, obj) is called per event;
    when it returns True the client hangs up."""
    out = {"status": None, "text": "", "finish_reason": None, "completion_tokens": None, "error": None,
           "events": 0, "t_events": [], "t_end": None, "done": False, "stopped": False, "t_error": None}
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        b = dict(body, temperature=0, stream=True, stream_options={"include_usage": True})
        c.request("POST", path_of(kind), json.dumps(b), {"Content-Type": "application/json"})
        r = c.getresponse()
        out["status"] = r.status
        if r.status != 200:
            out["error"] = r.read().decode("utf-8", "replace")
            return out
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            out["t_events"].append(time.time())
            if data == b"[DONE]":
                out["done"] = True
                continue
            o = json.loads(data)
            out["events"] += 1
            if "error" in o:
                out["error"] = o["error"]
                out["t_error"] = out["t_events"][-1]
            for ch in o.get("choices", []):
                piece = ch.get("delta", {}).get("content") if kind == "chat" else ch.get("text")
                out["text"] += piece or ""
                if ch.get("finish_reason"):
                    out["finish_reason"] = ch["finish_reason"]
            if o.get("usage"):
                out["completion_tokens"] = o["usage"]["completion_tokens"]
            if on_event and on_event(out["events"], o):
                out["stopped"] = True  # the caller hung up (the router cancels the request)
                break
    except (OSError, http.client.HTTPException, ValueError) as e:
        if out["error"] is None:
            out["error"] = "connection: %r" % (e,)
    finally:
        out["t_end"] = time.time()
        c.close()
    return out


def run_threads(fns, timeout):
    """Runs each fn in a thread; returns their results in order (None where one did not finish within timeout)."""
    res = [None] * len(fns)

    def wrap(i, f):
        res[i] = f()

    ts = [threading.Thread(target=wrap, args=(i, f), daemon=True) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    end = time.time() + timeout
    for t in ts:
        t.join(max(0.0, end - time.time()))
    return res


# ---- the control protocol (docs/protocol.md): 4-byte big-endian length + one JSON object ----

class Control:
    """A connection to a worker's control port that speaks as a router (for `stats`), proving the secret
    (ctl_wire.py: the handshake and sealed frames)."""

    def __init__(self, host, port, name="probe", timeout=10.0, secret=None):
        self.c = ctl_wire.connect(socket.create_connection((host, port), timeout=timeout),
                                  TEST_SECRET if secret is None else secret, name=name, timeout=timeout)
        self.hello = self.c.hello

    def send(self, obj):
        self.c.send(obj)

    def recv(self, timeout=None):
        """The next message; TimeoutError when none came within timeout (None: wait)."""
        return self.c.recv(timeout)

    def stats(self):
        self.send({"op": "stats"})
        while True:
            m = self.recv()
            if m.get("op") == "stats_ok":
                return m

    def close(self):
        self.c.close()


def worker_stats(port, host="127.0.0.1", secret=None):
    c = Control(host, port, secret=secret)
    try:
        return c.stats()
    finally:
        c.close()


def prefix_fetch_cluster(test, prefix, fetch, tag, model=MODEL, block_size=16):
    """Two prefill workers (p0, p1) and a decode worker over tcp, router.prefix_fetch = fetch, routing by free KV blocks
    only: prefix (token ids) goes to one of the two idle prefill workers (the holder); the blocks it then keeps make the
    other one (the asker) the emptier, so the next prompt goes there while the holder holds the prefix. Returns
    (cluster, asker, holder) once the router's view shows the holder's kept blocks; test cleans the cluster up."""
    c = Cluster([{"name": "p1", "role": "prefill", "kvxfer": {"backend": "tcp"}},
                 {"name": "p0", "role": "prefill", "kvxfer": {"backend": "tcp"}},
                 {"name": "d0", "role": "decode", "kvxfer": {"backend": "tcp"}}],
                disagg_threshold=0, tag=tag, model=model,
                router={"prefix_fetch": fetch, "routing": {"overlap": 0, "queue": 0, "free": 1}})
    test.addCleanup(c.close)
    c.start()
    ports = c.ports()
    first = complete(c.port, "completions", {"prompt": prefix, "max_tokens": 2})
    test.assertEqual(first["status"], 200, first)
    held = [n for n in ("p0", "p1") if worker_stats(ports[n])["prefix_cached_blocks"] >= len(prefix) // block_size]
    test.assertEqual(len(held), 1, held)
    holder = held[0]
    kept = worker_stats(ports[holder])["prefix_cached_blocks"]
    key = 'dserve:prefix_cache_blocks{worker="%s",tier="pool"}' % holder
    seen = wait_until(lambda: metrics(c.port).get(key, 0) >= kept, 30 * SCALE, step=0.1)
    test.assertTrue(seen, "the router never saw %s's %d kept blocks: %r" % (holder, kept, metrics(c.port)))
    return c, ("p0" if holder == "p1" else "p1"), holder


def main(argv):
    """`python3 e2e_util.py request HOST PORT KIND BODY` (for clients inside a network namespace): prints the result."""
    if len(argv) == 6 and argv[1] == "request":
        print(json.dumps(complete(int(argv[3]), argv[4], json.loads(argv[5]), host=argv[2])))
        return 0
    if len(argv) == 4 and argv[1] == "wait":
        wait_workers(int(argv[3]), 60, host=argv[2])
        return 0
    if len(argv) == 4 and argv[1] == "metrics":
        print(json.dumps(metrics(int(argv[3]), host=argv[2])))
        return 0
    print("usage: e2e_util.py request HOST PORT chat|completions BODY | wait HOST PORT | metrics HOST PORT",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
