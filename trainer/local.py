"""`python -m trainer local`: the first thing a new user runs.

Starts a local Ray cluster on CPU, fine-tunes a tiny random-init Qwen2 model on a
generated instruction task (reverse / sort / upper-case a word) with the same trainer
that runs on the GPU cluster, measures held-out exact match before and after, exports
the model and prints where everything is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from trainer import demo
from trainer.config import ConfigError, TrainConfig, micro_batch_value, split_out, validate

DEFAULTS = dict(workers=2, steps=400, seed=0, global_batch_size=32, log_every=20, checkpoint_every=200,
                max_failures=1, lr=3e-3, seq_len=128)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer local",
                                description="Fine-tune a tiny Qwen2 model on a local CPU Ray cluster.")
    p.add_argument("--workers", type=int, default=DEFAULTS["workers"], help="training workers (CPU processes)")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="optimizer steps")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seed for data, init and order")
    p.add_argument("--global-batch-size", type=int, default=DEFAULTS["global_batch_size"],
                   help="packed sequences per step, whatever the number of workers")
    p.add_argument("--micro-batch-size", type=micro_batch_value, default=None,
                   help="sequences per forward pass: a positive integer, or auto for the largest that fits in "
                        "memory (default: each worker's share per step, at most 16)")
    p.add_argument("--seq-len", type=int, default=DEFAULTS["seq_len"], help="packed sequence length")
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="peak learning rate")
    p.add_argument("--log-every", type=int, default=DEFAULTS["log_every"], help="log metrics every N steps")
    p.add_argument("--checkpoint-every", type=int, default=DEFAULTS["checkpoint_every"],
                   help="save a checkpoint every N steps")
    p.add_argument("--max-failures", type=int, default=DEFAULTS["max_failures"],
                   help="restarts from the last checkpoint Ray Train attempts")
    p.add_argument("--out", default=None, help="run folder (default: runs/demo-<time>); metrics, checkpoints, model")
    p.add_argument("--address", default=None,
                   help="connect to this Ray cluster instead of starting a local one (e.g. 127.0.0.1:6379)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _micro_batch(global_batch: int, workers: int, requested: int | str | None) -> int | str:
    """The demo's default needs no memory estimate: the tiny model fits any share, 16 rows at most."""
    if requested is not None:
        return requested
    per_rank = max(1, global_batch // max(1, workers))
    return max(d for d in range(1, min(16, per_rank) + 1) if per_rank % d == 0)


def make_config(args: argparse.Namespace, out: Path) -> TrainConfig:
    cfg = TrainConfig(
        model=str(out / "init-model"),
        dataset=str(out / "data" / "train.jsonl"),
        seq_len=args.seq_len,
        global_batch_size=args.global_batch_size,
        micro_batch_size=_micro_batch(args.global_batch_size, args.workers, args.micro_batch_size),
        steps=args.steps,
        lr=args.lr,
        min_lr_ratio=0.1,
        warmup_steps=min(40, max(0, args.steps // 10)),
        schedule="cosine",
        seed=args.seed,
        log_every=args.log_every,
        checkpoint_every=args.checkpoint_every,
        max_failures=args.max_failures,
        num_workers=args.workers,
        device="cpu",
        progress=not args.no_progress,
        **split_out(str(out)),
    )
    validate(cfg)
    return cfg


def prepare_assets(out: Path, seed: int) -> tuple[Path, list[dict]]:
    """Tiny random-init model and the generated train / held-out data, written into the run folder."""
    train_rows, eval_rows = demo.make_dataset(seed=seed)
    demo.write_jsonl(train_rows, out / "data" / "train.jsonl")
    demo.write_jsonl(eval_rows, out / "data" / "heldout.jsonl")
    return demo.write_init_model(out / "init-model", seed=seed), eval_rows


def _evaluate(path: Path, rows: list[dict]) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path))
    return demo.exact_match(model, AutoTokenizer.from_pretrained(str(path)), rows)


def _samples(path: Path, rows: list[dict], n: int = 3) -> list[tuple[str, str, str]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    out = []
    for r in rows[:n]:
        prompt = tok.apply_chat_template(r["messages"][:-1], tokenize=False, add_generation_prompt=True)
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        out.append((r["messages"][0]["content"], r["messages"][-1]["content"],
                    tok.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)))
    return out


def _quiet_libraries() -> None:
    """No per-file progress bars from transformers / huggingface_hub in the demo's output."""
    import huggingface_hub.utils
    import transformers

    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    t_start = time.perf_counter()
    out = Path(args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")).expanduser().absolute()
    try:
        make_config(args, out)  # validate the flags before writing anything
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    _quiet_libraries()
    print(f"[1/5] preparing the tiny Qwen2 model and the instruction data in {out}", flush=True)
    init_model, eval_rows = prepare_assets(out, args.seed)
    cfg = make_config(args, out)

    from trainer.launch import preflight, train

    preflight(cfg)
    before = _evaluate(init_model, eval_rows)
    print(f"[2/5] held-out exact match before training: {before:.1%} ({len(eval_rows)} examples)", flush=True)

    import ray

    if args.address:
        ctx = ray.init(address=args.address, logging_level="WARNING")
        where = f"the Ray cluster at {args.address}"
    else:
        # One CPU node cannot be preempted: Ray Train's preemption watcher would only print an
        # internal error-level line (its actor's restart policy) into the demo's output.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        # The dashboard serves the State API that Ray Train's placement-group cleaner polls.
        ctx = ray.init(num_cpus=max(2, args.workers), include_dashboard=True, logging_level="WARNING")
        where = "a local Ray cluster"
    dashboard = f"http://{ctx.dashboard_url}" if getattr(ctx, "dashboard_url", None) else "n/a"
    print(f"[3/5] training on {where} (dashboard {dashboard}): {cfg.num_workers} CPU workers (gloo), "
          f"{cfg.steps} steps, global batch {cfg.global_batch_size} x {cfg.seq_len} tokens", flush=True)
    t_train = time.perf_counter()
    try:
        result = train(cfg, check=False, quiet=True)
    except Exception as e:  # noqa: BLE001 - Ray raises the workers' error from fit()
        print(f"error: training failed: {e}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()  # frees the CPUs for the evaluation; a local cluster stops here
    train_s = time.perf_counter() - t_train
    if result.error:
        print(f"error: training failed: {result.error}", file=sys.stderr)
        return 1

    model_dir = out / "model"
    after = _evaluate(model_dir, eval_rows)
    print(f"[4/5] held-out exact match after training: {after:.1%}", flush=True)
    from trainer.metrics import read_metrics

    metrics = read_metrics(out / "metrics.jsonl")
    checkpoints = sorted(p.name for p in out.glob("checkpoint_0*") if p.is_dir())
    print("[5/5] done in {:.0f} s (training job {:.0f} s)".format(time.perf_counter() - t_start, train_s))
    for prompt, want, got in _samples(model_dir, eval_rows):
        print(f"      {prompt!r:>24} -> {got!r} (expected {want!r})")
    print(f"""
  exact match   {before:.1%} -> {after:.1%} on {len(eval_rows)} held-out prompts
  loss          {metrics[0]['loss']:.3f} (step {metrics[0]['step']}) -> {metrics[-1]['loss']:.3f} (step {metrics[-1]['step']})
  throughput    {metrics[-1]['tokens_per_s']:.0f} tokens/s
  run folder    {out}
  metrics       {out / 'metrics.jsonl'}
  tensorboard   tensorboard --logdir {out / 'tensorboard'}
  checkpoints   {', '.join(checkpoints) or 'none'}
  model         {model_dir}   (AutoModelForCausalLM.from_pretrained)
  data          {out / 'data'}""")
    return 0
