"""TRL SFTConfig / transformers TrainingArguments keys in a `--config` YAML, mapped to this trainer's.

A YAML written for `trl sft --config FILE` (or a TrainingArguments dump) means here what it means
in TRL 1.16: each key is translated to the setting with the same meaning, keys whose value does
nothing here are accepted and recorded, and each other key is refused with the reason and the fix,
so nothing is silently ignored. The keys the YAML omits take TRL's defaults, read from
`trl.SFTConfig` / `trl.ScriptArguments` themselves when TRL is installed (else from SFT_DEFAULTS,
TRL 1.16.0's values, which a test keeps equal to the installed TRL's).

Which defaults a YAML gets (`style`): `defaults: trl` or `defaults: trainer` in the YAML says it;
otherwise a YAML is TRL's when one of its keys is a TRL/transformers name that is not also this
trainer's own (model_name_or_path, learning_rate, ...). The global batch follows transformers'
arithmetic: per_device_train_batch_size x gradient_accumulation_steps x workers, unless
global_batch_size is given too (then the three must agree).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Mapping

from facts.errors import Problems
from trainer.config.flags import FLAGS, REPORT_TO
from trainer.data import mixture

# keys read with their own rules below (units, precedence, lists); every other key a flag declares
# under `trl=` (trainer.config.flags) is a plain rename with the same meaning and unit
CONVERTED = frozenset({"use_peft", "lora_target_modules", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
                       "num_train_epochs", "max_steps", "warmup_steps", "warmup_ratio", "lr_scheduler_type",
                       "output_dir", "report_to", "gradient_accumulation_steps", "lr_scheduler_kwargs",
                       "completion_only_loss", "assistant_only_loss", "dataset_mixture", "eval_strategy",
                       "eval_steps", "save_strategy", "load_best_model_at_end", "metric_for_best_model",
                       "greater_is_better"})
# key -> our field, from the declarations
RENAMES = {key: name for name, f in FLAGS.items() for key in f.trl if key not in CONVERTED}

SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "constant_with_warmup": "constant",
             "cosine_with_min_lr": "cosine"}
HF_DEFAULT_MICRO_BATCH = 8  # TrainingArguments.per_device_train_batch_size

# why each key has no counterpart (keys of TrainingArguments not listed get a generic reason)
_REFUSED_BY_REASON = {
    "training runs in bf16 on GPU (fp32 on CPU); fp16 is not supported": ("fp16",),
    "TF32 matmuls are not configurable here": ("tf32",),
    "the optimizer is AdamW (fused on GPU); other optimizers are not supported": ("optim",),
    "evaluation packs rows as training does; remove the key": ("eval_packing",),
    "pass the held-out data with --eval-dataset": ("eval_dataset_name",),
    "metrics go to the run folder (metrics.jsonl, tensorboard/)": ("logging_dir",),
    "metrics are logged every logging_steps steps, the first step included; remove the key": ("logging_first_step",),
    "resubmitting the same run name resumes from its last complete checkpoint": ("resume_from_checkpoint",),
    "sharding is FSDP2, set up by this trainer (--sharding)": ("deepspeed", "fsdp", "fsdp_config"),
    "Ray Train sets up the process group (NCCL on GPU, gloo on CPU)": ("ddp_backend", "local_rank"),
    "packed rows are memory-mapped; there is no DataLoader": ("dataloader_num_workers", "dataloader_pin_memory"),
    "8-bit training is not supported; use load_in_4bit: true (QLoRA on torchao's NF4) or use_peft: true alone": (
        "load_in_8bit",),
    "compilation is chosen by this trainer": ("torch_compile",),
    "rows are always packed with per-document position ids": ("padding_free",),
    "documents are always truncated at the end (keep_start)": ("truncation_mode",),
    "packed rows are always shuffled per epoch with the seed": ("shuffle_dataset",),
    "datasets and models are prepared by this trainer": ("dataset_kwargs", "model_init_kwargs"),
    "the loss is the mean negative log-likelihood over trained tokens": ("loss_type",),
    "NEFTune is not supported": ("neftune_noise_alpha",),
    "label smoothing is not supported": ("label_smoothing_factor",),
    "rows are packed, not grouped by length": ("group_by_length",),
    "checkpoints always hold model, optimizer and data position (needed to resume)": ("save_only_model",),
    "the exported model is always safetensors": ("save_safetensors",),
    "use --device cpu": ("use_cpu",),
}
REFUSED = {key: reason for reason, keys in _REFUSED_BY_REASON.items() for key in keys}


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: any(v is x if isinstance(x, bool) else v == x for x in values)


# key -> (is the value accepted, why it does nothing here (recorded) or why it is refused (with the fix));
# a predicate of two arguments also sees the other TRL keys
ACCEPTED: dict[str, tuple[Callable[..., bool], str, str]] = {
    "bf16": (_is(True), "parameters are bf16 on GPU (fp32 on CPU)",
             "training always uses bf16 parameters on GPU (fp32 on CPU); bf16: false (fp32 on GPU) is not supported: "
             "remove the key or set bf16: true"),
    "fp16": (_is(False), "fp16 is off", REFUSED["fp16"]),
    "torch_dtype": (_is("bfloat16", "auto"), "parameters are bf16 on GPU, fp32 on CPU",
                    "parameters are bf16 on GPU, fp32 on CPU; use bfloat16 or auto"),
    "dtype": (_is("bfloat16", "auto"), "parameters are bf16 on GPU, fp32 on CPU",
              "parameters are bf16 on GPU, fp32 on CPU; use bfloat16 or auto"),
    "packing": (_is(True), "documents are always packed (position ids restart per document)",
                "documents are always packed (position ids restart per document, so attention never crosses "
                "them); packing: false is not supported: remove the key or set packing: true"),
    "packing_strategy": (_is("bfd"), "packing is best-fit decreasing, overlong documents truncated (TRL's bfd)",
                         "packing is always best-fit decreasing with overlong documents truncated (TRL's bfd); "
                         "use packing_strategy: bfd"),
    "do_train": (_is(True, False), "transformers' Trainer does not read it (the script does); this trainer trains",
                 "must be true or false"),
    "do_eval": (_is(True, False), "transformers' Trainer does not read it; evaluation follows eval_strategy",
                "must be true or false"),
    "logging_strategy": (_is("steps"), "metrics are logged every logging_steps steps",
                         "metrics are logged every logging_steps steps; use logging_strategy: steps"),
    "log_level": (lambda v: True, "log verbosity only", ""),
    "log_level_replica": (lambda v: True, "log verbosity only", ""),
    "log_on_each_node": (lambda v: True, "log verbosity only", ""),
    "disable_tqdm": (lambda v: True, "progress bar only (--progress)", ""),
    "dataset_num_proc": (lambda v: True, "tokenization processes: the tokens are the same", ""),
    "remove_unused_columns": (_is(True, False), "only the fields of the record's format are read",
                              "must be true or false"),
    "overwrite_output_dir": (_is(True, False), "a run folder is never overwritten: resubmitting its name resumes it",
                             "must be true or false"),
    "ddp_timeout": (lambda v: True, "Ray Train sets the process group's timeout", ""),
    "gradient_checkpointing_kwargs": (
        lambda v: v in (None, {}) or v == {"use_reentrant": False},
        "activation checkpointing is non-reentrant, as asked",
        "activation checkpointing is non-reentrant here (the gradients are the same); set use_reentrant: false "
        "or remove the key"),
    "hub_strategy": (lambda v, hf: hf.get("push_to_hub") is not True or v in ("end", "every_save"),
                     "push_to_hub uploads the exported model once, when training ends (checkpoints are not pushed)",
                     "checkpoints are not pushed (resubmitting the run name resumes from storage); use hub_strategy: "
                     "end or every_save (the exported model, uploaded when training ends)"),
    "average_tokens_across_devices": (_is(True), "the loss is the mean over the trained tokens of all workers",
                                      "the loss is always the mean over the trained tokens of all workers; set "
                                      "average_tokens_across_devices: true or remove it"),
    "use_liger_kernel": (_is(True, False), "kernels are chosen by this trainer (the loss is the same)",
                         "must be true or false"),
    "dataset_streaming": (_is(False), "the dataset is read whole",
                          "datasets are prepared whole, once, by the cluster (shards in the run storage); set "
                          "dataset_streaming: false"),
    "optim": (_is("adamw_torch", "adamw_torch_fused"), "the optimizer is AdamW (fused on GPU)", REFUSED["optim"]),
    "trust_remote_code": (_is(False), "no custom model code is run",
                          "models with custom code are not loaded (no trust_remote_code); set it false or remove it"),
}


def _accepted(key: str, value: Any, hf: Mapping[str, Any]) -> bool:
    ok = ACCEPTED[key][0]
    return bool(ok(value, hf) if ok.__code__.co_argcount == 2 else ok(value))


@functools.cache
def _training_argument_names() -> frozenset[str]:
    try:
        import dataclasses

        from transformers import TrainingArguments

        return frozenset(f.name for f in dataclasses.fields(TrainingArguments))
    except Exception:  # noqa: BLE001 - without transformers, only the listed keys are known
        return frozenset()


# the keys whose TRL default this trainer applies to a TRL YAML that omits them, with TRL 1.16.0's values
# (used only where TRL is not installed; tests/trainer/test_trl_recipes.py keeps them equal to trl.SFTConfig's)
SFT_DEFAULTS: dict[str, Any] = {
    "learning_rate": 2e-05, "num_train_epochs": 3.0, "max_steps": -1, "lr_scheduler_type": "linear",
    "max_length": 1024, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "adam_beta1": 0.9,
    "adam_beta2": 0.999, "adam_epsilon": 1e-08, "weight_decay": 0.0, "max_grad_norm": 1.0, "warmup_steps": 0,
    "seed": 42, "logging_steps": 10, "save_steps": 500, "gradient_checkpointing": True, "dataset_text_field": "text",
    "assistant_only_loss": False, "report_to": "none", "dataset_train_split": "train",
}
# completion_only_loss defaults to None in TRL (completion-only for prompt/completion records): given or not,
# it is read as None here, so it needs no default


def _trl_classes() -> list:
    from trl import ModelConfig, ScriptArguments, SFTConfig

    return [SFTConfig, ScriptArguments, ModelConfig]


@functools.cache
def _sft_names() -> frozenset[str]:
    """Every key TRL's `trl sft` reads from a YAML (SFTConfig, ScriptArguments, ModelConfig)."""
    import dataclasses

    try:
        return frozenset(f.name for c in _trl_classes() for f in dataclasses.fields(c))
    except Exception:  # noqa: BLE001 - without TRL, the listed and TrainingArguments keys are known
        return frozenset()


