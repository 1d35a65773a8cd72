"""tests/fault/fault_util.py: helpers for the fault suite: 16 watched streams, fault moments chosen from worker stats, the checks every case makes."""

import ctypes
import json
import os
import re
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import e2e_util as u  # noqa: E402  (the shared launcher / HTTP / control helpers)

N_STREAMS = 16
# Four prompts of 20-30 tokens, each sent by four clients; ignore_eos makes every answer exactly MAX_TOKENS long.
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night by the sea:",
    "List ten facts about the planets of the solar system, starting with the closest one to the sun and going out:",
    "Explain in simple words how a bicycle stays upright while it is moving along a road, and why it falls when still:",
    "Describe the steps to bake a loaf of bread at home, from mixing the flour and water to taking it out of the oven:",
]
MAX_TOKENS = 12
TCP = {"backend": "tcp"}
# router.link_dead_ms in the fault configs (the default is 15000). The workers' hub threads answer the router's ping
# however long a compute step takes, so a slow (sanitizer) build on a loaded machine is not taken for dead.
LINK_DEAD_MS = 6000
# router.migration_wait_ms: a stream whose decode worker died waits this long for another (the launcher's restart).
MIGRATION_WAIT_MS = 8000
# router.migrate_silent_ms (its default): a decode worker silent this long has its streams moved to another.
MIGRATE_SILENT_MS = 2000

# Bounds (seconds) the cases assert; generous for a loaded 2-core machine. docs/reliability.md quotes them.
# Each is multiplied by u.SCALE (DSERVE_TIMEOUT_SCALE: 4 in the sanitize build, whose router also scales link_dead_ms).
KILL_ERROR_S = 5.0 * u.SCALE       # kill -9 of a worker: its clients get an OpenAI error this soon
STOP_ERROR_S = (LINK_DEAD_MS / 1000.0 + 6.0) * u.SCALE  # SIGSTOP of a worker: the router gives up on it this soon
# ... and, for the streams of a stopped decode worker with no other one, after waiting MIGRATION_WAIT_MS for one
STOP_MOVE_ERROR_S = (LINK_DEAD_MS + MIGRATION_WAIT_MS) / 1000.0 * u.SCALE + 6.0 * u.SCALE
# A moved stream's longest silence around the fault, less its usual gap between tokens (issue 21's target: 2 s plus
# the recompute of its prefix; here with room for a loaded 2-core machine)
MOVE_ADDED_S = 6.0 * u.SCALE
IDLE_S = 15.0 * u.SCALE            # surviving workers back to all blocks free, nothing running or waiting
END_S = 90.0 * u.SCALE             # every stream ends (answer or error) this long after the fault


def body(i):
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS, "ignore_eos": True}


wait_until = u.wait_until


def worker(name, role, **kw):
    """A worker entry for u.Cluster / a config: 1 thread, no prefix cache (so idle = every block free), tcp KV."""
    w = {"name": name, "role": role, "prefix_cache_mb": 0, "kvxfer": dict(TCP)}
    if role == "prefill":
        w["max_batch_tokens"] = 32  # several steps per prompt: a kill lands mid-prefill / mid-transfer
    else:
        w["max_seqs"] = 8           # 16 streams: 8 admitted, 8 queued in the router
        w["max_batch_tokens"] = 64  # short steps (the queued prompts are prefilled here while no prefill worker is up)
    w.update(kw)
    return w


def cluster(workers, tag, backoff_ms=100):
    """A one-node fault cluster (every prompt disaggregated, router.link_dead_ms = LINK_DEAD_MS), not started."""
    return u.Cluster(workers, disagg_threshold=0, tag=tag, backoff_ms=backoff_ms,
                     router={"link_dead_ms": LINK_DEAD_MS, "migration_wait_ms": MIGRATION_WAIT_MS,
                             "migrate_silent_ms": MIGRATE_SILENT_MS})


_REFS = {}


