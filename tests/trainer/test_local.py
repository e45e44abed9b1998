"""`python -m trainer local`: the training flags of train/submit with the demo's defaults, and its own cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.__main__ import main as trainer
from trainer.jobs import local
from trainer.loop.metrics import read_metrics

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
    assert cfg.global_batch_size == 2 * 1 * 4 and cfg.warmup_steps == 3  # transformers' batch; demo warm-up
    assert (cfg.train_on, cfg.reporters) == ("all", ())
    assert _config(["--workers", "4", "--global-batch-size", "8"], tmp_path / "r").num_workers == 4  # old name
    assert trainer(["local", "--device", "gpu", "--out", str(tmp_path / "gpu")]) == 2
    assert not (tmp_path / "gpu").exists()


def test_local_starts_its_own_cluster_even_with_ray_address_pointing_at_a_running_one(
        ray_cluster, demo_assets, trainer_cache, tmp_path):
    """RAY_ADDRESS and the address file `ray start` leaves (RAY_TMPDIR/ray_current_cluster) both name the
    session's running cluster: the run keeps to its own, Ray Train's placement-group cleaner included
    (asking the other cluster, it finds no controller there and gives up or removes the run's group)."""
    out = tmp_path / "own"
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths must fit
    (ray_tmp / "ray_current_cluster").write_text(ray_cluster.address)
    env = {**ray_cluster.client_env(), "RAY_ADDRESS": ray_cluster.address, "RAY_TMPDIR": str(ray_tmp)}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "local", "--model", str(demo_assets["model"]), "--dataset",
         str(demo_assets["train"]), "--steps", "2", "--global-batch-size", "4", "--log-every", "1",
         "--checkpoint-every", "0", "--no-export", "--no-progress", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "training on a local Ray cluster of its own" in proc.stdout
    assert "num_cpus and num_gpus must not be provided" not in proc.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    output = proc.stdout + proc.stderr
    assert "Found multiple active Ray instances" not in output and "with cleaner" not in output, output[-3000:]
    shutil.rmtree(ray_tmp, ignore_errors=True)