@functools.cache
def sft_defaults() -> tuple[dict[str, Any], str]:
    """TRL's default of each key of SFT_DEFAULTS, read from the installed TRL's dataclasses, and where from."""
    import dataclasses

    try:
        import trl

        found: dict[str, Any] = {}
        for cls in reversed(_trl_classes()):  # SFTConfig last: its value wins
            for f in dataclasses.fields(cls):
                if f.name in SFT_DEFAULTS:
                    found[f.name] = f.default_factory() if f.default is dataclasses.MISSING else f.default
        return found, f"trl {trl.__version__}"
    except Exception:  # noqa: BLE001 - TRL is not installed where this runs: its 1.16.0 values
        return dict(SFT_DEFAULTS), "trl 1.16.0 (SFT_DEFAULTS; trl is not installed)"


STYLE_KEY = "defaults"  # `defaults: trl` or `defaults: trainer` in a YAML: whose defaults its omitted keys take
STYLES = ("trl", "trainer")


def style(given: Mapping[str, Any], ours: set[str]) -> str:
    """Whose defaults a YAML's omitted keys take: its `defaults:` key, else TRL's when it names a TRL/transformers
    key that is not also this trainer's own, else this trainer's."""
    explicit = given.get(STYLE_KEY)
    if explicit is not None:
        return str(explicit)
    return "trl" if any(k not in ours and is_hf_key(k) for k in given) else "trainer"


