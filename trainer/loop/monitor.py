"""What a run writes about itself: metrics and events, throughput and MFU, step health, their upload.

Rank 0 writes metrics.jsonl, events.jsonl and the --report-to backends into the run folder, or into
a local mirror of it when the run storage is remote (uploaded at checkpoints, on a stop and at the
end). Every rank keeps the interval accounting (its summary is collective) and the step health:
a NaN/Inf loss or an all-zero gradient stops the run, named, before anything is logged, saved or
exported from an unhealthy model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainer.config.flags import TrainConfig
from trainer.loop.metrics import EVENTS_FILE, METRICS_FILE, MLFLOW_DIR, TENSORBOARD_DIR, IntervalTracker, MetricsWriter
from trainer.loop.parallel import WorkerEnv
from trainer.loop.step import StepHealth, StepOutput, TrainingDiverged
from trainer.model import flops as flops_lib
from trainer.storage import Storage

log = logging.getLogger("trainer")


class Monitor:
    """The run's metrics, events and health on every rank (files on rank 0)."""

    def __init__(self, cfg: TrainConfig, env: WorkerEnv, storage: Storage, model, *, start: int, total_steps: int):
        self.storage = storage
        self.rank0 = env.rank == 0
        self.folder = metrics_folder(cfg, storage, self.rank0)
        # Inside Ray Train the logger reaches the driver once; a print would arrive twice (Ray's print patch).
        emit = log.info if log.isEnabledFor(logging.INFO) and log.hasHandlers() else None
        self.writer = MetricsWriter(self.folder, enabled=self.rank0, start_step=start, total_steps=total_steps,
                                    progress=cfg.progress, emit=emit, reporters=cfg.reporters,
                                    run_name=cfg.resolved_run_name, config=cfg.to_dict())
        self.tracker = IntervalTracker(env.device, flops_lib.flops_per_token(model.config, cfg.seq_len),
                                       flops_lib.device_peak_flops(cfg.peak_tflops), env.world_size)
        self.health = StepHealth(env.device)

    def event(self, kind: str, **fields: Any) -> None:
        self.writer.event(kind, **fields)

    def add(self, done: int, out: StepOutput, data_wait_s: float) -> None:
        self.tracker.add(out, data_wait_s)
        self.health.add(done, out)

    def exclude(self, seconds: float) -> None:
        """Time outside training steps (saves, Ray reports) that must not dilute throughput."""
        self.tracker.exclude(seconds)

    def check_health(self, step: int) -> None:
        """Raises TrainingDiverged naming the first step with a NaN/Inf loss or an all-zero gradient."""
        try:
            self.health.check()
        except TrainingDiverged as e:
            self.writer.event("stopped", step=step, error=str(e))
            if self.rank0:  # the driver prints it (trainer.loop.user_errors)
                self.upload()
            raise

    def log(self, step: int, *, epoch: int, vote: bool, extra: dict | None = None) -> dict:
        """The interval's metrics (and `extra`: an evaluation's), written; `vote` (rank 0's) reaches every rank
        as `voted`."""
        metrics = {**self.tracker.summarize(step, vote=vote), "epoch": epoch, **(extra or {})}
        self.writer.log(metrics)
        return metrics

    def log_eval(self, step: int, result: dict) -> None:
        """An evaluation outside a logging step (eval_on_start): its own metrics line."""
        self.writer.log({"step": step, **result})

    @property
    def voted(self) -> bool:
        return self.tracker.vote

    def record_failure(self, kind: str, step: int, error: Exception) -> None:
        """The event log names a failure and why, stored even when the run then stops.

        Every rank waits for rank 0 to store the log: Ray stops the whole worker group as soon
        as one rank's error reaches it.
        """
        self.writer.event(kind, step=step, error=str(error))
        if self.rank0:
            log.error("%s", error)
            try:
                self.upload()
            except Exception as upload_error:  # noqa: BLE001 - the storage may be what is failing
                log.error("could not upload the event log after the failure either: %s", upload_error)
        if dist.is_initialized():
            try:
                dist.barrier()
            except Exception as barrier_error:  # noqa: BLE001 - the failure's error is the one to raise
                log.warning("ranks did not meet after the failure: %s", barrier_error)

    def upload(self) -> None:
        """Rank 0: the local mirror's files into remote run storage (nothing to do for a local run)."""
        if not self.rank0 or self.storage.is_local:
            return
        for name in (METRICS_FILE, EVENTS_FILE):
            if (self.folder / name).is_file():
                self.storage.upload_file(self.folder / name, name)
        for name in (TENSORBOARD_DIR, MLFLOW_DIR):
            if (self.folder / name).is_dir():
                self.storage.upload_dir(self.folder / name, name)

    def close(self) -> None:
        self.writer.close()
        self.upload()


def metrics_folder(cfg: TrainConfig, storage: Storage, rank0: bool) -> Path:
    """metrics.jsonl and TensorBoard files: the run folder itself, or a local mirror of remote storage."""
    if storage.is_local:
        return Path(storage.root)
    mirror = Path(cfg.resolved_cache_dir) / "runs" / cfg.resolved_run_name
    if rank0:
        mirror.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, EVENTS_FILE):
            if storage.exists(name):
                (mirror / name).write_bytes(storage.read_bytes(name))
    return mirror
