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

from facts.errors import Problems, first_line
from facts.reading import BoundedYaml, InputLimit, clip, clip_text, decode_utf8, odd_characters
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
    hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(sorted(FLAGS))}"
    odd = odd_characters(name)
    return f"{hint}; {odd}" if odd else hint


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


class _Loader(BoundedYaml, yaml.SafeLoader):
    """SafeLoader bounded as facts.reading says, refusing a key given twice (the last one would win silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key not in seen:
                    seen[key] = line
                    continue
            except TypeError:  # an unhashable key: SafeLoader names it
                continue
            self.duplicates.append(f"line {line}: key {clip(key)} is given twice (also on line {seen[key]}); "
                                   f"the last one would silently win. Keep one")
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str) -> dict[str, Any]:
    """A --config file's mapping; ConfigError naming the file, the line and the fix for anything else."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError([f"--config {path}: is a folder; pass the path of a YAML file with configuration keys"])
    if not p.is_file():
        raise ConfigError([f"--config {path}: file not found; pass the path of a YAML file with configuration keys"])
    loader = None
    try:
        loader = _Loader(decode_utf8(p.read_bytes()))
        loader.duplicates = []
        data = loader.get_single_data() or {}
    except (OSError, InputLimit) as e:
        raise ConfigError([f"--config {path}: {e if isinstance(e, InputLimit) else first_line(e)}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = clip_text(getattr(e, "problem", None) or str(e), 200)
        raise ConfigError([f"--config {path}: not valid YAML{where} ({what})"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader.duplicates or getattr(loader, "yaml11", None):
        raise ConfigError([f"--config {path} {p}" for p in [*loader.duplicates, *getattr(loader, "yaml11", [])]])
    if not isinstance(data, dict):
        raise ConfigError([f"--config {path}: expected a mapping of configuration keys, got {type(data).__name__}"])
    return data


def yaml_style(path: str | None) -> str:
    """Whose defaults a --config file's omitted keys take: "trl" or "trainer" (trainer.config.trl.style)."""
    values = {str(k).replace("-", "_"): v for k, v in load_yaml(path).items()} if path else {}
    return trl.style(values, set(FLAGS) | set(EXTRA_ARGUMENTS))


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
    problems.append(f"{source} {name}: {clip(value)} is not a valid {kind}")
    return None


def merge(yaml_values: Mapping[str, Any], flag_values: Mapping[str, Any],
          defaults: Mapping[str, Any] | None = None, yaml_source: str = "YAML") -> TrainConfig:
    """Defaults < (a TRL YAML: TRL's defaults <) YAML < flags, then validate. Raises ConfigError listing every problem.

    The YAML may use this trainer's keys or TRL SFTConfig / TrainingArguments keys (trainer.config.trl);
    the TrainConfig's `sources` says where each setting came from.
    """
    problems = Problems()
    values: dict[str, Any] = dict(defaults or {})
    given = {str(key).replace("-", "_"): value for key, value in yaml_values.items()}
    original = {str(key).replace("-", "_"): key for key in yaml_values}
    carried = given.pop("sources", None)  # a resolved config written back as YAML (trainer submit's job file)
    ours = set(FLAGS) | set(EXTRA_ARGUMENTS)
    style = trl.style(given, ours)
    given.pop(trl.STYLE_KEY, None)
    trl_defaults, trl_origin = trl.sft_defaults() if style == "trl" else ({}, "")
    if style not in trl.STYLES:
        problems.append(f"{yaml_source} key {trl.STYLE_KEY!r} = {style!r}: must be one of {', '.join(trl.STYLES)} "
                        f"(whose defaults the keys the YAML omits take)")
    omitted = {k: v for k, v in trl_defaults.items() if k not in given}
    own, mapped, hf, accepted = trl.translate({**omitted, **given}, yaml_source, ours, problems)
    for name in given:
        if name not in ours and not trl.is_hf_key(name):
            problems.append(f"{yaml_source} key {clip(original[name])}: unknown configuration key{did_you_mean(name)}")
    for name, value in {**mapped, **own}.items():
        if name == "out":
            values.update(split_out(str(value)))
        elif name != "config":
            values[name] = coerce(name, value, problems, f"{yaml_source} key")
    _flags_over_yaml(values, flag_values)
    hf_batch = None
    if "global_batch_size" not in own and "global_batch_size" not in flag_values:
        hf_batch = trl.global_batch({**TrainConfig().to_dict(), **values}, hf)
        if hf_batch is not None:
            values["global_batch_size"] = hf_batch
    problems.raise_if_any(ConfigError)
    values["sources"] = carried if isinstance(carried, dict) and not given.keys() - ours else _sources(
        style, trl_origin, given, omitted, mapped, own, flag_values, accepted, yaml_source, hf_batch is not None)
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def _flags_over_yaml(values: dict[str, Any], flag_values: Mapping[str, Any]) -> None:
    """Flags win; a flag's --steps replaces the YAML's epochs and --epochs its steps (transformers: one of them)."""
    for one, other in (("steps", "epochs"), ("epochs", "steps")):
        if one in flag_values and other not in flag_values:
            values.pop(other, None)
    for name, value in flag_values.items():
        if name == "out":
            values.update(split_out(str(value)))
        elif name in FLAGS:
            values[name] = value


def _sources(style: str, trl_origin: str, given: Mapping[str, Any], omitted: Mapping[str, Any],
             mapped: Mapping[str, Any], own: Mapping[str, Any], flag_values: Mapping[str, Any],
             accepted: Mapping[str, str], yaml_source: str, hf_batch: bool) -> dict[str, Any]:
    """Where each setting came from, for run.json: a flag, a YAML key, TRL's default of a key, or the default."""
    where: dict[str, str] = {}
    for name in FLAGS:
        keys = [*FLAGS[name].trl, *(["output_dir"] if name in ("storage_path", "run_name") else [])]
        if name in flag_values or (name in ("storage_path", "run_name") and "out" in flag_values):
            where[name] = "flag"
        elif name in own and name not in given:  # a TRL key of the same name, omitted: TRL's default
            where[name] = f"{trl_origin} default: {name}"
        elif name in own or (name in ("storage_path", "run_name") and "out" in own):
            where[name] = f"{yaml_source}: {name if name in own else 'out'}"
        elif name in mapped or (name in ("storage_path", "run_name") and "out" in mapped):
            named = [k for k in keys if k in given]
            where[name] = (f"{yaml_source}: {', '.join(named)}" if named else
                           f"{trl_origin} default: {', '.join(k for k in keys if k in omitted)}")
    if hf_batch:
        where["global_batch_size"] = ("per_device_train_batch_size x gradient_accumulation_steps x num_workers "
                                      "(transformers' arithmetic)")
    return {"defaults": style if style == "trainer" else f"{style} ({trl_origin})", "settings": where,
            "accepted": {k: why for k, why in accepted.items() if k in given}}


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
