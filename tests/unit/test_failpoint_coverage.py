"""Every registered failpoint is armed by the suite in every crash mode it supports (and in pause, where registered).

The test reads the string literals of tests/**/*.py outside tests/unit (unit tests parse armings but never let a
process die), f-strings with each `{...}` rendered as `{}`, and splits each at commas into items. A pair
(name, mode) counts as armed when one test file holds:

- exit: the item `name` or `name=exit`; for a point that counts records also `name=N` or `name={}`;
- kill: the item `name=kill`; for a point that counts records also `name=N:kill` or `name={}:kill`;
- pause: an item starting with `name=pause`.

Tests also build armings from names held elsewhere (`p + kill` over a list of names, with `kill = "=kill"`,
or `f"{point}=pause:{HOLD_SECONDS}"`), so a file that holds a suffix `=kill` (or `{}=kill`) arms kill for
every plain `name` item in it, one that holds a suffix starting with `=pause` arms pause for them, and for a
point that counts records a suffix `:kill` arms kill for its `name=N`/`name={}` items. A rule of thumb, not a
proof: a name merely mentioned (a marker path) counts too, so read the failure's list, not the pass, as news.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from microbatch import failpoints

TESTS = Path(__file__).resolve().parents[1]


def literals(source: str) -> set[str]:
    """The string literals of a module, f-strings rendered with `{}` for each field."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.add("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
    return out


def items(source: str) -> set[str]:
    """The comma-separated items of a module's string literals."""
    return {part.strip() for text in literals(source) for part in text.split(",") if part.strip()}


def armed_pairs(found: set[str]) -> set[tuple[str, str]]:
    """The (name, mode) pairs one test file arms, by the rules of the module docstring."""
    suffixes = {item.removeprefix("{}") for item in found if item.removeprefix("{}")[:1] in ("=", ":")}
    pairs = set()
    for name, registered in failpoints.REGISTRY.items():
        counted = {item for item in found if re.fullmatch(re.escape(name) + r"=[\d{}]+", item)}
        counted_kill = any(re.fullmatch(re.escape(name) + r"=[\d{}]*:kill", item) for item in found)
        plain = name in found
        if plain or f"{name}=exit" in found or (registered.counts_records and counted):
            pairs.add((name, failpoints.EXIT))
        if f"{name}=kill" in found or (plain and "=kill" in suffixes and not registered.counts_records) or (
                registered.counts_records and (counted_kill or (counted and ":kill" in suffixes))):
            pairs.add((name, failpoints.KILL))
        if any(item.startswith(f"{name}=pause") for item in found) or (
                plain and any(s.startswith("=pause") for s in suffixes)):
            pairs.add((name, failpoints.PAUSE))
    return pairs


def required_pairs() -> set[tuple[str, str]]:
    """Every registered point with every mode it supports."""
    return {(name, mode) for name, registered in failpoints.REGISTRY.items() for mode in registered.modes}


def suite_pairs() -> set[tuple[str, str]]:
    """The pairs armed by some test file outside tests/unit."""
    files = [path for path in sorted(TESTS.rglob("*.py")) if TESTS / "unit" not in path.parents]
    return {pair for path in files for pair in armed_pairs(items(path.read_text()))}


def test_rules_read_the_ways_tests_arm_points():
    source = '''
kill = "=kill" if mode == "kill" else ""
POINTS = ["commit.before_commit", "publish.after_commit"]
armed = ",".join([f"stage.read={LIMIT}" + (":kill" if mode == "kill" else ""), *(p + kill for p in POINTS)])
hold = f"{point}=pause:{SECONDS}"
HOLD = {"a fault": "plan.list_offsets"}
'''
    pairs = armed_pairs(items(source))
    assert {("stage.read", "exit"), ("stage.read", "kill"), ("commit.before_commit", "kill"),
            ("publish.after_commit", "exit"), ("plan.list_offsets", "pause")} <= pairs
    assert ("stage.read", "kill") not in armed_pairs(items('x = "stage.read=7,commit.after_commit=kill"'))


def test_every_registered_point_is_armed_in_every_mode_it_supports():
    missing = sorted(required_pairs() - suite_pairs())
    for name, mode in missing:
        print(f"never armed by the suite: {name} in mode {mode} (arm it as {failpoints.forms(name)})")
    assert not missing, f"(failpoint, mode) pairs no test outside tests/unit arms: {missing}"
