#!/usr/bin/env python3
"""bench/scale_sim.py: a null-model cluster on one host (N workers, a router, optionally etcd) driven by S streams of
its own raw-socket client; prints delivered against offered tokens/s, router CPU and RSS, and inter-token gaps.

  python3 bench/scale_sim.py --streams 500,1000,2000,4000            # static workers, the config lists them
  python3 bench/scale_sim.py --streams 500 --etcd                    # workers register in etcd (started here)
  python3 bench/scale_sim.py --etcd --workers 100 --max-seqs 8 --streams 400 --churn 10 --window 60
                                                                     # 10% leave and 10% join a minute meanwhile

Each level opens S streams (POST /v1/completions, stream, greedy, max_tokens enough for the level), lets them
warm up, then measures for --window seconds: tokens delivered (SSE data events), each stream's gaps between
events, the router's CPU time (/proc/PID/stat utime + stime) and its VmRSS; then hangs up every stream (the router
cancels them) and waits for the workers to go idle. Offered = streams x 1000 / null_step_ms: every stream gets a
token each step when its worker's batch holds it (workers x max_seqs >= streams). The client runs in this process
(asyncio, one socket a stream, bytes counted without parsing JSON); on a small machine it competes with the router
for the cores: its own CPU is printed too. docs/scale.md holds figures and the commands that made them."""

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import e2e_util as u  # noqa: E402 (free ports, processes, the test secret in the environment)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """utime + stime of pid, in seconds (/proc/PID/stat fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICKS


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024.0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


class Cluster:
    """The router and N null `both` workers, each its own process, in a temp dir; with etcd, workers register there
    and the router watches it (no config lists them)."""

    def __init__(self, args):
        self.a = args
        self.dir = tempfile.mkdtemp(prefix="dserve-scale-")
        self.procs, self.etcd = [], None
        self.port = u.free_ports(1)[0]
        self.router_cfg = {"port": self.port, "queue_limit": 100000, "max_connections": 20000,
                           "max_connections_per_client": 20000, "max_choices": 64}
        if args.flush_ms:
            self.router_cfg["stream_flush_ms"] = args.flush_ms

    def worker_entry(self, i, port):
        a = self.a
        return {"name": "w%d" % i, "role": "both", "host": "127.0.0.1", "port": port, "threads": 1,
                "max_seqs": a.max_seqs, "kv_budget_mb": a.kv_budget_mb, "null_step_ms": a.step_ms,
                "spec": "off", "prefix_cache_mb": 0}

    def write(self, name, cfg):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        return path

    def start_proc(self, argv, log):
        p = u.Proc(argv, os.path.join(self.dir, log))
        self.procs.append(p)
        return p

    def start(self):
        a = self.a
        if a.etcd:
            import etcd_util
            etcd_util.require_etcd()
            self.etcd = etcd_util.Etcd()
            self.etcd.start()
            disco = {"etcd": [self.etcd.url], "cluster": "scale", "lease_ttl_s": 5}
            self.router = self.start_proc(["router", "--config", self.write(
                "router.json", {"model": "null", "discovery": disco, "router": self.router_cfg})], "router.log")
            self.disco = disco
            self.members = []
            for i in range(a.workers):
                if i == 0:
                    t_workers = time.monotonic()
                self.members.append(self.member("w%d" % i))
        else:
            ports = u.free_ports(a.workers)
            cfg = {"model": "null", "router": self.router_cfg,
                   "workers": [self.worker_entry(i, p) for i, p in enumerate(ports)]}
            path = self.write("c.json", cfg)
            self.router = self.start_proc(["router", "--config", path], "router.log")
            t_workers = time.monotonic()
            for i in range(a.workers):
                self.start_proc(["both", "--config", path, "--name", "w%d" % i], "w%d.log" % i)
        self.router.wait_count(") connected", a.workers, 120)
        self.link_s = time.monotonic() - t_workers  # the first worker started to the last one linked
        u.wait_workers(self.port, 60)

    def member(self, name):
        """A null worker that registers in etcd (the router is told of it by its watch, no config lists it)."""
        cfg = {"model": "null", "discovery": self.disco, "workers": [self.worker_entry(0, 0)]}
        cfg["workers"][0]["name"] = name
        return self.start_proc(["both", "--config", self.write("%s.json" % name, cfg), "--name", name], name + ".log")

    def close(self):
        for p in reversed(self.procs):
            p.stop()
        if self.etcd:
            self.etcd.close()

    def running(self):
        m = u.metrics(self.port)
        return sum(v for k, v in m.items() if re.match(r'dserve:worker_num_requests_(running|waiting)\{worker=', k))


