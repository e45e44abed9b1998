"""No test checks every item of a computed collection without knowing there is one (tests/guards.py).

The rule, read from each test function's AST (functions named test_*, at module level or in a class):

  * a `for` loop among the test's own statements (its body, and the bodies of `with`, `if` and `try`
    there; not a loop nested in another loop) whose body holds an `assert`, and
  * `all(<comprehension>)` as an `assert` (or one `and` operand of it) among those statements or in a loop

must iterate something known to be non-empty:

  * a non-empty literal (`[...]`, `(...)`, `{...}`, a string), a module-level name bound to one in the same
    file, or `range(<constants>)`;
  * `nonempty(...)` (tests.guards);
  * a name the test assigned from any of these;
  * an argument of the test that each case of its @pytest.mark.parametrize (a literal list, or a name bound
    to one at module level) sets to a non-empty literal;
  * an expression an earlier `assert` of the test (or an earlier operand of the same `and`) showed
    non-empty: `assert x`, `assert len(x) == 3` (or `> 0`, `>= 1`), `assert x == <non-empty literal>`,
    `assert x >= {...}`, `assert "a" in x`, `assert x == y` for a `y` of this list; `sorted(x)`, `set(x)`,
    `list(x)`, `tuple(x)` and a comprehension `[... for i in x]` in such an assert stand for `x`;
  * any of these through `sorted`, `list`, `tuple`, `set`, `reversed`, `enumerate`, `zip` (every argument;
    one with strict=True), `+` (either side), `range(len(...))`, `.items()`, `.keys()`, `.values()` and a
    comprehension without `if` over them.

`any(...)` needs no guard: it is False on nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.guards import nonempty, parse_python

TESTS = Path(__file__).resolve().parent
HELPER = "nonempty"
PASSTHROUGH = {"sorted", "list", "tuple", "set", "reversed", "enumerate", "iter"}
VIEWS = {"items", "keys", "values"}


def _literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return bool(node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.keys)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(node.value)


def _module_literals(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level names bound to a non-empty literal, and the literal."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and _literal(node.value):
            names.update((t.id, node.value) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and node.value is not None and _literal(node.value) \
                and isinstance(node.target, ast.Name):
            names[node.target.id] = node.value
    return names


def _call_name(node: ast.AST) -> str | None:
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None


def _known(node: ast.AST, guarded: set[str], literals: dict[str, ast.AST]) -> bool:
    """Whether iterating `node` is known to give one item at least."""
    if _literal(node) or ast.unparse(node) in guarded:
        return True
    if isinstance(node, ast.Name):
        return node.id in literals
    name = _call_name(node)
    if name == HELPER:
        return True
    if name in PASSTHROUGH and node.args:
        return _known(node.args[0], guarded, literals)
    if name == "zip" and node.args:
        strict = any(k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
        return (any if strict else all)(_known(a, guarded, literals) for a in node.args)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _known(node.left, guarded, literals) or _known(node.right, guarded, literals)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return not any(g.ifs for g in node.generators) and all(_known(g.iter, guarded, literals)
                                                               for g in node.generators)
    if name == "range" and node.args:
        if len(node.args) == 1 and _call_name(node.args[0]) == "len" and node.args[0].args:
            return _known(node.args[0].args[0], guarded, literals)
        return all(isinstance(a, ast.Constant) for a in node.args) and len(range(*(a.value for a in node.args))) > 0
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in VIEWS \
            and not node.args:
        return _known(node.func.value, guarded, literals)
    return False


def _subjects(node: ast.AST) -> list[ast.AST]:
    """The expression and what it is made from: through sorted/set/list/tuple, and a comprehension's source."""
    out = [node]
    while True:
        if _call_name(node) in {"sorted", "set", "list", "tuple"} and node.args:
            node = node.args[0]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            node = node.generators[0].iter
        else:
            return out
        out.append(node)


