"""Sharded checkpoints in run storage, resumption, and the final Hugging Face export.

Layout of one checkpoint, `<run>/checkpoint_<step>/`:
  *.distcp, .metadata   torch.distributed.checkpoint shards of model and optimizer
  rng/rank_<r>.pt       each rank's Python/NumPy/torch RNG state
  train_state.json      step, data position, scheduler state, world size
  COMPLETE.json         written last, after every rank's files are in storage

A checkpoint folder without COMPLETE.json (a crash mid-upload, ray issue 41700) is never
resumed from. The sequence per save is: every rank writes its shard and uploads it; the
ranks exchange their outcome; rank 0 lists the folder in storage and checks that every
file the DCP metadata refers to is there at full length, plus every rank's RNG state;
only then does it write the marker, which records each file's size; then the checkpoint
is reported to Ray, so Ray's "latest checkpoint" is always a complete one. A failure on
any rank fails the save on every rank with one CheckpointError (no rank hangs in a
collective waiting for another), and no marker is written.

A marker is trusted only while the files it lists are still there at their recorded
sizes, so a folder that lost files afterwards (a deletion cut short) is skipped too.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from trainer.storage import Storage

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
TRAIN_STATE = "train_state.json"
PREFIX = "checkpoint_"
EXPORT_DIR = "model"


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def step_of(name: str) -> int | None:
    tail = name.rsplit("/", 1)[-1]
    if not tail.startswith(PREFIX):
        return None
    try:
        return int(tail[len(PREFIX):])
    except ValueError:
        return None


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _sharded_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}


@contextmanager
def _staging(storage: Storage, name: str) -> Iterator[Path]:
    """Write straight into local storage; stage in a temp folder for remote storage."""
    if storage.is_local:
        path = Path(storage.path(name))
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-rank{_rank()}-"))
    try:
        yield tmp
        storage.upload_dir(tmp, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written completely: it has no marker and is never resumed from."""


