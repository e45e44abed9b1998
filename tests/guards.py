"""Guards for tests that check every item of a collection the code computed.

`for x in found: assert ...` and `assert all(... for x in found)` pass when `found` is empty, so a
bug that finds nothing passes them. Wrap the collection: `for x in nonempty(found, "what it is")`.
"""
from __future__ import annotations

from typing import Iterable, TypeVar

T = TypeVar("T")


def nonempty(items: Iterable[T], what: str) -> list[T]:
    """The items as a list, after asserting there is one at least: checks over none pass vacuously."""
    found = list(items)
    assert found, f"no {what}: the checks over them would pass without checking anything"
    return found


def parse_python(source: str):
    """ast.parse, in a thread of its own when this one's recursion counters are off: CPython 3.11's AST
    constructor can raise `SystemError: AST constructor recursion depth mismatch` in a process where other tests
    changed the recursion limit (torch, jinja2); a fresh thread state starts its counters anew."""
    import ast
    import threading

    try:
        return ast.parse(source)
    except SystemError:
        found: list = []
        worker = threading.Thread(target=lambda: found.append(ast.parse(source)))
        worker.start()
        worker.join()
        if not found:
            raise
        return found[0]