def _shown_nonempty(test: ast.AST, guarded: set[str], literals: dict[str, ast.AST]) -> set[str]:
    """Expressions an assert with this test shows non-empty (when it passes)."""
    operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    shown: set[str] = set()
    for op in operands:
        if not isinstance(op, ast.Compare):
            if not isinstance(op, (ast.UnaryOp, ast.Constant)):
                shown.add(ast.unparse(op))
            continue
        parts = [op.left, *op.comparators]
        for i, cmp in enumerate(op.ops):
            left, right = parts[i], parts[i + 1]
            if isinstance(cmp, ast.In):
                shown.update(ast.unparse(s) for s in _subjects(right))
            if _call_name(left) == "len" and left.args and isinstance(right, ast.Constant) \
                    and isinstance(right.value, int):
                if (isinstance(cmp, ast.Eq) and right.value > 0) or (isinstance(cmp, ast.Gt) and right.value >= 0) \
                        or (isinstance(cmp, ast.GtE) and right.value >= 1) \
                        or (isinstance(cmp, ast.NotEq) and right.value == 0):
                    shown.add(ast.unparse(left.args[0]))
        if all(isinstance(c, ast.Eq) for c in op.ops) and any(_known(p, guarded, literals) for p in parts):
            shown.update(ast.unparse(s) for p in parts for s in _subjects(p))
        for cmp, left, right in zip(op.ops, parts, parts[1:], strict=False):
            bigger = left if isinstance(cmp, ast.GtE) else right if isinstance(cmp, ast.LtE) else None
            smaller = right if bigger is left else left
            if bigger is not None and _literal(smaller):
                shown.update(ast.unparse(s) for s in _subjects(bigger))
    return shown


def _statements(body: list[ast.stmt], in_loop: bool = False):
    """(statement, in a loop) for a test's statements in order, into blocks and loops, not nested functions."""
    for stmt in body:
        yield stmt, in_loop
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from _statements(stmt.body, in_loop)
        elif isinstance(stmt, ast.If):
            yield from _statements(stmt.body, in_loop)
            yield from _statements(stmt.orelse, in_loop)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _statements(block, in_loop)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            yield from _statements(stmt.body, True)


def _test_functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (f for f in node.body
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test_"))


def unguarded(source: str) -> list[tuple[int, str]]:
    """(line, what) of each loop of checks, or all(...) assert, over a collection not known to be non-empty."""
    tree = parse_python(source)
    literals = _module_literals(tree)
    found = []
    for function in _test_functions(tree):
        guarded = _parametrized_literals(function, literals)
        for stmt, in_loop in _statements(function.body):
            if isinstance(stmt, ast.Assign) and _known(stmt.value, guarded, literals):
                guarded.update(ast.unparse(t) for t in stmt.targets)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)) and not in_loop:
                asserts = any(isinstance(n, ast.Assert) for s in stmt.body for n in ast.walk(s))
                if asserts and not _known(stmt.iter, guarded, literals):
                    found.append((stmt.lineno, f"for ... in {ast.unparse(stmt.iter)}"))
            elif isinstance(stmt, ast.Assert):
                and_ = isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.And)
                for op in stmt.test.values if and_ else [stmt.test]:  # `assert xs and all(... for x in xs)`
                    if _call_name(op) == "all" and op.args and isinstance(op.args[0], (ast.GeneratorExp, ast.ListComp)):
                        source_of = op.args[0].generators[0].iter
                        if not _known(source_of, guarded, literals):
                            found.append((stmt.lineno, f"all(... for ... in {ast.unparse(source_of)})"))
                    guarded |= _shown_nonempty(op, guarded, literals)
    return found


