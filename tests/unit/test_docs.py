"""The docs stay true to the repository: the README's links resolve, the README shows the two commands,
every repository path and `microbatch.` module the pages name exists, and the architecture page describes
every module and folder of the package. (`make docs`, run by `make test`, checks the links between pages.)"""

import ast
import difflib
import importlib.util
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
README = ROOT / "README.md"
PATH = re.compile(r"(?<![\w./-])((?:include|dags|spark_jobs|plugins|tests|bench|docs)/[\w./-]*)")
MODULE = re.compile(r"(?<![\w.])(microbatch(?:\.\w+)+)")
NOT_MODULES = {"microbatch.seq", "microbatch.correction", "microbatch.retraction"}  # Kafka header names


def _texts() -> dict[str, str]:
    return {path.name: path.read_text() for path in [README, *PAGES]}


def test_readme_shows_the_two_commands_and_its_links_resolve():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links
    for link in links:
        if not link.startswith(("http://", "https://", "#")):
            assert (ROOT / link.split("#")[0]).exists(), f"README links to {link}, which does not exist"


def test_every_repository_path_named_in_the_docs_exists():
    missing = []
    for name, text in _texts().items():
        for match in PATH.finditer(text):
            if text[match.end():match.end() + 1] in ("<", "*"):  # a pattern such as bench/results/<name>.json
                continue
            path = match.group(1).rstrip(".,:;")
            if not (ROOT / path).exists():
                missing.append(f"{name}: {path}")
    assert not missing, missing


def _defines(module_file: Path, name: str) -> bool:
    tree = ast.parse(module_file.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def _resolves(dotted: str) -> bool:
    """`microbatch.a.b[.name]`: a module or package of the source tree, then at most one name it defines."""
    parts = dotted.split(".")
    base = ROOT / "include"
    for i in range(len(parts), 0, -1):
        path = base.joinpath(*parts[:i])
        module_file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if module_file.is_file():
            rest = parts[i:]
            return not rest or (len(rest) == 1 and _defines(module_file, rest[0]))
    return False


def test_every_microbatch_module_named_in_the_docs_exists():
    stale = [f"{name}: {dotted}" for name, text in _texts().items() for dotted in MODULE.findall(text)
             if dotted not in NOT_MODULES and not _resolves(dotted)]
    assert not stale, stale


def test_the_architecture_page_describes_every_module_and_folder_of_the_package():
    page = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "include" / "microbatch"
    entries = [p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
               if not p.name.startswith(("_", ".")) and (p.is_dir() or p.suffix == ".py")]
    undescribed = [entry for entry in entries if f"`{entry}`" not in page]
    assert not undescribed, f"docs/architecture.md does not describe {undescribed}"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PENDING: dict[str, str] = {}
"""Pages whose regeneration is left to whoever merges the concurrent edits of them."""


@pytest.mark.parametrize("page", [
    pytest.param(page, id=page.name, marks=[pytest.mark.xfail(strict=True, reason=PENDING[page.name])]
                 if page.name in PENDING else []) for page in PAGES])
def test_the_generated_parts_of_each_page_are_committed_as_the_code_makes_them(page):
    """The references and the included files are in the committed pages, so they read on GitHub (which shows
    neither an mkdocs hook's output nor a `--8<--` include); a regeneration changes nothing."""
    text = page.read_text()
    fresh = _hooks().refresh(text)
    diff = "".join(list(difflib.unified_diff(text.splitlines(True), fresh.splitlines(True), "committed",
                                             "regenerated"))[:30])
    assert fresh == text, f"docs/{page.name} is stale: run `make docs-generate` and commit it.\n{diff}"
    assert '--8<-- "' not in text, f"docs/{page.name} has a snippet include GitHub does not expand"


def test_every_generated_part_is_delimited_and_a_regeneration_is_stable():
    hooks = _hooks()
    page = ("# Page\n\n<!-- generated: cli-reference -->\n\ntext\n\n```python\n--8<-- \"dags/clicks.py\"\n```\n\nend\n")
    once = hooks.refresh(page)
    assert once.count("<!-- generated: cli-reference -->") == 1 and "<!-- end generated: cli-reference -->" in once
    assert "<!-- include: dags/clicks.py -->\n```python\n" in once and "<!-- end include: dags/clicks.py -->" in once
    assert (ROOT / "dags" / "clicks.py").read_text().strip() in once and "--8<--" not in once
    assert once.endswith("end\n") and hooks.refresh(once) == once
    # What lies between the markers is rewritten; the rest of the page is left as it was.
    edited = once.replace("## `microbatch migrate`", "## hand-edited").replace("\nend\n", "\nthe end\n")
    assert hooks.refresh(edited) == once.replace("\nend\n", "\nthe end\n")


def _layout_tree(page: str) -> set[str]:
    """The module paths of the architecture page's layout tree (two spaces of indent per folder)."""
    block = page.split("## The layout", 1)[1].split("```", 2)[1]
    paths: set[str] = set()
    folders: list[str] = []
    for line in block.strip("\n").splitlines()[1:]:
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip())) // 2 - 1
        folders = folders[:depth]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            paths.add("/".join([*folders, name]))
    return paths


