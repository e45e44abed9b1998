"""Training metrics: interval accounting on every rank; files, backends and a progress bar on rank 0.

Nothing here synchronises the device or the ranks on ordinary steps: losses stay on the
device and are summed there; the one all-reduce (real tokens of all ranks, plus rank 0's
vote on reporting to Ray) and the one host sync (.item()) happen at logging steps only.

Backends (--report-to): tensorboard (default), wandb and mlflow through their own clients,
optional installs; metrics.jsonl is always written. wandb reads WANDB_PROJECT, WANDB_MODE
(offline), WANDB_API_KEY; mlflow reads MLFLOW_TRACKING_URI (default: mlruns/ in the run
folder) and MLFLOW_EXPERIMENT_NAME. A resumed run continues the same wandb/mlflow run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from trainer.model import flops as flops_lib

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
BACKEND_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
DEFAULT_PROJECT = "raytrain"


class IntervalTracker:
    """Accumulates one logging interval; summarize() is collective (all ranks call it)."""

    def __init__(self, device: torch.device, flops_per_token: float, peak_flops: float | None, world_size: int):
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.world_size = world_size
        self.total_tokens = 0
        self.vote = False
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

    def summarize(self, step: int, vote: bool = False) -> dict[str, Any]:
        """The interval's metrics; `vote` (rank 0's) comes back to every rank as self.vote, in the same all-reduce."""
        tokens = torch.tensor([float(self.tokens), float(vote)], device=self.device)
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(tokens)
        self.vote = bool(tokens[1].item() > 0)
        loss = (self.loss_sum / max(1, self.steps)).item()
        elapsed = time.perf_counter() - self.t0 - self.excluded
        global_tokens = int(tokens[0].item())
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


class RayReportBudget:
    """When reporting metrics to Ray is cheap: its cost (a barrier, ~2 s) under `share` of the time since."""

    def __init__(self, share: float = 0.05):
        self.share = share
        self.cost: float | None = None
        self.since = time.perf_counter()

    def wanted(self) -> bool:
        return self.cost is None or self.cost <= self.share * (time.perf_counter() - self.since)

    def timed(self, report: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        report()
        self.since = time.perf_counter()
        self.cost = self.since - t0


def missing_backends(names: Sequence[str]) -> list[str]:
    """The --report-to backends whose package is not installed here."""
    return [n for n in names if n in BACKEND_PACKAGES and importlib.util.find_spec(BACKEND_PACKAGES[n]) is None]


WANDB_MODES = ("online", "offline", "dryrun", "disabled", "shared", "run")  # wandb_settings.Settings.mode


def credential_problems(names: Sequence[str], environ: dict | None = None) -> list[str]:
    """What a --report-to backend will refuse on the workers for want of credentials, found before Ray.

    wandb: WANDB_MODE must be one it knows; online (its default), it needs an API key
    (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or a netrc entry for its host, as `wandb login`
    writes), else wandb.init raises UsageError on every worker; offline or disabled it needs none.
    """
    env = os.environ if environ is None else environ
    if "wandb" not in names:
        return []
    mode = (env.get("WANDB_MODE") or "online").strip().lower()
    if mode not in WANDB_MODES:
        return [f"--report-to wandb: WANDB_MODE={mode[:40]!r} is not a wandb mode; set it to one of "
                f"{', '.join(WANDB_MODES[:4])}"]
    if mode in ("offline", "dryrun", "disabled"):
        return []
    token_file = env.get("WANDB_IDENTITY_TOKEN_FILE")
    if env.get("WANDB_API_KEY", "").strip() or (token_file and Path(token_file).is_file()) or _netrc_has(env):
        return []
    host = env.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    return [f"--report-to wandb: no wandb credentials (WANDB_MODE {mode}): neither WANDB_API_KEY, "
            f"WANDB_IDENTITY_TOKEN_FILE nor a netrc entry for {host} is set, so wandb.init would fail on every "
            f"worker; set WANDB_API_KEY (with `trainer submit`, --env WANDB_API_KEY=...), run `wandb login`, "
            f"or set WANDB_MODE=offline"]


def _netrc_has(env: dict) -> bool:
    """Whether the netrc file wandb reads (NETRC, else ~/.netrc) holds a password for wandb's host."""
    import netrc
    from urllib.parse import urlsplit

    path = env.get("NETRC") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".netrc")
    host = urlsplit(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    try:
        found = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(found and found[2])


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardBackend:
    def __init__(self, folder: Path, start_step: int, **_):
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(folder / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for key, value in _scalars(metrics).items():  # eval_loss -> eval/loss, as transformers' Trainer names it
            self.tb.add_scalar(f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}", value, step)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()


class WandbBackend:
    """One wandb run per run name (its id), resumed by a resubmitted run."""

    def __init__(self, folder: Path, start_step: int, run_name: str, config: dict, **_):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), name=run_name,
                              id=re.sub(r"[^A-Za-z0-9_-]", "-", run_name)[:64], resume="allow", config=config,
                              dir=str(folder))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log({f"train/{k}": v for k, v in _scalars(metrics).items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowBackend:
    """One MLflow run per run name in MLFLOW_EXPERIMENT_NAME, found again by its name when resumed."""

    def __init__(self, folder: Path, start_step: int, run_name: str, config: dict, **_):
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a file store in the run folder (MLflow keeps it, in maintenance mode, behind this switch)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (folder / MLFLOW_DIR).absolute().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_PROJECT)
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`mlflow.runName` = '{run_name}'",
                                        max_results=1)
        if found:
            self.run_id = found[0].info.run_id
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in config.items()])

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in _scalars(metrics).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS = {"tensorboard": TensorBoardBackend, "wandb": WandbBackend, "mlflow": MlflowBackend}


class MetricsWriter:
    """metrics.jsonl, the --report-to backends and the progress bar; a no-op except on rank 0."""

    def __init__(self, folder: str | Path, *, enabled: bool, start_step: int, total_steps: int, progress: bool,
                 emit: Callable[[str], Any] | None = None, reporters: Sequence[str] = ("tensorboard",),
                 run_name: str = "run", config: dict | None = None):
        self.enabled = enabled
        self.folder = Path(folder)
        self.bar = None
        self.backends: list = []
        if not enabled:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / METRICS_FILE
        _truncate_after(self.path, start_step)
        for name in reporters:
            self.backends.append(BACKENDS[name](self.folder, start_step, run_name=run_name, config=config or {}))
        if progress:
            self.bar = ProgressBar(total_steps, start_step, emit=emit)

    def log(self, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        for backend in self.backends:
            backend.log(metrics, metrics["step"])
        if self.bar is not None and "loss" in metrics:  # (an eval-only line has no training loss)
            self.bar.show(metrics["step"], metrics)

    def event(self, kind: str, **fields: Any) -> None:
        """Run lifecycle (start, resume, checkpoint, export) for humans and tests; one JSON per line."""
        if not self.enabled:
            return
        with (self.folder / EVENTS_FILE).open("a") as f:
            f.write(json.dumps({"event": kind, "time": round(time.time(), 3), **fields}) + "\n")

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
        self.backends = []


def _truncate_after(path: Path, step: int) -> None:
    """On resume, drop lines logged after the checkpoint so the file reads as one run."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
