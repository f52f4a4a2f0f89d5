"""The pages count and list what the code has: the sink types of the spec (`microbatch.config.SINK_TAGS`) and the
formats of a key or value (`microbatch.formats.registry.FORMATS`), read from the code, never written here.

- A count in words ("five types", "all four sink types", "three formats") is the code's count.
- A run of backticked names (`raw`, `text`, `json` ...) of three or more sink types or formats names them all;
  a page that means a few writes them apart ("an append sink: `postgres_append`, or `delta` append").
- The sinks page's table has one row per type, and the pages that present the platform (README.md, docs/index.md)
  name every type and format.
- The pages are pages, not diaries: performance.md and tests.md stay short, and lead with the current figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from microbatch.config import SINK_TAGS
from microbatch.formats.registry import FORMATS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10}
NUMBER = "|".join(NUMBERS)
KINDS = {"sink types": SINK_TAGS, "formats": frozenset(FORMATS)}


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _counts(text: str, sinks_page: bool) -> list[tuple[int, str, int, int]]:
    """(line, phrase, counted, actual) of each count in words of sink types or formats (on the sinks page, also
    "all five" with the noun left out)."""
    found = []
    patterns = [(rf"\b(?:all\s+)?({NUMBER})(?:\s+sink)?\s+types\b", SINK_TAGS),
                (rf"\b(?:all\s+)?({NUMBER})(?:\s+key(?:\s+and\s+value)?|\s+value)?\s+formats\b", frozenset(FORMATS))]
    if sinks_page:
        patterns.append((rf"\ball\s+({NUMBER})\b(?=[.,;:)])", SINK_TAGS))
    for pattern, names in patterns:
        for match in re.finditer(pattern, text, re.IGNORECASE):
            found.append((_line(text, match.start()), match.group(0), NUMBERS[match.group(1).lower()], len(names)))
    return found


def _runs(text: str, names: frozenset[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of each run of backticked names joined by commas, "and", "or" or slashes."""
    name = "|".join(sorted(names, key=len, reverse=True))
    run = re.compile(rf"`(?:{name})`(?:(?:,\s+|,?\s+and\s+|,?\s+or\s+|/|;\s+)`(?:{name})`)+")
    return [(_line(text, m.start()), re.findall(rf"`({name})`", m.group(0))) for m in run.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_count_of_sink_types_or_formats_is_the_codes(page: Path):
    wrong = [f"{page.name}:{line}: '{phrase}', but the code has {actual}"
             for line, phrase, counted, actual in _counts(page.read_text(), page.name == "sinks.md")
             if counted != actual]
    assert not wrong, wrong


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_list_of_sink_types_or_formats_names_them_all(page: Path):
    text = page.read_text()
    partial = [f"{page.name}:{line}: {', '.join(found)} lacks {', '.join(sorted(names - set(found)))}"
               for kind, names in KINDS.items() for line, found in _runs(text, names)
               if len(found) >= 3 and set(found) != names]
    assert not partial, partial


def test_the_sinks_table_has_a_row_per_type():
    text = (ROOT / "docs" / "sinks.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE))
    assert rows == SINK_TAGS, f"docs/sinks.md's table: lacks {sorted(SINK_TAGS - rows)}, has {sorted(rows - SINK_TAGS)}"
    headings = set(re.findall(r"^## `(\w+)`", text, re.MULTILINE))
    assert headings == SINK_TAGS, f"docs/sinks.md has no section for {sorted(SINK_TAGS - headings)}"


@pytest.mark.parametrize("name", ["README.md", "docs/index.md"])
def test_the_front_pages_name_every_sink_type_and_format(name: str):
    text = (ROOT / name).read_text()
    missing = sorted(n for n in SINK_TAGS | set(FORMATS) if f"`{n}`" not in text)
    assert not missing, f"{name} does not name {missing}"


def test_the_readme_fits_one_screen_with_one_line_of_figures():
    """What it is, the two commands, a pipeline, the features: no diary of dated runs (one line of figures)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    dated = [line for line in text.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert len(dated) <= 1, dated
    assert "```yaml" in text and re.search(r"!\[[^\]]*\]\(docs/img/[\w-]+\.svg\)", text)


@pytest.mark.parametrize(("name", "most"), [("performance.md", 600), ("tests.md", 300)])
def test_the_results_pages_are_pages_not_diaries(name: str, most: int):
    lines = (ROOT / "docs" / name).read_text().splitlines()
    assert len(lines) <= most, f"docs/{name} has {len(lines)} lines; move the history to its own page"
    head = "\n".join(lines[:40])
    assert "|" in head, f"docs/{name} does not lead with a table of the current figures"
