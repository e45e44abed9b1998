"""The layering docs/architecture.md's Layout describes, read from the imports themselves.

facts is the standard library's only dependant that everyone else may import; infra (AWS) and
workloads (Kubernetes) never import each other, nor the composition root (deploy) above them;
the policy pack imports only facts of this project; the trainer never imports the Pulumi side.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("facts", "infra", "workloads", "deploy", "trainer", "policy", "tests")
ALLOWED = {  # package -> which of ours it may import
    "facts": {"facts"},
    "infra": {"facts", "infra"},
    "workloads": {"facts", "workloads"},
    "deploy": {"facts", "infra", "workloads", "deploy"},
    "policy": {"facts", "policy"},
    "trainer": {"facts", "trainer"},
}


def imported(path: Path) -> set[str]:
    """Top-level names of every module `path` imports, relative imports resolved to its own package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(path.relative_to(REPO).parts[0] if node.level else (node.module or "").split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_layers_below_it(package):
    for path in sorted((REPO / package).rglob("*.py")):
        ours = imported(path) & set(OURS)
        assert ours <= ALLOWED[package], f"{path.relative_to(REPO)} imports {sorted(ours - ALLOWED[package])}"


def test_facts_needs_nothing_but_the_standard_library():
    for path in sorted((REPO / "facts").rglob("*.py")):
        foreign = imported(path) - set(sys.stdlib_module_names) - {"facts", "__future__"}
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_the_pulumi_entry_point_is_the_composition_root():
    assert imported(REPO / "__main__.py") & set(OURS) == {"deploy", "facts"}
