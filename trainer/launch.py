"""Pre-flight checks and the Ray Train TorchTrainer for a configuration.

`preflight` reads the model config and the dataset before anything is started or
written, so bad inputs fail in seconds with every problem listed, and the run folder
is never created for a job that cannot train.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from facts import ray as ray_facts
from trainer.config import ConfigError, TrainConfig, add_arguments, flag, from_args, is_remote
from trainer.data import DataError, check_records, load_records
from trainer.formats import Renderer
from trainer.model import ModelSourceError, check_architecture, describe_source, read_model_config

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json", "config.json")


def read_chat_template(spec: str, storage_fs: Any = None) -> str:
    """The text of --chat-template (a local or s3:// Jinja file); ValueError naming what is wrong."""
    try:
        if spec.startswith("s3://"):
            from trainer.storage import Storage

            parent, _, name = spec.rpartition("/")
            text = Storage.from_uri(parent, fs=storage_fs).read_text(name)
        else:
            text = Path(spec).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{spec}: cannot read it ({type(e).__name__}: {e}); pass a Jinja chat template file") from None
    if not text.strip():
        raise ValueError(f"{spec}: the file is empty; pass a Jinja chat template file")
    return text


def preflight_tokenizer(cfg: TrainConfig, storage_fs: Any = None):
    """The tokenizer the workers will use (only its files are fetched), --chat-template applied."""
    import tempfile

    from trainer.model import load_tokenizer

    spec = cfg.tokenizer or cfg.model
    if describe_source(spec) == "s3":
        from trainer.storage import Storage

        store = Storage.from_uri(spec, fs=storage_fs)
        folder = Path(tempfile.mkdtemp(prefix="tokenizer-"))
        for name in _TOKENIZER_FILES:
            if store.exists(name):
                (folder / name).write_bytes(store.read_bytes(name))
        tok = load_tokenizer(folder)
    elif describe_source(spec) == "hub":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(spec, cache_dir=str(Path(cfg.resolved_cache_dir) / "hub"))
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
    else:
        tok = load_tokenizer(Path(spec).expanduser())
    if cfg.chat_template:
        tok.chat_template = read_chat_template(cfg.chat_template, storage_fs)
    return tok


def preflight(cfg: TrainConfig, storage_filesystem: Any = None) -> dict:
    """I/O checks of model, tokenizer, chat template and data; raises ConfigError listing every problem.

    The first records are rendered with the workers' tokenizer and template, so a record the
    template cannot render, or a tokenizer without a chat template, fails here, before Ray starts.
    """
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
    from trainer.metrics import missing_backends

    for name in missing_backends(cfg.reporters):
        problems.append(f"{flag('report_to')} {name}: the {name} package is not installed where the job runs; "
                        f"install it (pip install {name}; with `trainer submit`, --pip {name}), or drop it")
    tokenizer = None
    if cfg.chat_template:
        try:
            read_chat_template(cfg.chat_template, fs_for(cfg.chat_template))
        except ValueError as e:
            problems.append(f"{flag('chat_template')} {e}")
    if not problems:
        try:
            tokenizer = preflight_tokenizer(cfg, storage_filesystem)
        except Exception as e:  # noqa: BLE001 - any failure to load it means the job cannot tokenize
            which = "tokenizer" if cfg.tokenizer else "model"
            problems.append(f"{flag(which)}: cannot load its tokenizer ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})")
    try:
        records = load_records(cfg.dataset, cfg.dataset_split, config=cfg.dataset_config,
                               storage_fs=fs_for(cfg.dataset), limit=100, cache_dir=cfg.resolved_cache_dir)
        renderer = Renderer(tokenizer, cfg.train_on) if tokenizer is not None else None
        check_records(records, cfg.dataset, renderer=renderer, text_field=cfg.dataset_text_field)
        info["sampled_records"] = len(records)
    except DataError as e:
        where = flag("chat_template") if "no chat template" in str(e) else flag("dataset")
        problems.append(f"{where}: {e}")
    if problems:
        raise ConfigError(problems)
    info["tokenizer"] = tokenizer
    return info


def build_trainer(cfg: TrainConfig, storage_filesystem: Any = None, *, quiet: bool = False):
    """TorchTrainer running trainer.loop.train_func; `quiet` hides Ray Train's own INFO logs."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from trainer.loop import CHAT_TEMPLATE_KEY, train_func

    storage_path = cfg.storage_path
    if storage_filesystem is not None and "://" in storage_path:
        storage_path = storage_path.split("://", 1)[1]
    loop_config = cfg.to_dict()
    if cfg.chat_template:  # read here, by the driver: the workers may be on nodes without the file
        fs = storage_filesystem if cfg.chat_template.startswith("s3://") else None
        loop_config[CHAT_TEMPLATE_KEY] = read_chat_template(cfg.chat_template, fs)
    return TorchTrainer(
        train_func,
        train_loop_config=loop_config,
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


CHECKPOINT_ENV = ray_facts.CHECKPOINT_ENV  # set on the RayCluster's head: the stack's bucket


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
