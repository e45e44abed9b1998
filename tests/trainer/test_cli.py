"""`python -m trainer`: a subcommand dispatcher that imports a command only when it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.__main__ import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def test_usage_lists_the_commands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in ("local", "data", "train", "efa-check"))


def test_unknown_command_is_an_error(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["local", "data", "train", "efa-check"])
def test_each_command_dispatches_to_its_module(command, capsys):
    assert main([command, "--help"]) == 0
    assert "usage:" in capsys.readouterr().out
    assert COMMANDS[command].module in sys.modules


def test_dispatcher_imports_nothing_heavy():
    code = "import sys, trainer.__main__; print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_step_model_and_flops_import_neither_ray_nor_datasets():
    code = ("import sys, trainer.loop.step, trainer.model.build, trainer.model.flops; "
            "print(sorted(m for m in ('ray', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
