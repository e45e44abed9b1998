"""`python -m trainer local`: the training flags of train/submit with the demo's defaults (its own cluster: test_train_ray.py)."""

from __future__ import annotations

from pathlib import Path

from trainer.__main__ import main as trainer
from trainer.jobs import local

REPO = Path(__file__).resolve().parents[2]


def _config(argv: list[str], out: Path):
    return local.demo_config(argv, out)


def test_demo_defaults_apply_where_no_flag_or_yaml_key_is_given(tmp_path):
    cfg = _config([], tmp_path / "run")
    assert (cfg.model, cfg.dataset) == (str(tmp_path / "run" / "init-model"), str(tmp_path / "run" / "data" /
                                                                                   "train.jsonl"))
    assert (cfg.num_workers, cfg.steps, cfg.global_batch_size, cfg.lr, cfg.seq_len, cfg.warmup_steps) == \
        (2, 400, 32, 3e-3, 128, 40)
    assert cfg.micro_batch_size == 16 and (cfg.storage_path, cfg.run_name) == (str(tmp_path), "run")


def test_local_takes_the_training_flags_and_config_of_train_and_submit(tmp_path):
    f = tmp_path / "sft.yaml"
    f.write_text("learning_rate: 1.0e-3\nper_device_train_batch_size: 2\nmax_steps: 30\n")
    cfg = _config(["--model", "my/model", "--dataset", "d.jsonl", "--config", str(f), "--num-workers", "4",
                   "--train-on", "all", "--report-to", "none"], tmp_path / "run")
    assert (cfg.model, cfg.dataset, cfg.num_workers, cfg.lr, cfg.micro_batch_size, cfg.steps) == \
        ("my/model", "d.jsonl", 4, 1e-3, 2, 30)
    # a TRL YAML: transformers' batch, and TRL's defaults where it is silent (no warm-up, decay to 0), not the demo's
    assert (cfg.global_batch_size, cfg.warmup_steps, cfg.min_lr_ratio, cfg.schedule) == (2 * 1 * 4, 0, 0.0, "linear")
    f.write_text("learning_rate: 1.0e-3\nnum_train_epochs: 1\n")  # a recipe's epochs: no demo --steps beside them
    assert (_config(["--config", str(f)], tmp_path / "e").epochs, _config(["--config", str(f)], tmp_path / "e").steps) \
        == (1, None)
    own = tmp_path / "own.yaml"
    own.write_text("lr: 1.0e-3\nsteps: 30\n")  # this trainer's own keys: the demo's defaults around them
    assert (_config(["--config", str(own)], tmp_path / "o").warmup_steps, _config(["--config", str(own)],
                                                                              tmp_path / "o").min_lr_ratio) == (3, 0.1)
    assert (cfg.train_on, cfg.reporters) == ("all", ())
    assert _config(["--workers", "4", "--global-batch-size", "8"], tmp_path / "r").num_workers == 4  # old name
    assert trainer(["local", "--device", "gpu", "--out", str(tmp_path / "gpu")]) == 2
    assert not (tmp_path / "gpu").exists()


def test_local_with_the_users_model_and_no_dataset_trains_on_the_demo_data_and_evaluates_that_model(
        demo_assets, trainer_cache, tmp_path):
    """`trainer local --model FOLDER`: the held-out evaluation before training reads the user's model (the
    demo's init-model is never written then)."""
    out = tmp_path / "run"
    cfg = _config(["--model", str(demo_assets["model"]), "--steps", "2", "--cache-dir", str(trainer_cache)], out)
    info, init_model, rows = local._prepare(cfg, out)
    assert Path(init_model) == Path(demo_assets["model"]) and not (out / local.DEMO_MODEL).exists()
    assert local.uses_demo_data(cfg, out) and len(rows) > 0 and info["inputs"]
    assert 0.0 <= local._evaluate(init_model, rows[:1]) <= 1.0  # loads the user's model, as step 2 does
