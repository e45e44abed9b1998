"""`python -m trainer.bench harness`: the same CPU training under Ray and under torchrun.

Both paths run the loop's own setup and `run` on the local demo's tiny model and data, logging
to metrics.jsonl; the steady tokens/s after start-up tells what Ray Train's harness costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch.distributed as dist

from trainer.bench import WORKER
from trainer.bench.setups import emit, free_port
from trainer.config.flags import TrainConfig


def steady_tokens_per_s(metrics: list[dict], skip: int) -> float:
    """Mean tokens/s of the logged intervals after the first `skip` (start-up and warm-up)."""
    rows = [r["tokens_per_s"] for r in metrics[skip:]]
    if not rows:
        raise ValueError(f"only {len(metrics)} logged intervals; log more often or run more steps")
    return float(sum(rows) / len(rows))


def _harness_config(out: Path, args: argparse.Namespace) -> TrainConfig:
    from trainer.jobs import local

    local.prepare_assets(out, seed=0)
    cfg = local.demo_config(["--num-workers", str(args.workers), "--steps", str(args.steps),
                             "--global-batch-size", str(args.global_batch_size), "--seq-len", str(args.seq_len),
                             "--log-every", str(args.log_every), "--checkpoint-every", "0", "--max-failures", "0",
                             "--no-progress"], out)
    return dataclasses.replace(cfg, export=False)


def worker_main(argv: Sequence[str]) -> int:
    """One torchrun rank: the loop's own setup and run, storage in a local folder."""
    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import run
    from trainer.storage import Storage

    cfg = TrainConfig.from_dict(json.loads(argv[0]))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = setup_parallel(cfg, rank, world, int(os.environ.get("LOCAL_RANK", rank)))
    try:
        run(cfg, env, Storage.from_uri(cfg.run_uri))
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench harness",
                                description="Steady-state tokens/s of the same CPU training under Ray and torchrun.")
    p.add_argument("--address", default=None, help="Ray cluster (default: start a local one)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--skip", type=int, default=1, help="logged intervals left out as warm-up")
    p.add_argument("--out", default=None, help="folder for both runs (default: a temporary one)")
    p.add_argument("--paths", default="ray,torchrun")
    args = p.parse_args(list(argv))
    from trainer.loop.metrics import read_metrics

    root = Path(args.out or tempfile.mkdtemp(prefix="harness-")).absolute()
    results = {}
    for path in args.paths.split(","):
        out = root / path
        cfg = _harness_config(out, args)
        t0 = time.perf_counter()
        if path == "ray":
            import ray

            from trainer.jobs.launch import train

            started = not ray.is_initialized()
            if started:
                ray.init(address=args.address, num_cpus=None if args.address else max(2, args.workers),
                         logging_level="WARNING")
            try:
                result = train(cfg, quiet=True)
            finally:
                if started:
                    ray.shutdown()
            if result.error:
                emit({"setup": "ray", "error": str(result.error)[:500]})
                continue
        elif path == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.workers),
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   "-m", "trainer.bench", WORKER, json.dumps(cfg.to_dict())]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(
                Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", "")})
            if proc.returncode:
                emit({"setup": "torchrun", "error": (proc.stdout + proc.stderr)[-1500:]})
                continue
        else:
            emit({"setup": path, "error": "unknown path; use ray and/or torchrun"})
            continue
        metrics = read_metrics(out / "metrics.jsonl")
        results[path] = emit({"setup": path, "workers": args.workers, "steps": args.steps,
                              "global_batch_size": args.global_batch_size, "seq_len": args.seq_len,
                              "steady_tokens_per_s": round(steady_tokens_per_s(metrics, args.skip), 1),
                              "intervals": [r["tokens_per_s"] for r in metrics],
                              "wall_s": round(time.perf_counter() - t0, 1), "run": str(out)})
    if len(results) == 2:
        emit({"setup": "summary", "ray_vs_torchrun": round(
            results["ray"]["steady_tokens_per_s"] / results["torchrun"]["steady_tokens_per_s"], 3)})
    return 0 if len(results) == len(args.paths.split(",")) else 1
