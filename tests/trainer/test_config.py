"""TrainConfig: flags, YAML, precedence and validation that names every bad input."""

from __future__ import annotations

import pytest

from tests.guards import nonempty
from trainer.config.flags import ConfigError, TrainConfig, validate
from trainer.config.load import parse, split_out

BASE = ["--model", "m", "--dataset", "d.jsonl"]


def test_flags_build_a_typed_frozen_config():
    cfg = parse(BASE + ["--seq-len", "512", "--lr", "2e-5", "--num-workers", "4", "--global-batch-size", "32",
                        "--micro-batch-size", "2", "--activation-checkpointing", "--device", "gpu"])
    assert (cfg.seq_len, cfg.lr, cfg.num_workers, cfg.device) == (512, 2e-5, 4, "gpu")
    assert cfg.activation_checkpointing is True and cfg.use_gpu
    assert cfg.grad_accum_steps == 4  # 32 / (4 workers x 2)
    with pytest.raises(AttributeError):
        cfg.lr = 1.0  # frozen


def test_global_batch_is_fixed_and_accumulation_fills_the_gap():
    one = parse(BASE + ["--num-workers", "1", "--global-batch-size", "16", "--micro-batch-size", "2"])
    four = parse(BASE + ["--num-workers", "4", "--global-batch-size", "16", "--micro-batch-size", "2"])
    assert one.grad_accum_steps * 1 * 2 == four.grad_accum_steps * 4 * 2 == 16


def test_yaml_fills_and_flags_override(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("model: from-yaml\ndataset: data.parquet\nseq-len: 1024\nlr: 0.001\nschedule: linear\n")
    cfg = parse(["--config", str(f), "--lr", "0.002"])
    assert cfg.model == "from-yaml" and cfg.seq_len == 1024 and cfg.schedule == "linear"
    assert cfg.lr == 0.002  # flag wins over YAML


def test_yaml_unknown_key_and_bad_type_are_named(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("model: m\ndataset: d.jsonl\nnum_epochs: 2\nseq_len: many\nsave_step: 5\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f)])
    msg = str(e.value)
    assert "key 'num_epochs': unknown configuration key (did you mean 'epochs'?)" in msg
    assert "key 'save_step': unknown configuration key (did you mean 'save_steps'?)" in msg  # not 'steps'
    assert "seq_len" in msg and "'many'" in msg


def test_missing_yaml_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="--config .*file not found"):
        parse(["--config", str(tmp_path / "nope.yaml")])


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as e:
        parse(["--seq-len", "0", "--lr", "-1", "--steps", "5", "--epochs", "2", "--global-batch-size", "10",
               "--num-workers", "4", "--run-name", "bad name!"])
    problems = e.value.problems
    text = "\n".join(problems)
    for needle in ("--model", "--dataset", "--seq-len", "--lr", "give one of them", "--global-batch-size",
                   "--run-name"):
        assert needle in text, needle
    assert len(problems) >= 7


def test_indivisible_global_batch_names_flags_and_suggests_a_fix():
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(model="m", dataset="d", global_batch_size=10, num_workers=4, micro_batch_size=1))
    msg = str(e.value)
    assert "--global-batch-size = 10" in msg and "--num-workers" in msg and "--micro-batch-size" in msg
    assert "multiple of 4" in msg and "8" in msg and "12" in msg


def test_run_name_is_derived_and_out_sets_storage_and_name(tmp_path):
    cfg = parse(BASE)
    assert cfg.resolved_run_name == f"m-d-seq2048-gb64-seed0-{cfg.result_digest}"
    cfg = parse(BASE + ["--out", str(tmp_path / "runs" / "exp1")])
    assert cfg.storage_path == str(tmp_path / "runs") and cfg.run_name == "exp1"
    assert cfg.run_uri == str(tmp_path / "runs" / "exp1")
    assert split_out("s3://bucket/prefix/exp2") == {"storage_path": "s3://bucket/prefix", "run_name": "exp2"}


def test_round_trips_through_a_dict():
    cfg = parse(BASE + ["--steps", "7"])
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_steps_or_epochs_set_the_length_of_the_run():
    assert parse(BASE + ["--steps", "7"]).total_steps(steps_per_epoch=100) == 7
    assert parse(BASE + ["--epochs", "3"]).total_steps(steps_per_epoch=100) == 300
    assert parse(BASE).total_steps(steps_per_epoch=100) == 100  # one epoch by default


def test_sharding_flags_are_validated_with_the_fix():
    cfg = parse(BASE + ["--sharding", "hybrid", "--shard-size", "2", "--num-workers", "4", "--global-batch-size", "8",
                        "--instance-type", "g6.12xlarge"])
    assert (cfg.sharding, cfg.shard_size, cfg.instance_type) == ("hybrid", 2, "g6.12xlarge")
    assert parse(BASE).sharding == "auto"
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(model="m", dataset="d", num_workers=4, global_batch_size=8, sharding="full", shard_size=2))
    assert "--shard-size" in str(e.value) and "--sharding hybrid" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(model="m", dataset="d", num_workers=4, global_batch_size=8, sharding="hybrid",
                             shard_size=3, instance_type="g9.huge"))
    msg = str(e.value)
    assert "must divide --num-workers = 4" in msg and "instance_type" in msg and "g6.12xlarge" in msg
    with pytest.raises(ConfigError, match="sharding.*must be one of auto, full, hybrid"):
        validate(TrainConfig(model="m", dataset="d", sharding="zero3"))


