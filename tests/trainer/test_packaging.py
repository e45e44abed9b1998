"""pyproject.toml: the wheel setuptools builds holds the trainer (and its demo data), a `trainer`
command, and requirements-trainer.txt's dependencies; installed, it runs from any folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")  # a copy: building in the checkout would leave build/ behind
    for name in ("pyproject.toml", "requirements-trainer.txt", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("trainer", "facts"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           str(src), "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("*.whl")
    return whl


def test_the_wheel_holds_the_trainer_its_command_and_its_pinned_dependencies(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "trainer/__main__.py" in names and "trainer/demo/tiny_qwen2.json" in names
    assert "facts/catalog.py" in names  # the trainer imports the shared facts
    assert not [n for n in names if n.startswith(("infra/", "workloads/", "tests/", "policy/"))]
    assert "trainer = trainer.__main__:main" in entry_points
    pins = [line.strip() for line in (REPO / "requirements-trainer.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert [line.split(": ", 1)[1] for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line] == pins
    assert "Requires-Dist: torch==2.13.0" in meta  # never an unpinned torch


def test_installed_it_runs_from_any_folder_as_a_command_and_as_python_m_trainer(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": f"{target / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(target)}
    for command in ([sys.executable, "-m", "trainer", "--help"], [str(target / "bin" / "trainer"), "--help"]):
        run = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "usage: python -m trainer <command>" in run.stdout and "data " in run.stdout
