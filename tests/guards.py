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
