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

from tests.guards import nonempty, parse_python

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
    for node in ast.walk(parse_python(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(path.relative_to(REPO).parts[0] if node.level else (node.module or "").split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_layers_below_it(package):
    for path in nonempty(sorted((REPO / package).rglob("*.py")), "modules of the package"):
        ours = imported(path) & set(OURS)
        assert ours <= ALLOWED[package], f"{path.relative_to(REPO)} imports {sorted(ours - ALLOWED[package])}"


def test_facts_needs_nothing_but_the_standard_library():
    for path in nonempty(sorted((REPO / "facts").rglob("*.py")), "modules of facts"):
        foreign = imported(path) - set(sys.stdlib_module_names) - {"facts", "__future__"}
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_the_pulumi_entry_point_is_the_composition_root():
    assert imported(REPO / "__main__.py") & set(OURS) == {"deploy", "facts"}


# --- trainer/: one subpackage per concern, no import cycle ---------------------------------------------

def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def trainer_imports() -> dict[str, set[str]]:
    """Module -> the trainer modules it imports, wherever the import stands (top level or inside a function:
    a function-local import cannot hide a cycle from this graph)."""
    modules = {module_name(p): p for p in (REPO / "trainer").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(parse_python(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = (node.module or "") if not node.level else \
                    ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [node.module])])
                targets = [f"{base}.{a.name}" for a in node.names]
                found.update(t if t in modules else base for t in targets if t in modules or base in modules)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target not in modules and "." in target:
                        target = target.rpartition(".")[0]
                    if target in modules:
                        found.add(target)
        graph[name] = found - {name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph, as the path that closes it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    return next((c for n in sorted(graph) if n not in state and (c := visit(n))), None)


def concern(module: str) -> str:
    """trainer.model.build -> model; trainer.storage -> storage (a top-level module is a concern of its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "trainer"


def test_no_trainer_module_imports_itself_back_even_from_inside_a_function():
    graph = trainer_imports()
    assert len(graph) > 40, "the import graph was not read"
    found = cycle(graph)
    assert found is None, f"import cycle: {' -> '.join(found)}"


def test_the_trainer_subpackages_form_layers_without_a_cycle():
    packages: dict[str, set[str]] = {}
    for module, targets in trainer_imports().items():
        packages.setdefault(concern(module), set()).update(concern(t) for t in targets if concern(t) != concern(module))
    packages.pop("trainer", None)  # the package's own __init__/__main__: the dispatcher imports commands by name
    assert {"config", "data", "model", "loop", "run_folder", "jobs", "submit", "efa", "bench"} <= set(packages)
    found = cycle(packages)
    assert found is None, f"subpackage cycle: {' -> '.join(found)}"


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None

