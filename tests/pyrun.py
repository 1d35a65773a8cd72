#!/usr/bin/env python3
"""tests/pyrun.py: runs one Python test module (or some of its cases) for ctest; the exit status says what happened.

Usage (from the module's folder; tests/CMakeLists.txt's dserve_pytests registers it):
  pyrun.py MODULE [--only CASE]... [--exclude CASE]...
CASE names one test as Class.test_name (or any dotted tail of its id). --only runs just those; --exclude leaves
those out (dserve_pytests gives a case that may skip its own ctest entry with --only, and leaves it out of the
module's entry with --exclude, so its skip shows in ctest's summary while the module's passes still read as passed).

Exit status:
  0   every case that ran passed (an expected failure counts as a pass)
  77  nothing passed and at least one case (or a whole class, from setUpClass) was skipped: ctest reads it as
      skipped (SKIP_RETURN_CODE 77)
  1   a failure, an error (also an import error of the module), an unexpected success, no case at all (a wrong
      --only), or some cases passed while others skipped: a skip must not hide inside a passing entry, so a case
      that can skip while its neighbours pass has to be registered on its own (dserve_pytests ... SPLIT)
"""

import argparse
import sys
import unittest


def flatten(suite):
    """The test cases of a (nested) suite, in order. A flat suite still runs setUpClass/setUpModule once per class."""
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def matches(test, names):
    tid = test.id()
    return any(tid == n or tid.endswith("." + n) for n in names)


class Result(unittest.TextTestResult):
    """Counts passes explicitly: a class skipped in setUpClass adds a skip but no run test."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module")
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--exclude", action="append", default=[])
    a = ap.parse_args(argv[1:])
    sys.path.insert(0, ".")
    loaded = unittest.defaultTestLoader.loadTestsFromName(a.module)
    cases = [t for t in flatten(loaded)
             if (not a.only or matches(t, a.only)) and not matches(t, a.exclude)]
    suite = unittest.TestSuite(cases)
    res = unittest.TextTestRunner(verbosity=2, resultclass=Result).run(suite)
    passed = res.passed + len(res.expectedFailures)
    failed = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
    skipped = len(res.skipped)
    what = "%s%s: %d passed, %d skipped, %d failed" % (
        a.module, " (only %s)" % ", ".join(a.only) if a.only else "", passed, skipped, failed)
    for t, why in res.skipped:
        print("pyrun: skipped %s: %s" % (t.id() if hasattr(t, "id") else t, why))
    if failed:
        print("pyrun: FAILED " + what)
        return 1
    if not passed and not skipped:
        print("pyrun: FAILED %s: no test ran (a wrong --only?)" % what)
        return 1
    if not passed:
        print("pyrun: SKIPPED " + what)
        return 77
    if skipped:
        print("pyrun: FAILED %s: some cases passed and some skipped; register each case that can skip as its own "
              "ctest entry (dserve_pytests(LABEL SPLIT module.Class.test) in its CMakeLists.txt) so that ctest shows "
              "the skip" % what)
        return 1
    print("pyrun: passed " + what)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