def test_flex_attention_is_refused_on_cpu_where_it_cannot_train():
    assert parse(BASE + ["--device", "gpu", "--attn-implementation", "flex_attention"]).attn_implementation == \
        "flex_attention"
    with pytest.raises(ConfigError, match=r"--attn-implementation \(attn_implementation\) = 'flex_attention': "
                                          r"FlexAttention has no backward pass on CPU; use sdpa"):
        parse(BASE + ["--device", "cpu", "--attn-implementation", "flex_attention"])


def test_micro_batch_size_is_auto_by_default_and_auto_or_an_integer_from_flags_yaml_and_job_yaml(tmp_path):
    import yaml

    cfg = parse(BASE + ["--global-batch-size", "64", "--num-workers", "2"])
    assert cfg.micro_batch_size == "auto" and cfg.micro_batch_auto
    assert cfg.grad_accum_for(4) == 8  # 64 / (2 workers x 4)
    with pytest.raises(ValueError, match="auto.*grad_accum_for"):
        cfg.grad_accum_steps  # noqa: B018 - unknown until the workers chose
    assert parse(BASE + ["--micro-batch-size", "AUTO"]).micro_batch_auto
    assert parse(BASE + ["--micro-batch-size", "4"]).micro_batch_size == 4
    f = tmp_path / "job.yaml"
    f.write_text("model: m\ndataset: d.jsonl\nmicro_batch_size: Auto\n")
    assert parse(["--config", str(f)]).micro_batch_auto
    f.write_text("model: m\ndataset: d.jsonl\nmicro-batch-size: 8\n")
    assert parse(["--config", str(f)]).micro_batch_size == 8
    assert parse(["--config", str(f), "--micro-batch-size", "auto"]).micro_batch_auto  # the flag wins
    for given in (cfg, parse(BASE + ["--micro-batch-size", "2"])):  # what `trainer submit` ships as job.yaml
        f.write_text(yaml.safe_dump(given.to_dict(), sort_keys=False))
        assert parse(["--config", str(f)]) == given == TrainConfig.from_dict(yaml.safe_load(f.read_text()))


