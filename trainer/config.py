"""The training configuration: one frozen, typed object built from flags and YAML.

Precedence is defaults < YAML file (``--config FILE``) < command-line flags. All
problems are collected and raised together as one ``ConfigError`` naming each flag
and key, so a user fixes a job in one pass instead of one cluster submission per
mistake. Checks that need to read the model or the dataset live in ``preflight``
(trainer.launch); this module does no I/O beyond reading the YAML file.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from trainer.errors import UserError

SCHEDULES = ("cosine", "linear", "constant")
DEVICES = ("cpu", "gpu")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
SHARDINGS = ("auto", "full", "hybrid")
TRAIN_ON = ("completion", "all")
REPORT_TO = ("tensorboard", "wandb", "mlflow")
OVERLONG = ("truncate", "drop")
AUTO = "auto"
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ConfigError(UserError, ValueError):
    """Every problem with a training configuration, one per line."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid training configuration ({len(self.problems)} problem(s)):\n{lines}")

    def __reduce__(self):  # a worker's error travels to the driver pickled
        return (type(self), (self.problems,))


@dataclass(frozen=True)
class TrainConfig:
    model: str = ""
    dataset: str = ""
    tokenizer: str | None = None
    dataset_split: str = "train"
    dataset_config: str | None = None
    dataset_text_field: str = "text"
    train_on: str = "completion"
    chat_template: str | None = None
    seq_len: int = 2048
    overlong: str = "truncate"
    global_batch_size: int = 64
    micro_batch_size: int | str = AUTO
    steps: int | None = None
    epochs: int | None = None
    lr: float = 1e-5
    min_lr_ratio: float = 0.0
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    schedule: str = "cosine"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    report_to: str = "tensorboard"
    checkpoint_every: int = 0
    num_to_keep: int = 2
    max_failures: int = 0
    storage_path: str = "runs"
    run_name: str | None = None
    num_workers: int = 2
    device: str = "cpu"
    activation_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    cache_dir: str | None = None
    peak_tflops: float | None = None
    export: bool = True
    progress: bool = True
    fail_at_step: int = 0
    sharding: str = "auto"
    shard_size: int = 0
    instance_type: str | None = None
    random_init: bool = False
    resume_anyway: bool = False

    @property
    def reporters(self) -> tuple[str, ...]:
        """The metrics backends of --report-to, in order (none: only metrics.jsonl)."""
        names = [n.strip() for n in self.report_to.split(",") if n.strip()]
        return () if names == ["none"] else tuple(names)

    def warmup_for(self, total: int) -> int:
        """Warm-up steps: --warmup-steps, else --warmup-ratio of the run's steps (transformers' rule)."""
        from trainer.hf_args import warmup_steps_for

        return warmup_steps_for(self.warmup_steps, self.warmup_ratio, total)

    @property
    def use_gpu(self) -> bool:
        return self.device == "gpu"

    @property
    def micro_batch_auto(self) -> bool:
        """`--micro-batch-size auto`: each worker picks the largest micro-batch that fits (trainer.loop)."""
        return isinstance(self.micro_batch_size, str) and self.micro_batch_size.strip().lower() == AUTO

    def grad_accum_for(self, micro_batch: int) -> int:
        """Micro-batches per rank per step: keeps the global batch fixed for any worker count."""
        return self.global_batch_size // (self.num_workers * micro_batch)

    @property
    def grad_accum_steps(self) -> int:
        """grad_accum_for the configured micro-batch; with auto it is known only once the workers measured."""
        if self.micro_batch_auto:
            raise ValueError("grad_accum_steps: --micro-batch-size is auto, so the micro-batch is chosen on the "
                             "workers from free memory; call grad_accum_for(micro_batch) with the chosen size")
        return self.grad_accum_for(self.micro_batch_size)

    @property
    def resolved_run_name(self) -> str:
        """The run's name: the Ray run name and the storage sub-folder (resubmitting resumes).

        The default ends in a digest of every setting that changes the result, so runs of a sweep
        (another --lr, batch or seed) never share a folder, and the same command resumes its own.
        """
        if self.run_name:
            return self.run_name
        parts = [_slug(self.model)[:36], _slug(self.dataset)[:36], f"seq{self.seq_len}", f"gb{self.global_batch_size}",
                 f"seed{self.seed}"]
        return "-".join([*(p for p in parts if p), self.result_digest])[:128]

    @property
    def result_settings(self) -> dict[str, Any]:
        """The settings that change what the run computes (a resume must keep them): all but RUN_SETTINGS."""
        return {k: v for k, v in self.to_dict().items() if k not in RUN_SETTINGS}

    @property
    def result_digest(self) -> str:
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.result_settings, sort_keys=True, default=str).encode()).hexdigest()[:8]

    @property
    def resolved_cache_dir(self) -> str:
        return self.cache_dir or os.environ.get("TRAINER_CACHE") or str(Path.home() / ".cache" / "trainer")

    @property
    def run_uri(self) -> str:
        """Where this run's checkpoints, metrics and exported model live (local path or s3://)."""
        return join_uri(self.storage_path, self.resolved_run_name)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        values = dict(values)
        if "micro_batch_size" in values:
            values["micro_batch_size"] = micro_batch_value(values["micro_batch_size"])
        return cls(**values)


