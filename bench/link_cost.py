#!/usr/bin/env python3
"""bench/link_cost.py: what one linked worker costs an idle router (stats + ping every second and their answers):
starts N null workers and a router (bench/scale_sim.py's cluster), no streams, and over 10 s reads the router's CPU
(/proc/PID/stat) and the bytes its sockets received (`ss -ti` bytes_received). docs/scale.md's projection uses it.

  python3 bench/link_cost.py 200"""

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scale_sim as ss  # noqa: E402 (also puts tests/e2e on the path)
import e2e_util as u  # noqa: E402


def bytes_in(pid):
    """Sum of bytes_received over the established TCP sockets of pid."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True, check=True).stdout
    tot, mine = 0, False
    for line in out.splitlines():
        if "users:" in line:
            mine = ("pid=%d," % pid) in line
        elif mine:
            m = re.search(r"bytes_received:(\d+)", line)
            if m:
                tot += int(m.group(1))
    return tot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workers", type=int)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--dserve", help="the dserve binary (default: DSERVE_BINARY or build/dserve)")
    a = ap.parse_args()
    u.DSERVE = a.dserve or os.environ.get("DSERVE_BINARY") or os.path.join(HERE, "..", "build", "dserve")
    cl = ss.Cluster(argparse.Namespace(workers=a.workers, max_seqs=8, step_ms=20.0, kv_budget_mb=64, etcd=False))
    try:
        cl.start()
        time.sleep(3)  # past the links' first stats and kv_events snapshots
        pid = cl.router.proc.pid
        c0, b0, t0 = ss.cpu_s(pid), bytes_in(pid), time.monotonic()
        time.sleep(a.window)
        c1, b1, t1 = ss.cpu_s(pid), bytes_in(pid), time.monotonic()
        w = t1 - t0
        print("workers %d: router %.3f cores idle, %.0f us per worker-second; %.0f B/s in, %.0f B per worker-second; "
              "RSS %.1f MB" % (a.workers, (c1 - c0) / w, (c1 - c0) / w / a.workers * 1e6, (b1 - b0) / w,
                               (b1 - b0) / w / a.workers, ss.rss_mb(pid)))
    finally:
        cl.close()


if __name__ == "__main__":
    main()
