#!/usr/bin/env bash
# bench/kvxfer_peers.sh: dserve's kvxfer (tcp, shm, nixl) beside NIXL/UCX and Mooncake's Transfer Engine, same sizes and block sizes, one table.
#
# Usage: bench/kvxfer_peers.sh          (from anywhere; a few minutes; first run installs the peers, ~100 MB)
# Env:   BLOCKS="6K 64K"  block sizes; 6 KiB is SmolLM2's KV block on the wire (16 tokens x 3 KV heads x 64 x f16,
#                          one layer's K or V), the unit a prefill worker pushes
#        MAX_SIZE=64M      messages from 4 KiB (or one block) up to this, x4 apart
#        SECS=3            Mooncake: seconds per size      ITERS=0 (kvxfer-bench and NIXL: 0 = ~256-512 MiB per size)
#        DSERVE_BIN=build/dserve (built when missing)       PEERS_VENV=~/.cache/dserve/peers-venv
#        UCX_TLS=tcp       the transport NIXL's UCX backend uses (tcp, to compare with the tcp engines)
# Every engine runs its two peers as two processes on loopback, 4 requests in flight (Mooncake: one thread
# submitting batches of SIZE/BLOCK requests), WRITE from scattered source blocks to scattered destination blocks.
# The raw columns are kvxfer-bench's own baselines (a plain loopback socket loop; a single-thread memcpy).
# Exit status: 0 when every engine ran; 1 when one could not (its columns say n/a and why is printed).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
BLOCKS=${BLOCKS:-6K 64K}
MAX_SIZE=${MAX_SIZE:-64M}
SECS=${SECS:-3}
ITERS=${ITERS:-0}
DSERVE_BIN=${DSERVE_BIN:-build/dserve}
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/dserve/peers-venv}
export UCX_TLS=${UCX_TLS:-tcp}
NIXL_WHEEL="nixl-cu12==1.5.1"
MOONCAKE_WHEEL="mooncake-transfer-engine-non-cuda==0.3.13.post1"
out=$(mktemp -d /tmp/kvxfer-peers.XXXXXX)
log() { echo "kvxfer_peers: $*" >&2; }
status=0

# The peers live in a venv of their own: NIXL's wheel declares torch, which this benchmark does not need, so the
# wheels go in without their dependencies, beside numpy (the one NIXL's Python API imports).
if ! "$PEERS_VENV/bin/python" -c "import numpy, nixl_cu12, mooncake" 2>/dev/null; then
  log "installing numpy, $NIXL_WHEEL and $MOONCAKE_WHEEL into $PEERS_VENV"
  { python3 -m venv "$PEERS_VENV" && "$PEERS_VENV/bin/pip" install -q numpy &&
    "$PEERS_VENV/bin/pip" install -q --no-deps "$NIXL_WHEEL" "$MOONCAKE_WHEEL"; } >"$out/install.log" 2>&1 ||
    log "could not install the peers (see $out/install.log); their columns will say n/a"
fi
if [ ! -x "$DSERVE_BIN" ]; then
  log "building dserve in build"
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j"$(nproc)" --target dserve; } \
    >"$out/build.log" 2>&1 || { log "dserve did not build (see $out/build.log)"; exit 1; }
  DSERVE_BIN=build/dserve
fi

ds_backends="tcp shm"
"$DSERVE_BIN" kvxfer-bench --help 2>&1 | grep -q nixl && ds_backends="$ds_backends nixl"
iters=()
[ "$ITERS" != 0 ] && iters=(--iters "$ITERS")

for block in $BLOCKS; do
  for be in $ds_backends; do
    log "dserve kvxfer-bench --backend $be --block $block --size $MAX_SIZE"
    "$DSERVE_BIN" kvxfer-bench --backend "$be" --block "$block" --size "$MAX_SIZE" "${iters[@]}" \
      >"$out/dserve-$be-$block.txt" 2>&1 || { log "dserve $be failed: $(tail -n 2 "$out/dserve-$be-$block.txt")"; status=1; }
  done
  # the sizes kvxfer-bench measured (bytes actually moved: a whole number of blocks), for the peers
  pairs=$(python3 - "$out/dserve-tcp-$block.txt" "$block" <<'EOF'
import re, sys
sys.path.insert(0, "bench")
from kvxfer_peers import parse_size
b = parse_size(sys.argv[2])
sizes = []
for line in open(sys.argv[1]):
    m = re.match(r"^(\d+) (B|KiB|MiB|GiB)\s+(\d+)\s", line)
    if m:
        sizes.append(int(m.group(1)) << {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)])
