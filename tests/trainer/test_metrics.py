"""Metrics accounting, files and the progress bar (no Ray, no distributed)."""

from __future__ import annotations

import json

import torch

from trainer.metrics import IntervalTracker, MetricsWriter, ProgressBar, read_metrics
from trainer.step import StepOutput


def _out(loss: float, tokens: int) -> StepOutput:
    return StepOutput(loss=torch.tensor(loss), grad_norm=torch.tensor(0.5), lr=1e-3, real_tokens=tokens,
                      loss_tokens=tokens // 4)


def test_interval_averages_loss_counts_real_tokens_and_excludes_checkpoint_time():
    tracker = IntervalTracker(torch.device("cpu"), flops_per_token=1e6, peak_flops=1e12, world_size=1)
    tracker.add(_out(2.0, 100), data_wait_s=0.01)
    tracker.add(_out(4.0, 300), data_wait_s=0.03)
    tracker.exclude(-3600.0)  # pretend an hour of checkpointing was excluded: throughput must drop accordingly
    m = tracker.summarize(step=2)
    assert m["loss"] == 3.0 and m["step"] == 2 and m["tokens_seen"] == 400
    assert m["data_wait_s"] == 0.02 and m["grad_norm"] == 0.5 and m["lr"] == 1e-3
    assert 0 < m["tokens_per_s"] < 400 / 3600 * 1.01
    assert m["mfu"] == round(m["tokens_per_s"] * 1e6 / 1e12, 4)
    assert tracker.summarize(step=3)["tokens_seen"] == 400  # the next interval starts empty


def test_writer_appends_json_lines_and_tensorboard_and_truncates_on_resume(tmp_path, capsys):
    w = MetricsWriter(tmp_path, enabled=True, start_step=0, total_steps=4, progress=True)
    for step in (1, 2, 3):
        w.log({"step": step, "loss": 1.0 / step, "lr": 0.1, "grad_norm": 1.0, "tokens_per_s": 10.0, "mfu": None})
    w.event("checkpoint", step=2)
    w.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert "train [" in capsys.readouterr().out
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "events.jsonl").read_text())["event"] == "checkpoint"
    MetricsWriter(tmp_path, enabled=True, start_step=2, total_steps=4, progress=False).close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_progress_bar_line():
    line = ProgressBar(total=400, start=0).line(100, {"loss": 1.23456, "tokens_per_s": 12345.0})
    assert line.startswith("train [######..................] 100/400  25% | loss 1.2346 | 12.3k tok/s |")


def test_disabled_writer_writes_nothing(tmp_path):
    w = MetricsWriter(tmp_path / "x", enabled=False, start_step=0, total_steps=1, progress=True)
    w.log({"step": 1, "loss": 1.0})
    w.event("start")
    w.close()
    assert not (tmp_path / "x").exists()
