"""Metrics accounting, files and the progress bar (no Ray, no distributed)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from trainer.loop.metrics import IntervalTracker, MetricsWriter, ProgressBar, read_metrics
from trainer.loop.step import StepOutput


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


METRICS = [{"step": s, "loss": 2.0 / s, "lr": 0.1, "grad_norm": 1.0, "tokens_per_s": 10.0 * s, "mfu": None}
           for s in (1, 2, 3)]


def wandb_history(run_file) -> list[dict]:
    """The history rows of an offline .wandb file: LevelDB-log framing around wandb's own Record protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, part, rows = run_file.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += block - pos % block
            continue
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_run_holds_the_logged_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = MetricsWriter(tmp_path, enabled=True, start_step=0, total_steps=3, progress=False, reporters=("wandb",),
                      run_name="wb-run", config={"lr": 0.1})
    for m in METRICS:
        w.log(m)
    w.close()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*-wb-run/run-wb-run.wandb")
    deadline = time.monotonic() + 60  # wandb's service process writes the file on its own after finish()
    while len(rows := wandb_history(run_file)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [(r["_step"], r["train/loss"], r["train/tokens_per_s"]) for r in rows] == \
        [(1, 2.0, 10.0), (2, 1.0, 20.0), (3, pytest.approx(2.0 / 3), 30.0)]
    assert not any("train/mfu" in r for r in rows)  # None values are not logged
    assert not (tmp_path / "tensorboard").exists()  # only the backends asked for


def test_mlflow_file_store_holds_every_logged_step_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tests")
    w = MetricsWriter(tmp_path, enabled=True, start_step=0, total_steps=3, progress=False, reporters=("mlflow",),
                      run_name="mf-run", config={"lr": 0.1, "model": "m"})
    for m in METRICS[:2]:
        w.log(m)
    w.close()
    w = MetricsWriter(tmp_path, enabled=True, start_step=2, total_steps=3, progress=False, reporters=("mlflow",),
                      run_name="mf-run", config={"lr": 0.1, "model": "m"})
    w.log(METRICS[2])
    w.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.run_name == "mf-run" and run.data.params == {"lr": "0.1", "model": "m"}
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(h.step, h.value) for h in history] == [(1, 2.0), (2, 1.0), (3, pytest.approx(2.0 / 3))]
    assert "mfu" not in run.data.metrics  # None values are not metrics


def test_report_to_names_are_validated_and_missing_packages_found():
    from trainer.config.flags import ConfigError, TrainConfig, validate
    from trainer.loop.metrics import missing_backends

    assert TrainConfig(report_to="tensorboard, wandb").reporters == ("tensorboard", "wandb")
    assert TrainConfig(report_to="none").reporters == ()
    with pytest.raises(ConfigError, match="report_to.*unknown: comet"):
        validate(TrainConfig(model="m", dataset="d", report_to="tensorboard,comet"))
    assert missing_backends(["tensorboard"]) == []


def test_ray_report_budget_reports_only_when_cheap():
    from trainer.loop.metrics import RayReportBudget

    budget = RayReportBudget(share=0.05)
    assert budget.wanted()  # the cost is unknown until measured
    budget.timed(lambda: time.sleep(0.05))
    assert budget.cost >= 0.05 and not budget.wanted()  # 0.05 s is more than 5% of the time since
    budget.since -= 2.0
    assert budget.wanted()
