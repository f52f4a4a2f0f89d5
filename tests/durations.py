"""Where the suite's time goes: seconds per test file and per fixture, from the JUnit XML that `make test` writes
(`.cache/test-report/junit.xml`) and the fixture timings of tests/conftest.py (`.cache/test-report/fixtures.json`).

    python tests/durations.py [REPORT_DIR] [--top N]

Prints Markdown tables (for docs/tests.md): files by total seconds (tests, seconds, the slowest test), the
slowest N tests, and the fixtures by setup seconds.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def test_times(junit: Path) -> list[tuple[str, str, float, str]]:
    """(file, test name, seconds, outcome) of every test case in a JUnit XML."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not case.get("name"):  # the test a Ctrl-C interrupted: no name, no outcome
            continue
        module = case.get("classname", "").split("[")[0]
        parts = module.split(".")
        # classname is the dotted module (and class, if any): the file is the part up to the test_*/module name.
        cut = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        path = "/".join(parts[: cut + 1]) + ".py"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        out.append((path, case.get("name", ""), float(case.get("time", 0)), outcome))
    return out


def by_file(cases: list[tuple[str, str, float, str]]) -> list[tuple[str, int, float, str, float]]:
    """(file, tests, seconds, slowest test, its seconds), the slowest file first."""
    files: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for path, name, seconds, _ in cases:
        files[path].append((name, seconds))
    rows = []
    for path, tests in files.items():
        slowest = max(tests, key=lambda t: t[1])
        rows.append((path, len(tests), sum(s for _, s in tests), slowest[0], slowest[1]))
    return sorted(rows, key=lambda r: -r[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir", nargs="?", default=".cache/test-report", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    cases = test_times(args.report_dir / "junit.xml")
    total = sum(c[2] for c in cases)
    outcomes = defaultdict(int)
    for case in cases:
        outcomes[case[3]] += 1
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(outcomes.items()))
    print(f"{len(cases)} tests, {total:.0f} s in tests ({summary})\n")
    print("| file | tests | seconds | share | slowest test (s) |\n|---|---|---|---|---|")
    for path, n, seconds, slowest, slowest_s in by_file(cases):
        print(f"| {path} | {n} | {seconds:.0f} | {seconds / total:.0%} | {slowest} ({slowest_s:.0f}) |")
    print(f"\n| the {args.top} slowest tests | seconds |\n|---|---|")
    for path, name, seconds, _ in sorted(cases, key=lambda c: -c[2])[: args.top]:
        print(f"| {path}::{name} | {seconds:.0f} |")
    timings: dict[str, float] = defaultdict(float)
    for fixtures in sorted(args.report_dir.glob("fixtures*.json")):  # one per pytest-xdist worker
        for name, seconds in json.loads(fixtures.read_text()).items():
            timings[name] += seconds
    if timings:
        print("\n| fixture (scope) | setup seconds, all uses |\n|---|---|")
        for name, seconds in sorted(timings.items(), key=lambda kv: -kv[1]):
            if seconds >= 1:
                print(f"| {name} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
