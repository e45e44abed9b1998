"""A run folder resumes only with what its run was started with.

Resuming continues the checkpoints of the run in the folder: with another learning rate,
batch, schedule length, dataset or model, the result is neither the old run nor the new
one, and nothing says so (a finished run pointed at new data trains 0 steps and exports
the old model again). So what a run was started with, its inputs (the settings that change
the result, the data's content, the tokenizer and chat template, the model), is kept in
run.json; before Ray starts, the inputs asked for now are compared with those, and any
difference is refused, listing each, with the two ways out: another run name or folder,
or --resume-anyway. Settings that only change how a run is executed or watched
(flags declared with `result=False`, trainer.config.flags) never block a resume.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from trainer.config.flags import ConfigError, TrainConfig, flag
from trainer.model.sources import BIN_WEIGHTS, describe_source, local_model_dir
from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder.export import EXPORT_DIR
from trainer.run_folder.record import RUN_RECORD
from trainer.storage import Storage

INPUTS_KEY = "run_inputs"  # train_loop_config key: the driver's inputs, written into run.json by rank 0
_SAMPLE = 1 << 20


def model_identity(spec: str, *, storage_fs: Any = None) -> dict:
    """The model's config and weight files: names, sizes and a hash of their header and three 1 MiB samples.

    Sampled, not whole-file, hashes: two checkpoints of one architecture have identical
    headers and sizes, but no two trainings agree on a single MiB of weights.
    """

    kind = describe_source(spec)
    if kind == "local":
        folder = local_model_dir(spec)
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and (p.suffix == ".safetensors"
                                                                          or BIN_WEIGHTS.match(p.name)))
        return {"config": _sha(folder.joinpath("config.json").read_bytes()),
                "weights": [[n, (folder / n).stat().st_size, _sampled_hash(folder / n)] for n in names]}
    if kind == "s3":
        store = Storage.from_uri(spec, fs=storage_fs)
        sizes = store.file_sizes()
        return {"config": _sha(store.read_bytes("config.json")),
                "weights": sorted([n, size] for n, size in sizes.items() if "/" not in n
                                  and (n.endswith(".safetensors") or BIN_WEIGHTS.match(n)))}
    return {"hub": spec}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _sampled_hash(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        for at in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            f.seek(at)
            h.update(f.read(_SAMPLE))
    return h.hexdigest()[:16]


def inputs(cfg: TrainConfig, *, data: dict | None, tokenizer: str | None, model: dict | None,
           chat_template: str | None = None) -> dict:
    """What a run is started with; `data` is the source fingerprint (trainer.model.sources), `tokenizer` its digest."""
    settings = cfg.result_settings
    if chat_template is not None:  # its text, not its path (a submitted job gets a copy under another name)
        settings["chat_template"] = _sha(chat_template.encode())
    return {"settings": settings, "data": data, "tokenizer": tokenizer, "model": model}


def differences(then: dict, now: dict, defaults: Mapping[str, Any]) -> list[str]:
    """Each input that differs, as `what: then ..., now ...`; parts missing on either side are not compared.

    A setting the record lacks (a flag newer than the run) was its default then (`defaults`:
    TrainConfig.result_defaults), so an old run folder resumes unless the new flag is changed.
    """
    out = []
    old, new = then.get("settings") or {}, now.get("settings") or {}
    for key in sorted(set(old) & set(new)):
        if old[key] != new[key]:
            out.append(f"{flag(key)}: {old[key]!r} then, {new[key]!r} now")
    for key in sorted(set(new) - set(old)):
        if new[key] != defaults.get(key):
            out.append(f"{flag(key)}: not set then, {new[key]!r} now")
    for part, what in (("data", "the dataset's content"), ("tokenizer", "the tokenizer or chat template"),
                       ("model", "the model's config or weights")):
        a, b = then.get(part), now.get(part)
        if a is not None and b is not None and _comparable(a) != _comparable(b):
            out.append(f"{what} changed{_which_files(a, b) if part == 'data' else ''}")
    return out


def _comparable(value: Any) -> Any:
    """A data fingerprint without its location (the same content elsewhere is the same data)."""
    if isinstance(value, dict) and "files" in value:
        return {k: v for k, v in value.items() if k != "spec"}
    return value


def _which_files(a: dict, b: dict) -> str:
    if not (isinstance(a, dict) and isinstance(b, dict) and "files" in a and "files" in b):
        return ""
    then, now = {f[0]: f for f in a["files"]}, {f[0]: f for f in b["files"]}
    changed = sorted(n for n in set(then) | set(now) if then.get(n) != now.get(n))
    return f" ({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''})" if changed else ""


class TornRecord(ValueError):
    """run.json is there but cannot be read: what the run was started with is unknown."""


def recorded(run_storage) -> dict | None:
    """The run.json of a run folder that has something to resume from (a checkpoint or an export).

    TornRecord when it is there but is not a JSON object (a write cut short): a resume could not be checked.
    """
    if not run_storage.exists(RUN_RECORD):
        return None
    if not (ckpt.names(run_storage) or run_storage.is_dir(EXPORT_DIR)):
        return None
    try:
        raw = run_storage.read_bytes(RUN_RECORD)
    except OSError as e:
        raise TornRecord(f"{run_storage.path(RUN_RECORD)} cannot be read ({type(e).__name__}: {e})") from None
    try:
        record = json.loads(raw)
    except ValueError:
        raise TornRecord(f"{run_storage.path(RUN_RECORD)} is not JSON ({len(raw)} bytes, as a write cut short "
                         f"leaves it)") from None
    if not isinstance(record, dict):
        raise TornRecord(f"{run_storage.path(RUN_RECORD)} holds a {type(record).__name__}, not a run record")
    return record


def check(cfg: TrainConfig, now: dict, run_storage) -> list[str]:
    """Refuse (ConfigError) to resume a run started with other inputs, unless --resume-anyway.

    A run.json that cannot be read is refused too (what the run was started with is unknown), unless
    --resume-anyway. Returns the differences it let through (to log), else [].
    """
    try:
        record = recorded(run_storage)
    except TornRecord as e:
        if cfg.resume_anyway:
            return [f"{e}, so the inputs were not compared"]
        raise ConfigError([
            f"{cfg.run_uri}: this run folder holds checkpoints, but {e}, so whether this resume continues it with the "
            f"inputs it was started with cannot be checked. Start a new run instead: another {flag('run_name')} (or "
            f"{flag('out')} FOLDER); or pass {flag('resume_anyway')} to continue this one unchecked (run.json is "
            f"then written again)"]) from None
    if record is None:
        return []
    then = record.get("inputs") or {"settings": {k: v for k, v in (record.get("config") or {}).items()
                                                 if k in cfg.result_settings}}
    found = differences(then, now, cfg.result_defaults())
    if not found or cfg.resume_anyway:
        return found
    listed = "".join(f"\n      {d}" for d in found)
    raise ConfigError([
        f"{cfg.run_uri}: this run folder holds run {record.get('run_name', cfg.resolved_run_name)!r}, started "
        f"with other inputs; resuming it would continue its checkpoints with these:{listed}\n    "
        f"Start a new run instead: another {flag('run_name')} (or {flag('out')} FOLDER); or pass "
        f"{flag('resume_anyway')} to continue this one with the new inputs"])
