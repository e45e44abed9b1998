"""TrainConfig: flags, YAML, precedence and validation that names every bad input."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, TrainConfig, parse, split_out, validate

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
    f.write_text("model: m\ndataset: d.jsonl\nlearning_rate: 0.1\nseq_len: many\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f)])
    msg = str(e.value)
    assert "learning_rate" in msg and "unknown configuration key" in msg and "'lr'" in msg
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
    assert cfg.resolved_run_name == "m-d-seq2048-gb64-seed0"
    cfg = parse(BASE + ["--out", str(tmp_path / "runs" / "exp1")])
    assert cfg.storage_path == str(tmp_path / "runs") and cfg.run_name == "exp1"
    assert cfg.run_uri == str(tmp_path / "runs" / "exp1")
    assert split_out("s3://bucket/prefix/exp2") == {"storage_path": "s3://bucket/prefix", "run_name": "exp2"}


def test_round_trips_through_a_dict():
    cfg = parse(BASE + ["--steps", "7"])
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_steps_or_epochs_set_the_length_of_the_run():
    from trainer.config import total_steps

    assert total_steps(parse(BASE + ["--steps", "7"]), steps_per_epoch=100) == 7
    assert total_steps(parse(BASE + ["--epochs", "3"]), steps_per_epoch=100) == 300
    assert total_steps(parse(BASE), steps_per_epoch=100) == 100  # one epoch by default


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