# Settings that change how a run is executed, watched or stored, not what it computes: a resume may change them.
RUN_SETTINGS = frozenset({
    "log_every", "progress", "report_to", "max_failures", "num_to_keep", "checkpoint_every", "storage_path",
    "run_name", "cache_dir", "peak_tflops", "export", "fail_at_step", "num_workers", "micro_batch_size",
    "activation_checkpointing", "attn_implementation", "sharding", "shard_size", "instance_type", "resume_anyway",
})


def micro_batch_value(value: Any) -> Any:
    """`auto` in any case, or a whole number from text or YAML; anything else is kept for `validate` to name."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == AUTO:
            return AUTO
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _slug(value: str) -> str:
    base = value.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"\.(jsonl|json|ndjson|parquet|csv|tsv|txt|arrow)(\.gz|\.zst|\.bz2|\.xz)?$", "", base)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")[:40]


def join_uri(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if "://" in base else str(Path(base) / name)


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


_FLAG_HELP: dict[str, str] = {
    "model": "Hugging Face hub id, local folder or s3:// prefix of the model to fine-tune",
    "dataset": "training data: hub id, a .jsonl/.json/.parquet/.csv file, a folder of shards, save_to_disk output, "
               "or an s3:// URI of one; records in TRL's formats (messages, prompt/completion, text)",
    "tokenizer": "tokenizer location if different from --model",
    "dataset_split": "split to read (datasets' slicing works: train[:1000])",
    "dataset_config": "hub dataset configuration (subset) name",
    "dataset_text_field": "field of language-modelling records (trained on all tokens)",
    "train_on": "trained tokens: completion (prompt/completion completions and assistant turns; text records: all) "
                "or all",
    "chat_template": "Jinja chat template file (local or s3://) to use instead of the tokenizer's",
    "seq_len": "packed sequence length in tokens",
    "overlong": "records longer than --seq-len: truncate (keep their start) or drop; both are counted and reported",
    "global_batch_size": "sequences per optimizer step, the same for any number of workers",
    "micro_batch_size": "sequences per forward/backward pass on one worker: a positive integer, or auto for "
                        "the largest divisor of the worker's share that fits in memory (measured on GPU, "
                        "estimated on CPU)",
    "steps": "optimizer steps to run (mutually exclusive with --epochs)",
    "epochs": "passes over the packed dataset (default 1 when --steps is not given)",
    "lr": "peak learning rate",
    "min_lr_ratio": "final learning rate as a fraction of --lr (cosine/linear)",
    "warmup_steps": "linear warm-up steps",
    "warmup_ratio": "linear warm-up as a fraction of the run's steps (when --warmup-steps is 0)",
    "schedule": "learning-rate schedule after warm-up",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "clip the global gradient norm to this value (0 disables)",
    "seed": "random seed (model init, data order)",
    "log_every": "log metrics (metrics.jsonl, --report-to backends, Ray) every N steps",
    "report_to": "metrics backends, comma-separated: tensorboard, wandb, mlflow, or none (metrics.jsonl only)",
    "checkpoint_every": "save a sharded checkpoint every N steps (0: only at the end)",
    "num_to_keep": "checkpoints Ray keeps in storage",
    "max_failures": "worker-group restarts Ray Train attempts, resuming from the last checkpoint",
    "storage_path": "local folder or s3:// prefix holding runs",
    "run_name": "run name (folder under --storage-path); resubmitting the same name resumes",
    "num_workers": "number of training workers (one per GPU, or CPU processes)",
    "device": "train on GPUs with NCCL or CPUs with gloo",
    "activation_checkpointing": "recompute decoder-layer activations in backward to save memory (with "
                                "--micro-batch-size auto it is turned on by itself when not one sequence fits)",
    "attn_implementation": "transformers attention implementation (must honour packed position ids)",
    "cache_dir": "per-node cache for downloaded models and tokenized data (default ~/.cache/trainer)",
    "peak_tflops": "device peak dense TFLOP/s for MFU (default: looked up from the device name)",
    "export": "export a Hugging Face model folder at the end",
    "progress": "show a progress bar on rank 0",
    "fail_at_step": "testing aid: raise once at this step (first attempt only) to exercise recovery",
    "sharding": "FSDP2 sharding: full (over all workers), hybrid (shard inside a node, replicate across nodes) "
                "or auto (hybrid when the communication estimate for --instance-type favours it)",
    "shard_size": "workers per shard group for hybrid sharding (0: the workers of one node)",
    "instance_type": "GPU instance type of the workers, for the communication estimate (e.g. g6.12xlarge)",
    "random_init": "train from the config's random initialisation instead of the model's weights (a model "
                   "without weight files is an error otherwise)",
    "resume_anyway": "continue a run whose folder holds a run started with other settings, data or model "
                     "(refused otherwise, listing what differs)",
}

# Names users bring from elsewhere that are neither ours nor TRL's/transformers', for "did you mean" hints.
_ALIASES = {
    "num_epochs": "epochs", "epoch": "epochs", "batch_size": "global_batch_size", "micro_batch": "micro_batch_size",
    "per_device_batch_size": "micro_batch_size", "sequence_length": "seq_len", "warmup": "warmup_steps",
    "workers": "num_workers", "gpus": "num_workers", "save_every": "checkpoint_every", "log_steps": "log_every",
    "scheduler": "schedule", "clip_grad": "grad_clip",
}

_CHOICES: dict[str, tuple[str, ...]] = {
    "schedule": SCHEDULES,
    "device": DEVICES,
    "attn_implementation": ATTN_IMPLEMENTATIONS,
    "sharding": SHARDINGS,
    "train_on": TRAIN_ON,
    "overlong": OVERLONG,
}


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(TrainConfig)}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None) -> None:
    """Add one flag per TrainConfig field; unset flags stay absent so YAML can fill them."""
    defaults = dict(defaults or {})
    parser.add_argument("--config", metavar="FILE", help="YAML file with configuration keys (flags override it)")
    parser.add_argument("--out", metavar="DIR", default=argparse.SUPPRESS,
                        help="run folder (local or s3://): sets --storage-path to its parent and --run-name to its name")
    for f in fields(TrainConfig):
        kind = str(f.type)
        default = defaults.get(f.name, f.default)
        help_text = f"{_FLAG_HELP.get(f.name, '')} (default: {default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if kind == "bool":
            parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if f.name == "micro_batch_size":
            kwargs["type"] = micro_batch_value
        elif "int" in kind:
            kwargs["type"] = int
        elif "float" in kind:
            kwargs["type"] = float
        if f.name in _CHOICES:
            kwargs["choices"] = _CHOICES[f.name]
        parser.add_argument(flag(f.name), **kwargs)


def load_yaml(path: str) -> dict[str, Any]:
    import yaml

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


def _coerce(name: str, value: Any, problems: list[str], source: str) -> Any:
    kind = _field_types()[name]
    if value is None:
        if "None" in kind:
            return None
        problems.append(f"{source} {name}: must not be empty")
        return None
    if name == "micro_batch_size":
        return micro_batch_value(value)
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "yes", "1", "on"):
                return True
            if str(value).lower() in ("false", "no", "0", "off"):
                return False
            raise ValueError
        if "int" in kind:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if "float" in kind:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        want = kind.replace(" | None", "")
        problems.append(f"{source} {name}: {value!r} is not a valid {want}")
        return None


def merge(yaml_values: Mapping[str, Any], flag_values: Mapping[str, Any],
          defaults: Mapping[str, Any] | None = None, yaml_source: str = "YAML") -> TrainConfig:
    """Defaults < YAML < flags, then validate. Raises ConfigError listing every problem.

    The YAML may use this trainer's keys or TRL SFTConfig / TrainingArguments keys (trainer.hf_args).
    """
    from trainer import hf_args

    names = set(_field_types())
    problems: list[str] = []
    values: dict[str, Any] = dict(defaults or {})
    given = {str(key).replace("-", "_"): value for key, value in yaml_values.items()}
    original = {str(key).replace("-", "_"): key for key in yaml_values}
    own, mapped, hf_problems, hf = hf_args.translate(given, yaml_source, names | {"out"})
    problems += hf_problems
    for name in given:
        if name in names or name == "out" or hf_args.is_hf_key(name):
            continue
        close = [_ALIASES[name]] if name in _ALIASES else difflib.get_close_matches(
            name, sorted(names | hf_args.known_keys()), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(sorted(names))}"
        problems.append(f"{yaml_source} key {original[name]!r}: unknown configuration key{hint}")
    for name, value in {**mapped, **own}.items():
        if name == "out":
            values.update(split_out(str(value)))
            continue
        if name == "report_to":
            value = _report_to_value(value, problems, f"{yaml_source} key {name}")
            if value is None:
                continue
        values[name] = _coerce(name, value, problems, f"{yaml_source} key")
    for name, value in flag_values.items():
        if name == "out":
            values.update(split_out(str(value)))
        elif name in names:
            values[name] = value
    if "global_batch_size" not in own and "global_batch_size" not in flag_values:
        hf_batch = hf_args.global_batch({**TrainConfig().to_dict(), **values}, hf)
        if hf_batch is not None:
            values["global_batch_size"] = hf_batch
    if problems:
        raise ConfigError(problems)
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def _report_to_value(value: Any, problems: list[str], source: str) -> Any:
    """transformers' report_to (a name, a list, "none"; "all" is ambiguous here) as --report-to text."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        problems.append(f"{source}: expected a name or a list of names ({', '.join(REPORT_TO)}, none), "
                        f"found {value!r}")
        return None
    if "all" in items:
        problems.append(f"{source}: 'all' means every installed integration in transformers; name the backends "
                        f"here: {', '.join(REPORT_TO)} or none")
        return None
    return ",".join(items) if items else "none"


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
    yaml_values = load_yaml(args.config) if getattr(args, "config", None) else {}
    return merge(yaml_values, given, defaults, yaml_source=f"--config {getattr(args, 'config', '')}".strip())