def references(port, host="127.0.0.1"):
    """The greedy answer to each prompt (computed once per process on the first healthy cluster, before any fault)."""
    if not _REFS:
        res = u.run_threads([lambda i=i: u.complete(port, "completions", body(i), host=host, timeout=120)
                             for i in range(len(PROMPTS))], 150)
        for i, r in enumerate(res):
            if r is None or r["status"] != 200 or r["completion_tokens"] != MAX_TOKENS:
                raise AssertionError("reference run failed for prompt %d: %r" % (i, r))
        _REFS.update((i, r["text"]) for i, r in enumerate(res))
    return [_REFS[i % len(PROMPTS)] for i in range(N_STREAMS)]


class Load:
    """N_STREAMS streaming clients started together; tokens[i] counts stream i's events as they arrive."""

    def __init__(self, port, host="127.0.0.1", timeout=120.0):
        self.tokens = [0] * N_STREAMS
        self.first = [None] * N_STREAMS  # time of stream i's first event
        self.ids = [None] * N_STREAMS    # the response id of stream i (from its events)
        self.times = [[] for _ in range(N_STREAMS)]  # arrival time of each of stream i's events
        self.res = [None] * N_STREAMS
        self.threads = []
        for i in range(N_STREAMS):
            t = threading.Thread(target=self._run, args=(i, port, host, timeout), daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, i, port, host, timeout):
        def on_event(k, o):
            if self.first[i] is None:
                self.first[i] = time.time()
                self.ids[i] = o.get("id")
            self.tokens[i] = k
            self.times[i].append(time.time())
            return False
        self.res[i] = u.stream(port, "completions", body(i), host=host, timeout=timeout, on_event=on_event)

    def streaming(self):
        """Indices of streams that have received at least one event (they are decoding)."""
        return [i for i in range(N_STREAMS) if self.tokens[i] > 0]

    def midway(self):
        """Indices of streams that have tokens but more than 3 still to come: right after a fault, a stream whose
        worker died or stopped cannot finish from what was already on the wire."""
        return [i for i in range(N_STREAMS) if 0 < self.tokens[i] < MAX_TOKENS - 3 and self.res[i] is None]

    def wait(self, timeout):
        end = time.time() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.time()))
        return self.res


def outcome(r, ref):
    """'ok' (the complete reference answer), 'error' (an OpenAI error object: HTTP status or SSE `error` event),
    'dropped' (the connection failed or ended without [DONE]), or a description of what is wrong."""
    if r is None:
        return "did not end"
    if r["status"] is None or (isinstance(r["error"], str) and r["error"].startswith("connection")):
        return "dropped"
    if r["status"] == 200 and r["error"] is None:
        if not r["done"]:
            return "dropped"
        if r["completion_tokens"] == MAX_TOKENS and r["text"] == ref:
            return "ok"
        return "complete but wrong: %r (want %r), %s tokens" % (r["text"], ref, r["completion_tokens"])
    return "error" if openai_error(r) else "not an OpenAI error: %r" % (r["error"],)


def openai_error(r):
    """True when r carries an OpenAI error object: an SSE `error` event, or a non-200 JSON body with `error`."""
    e = r["error"]
    if isinstance(e, dict):
        return "message" in e and "type" in e and "code" in e
    if r["status"] not in (None, 200) and isinstance(e, str):
        try:
            o = json.loads(e)
        except ValueError:
            return False
        return isinstance(o.get("error"), dict) and "message" in o["error"]
    return False


def end_time(r):
    return r["t_error"] or r["t_end"]


def idle(ports, names, hosts=None):
    """{name: stats} when every named worker has nothing running or waiting and every KV block free, else None.
    hosts: {name: address} (default 127.0.0.1)."""
    out = {}
    for n in names:
        try:
            st = u.worker_stats(ports[n], (hosts or {}).get(n, "127.0.0.1"))
        except (OSError, AssertionError):
            return None
        if st["running"] or st["waiting"] or st["free_blocks"] != st["total_blocks"]:
            return None
        out[n] = st
    return out


