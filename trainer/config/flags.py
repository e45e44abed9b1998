"""The training configuration: every flag declared once, as a field of one frozen, typed object.

Each field of TrainConfig is a training flag: its type, its default, and (through `setting`) its
help, its check, its choices, the TRL/transformers YAML keys that set it, the names users bring
from elsewhere and whether a resume may change it. The argparse flags and the YAML reader
(trainer.config.load, with trainer.config.trl's key mapping), the "did you mean" hints and the
table of training flags in docs/training.md (`python -m trainer flags`) all derive from these
declarations.

`validate` collects every problem (facts.errors.Problems) and raises them together as one
ConfigError naming each flag, so a user fixes a job in one pass instead of one cluster
submission per mistake. Checks that need to read the model or the dataset live in the pre-flight
(trainer.jobs.launch); this module does no I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from facts import nodes as node_facts
from facts import ray as ray_facts
from facts.errors import Problems, ProblemsError
from facts.reading import clip
from trainer.cache import default_dir

AUTO = "auto"
REPORT_TO = ("tensorboard", "wandb", "mlflow")
TRAIN_ON = ("completion", "completion_only", "all")
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ConfigError(ProblemsError):
    """Every problem with a training configuration, one per line."""

    title = "invalid training configuration"


# --- the declarations ---------------------------------------------------------------------------

Check = Callable[[Any], "str | None"]  # why a value is wrong, with the fix; None when it is fine


@dataclass(frozen=True)
class Flag:
    """What a TrainConfig field declares besides its type and default (see `setting`)."""

    help: str
    check: Check | None = None
    choices: tuple[str, ...] = ()
    trl: tuple[str, ...] = ()          # TRL SFTConfig / TrainingArguments keys that set it (trainer.config.trl)
    aliases: tuple[str, ...] = ()      # names from elsewhere that mean it, for "did you mean"
    result: bool = True                # changes what the run computes: a resume must keep it
    shown_default: str | None = None   # the table's default where the value itself says too little


def setting(default: Any, help: str, **flag: Any) -> Any:
    """A TrainConfig field with its declaration (Flag's arguments)."""
    return field(default=default, metadata={"flag": Flag(help, **flag)})


def at_least(lo: int, fix: str = "") -> Check:
    return lambda v: None if v is None or v >= lo else f"must be at least {lo}{fix}"


def not_negative(v: Any) -> str | None:
    return None if v is None or v >= 0 else "must be 0 or more"


def positive(v: Any) -> str | None:
    return None if v is None or v > 0 else "must be positive"


def _seed(v: Any) -> str | None:
    return None if v is None or 0 <= v < 2**64 else \
        f"must be from 0 to {2**64 - 1} (torch seeds its generators with 64 bits)"


def _beta(v: Any) -> str | None:
    return None if 0.0 <= v < 1.0 else "must be at least 0 and below 1 (a moment's decay per step, e.g. 0.9 or 0.95)"


def required(what: str) -> Check:
    return lambda v: None if v else f"required; pass {what}"


def _micro_batch(v: Any) -> str | None:
    if v == AUTO or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return None
    return ("must be a positive integer or auto; pass e.g. --micro-batch-size 2, or auto for the largest "
            "micro-batch that fits in memory")


def _report_to(v: str) -> str | None:
    names = [n.strip() for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in REPORT_TO and names != ["none"]]
    if unknown or not names:
        return (f"comma-separated names of {', '.join(REPORT_TO)}, or none"
                + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return None


def _storage_path(v: str) -> str | None:
    if not v:
        return "required: a local folder or an s3:// prefix"
    if "://" in v and not v.startswith(("s3://", "file://", "gs://")):
        return "supported schemes are a local path, s3:// (or gs://, file://)"
    return None


def _run_name(v: str | None) -> str | None:
    if v is None or _RUN_NAME.match(v):
        return None
    return "use letters, digits, '.', '_' or '-' (at most 128), starting with a letter or digit"


def _instance_type(v: str | None) -> str | None:
    from facts.catalog import GPU_TYPES

    if v is None or v in GPU_TYPES:
        return None
    return f"unknown; use one of {', '.join(sorted(GPU_TYPES))}"


def _pool(v: str | None) -> str | None:
    if v is None or not node_facts.label_problem(ray_facts.POOL_LABEL, v):
        return None
    return "not a node pool name; use a pool of the stack's nodePools output (lowercase letters, digits and '-')"


@dataclass(frozen=True)
class TrainConfig:
    model: str = setting("", "Hugging Face hub id, local folder or s3:// prefix of the model to fine-tune",
                         check=required("a hub id, a local model folder or an s3:// prefix"),
                         trl=("model_name_or_path",), shown_default="required")
    dataset: str = setting("", "training data: hub id, a .jsonl/.json/.parquet/.csv file, a folder of shards, "
                               "save_to_disk output, or an s3:// URI of one; records in TRL's formats (messages, "
                               "prompt/completion, text)",
                           check=required("a hub id, a .jsonl/.json/.parquet/.csv file, a folder of them, "
                                          "save_to_disk output or an s3:// URI"),
                           trl=("dataset_name", "dataset_mixture"), shown_default="required")
    tokenizer: str | None = setting(None, "tokenizer location if different from --model",
                                    shown_default="the model's")
    model_revision: str | None = setting(None, "revision (branch, tag or commit) of a hub --model to download, "
                                               "its tokenizer's too unless --tokenizer is given",
                                         check=lambda v: None if v is None or (v.strip() and v == v.strip())
                                         else "must be a branch, tag or commit name without spaces",
                                         trl=("model_revision",), shown_default="main")
    dataset_split: str = setting("train", "split to read (datasets' slicing works: train[:1000])",
                                 trl=("dataset_train_split",))
    dataset_config: str | None = setting(None, "hub dataset configuration (subset) name", trl=("dataset_config",))
    dataset_text_field: str = setting("text", "field of language-modelling records (trained on all tokens)",
                                      check=lambda v: None if v else "must not be empty",
                                      trl=("dataset_text_field",))
    train_on: str = setting("completion", "trained tokens: completion (prompt/completion completions and assistant "
                                          "turns; text records: all), completion_only (prompt/completion "
                                          "completions; messages and text: all, TRL's default) or all",
                            choices=TRAIN_ON, trl=("assistant_only_loss", "completion_only_loss"),
                            shown_default="`completion`; a TRL YAML: `completion_only`")
    chat_template: str | None = setting(None, "Jinja chat template to use instead of the tokenizer's: a file (local "
                                              "or s3://) or the template itself (text with Jinja tags)",
                                        trl=("chat_template_path",), shown_default="the tokenizer's")
    eos_token: str | None = setting(None, "the tokenizer's end-of-sequence token instead of its own (appended to text "
                                          "and completions; the exported model stops on it); must be in the vocabulary",
                                    trl=("eos_token",), shown_default="the tokenizer's")
    seq_len: int = setting(2048, "packed sequence length in tokens",
                           check=at_least(2, " (a row of one token has no next token to learn)"),
                           trl=("max_length", "max_seq_length"), aliases=("sequence_length",))
    eval_every: int = setting(0, "evaluate the loss on held-out data every N steps (0: never), packed as training "
                                 "is, on every worker", check=not_negative, trl=("eval_strategy", "eval_steps"),
                              result=False)
    eval_each_epoch: bool = setting(False, "evaluate at the end of every epoch too (TRL: eval_strategy: epoch)",
                                    trl=("eval_strategy",), result=False)
    eval_dataset: str | None = setting(None, "held-out data to evaluate (any --dataset location)",
                                       result=False, shown_default="--dataset's --eval-split")
    eval_split: str = setting("test", "split of --dataset evaluated when --eval-dataset is not given",
                              trl=("dataset_test_split",), result=False)
    eval_batch_size: int | None = setting(None, "packed rows per evaluation forward pass on one worker",
                                          check=at_least(1), trl=("per_device_eval_batch_size",), result=False,
                                          shown_default="the training micro-batch")
    eval_on_start: bool = setting(False, "evaluate once before the first step too", trl=("eval_on_start",),
                                  result=False)
    overlong: str = setting("truncate", "records longer than --seq-len: truncate (keep their start) or drop; both "
                                        "are counted and reported", choices=("truncate", "drop"))
    global_batch_size: int = setting(64, "sequences per optimizer step, the same for any number of workers "
                                         "(gradient accumulation fills the gap)", check=at_least(1),
                                     trl=("gradient_accumulation_steps",), aliases=("batch_size",))
    micro_batch_size: int | str = setting(AUTO, "sequences per forward/backward pass on one worker: a positive "
                                                "integer, or auto for the largest divisor of the worker's share "
                                                "that fits in memory (measured on GPU, estimated on CPU)",
                                          check=_micro_batch, trl=("per_device_train_batch_size",),
                                          aliases=("micro_batch", "per_device_batch_size"), result=False)
    steps: int | None = setting(None, "optimizer steps to run (mutually exclusive with --epochs)", check=at_least(1),
                                trl=("max_steps",), shown_default="one epoch")
    epochs: int | None = setting(None, "passes over the packed dataset (default 1 when --steps is not given)",
                                 check=at_least(1), trl=("num_train_epochs",), aliases=("num_epochs", "epoch"))
    lr: float = setting(1e-5, "peak learning rate", check=positive, trl=("learning_rate",))
    min_lr_ratio: float = setting(0.0, "final learning rate as a fraction of --lr (cosine/linear)",
                                  check=lambda v: None if 0.0 <= v <= 1.0 else "must be between 0 and 1",
                                  trl=("lr_scheduler_kwargs",))
    warmup_steps: int = setting(0, "linear warm-up steps", check=not_negative, trl=("warmup_steps",),
                                aliases=("warmup",))
    warmup_ratio: float = setting(0.0, "linear warm-up as a fraction of the run's steps (when --warmup-steps is 0)",
                                  check=lambda v: None if 0.0 <= v < 1.0 else "must be at least 0 and below 1",
                                  trl=("warmup_ratio",))
    schedule: str = setting("cosine", "learning-rate schedule after warm-up", choices=("cosine", "linear", "constant"),
                            trl=("lr_scheduler_type",), aliases=("scheduler",))
    weight_decay: float = setting(0.0, "AdamW weight decay", check=not_negative, trl=("weight_decay",))
    adam_beta1: float = setting(0.9, "AdamW's decay of the gradient's running mean (beta1)", check=_beta,
                                trl=("adam_beta1",))
    adam_beta2: float = setting(0.95, "AdamW's decay of the squared gradient's running mean (beta2)", check=_beta,
                                trl=("adam_beta2",))
    adam_epsilon: float = setting(1e-8, "AdamW's epsilon, added to the root of the squared-gradient mean",
                                  check=positive, trl=("adam_epsilon",))
    grad_clip: float = setting(1.0, "clip the global gradient norm to this value (0 disables)",
                               check=lambda v: None if v >= 0 else "must be 0 (off) or positive",
                               trl=("max_grad_norm",), aliases=("clip_grad",))
    seed: int = setting(0, "random seed (model init, data order)", check=_seed, trl=("seed",))
    log_every: int = setting(10, "log metrics (metrics.jsonl, --report-to backends, Ray) every N steps",
                             check=at_least(1), trl=("logging_steps",), aliases=("log_steps",), result=False)
    report_to: str = setting("tensorboard", "metrics backends, comma-separated: tensorboard, wandb, mlflow, or none "
                                            "(metrics.jsonl only)", check=_report_to, trl=("report_to",), result=False)
    checkpoint_every: int = setting(0, "save a sharded checkpoint every N steps (0: only at the end)",
                                    check=not_negative, trl=("save_steps", "save_strategy"), aliases=("save_every",),
                                    result=False)
    checkpoint_each_epoch: bool = setting(False, "save a checkpoint at the end of every epoch too (TRL: "
                                                 "save_strategy: epoch)", trl=("save_strategy",), result=False)
    keep_best: bool = setting(False, "keep the checkpoint with the lowest eval loss and export it instead of the last "
                                     "(evaluates at every checkpoint; Ray keeps the best --num-to-keep and the latest)",
                              trl=("load_best_model_at_end", "metric_for_best_model", "greater_is_better"),
                              result=False)
    num_to_keep: int = setting(2, "checkpoints Ray keeps in storage",
                               check=at_least(1, " (the latest checkpoint is needed to resume)"),
                               trl=("save_total_limit",), result=False)
    max_failures: int = setting(0, "worker-group restarts after a worker, node or storage failure, each resuming "
                                   "from the last checkpoint", check=not_negative, result=False)
    storage_path: str = setting("runs", "local folder or s3:// prefix holding runs", check=_storage_path,
                                result=False, shown_default="`runs`; `submit --stack`: the stack's bucket; on the cluster: its "
                                              "`CHECKPOINT_URI`")
    run_name: str | None = setting(None, "run name (folder under --storage-path); resubmitting the same name resumes",
                                   check=_run_name, trl=("run_name",), result=False,
                                   shown_default="from the model, data and a digest of the settings that change "
                                                 "the result and differ from their default")
    num_workers: int = setting(2, "number of training workers (one per GPU, or CPU processes)", check=at_least(1),
                               aliases=("workers", "gpus"), result=False,
                               shown_default="`2`; `submit --stack`: every GPU of the pool (`--pool`)")
    device: str = setting("cpu", "train on GPUs with NCCL or CPUs with gloo", choices=("cpu", "gpu"),
                          shown_default="`cpu`; `submit --stack`: `gpu`")
    activation_checkpointing: bool = setting(False, "recompute decoder-layer activations in backward to save "
                                                    "memory (with --micro-batch-size auto it is turned on by itself "
                                                    "when not one sequence fits)",
                                             trl=("gradient_checkpointing",), result=False)
    attn_implementation: str = setting("sdpa", "transformers attention implementation (must honour packed "
                                               "position ids)",
                                       choices=("sdpa", "eager", "flash_attention_2", "flash_attention_3",
                                                "flex_attention"), trl=("attn_implementation",), result=False)
    cache_dir: str | None = setting(None, "per-node cache for downloaded models and tokenized data", result=False,
                                    shown_default="`TRAINER_CACHE`, else `~/.cache/trainer`")
    peak_tflops: float | None = setting(None, "device peak dense TFLOP/s for MFU", check=positive, result=False,
                                        shown_default="looked up from the device name")
    export: bool = setting(True, "export a Hugging Face model folder at the end", result=False)
    push_to_hub: bool = setting(False, "upload the exported model folder to the Hugging Face Hub at the end (token: "
                                       "HF_TOKEN or `huggingface-cli login`)", trl=("push_to_hub",), result=False)
    hub_model_id: str | None = setting(None, "the Hub repository --push-to-hub uploads to (a bare name: the token's "
                                             "namespace)", trl=("hub_model_id",), result=False,
                                       shown_default="the run name")
    hub_private_repo: bool | None = setting(None, "create the --push-to-hub repository private (an existing one keeps "
                                                  "its visibility)", trl=("hub_private_repo",), result=False,
                                            shown_default="the Hub's default")
    progress: bool = setting(True, "show a progress bar on rank 0", result=False)
    fail_at_step: int = setting(0, "testing aid: raise once at this step (first attempt only) to exercise recovery",
                                check=not_negative, result=False)
    sharding: str = setting(AUTO, "FSDP2 sharding: full (over all workers), hybrid (shard inside a node, replicate "
                                  "across nodes) or auto (hybrid when one node's GPUs hold the run and the "
                                  "communication estimate for --instance-type favours it)",
                            choices=(AUTO, "full", "hybrid"), result=False)
    shard_size: int = setting(0, "workers per shard group for hybrid sharding (0: the workers of one node)",
                              check=lambda v: None if v >= 0 else "must be 0 (the workers of one node) or positive",
                              result=False)
    instance_type: str | None = setting(None, "GPU instance type of the workers, for the communication estimate "
                                              "(e.g. g6.12xlarge)", check=_instance_type, result=False,
                                        shown_default="unset; `submit --stack`: the pool's")
    pool: str | None = setting(None, "node pool the workers run on: Ray Train places them only on nodes with the "
                                     "Ray label raytrain.io/pool=NAME, which each pool's worker group carries",
                               check=_pool, result=False,
                               shown_default="unset (any node); `submit --stack`: required when the stack has "
                                             "several GPU pools")
    node_disk_gib: int | None = setting(None, "root volume of each GPU node, GiB: the prepared data must fit it (with "
                                              "the system, the image and the model's weights)",
                                        check=at_least(1), result=False,
                                        shown_default="unset (not checked); `submit --stack`: the pool's diskSize")
    method: str = setting("full", "what trains: full (every weight), lora (peft's LoRA adapters on the decoder "
                                  "layers' linear layers, the base frozen) or qlora (LoRA on a base whose decoder-layer "
                                  "linear weights are stored as torchao's 4-bit NF4); with lora and qlora checkpoints "
                                  "hold only the adapters and their optimizer state, the export adds an adapter folder",
                          choices=("full", "lora", "qlora"),
                          trl=("use_peft", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant"))
    lora_rank: int = setting(16, "LoRA rank (--method lora, qlora)", check=at_least(1), trl=("lora_r",))
    lora_alpha: float = setting(32.0, "LoRA scale numerator: the adapters' product is scaled by lora_alpha / "
                                      "lora_rank (--method lora, qlora)", check=positive, trl=("lora_alpha",))
    lora_dropout: float = setting(0.05, "dropout on the adapters' input (--method lora, qlora)",
                                  check=lambda v: None if 0.0 <= v < 1.0 else "must be at least 0 and below 1",
                                  trl=("lora_dropout",))
    lora_target_modules: str | None = setting(None, "comma-separated module names of the decoder layers' linear "
                                                    "layers that get adapters, e.g. q_proj,v_proj (--method lora, qlora)",
                                              trl=("lora_target_modules",),
                                              shown_default="every linear layer of the decoder layers (all-linear)")
    offload: str = setting("none", "FSDP2 CPU offload: cpu keeps the sharded parameters, gradients and AdamW states in "
                                   "host memory (pinned) and runs the optimizer step on the CPU, for a full fine-tune "
                                   "beyond GPU memory; the plan checks the worker pod's memory (--device gpu)",
                           choices=("none", "cpu"), result=False)
    random_init: bool = setting(False, "train from the config's random initialisation instead of the model's "
                                       "weights (a model without weight files is an error otherwise)")
    resume_anyway: bool = setting(False, "continue a run whose folder holds a run started with other settings, "
                                         "data or model (refused otherwise, listing what differs)", result=False)
    # not a flag: where each setting came from (flag, YAML key, TRL's default, this trainer's default), for run.json
    sources: dict = field(default_factory=dict, compare=False, metadata={})

    @property
    def reporters(self) -> tuple[str, ...]:
        """The metrics backends of --report-to, in order (none: only metrics.jsonl)."""
        names = [n.strip() for n in self.report_to.split(",") if n.strip()]
        return () if names == ["none"] else tuple(names)

    def warmup_for(self, total: int) -> int:
        """Warm-up steps: --warmup-steps, else --warmup-ratio of the run's steps (transformers' rule)."""
        return self.warmup_steps if self.warmup_steps else math.ceil(total * self.warmup_ratio)

    @property
    def evaluates(self) -> bool:
        return bool(self.eval_every or self.eval_on_start or self.eval_each_epoch)

    @property
    def lora_targets(self) -> tuple[str, ...] | None:
        """--lora-target-modules as names; None: every linear layer of the decoder layers."""
        names = [n.strip() for n in (self.lora_target_modules or "").split(",") if n.strip()]
        return None if not names or names == ["all-linear"] else tuple(names)

    @property
    def lora(self) -> dict | None:
        """trainer.model.adapters.apply_lora's arguments with --method lora or qlora; None for a full fine-tune."""
        if self.method == "full":
            return None
        return {"rank": self.lora_rank, "alpha": self.lora_alpha, "dropout": self.lora_dropout,
                "targets": self.lora_targets}

    @property
    def use_gpu(self) -> bool:
        return self.device == "gpu"

    @property
    def micro_batch_auto(self) -> bool:
        """`--micro-batch-size auto`: each worker picks the largest micro-batch that fits (trainer.loop.memory)."""
        return self.micro_batch_size == AUTO

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

        The default ends in a digest of the settings that change the result and differ from their
        default, so runs of a sweep (another --lr, batch or seed) never share a folder, the same
        command resumes its own, and a flag added later (at its default) renames no run.
        """
        if self.run_name:
            return self.run_name
        parts = [_slug(self.model)[:36], _slug(self.dataset)[:36], f"seq{self.seq_len}", f"gb{self.global_batch_size}",
                 f"seed{self.seed}"]
        return "-".join([*(p for p in parts if p), self.result_digest])[:128]

    @classmethod
    def result_defaults(cls) -> dict[str, Any]:
        """The declared default of each setting that changes the result, from this class's own fields
        (a subclass's or a newer flag's included), for comparing with a record that predates one."""
        return {f.name: declared_default(f) for f in fields(cls) if "flag" in f.metadata and f.metadata["flag"].result}

    @property
    def result_settings(self) -> dict[str, Any]:
        """The settings that change what the run computes (a resume must keep them)."""
        values = self.to_dict()
        return {name: values[name] for name in self.result_defaults()}

    @property
    def changed_result_settings(self) -> dict[str, Any]:
        """The result settings whose value is not their declared default: what the user chose."""
        defaults = self.result_defaults()
        return {k: v for k, v in self.result_settings.items() if v != defaults[k]}

    @property
    def result_digest(self) -> str:
        """A digest of changed_result_settings: the same for every default, present or future."""
        text = json.dumps(self.changed_result_settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    @property
    def resolved_cache_dir(self) -> str:
        return self.cache_dir or default_dir()

    @property
    def run_uri(self) -> str:
        """Where this run's checkpoints, metrics and exported model live (local path or s3://)."""
        return join_uri(self.storage_path, self.resolved_run_name)

    def total_steps(self, steps_per_epoch: int) -> int:
        """--steps, else --epochs (default 1) passes over the packed data."""
        return self.steps if self.steps is not None else (self.epochs or 1) * steps_per_epoch

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        values = dict(values)
        if "micro_batch_size" in values:
            values["micro_batch_size"] = micro_batch_value(values["micro_batch_size"])
        return cls(**values)


FLAGS: dict[str, Flag] = {f.name: f.metadata["flag"] for f in fields(TrainConfig) if "flag" in f.metadata}
KINDS: dict[str, str] = {f.name: str(f.type) for f in fields(TrainConfig) if "flag" in f.metadata}
# Command-line arguments that are not settings: they say where settings come from or go.
@dataclass(frozen=True)
class Argument:
    metavar: str
    help: str
    trl: tuple[str, ...] = ()


EXTRA_ARGUMENTS = {
    "config": Argument("FILE", "YAML file with configuration keys (this trainer's, or TRL/transformers'; flags "
                               "override it)"),
    "out": Argument("DIR", "run folder (local or s3://): sets --storage-path to its parent and --run-name to its "
                           "name", trl=("output_dir",)),
}


def declared_default(f: dataclasses.Field) -> Any:
    """A field's default as declared (its default_factory's value when it has one)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def micro_batch_value(value: Any) -> Any:
    """`auto` in any case, or a whole number from text or YAML; anything else is kept for the check to name."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == AUTO:
            return AUTO
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _slug(value: str) -> str:
    if value.startswith("mixture:"):  # trainer.data.mixture's location: its JSON would make no name
        return "mixture"
    base = value.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"\.(jsonl|json|ndjson|parquet|csv|tsv|txt|arrow)(\.gz|\.zst|\.bz2|\.xz)?$", "", base)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")[:40]


def join_uri(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if "://" in base else str(Path(base) / name)


def is_inline_template(spec: str) -> bool:
    """--chat-template holds the template itself (as alignment-handbook recipes give it), not a file's path."""
    return "{%" in spec or "{{" in spec


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def base_kind(kind: str) -> str:
    """A declared type without its None: int | None -> int."""
    return kind.replace(" | None", "")


# --- checks -------------------------------------------------------------------------------------

def validate(cfg: TrainConfig) -> None:
    """Each flag's own check and choices, then the checks across flags. Raises ConfigError naming every bad flag."""
    problems = Problems()
    bad: set[str] = set()

    def add(name: str, why: str) -> None:
        value = getattr(cfg, name)
        shown = "" if value in ("", None) else f" = {clip(value)}"
        problems.append(f"{flag(name)} ({name}){shown}: {why}")
        bad.add(name)

    for name, f in FLAGS.items():
        value = getattr(cfg, name)
        why = f"must be one of {', '.join(f.choices)}" if f.choices and value not in f.choices else None
        if why is None and f.check is not None and name not in bad:
            try:
                why = f.check(value)
            except TypeError:  # a value of another type (a dict built by hand): named, not a traceback
                why = f"{value!r} is not a valid {base_kind(KINDS[name])}"
        if why:
            add(name, why)
    _across(cfg, bad, add, problems)
    if cfg.keep_best and not (cfg.eval_every or cfg.eval_each_epoch):
        add("keep_best", "needs held-out evaluation during the run: pass --eval-every N or --eval-each-epoch (TRL: "
                         "eval_strategy: steps or epoch), with --eval-dataset or an --eval-split of --dataset")
    problems.raise_if_any(ConfigError)


def _method_rules(cfg: TrainConfig, add: Callable[[str, str], None]) -> None:
    """LoRA's settings only with an adapter method; QLoRA only on a trained base."""
    if cfg.method == "full":
        given = [name for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules")
                 if getattr(cfg, name) != declared_default(next(f for f in fields(cfg) if f.name == name))]
        for name in given:
            add(name, "applies to --method lora and qlora; pass --method lora or drop it")
    if cfg.offload == "cpu" and cfg.method == "qlora":
        add("offload", "--method qlora keeps its base as torchao NF4 tensors on the GPU, which FSDP2's CPU offload "
                       "cannot move to host memory; use --method qlora without --offload, or --method lora (or full) "
                       "with --offload cpu")
    if cfg.method == "qlora" and cfg.random_init:
        add("random_init", "--method qlora quantizes a trained base model's weights; drop --random-init, or use "
                           "--method full or lora")


def _across(cfg: TrainConfig, bad: set[str], add: Callable[[str, str], None], problems: Problems) -> None:
    """The rules that join flags: one of two, divisibility, what a device or a sharding allows."""
    if cfg.steps is not None and cfg.epochs is not None:
        problems.append(f"{flag('steps')} = {cfg.steps} and {flag('epochs')} = {cfg.epochs}: give one of them, "
                        f"not both")
    if cfg.offload == "cpu" and not cfg.use_gpu:
        add("offload", "moves GPU memory to host memory, and a --device cpu run keeps everything in host memory "
                       "already (FSDP2's CPU offload is a no-op there); drop --offload, or use --device gpu")
    if cfg.attn_implementation == "flex_attention" and not cfg.use_gpu:
        add("attn_implementation", "FlexAttention has no backward pass on CPU; use sdpa with --device cpu (it masks "
                                   "packed documents too)")
    if "warmup_ratio" not in bad and cfg.warmup_ratio and cfg.warmup_steps:
        problems.append(f"{flag('warmup_steps')} = {cfg.warmup_steps} and {flag('warmup_ratio')} = "
                        f"{cfg.warmup_ratio}: give one of them, not both")
    if not bad & {"micro_batch_size", "global_batch_size", "num_workers"}:
        auto, micro = cfg.micro_batch_auto, cfg.micro_batch_size
        per_pass = cfg.num_workers * (1 if auto else micro)
        if cfg.global_batch_size % per_pass:
            lo = max(per_pass, cfg.global_batch_size // per_pass * per_pass)
            divisor = (f"{flag('num_workers')} = {per_pass} (with {flag('micro_batch_size')} auto every worker takes "
                       f"an equal share)" if auto else
                       f"{flag('num_workers')} x {flag('micro_batch_size')} = {cfg.num_workers} x {micro} = {per_pass}")
            problems.append(f"{flag('global_batch_size')} = {cfg.global_batch_size} is not divisible by {divisor}; "
                            f"use a multiple of {per_pass} (e.g. {lo} or {lo + per_pass}) or change the workers"
                            f"{'' if auto else '/micro-batch'}")
    if "shard_size" not in bad and cfg.shard_size:
        if cfg.sharding == "full":
            add("shard_size", "applies to hybrid sharding; pass --sharding hybrid or drop --shard-size")
        elif "num_workers" not in bad and cfg.num_workers % cfg.shard_size:
            add("shard_size", f"must divide {flag('num_workers')} = {cfg.num_workers} (replicas x shard size)")
    _method_rules(cfg, add)
    if cfg.steps and cfg.warmup_steps >= cfg.steps > 1:
        problems.append(f"{flag('warmup_steps')} = {cfg.warmup_steps} must be below {flag('steps')} = {cfg.steps}")


# --- the table of docs/training.md ---------------------------------------------------------------

def _default_text(name: str) -> str:
    if FLAGS[name].shown_default is not None:
        return FLAGS[name].shown_default
    value = next(x.default for x in fields(TrainConfig) if x.name == name)
    if value is None:
        return "unset"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _keys(keys: Sequence[str]) -> str:
    return ", ".join(f"`{k}`" for k in keys)


def markdown_table() -> str:
    """The table of training flags in docs/training.md, from the declarations (`python -m trainer flags`)."""
    rows = ["| flag (YAML key) | default | TRL / transformers key | a resume may change it | meaning |",
            "|---|---|---|---|---|"]
    for name, arg in EXTRA_ARGUMENTS.items():
        rows.append(f"| `{flag(name)}` | unset | {_keys(arg.trl)} |  | {arg.help} |")
    for name, f in FLAGS.items():
        choices = f" ({_keys(f.choices)})" if f.choices else ""
        rows.append(f"| `{flag(name)}` (`{name}`) | {_default_text(name)} | {_keys(f.trl)} | "
                    f"{'' if f.result else 'yes'} | {f.help}{choices} |")
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    """`python -m trainer flags`: print the table of training flags (a test keeps docs/training.md equal)."""
    argparse.ArgumentParser(prog="python -m trainer flags", description=main.__doc__).parse_args(list(argv))
    print(f"<!-- training flags table: python -m trainer flags -->\n{markdown_table()}")
    return 0
