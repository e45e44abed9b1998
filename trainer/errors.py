"""The trainer's one error model: a user error is something the user fixes, never retried.

Configuration, data, model, storage-location and cluster-size problems derive from
UserError. Every CLI prints one as `error: ...` and exits 2 (`cli`); a worker that raises
one ends the run at once whatever --max-failures says (trainer.launch.fit_with_retries),
because every retry would fail the same way. Anything else (a worker or node dying,
storage errors while saving) is retried. Issue 14 later moves this onto the shared
error model of all sides.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, Sequence

EXIT_USAGE = 2


class UserError(Exception):
    """A bad input: the message names it, says what is wrong and how to fix it."""

    exit_code = EXIT_USAGE


def first_line(err: BaseException) -> str:
    """`Type: first line` of an exception, for messages that wrap a library's error."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300]}" if text else type(err).__name__


def cli(main: Callable[[Sequence[str]], int]) -> Callable[[Sequence[str]], int]:
    """A command's main that prints a UserError as `error: ...` and returns its exit code, never a traceback."""

    @functools.wraps(main)
    def run(argv: Sequence[str]) -> int:
        try:
            return int(main(argv) or 0)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return run
