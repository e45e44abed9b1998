"""Sharded checkpoints in run storage, resumption, and the final Hugging Face export.

Layout of one checkpoint, `<run>/checkpoint_<step>/`:
  *.distcp, .metadata   torch.distributed.checkpoint shards of model and optimizer
  rng/rank_<r>.pt       each rank's Python/NumPy/torch RNG state
  train_state.json      step, data position, scheduler state, world size
  COMPLETE.json         written last, after every rank's files are in storage

A checkpoint folder without COMPLETE.json (a crash mid-upload, ray issue 41700) is never
resumed from. The sequence per save is: every rank writes its shard and uploads it;
barrier; rank 0 writes the marker; then the checkpoint is reported to Ray, so Ray's
"latest checkpoint" is always a complete one.
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


def save(storage: Storage, step: int, model, optimizer, scheduler, data_position: dict,
         extra: dict | None = None) -> str:
    """Collective: every rank writes its shard; returns the checkpoint's path in storage."""
    import torch.distributed.checkpoint as dcp

    name = dir_name(step)
    rank, world = _rank(), _world()
    if rank == 0 and storage.exists(name):
        storage.delete_dir(name)  # a leftover of a crashed attempt at this same step
    _barrier()
    t0 = time.perf_counter()
    with _staging(storage, name) as folder:
        dcp.save(_sharded_state(model, optimizer), checkpoint_id=str(folder))
        (folder / "rng").mkdir(exist_ok=True)
        torch.save(rng_state(), folder / "rng" / f"rank_{rank}.pt")
        if rank == 0:
            state = {"step": step, "data_position": data_position, "world_size": world,
                     "scheduler": scheduler.state_dict() if scheduler is not None else None, **(extra or {})}
            (folder / TRAIN_STATE).write_text(json.dumps(state, indent=1))
    _barrier()
    if rank == 0:
        storage.write_text(json.dumps({"step": step, "world_size": world, "time": time.time(),
                                       "save_s": round(time.perf_counter() - t0, 3)}), name, MARKER)
    _barrier()
    return storage.path(name)


def is_complete(storage: Storage, name: str) -> bool:
    return storage.exists(name, MARKER)


def latest_complete(storage: Storage, preferred: str | None = None) -> str | None:
    """The newest complete checkpoint: Ray's reported one if complete, else a scan of the run folder."""
    if preferred:
        name = preferred.rstrip("/").rsplit("/", 1)[-1]
        if is_complete(storage, name):
            return name
        log.warning("checkpoint %s has no %s (incomplete upload); looking for an older one", preferred, MARKER)
    candidates = sorted((step_of(n), n) for n in storage.list_dirs() if step_of(n) is not None)
    for _, name in reversed(candidates):
        if is_complete(storage, name):
            return name
        log.warning("skipping incomplete checkpoint %s (no %s)", storage.path(name), MARKER)
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


def export_hf(storage: Storage, model, tokenizer, source: str | Path | None = None, name: str = EXPORT_DIR) -> str:
    """Collective: gather full weights to rank 0 and write a Hugging Face folder (bf16 safetensors)."""
    from transformers import GenerationConfig

    rank = _rank()
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    full: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        if rank == 0 and not (tied and key == "lm_head.weight"):
            full[key] = tensor.detach().to("cpu", torch.bfloat16).contiguous()
        del tensor
    if rank == 0:
        tmp = Path(tempfile.mkdtemp(prefix="export-"))
        try:
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
