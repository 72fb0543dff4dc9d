#!/usr/bin/env python3
"""Reads drill's JUnit XML with a real JUnit reader (junitparser) and prints what a CI would see.

Usage: python3 ci/junit_check.py reports/<scenario>/junit.xml [more.xml ...]
Needs: pip install junitparser

For each file, per suite: its name, tests and failures (as the suite's attributes say), then for
each failing testcase its name and failure message. Exits 0 when every file was read and every
suite's counts agree with its testcases; 1 when a file cannot be read or parsed (or names no
suite), or when the counts in the attributes disagree with the testcases.
"""

import sys

try:
    from junitparser import Error, Failure, JUnitXml, TestSuite
except ImportError:
    print("junit_check: junitparser is not installed (pip install junitparser)", file=sys.stderr)
    sys.exit(1)


def suites_of(doc):
    # fromfile returns a JUnitXml for a <testsuites> root, a TestSuite for a lone <testsuite>.
    if isinstance(doc, TestSuite):
        return [doc]
    return list(doc)


def check(path):
    """Prints one file's suites; returns a list of problems (empty when all is well)."""
    try:
        doc = JUnitXml.fromfile(path)
    except Exception as e:  # the reader raises parser-specific errors; any of them is fatal
        return [f"{path}: cannot parse: {type(e).__name__}: {e}"]
    suites = suites_of(doc)
    if not suites:
        return [f"{path}: no <testsuite> in it"]

    problems = []
    print(f"{path}")
    for suite in suites:
        cases = list(suite)
        failed = [c for c in cases if any(isinstance(r, (Failure, Error)) for r in c.result)]
        print(f"  suite {suite.name!r}: tests={suite.tests} failures={suite.failures}")
        for case in failed:
            for r in case.result:
                if isinstance(r, (Failure, Error)):
                    kind = "failure" if isinstance(r, Failure) else "error"
                    print(f"    {kind} in {case.name!r} (type={r.type!r}): {r.message}")
        if suite.tests != len(cases):
            problems.append(f"{path}: suite {suite.name!r} says tests={suite.tests}, has {len(cases)}")
        n_fail = sum(1 for c in cases if any(isinstance(r, Failure) for r in c.result))
        if suite.failures != n_fail:
            problems.append(f"{path}: suite {suite.name!r} says failures={suite.failures}, has {n_fail}")
    return problems


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 1
    problems = []
    for path in argv[1:]:
        problems += check(path)
    for p in problems:
        print(f"junit_check: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