def training_arguments(cfg: Any, names: Iterable[str]) -> dict[str, Any]:
    """transformers TrainingArguments keywords carrying these settings' values, through each one's declared
    key (a plain rename: the same meaning and unit), e.g. for a baseline that must train like the config."""
    out = {}
    for name in names:
        keys = [key for key in FLAGS[name].trl if key in RENAMES]
        if not keys:
            raise ValueError(f"{name}: no TRL/transformers key of the same meaning and unit is declared for it "
                             f"(trainer.config.flags, trl=); translate it by hand")
        out[keys[0]] = getattr(cfg, name)
    return out


def known_keys() -> set[str]:
    """The TRL/transformers names this module maps (for "did you mean" hints)."""
    return set(RENAMES) | CONVERTED


def is_hf_key(name: str) -> bool:
    return name in RENAMES or name in REFUSED or name in ACCEPTED or name in CONVERTED or \
        name in _training_argument_names() or name in _sft_names()


# names both trainers use, read with transformers' rules (a float warmup_steps below 1 is a ratio, report_to and
# lora_target_modules a list)
SHARED_SEMANTICS = {"warmup_steps", "warmup_ratio", "report_to", "lora_target_modules",
                    "push_to_hub"}  # (hub_strategy's check reads it)


def translate(values: Mapping[str, Any], source: str, ours: set[str],
              problems: Problems) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, str]]:
    """YAML keys as (our keys, TRL/transformers keys translated to ours, the TRL/transformers keys as
    given, the keys accepted because their value does nothing here: key -> why), each problem added to
    `problems`; unknown keys are left to the caller."""
    own: dict[str, Any] = {}
    mapped: dict[str, Any] = {}
    accepted: dict[str, str] = {}
    hf = {k: v for k, v in values.items() if (k not in ours or k in SHARED_SEMANTICS) and is_hf_key(k)}

    def refuse(key: str, why: str) -> None:
        problems.append(f"{source} key {key!r} = {values[key]!r}: not applicable here: {why}")

    for key, value in values.items():
        if key in ours and key not in hf:
            own[key] = value
    _renamed(hf, mapped, accepted, refuse)
    _saving(hf, mapped, accepted, refuse)
    if hf.get("max_steps") == -1:
        accepted["max_steps"] = "-1: the run's length is num_train_epochs"
    _epochs_and_steps(hf, mapped, refuse)
    _evaluation(hf, mapped, accepted, refuse)
    _best(hf, mapped, refuse)
    _warmup(hf, mapped, refuse)
    _schedule(hf, mapped, refuse)
    _loss_mask(hf, mapped, refuse)
    if "dataset_mixture" in hf:  # alignment-handbook's; it wins over dataset_name, as there
        try:
            mapped["dataset"] = mixture.spec(hf["dataset_mixture"])
        except ValueError as e:
            refuse("dataset_mixture", f"{e} (alignment-handbook's dataset_mixture)")
    _peft(hf, mapped, refuse)
    if "output_dir" in hf:
        mapped["out"] = hf["output_dir"]
    if "report_to" in hf:
        _report_to(hf["report_to"], mapped, refuse)
    for key in set(own) & set(mapped):
        problems.append(f"{source}: both {key!r} and its TRL/transformers name are given; keep one")
    _gradient_accumulation(hf, mapped, refuse)
    return own, mapped, hf, accepted


