"""Where a TrainConfig comes from: defaults < a YAML file (``--config FILE``) < command-line flags.

The argparse flags and the YAML reader derive from the declarations (trainer.config.flags); a
TRL/transformers YAML's keys are mapped by trainer.config.trl. All problems are collected and
raised together as one ConfigError naming each flag and key; unknown keys get a "did you mean".
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from facts.errors import Problems
from trainer.config import trl
from trainer.config.flags import (
    EXTRA_ARGUMENTS,
    FLAGS,
    KINDS,
    ConfigError,
    TrainConfig,
    base_kind,
    flag,
    micro_batch_value,
    validate,
)


def close_names() -> set[str]:
    """Every name a YAML key may be near: ours, their aliases, and the TRL/transformers keys mapped."""
    return set(FLAGS) | trl.known_keys()


def did_you_mean(name: str) -> str:
    """The hint for an unknown key: an alias's flag, else the closest known name, else the known keys."""
    aliases = {alias: own for own, f in FLAGS.items() for alias in f.aliases}
    close = [aliases[name]] if name in aliases else difflib.get_close_matches(name, sorted(close_names()), n=1,
                                                                             cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(sorted(FLAGS))}"


def add_arguments(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None) -> None:
    """One flag per declaration; unset flags stay absent so YAML can fill them. `defaults`: shown in --help."""
    defaults = dict(defaults or {})
    for name, arg in EXTRA_ARGUMENTS.items():
        shown = f" (default: {defaults[name]})" if name in defaults else ""
        parser.add_argument(flag(name), metavar=arg.metavar, default=None if name == "config" else argparse.SUPPRESS,
                            help=arg.help + shown)
    for name, f in FLAGS.items():
        kind = base_kind(KINDS[name])
        default = defaults.get(name, dataclasses.MISSING)
        if default is dataclasses.MISSING:
            default = next(x.default for x in fields(TrainConfig) if x.name == name)
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": f"{f.help} (default: {default})"}
        if kind == "bool":
            parser.add_argument(flag(name), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        kwargs["type"] = {"int": int, "float": float, "int | str": micro_batch_value}.get(kind, str)
        if f.choices:
            kwargs["choices"] = f.choices
        parser.add_argument(flag(name), **kwargs)


def load_yaml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"--config {path}: file not found; pass the path of a YAML file with configuration keys"])
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError([f"--config {path}: not valid YAML ({e})"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"--config {path}: expected a mapping of configuration keys, got {type(data).__name__}"])
    return data


def yaml_keys(path: str | None) -> set[str]:
    """The settings a --config file names (its keys with dashes as underscores)."""
    return {str(k).replace("-", "_") for k in load_yaml(path)} if path else set()


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def coerce(name: str, value: Any, problems: Problems, source: str) -> Any:
    """A YAML value as the declared type; a problem naming the key when it is not one."""
    kind = KINDS[name]
    if value is None:
        if "None" not in kind:
            problems.append(f"{source} {name}: must not be empty")
        return None
    kind = base_kind(kind)
    if kind == "int | str":
        return micro_batch_value(value)
    text = str(value).lower()
    if kind == "bool" and (isinstance(value, bool) or text in _TRUE + _FALSE):
        return value if isinstance(value, bool) else text in _TRUE
    if kind == "int" and not isinstance(value, bool) and not (isinstance(value, float) and not value.is_integer()):
        try:
            return int(value)
        except (TypeError, ValueError):
            pass
    if kind == "float" and not isinstance(value, bool):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    if kind == "str":
        return str(value)
    problems.append(f"{source} {name}: {value!r} is not a valid {kind}")
    return None


def merge(yaml_values: Mapping[str, Any], flag_values: Mapping[str, Any],
          defaults: Mapping[str, Any] | None = None, yaml_source: str = "YAML") -> TrainConfig:
    """Defaults < YAML < flags, then validate. Raises ConfigError listing every problem.

    The YAML may use this trainer's keys or TRL SFTConfig / TrainingArguments keys (trainer.config.trl).
    """
    problems = Problems()
    values: dict[str, Any] = dict(defaults or {})
    given = {str(key).replace("-", "_"): value for key, value in yaml_values.items()}
    original = {str(key).replace("-", "_"): key for key in yaml_values}
    ours = set(FLAGS) | set(EXTRA_ARGUMENTS)
    own, mapped, hf = trl.translate(given, yaml_source, ours, problems)
    for name in given:
        if name not in ours and not trl.is_hf_key(name):
            problems.append(f"{yaml_source} key {original[name]!r}: unknown configuration key{did_you_mean(name)}")
    for name, value in {**mapped, **own}.items():
        if name == "out":
            values.update(split_out(str(value)))
        elif name != "config":
            values[name] = coerce(name, value, problems, f"{yaml_source} key")
    for name, value in flag_values.items():
        if name == "out":
            values.update(split_out(str(value)))
        elif name in FLAGS:
            values[name] = value
    if "global_batch_size" not in own and "global_batch_size" not in flag_values:
        hf_batch = trl.global_batch({**TrainConfig().to_dict(), **values}, hf)
        if hf_batch is not None:
            values["global_batch_size"] = hf_batch
    problems.raise_if_any(ConfigError)
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def split_out(out: str) -> dict[str, str]:
    """`--out DIR` means: storage path = DIR's parent, run name = DIR's name."""
    out = out.rstrip("/")
    if "://" in out:
        parent, _, name = out.rpartition("/")
    else:
        p = Path(out).expanduser().absolute()
        parent, name = str(p.parent), p.name
    return {"storage_path": parent, "run_name": name}


def from_args(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> TrainConfig:
    given = {k: v for k, v in vars(args).items() if k != "config"}
    config = getattr(args, "config", None)
    yaml_values = load_yaml(config) if config else {}
    return merge(yaml_values, given, defaults, yaml_source=f"--config {config or ''}".strip())


def parse(argv: Sequence[str], defaults: Mapping[str, Any] | None = None, prog: str = "trainer") -> TrainConfig:
    parser = argparse.ArgumentParser(prog=prog)
    add_arguments(parser, defaults)
    return from_args(parser.parse_args(list(argv)), defaults)


def absolute_storage(cfg: TrainConfig) -> TrainConfig:
    """A relative local --storage-path, made absolute here: Ray Train takes only absolute paths and URIs
    (a relative `runs` fails inside its controller with pyarrow's "URI has empty scheme")."""
    if "://" in cfg.storage_path:
        return cfg
    path = str(Path(cfg.storage_path).expanduser().absolute())
    return cfg if path == cfg.storage_path else dataclasses.replace(cfg, storage_path=path)
