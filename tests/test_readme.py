"""The README stays true: its commands are the ones CI runs, and every configuration key is documented."""
from __future__ import annotations

import re
from pathlib import Path

from infra.config import KEYS

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, flags=re.M)
    test_command = next(c for c in commands if c.endswith("python -m pytest"))
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_every_configuration_key_is_documented():
    rows = set(re.findall(r"^\| `([^`]+)` \|", README, flags=re.M))
    assert {"aws:region", *KEYS} <= rows, sorted({"aws:region", *KEYS} - rows)
