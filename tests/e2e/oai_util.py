"""tests/e2e/oai_util.py: what the openai-client e2e tests share: the client (from the test venv), a cluster per test class, and a JSON Schema check of answers."""

import os
import re
import sys
import threading
import unittest

try:
    import openai
except ImportError:  # ctest runs the e2e tests with the system python: the openai client lives in the test venv
    VENV_PY = os.path.join(os.environ.get("DSERVE_VENV") or os.path.expanduser("~/.cache/dserve/venv"), "bin", "python")
    if os.access(VENV_PY, os.X_OK) and not os.environ.get("DSERVE_OPENAI_REEXEC"):
        os.environ["DSERVE_OPENAI_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY] + sys.argv)
    openai = None

import e2e_util as u

MODEL_ID = {}  # router port -> the served model's id
# format "email" as the server's grammar writes it (models/json_schema.c)
EMAIL = re.compile(r"^[A-Za-z0-9._%+-]{1,64}@([A-Za-z0-9-]{1,38}\.){1,4}[A-Za-z]{2,24}$")


def client(port):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none", max_retries=0,
                         timeout=300 * u.SCALE)


def start(test_class, workers, disagg_threshold, tag, extra=None):
    """A cluster for test_class (closed after it), its router's port in test_class.PORT and the model id in MODEL_ID.
    extra: more top-level config keys (e2e_util.local_config)."""
    u.require_env(test_class)
    if openai is None:
        raise unittest.SkipTest("the openai package is not installed (scripts/setup.sh makes the test venv)")
    c = u.Cluster(workers, disagg_threshold=disagg_threshold, tag=tag, extra=extra)
    test_class.addClassCleanup(c.close)
    c.start()
    test_class.PORT = c.port
    MODEL_ID[c.port] = client(c.port).models.list().data[0].id
    return c


def map_parallel(fn, seeds, parallel=4):
    """fn(seed) for each seed, parallel at a time: the results in seed order (None where it raised), and the errors
    ("seed N: exception"), which the caller reports."""
    out, errors, lock = [None] * len(seeds), [], threading.Lock()

    def worker(k):
        for i in range(k, len(seeds), parallel):
            try:
                out[i] = fn(seeds[i])
            except Exception as ex:
                with lock:
                    errors.append("seed %d: %r" % (seeds[i], ex))

    th = [threading.Thread(target=worker, args=(k,)) for k in range(parallel)]
    for t in th:
        t.start()
    for t in th:
        t.join(600 * u.SCALE)
    return out, errors


def validate(v, s, root=None, path="$"):
    """The errors of value v under schema s, as a list of strings: the keywords the e2e schemas use ($ref into root's
    $defs, anyOf, type, enum, properties, required, additionalProperties, items, minItems/maxItems,
    minLength/maxLength, format email)."""
    root = s if root is None else root
    if "$ref" in s:
        s = root["$defs"][s["$ref"].split("/")[-1]]
    if "anyOf" in s:
        if any(not validate(v, b, root, path) for b in s["anyOf"]):
            return []
        return ["%s: matches no anyOf branch" % path]
    errs = []
    t = s.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if t == "integer":
        if not isinstance(v, int) or isinstance(v, bool):
            return ["%s: not an integer" % path]
    elif t in types and not isinstance(v, types[t]):
        return ["%s: not a %s" % (path, t)]
    if "enum" in s and v not in s["enum"]:
        errs.append("%s: %r not in the enum" % (path, v))
    if isinstance(v, dict):
        props = s.get("properties", {})
        errs += ["%s: %s is required" % (path, k) for k in s.get("required", []) if k not in v]
        if s.get("additionalProperties") is False:
            errs += ["%s: unexpected %s" % (path, k) for k in v if k not in props]
        for k, sub in props.items():
            if k in v:
                errs += validate(v[k], sub, root, path + "." + k)
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", 1 << 30):
            errs.append("%s: %d items" % (path, len(v)))
        for i, x in enumerate(v):
            errs += validate(x, s.get("items", {}), root, "%s[%d]" % (path, i))
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", 1 << 30):
            errs.append("%s: length %d" % (path, len(v)))
        if s.get("format") == "email" and not EMAIL.match(v):
            errs.append("%s: not an email" % path)
    return errs