def _renamed(hf: dict, mapped: dict, accepted: dict, refuse) -> None:
    """Each key by its table: accepted (its value does nothing here), a rename, refused outright, converted later,
    or unknown here."""
    for key, value in hf.items():
        if key in ACCEPTED:
            _, note, why = ACCEPTED[key]
            if _accepted(key, value, hf):
                accepted[key] = note
            else:
                refuse(key, why)
        elif key in RENAMES:
            mapped[RENAMES[key]] = value
        elif key in REFUSED:
            refuse(key, REFUSED[key])
        elif key not in CONVERTED:
            refuse(key, "a TRL/transformers option with no counterpart in this trainer")


def _peft(hf: dict, mapped: dict, refuse) -> None:
    """TRL's use_peft (LoRA through peft) as --method, with load_in_4bit QLoRA (the base in torchao's NF4, which is
    bitsandbytes' nf4 with its scales always quantized too), its lora_target_modules (a name, a list, all-linear)
    as text."""
    flags = {key: hf[key] for key in ("use_peft", "load_in_4bit", "use_bnb_nested_quant") if key in hf}
    for key in [k for k, v in flags.items() if not isinstance(v, bool)]:
        refuse(key, "must be true or false")
    if all(isinstance(v, bool) for v in flags.values()):
        if flags.get("load_in_4bit"):
            if flags.get("use_peft") is False:
                refuse("load_in_4bit", "4-bit weights train only as QLoRA; set use_peft: true (or drop load_in_4bit)")
            mapped["method"] = "qlora"
        elif "use_peft" in flags:
            mapped["method"] = "lora" if flags["use_peft"] else "full"
    quant = hf.get("bnb_4bit_quant_type")
    if "bnb_4bit_quant_type" in hf and quant != "nf4":
        refuse("bnb_4bit_quant_type", f"{quant!r}: only nf4 is supported (torchao's NF4); use nf4")
    if "lora_target_modules" in hf:
        value = hf["lora_target_modules"]
        items = value if isinstance(value, list) else [value]
        if value is None:  # unset (a job's own YAML writes it so): every linear layer of the decoder layers
            mapped["lora_target_modules"] = None
        elif not items or not all(isinstance(v, str) for v in items):
            refuse("lora_target_modules", "expected a module name, a list of them, or all-linear")
        else:
            mapped["lora_target_modules"] = ",".join(items)