class Stream:
    __slots__ = ("events", "times", "err", "done")

    def __init__(self):
        self.events, self.times, self.err, self.done = 0, [], None, False


async def one_stream(port, body, st, stop):
    """One streaming request on its own socket; records the time of every data event until stop is set."""
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        st.err = "connect: %s" % e
        return
    req = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
           "\r\n" % len(body)).encode() + body
    w.write(req)
    try:
        head = await r.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            st.err = head.split(b"\r\n", 1)[0].decode(errors="replace") + " " + (await r.read(300)).decode(
                errors="replace")
            return
        tail = b""
        while not stop.is_set():
            chunk = await r.read(65536)
            if not chunk:
                st.done = True
                break
            now = time.monotonic()
            buf = tail + chunk
            n = buf.count(b"data: {")
            tail = buf[-6:]
            n -= tail.count(b"data: {")  # counted again with the next chunk
            if n:
                st.events += n
                st.times.append((now, n))
            if b"[DONE]" in chunk or b'"error"' in chunk:
                if b'"error"' in chunk:
                    st.err = chunk[chunk.find(b'"error"'):][:200].decode(errors="replace")
                st.done = True
                break
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        st.err = "read: %r" % e
    finally:
        w.close()


def stamp(iso):
    """Seconds of a log line's UTC timestamp (2026-12-06T08:05:56.961Z)."""
    return time.mktime(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + iso[19:-1])


async def churner(cl, args, stop):
    """--churn P: while the level is measured, P% of the workers leave (SIGTERM: they drain, their streams move) and
    as many join a minute, one leave and one join at a time; returns the joins' start-to-linked seconds and the
    leaves whose streams the router moved (its log's `draining; moving its streams`)."""
    every = 60.0 / max(1e-9, len(cl.members) * args.churn / 100.0)
    joins, leaves, k = [], 0, 0
    moved0 = cl.router.text().count("is draining; moving its streams")
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            break
        except asyncio.TimeoutError:
            pass
        old = cl.members.pop(0)
        old.signal(15)
        leaves += 1
        name = "j%d" % k
        k += 1
        t = time.monotonic()
        cl.members.append(cl.member(name))
        linked = re.compile(r"(\S+) INFO  router: worker %s \([^)]*\) connected" % name)
        while not linked.search(cl.router.text()) and time.monotonic() - t < 30:
            await asyncio.sleep(0.02)
        m = linked.search(cl.router.text())
        reg = re.search(r"^(\S+) INFO  %s: registered in etcd" % name, cl.members[-1].text(), re.M)
        # registered (the joiner's log) to linked (the router's log): the clocks are the same host's
        joins.append(stamp(m.group(1)) - stamp(reg.group(1)) if m and reg else float("inf"))
    moved = cl.router.text().count("is draining; moving its streams") - moved0
    return {"leaves": leaves, "moved": moved, "joins": len(joins), "join_max_s": max(joins) if joins else 0.0,
            "join_p50_s": pct(joins, 50) if joins else 0.0}


async def level(cl, S, args):
    rpid = cl.router.proc.pid
    wpids = [p.proc.pid for p in cl.procs if p is not cl.router]
    secs = args.warmup + args.window + args.ramp + 5
    tokens = int(secs * 1000.0 / args.step_ms) + 50
    body = json.dumps({"prompt": " togo guse", "max_tokens": tokens, "stream": True, "temperature": 0}).encode()
    stop = asyncio.Event()
    sts = [Stream() for _ in range(S)]
    tasks = []
    for i, st in enumerate(sts):  # ramp: spread the opens over args.ramp seconds
        tasks.append(asyncio.ensure_future(one_stream(cl.port, body, st, stop)))
        if args.ramp > 0 and i % 50 == 49:
            await asyncio.sleep(args.ramp * 50.0 / S)
    await asyncio.sleep(args.warmup)
    churn = asyncio.ensure_future(churner(cl, args, stop)) if args.churn else None
    t0, c0, me0, w0 = time.monotonic(), cpu_s(rpid), os.times(), sum(cpu_s(p) for p in wpids)
    ev0 = sum(s.events for s in sts)
    rss = 0.0
    end = t0 + args.window
    while time.monotonic() < end:
        await asyncio.sleep(0.5)
        rss = max(rss, rss_mb(rpid))
    t1, c1, me1, w1 = time.monotonic(), cpu_s(rpid), os.times(), sum(cpu_s(p) for p in wpids)
    ev1 = sum(s.events for s in sts)
    stop.set()
    churned = (await churn) if churn else None
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    gaps, worst = [], []
    step = args.step_ms / 1000.0
    for s in sts:
        g, prev = [], None
        for tm, n in s.times:
            if tm < t0 or tm > t1:
                prev = tm if tm < t0 else prev
                continue
            if prev is not None:
                g.append(tm - prev)
            g.extend([0.0] * (n - 1))  # several events read at once: arrived together
            prev = tm
        gaps.extend(g)
        worst.append(pct(g, 99) if g else float("inf"))  # no two tokens in the window: starved
    failed = sum(1 for s in sts if s.err or s.done)  # an error, or an end before we hung up
    errs = [s.err for s in sts if s.err][:3]
    wall = t1 - t0
    return {"streams": S, "offered": S * 1000.0 / args.step_ms, "delivered": (ev1 - ev0) / wall,
            "router_cores": (c1 - c0) / wall, "worker_cores": (w1 - w0) / wall, "client_cores": ((me1.user - me0.user) + (me1.system - me0.system)) / wall,
            "p50_ms": pct(gaps, 50) * 1000, "p99_ms": pct(gaps, 99) * 1000,
            "worst_stream_p99_ms": max(worst) * 1000 if worst else float("nan"), "load": os.getloadavg()[0],
            "starved": sum(1 for w in worst if w > 5 * step), "router_rss_mb": rss, "failed": failed,
            "errors": errs, "step_ms": args.step_ms, "churn": churned}


