"""When a run saves and what a save involves (the format itself: trainer.run_folder.checkpoint).

The Checkpointer resumes from the newest complete checkpoint, saves every --checkpoint-every
steps and at the last step, saves at once when Ray reports that a node is about to be
reclaimed (asked at logging steps, on every rank: it is a barrier), records a failed save in
the event log before the error stops the run, and reports to Ray: each checkpoint, and the
metrics of logging steps where the report (a barrier) costs under 5% of the time since the last.
With --keep-best each checkpoint holds its eval loss, and the run ends on the best one's weights.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from trainer.config.flags import TrainConfig
from trainer.data.packing import PackedData
from trainer.loop.metrics import RayReportBudget
from trainer.loop.monitor import Monitor
from trainer.run_folder import checkpoint as ckpt
from trainer.storage import Storage

log = logging.getLogger("trainer")

Reporter = Callable[[dict, "str | None"], None]  # ray.train.report's role: metrics, and a checkpoint's path


class Checkpointer:
    def __init__(self, cfg: TrainConfig, storage: Storage, model, optimizer, scheduler, data: PackedData,
                 total_steps: int, *, rank: int, reporter: Reporter | None = None,
                 preemption: Callable[[], Any] | None = None):
        self.cfg, self.storage, self.data, self.total_steps = cfg, storage, data, total_steps
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.rank0 = rank == 0
        self.reporter, self.preemption = reporter, preemption
        self.budget = RayReportBudget()
        self.resumed_from: str | None = None
        self.saved_for_preemption = False

    def resume(self, latest: str | None) -> int:
        """Collective: restores the newest checkpoint whose content is what was written; the step to start at."""
        name = ckpt.resume_point(self.storage, latest)
        if name is None:
            return 0
        state = ckpt.load(self.storage, name, self.model, self.optimizer, self.scheduler)
        self.resumed_from = name
        if self.rank0:
            log.info("resumed from %s at step %d", self.storage.path(name), state["step"])
            if state.get("data_fingerprint") not in (None, self.data.fingerprint):
                log.warning("the packed data differs from the checkpoint's (dataset, tokenizer or --seq-len "
                            "changed): the data order after step %d is not the original run's", state["step"])
        return state["step"]

    @property
    def resumed_path(self) -> str | None:
        return self.storage.path(self.resumed_from) if self.resumed_from else None

    def due(self, done: int) -> bool:
        """Every --checkpoint-every steps, at each epoch's end with --checkpoint-each-epoch, and the last step."""
        every = self.cfg.checkpoint_every
        epoch_end = self.cfg.checkpoint_each_epoch and done % self.data.steps_per_epoch(self.cfg.global_batch_size) == 0
        return bool(every and done % every == 0) or epoch_end or done == self.total_steps

    def report_wanted(self) -> bool:
        """Rank 0's vote on reporting this logging step's metrics to Ray (the ranks agree in the summary)."""
        return self.rank0 and self.budget.wanted()

    def report(self, metrics: dict, *, agreed: bool) -> float:
        """A logging step's metrics to Ray when the ranks agreed it is cheap; the seconds it took."""
        if not (self.reporter and agreed):
            return 0.0
        self.budget.timed(lambda: self.reporter(metrics, None))
        return self.budget.cost or 0.0

    def preempted(self, done: int, monitor: Monitor) -> bool:
        """Collective, at a logging step without a save: whether a node is about to be reclaimed (then save now)."""
        if self.preemption is None or self.saved_for_preemption:
            return False
        notice = self.preemption()
        if notice is None:
            return False
        self.saved_for_preemption = True
        ranks, deadline_ms = notice.preempted_ranks, notice.deadline_ms  # a ray.train.PreemptionInfo
        monitor.event("preemption_notice", step=done, ranks=ranks, deadline_ms=deadline_ms)
        if self.rank0:
            left = f", {deadline_ms / 1000 - time.time():.0f} s left" if deadline_ms else ""
            log.warning("node(s) of rank(s) %s about to be reclaimed%s: saving a checkpoint at step %d", ranks, left,
                        done)
        return True

    def save(self, done: int, metrics: dict, monitor: Monitor) -> float:
        """Collective: a checkpoint at step `done`, reported to Ray with `metrics`; the seconds it took."""
        t0 = time.perf_counter()
        gb = self.cfg.global_batch_size
        try:
            evaluated = {"eval_loss": metrics["eval_loss"]} if metrics.get("step") == done and \
                "eval_loss" in metrics else {}
            path = ckpt.save(self.storage, done, self.model, self.optimizer, self.scheduler, self.data.position(done, gb),
                             extra={"data_fingerprint": self.data.fingerprint, "total_steps": self.total_steps,
                                    **evaluated}, keep=self.cfg.num_to_keep, keep_best=self.cfg.keep_best)
        except ckpt.CheckpointError as e:
            monitor.record_failure("checkpoint_failed", done, e)
            raise
        monitor.event("checkpoint", step=done, path=path)
        monitor.upload()
        if self.reporter:  # ray.train.report is a barrier: with checkpoints, and at logging steps where cheap
            self.budget.timed(lambda: self.reporter({**metrics, "checkpoint_step": done}, path))
        return time.perf_counter() - t0


    def restore_best(self, monitor: Monitor) -> dict | None:
        """Collective: the model's weights become those of the complete checkpoint with the lowest eval loss (the
        earliest of equals, as transformers keeps the first best); what it is, or None when none has one."""
        scored = ckpt.eval_losses(self.storage)
        if not scored:
            return None
        name, loss = min(scored.items(), key=lambda kv: (kv[1], ckpt.step_of(kv[0])))
        step = ckpt.step_of(name)
        if step != self.total_steps:
            ckpt.load(self.storage, name, self.model, self.optimizer, self.scheduler)
        best = {"checkpoint": self.storage.path(name), "step": step, "eval_loss": loss}
        monitor.event("best_checkpoint", **best)
        if self.rank0:
            log.info("best checkpoint by eval loss: %s (step %d, eval loss %.4f)", best["checkpoint"], step, loss)
        return best


def report_to_ray(metrics: dict, checkpoint_path: str | None, storage: Storage) -> None:
    """ray.train.report (a barrier); rank 0 attaches the already-complete checkpoint in storage."""
    import ray.train
    import torch.distributed as dist
    from ray.train import Checkpoint, CheckpointUploadMode

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    checkpoint = Checkpoint(path=checkpoint_path, filesystem=storage.fs) if checkpoint_path and rank0 else None
    ray.train.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
