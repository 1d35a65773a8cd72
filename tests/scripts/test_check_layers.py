"""tests/scripts/test_check_layers.py: scripts/check_layers.py passes on this tree and fails on made-up trees with each kind of circle."""

import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("DSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CHECK = os.path.join(SRC, "scripts", "check_layers.py")


def run(root):
    p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def tree(files):
    """A temp tree of {relative path: text}."""
    d = tempfile.mkdtemp(prefix="layers-")
    for rel, text in files.items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return d


PROTO = {"proto/proto.h": '#define PRT_OP_KV_TABLE "kv_table"\n', "proto/proto.c": "int prt_x(void) { return 0; }\n"}


class CheckLayers(unittest.TestCase):
    def test_this_tree_has_no_circle(self):
        rc, out = run(SRC)
        self.assertEqual(rc, 0, out)
        self.assertIn("no circle", out)

    def test_a_clean_tree_passes(self):
        rc, out = run(tree(dict(PROTO, **{
            "router/a.c": "int rtr_b(void);\nint rtr_a(void) { return rtr_b(); }\n",
            "router/b.c": "int rtr_b(void) { return 1; }\n",
            "worker/w.c": '#include "proto/proto.h"\nint wrk_w(void) { return 0; }\n'})))
        self.assertEqual(rc, 0, out)

    def test_files_calling_each_other_fail(self):
        rc, out = run(tree(dict(PROTO, **{
            "router/a.c": "int rtr_b(void);\nint rtr_a(void) { return rtr_b(); }\n",
            "router/b.c": "int rtr_a(void);\nint rtr_b(void) {\n  return rtr_a();\n}\n"})))
        self.assertEqual(rc, 1, out)
        self.assertIn("files of router/ call each other: router/a.c <-> router/b.c", out)

    def test_a_call_through_a_registered_pointer_is_no_circle(self):
        rc, out = run(tree(dict(PROTO, **{
            "router/low.c": "typedef struct s { void (*up)(void); } s;\nvoid rtr_low(s *x) { x->up(); }\n",
            "router/high.c": "typedef struct s { void (*up)(void); } s;\nvoid rtr_low(s *x);\n"
                             "static void up(void) {}\nvoid rtr_high(s *x) { x->up = up; rtr_low(x); }\n"})))
        self.assertEqual(rc, 0, out)

    def test_folders_including_each_other_fail(self):
        rc, out = run(tree(dict(PROTO, **{
            "worker/w.h": '#include "router/r.h"\n', "router/r.h": '#include "worker/w.h"\n'})))
        self.assertEqual(rc, 1, out)
        self.assertIn("folders include each other: router <-> worker", out)

    def test_a_floor_library_including_upward_fails(self):
        rc, out = run(tree(dict(PROTO, **{
            "spec/s.c": '#include "util/err.h"\n#include "worker/w.h"\nint spc_s(void) { return 0; }\n',
            "worker/w.h": '#include "spec/spec.h"\n'})))
        self.assertEqual(rc, 1, out)
        self.assertIn('spec/ may include only util/: spec/s.c: #include "worker/..."', out)

    def test_an_op_name_outside_proto_fails(self):
        rc, out = run(tree(dict(PROTO, **{
            "decode/d.c": 'const char *x = "kv_table"; // a comment with "op" is fine\n',
            "router/r.c": 'const char *y(void) { return "op"; }\n'})))
        self.assertEqual(rc, 1, out)
        self.assertIn('op "kv_table" spelled outside proto/: decode/d.c', out)
        self.assertIn('"op" field read or written outside proto/: router/r.c', out)


if __name__ == "__main__":
    unittest.main()