@pytest.mark.parametrize("value", ["0", "-1", "big", "2.5", "true"])
def test_a_bad_micro_batch_size_flag_names_the_flag_and_the_fix(value):
    with pytest.raises(ConfigError) as e:
        parse(BASE + ["--micro-batch-size", value])
    assert e.value.problems == [
        f"--micro-batch-size (micro_batch_size) = {int(value) if value.lstrip('-').isdigit() else value!r}: must be "
        "a positive integer or auto; pass e.g. --micro-batch-size 2, or auto for the largest micro-batch that fits "
        "in memory"]


@pytest.mark.parametrize("value", ["0", "-1", "big", "2.5", "true", "[2]"])
def test_a_bad_micro_batch_size_yaml_value_names_the_key_and_the_fix(value, tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(f"model: m\ndataset: d.jsonl\nmicro_batch_size: {value}\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f)])
    (problem,) = e.value.problems
    assert problem.startswith("--micro-batch-size (micro_batch_size) = ")
    assert "must be a positive integer or auto" in problem


def test_auto_needs_only_the_global_batch_divisible_by_the_workers():
    ok = validate(TrainConfig(model="m", dataset="d", global_batch_size=12, num_workers=4))  # 3 rows each
    assert ok is None
    with pytest.raises(ConfigError, match="--global-batch-size = 12 is not divisible by --num-workers x "
                                          "--micro-batch-size = 4 x 2 = 8"):
        validate(TrainConfig(model="m", dataset="d", global_batch_size=12, num_workers=4, micro_batch_size=2))
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(model="m", dataset="d", global_batch_size=10, num_workers=4, micro_batch_size="auto"))
    (problem,) = e.value.problems
    assert problem.startswith("--global-batch-size = 10 is not divisible by --num-workers = 4 (with "
                              "--micro-batch-size auto")
    assert "use a multiple of 4 (e.g. 8 or 12)" in problem


# A TRL SFTConfig YAML as `trl sft --config FILE` takes it: the 18 keys of the issue.
SFT_YAML = """\
learning_rate: 2.0e-5
per_device_train_batch_size: 4
gradient_accumulation_steps: 8
max_length: 1024
num_train_epochs: 3
max_steps: -1
warmup_ratio: 0.03
lr_scheduler_type: cosine
weight_decay: 0.01
max_grad_norm: 1.0
save_steps: 200
logging_steps: 10
seed: 42
bf16: true
gradient_checkpointing: true
packing: true
output_dir: {out}
report_to: none
dataset_text_field: content
"""


def test_a_trl_sft_config_yaml_maps_every_common_key_to_its_meaning_here(tmp_path):
    import yaml

    f = tmp_path / "sft.yaml"
    f.write_text(SFT_YAML.format(out=tmp_path / "runs" / "qwen-sft"))
    values = yaml.safe_load(f.read_text())
    assert len(values) == 19
    trl = pytest.importorskip("trl")
    assert trl.SFTConfig(**values, use_cpu=True).per_device_train_batch_size == 4  # it is a real SFTConfig
    cfg = parse(["--config", str(f), *BASE, "--num-workers", "2"])
    assert (cfg.lr, cfg.micro_batch_size, cfg.seq_len, cfg.epochs, cfg.steps) == (2e-5, 4, 1024, 3, None)
    assert cfg.global_batch_size == 4 * 8 * 2  # per device x accumulation x workers, as transformers counts
    assert cfg.grad_accum_steps == 8
    assert (cfg.warmup_ratio, cfg.warmup_steps, cfg.warmup_for(1000)) == (0.03, 0, 30)
    assert (cfg.schedule, cfg.weight_decay, cfg.grad_clip, cfg.checkpoint_every, cfg.log_every, cfg.seed) == \
        ("cosine", 0.01, 1.0, 200, 10, 42)
    assert cfg.activation_checkpointing and cfg.reporters == () and cfg.dataset_text_field == "content"
    assert (cfg.storage_path, cfg.run_name) == (str(tmp_path / "runs"), "qwen-sft")
    assert parse(["--config", str(f), *BASE, "--num-workers", "4"]).global_batch_size == 128
    assert parse(["--config", str(f), *BASE, "--global-batch-size", "64"]).grad_accum_steps == 8  # 64/(2x4)


@pytest.mark.parametrize("text, want", [
    ("max_steps: 500\nnum_train_epochs: 3\n", {"steps": 500, "epochs": None}),  # max_steps wins
    ("warmup_steps: 0.1\n", {"warmup_ratio": 0.1, "warmup_steps": 0}),  # transformers 5: a float < 1 is a ratio
    ("warmup_steps: 50\nwarmup_ratio: 0.1\n", {"warmup_steps": 50, "warmup_ratio": 0.0}),
    ("lr_scheduler_type: constant_with_warmup\nwarmup_steps: 5\n", {"schedule": "constant", "warmup_steps": 5}),
    ("lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr_rate: 0.1}\n",
     {"schedule": "cosine", "min_lr_ratio": 0.1}),
    ("report_to: [tensorboard, wandb]\n", {"report_to": "tensorboard,wandb"}),
    ("gradient_accumulation_steps: 2\n", {"micro_batch_size": 8, "global_batch_size": 32}),
    ("assistant_only_loss: true\n", {"train_on": "completion"}),
    ("completion_only_loss: false\n", {"train_on": "all"}),
    ("model_name_or_path: Qwen/Qwen2.5-1.5B\ndataset_name: trl-lib/Capybara\ndataset_train_split: train[:100]\n"
     "save_total_limit: 3\nsave_strategy: steps\noptim: adamw_torch_fused\nfp16: false\n",
     {"model": "Qwen/Qwen2.5-1.5B", "dataset": "trl-lib/Capybara", "dataset_split": "train[:100]", "num_to_keep": 3}),
])
def test_transformers_semantics_of_the_trl_keys(tmp_path, text, want):
    f = tmp_path / "sft.yaml"
    f.write_text(text)
    cfg = parse(["--config", str(f), "--model", "m", "--dataset", "d.jsonl", "--num-workers", "2"]
                if "model_name_or_path" not in text else ["--config", str(f), "--num-workers", "2"])
    assert {k: getattr(cfg, k) for k in want} == want


def test_trl_keys_that_do_not_apply_are_refused_each_with_its_reason(tmp_path):
    f = tmp_path / "sft.yaml"
    f.write_text("packing: false\nbf16: false\nfp16: true\neval_strategy: best\nload_in_8bit: true\n"
                 "lr_scheduler_type: polynomial\nnum_train_epochs: 1.5\noptim: sgd\npush_to_hub: true\n"
                 "report_to: all\nhub_strategy: checkpoint\ndeepspeed: ds.json\ntorch_empty_cache_steps: 10\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f), *BASE])
    by_key = {p.split("key ", 1)[1].split(" ", 1)[0].strip("':"): p for p in e.value.problems}
    reasons = {"packing": "always packed", "bf16": "bf16 parameters on GPU", "fp16": "fp16 is not supported",
               "eval_strategy": "use eval_strategy: steps, epoch or no",
               "load_in_8bit": "8-bit training is not supported",
               "lr_scheduler_type": "supported: cosine, linear, constant", "num_train_epochs": "whole epochs",
               "optim": "AdamW", "report_to:": "name the backends",
               "hub_strategy": "checkpoints are not pushed", "deepspeed": "FSDP2",
               "torch_empty_cache_steps": "TRL/transformers option with no counterpart"}
    for key, reason in reasons.items():
        problem = by_key[key.rstrip(":")]
        assert reason in problem, (key, problem)
    assert len(e.value.problems) == len(reasons)


def test_trl_load_in_4bit_is_qlora_on_nf4_and_other_4bit_types_are_refused(tmp_path):
    f = tmp_path / "qlora.yaml"
    f.write_text("use_peft: true\nload_in_4bit: true\nbnb_4bit_quant_type: nf4\nuse_bnb_nested_quant: true\n"
                 "lora_r: 8\n")
    assert parse(["--config", str(f), *BASE]).method == "qlora"
    f.write_text("load_in_4bit: true\nbnb_4bit_quant_type: fp4\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f), *BASE])
    assert len(e.value.problems) == 1 and "'fp4': only nf4 is supported" in e.value.problems[0]
    f.write_text("use_peft: false\nload_in_4bit: true\n")
    with pytest.raises(ConfigError, match="4-bit weights train only as QLoRA"):
        parse(["--config", str(f), *BASE])


def test_adamw_betas_and_epsilon_are_flags_trl_keys_and_result_settings(tmp_path):
    """Declared once in TrainConfig: flags, TRL/transformers keys (no longer refused), checks, run name."""
    from trainer.config.trl import training_arguments

    cfg = parse(BASE + ["--adam-beta1", "0.8", "--adam-beta2", "0.99", "--adam-epsilon", "1e-6"])
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon) == (0.8, 0.99, 1e-6)
    f = tmp_path / "sft.yaml"
    f.write_text("adam_beta1: 0.85\nadam_beta2: 0.98\nadam_epsilon: 1.0e-7\n")
    cfg = parse(["--config", str(f), *BASE])
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon) == (0.85, 0.98, 1e-7)
    assert training_arguments(cfg, ["adam_beta2", "lr"]) == {"adam_beta2": 0.98, "learning_rate": 1e-5}
    with pytest.raises(ValueError, match="steps: no TRL/transformers key of the same meaning and unit"):
        training_arguments(cfg, ["steps"])  # max_steps is translated with its own rules
    assert parse(BASE + ["--adam-beta2", "0.98"]).resolved_run_name != parse(BASE).resolved_run_name
    with pytest.raises(ConfigError) as e:
        parse(BASE + ["--adam-beta1", "1", "--adam-beta2", "-0.1", "--adam-epsilon", "0"])
    msg = str(e.value)
    for needle in ("--adam-beta1 (adam_beta1) = 1.0: must be at least 0 and below 1",
                   "--adam-beta2 (adam_beta2) = -0.1: must be at least 0 and below 1",
                   "--adam-epsilon (adam_epsilon) = 0.0: must be positive"):
        assert needle in msg, (needle, msg)


def test_a_key_given_under_both_names_is_a_conflict(tmp_path):
    f = tmp_path / "sft.yaml"
    f.write_text("learning_rate: 1.0e-4\nlr: 2.0e-4\n")
    with pytest.raises(ConfigError, match="both 'lr' and its TRL/transformers name are given; keep one"):
        parse(["--config", str(f), *BASE])


def test_default_run_names_of_a_sweep_differ_and_the_same_command_keeps_its_name():
    """A sweep over --lr (or any setting that changes the result) never shares a run folder; settings
    that only change how the run is executed or watched keep it, so the same command resumes."""
    names = {parse(BASE + extra).resolved_run_name for extra in
             ([], ["--lr", "2e-5"], ["--lr", "3e-5"], ["--warmup-steps", "5"], ["--train-on", "all"],
              ["--overlong", "drop"], ["--steps", "100"])}
    assert len(names) == 7, names
    same = {parse(BASE + extra).resolved_run_name for extra in
            ([], ["--log-every", "1"], ["--max-failures", "3"], ["--num-workers", "4", "--global-batch-size", "64"],
             ["--no-progress"], ["--num-to-keep", "5"], ["--resume-anyway"])}
    assert len(same) == 1, same


def _with_a_newer_flag():
    """TrainConfig plus a result flag declared after a run started (a newer trainer's)."""
    import dataclasses

    from trainer.config.flags import setting

    return dataclasses.make_dataclass("NewerConfig", [("adam_gamma", float, setting(0.5, "a flag added later"))],
                                      bases=(TrainConfig,), frozen=True)


def test_a_flag_added_at_its_default_keeps_default_run_names_and_a_set_one_changes_them():
    """The digest covers the result settings the user changed, so an upgrade that adds a flag renames no run."""
    newer = _with_a_newer_flag()
    for given in ({}, {"lr": 2e-5, "overlong": "drop"}):
        old = TrainConfig(model="Qwen/Qwen2.5-1.5B", dataset="d.jsonl", **given)
        assert newer(model="Qwen/Qwen2.5-1.5B", dataset="d.jsonl", **given).resolved_run_name == \
            old.resolved_run_name
        assert newer(model="Qwen/Qwen2.5-1.5B", dataset="d.jsonl", adam_gamma=0.5, **given).resolved_run_name == \
            old.resolved_run_name  # the default, passed explicitly
        changed = newer(model="Qwen/Qwen2.5-1.5B", dataset="d.jsonl", adam_gamma=0.25, **given)
        assert changed.resolved_run_name != old.resolved_run_name
        assert changed.resolved_run_name.startswith("Qwen2.5-1.5B-d-seq2048-gb64-seed0-")  # still readable
    assert newer.result_defaults()["adam_gamma"] == 0.5 and "adam_gamma" not in TrainConfig.result_defaults()
    # passing a default explicitly is not a change either, flag or YAML
    assert parse(BASE + ["--lr", "1e-5", "--seq-len", "2048"]).resolved_run_name == parse(BASE).resolved_run_name
    assert parse(BASE).changed_result_settings == {"model": "m", "dataset": "d.jsonl"}


def test_an_old_run_folder_resumes_after_a_flag_is_added_at_its_default(tmp_path):
    """run.json written before a flag existed lacks it: it was its default then, so only a change is refused."""
    import dataclasses
    import json

    from trainer.run_folder import checkpoint as ckpt
    from trainer.run_folder import resume
    from trainer.run_folder.record import RUN_RECORD
    from trainer.storage import Storage

    newer = _with_a_newer_flag()
    where = {"model": "m", "dataset": "d.jsonl", "lr": 2e-5, "storage_path": str(tmp_path)}
    old = TrainConfig(**where)
    run = tmp_path / old.resolved_run_name
    (run / ckpt.dir_name(2)).mkdir(parents=True)
    recorded = resume.inputs(old, data=None, tokenizer=None, model=None)
    (run / RUN_RECORD).write_text(json.dumps({"run_name": run.name, "inputs": recorded}))
    assert "adam_gamma" not in recorded["settings"]

    def check(cfg):
        return resume.check(cfg, resume.inputs(cfg, data=None, tokenizer=None, model=None), Storage.from_uri(str(run)))

    now = newer(**where)
    assert now.run_uri == str(run) and check(now) == []
    assert check(newer(**where, adam_gamma=0.5)) == []
    with pytest.raises(ConfigError, match=r"--adam-gamma: not set then, 0.25 now"):
        check(newer(**where, adam_gamma=0.25))
    with pytest.raises(ConfigError, match=r"--lr: 2e-05 then, 3e-05 now"):
        check(dataclasses.replace(now, lr=3e-5))
    # a record of the older layout (its whole config, no inputs) is read the same way
    (run / RUN_RECORD).write_text(json.dumps({"run_name": run.name, "config": old.to_dict()}))
    assert check(now) == []
    with pytest.raises(ConfigError, match=r"--adam-gamma: not set then, 0.25 now"):
        check(newer(**where, adam_gamma=0.25))


def test_every_declared_trl_key_is_a_real_trl_field_and_sets_its_flag(tmp_path):
    """The TRL column of the flags table is read from the declarations; each key must exist upstream
    (`trl sft` reads ScriptArguments, SFTConfig and ModelConfig; max_seq_length is SFTConfig's old name,
    dataset_mixture alignment-handbook's ScriptArguments')."""
    import dataclasses

    from trainer.config.flags import EXTRA_ARGUMENTS, FLAGS
    from trainer.config.trl import CONVERTED, RENAMES

    trl = pytest.importorskip("trl")
    upstream = {f.name for c in (trl.SFTConfig, trl.ModelConfig, trl.ScriptArguments) for f in dataclasses.fields(c)}
    declared = {key for f in [*FLAGS.values(), *EXTRA_ARGUMENTS.values()] for key in f.trl}
    assert declared - upstream == {"max_seq_length", "dataset_mixture"}  # the latter: alignment-handbook's
    assert CONVERTED <= declared  # every key read with its own rules is in the table too
    f = tmp_path / "sft.yaml"
    f.write_text("".join(f"{key}: {value}\n" for key, value in
                         [("learning_rate", 0.5), ("max_grad_norm", 0.25), ("logging_steps", 3), ("save_steps", 7)]))
    cfg = parse(["--config", str(f), *BASE])
    assert {RENAMES[k] for k in ("learning_rate", "max_grad_norm", "logging_steps", "save_steps")} == \
        {"lr", "grad_clip", "log_every", "checkpoint_every"}
    assert (cfg.lr, cfg.grad_clip, cfg.log_every, cfg.checkpoint_every) == (0.5, 0.25, 3, 7)


def test_names_from_elsewhere_get_a_did_you_mean_from_the_declarations(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("workers: 4\nclip_grad: 0.5\nglobal_batch_sise: 8\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f), *BASE])
    text = str(e.value)
    for hint in ("'workers': unknown configuration key (did you mean 'num_workers'?)",
                 "'clip_grad': unknown configuration key (did you mean 'grad_clip'?)",
                 "(did you mean 'global_batch_size'?)"):
        assert hint in text


def test_every_declared_flag_is_a_command_line_flag_with_its_help_and_default(capsys):
    from trainer.config.flags import FLAGS, flag

    with pytest.raises(SystemExit):
        parse(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name, f in nonempty(FLAGS.items(), "declared flags"):
        assert flag(name) in out
        assert " ".join(f.help.split())[:40] in out


def test_a_config_file_naming_the_storage_chooses_it_as_a_flag_would(tmp_path):
    """submit leaves the run on the cluster's storage only when neither flags nor --config name one."""
    import argparse

    from trainer.submit.cli import storage_chosen

    named, other = tmp_path / "named.yaml", tmp_path / "other.yaml"
    named.write_text("storage-path: s3://b/runs\n")  # dashes, as TRL-style files write keys
    other.write_text("lr: 0.001\n")
    assert storage_chosen(argparse.Namespace(config=str(named)), {})
    assert not storage_chosen(argparse.Namespace(config=str(other)), {})
    assert not storage_chosen(argparse.Namespace(config=None), {})
    assert storage_chosen(argparse.Namespace(config=None), {"out": "runs/x"})


def test_trl_s_peft_keys_set_the_lora_flags(tmp_path):
    f = tmp_path / "sft.yaml"
    f.write_text("use_peft: true\nlora_r: 8\nlora_alpha: 16\nlora_dropout: 0.0\n"
                 "lora_target_modules: [q_proj, v_proj]\n")
    cfg = parse(["--config", str(f), *BASE])
    assert (cfg.method, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout) == ("lora", 8, 16, 0.0)
    assert cfg.lora_targets == ("q_proj", "v_proj") and cfg.lora["targets"] == ("q_proj", "v_proj")
    f.write_text("use_peft: false\nlora_r: 8\n")
    with pytest.raises(ConfigError, match=r"--lora-rank \(lora_rank\) = 8: applies to --method lora"):
        parse(["--config", str(f), *BASE])
    f.write_text("use_peft: yes please\n")
    with pytest.raises(ConfigError, match="use_peft.*must be true or false"):
        parse(["--config", str(f), *BASE])
