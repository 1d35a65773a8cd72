#!/usr/bin/env python3
"""scripts/gguf_truncate.py: writes a copy of a llama-family GGUF that keeps only its first N layers (tokenizer, embeddings, output and all metadata intact): a real-tokenizer model small enough to carry to a GPU machine without network for gpu-check's end-to-end stage.

Usage: gguf_truncate.py IN.gguf N OUT.gguf
Its text is not the full model's (the upper layers are gone), but it is a deterministic model whose greedy tokens the
CPU and GPU runs can be held to. Stdlib only (reads GGUF v2/v3 as written by llama.cpp's gguf-py).
"""

import re
import struct
import sys

# GGUF metadata value types -> struct format of a scalar (8: string, 9: array).
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Reader:
    def __init__(self, buf):
        self.b, self.o = buf, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.b[self.o:self.o + n]
        self.o += n
        return s

    def value(self, t):
        """Skips one value of type t; returns its decoded scalar (or None for strings and arrays)."""
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == 8:
            self.string()
            return None
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            if et in SCALAR:
                self.o += n * struct.calcsize("<" + SCALAR[et])
            else:
                for _ in range(n):
                    self.value(et)
            return None
        raise ValueError("unknown GGUF value type %d" % t)


def main(argv):
    if len(argv) != 4 or not argv[2].isdigit() or int(argv[2]) < 1:
        print("usage: gguf_truncate.py IN.gguf N OUT.gguf  (N >= 1 layers to keep)", file=sys.stderr)
        return 2
    keep = int(argv[2])
    with open(argv[1], "rb") as f:
        buf = f.read()
    r = Reader(buf)
    if r.take("4s") != b"GGUF":
        print("gguf_truncate: %s is not a GGUF file" % argv[1], file=sys.stderr)
        return 1
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    if version not in (2, 3):
        print("gguf_truncate: GGUF version %d is not supported (2 or 3)" % version, file=sys.stderr)
        return 1
    out_kv = []
    alignment, layers = 32, None
    for _ in range(n_kv):
        start = r.o
        key = r.string().decode()
        t = r.take("I")
        vstart = r.o
        v = r.value(t)
        raw = bytearray(buf[start:r.o])
        if key == "general.alignment":
            alignment = v
        if key.endswith(".block_count"):
            layers = v
            if keep > v:
                print("gguf_truncate: the model has %d layers, cannot keep %d" % (v, keep), file=sys.stderr)
                return 1
            struct.pack_into("<" + SCALAR[t], raw, vstart - start, keep)
        out_kv.append(bytes(raw))
    if layers is None:
        print("gguf_truncate: no <arch>.block_count key: not a llama-family model", file=sys.stderr)
        return 1
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        ttype, off = r.take("I"), r.take("Q")
        tensors.append((name, dims, ttype, off))
    data0 = (r.o + alignment - 1) // alignment * alignment
    # each tensor's size: up to the next offset in file order (the writer pads each to the alignment)
    offs = sorted(t[3] for t in tensors) + [len(buf) - data0]
    size = {o: offs[i + 1] - o for i, o in enumerate(offs[:-1])}
    kept = []
    for name, dims, ttype, off in tensors:
        m = re.match(rb"blk\.(\d+)\.", name)
        if m and int(m.group(1)) >= keep:
            continue
        kept.append((name, dims, ttype, off))
    head = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(kept), n_kv))
    for kv in out_kv:
        head += kv
    new_off, body = 0, []
    for name, dims, ttype, off in kept:
        head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, new_off)
        chunk = buf[data0 + off:data0 + off + size[off]]
        pad = (-len(chunk)) % alignment
        body.append(chunk + b"\0" * pad)
        new_off += len(chunk) + pad
    head += b"\0" * ((-len(head)) % alignment)
    with open(argv[3], "wb") as f:
        f.write(head)
        for c in body:
            f.write(c)
    print("gguf_truncate: %s: %d of %d layers, %d of %d tensors, %.1f MB" %
          (argv[3], keep, layers, len(kept), n_tensors, (len(head) + new_off) / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
