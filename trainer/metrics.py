"""Training metrics: interval accounting on every rank, files and a progress bar on rank 0.

Nothing here synchronises the device or the ranks on ordinary steps: losses stay on the
device and are summed there; the one all-reduce (real tokens of all ranks) and the one
host sync (.item()) happen at logging steps only.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainer import flops as flops_lib

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
TENSORBOARD_DIR = "tensorboard"


class IntervalTracker:
    """Accumulates one logging interval; summarize() is collective (all ranks call it)."""

    def __init__(self, device: torch.device, flops_per_token: float, peak_flops: float | None, world_size: int):
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.world_size = world_size
        self.total_tokens = 0
        self._reset()

    def _reset(self) -> None:
        self.t0 = time.perf_counter()
        self.excluded = 0.0
        self.steps = 0
        self.data_wait = 0.0
        self.tokens = 0
        self.loss_sum = torch.zeros((), device=self.device)
        self.grad_norm = torch.zeros((), device=self.device)
        self.lr = 0.0

    def exclude(self, seconds: float) -> None:
        """Time spent outside training steps (checkpointing) that must not dilute throughput."""
        self.excluded += seconds

    def add(self, out, data_wait_s: float) -> None:
        self.steps += 1
        self.data_wait += data_wait_s
        self.tokens += out.real_tokens
        self.loss_sum += out.loss.detach()
        self.grad_norm = out.grad_norm
        self.lr = out.lr

    def summarize(self, step: int) -> dict[str, Any]:
        tokens = torch.tensor([float(self.tokens)], device=self.device)
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(tokens)
        loss = (self.loss_sum / max(1, self.steps)).item()
        elapsed = time.perf_counter() - self.t0 - self.excluded
        global_tokens = int(tokens.item())
        self.total_tokens += global_tokens
        tps = global_tokens / elapsed if elapsed > 0 else 0.0
        mfu = flops_lib.mfu(tps, self.flops_per_token, self.peak_flops, self.world_size)
        out = {
            "step": step,
            "loss": round(loss, 6),
            "lr": self.lr,
            "grad_norm": round(float(self.grad_norm), 6),
            "tokens_per_s": round(tps, 1),
            "tokens_per_s_per_device": round(tps / self.world_size, 1),
            "mfu": round(mfu, 4) if mfu is not None else None,
            "step_time_s": round(elapsed / max(1, self.steps), 4),
            "data_wait_s": round(self.data_wait / max(1, self.steps), 5),
            "peak_mem_gb": round(peak_memory_gb(self.device), 3),
            "tokens_seen": self.total_tokens,
        }
        self._reset()
        return out


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated device memory on GPU; peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 2**20 if sys.platform != "darwin" else kb / 2**30


class ProgressBar:
    """A text progress bar printed as one line per logging step.

    Worker output reaches the user through Ray's log forwarding (and `ray job logs`),
    which is line-based: carriage-return animations turn into noise there.
    """

    def __init__(self, total: int, start: int, width: int = 24, emit: Callable[[str], Any] | None = None):
        self.total, self.start, self.width = max(1, total), start, width
        self.emit = emit or (lambda line: print(line, flush=True))
        self.t0 = time.perf_counter()

    def line(self, step: int, metrics: dict[str, Any]) -> str:
        frac = min(1.0, step / self.total)
        filled = int(round(frac * self.width))
        elapsed = time.perf_counter() - self.t0
        done_here = max(1, step - self.start)
        left = elapsed / done_here * (self.total - step)
        tps = metrics.get("tokens_per_s") or 0.0
        return (f"train [{'#' * filled}{'.' * (self.width - filled)}] {step:>{len(str(self.total))}}/{self.total} "
                f"{frac:4.0%} | loss {metrics['loss']:.4f} | {tps / 1000:.1f}k tok/s | "
                f"{_clock(elapsed)} elapsed, {_clock(left)} left")

    def show(self, step: int, metrics: dict[str, Any]) -> None:
        self.emit(self.line(step, metrics))


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


class MetricsWriter:
    """metrics.jsonl, TensorBoard events and the progress bar; a no-op except on rank 0."""

    def __init__(self, folder: str | Path, *, enabled: bool, start_step: int, total_steps: int, progress: bool,
                 emit: Callable[[str], Any] | None = None):
        self.enabled = enabled
        self.folder = Path(folder)
        self.bar = None
        self.tb = None
        if not enabled:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / METRICS_FILE
        _truncate_after(self.path, start_step)
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(self.folder / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)
        if progress:
            self.bar = ProgressBar(total_steps, start_step, emit=emit)

    def log(self, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        step = metrics["step"]
        for key, value in metrics.items():
            if key != "step" and isinstance(value, (int, float)) and value is not None:
                self.tb.add_scalar(f"train/{key}", value, step)
        self.tb.flush()
        if self.bar is not None:
            self.bar.show(step, metrics)

    def event(self, kind: str, **fields: Any) -> None:
        """Run lifecycle (start, resume, checkpoint, export) for humans and tests; one JSON per line."""
        if not self.enabled:
            return
        with (self.folder / EVENTS_FILE).open("a") as f:
            f.write(json.dumps({"event": kind, "time": round(time.time(), 3), **fields}) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _truncate_after(path: Path, step: int) -> None:
    """On resume, drop lines logged after the checkpoint so the file reads as one run."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
