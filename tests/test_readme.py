"""The README stays true: its commands are the ones CI runs, and its configuration tables are the declarations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.config import markdown_tables
from facts.errors import markdown_table as exit_codes_table
from trainer.config.flags import markdown_table as trainer_flags_table

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


@pytest.mark.parametrize(("marker", "table"), [
    ("<!-- training flags table: python -m trainer flags -->\n", trainer_flags_table),
    ("<!-- exit codes table: python -m facts.errors -->\n", exit_codes_table),
], ids=["training flags", "exit codes"])
def test_the_trainer_tables_are_the_declarations_in_full(marker, table):
    """Every flag, its default, TRL keys and meaning; every exit code: the commands print what belongs under the marker."""
    assert README.count(marker) == 1, f"the README lacks the marker {marker.strip()}"
    shown = README.split(marker, 1)[1].split("\n\n", 1)[0]
    assert shown == table(), f"run `{marker.split(': ', 1)[1].removesuffix(' -->' + chr(10))}` and paste its table"