def _parametrized_literals(function: ast.FunctionDef, literals: dict[str, ast.AST]) -> set[str]:
    """Arguments of the test that every case of its @pytest.mark.parametrize sets to a non-empty literal."""
    names = set()
    for deco in function.decorator_list:
        if not (isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("parametrize") and len(deco.args) >= 2):
            continue
        argnames, cases = deco.args[0], deco.args[1]
        if isinstance(cases, ast.Name):
            cases = literals.get(cases.id, cases)
        if not (isinstance(argnames, ast.Constant) and isinstance(cases, (ast.List, ast.Tuple)) and cases.elts):
            continue
        args = [a.strip() for a in argnames.value.split(",") if a.strip()]
        rows = [c.elts if len(args) > 1 and isinstance(c, ast.Tuple) else [c] for c in cases.elts]
        for i, arg in enumerate(args):
            if all(len(row) == len(args) and _literal(row[i]) for row in rows):
                names.add(arg)
    return names


def test_the_scanner_finds_a_planted_unguarded_loop_and_accepts_each_guard():
    source = '''
PAIRS = [(1, 2)]

def test_planted(found, plan):
    for x in found:  # flagged
        assert x
    assert all(x > 0 for x in plan.values)  # flagged
    for x in [1, 2]:
        assert x
    for a, b in PAIRS:
        assert a < b
    for x in nonempty(found, "items"):
        assert x
    rows = nonempty(plan.rows(), "rows")
    for r in rows:
        assert r
    assert len(plan.values) == 2
    assert all(v for v in plan.values)
    for i in range(3):
        assert i < 3
    assert "a" in plan.names and plan.kinds == {"x"}
    for k, v in sorted(plan.names.items()):
        assert k
    assert all(k for k in plan.kinds)
    assert set(plan.other) >= {"y"}
    for o in plan.other:
        assert o
    for x in range(0):  # flagged, an empty range
        assert x
    for key in ("a", "b"):
        assert all(key in r for r in found), key  # flagged
    for x in found:  # asserts nothing: not a check
        print(x)
    assert any(x for x in found)
    names = ["a", "b"]
    for n in names:
        assert n
    for label, value in zip(("loss", "grad"), found, strict=True):
        assert value, label
    for x in found + [1]:
        assert x
    assert plan.found and all(f for f in plan.found)
    assert [r.step for r in plan.rows] == [1, 2]
    for r in plan.rows:
        assert r.loss
    procs = [str(i) for i in range(2)]
    assert [p for p in plan.ranks] == [str(i) for i in range(2)]
    for p in procs:
        assert p
    assert all(r for r in plan.ranks)

@pytest.mark.parametrize("words, n", [(["a"], 1), (("b", "c"), 2)])
def test_parametrized(words, n, found):
    for w in words:
        assert w
    assert all(f for f in found)  # flagged

class TestGrouped:
    def test_in_a_class(self, items):
        with open("f") as f:
            for item in zip(items, [1]):  # flagged, items is not known
                assert item
'''
    flagged = [n for n, line in enumerate(source.splitlines(), 1) if "# flagged" in line]
    assert [line for line, _ in unguarded(source)] == flagged and len(flagged) == 6
    assert [what for _, what in unguarded(source)] == [
        "for ... in found", "all(... for ... in plan.values)", "for ... in range(0)", "all(... for ... in found)",
        "all(... for ... in found)", "for ... in zip(items, [1])"]


def test_every_loop_of_checks_over_a_computed_collection_is_guarded():
    files = nonempty(sorted(TESTS.rglob("*.py")), "test files")
    found = [f"{path.relative_to(TESTS.parent)}:{line}: {what}" for path in files
             for line, what in unguarded(path.read_text())]
    assert found == [], "wrap each collection in tests.guards.nonempty (or assert it non-empty first):\n" + \
        "\n".join(found)


def test_nonempty_returns_the_items_and_refuses_none():
    assert nonempty(iter({"a": 1}), "keys") == ["a"]
    with pytest.raises(AssertionError, match="no resources of the plan: the checks over them would pass"):
        nonempty([], "resources of the plan")
