"""One error model for every command: a user error carries its exit code, problems are reported together.

A mistake the user can fix (a key, a flag, a file) is a UserError; the one wrapper, `run`, prints
it as `error: ...` on stderr, without a traceback, and returns its exit code. Where input has
several parts (a stack file, a set of flags), every problem is collected first and raised at once,
each naming the key, the value, why it is wrong and how to fix it, so one pass fixes them all.

Every command of the project (`python -m deploy.plan`, `python -m trainer <command>`) exits with
a code of EXIT_CODES, and no code means two things (`python -m facts.errors` prints the table of
docs/troubleshooting.md, Exit codes).
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Sequence

EXIT_OK = 0
EXIT_FAILED = 1  # the work ran and failed
EXIT_USAGE = 2  # bad input, or a cluster that cannot be reached; nothing was created or submitted
EXIT_STOPPED = 3  # a submitted run was stopped before it ended
EXIT_NO_PROOF = 4  # the NCCL logs prove neither EFA nor a fallback
EXIT_SOCKETS = 5  # NCCL fell back to TCP sockets
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)

# code -> (meaning, the commands that exit with it): the exit-code table of docs/troubleshooting.md
EXIT_CODES: dict[int, tuple[str, str]] = {
    EXIT_OK: ("succeeded (`efa-check`: EFA on every node with network traffic)", "every command"),
    EXIT_FAILED: ("the work ran and failed: training, a submitted run, a benchmark setup", "`train`, `local`, "
                  "`submit`, `status`, `logs`, `nccl-bench`, `bench`"),
    EXIT_USAGE: ("bad input (a flag, key or file: `error: ...` names it and the fix), or a cluster that cannot be "
                 "reached; nothing was created, written or submitted. A submitted job that found a bad input on "
                 "the cluster exits 2 too", "every command"),
    EXIT_STOPPED: ("the submitted run was stopped (`trainer stop`)", "`submit`, `status`, `logs`"),
    EXIT_NO_PROOF: ("no proof either way: no NCCL transport line, or single-node logs only", "`efa-check`"),
    EXIT_SOCKETS: ("NCCL fell back to TCP sockets on at least one node (named)", "`efa-check`"),
    EXIT_INTERRUPTED: ("interrupted (Ctrl-C)", "every command"),
}


class UserError(Exception):
    """Input the user can fix. Printed as `error: <message>` with no traceback; the process exits `exit_code`."""

    exit_code = EXIT_USAGE


class ProblemsError(UserError):
    """Every problem found in one input, one per line under a title."""

    title = "invalid input"

    def __init__(self, problems: Iterable[str], title: str | None = None):
        self.problems = [str(p) for p in problems]
        if title is not None:
            self.title = title
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.title} ({len(self.problems)} problem(s)):\n{lines}")

    def __reduce__(self):  # a Ray worker's error reaches the driver pickled
        return (type(self), (self.problems, self.title))


class Problems:
    """Collects problems while input is checked; `raise_if_any` reports them all at once."""

    def __init__(self) -> None:
        self._items: list[str] = []

    def append(self, problem: str) -> None:
        """A problem written out as `key: the value, what is wrong; the fix`."""
        self._items.append(str(problem))

    def extend(self, problems: Iterable[str]) -> None:
        self._items.extend(map(str, problems))

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def raise_if_any(self, error: Callable[[list[str]], ProblemsError] = ProblemsError) -> None:
        if self._items:
            raise error(list(self._items))


def first_line(err: BaseException) -> str:
    """`Type: first line` of an exception, for a message that wraps a library's error."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300]}" if text else type(err).__name__


def run(main: Callable[[Sequence[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a command's main; a UserError becomes `error: ...` on stderr and its exit code, Ctrl-C 130.

    argparse's exit (usage printed, or --help) becomes its code too, so a caller always gets a code back.
    """
    try:
        return main(list(sys.argv[1:] if argv is None else argv)) or EXIT_OK
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or EXIT_OK
        raise
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def markdown_table() -> str:
    """The exit-code table of docs/troubleshooting.md."""
    rows = [f"| {code} | {meaning} | {commands} |" for code, (meaning, commands) in EXIT_CODES.items()]
    return "\n".join(["| code | meaning | commands |", "|---|---|---|", *rows])


if __name__ == "__main__":
    print(f"<!-- exit codes table: python -m facts.errors -->\n{markdown_table()}")
