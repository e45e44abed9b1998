"""Checkpoint loading into an FSDP2-sharded model, with transformers' own key conversion.

transformers 5 renames and fuses checkpoint keys on load (Mixtral's
`block_sparse_moe.experts.N.w1` becomes one fused `mlp.experts.gate_up_proj`, legacy
`LayerNorm.gamma` becomes `weight`, ...). The checkpoint keys are mapped here with the
model's own conversion list (`get_model_conversion_mapping`) and `rename_source_key`,
and fused tensors are built by the converters' own `convert`, as `from_pretrained`
does; only the reading differs: every rank reads just the rows of its shard.

- Renamed-only tensors: a lazy slice of this rank's rows (safetensors `get_slice`, or
  a memory-mapped `.bin`), so nothing else is read.
- Stacked experts (`MergeModulelist(dim=0)` then concatenations on other dims): dim 0
  is the expert index, so only this rank's experts are read and converted.
- Any other conversion (a fused QKV split, a transpose) materialises that one tensor,
  then keeps this rank's rows: one tensor at a time, never the whole model.

A model tensor the checkpoint does not hold is an error (from_pretrained would initialise it
randomly and warn once): the run would train from partly random weights. Non-persistent buffers,
which no checkpoint holds, get the model's own initialisation (trainer.model.build). Imports torch,
safetensors and transformers only.
"""

from __future__ import annotations

import copy
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from facts.errors import first_line
from trainer.model import quantize
from trainer.model.errors import ModelSourceError
from trainer.model.parts import model_name

log = logging.getLogger("trainer")


class Checkpoint:
    """The tensors of a folder's weight files, read lazily (safetensors, or .bin memory-mapped)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._handles: dict[str, object] = {}
        self.file_of: dict[str, str] = {}
        files = self._files()
        if not files:
            raise ModelSourceError(f"model weights in {folder}: no *.safetensors or pytorch_model*.bin files")
        for name in files:
            for key in self._open(name).keys():
                self.file_of[key] = name

    def _files(self) -> list[str]:
        return self.files_in(self.folder)

    @staticmethod
    def files_in(folder: Path) -> list[str]:
        """The weight files of a folder: those its index names, else the safetensors, else pytorch_model*.bin."""
        for index, pattern in (("model.safetensors.index.json", "*.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model*.bin")):
            if (folder / index).is_file():
                try:
                    weight_map = json.loads((folder / index).read_text())["weight_map"]
                    return sorted(set(weight_map.values()))
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                    raise ModelSourceError(f"model weights in {folder}: {index} cannot be read ({first_line(e)}); "
                                           f"download or save the folder again") from None
            found = sorted(p.name for p in folder.glob(pattern))
            if found:
                return found
        return []

    def _open(self, name: str):
        if name not in self._handles:
            path = self.folder / name
            if not path.is_file():
                raise ModelSourceError(f"model weights in {self.folder}: {name} is named by the index but missing")
            try:
                if name.endswith(".safetensors"):
                    from safetensors import safe_open

                    self._handles[name] = safe_open(str(path), framework="pt", device="cpu")
                else:
                    self._handles[name] = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
            except BaseException as e:
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                raise ModelSourceError(f"model weights in {self.folder}: {name} cannot be read ({first_line(e)}); "
                             f"download or save the folder again") from e
        return self._handles[name]

    def keys(self) -> list[str]:
        return list(self.file_of)

    def shape(self, key: str) -> tuple[int, ...]:
        handle = self._open(self.file_of[key])
        return tuple(handle.get_slice(key).get_shape()) if hasattr(handle, "get_slice") else tuple(handle[key].shape)

    def read(self, key: str, rows: slice | None = None) -> torch.Tensor:
        handle = self._open(self.file_of[key])
        if hasattr(handle, "get_slice"):
            sliced = handle.get_slice(key)
            return sliced[rows] if rows is not None and len(sliced.get_shape()) else handle.get_tensor(key)
        tensor = handle[key]
        return tensor[rows] if rows is not None and tensor.ndim else tensor

    def close(self) -> None:
        for handle in self._handles.values():
            if hasattr(handle, "__exit__"):
                handle.__exit__(None, None, None)
        self._handles.clear()


@dataclass
class _Target:
    """One model tensor and where it comes from: checkpoint keys per source pattern of its converter."""

    converter: object | None
    sources: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


CONVERSIONS = "_trainer_conversions"  # the model's __dict__ key of the conversions its unsharded class gives


def remember_conversions(model: nn.Module) -> None:
    """transformers' key conversions for the model's own classes, taken before fully_shard renames them.

    Its mapping is looked up by class name (Qwen3.5's `model.language_model.*` layout, NemotronH's
    `backbone.*`), which FSDP<Name> would miss."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    model.__dict__[CONVERSIONS] = get_model_conversion_mapping(model)