def table(rows):
    out = ["| streams | offered tok/s | delivered tok/s | delivered | router cores | workers' cores | client cores | gap p50 ms | "
           "gap p99 ms | worst stream p99 ms | streams p99 > 5x step | router RSS MB | failed | load avg |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append("| %d | %.0f | %.0f | %.1f%% | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %d | %.1f | %d | %.1f |" % (
            r["streams"], r["offered"], r["delivered"], 100.0 * r["delivered"] / r["offered"], r["router_cores"], r["worker_cores"],
            r["client_cores"], r["p50_ms"], r["p99_ms"], r["worst_stream_p99_ms"], r["starved"], r["router_rss_mb"],
            r["failed"], r["load"]))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="500,1000,2000,4000", help="levels, comma-separated")
    ap.add_argument("--workers", type=int, default=0, help="null workers (default: enough for the largest level)")
    ap.add_argument("--max-seqs", type=int, default=256, help="workers[].max_seqs")
    ap.add_argument("--step-ms", type=float, default=20.0, help="workers[].null_step_ms (20: 50 tok/s a stream)")
    ap.add_argument("--kv-budget-mb", type=float, default=2048, help="workers[].kv_budget_mb (never touched: virtual)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds measured per level")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds after the last stream opened")
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds over which a level's streams open")
    ap.add_argument("--etcd", action="store_true", help="workers register in an etcd this script starts")
    ap.add_argument("--flush-ms", type=int, default=0, help="router.stream_flush_ms (0: the router's default)")
    ap.add_argument("--churn", type=float, default=0, help="with --etcd: percent of the workers that leave and as many "
                    "that join a minute while a level is measured")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    ap.add_argument("--dserve", help="the dserve binary (default: DSERVE_BINARY or build/dserve)")
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    if args.churn and not args.etcd:
        ap.error("--churn needs --etcd (members join and leave through etcd)")
    u.DSERVE = args.dserve or os.environ.get("DSERVE_BINARY") or os.path.join(HERE, "..", "build", "dserve")
    if not args.workers:
        args.workers = max(1, -(-max(levels) // args.max_seqs))
    cl = Cluster(args)
    rows = []
    try:
        cl.start()
        print("cluster: %d null workers (max_seqs %d, step %.0f ms)%s, router pid %d; all linked %.1f s after the "
              "first worker started" % (args.workers, args.max_seqs, args.step_ms, " via etcd" if args.etcd else "",
                                        cl.router.proc.pid, cl.link_s),
            file=sys.stderr)
        for S in levels:
            r = asyncio.run(level(cl, S, args))
            rows.append(r)
            print(table([r]).splitlines()[-1], file=sys.stderr)
            if r["churn"]:
                print("  churn: %(leaves)d left (%(moved)d moved their streams), %(joins)d joined, linked after "
                      "p50 %(join_p50_s).2f s, max %(join_max_s).2f s (registered in etcd to linked, from the logs)" % r["churn"],
                      file=sys.stderr)
            if r["errors"]:
                print("  errors: %s" % r["errors"], file=sys.stderr)
            if not u.wait_until(lambda: cl.running() == 0, 60):
                print("  workers still busy after the level", file=sys.stderr)
    finally:
        cl.close()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
