"""Reading Pulumi.<stack>.yaml as the offline plan needs it: every problem of the file itself named by line.

The Pulumi CLI parses the file for `pulumi preview`; offline, this reader does, and refuses what the
CLI would silently take differently: a key given twice (the last one would win), values YAML tags
turn into something else, a `config:` that is not a mapping. Secret values (`secure:`) cannot be
decrypted offline: their keys are checked, their values only by `pulumi preview`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from facts.errors import ProblemsError, first_line
from facts.reading import BoundedYaml, InputLimit, decode_utf8


class StackFileError(ProblemsError):
    """Problems of the stack file itself, one per line, each with the file and line."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(problems, title=path.name)


@dataclass
class StackFile:
    path: Path
    config: dict[str, Any]
    lines: dict[str, int]  # config key -> line in the file (1-based)
    secrets: list[str] = field(default_factory=list)  # keys with secure: values


class _Loader(BoundedYaml, yaml.SafeLoader):
    """SafeLoader that remembers where each mapping key was and refuses duplicates, bounded (facts.reading)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                self.duplicates.append(f"line {line}: {key!r} is given twice (also on line {seen[key]}); Pulumi would "
                                       "silently use the last one. Keep one")
            else:
                seen[key] = line
        self.key_lines.update({k: v for k, v in seen.items() if isinstance(k, str)})
        return super().construct_mapping(node, deep=deep)


def read(path: Path) -> StackFile:
    """Parse a stack file; raises StackFileError naming the file, the line and the fix."""
    if path.is_dir():
        raise StackFileError(path, [f"{path} is a folder, not a stack file; pass the Pulumi.<stack>.yaml file"])
    loader = None
    try:
        loader = _Loader(decode_utf8(path.read_bytes()))
        loader.duplicates, loader.key_lines = [], {}
        data = loader.get_single_data()
    except (OSError, InputLimit) as err:
        raise StackFileError(path, [str(err) if isinstance(err, InputLimit) else f"cannot be read "
                                    f"({first_line(err)})"]) from None
    except yaml.constructor.ConstructorError as err:
        mark = err.problem_mark
        raise StackFileError(path, [f"line {mark.line + 1}: {err.problem}; Pulumi stack files hold plain values: "
                                    "remove the tag (quote the value if it is a string)"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        what = getattr(err, "problem", None) or str(err)
        raise StackFileError(path, [f"{where}: not valid YAML ({what}); fix the indentation or quoting there"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    problems = [*loader.duplicates, *getattr(loader, "yaml11", [])]
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise StackFileError(path, [f"the file holds a {type(data).__name__}, not a mapping with a config: section"])
    config = data.get("config") or {}
    if not isinstance(config, dict):
        line = loader.key_lines.get("config", 1)
        problems.append(f"line {line}: config: is a {type(config).__name__}; it must be a mapping of "
                        "namespace:key: value, e.g. `aws:region: us-east-1`")
        config = {}
    parsed, secrets = {}, []
    for key, value in config.items():
        if not isinstance(key, str):
            problems.append(f"line {loader.key_lines.get(key, '?')}: key {key!r} is not a string; write it as "
                            "raytrain-eks:NAME")
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            secrets.append(key)
            continue
        parsed[key] = value
    if problems:
        raise StackFileError(path, problems)
    return StackFile(path, parsed, {k: v for k, v in loader.key_lines.items() if k in config}, secrets)


def secret_problems(stack: StackFile, project: str) -> list[str]:
    """Secrets cannot be decrypted offline; none of this program's settings is secret."""
    problems = []
    for key in stack.secrets:
        where = f"{stack.path.name} line {stack.lines.get(key, '?')}"
        if key.startswith(f"{project}:"):
            fix = (f"none of {project}'s settings is secret: store it in plain text "
                   f"(`pulumi config set {key} VALUE`, without --secret)")
        else:
            fix = "run `pulumi preview`, which decrypts it and checks the value"
        problems.append(f"{key} ({where}): a secure: value; the offline plan cannot decrypt it, so only its key "
                        f"was checked, not its value; {fix}")
    return problems


def locate(problem: str, stack: StackFile) -> str:
    """Add the file and line to a configuration problem that names a key of the file (or a setting inside one)."""
    key = problem.split(": ", 1)[0]
    namespace, _, name = key.partition(":")
    top = f"{namespace}:{name.split('.')[0]}"
    for candidate in (key, top):
        if candidate in stack.lines:
            return f"{problem} ({stack.path.name} line {stack.lines[candidate]})"
    return problem
