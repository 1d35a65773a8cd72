#!/usr/bin/env python3
"""bench/kvxfer_ab.py: `dserve kvxfer-bench` of two dserve binaries, run in turns, summarized per message size.

On a shared or small machine one run of the bench is noisy (the raw baseline too), so this runs A and B alternately
for --rounds rounds with the same arguments and prints, per size and binary, the median and the best kvx/raw ratio
and kvx bandwidth over the rounds. Use it to compare a change against the binary before it:

    python3 bench/kvxfer_ab.py --a /tmp/dserve-before --b build/dserve --rounds 5 -- --backend tcp --size 4M --blocks 64

Arguments after `--` go to `dserve kvxfer-bench` unchanged. --nice N runs each bench under `nice -n N` (root may
give a negative N, so that compilers on the same cores disturb it less). Standard library only.
"""
import argparse
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^(\d+ [KMG]?i?B)\s+(\d+)\s+(\S+ \S+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+\|\s+(\d+)%")


def run_once(binary, bench_args, nice):
    cmd = ([] if nice is None else ["nice", "-n", str(nice)]) + [binary, "kvxfer-bench"] + bench_args
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"kvxfer_ab: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    rows = {}
    for line in out.stdout.splitlines():
        m = ROW.match(line.strip())
        if m:
            rows[m.group(1)] = {"kvx_gbs": float(m.group(4)), "kvx_p50": float(m.group(5)),
                                "raw_gbs": float(m.group(6)), "ratio": float(m.group(8))}
    if not rows:
        sys.exit(f"kvxfer_ab: no table in the output of {' '.join(cmd)}:\n{out.stdout}")
    return rows


def main():
    argv = sys.argv[1:]
    bench_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, bench_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="first dserve binary (e.g. the one before a change)")
    ap.add_argument("--b", required=True, help="second dserve binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nice", type=int, default=None)
    args = ap.parse_args(argv)
    runs = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, binary in (("A", args.a), ("B", args.b)):
            runs[name].append(run_once(binary, bench_args, args.nice))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    sizes = list(runs["A"][0].keys())
    print(f"kvxfer-bench {' '.join(bench_args)}: {args.rounds} rounds each, A = {args.a}, B = {args.b}")
    print(f"{'size':<9} | {'A ratio med':>11} {'best':>5} {'GB/s med':>8} {'p50 us':>7} | "
          f"{'B ratio med':>11} {'best':>5} {'GB/s med':>8} {'p50 us':>7}")
    for s in sizes:
        cols = []
        for name in ("A", "B"):
            v = [run[s] for run in runs[name] if s in run]
            ratio = [x["ratio"] for x in v]
            cols.append(f"{statistics.median(ratio):10.0f}% {max(ratio):4.0f}% "
                        f"{statistics.median(x['kvx_gbs'] for x in v):8.2f} "
                        f"{statistics.median(x['kvx_p50'] for x in v):7.1f}")
        print(f"{s:<9} | {cols[0]} | {cols[1]}")


if __name__ == "__main__":
    main()
