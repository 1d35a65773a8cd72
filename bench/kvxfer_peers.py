#!/usr/bin/env python3
"""bench/kvxfer_peers.py: the transfer engines of the field measured the way `dserve kvxfer-bench` measures kvxfer.

Two peers, each in its own process on loopback, WRITE a message of SIZE bytes made of SIZE/BLOCK blocks of BLOCK
bytes from the initiator's memory into the target's, ITERS times, 4 messages in flight; prints one line of JSON
per (size, block): {"engine", "size", "block", "gbps", "iters"}. Engines:

  nixl      NIXL's Python API (the nixl-cu12 wheel) with its UCX backend; UCX_TLS picks the transport (tcp here).
            The target's agent metadata reaches the initiator through a pipe; the initiator's last WRITE of each
            size carries a notification that the target waits for, so every byte is known to have landed.
  mooncake  Mooncake's Transfer Engine, its own `transfer_engine_bench` binary (mooncake-transfer-engine-non-cuda
            wheel): P2P handshake for metadata, tcp protocol, one submitting thread, batch = SIZE/BLOCK requests
            of BLOCK bytes, for --secs seconds per size.

Blocks are laid out every other BLOCK bytes in both buffers (scattered, as kvxfer-bench's are), so no engine can
merge them into one contiguous copy. bench/kvxfer_peers.sh runs this beside dserve's own kvxfer-bench and prints
the table. Needs numpy and the wheels (bench/kvxfer_peers.sh installs them into a venv of their own).
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time


PROG = os.environ.get("NIXL_PROG_THREAD", "0") == "1"  # progress in check_xfer_state itself (see the table notes)


TARGET_PROG = os.environ.get("NIXL_TARGET_PROG", "1") == "1"
INFLIGHT = 4  # requests in flight, as in `dserve kvxfer-bench` (BENCH_INFLIGHT)


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s.strip().upper().removesuffix("IB").removesuffix("B"))
    if not m:
        raise argparse.ArgumentTypeError("bad size '%s' (e.g. 4K, 64K, 1M, 64M)" % s)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def iters_for(size, budget=256 << 20):
    """Iterations that move about `budget` bytes, 8..2000 (as kvxfer-bench chooses)."""
    return max(8, min(2000, budget // size))


def scattered(base, size, block):
    """(address, length, device) of each block, every other block-sized slot from base."""
    return [(base + 2 * i * block, block, 0) for i in range(size // block)]


# ---- NIXL ----

def nixl_target(conn, cap):
    import numpy as np
    from nixl_cu12 import nixl_agent, nixl_agent_config
    # A passive target: its progress thread receives (UCX over tcp needs the receiving worker to progress)
    agent = nixl_agent("target", nixl_agent_config(enable_prog_thread=TARGET_PROG, backends=["UCX"]))
    buf = np.zeros(2 * cap, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    seen = set()  # notification messages received

    def progress():
        for v in agent.get_new_notifs().values():
            seen.update(v)
    while True:
        while not TARGET_PROG and not conn.poll(0):
            progress()  # no progress thread: this loop is the receiver's progress
        msg = conn.recv()
        if msg is None:
            break
        tag, size, block = msg  # wait for the notification of the last write, then check its bytes
        deadline = time.time() + 120
        while time.time() < deadline:
            progress()
            if tag in seen:
                break
            time.sleep(0 if not TARGET_PROG else 0.0005)
        else:
            conn.send("no notification within 120 s")
            continue
        want = (size // block) & 0xFF
        got = {int(buf[2 * i * block]) for i in range(size // block)}
        conn.send("ok" if got == {want} else "bytes differ: %r, want %d" % (sorted(got)[:4], want))


def nixl_run(pairs, iters_override):
    from nixl_cu12 import nixl_agent, nixl_agent_config
    import numpy as np
    cap = max(s for s, _ in pairs)
    parent, child = mp.Pipe()
    p = mp.Process(target=nixl_target, args=(child, cap), daemon=True)
    p.start()
    md, remote_base = parent.recv()
    agent = nixl_agent("initiator", nixl_agent_config(enable_prog_thread=PROG, backends=["UCX"]))
    buf = np.zeros(2 * cap, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    peer = agent.add_remote_agent(md)
    out = []
    for size, block in pairs:
        n = size // block
        buf[:] = n & 0xFF
        local = agent.get_xfer_descs(scattered(buf.ctypes.data, size, block), "DRAM")
        remote = agent.get_xfer_descs(scattered(remote_base, size, block), "DRAM")
        k = iters_override or iters_for(size)
        tag = ("%d-%d" % (size, block)).encode()
        hs = [agent.initialize_xfer("WRITE", local, remote, peer, b"") for _ in range(INFLIGHT)]
        h_last = agent.initialize_xfer("WRITE", local, remote, peer, tag)

        def wait(handle, st="PROC"):
            while st == "PROC":
                st = agent.check_xfer_state(handle)
            if st != "DONE":
                raise RuntimeError("NIXL transfer failed (%s) at size %d block %d" % (st, size, block))
        wait(hs[0], agent.transfer(hs[0]))  # warm-up: connection and first-touch costs are not measured
        t0 = time.perf_counter()
        posted = [None] * INFLIGHT  # INFLIGHT requests kept in flight, as kvxfer-bench does
        for i in range(k - 1):
            j = i % INFLIGHT
            if posted[j] is not None:
                wait(hs[j], posted[j])
            posted[j] = agent.transfer(hs[j])
        for j in range(INFLIGHT):
            if posted[j] is not None:
                wait(hs[j], posted[j])
        wait(h_last, agent.transfer(h_last))  # carries the notification the target waits for
        dt = time.perf_counter() - t0
        parent.send((tag, size, block))
        verdict = parent.recv()
        if verdict != "ok":
            raise RuntimeError("NIXL target: %s (size %d block %d)" % (verdict, size, block))
        for h in hs + [h_last]:
            agent.release_xfer_handle(h)
        out.append({"engine": "nixl", "size": size, "block": block, "gbps": size * k / dt / 1e9, "iters": k})
    parent.send(None)
    p.join(10)
    return out


# ---- Mooncake ----

def mooncake_run(pairs, secs, port):
    import mooncake
    d = os.path.dirname(mooncake.__file__)
    exe = os.path.join(d, "transfer_engine_bench")
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(
        [d, os.path.join(os.path.dirname(d), "mooncake_transfer_engine_non_cuda.libs"), os.environ.get("LD_LIBRARY_PATH", "")]))
    cap = max(s for s, _ in pairs)
    common = ["--metadata_server=P2PHANDSHAKE", "--protocol=tcp", "--buffer_size=%d" % (2 * cap), "--logtostderr"]
    target = subprocess.Popen([exe, "--mode=target", "--local_server_name=127.0.0.1:%d" % port] + common, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = []
    try:
        seg = None  # the target's handshake address, printed when it listens
        deadline = time.time() + 30
        while seg is None and time.time() < deadline:
            line = target.stderr.readline()
            if not line:
                break
            m = re.search(r"listening on (\S+:\d+)", line)
            seg = m.group(1) if m else None
        if seg is None:
            raise RuntimeError("Mooncake's target never said where it listens")
        for size, block in pairs:  # a size that fails is reported and left out; the others still run
            try:
                r = subprocess.run([exe, "--mode=initiator", "--local_server_name=127.0.0.1:%d" % (port + 1),
                                    "--segment_id=" + seg, "--operation=write", "--threads=1",
                                    "--block_size=%d" % block, "--batch_size=%d" % (size // block),
                                    "--duration=%d" % secs, "--report_unit=GB"] + common,
                                   env=env, capture_output=True, text=True, timeout=secs + 30)
            except subprocess.TimeoutExpired:
                print("kvxfer_peers: mooncake: size %d block %d (batch of %d) did not finish within %d s"
                      % (size, block, size // block, secs + 30), file=sys.stderr)
                continue
            m = re.search(r"batch count (\d+), throughput ([\d.]+) GB/s", r.stderr)
            if not m:
                print("kvxfer_peers: mooncake: size %d block %d: no throughput printed (status %d): %s"
                      % (size, block, r.returncode, r.stderr[-300:]), file=sys.stderr)
                continue
            out.append({"engine": "mooncake", "size": size, "block": block, "gbps": float(m.group(2)),
                        "iters": int(m.group(1))})
    finally:
        target.kill()
        target.wait()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=["nixl", "mooncake"])
    ap.add_argument("--pairs", required=True, help="SIZE:BLOCK,... e.g. 64K:4K,1M:6K")
    ap.add_argument("--iters", type=int, default=0, help="NIXL: iterations per size (default: ~256 MiB moved)")
    ap.add_argument("--secs", type=int, default=3, help="Mooncake: seconds per size")
    ap.add_argument("--port", type=int, default=17777, help="Mooncake: the target's server name port")
    a = ap.parse_args()
    pairs = []
    for p in a.pairs.split(","):
        s, b = p.split(":")
        s, b = parse_size(s), parse_size(b)
        if b < 1 or s < b:
            ap.error("block %d must be at least 1 and at most the size %d" % (b, s))
        pairs.append((s // b * b, b))
    try:
        rows = nixl_run(pairs, a.iters) if a.engine == "nixl" else mooncake_run(pairs, a.secs, a.port)
    except (ImportError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print("kvxfer_peers: %s: %s" % (a.engine, e), file=sys.stderr)
        return 1
    for r in rows:
        print(json.dumps(r), flush=True)
    sys.stderr.flush()
    os._exit(0)  # NIXL 1.5.1's agents can crash in the interpreter's teardown, after the work is done


if __name__ == "__main__":
    sys.exit(main())