def mixed_moment(c, load, decode="d0"):
    """Stats when every phase is populated at once: a stream decoding, a handoff (prefill running, KV in transfer to
    the decode worker) and requests queued in the router; else None."""
    ports, hosts = c.ports(), getattr(c, "hosts", None) or {}
    if not load.streaming():
        return None
    p = u.worker_stats(ports["p0"], hosts.get("p0", "127.0.0.1"))
    d = u.worker_stats(ports[decode], hosts.get(decode, "127.0.0.1"))
    queued = u.metrics(c.port, getattr(c, "host", "127.0.0.1"))["dserve:num_requests_waiting"]
    if p["running"] + p["waiting"] >= 1 and d["waiting"] >= 1 and d["running"] >= 1 and queued >= 1:
        return {"p0": p, decode: d, "queued": queued, "streaming": load.streaming()}
    return None


def decoding_moment(c, load, decode, n):
    """Stats when decode worker `decode` runs at least n streams and some stream is midway; else None. (n = 2 was
    never seen within 60 s under ASan on 2 cores: the cases use 1.)"""
    if not load.midway():
        return None
    d = u.worker_stats(c.ports()[decode])
    return {decode: d, "streaming": load.streaming()} if d["running"] >= n else None


class FaultCase(unittest.TestCase):
    """Checks shared by the fault cases."""

    def setUp(self):
        u.require_env(self)

    def logs(self):
        """The tail of each launcher's log of the cluster under test (for failure messages)."""
        c = getattr(self, "c", None)
        nodes = getattr(c, "nodes", None) or ({"local": c.node} if c else {})
        return "".join("---- %s log:\n%s\n" % (k, n.text()[-6000:]) for k, n in nodes.items())

    def start(self, workers, tag, backoff_ms=100):
        c = self.c = cluster(workers, tag, backoff_ms)
        self.addCleanup(c.close)
        c.start()
        self.refs = references(c.port)
        return c

    def start_1p2d_decoding(self, tag, backoff_ms=100):
        """One prefill and two decode workers (4 streams each) under 16 streams, returned at the moment d0 decodes
        with a stream midway: the moment the 1P2D migration cases strike. Returns (cluster, load)."""
        c = self.start([worker("p0", "prefill"), worker("d0", "decode", max_seqs=4), worker("d1", "decode", max_seqs=4)],
                       tag, backoff_ms)
        load = Load(c.port)
        self.wait_moment(load, lambda: decoding_moment(c, load, "d0", 1), "d0 decoding, a stream midway")
        return c, load

    def wait_moment(self, load, cond, what, timeout=60.0):
        """Polls cond() (worker stats) until it holds, returns its value; fails with the last state otherwise."""
        last = {}

        def f():
            try:
                v = cond()
            except (OSError, AssertionError) as e:
                v, last["e"] = None, e
            last["v"] = v
            return v
        v = wait_until(f, timeout, 0.01)
        self.assertTrue(v, "never reached the moment '%s' within %.0f s: %r; streams %r" % (what, timeout, last, load.tokens))
        return v

    def check_streams(self, load, t_fault, must_ok=(), bound=KILL_ERROR_S, conn_ok=False):
        """Every stream ends within END_S of the fault with the reference answer or an OpenAI error (conn_ok: or a
        dropped connection); every error comes within bound of the fault; the streams in must_ok end with the
        reference answer. Returns the (ok, error) stream indices."""
        res = load.wait(END_S)
        ok, err, bad = [], [], []
        for i, r in enumerate(res):
            o = outcome(r, self.refs[i])
            if o == "ok":
                ok.append(i)
            elif o == "error" or (o == "dropped" and conn_ok):
                err.append(i)
                if end_time(r) - t_fault > bound:
                    bad.append("stream %d: error %.1f s after the fault (bound %.1f s)" % (i, end_time(r) - t_fault, bound))
            else:
                bad.append("stream %d: %s" % (i, o))
        for i in must_ok:
            if i not in ok:
                bad.append("stream %d was not affected by the fault but did not finish correctly: %r" % (i, res[i]))
        self.assertEqual(bad, [], "ok %s, errors %s\n%s" % (ok, err, self.logs()))
        lat = sorted(end_time(res[i]) - t_fault for i in err)
        print("\n%s: %d answers, %d errors%s" % (self.id().rsplit(".", 1)[-1], len(ok), len(err),
              " %.2f-%.2f s after the fault" % (lat[0], lat[-1]) if lat else ""), file=sys.stderr)
        return ok, err

    def check_moves(self, c, load, t_fault, victim, to):
        """Streams of `victim` moved mid-stream (after >= 1 token) to a worker in `to`, each one a client's stream
        that got the whole reference answer; prints and bounds the latency a move added. Returns the moves
        [(stream index, tokens streamed before the move, new worker)]."""
        log = c.node.text()
        pat = r"(\S+?)-0(?:-r\d+)?: worker %s is gone after (\d+) tokens; (?:continuing on (\w+)|no worker is up)" % victim
        moves = []
        for rid, n, dest in re.findall(pat, log):
            if not dest:  # it waited for a worker: the line that sent it on names it
                later = re.findall(r"%s-0-r\d+: continuing on (\w+)" % re.escape(rid), log)
                self.assertTrue(later, "moved %s never continued\n%s" % (rid, self.logs()))
                dest = later[-1]
            self.assertIn(rid, load.ids, "moved %s is no client's stream" % rid)
            i = load.ids.index(rid)
            self.assertIn(dest, to, "stream %d moved to %s" % (i, dest))
            self.assertEqual(outcome(load.res[i], self.refs[i]), "ok", "moved stream %d: %r" % (i, load.res[i]))
            moves.append((i, int(n), dest))
        mid = [m for m in moves if m[1] > 0]
        self.assertGreaterEqual(len(mid), 1, "no stream moved mid-stream from %s\n%s" % (victim, self.logs()))
        added = []
        for i, n, _ in mid:
            ts = load.times[i]
            gaps = [b - a for a, b in zip(ts, ts[1:])]
            before = [b - a for a, b in zip(ts, ts[1:]) if b < t_fault] or [0.0]
            around = [b - a for a, b in zip(ts, ts[1:]) if b >= t_fault] or [0.0]
            usual = sorted(before)[len(before) // 2]
            added.append(max(around) - usual if gaps else 0.0)
        print("%s: %d streams moved from %s (%d mid-stream, after %s tokens); added latency %.2f-%.2f s" %
              (self.id().rsplit(".", 1)[-1], len(moves), victim, len(mid), sorted(m[1] for m in mid), min(added),
               max(added)), file=sys.stderr)
        self.assertLessEqual(max(added), MOVE_ADDED_S, "a move added %.2f s\n%s" % (max(added), self.logs()))
        return moves

    def check_idle(self, c, names):
        """The named workers return to idle (their own stats) and so does the router's KV gauge.
        c: a u.Cluster, or anything with port, ports(), and optionally host (router) and hosts ({worker: address})."""
        ports, hosts, host = c.ports(), getattr(c, "hosts", None), getattr(c, "host", "127.0.0.1")
        st = wait_until(lambda: idle(ports, names, hosts), IDLE_S, 0.1)
        self.assertIsNotNone(st, "workers %s did not return to idle within %.0f s: %r" %
                             (names, IDLE_S, {n: u.worker_stats(ports[n], (hosts or {}).get(n, "127.0.0.1"))
                                              for n in names}))
        self.assertTrue(wait_until(lambda: u.metrics(c.port, host)["dserve:kv_cache_usage_perc"] == 0, IDLE_S, 0.2),
                        "the router's /metrics still shows KV blocks in use")
        return st

    def check_serves(self, c):
        """A request after the fault gets the reference answer."""
        r = u.complete(c.port, "completions", body(0), host=getattr(c, "host", "127.0.0.1"), timeout=120)
        self.assertEqual((r["status"], r.get("text")), (200, self.refs[0]), r)


# ---- signals to one role under the launcher ----

def signal_role(c, name, sig):
    pid = c.node.child_pid(name)
    os.kill(pid, sig)
    return pid


# ---- network namespaces ----

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def setns(path):
    """Moves the calling thread (and the threads it starts later) into the network namespace at path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns %s: %s" % (path, os.strerror(e)))
    finally:
        os.close(fd)


def tc(ns, *args):
    """Runs tc inside namespace ns; returns (rc, stdout or, on failure, stderr)."""
    r = subprocess.run(["ip", "netns", "exec", ns, "tc"] + list(args), capture_output=True, text=True, timeout=20)
    return r.returncode, (r.stderr if r.returncode else r.stdout).strip()
