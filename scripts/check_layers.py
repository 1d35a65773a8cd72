#!/usr/bin/env python3
"""scripts/check_layers.py: fails on a circle in the tree's layering: folders that include each other, files of one folder
that call each other, or a control message's op name spelled outside proto/.

usage: scripts/check_layers.py [ROOT]        (default: the repository this script is in)

What it reads (C sources of the library folders and cmd/, comments and strings stripped):
- folder edges: `#include "B/x.h"` in a file of folder A is A -> B. Any circle between folders fails, and so does an
  include from a floor library (FLOORS: util/, spec/, kvstore/) of a folder it may not use.
- file edges, inside each folder: a call in file X of a non-static function defined in file Y of the same folder is
  X -> Y (functions reached through a pointer that a higher file registered are not calls, which is the point: a
  lower layer reads a callback instead of calling up). Any circle between two or more files fails.
- op names: every PRT_OP_* string of proto/proto.h must appear as a string literal in proto/ only (but for the
  everyday words and other meanings listed below), and no file outside proto/ spells a message's "op" field.
Prints each circle with one edge's evidence (the include line, or the function called) and exits 1; 0 and a summary
when there is none."""

import os
import re
import sys

FOLDERS = ["util", "spec", "kvstore", "kernels", "models", "kvxfer", "proto", "ctl", "config", "disco", "kv", "worker", "router", "prefill", "decode",
           "launch", "cmd"]


def strip(src, keep_strings=False):
    """src without comments and (unless keep_strings) with string and char literals emptied."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1] if keep_strings else c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def literals(src):
    """The contents of src's string literals (comments and char literals skipped)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif src[i] in "\"'":
            q, j = src[i], i + 1
            while j < n and src[j] != q:
                j += 2 if src[j] == "\\" else 1
            if q == '"':
                out.append(src[i + 1:j])
            i = j + 1
        else:
            i += 1
    return out


def sources(root):
    for folder in FOLDERS:
        base = os.path.join(root, folder)
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                if name.endswith((".c", ".h")):
                    path = os.path.join(dirpath, name)
                    yield folder, os.path.relpath(path, root), open(path, encoding="utf-8", errors="replace").read()


# Op names that are also everyday words of the OpenAI API or of the router's replies ("error" objects, "token"
# fields, "done"): a literal of these says nothing about who builds a control message; the "op" check below does.
COMMON_WORDS = ("error", "token", "done", "stats", "ping", "pong", "cancel", "hello")
# The same word meaning something else there.
OTHER_MEANING = {("draining", "router/http.c"): "/health's status while the router drains",
                 ("generate", "cmd/main.c"): "the `dserve generate` command's name",
                 ("generate", "cmd/cmd_generate.c"): "the `dserve generate` command's name"}

DEF_RE = re.compile(r"^(?!static\b)(?!typedef\b)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(([^;{}()]|\([^()]*\))*\)\s*\{", re.M)
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
# Floor libraries: each may include only the folders named here (a circle check alone would let them grow upward).
# spec/ (the speculative drafts) sits above util/ and below worker/, prefill/ and decode/, which call it.
# kvstore/ (the shared KV block tier on Redis) likewise: above util/, below worker/.
FLOORS = {"util": (), "spec": ("util",), "kvstore": ("util",)}

INC_RE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]+"', re.M)


def circles(edges):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    nodes = set(edges) | {b for bs in edges.values() for b in bs}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = list(sources(root))
    fail = []

    # Folders, by include.
    fedges, fwhy = {}, {}
    for folder, rel, src in files:
        for m in INC_RE.finditer(strip(src, keep_strings=True)):
            to = m.group(1)
            if to in FOLDERS and to != folder:
                fedges.setdefault(folder, set()).add(to)
                fwhy.setdefault((folder, to), rel + ': #include "' + to + '/..."')
    for folder, tos in sorted(fedges.items()):
        for to in sorted(tos):
            if folder in FLOORS and to not in FLOORS[folder]:
                fail.append("%s/ may include only %s: %s" % (folder, ", ".join(f + "/" for f in FLOORS[folder]) or "itself",
                                                             fwhy[(folder, to)]))
    for comp in circles(fedges):
        fail.append("folders include each other: " + " <-> ".join(comp))
        for a in comp:
            for b in comp:
                if (a, b) in fwhy:
                    fail.append("    " + fwhy[(a, b)])

    # Files of one folder, by call.
    defined = {}  # (folder, function) -> file
    bodies = {}
    for folder, rel, src in files:
        s = strip(src)
        bodies[rel] = (folder, s)
        if rel.endswith(".c"):
            for m in DEF_RE.finditer(s):
                defined.setdefault((folder, m.group(1)), rel)
    n_file_edges = 0
    for folder in FOLDERS:
        cedges, cwhy = {}, {}
        for rel, (fo, s) in bodies.items():
            if fo != folder or not rel.endswith(".c"):
                continue
            for m in CALL_RE.finditer(s):
                to = defined.get((folder, m.group(1)))
                if to and to != rel:
                    cedges.setdefault(rel, set()).add(to)
                    cwhy.setdefault((rel, to), m.group(1))
        n_file_edges += sum(len(v) for v in cedges.values())
        for comp in circles(cedges):
            fail.append("files of %s/ call each other: %s" % (folder, " <-> ".join(comp)))
            for a in comp:
                for b in comp:
                    if (a, b) in cwhy:
                        fail.append("    %s calls %s (%s)" % (a, cwhy[(a, b)], b))

    # Op names in proto/ only.
    proto_h = os.path.join(root, "proto", "proto.h")
    ops = re.findall(r'#define\s+PRT_OP_\w+\s+"([^"]+)"', open(proto_h).read()) if os.path.exists(proto_h) else []
    for folder, rel, src in files:
        if folder == "proto":
            continue
        lits = set(literals(src))
        for op in ops:
            if op in lits and op not in COMMON_WORDS and (op, rel) not in OTHER_MEANING:
                fail.append('op "%s" spelled outside proto/: %s' % (op, rel))
        if "op" in lits:
            fail.append('a message\'s "op" field read or written outside proto/: %s' % rel)

    if fail:
        print("check_layers: %d problem(s)" % sum(1 for f in fail if not f.startswith("    ")))
        print("\n".join(fail))
        return 1
    print("check_layers: no circle: %d folders, %d include edges between them, %d call edges between files; "
          "%d op names only in proto/" % (len(FOLDERS), sum(len(v) for v in fedges.values()), n_file_edges, len(ops)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
