"""A run never exits 0 on a NaN/Inf loss or an all-zero gradient: it stops with an error naming the step.

Real runs of the loop (one gloo rank, the demo data) on checkpoints that produce them: all
weights zero (the loss is log(vocab) and no weight gets any gradient) and a NaN weight.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from trainer.loop.step import StepHealth, StepOutput, TrainingDiverged
from trainer.run_folder import checkpoint as ckpt


def _broken_copy(demo_assets, folder, how: str):
    from safetensors.torch import load_file, save_file

    shutil.copytree(demo_assets["model"], folder)
    state = load_file(str(folder / "model.safetensors"))
    if how == "zero":
        state = {k: torch.zeros_like(v) for k, v in state.items()}
    else:
        state["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _run(process_group_folder, demo_assets, tmp_path):
    from trainer.config.flags import TrainConfig
    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import run
    from trainer.storage import Storage

    cfg = TrainConfig(model=str(process_group_folder), dataset=str(demo_assets["train"]), seq_len=128,
                      global_batch_size=4, micro_batch_size=2, steps=3, log_every=10, num_workers=1, device="cpu",
                      storage_path=str(tmp_path / "runs"), run_name="broken", cache_dir=str(tmp_path / "cache"),
                      progress=False)
    env = setup_parallel(cfg, 0, 1, 0)
    run(cfg, env, Storage.from_uri(cfg.run_uri))


@pytest.mark.parametrize("how,message", [
    ("zero", r"step 1: the gradient is exactly zero \(loss 4\.85\d*\)"),
    ("nan", r"step 1: the loss is nan and the gradient norm nan: training diverged"),
])
def test_the_run_stops_at_the_first_step_naming_it(process_group, demo_assets, tmp_path, how, message):
    folder = _broken_copy(demo_assets, tmp_path / f"{how}-model", how)
    with pytest.raises(TrainingDiverged, match=message):
        _run(folder, demo_assets, tmp_path)
    run = tmp_path / "runs" / "broken"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "stopped"] and events[-1]["step"] == 1
    assert not ckpt.names(run) and not (run / "model").exists()  # nothing saved or exported


def _out(loss: float, norm: float, tokens: float = 10.0) -> StepOutput:
    return StepOutput(loss=torch.tensor(loss), grad_norm=torch.tensor(norm), lr=1e-3, real_tokens=8, loss_tokens=4,
                      global_loss_tokens=torch.tensor(tokens))


def test_the_first_unhealthy_step_is_the_one_named():
    health = StepHealth(torch.device("cpu"))
    health.add(1, _out(2.0, 1.0))
    health.check()  # healthy so far
    health.add(2, _out(float("inf"), 3.0))
    health.add(3, _out(2.0, 0.0))
    with pytest.raises(TrainingDiverged, match=r"^step 2: the loss is inf"):
        health.check()
    empty = StepHealth(torch.device("cpu"))
    empty.add(7, _out(0.0, 0.0, tokens=0.0))
    with pytest.raises(TrainingDiverged, match=r"^step 7: the global batch has no labelled \(response\) token"):
        empty.check()