print(",".join("%d:%d" % (s, b) for s in sizes))
EOF
)
  if [ -z "$pairs" ]; then
    log "no sizes from kvxfer-bench tcp for block $block; peers skipped"; status=1; continue
  fi
  log "NIXL (UCX_TLS=$UCX_TLS) block $block"
  "$PEERS_VENV/bin/python" bench/kvxfer_peers.py nixl --pairs "$pairs" --iters "$ITERS" \
    >"$out/nixl-$block.jsonl" 2>"$out/nixl-$block.log" || { log "NIXL failed: $(grep -v ' INFO ' "$out/nixl-$block.log" "$out/nixl-$block.jsonl" | tail -n 2)"; status=1; }
  log "Mooncake Transfer Engine (tcp) block $block"
  "$PEERS_VENV/bin/python" bench/kvxfer_peers.py mooncake --pairs "$pairs" --secs "$SECS" \
    >"$out/mooncake-$block.jsonl" 2>"$out/mooncake-$block.log" || { log "Mooncake failed: $(tail -n 2 "$out/mooncake-$block.log")"; status=1; }
done

python3 - "$out" "$ds_backends" $BLOCKS <<'EOF'
import json, os, re, sys
sys.path.insert(0, "bench")
from kvxfer_peers import parse_size
out, backends, blocks = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
ROW = re.compile(r"^(\d+) (B|KiB|MiB|GiB)\s+(\d+)\s+\S+ \S+\s+\|\s+([\d.]+)\s+[\d.]+\s+\|\s+([\d.]+)\s+[\d.]+\s+\|")
UNIT = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}


def dserve(be, block):  # {size: (kvx GB/s, raw GB/s)}
    rows = {}
    try:
        for line in open(os.path.join(out, "dserve-%s-%s.txt" % (be, block))):
            m = ROW.match(line)
            if m:
                rows[int(m.group(1)) << UNIT[m.group(2)]] = (float(m.group(4)), float(m.group(5)))
    except OSError:
        pass
    return rows


def peer(name, block):  # {size: GB/s}
    try:
        lines = open(os.path.join(out, "%s-%s.jsonl" % (name, block))).read().splitlines()
        # NIXL's logger writes to stdout too: only the JSON lines are results
        return {r["size"]: r["gbps"] for r in (json.loads(x) for x in lines if x.startswith("{"))}
    except (OSError, ValueError):
        return {}


def size_text(n):
    for u, s in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << u and n % (1 << u) == 0:
            return "%d %s" % (n >> u, s)
    return "%.0f KiB" % (n / 1024) if n >= 1024 else "%d B" % n


f = lambda v: "n/a" if v is None else "%.2f" % v
r = lambda a, b: "n/a" if a is None or not b else "%.2f" % (a / b)
print("== kvxfer and the field's transfer engines on loopback (GB/s; UCX_TLS=%s for NIXL) ==" % os.environ.get("UCX_TLS"))
hdr = ["block", "size", "raw tcp", "kvx tcp", "Mooncake", "NIXL/UCX"] + (["kvx nixl"] if "nixl" in backends else []) + \
      ["memcpy", "kvx shm", "tcp/raw", "tcp/Mooncake", "tcp/NIXL", "shm/memcpy"]
rows = []
for block in blocks:
    t, s, n = dserve("tcp", block), dserve("shm", block), dserve("nixl", block)
    mc, nx = peer("mooncake", block), peer("nixl", block)
    for size in sorted(set(t) | set(s)):
        kt, rt = t.get(size, (None, None))
        ks, rs = s.get(size, (None, None))
        row = [size_text(parse_size(block)), size_text(size), f(rt), f(kt), f(mc.get(size)), f(nx.get(size))]
        if "nixl" in backends:
            row.append(f(n.get(size, (None,))[0]))
        row += [f(rs), f(ks), r(kt, rt), r(kt, mc.get(size)), r(kt, nx.get(size)), r(ks, rs)]
        rows.append(row)
w = [max([len(h)] + [len(x[i]) for x in rows]) for i, h in enumerate(hdr)]
print("  ".join(h.rjust(w[i]) for i, h in enumerate(hdr)))
for x in rows:
    print("  ".join(c.rjust(w[i]) for i, c in enumerate(x)))
print("targets (issue 19): tcp/Mooncake and tcp/NIXL >= 1.0 from 64 KiB; tcp/raw >= 0.60 at 64 KiB, >= 0.90 from 1 MiB; "
      "shm/memcpy >= 0.85 from 1 MiB")
EOF
echo "(logs: $out)"
exit $status
