#!/usr/bin/env python3
"""The slowest tests of a run, as a Markdown table: `scripts/slowest.py JUNIT_XML [N] > FILE`.

scripts/test.sh writes tests/slowest.md from the cluster tests' JUnit report after every full
run; commit it with a change to the suite, so that the cost of each test is seen where it
changes. Times include setup and teardown (a module's cluster is paid by its first test)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def slowest(report: str, n: int) -> str:
    suite = ET.parse(report).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    cases = [(float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}")
             for case in suite.iter("testcase")]
    cases.sort(reverse=True)
    total = sum(seconds for seconds, _ in cases)
    lines = [
        f"# The {min(n, len(cases))} slowest cluster tests",
        "",
        f"From the last full `make test` (scripts/test.sh): {len(cases)} tests, "
        f"{total / 60:.1f} min of test time in all, run side by side by two workers.",
        "",
        "| seconds | test |",
        "|---:|---|",
        *(f"| {seconds:.1f} | `{name}` |" for seconds, name in cases[:n]),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(slowest(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
