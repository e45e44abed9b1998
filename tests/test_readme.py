"""The README stays true: its commands are the ones CI runs, and its configuration tables are the declarations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.config import markdown_tables

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, flags=re.M)
    test_command = next(c for c in commands if c.endswith("python -m pytest"))
    assert test_command in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("name", sorted(markdown_tables()))
def test_each_configuration_table_is_the_declarations_in_full(name):
    """Every row, default and meaning: `python -m deploy.config` prints what belongs under the marker."""
    marker = f"<!-- {name} table: python -m deploy.config -->\n"
    assert README.count(marker) == 1, f"the README lacks the marker {marker.strip()}"
    table = README.split(marker, 1)[1].split("\n\n", 1)[0]
    assert table == markdown_tables()[name], "run `python -m deploy.config` and paste its table under the marker"