def _gradient_accumulation(hf: dict, mapped: dict, refuse) -> None:
    """Accumulation steps come from the batch sizes here; given without a micro batch, transformers' default one."""
    if "gradient_accumulation_steps" not in hf:
        return
    gas = hf["gradient_accumulation_steps"]
    if isinstance(gas, bool) or not isinstance(gas, int) or gas < 1:
        refuse("gradient_accumulation_steps", "must be a whole number, at least 1")
    elif "per_device_train_batch_size" not in hf:
        mapped["micro_batch_size"] = HF_DEFAULT_MICRO_BATCH


def _report_to(value: Any, mapped: dict, refuse) -> None:
    """transformers' report_to (a name, a list, "none"; "all" is ambiguous here) as --report-to text."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        refuse("report_to", f"expected a name or a list of names ({', '.join(REPORT_TO)}, none)")
    elif "all" in items:
        refuse("report_to", f"'all' means every installed integration in transformers; name the backends here: "
                            f"{', '.join(REPORT_TO)} or none")
    else:
        mapped["report_to"] = ",".join(items) if items else "none"


def _epochs_and_steps(hf: dict, mapped: dict, refuse) -> None:
    steps = hf.get("max_steps")
    if steps is not None and steps != -1:
        mapped["steps"] = steps
    epochs = hf.get("num_train_epochs")
    if epochs is not None and "steps" not in mapped:  # transformers: max_steps > 0 overrides num_train_epochs
        if isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and float(epochs).is_integer():
            mapped["epochs"] = int(epochs)
        else:
            refuse("num_train_epochs", "only whole epochs are supported; use max_steps for a partial epoch")


def _saving(hf: dict, mapped: dict, accepted: dict, refuse) -> None:
    """save_strategy: steps (every save_steps), epoch, or no (only the final checkpoint here; transformers: none)."""
    strategy = hf.get("save_strategy", "steps")
    if strategy == "steps":  # every save_steps: checkpoint_every
        return
    if strategy in ("no", "epoch"):
        mapped["checkpoint_every"] = 0
        mapped["checkpoint_each_epoch"] = strategy == "epoch"
    else:
        refuse("save_strategy", "checkpoints are saved every save_steps steps, every epoch, or only at the end: use "
                                "save_strategy: steps, epoch or no")


def _evaluation(hf: dict, mapped: dict, accepted: dict, refuse) -> None:
    """eval_strategy: steps evaluates every eval_steps (transformers: logging_steps when unset); 'no' never."""
    key = "eval_strategy"
    strategy, every = hf.get(key, "no"), hf.get("eval_steps")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        refuse("eval_steps", "must be a whole number of steps, at least 1 (a fraction of the run is not supported)")
    elif strategy == "steps":
        mapped["eval_every"] = every or hf.get("logging_steps", 10)
    elif strategy == "epoch":
        mapped["eval_each_epoch"] = True
        if every is not None:
            accepted["eval_steps"] = "used only when eval_strategy is steps"
    elif strategy == "no":
        accepted[key] = "evaluation is off"
        if every is not None:
            accepted["eval_steps"] = "used only when eval_strategy is steps"
    else:
        refuse(key, "evaluation runs every eval_steps steps or every epoch: use eval_strategy: steps, epoch or no")


BEST_METRICS = (None, "loss", "eval_loss")  # transformers reads "loss" as "eval_loss"


def _best(hf: dict, mapped: dict, refuse) -> None:
    """load_best_model_at_end as keep_best; the only metric evaluated here is the eval loss, lower is better."""
    keys = ("load_best_model_at_end", "metric_for_best_model", "greater_is_better")
    if not any(k in hf for k in keys):
        return
    keep, metric, greater = (hf.get(k) for k in keys)
    wrong = {"load_best_model_at_end": "must be true or false"} if keep is not None and not isinstance(keep, bool) \
        else {}
    if metric not in BEST_METRICS:
        wrong["metric_for_best_model"] = ("the only metric evaluated here is the eval loss: use metric_for_best_model: "
                                          "eval_loss (or loss), or remove the key")
    if greater not in (None, False):
        wrong["greater_is_better"] = "the best checkpoint has the lowest eval loss: set greater_is_better: false or " \
                                     "remove the key"
    for key, why in wrong.items():
        refuse(key, why)
    if not wrong:
        mapped["keep_best"] = bool(keep)


def _warmup(hf: dict, mapped: dict, refuse) -> None:
    steps, ratio = hf.get("warmup_steps"), hf.get("warmup_ratio")
    if isinstance(steps, float) and 0 < steps < 1:  # transformers 5: a float below 1 is a ratio
        steps, ratio = None, steps if ratio is None else ratio
    if steps:  # transformers: warmup_steps > 0 wins over warmup_ratio
        mapped["warmup_steps"] = steps
    elif ratio is not None:
        mapped["warmup_ratio"] = ratio
    elif steps == 0:
        mapped["warmup_steps"] = 0


def _schedule(hf: dict, mapped: dict, refuse) -> None:
    name = hf.get("lr_scheduler_type")
    if "lr_scheduler_kwargs" in hf and name != "cosine_with_min_lr":
        refuse("lr_scheduler_kwargs", "only cosine_with_min_lr's min_lr_rate is understood (or use min_lr_ratio)")
    if name is None:
        return
    if name not in SCHEDULES:
        refuse("lr_scheduler_type", f"supported: {', '.join(SCHEDULES)} (cosine/linear decay to 0, or to "
                                    f"min_lr_ratio x the learning rate)")
        return
    if name == "constant" and (mapped.get("warmup_steps") or mapped.get("warmup_ratio")):
        refuse("lr_scheduler_type", "transformers' 'constant' ignores the warm-up; use constant_with_warmup, "
                                    "or remove the warm-up")
        return
    mapped["schedule"] = SCHEDULES[name]
    kwargs = hf.get("lr_scheduler_kwargs") or {}
    if name == "cosine_with_min_lr":
        rate = kwargs.get("min_lr_rate") if isinstance(kwargs, dict) else None
        if rate is None:
            refuse("lr_scheduler_type", "cosine_with_min_lr needs lr_scheduler_kwargs: {min_lr_rate: R} "
                                        "(the final learning rate as a fraction of learning_rate)")
        else:
            mapped["min_lr_ratio"] = rate


def _loss_mask(hf: dict, mapped: dict, refuse) -> None:
    """TRL's two switches as one --train-on: assistant_only_loss (default false: messages train every token)
    and completion_only_loss (default None: prompt/completion records train their completion)."""
    if "assistant_only_loss" not in hf and "completion_only_loss" not in hf:
        return
    assistant, completion = hf.get("assistant_only_loss", False), hf.get("completion_only_loss")
    if not isinstance(assistant, bool) or completion not in (None, True, False):
        refuse("assistant_only_loss" if not isinstance(assistant, bool) else "completion_only_loss",
               "must be true or false")
    elif assistant and completion is False:
        refuse("completion_only_loss", "with assistant_only_loss: true, TRL trains the assistant turns of the prompt "
                                       "too; not supported: remove completion_only_loss (completions and assistant "
                                       "turns are trained)")
    elif assistant:
        mapped["train_on"] = "completion"
    elif completion is False:
        mapped["train_on"] = "all"
    else:
        mapped["train_on"] = "completion_only"


def global_batch(values: Mapping[str, Any], hf: Mapping[str, Any]) -> int | None:
    """transformers' global batch (per device x accumulation x workers) when the YAML gives those keys."""
    if "per_device_train_batch_size" not in hf and "gradient_accumulation_steps" not in hf:
        return None
    micro = values.get("micro_batch_size", HF_DEFAULT_MICRO_BATCH)
    workers = values.get("num_workers")
    gas = hf.get("gradient_accumulation_steps", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (micro, workers, gas)):
        return None
    return micro * gas * workers
