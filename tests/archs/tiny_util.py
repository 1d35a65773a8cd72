"""tests/archs/tiny_util.py: the tiny GGUFs of every architecture (scripts/make_tiny_gguf.py), written once per build
into the build folder, keyed by the script's sha256, and checked against the goldens' manifest."""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))  # e2e_util, oai_util: clusters and the openai client

DSERVE = os.environ.get("DSERVE_BINARY", "")
SOURCE_DIR = os.environ.get("DSERVE_SOURCE_DIR", os.path.join(HERE, "..", ".."))
MAKER = os.path.join(SOURCE_DIR, "scripts", "make_tiny_gguf.py")
GOLDEN = os.path.join(SOURCE_DIR, "tests", "models", "golden", "archs")
CACHE = os.environ.get("DSERVE_TINY_DIR") or os.path.join(tempfile.gettempdir(), "dserve-tiny-gguf")
VENV_PY = os.path.join(os.environ.get("DSERVE_VENV") or os.path.expanduser("~/.cache/dserve/venv"), "bin", "python")
TYPES = ["F32", "Q8_0", "Q4_K_M"]
REGENERATE = "regenerate the goldens: python3 scripts/golden/make_arch_goldens.py (needs llama.cpp: bench/peer.sh)"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def require_env():
    """Skips (with the reason) without the dserve binary or the venv that has numpy and gguf."""
    if not DSERVE or not os.access(DSERVE, os.X_OK):
        raise unittest.SkipTest("DSERVE_BINARY is not set to an executable (run through ctest)")
    if not os.access(VENV_PY, os.X_OK):
        raise unittest.SkipTest("no test venv at %s (scripts/setup.sh makes it: numpy, gguf)" % VENV_PY)


def manifest():
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        return json.load(f)


def models(arch, types=TYPES):
    """{type: path} of arch's tiny GGUFs, written by make_tiny_gguf.py the first time this build asks."""
    key = sha256(MAKER)[:16]
    folder = os.path.join(CACHE, key)
    paths = {t: os.path.join(folder, "%s-%s.gguf" % (arch, t)) for t in types}
    if not all(os.path.exists(p) for p in paths.values()):
        for old in os.listdir(CACHE) if os.path.isdir(CACHE) else []:  # files of an earlier script: 1.2 GB a set
            if old != key and len(old) == 16:
                shutil.rmtree(os.path.join(CACHE, old), ignore_errors=True)
        argv = [VENV_PY, MAKER, "--out", folder, "--arch", arch] + [x for t in types for x in ("--type", t)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if p.returncode:
            raise AssertionError("make_tiny_gguf.py failed (%d): %s" % (p.returncode, p.stderr[-2000:]))
    return paths


def golden_models(test, arch):
    """models(arch), each checked to be the very file the goldens were made from."""
    m = manifest()  # (a change to make_tiny_gguf.py that writes the same bytes keeps the goldens)
    paths = models(arch)
    for t, p in paths.items():
        name = os.path.basename(p)
        want, got = m["files"].get(name), sha256(p)
        if want != got:
            test.fail("%s as written here (sha256 %s) is not the file the goldens were made from (%s): "
                      "make_tiny_gguf.py changed, or numpy or gguf differ from the goldens' machine? %s"
                      % (name, got[:16], (want or "none")[:16], REGENERATE))
    return paths


def golden_base(arch, t, folder):
    """llama.cpp's log-probabilities on arch-t (tests/models/golden/archs/arch-t.kld.gz), unpacked into folder."""
    out = os.path.join(folder, "%s-%s.kld" % (arch, t))
    with gzip.open(os.path.join(GOLDEN, "%s-%s.kld.gz" % (arch, t))) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def kv_bytes_per_token(path):
    """Bytes of one token's KV cache over all layers at f16, read from the GGUF's own metadata (not dserve's code): an
    MLA model (attention.kv_lora_rank) caches one row of kv_lora_rank + rope dimension values per layer, every other
    model K and V rows of head_count_kv x key_length values."""
    from gguf import GGUFReader  # the venv's (require_env)
    r = GGUFReader(path)

    def get(key, default=None):
        f = r.fields.get(key)
        return default if f is None else int(f.parts[f.data[0]][0])

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_layer, rank = get(arch + ".block_count"), get(arch + ".attention.kv_lora_rank", 0)
    if rank > 0:
        return n_layer * (rank + get(arch + ".rope.dimension_count")) * 2
    n_head = get(arch + ".attention.head_count")
    head_dim = get(arch + ".attention.key_length", get(arch + ".embedding_length") // n_head)
    return n_layer * 2 * get(arch + ".attention.head_count_kv", n_head) * head_dim * 2
