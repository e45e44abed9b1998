"""The error model: a user error prints as `error: ...` with its exit code, problems are reported together."""
from __future__ import annotations

import pytest

from facts import errors


def test_problems_are_collected_then_raised_together():
    problems = errors.Problems()
    problems.raise_if_any()  # nothing yet: no error
    assert not problems and len(problems) == 0
    problems.append("a: is wrong; fix a")
    problems.append("b: is wrong too; fix b")
    problems.extend(["c: third"])
    with pytest.raises(errors.ProblemsError) as info:
        problems.raise_if_any()
    assert info.value.problems == ["a: is wrong; fix a", "b: is wrong too; fix b", "c: third"] == list(problems)
    assert str(info.value).startswith("invalid input (3 problem(s)):\n  - a: is wrong; fix a\n")
    assert info.value.exit_code == errors.EXIT_USAGE


def test_the_wrapper_prints_the_error_and_returns_its_code(capsys):
    class Stopped(errors.UserError):
        exit_code = 7

    def main(argv):
        if argv == ["bad"]:
            raise errors.ProblemsError(["--flag: missing"], title="bad flags")
        if argv == ["stopped"]:
            raise Stopped("the run was stopped")
        return None

    assert errors.run(main, ["ok"]) == errors.EXIT_OK
    assert errors.run(main, ["bad"]) == errors.EXIT_USAGE
    assert capsys.readouterr().err == "error: bad flags (1 problem(s)):\n  - --flag: missing\n"
    assert errors.run(main, ["stopped"]) == 7
    assert capsys.readouterr().err == "error: the run was stopped\n"


def test_anything_else_is_a_bug_and_keeps_its_traceback():
    def main(argv):
        raise KeyError("x")

    with pytest.raises(KeyError):
        errors.run(main, [])


def test_no_exit_code_means_two_things():
    """Each EXIT_ name has its own code and its own row (a repeated code would collapse two rows)."""
    names = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_") and name != "EXIT_CODES"}
    assert len(set(names.values())) == len(names), names
    assert set(errors.EXIT_CODES) == set(names.values())
    assert errors.EXIT_STOPPED != errors.EXIT_SOCKETS


def test_ctrl_c_and_argparse_exits_become_codes(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    def usage(argv):
        import argparse

        argparse.ArgumentParser(prog="cmd").parse_args(argv)

    assert errors.run(interrupted, []) == errors.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"
    assert errors.run(usage, ["--nope"]) == errors.EXIT_USAGE
    assert "unrecognized arguments: --nope" in capsys.readouterr().err
    assert errors.run(usage, ["--help"]) == errors.EXIT_OK
