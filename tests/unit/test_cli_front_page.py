"""`microbatch --help` fits one screen (issue 64): one line per command, grouped in four help panels, at most 40
lines at 80 columns; every command stays reachable, and its own `--help` keeps its paragraphs."""

from __future__ import annotations

from typer.main import get_command
from typer.testing import CliRunner

from microbatch.cli import app
from microbatch.cli.entry import COMMANDS

SCREEN = {"COLUMNS": "80", "TERMINAL_WIDTH": "80", "NO_COLOR": "1"}


def test_the_front_page_is_one_screen_of_one_line_per_command_grouped_by_purpose():
    page = CliRunner().invoke(app, ["--help"], env=SCREEN)
    assert page.exit_code == 0, page.output
    lines = page.output.splitlines()
    assert len(lines) <= 40, page.output
    assert all(len(line) <= 80 for line in lines)
    panels = [line for line in lines if line.startswith("╭─ ")]
    assert [p.split("─ ")[1].split(" ─")[0] for p in panels] == [
        "Options", "Pipelines", "Ledger and audit", "Dead letters", "Local stack"]
    listed = {line.split()[1] for line in lines if line.startswith("│ ") and not line.startswith("│ --")}
    assert listed == {name for name, *_ in COMMANDS}
    assert listed | {"init-db"} == set(get_command(app).commands)  # the alias: reachable, not listed


def test_each_command_keeps_its_paragraphs_in_its_own_help():
    run = CliRunner().invoke(app, ["run", "--help"], env=SCREEN)
    assert run.exit_code == 0 and "tracebacks included, are in that file" in " ".join(run.output.split())
    alias = CliRunner().invoke(app, ["init-db", "--help"], env=SCREEN)
    assert alias.exit_code == 0 and "Alias of migrate." in alias.output
