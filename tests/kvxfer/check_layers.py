# tests/kvxfer/check_layers.py: kvxfer's files call one way only (the layering in kvxfer/kvx_int.h): reads which
# object of libdserve_kvxfer.a defines each symbol another one uses (nm), and fails on a reference upward or sideways.
# Usage: check_layers.py LIBRARY AR NM
import os
import subprocess
import sys
import tempfile

# Higher calls lower only; files of one level do not call each other (no backend calls another).
LEVEL = {
    "kvx_md": 8,
    "kvx": 7,
    "kvx_xfer": 6,
    "kvx_tcp": 5, "kvx_shm": 5, "kvx_rdma": 5, "kvx_nccl": 5, "kvx_nixl": 5,
    "kvx_listen": 4,
    "kvx_conn": 3,
    "kvx_base": 2, "kvx_host": 2,
    "kvx_wire": 1,
}


def main():
    lib, ar, nm = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([ar, "x", os.path.abspath(lib)], cwd=d, check=True)
        defs, uses = {}, {}
        for o in sorted(os.listdir(d)):
            name = o.split(".")[0]
            out = subprocess.run([nm, os.path.join(d, o)], capture_output=True, text=True, check=True).stdout
            defs[name], uses[name] = set(), set()
            for line in out.splitlines():
                f = line.split()
                if len(f) == 3 and f[1] in "TDRBVW":
                    defs[name].add(f[2])
                elif len(f) == 2 and f[0] == "U":
                    uses[name].add(f[1])
    bad = [n for n in defs if n not in LEVEL]
    if bad:
        print("objects with no level (add them to LEVEL and to kvx_int.h's layering):", " ".join(bad))
        return 1
    wrong = []
    for n in sorted(uses):
        for m in sorted(defs):
            if m == n:
                continue
            syms = sorted(uses[n] & defs[m])
            if syms and LEVEL[m] >= LEVEL[n]:
                wrong.append(f"{n} (level {LEVEL[n]}) -> {m} (level {LEVEL[m]}): {' '.join(syms)}")
    for w in wrong:
        print("upward or sideways:", w)
    if not wrong:
        print(f"kvxfer layering holds over {len(defs)} objects")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