def parse(argv: Sequence[str], defaults: Mapping[str, Any] | None = None, prog: str = "trainer") -> TrainConfig:
    parser = argparse.ArgumentParser(prog=prog)
    add_arguments(parser, defaults)
    return from_args(parser.parse_args(list(argv)), defaults)


def validate(cfg: TrainConfig) -> None:
    """Checks that need no I/O. Raises ConfigError naming every bad flag."""
    p: list[str] = []

    def bad(name: str, msg: str) -> None:
        p.append(f"{flag(name)} ({name}) = {getattr(cfg, name)!r}: {msg}")

    if not cfg.model:
        p.append(f"{flag('model')} (model): required; pass a hub id, a local model folder or an s3:// prefix")
    if not cfg.dataset:
        p.append(f"{flag('dataset')} (dataset): required; pass a hub id, a .jsonl/.json/.parquet/.csv file, a "
                 f"folder of them, save_to_disk output or an s3:// URI")
    for name in ("seq_len", "global_batch_size", "num_workers", "log_every"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            bad(name, "must be at least 1")
    for name in ("warmup_steps", "checkpoint_every", "max_failures", "fail_at_step", "seed"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 0:
            bad(name, "must be 0 or more")
    if cfg.num_to_keep < 1:
        bad("num_to_keep", "must be at least 1 (the latest checkpoint is needed to resume)")
    if cfg.steps is not None and cfg.epochs is not None:
        p.append(f"{flag('steps')} = {cfg.steps} and {flag('epochs')} = {cfg.epochs}: give one of them, not both")
    if cfg.steps is not None and cfg.steps < 1:
        bad("steps", "must be at least 1")
    if cfg.epochs is not None and cfg.epochs < 1:
        bad("epochs", "must be at least 1")
    if not cfg.lr > 0:
        bad("lr", "must be positive")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        bad("min_lr_ratio", "must be between 0 and 1")
    if cfg.weight_decay < 0:
        bad("weight_decay", "must be 0 or more")
    if cfg.grad_clip < 0:
        bad("grad_clip", "must be 0 (off) or positive")
    for name, choices in _CHOICES.items():
        if getattr(cfg, name) not in choices:
            bad(name, f"must be one of {', '.join(choices)}")
    if cfg.attn_implementation == "flex_attention" and not cfg.use_gpu:
        bad("attn_implementation", "FlexAttention has no backward pass on CPU; use sdpa with --device cpu "
                                   "(it masks packed documents too)")
    if not 0.0 <= cfg.warmup_ratio < 1.0:
        bad("warmup_ratio", "must be at least 0 and below 1")
    elif cfg.warmup_ratio and cfg.warmup_steps:
        p.append(f"{flag('warmup_steps')} = {cfg.warmup_steps} and {flag('warmup_ratio')} = {cfg.warmup_ratio}: "
                 f"give one of them, not both")
    reporters = cfg.reporters
    unknown = [r for r in reporters if r not in REPORT_TO]
    if unknown or (not reporters and cfg.report_to.strip() != "none"):
        bad("report_to", f"comma-separated names of {', '.join(REPORT_TO)}, or none"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    if not cfg.dataset_text_field:
        bad("dataset_text_field", "must not be empty")
    if cfg.peak_tflops is not None and cfg.peak_tflops <= 0:
        bad("peak_tflops", "must be positive")
    if cfg.run_name is not None and not _RUN_NAME.match(cfg.run_name):
        bad("run_name", "use letters, digits, '.', '_' or '-' (at most 128), starting with a letter or digit")
    if not cfg.storage_path:
        bad("storage_path", "required: a local folder or an s3:// prefix")
    elif "://" in cfg.storage_path and not cfg.storage_path.startswith(("s3://", "file://", "gs://")):
        bad("storage_path", "supported schemes are a local path, s3:// (or gs://, file://)")
    micro = cfg.micro_batch_size
    micro_ok = cfg.micro_batch_auto or (isinstance(micro, int) and not isinstance(micro, bool) and micro >= 1)
    if not micro_ok:
        bad("micro_batch_size", f"must be a positive integer or auto; pass e.g. {flag('micro_batch_size')} 2, "
                                f"or auto for the largest micro-batch that fits in memory")
    if micro_ok and min(cfg.global_batch_size, cfg.num_workers) >= 1:
        auto = cfg.micro_batch_auto
        per_pass = cfg.num_workers * (1 if auto else micro)
        if cfg.global_batch_size % per_pass:
            lo = max(per_pass, cfg.global_batch_size // per_pass * per_pass)
            divisor = (f"{flag('num_workers')} = {per_pass} (with {flag('micro_batch_size')} auto every worker takes "
                       f"an equal share)" if auto else
                       f"{flag('num_workers')} x {flag('micro_batch_size')} = {cfg.num_workers} x {micro} = {per_pass}")
            p.append(f"{flag('global_batch_size')} = {cfg.global_batch_size} is not divisible by {divisor}; use a "
                     f"multiple of {per_pass} (e.g. {lo} or {lo + per_pass}) or change the workers"
                     f"{'' if auto else '/micro-batch'}")
    if cfg.shard_size < 0:
        bad("shard_size", "must be 0 (the workers of one node) or positive")
    elif cfg.shard_size and cfg.sharding == "full":
        bad("shard_size", "applies to hybrid sharding; pass --sharding hybrid or drop --shard-size")
    elif cfg.shard_size and cfg.num_workers >= 1 and cfg.num_workers % cfg.shard_size:
        bad("shard_size", f"must divide {flag('num_workers')} = {cfg.num_workers} (replicas x shard size)")
    if cfg.instance_type is not None:
        from trainer.flops import instance_network

        try:
            instance_network(cfg.instance_type)
        except ValueError as e:
            bad("instance_type", str(e).split(": ", 1)[1])
    if cfg.steps and cfg.warmup_steps >= cfg.steps > 1:
        p.append(f"{flag('warmup_steps')} = {cfg.warmup_steps} must be below {flag('steps')} = {cfg.steps}")
    if p:
        raise ConfigError(p)


def total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    return cfg.steps if cfg.steps is not None else (cfg.epochs or 1) * steps_per_epoch