def conversions(model: nn.Module) -> list:
    if CONVERSIONS in model.__dict__:
        return copy.deepcopy(model.__dict__[CONVERSIONS])
    from transformers.conversion_mapping import get_model_conversion_mapping

    return get_model_conversion_mapping(model)


def plan_keys(model: nn.Module, keys: list[str], targets: dict[str, torch.Tensor]) -> tuple[dict[str, _Target], list[str]]:
    """Model tensor name -> its checkpoint keys, renamed exactly as from_pretrained renames them."""
    from transformers.core_model_loading import WeightConverter, dot_natural_key, rename_source_key

    mapping = conversions(model)
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    renamings = [m for m in mapping if not isinstance(m, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    prefix = getattr(model, "base_model_prefix", None)
    plan: dict[str, _Target] = {}
    unexpected: list[str] = []
    for key in sorted(keys, key=dot_natural_key):  # natural order: expert 10 after expert 9, as transformers stacks
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, targets)
        if renamed not in targets and key in targets:
            renamed, pattern = key, None
        if renamed not in targets:
            unexpected.append(key)
        elif pattern is None:
            plan[renamed] = _Target(None, {key: [key]})
        else:
            entry = plan.setdefault(renamed, _Target(copy.deepcopy(by_pattern[pattern])))
            entry.sources[pattern].append(key)
    return plan, unexpected


def _rows(tensor: torch.Tensor) -> tuple[slice | None, tuple[int, ...]]:
    """This rank's rows (dim 0) of a sharded parameter, and its local shape; None for a whole tensor."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return None, tuple(tensor.shape)
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(isinstance(p, Shard) and p.dim != 0 for p in placements):
        raise ModelSourceError(f"a parameter sharded on dim {[p.dim for p in placements if isinstance(p, Shard)]}: "
                     f"the loader reads dim-0 shards (FSDP2's default) only")
    local, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, placements)
    if not local:
        return None, ()
    return slice(offset[0], offset[0] + local[0]), tuple(local)


shard_rows = _rows  # for the initialisation of sharded parameters (trainer.model.build)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _read_rows(tensor: torch.Tensor) -> slice | None:
    """The rows this rank reads: an NF4 weight (QLoRA) is read whole, quantized as one (trainer.model.quantize)."""
    return None if quantize.is_nf4(tensor) else _rows(tensor)[0]


def _copy(name: str, target: torch.Tensor, value: torch.Tensor, what: str) -> None:
    if quantize.is_nf4(target):
        if tuple(value.shape) != tuple(target.shape):
            raise ModelSourceError(f"{what}: shape {tuple(value.shape)} does not fit {name} of shape "
                                   f"{tuple(target.shape)}; the checkpoint is not of this config")
        quantize.load_full(target, value)
        return
    dest = _local(target)
    if tuple(value.shape) != tuple(dest.shape):
        raise ModelSourceError(f"{what}: shape {tuple(value.shape)} does not fit {name} (this rank's shard "
                     f"{tuple(dest.shape)} of {tuple(target.shape)}); the checkpoint is not of this config")
    dest.copy_(value)


def _experts_only(converter) -> bool:
    """Stacked experts: the target's dim 0 is the index of the source tensors, in order."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = getattr(converter, "operations", [])
    return (len(converter.target_patterns) == 1 and len(ops) > 0 and isinstance(ops[0], MergeModulelist)
            and ops[0].dim == 0 and all(isinstance(op, Concatenate) and op.dim != 0 for op in ops[1:]))


def _load_converted(model, name: str, entry: _Target, ckpt: Checkpoint, targets: dict[str, torch.Tensor]) -> list[str]:
    converter = entry.converter
    rows, _ = _rows(targets[name])
    count = {len(keys) for keys in entry.sources.values()}
    subset = (_experts_only(converter) and rows is not None and count == {targets[name].shape[0]})
    for pattern, keys in entry.sources.items():
        chosen = keys[rows] if subset else keys
        for key in chosen:
            converter.add_tensor(name, key, pattern, _reader(ckpt, key))
    if subset and rows.stop <= rows.start:
        return [name]  # this rank holds no expert of this tensor
    realized = converter.convert(name, model=model, config=model.config)
    done = []
    for target_name, value in realized.items():
        value = value[0] if isinstance(value, list) else value
        if target_name not in targets:
            raise ModelSourceError(f"transformers' conversion of {sorted(entry.sources)} gave {target_name}, "
                         f"which {model_name(model)} does not have")
        target_rows = _read_rows(targets[target_name])
        if not subset and target_rows is not None:
            value = value[target_rows]
        sources = sum(len(keys) for keys in entry.sources.values())
        _copy(target_name, targets[target_name], value, f"{sources} checkpoint tensor(s) converted by transformers")
        done.append(target_name)
    return done


def _reader(ckpt: Checkpoint, key: str) -> Callable[[], torch.Tensor]:
    return lambda: ckpt.read(key)


def unloaded_error(model: nn.Module, folder: Path, missing: list[str], total: int) -> ModelSourceError:
    return ModelSourceError(
        f"model weights in {folder}: {len(missing)} of the {total} tensors of {model_name(model)} are not in the "
        f"checkpoint, even with transformers' key conversion ({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}"
        f"); training would start them from random values. Point --model at the folder saved with this config.json, "
        f"or pass --random-init to train the whole model from its random initialisation")


def unloaded(model: nn.Module, folder: Path) -> tuple[list[str], int]:
    """The model's tensors (parameters and persistent buffers) no checkpoint key maps to, and how many it has.

    Reads only the files' headers: the pre-flight's check of what load_sharded would refuse."""
    targets = dict(model.state_dict(keep_vars=True))
    ckpt = Checkpoint(folder)
    try:
        plan, _ = plan_keys(model, ckpt.keys(), targets)
    finally:
        ckpt.close()
    covered = set(plan)
    for name, entry in plan.items():  # a converter may fill more targets than the one it is planned under
        covered.update(t for t in targets if entry.converter is not None and t in _targets_of(entry.converter, name))
    return sorted(set(targets) - covered - _tied_to(model, targets, covered)), len(targets)


def _targets_of(converter, name: str) -> set[str]:
    """The tensors a one-to-many converter fills besides `name` (its first target): a fused QKV split."""
    patterns = [p.replace("\\", "").strip("^$") for p in getattr(converter, "target_patterns", [])]
    first = patterns[0] if patterns else None
    return {name.replace(first, p) for p in patterns} if first and first in name else {name}


def _tied_to(model: nn.Module, targets: dict[str, torch.Tensor], covered: set[str]) -> set[str]:
    """State-dict names that share their tensor with a covered one (a tied lm_head)."""
    ids = {id(targets[n]) for n in covered}
    return {n for n, t in targets.items() if id(t) in ids}


def load_sharded(model: nn.Module, folder: Path) -> dict:
    """Fill every parameter and persistent buffer the checkpoint holds; returns what was loaded and skipped.

    Collective-free: each rank reads its own rows. Tensors it filled are flagged with
    transformers' `_is_hf_initialized`, so the model's own initialisation then skips them.
    """
    targets = dict(model.state_dict(keep_vars=True))
    ckpt = Checkpoint(folder)
    loaded: set[str] = set()
    try:
        plan, unexpected = plan_keys(model, ckpt.keys(), targets)
        if not plan:
            sample = ", ".join(sorted(ckpt.keys())[:3])
            raise ModelSourceError(f"model weights in {folder}: none of its {len(ckpt.file_of)} tensors ({sample}, ...) is a "
                         f"weight of {model_name(model)} ({', '.join(list(targets)[:3])}, ...), even with "
                         f"transformers' key conversion; is config.json the one saved with these weights?")
        with torch.no_grad():
            for name, entry in plan.items():
                first = next(iter(entry.sources.values()))[0]
                what = f"{first} in {ckpt.file_of[first]}"
                try:
                    if entry.converter is None:
                        (key,) = next(iter(entry.sources.values()))
                        _copy(name, targets[name], ckpt.read(key, _read_rows(targets[name])),
                              f"{key} of shape {ckpt.shape(key)}")
                        loaded.add(name)
                    else:
                        loaded.update(_load_converted(model, name, entry, ckpt, targets))
                except Exception as e:
                    if isinstance(e, ModelSourceError):
                        raise ModelSourceError(f"model weights in {folder}: {what}: {e}") from e
                    raise ModelSourceError(f"model weights in {folder}: {what} cannot be loaded into {name} "
                                 f"({first_line(e)})") from e
    finally:
        ckpt.close()
    for name in loaded:
        targets[name]._is_hf_initialized = True
    missing = sorted(n for n, t in targets.items() if not getattr(t, "_is_hf_initialized", False))
    if missing:
        raise unloaded_error(model, folder, missing, len(targets))
    first_rank = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if first_rank and unexpected:
        log.info("%d checkpoint tensor(s) of %s are not used by %s: %s", len(unexpected), folder,
                 model_name(model), ", ".join(unexpected[:8]))
    return {"loaded": sorted(loaded), "missing": missing, "unexpected": unexpected,
            "converted": sorted(n for n, e in plan.items() if e.converter is not None)}
