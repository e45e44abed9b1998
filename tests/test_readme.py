"""The README and docs/ stay true: the README's commands are the ones CI runs, and the generated tables
of docs/ are the declarations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.config import markdown_tables
from facts.errors import markdown_table as exit_codes_table
from trainer.config import markdown_table as trainer_flags_table

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # every page a reader follows links in


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, flags=re.M)
    test_command = next(c for c in commands if c.endswith("python -m pytest"))
    assert test_command in (REPO / ".ci" / "run").read_text()


def generated_table(page: str, marker: str) -> str:
    """The table under `marker` in docs/`page`; the marker appears exactly once in the README and docs/."""
    counts = {p.relative_to(REPO).as_posix(): p.read_text().count(marker) for p in PAGES}
    assert sum(counts.values()) == 1 and counts.get(f"docs/{page}") == 1, \
        f"the marker {marker.strip()} must appear once, in docs/{page}; found {counts}"
    return (REPO / "docs" / page).read_text().split(marker, 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("name", sorted(markdown_tables()))
def test_each_configuration_table_is_the_declarations_in_full(name):
    """Every row, default and meaning: `python -m deploy.config` prints what belongs under the marker."""
    table = generated_table("configuration.md", f"<!-- {name} table: python -m deploy.config -->\n")
    assert table == markdown_tables()[name], "run `python -m deploy.config` and paste its table under the marker"


@pytest.mark.parametrize(("page", "marker", "table"), [
    ("training.md", "<!-- training flags table: python -m trainer flags -->\n", trainer_flags_table),
    ("troubleshooting.md", "<!-- exit codes table: python -m facts.errors -->\n", exit_codes_table),
], ids=["training flags", "exit codes"])
def test_the_trainer_tables_are_the_declarations_in_full(page, marker, table):
    """Every flag, its default, TRL keys and meaning; every exit code: the commands print what belongs under the marker."""
    shown = generated_table(page, marker)
    assert shown == table(), f"run `{marker.split(': ', 1)[1].removesuffix(' -->' + chr(10))}` and paste its table"
