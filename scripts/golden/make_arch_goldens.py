#!/usr/bin/env python3
"""scripts/golden/make_arch_goldens.py: llama.cpp's logits on the tiny GGUF of every architecture, for tests/archs.

For each architecture scripts/make_tiny_gguf.py writes ARCH-F32, ARCH-Q8_0 and ARCH-Q4_K_M. llama.cpp's
llama-perplexity then scores the same text on each (CTX tokens per chunk, CHUNKS chunks) and writes its
log-probabilities (--kl-divergence-base: models/ppl.h documents the layout), and scores each quantized file against the
F32 file's (--kl-divergence: llama.cpp's own KL divergence from the exact-math reference). Into
tests/models/golden/archs it writes:
  ARCH-TYPE.kld.gz   llama.cpp's log-probabilities on that very file (gzip; the tests compare dserve's logits on the
                     same file with them)
  manifest.json      the text, context, chunks and llama.cpp version; make_tiny_gguf.py's sha256 and each GGUF's
                     sha256 (the tests refuse to compare against another file: "regenerate goldens"); per quantized
                     file llama.cpp's KL figures from the F32 reference ("kl": mean, its error, p99, max, same top);
                     per file llama.cpp's KL from itself with flash attention off ("self": the noise floor of comparing
                     two engines on that file).

Needs llama.cpp's binaries (bench/peer.sh builds them) and the test venv (numpy, gguf). Usage:
  python3 scripts/golden/make_arch_goldens.py [--bin BIN_DIR] [--arch ARCH]...
(--arch regenerates those architectures' goldens and keeps the others': the tests check each file's sha256.) The text is the GNU GPL version 3 that
Debian's base-files installs (bench/ppl_common.sh's default); only the tokens llama.cpp made of it go into the goldens.
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/models/golden/archs")
MAKER = os.path.join(ROOT, "scripts/make_tiny_gguf.py")
TEXT = "/usr/share/common-licenses/GPL-3"
CTX, CHUNKS, THREADS = 128, 3, 2
TYPES = ["F32", "Q8_0", "Q4_K_M"]
sys.path.insert(0, os.path.join(ROOT, "bench"))
from ppl_figures import PATTERNS  # noqa: E402  (the figures of llama-perplexity's summary)

KL_FIGURES = {"kld": PATTERNS["kld"], "kld_err": PATTERNS["kld_err"], "p99": PATTERNS["p99"],
              "max": r"Maximum KLD: +(-?[0-9.]+)", "same_top": PATTERNS["top"]}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode:
        sys.exit("make_arch_goldens: %s failed (%d):\n%s" % (" ".join(argv), p.returncode, p.stderr[-3000:]))
    return p.stdout + p.stderr


def figures(out):
    got = {}
    for k, pat in KL_FIGURES.items():
        m = re.search(pat, out)
        if not m:
            sys.exit("make_arch_goldens: no %s in llama-perplexity's output:\n%s" % (k, out[-3000:]))
        got[k] = float(m.group(1))
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", help="llama.cpp's bin dir (default: what bench/peer.sh prints)")
    ap.add_argument("--arch", action="append", help="only these architectures (default: all)")
    ap.add_argument("--python", default=os.path.join(os.environ.get("DSERVE_VENV") or
                                                     os.path.expanduser("~/.cache/dserve/venv"), "bin", "python"))
    a = ap.parse_args()
    bin_dir = a.bin or run([os.path.join(ROOT, "bench/peer.sh")]).strip().splitlines()[-1]
    perplexity = os.path.join(bin_dir, "llama-perplexity")
    archs = a.arch or run([a.python, MAKER, "--list-archs"]).split()
    os.makedirs(OUT, exist_ok=True)
    mpath = os.path.join(OUT, "manifest.json")
    old = json.load(open(mpath)) if a.arch and os.path.exists(mpath) else {}
    version = run([perplexity, "--version"]).strip().splitlines()
    manifest = {
        "text": TEXT, "text_sha256": sha256(TEXT), "ctx": CTX, "chunks": CHUNKS, "threads": THREADS,
        "llama_cpp": [v for v in version if "version" in v or "built" in v],
        "maker_sha256": sha256(MAKER),
        "files": old.get("files", {}), "kl": old.get("kl", {}), "self": old.get("self", {}),
    }
    work = tempfile.mkdtemp(prefix="dserve-archs-")
    try:
        for arch in archs:
            run([a.python, MAKER, "--out", work, "--arch", arch])
            kl, own = {}, {}
            for t in TYPES:
                model = os.path.join(work, f"{arch}-{t}.gguf")
                manifest["files"][f"{arch}-{t}.gguf"] = sha256(model)
                base = os.path.join(work, f"{arch}-{t}.kld")
                run([perplexity, "-m", model, "-f", TEXT, "-c", str(CTX), "--chunks", str(CHUNKS), "-t", str(THREADS),
                     "--kl-divergence-base", base])
                with open(base, "rb") as src, open(os.path.join(OUT, f"{arch}-{t}.kld.gz"), "wb") as raw:
                    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
                        shutil.copyfileobj(src, gz)
                # llama.cpp against itself: flash attention off (the base ran with it on, the CPU default). On
                # quantized weights the activations are rounded to 8 bits before each product, so the smallest
                # difference upstream moves some roundings: this is the floor for comparing two engines' logits.
                out = run([perplexity, "-m", model, "-t", str(THREADS), "-fa", "off", "--kl-divergence-base", base,
                           "--kl-divergence"])
                own[t] = figures(out)
                if t != "F32":
                    out = run([perplexity, "-m", model, "-t", str(THREADS), "--kl-divergence-base",
                               os.path.join(work, f"{arch}-F32.kld"), "--kl-divergence"])
                    kl[t] = figures(out)
                o = own[t]
                line = f"{arch} {t}: llama.cpp -fa off vs on KLD {o['kld']:.6f}, same top {o['same_top']:.2f} %"
                if t in kl:
                    k = kl[t]
                    line += f"; KLD from F32 {k['kld']:.6f} ± {k['kld_err']:.6f}, same top {k['same_top']:.2f} %"
                print(line, file=sys.stderr)
            manifest["kl"][arch], manifest["self"][arch] = kl, own
            for f in os.listdir(work):
                os.unlink(os.path.join(work, f))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"make_arch_goldens: {OUT}: {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
