"""One error model for every command: a user error carries its exit code, problems are reported together.

A mistake the user can fix (a key, a flag, a file) is a UserError; the one wrapper, `run`, prints
it as `error: ...` on stderr, without a traceback, and returns its exit code. Where input has
several parts (a stack file, a set of flags), every problem is collected first and raised at once,
each naming the key, the value, why it is wrong and how to fix it, so one pass fixes them all.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

EXIT_OK = 0
EXIT_FAILED = 1  # the work ran and failed
EXIT_USAGE = 2  # bad input, or a cluster that cannot be reached; nothing was created or submitted

_NO_VALUE: Any = object()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where (a key, flag or file), the value, why, and the fix."""

    key: str
    why: str
    value: Any = _NO_VALUE
    fix: str | None = None

    def __str__(self) -> str:
        value = "" if self.value is _NO_VALUE else f"{self.value!r} "
        return f"{self.key}: {value}{self.why}" + (f"; {self.fix}" if self.fix else "")


class UserError(Exception):
    """Input the user can fix. Printed as `error: <message>` with no traceback; the process exits `exit_code`."""

    exit_code = EXIT_USAGE


class ProblemsError(UserError):
    """Every problem found in one input, one per line under a title."""

    title = "invalid input"

    def __init__(self, problems: Iterable[Problem | str], title: str | None = None):
        self.problems = [str(p) for p in problems]
        if title is not None:
            self.title = title
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.title} ({len(self.problems)} problem(s)):\n{lines}")


class Problems:
    """Collects problems while input is checked; `raise_if_any` reports them all at once."""

    def __init__(self) -> None:
        self._items: list[Problem | str] = []

    def add(self, key: str, why: str, *, value: Any = _NO_VALUE, fix: str | None = None) -> None:
        self._items.append(Problem(key, why, value, fix))

    def append(self, problem: Problem | str) -> None:
        """A problem already written out as `key: what is wrong; the fix`."""
        self._items.append(problem)

    def extend(self, problems: Iterable[Problem | str]) -> None:
        self._items.extend(problems)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return (str(p) for p in self._items)

    def raise_if_any(self, error: Callable[[list[str]], ProblemsError] = ProblemsError) -> None:
        if self._items:
            raise error([str(p) for p in self._items])


def run(main: Callable[[Sequence[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a command's main; a UserError becomes `error: ...` on stderr and its exit code."""
    try:
        return main(list(sys.argv[1:] if argv is None else argv)) or EXIT_OK
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
