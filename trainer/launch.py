"""Pre-flight checks and the Ray Train TorchTrainer for a configuration.

`preflight` reads the model config and the dataset before anything is started or
written, so bad inputs fail in seconds with every problem listed, and the run folder
is never created for a job that cannot train.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from trainer.config import ConfigError, TrainConfig, add_arguments, flag, from_args, is_remote
from trainer.data import DataError, check_records, load_records, source_kind
from trainer.model import ModelSourceError, check_architecture, read_model_config


def preflight(cfg: TrainConfig, storage_filesystem: Any = None) -> dict:
    """I/O checks of model, tokenizer and data; raises ConfigError listing every problem."""
    problems: list[str] = []
    info: dict = {}
    fs_for = lambda uri: storage_filesystem if uri.startswith("s3://") else None  # noqa: E731
    try:
        mcfg = read_model_config(cfg.model, storage_fs=fs_for(cfg.model))
        info["model_type"] = getattr(mcfg, "model_type", "?")
        limit = getattr(mcfg, "max_position_embeddings", None)
        if limit and cfg.seq_len > limit:
            problems.append(f"{flag('seq_len')} = {cfg.seq_len} exceeds the model's maximum sequence length "
                            f"(max_position_embeddings = {limit}); use --seq-len {limit} or less")
        info["decoder_layers"] = len(check_architecture(mcfg).layers)  # on the meta device: shardable?
    except ModelSourceError as e:
        problems.append(f"{flag('model')}: {e}")
    if cfg.tokenizer:
        try:
            read_model_config(cfg.tokenizer, storage_fs=fs_for(cfg.tokenizer))
        except ModelSourceError as e:
            problems.append(f"{flag('tokenizer')}: {str(e).replace('model ', 'tokenizer ', 1)}")
    try:
        hub = source_kind(cfg.dataset) == "hub"
        records = load_records(cfg.dataset, cfg.dataset_split, storage_fs=fs_for(cfg.dataset),
                               limit=100 if hub else None)
        check_records(records, cfg.dataset)
        info["records"] = len(records) if not hub else None
    except DataError as e:
        problems.append(f"{flag('dataset')}: {e}")
    if problems:
        raise ConfigError(problems)
    return info


def build_trainer(cfg: TrainConfig, storage_filesystem: Any = None, *, quiet: bool = False):
    """TorchTrainer running trainer.loop.train_func; `quiet` hides Ray Train's own INFO logs."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from trainer.loop import train_func

    storage_path = cfg.storage_path
    if storage_filesystem is not None and "://" in storage_path:
        storage_path = storage_path.split("://", 1)[1]
    return TorchTrainer(
        train_func,
        train_loop_config=cfg.to_dict(),
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
        run_config=RunConfig(
            name=cfg.resolved_run_name,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            failure_config=FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.num_to_keep),
            worker_runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "TRAINER_QUIET_RAY": str(int(quiet))}},
            logging_config=LoggingConfig(log_level="WARNING" if quiet else "INFO"),
        ),
    )


def train(cfg: TrainConfig, storage_filesystem: Any = None, *, check: bool = True, quiet: bool = False):
    """Pre-flight, then fit on the Ray cluster this process is connected to; returns Ray's Result."""
    if check:
        preflight(cfg, storage_filesystem)
    return build_trainer(cfg, storage_filesystem, quiet=quiet).fit()


CHECKPOINT_ENV = "CHECKPOINT_URI"  # set on the RayCluster's head (workloads/raycluster.py): the stack's bucket


def storage_default(environ=None) -> dict[str, str] | None:
    """The default storage path on the cluster: CHECKPOINT_URI where the deployment sets it."""
    import os

    uri = (os.environ if environ is None else environ).get(CHECKPOINT_ENV)
    return {"storage_path": uri} if uri else None


def main(argv: Sequence[str]) -> int:
    """`python -m trainer train`: run one training job on an existing Ray cluster."""
    parser = argparse.ArgumentParser(prog="python -m trainer train",
                                     description="Fine-tune a causal LM with FSDP2 on a running Ray cluster.")
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    address = args.__dict__.pop("address")
    try:
        cfg = from_args(args, storage_default())
        if not is_remote(cfg.storage_path) and cfg.num_workers > 1 and address not in ("auto", "local"):
            print(f"note: {flag('storage_path')} {cfg.storage_path} is local; multi-node runs need shared storage (s3://)",
                  file=sys.stderr)
        preflight(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import ray

    ray.init(address=address)
    try:
        result = train(cfg, check=False)
    except Exception as e:  # noqa: BLE001 - fit() raises the workers' error after max_failures
        print(f"error: training failed: {e}", file=sys.stderr)
        return 1
    if result.error:
        print(f"error: training failed: {result.error}", file=sys.stderr)
        return 1
    print(f"done: run folder {cfg.run_uri}")
    return 0