def _gather(value):
    """Every rank's value, in rank order (a collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _from_rank0(value):
    """Rank 0's value on every rank (a collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _required_files(folder: Path, world: int) -> dict[str, int]:
    """Minimum size of every file a load reads: DCP's own index of the shards, the RNG and train state."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    required: dict[str, int] = {".metadata": 1, TRAIN_STATE: 1}
    for info in (metadata.storage_data or {}).values():
        required[info.relative_path] = max(required.get(info.relative_path, 0), info.offset + info.length)
    for r in range(world):
        required[f"rng/rank_{r}.pt"] = 1
    return required


def _missing(present: dict[str, int], required: dict[str, int]) -> list[str]:
    return sorted(f"{path} ({'absent' if path not in present else f'{present[path]} of {size} bytes'})"
                  for path, size in required.items() if present.get(path, -1) < size)


def save(storage: Storage, step: int, model, optimizer, scheduler, data_position: dict,
         extra: dict | None = None) -> str:
    """Collective: every rank writes its shard; returns the checkpoint's path in storage.

    Raises CheckpointError on every rank when any rank failed to write or the files are not
    all in storage; the folder then has no marker and the previous checkpoint stays the latest.
    """
    import torch.distributed.checkpoint as dcp

    name = dir_name(step)
    rank, world = _rank(), _world()
    if rank == 0 and storage.exists(name):
        storage.delete_dir(name)  # a leftover of a crashed attempt at this same step
    _barrier()
    t0 = time.perf_counter()
    required: dict[str, int] = {}
    error = None
    try:
        with _staging(storage, name) as folder:
            dcp.save(_sharded_state(model, optimizer), checkpoint_id=str(folder))
            (folder / "rng").mkdir(exist_ok=True)
            torch.save(rng_state(), folder / "rng" / f"rank_{rank}.pt")
            if rank == 0:
                state = {"step": step, "data_position": data_position, "world_size": world,
                         "scheduler": scheduler.state_dict() if scheduler is not None else None, **(extra or {})}
                (folder / TRAIN_STATE).write_text(json.dumps(state, indent=1))
                required = _required_files(folder, world)
    except Exception as e:  # noqa: BLE001 - reported to every rank below, then raised
        error = f"{type(e).__name__}: {e}"
    failures = [(r, err) for r, err in enumerate(_gather(error)) if err]
    verdict = "; ".join(f"rank {r}: {err}" for r, err in failures) or None
    if verdict is None and rank == 0:
        try:
            present = storage.file_sizes(name)
            missing = _missing(present, required)
            if missing:
                verdict = f"not in storage after the upload: {', '.join(missing)}"
            else:
                storage.write_text(json.dumps({"step": step, "world_size": world, "time": time.time(),
                                               "save_s": round(time.perf_counter() - t0, 3),
                                               "files": present}), name, MARKER)
        except Exception as e:  # noqa: BLE001 - reported to every rank below, then raised
            verdict = f"rank 0 writing {MARKER}: {type(e).__name__}: {e}"
    verdict = _from_rank0(verdict)
    if verdict:
        raise CheckpointError(f"checkpoint {storage.path(name)} was not saved (no {MARKER}; the previous "
                              f"complete checkpoint stays the latest): {verdict}")
    return storage.path(name)


def is_complete(storage: Storage, name: str) -> bool:
    """Marker present and readable, and every file it lists still there at its recorded size."""
    if not storage.exists(name, MARKER):
        return False
    try:
        marker = json.loads(storage.read_text(name, MARKER))
    except (OSError, ValueError) as e:
        log.warning("checkpoint %s: unreadable %s (%s)", storage.path(name), MARKER, e)
        return False
    if not isinstance(marker, dict):
        return False
    listed = marker.get("files")
    if listed:
        missing = _missing(storage.file_sizes(name), listed)
        if missing:
            log.warning("checkpoint %s: files listed in %s are gone or shorter: %s",
                        storage.path(name), MARKER, ", ".join(missing))
            return False
    return True


def latest_complete(storage: Storage, preferred: str | None = None) -> str | None:
    """The newest complete checkpoint in the run folder.

    `preferred` (Ray's latest reported checkpoint) is only a hint: a run stopped between
    writing a marker and reporting to Ray has a newer complete one, and an incomplete one
    is never returned.
    """
    candidates = sorted((step_of(n), n) for n in storage.list_dirs() if step_of(n) is not None)
    for _, name in reversed(candidates):
        if is_complete(storage, name):
            if preferred and preferred.rstrip("/").rsplit("/", 1)[-1] != name:
                log.info("resuming from %s rather than Ray's latest reported checkpoint %s", name, preferred)
            return name
        log.warning("skipping incomplete checkpoint %s (no valid %s)", storage.path(name), MARKER)
    return None


@contextmanager
def _local_copy(storage: Storage, name: str) -> Iterator[Path]:
    if storage.is_local:
        yield Path(storage.path(name))
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-load-"))
    try:
        storage.download_dir(tmp, name)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(storage: Storage, name: str, model, optimizer, scheduler) -> dict:
    """Collective: restore model/optimizer shards (resharding if the world size changed), scheduler, RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    with _local_copy(storage, name) as folder:
        state = _sharded_state(model, optimizer)
        dcp.load(state, checkpoint_id=str(folder))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
        train_state = json.loads((folder / TRAIN_STATE).read_text())
        if scheduler is not None and train_state.get("scheduler"):
            scheduler.load_state_dict(train_state["scheduler"])
        rng_file = folder / "rng" / f"rank_{_rank()}.pt"
        if rng_file.is_file() and train_state.get("world_size") == _world():
            set_rng_state(torch.load(rng_file, weights_only=False))
    return train_state


def report_to_ray(metrics: dict, checkpoint_path: str | None, storage: Storage) -> None:
    """ray.train.report (a barrier); rank 0 attaches the already-complete checkpoint in storage."""
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode

    ckpt = Checkpoint(path=checkpoint_path, filesystem=storage.fs) if checkpoint_path and _rank() == 0 else None
    ray.train.report(metrics, checkpoint=ckpt, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def export_hf(storage: Storage, model, tokenizer, source: str | Path | None = None, name: str = EXPORT_DIR,
              card: str | None = None) -> str:
    """Collective: gather full weights to rank 0 and write a Hugging Face folder (bf16 safetensors),
    with `card` (rank 0's model card text) as its README.md."""
    from transformers import GenerationConfig

    from transformers.core_model_loading import revert_weight_conversion

    rank = _rank()
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    tied_keys = set(getattr(model, "all_tied_weights_keys", None) or {"lm_head.weight"}) if tied else set()
    full: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        if rank == 0 and key not in tied_keys:
            full[key] = tensor.detach().to("cpu", torch.bfloat16).contiguous()
        del tensor
    if rank == 0:
        tmp = Path(tempfile.mkdtemp(prefix="export-"))
        try:
            # the checkpoint's own key layout, as save_pretrained writes it (per-expert MoE keys, not the fused ones)
            full = {k: v.contiguous() for k, v in revert_weight_conversion(model, full).items()}
            _save_safetensors(full, tmp)
            config = model.config
            config.use_cache = True
            config.dtype = torch.bfloat16
            config.save_pretrained(tmp)
            try:
                gen = GenerationConfig.from_pretrained(str(source))
            except Exception:  # noqa: BLE001 - the source model has no generation config
                gen = GenerationConfig.from_model_config(config)
            if tokenizer.eos_token_id is not None and gen.eos_token_id is None:
                gen.eos_token_id = tokenizer.eos_token_id
            if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
                gen.pad_token_id = tokenizer.pad_token_id
            gen.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if card:
                (tmp / "README.md").write_text(card)
            if storage.exists(name):
                storage.delete_dir(name)
            storage.upload_dir(tmp, name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    return storage.path(name)


def _save_safetensors(state: dict[str, torch.Tensor], folder: Path, max_shard_size: str = "5GB") -> None:
    """model.safetensors, or shards plus model.safetensors.index.json, as save_pretrained writes them."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(state, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, str(folder / filename), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