def test_the_architecture_page_shows_every_module_of_the_package_one_line_each():
    package = ROOT / "include" / "microbatch"
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.name != "__init__.py" and "migrations" not in p.relative_to(package).parts}
    tree = _layout_tree((ROOT / "docs" / "architecture.md").read_text())
    assert not modules - tree, f"modules missing from the layout tree of docs/architecture.md: {sorted(modules - tree)}"
    assert not tree - modules, f"the layout tree names modules that do not exist: {sorted(tree - modules)}"


FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
LINK = re.compile(r"\]\(((?:[\w./-]+\.md)?)#([^)\s]+)\)")


def _heading_text(heading: str) -> str:
    """A heading as both renderers read it: inline code and links keep only their text."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return heading.replace("`", "").replace("*", "")


def _github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, every character but letters, digits, `_`, `-` and spaces dropped,
    each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", _heading_text(heading).lower()).replace(" ", "-")


def _mkdocs_slug(heading: str) -> str:
    """Python-Markdown's toc slugify (mkdocs' default): ASCII only, runs of hyphens and spaces one hyphen."""
    text = unicodedata.normalize("NFKD", _heading_text(heading)).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _anchors(text: str) -> tuple[set[str], set[str]]:
    """The anchors of a page on GitHub and on the site: its headings' (a repeated heading's -1, -2 ... included)
    and its HTML anchors."""
    headings = HEADING.findall(FENCE.sub("", text))

    def slugs(slugify: Callable[[str], str]) -> set[str]:
        found: set[str] = set()
        counts: dict[str, int] = {}
        for heading in headings:
            base = slugify(heading)
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
        return found

    ids = set(re.findall(r'<a id="([\w-]+)"', text))  # an HTML anchor is the same in both
    return slugs(_github_slug) | ids, slugs(_mkdocs_slug) | ids


def test_every_anchor_a_page_links_to_is_the_same_on_github_and_the_site():
    """A link to `page.md#anchor` works in both renderers: the target heading's slug is that anchor on GitHub and in
    mkdocs (which `mkdocs build --strict` checks for the site only), and no heading carries a `{#id}` that GitHub
    would show as text."""
    broken = []
    for name, text in _texts().items():
        source = README if name == "README.md" else ROOT / "docs" / name
        for target, anchor in LINK.findall(FENCE.sub("", text)):
            page = (source.parent / target) if target else source
            if not page.is_file():
                continue
            github, mkdocs = _anchors(page.read_text())
            if anchor not in github or anchor not in mkdocs:
                broken.append(f"{name}: {target}#{anchor} (GitHub: {anchor in github}, site: {anchor in mkdocs})")
        braces = [h for h in HEADING.findall(FENCE.sub("", text)) if re.search(r"\{[#.][\w-]+\}$", h)]
        broken += [f"{name}: heading '{h}' has an attribute GitHub shows as text" for h in braces]
    assert not broken, broken


def test_no_admonition_that_github_shows_as_text():
    """`!!! tip` is mkdocs' box and raw text on GitHub: the pages use a blockquote (`> **Tip**`) instead."""
    boxes = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for name, text in _texts().items()
             for m in re.finditer(r"^[ \t]*(!!!|\?\?\?)[ \t]*\w+", FENCE.sub("", text), re.MULTILINE)]
    assert not boxes, f"admonitions GitHub shows as raw text: {boxes}"
