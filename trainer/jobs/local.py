"""`python -m trainer local`: the first thing a new user runs.

Starts its own local Ray cluster on CPU (never an existing one, unless --address asks),
fine-tunes a tiny random-init Qwen2 model on a generated instruction task (reverse / sort /
upper-case a word) with the same trainer that runs on the GPU cluster, measures held-out
exact match before and after, exports the model and prints where everything is.

It takes the same training flags as `train` and `submit` (--model, --dataset, --config,
--num-workers, ...), with the demo's defaults: without --model / --dataset it builds the
tiny model and the generated data in the run folder.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

from facts.errors import EXIT_FAILED, EXIT_OK, UserError
from trainer import demo
from trainer.config.flags import ConfigError, TrainConfig, validate
from trainer.config.load import add_arguments, from_args, split_out, yaml_keys, yaml_style
from trainer.jobs.cluster import check_reachable
from trainer.jobs.launch import connect, preflight, print_notes, train
from trainer.loop.metrics import read_metrics
from trainer.run_folder import checkpoint as ckpt
from trainer.storage import location_problem

DEFAULTS = dict(num_workers=2, steps=400, seed=0, global_batch_size=32, log_every=20, checkpoint_every=200,
                max_failures=1, lr=3e-3, seq_len=128, min_lr_ratio=0.1, schedule="cosine", device="cpu")
CPU_ATTENTION = ("flash_attention_2", "flash_attention_3")  # FlashAttention kernels run on GPUs only
RUN_DEFAULTS = ("num_workers", "max_failures", "device")  # where it runs: a TRL YAML keeps these, and TRL's others
DEMO_MODEL, DEMO_DATA = "init-model", "data"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer local",
                                description="Fine-tune on a local CPU Ray cluster: by default the demo's tiny "
                                            "Qwen2 model on a generated task. Takes the training flags of "
                                            "`train` and `submit`.")
    add_arguments(p, {**DEFAULTS, "model": "the demo's tiny Qwen2 (built in the run folder)",
                      "dataset": "the demo's generated task", "micro_batch_size": "the worker's share, at most 16",
                      "warmup_steps": "a tenth of --steps, at most 40", "out": "runs/demo-<time>"})
    p.add_argument("--workers", dest="num_workers", type=int, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the flag's earlier name
    p.add_argument("--address", default=None,
                   help="connect to this Ray cluster instead of starting a local one (e.g. 127.0.0.1:6379); "
                        "RAY_ADDRESS and a running cluster are ignored without it")
    return p


def _micro_batch(global_batch: int, workers: int) -> int:
    """The demo's default needs no memory estimate: the tiny model fits any share, 16 rows at most."""
    per_rank = max(1, global_batch // max(1, workers))
    return max(d for d in range(1, min(16, per_rank) + 1) if per_rank % d == 0)


def make_config(args: argparse.Namespace, out: Path) -> TrainConfig:
    """Flags > YAML > the demo's defaults; the demo's model and data in `out` unless --model / --dataset."""
    given = dict(vars(args))
    given.pop("address", None)
    out_given = given.pop("out", None) is not None
    if out_given:  # --out wins over a YAML's output_dir, as every flag does
        given["out"] = str(out)
    explicit = set(given) | yaml_keys(given.get("config"))
    trl_yaml = yaml_style(given.get("config")) == "trl"  # a TRL recipe trains as TRL would, not as the demo
    demo_defaults = {k: v for k, v in DEFAULTS.items() if k in RUN_DEFAULTS} if trl_yaml else DEFAULTS
    defaults = {**demo_defaults, "model": str(out / DEMO_MODEL), "dataset": str(out / DEMO_DATA / "train.jsonl"),
                **({} if out_given else split_out(str(out)))}
    cfg = from_args(argparse.Namespace(**given), defaults)
    changes = {}
    if not trl_yaml and not explicit & {"micro_batch_size", "per_device_train_batch_size",
                                        "gradient_accumulation_steps"}:
        changes["micro_batch_size"] = _micro_batch(cfg.global_batch_size, cfg.num_workers)
    if not trl_yaml and not explicit & {"warmup_steps", "warmup_ratio"} and cfg.steps:
        changes["warmup_steps"] = min(40, max(0, cfg.steps // 10))
    if cfg.device != "cpu":
        raise ConfigError([f"--device {cfg.device}: `trainer local` trains on this machine's CPUs; use `trainer "
                           f"train` or `trainer submit` for GPUs"])
    if cfg.attn_implementation in CPU_ATTENTION:  # a GPU recipe's kernel: the same attention, computed by sdpa
        changes["attn_implementation"] = "sdpa"
        settings = {**cfg.sources.get("settings", {}), "attn_implementation": (
            f"{cfg.sources.get('settings', {}).get('attn_implementation', 'flag')}: {cfg.attn_implementation} is "
            f"GPU-only; sdpa on CPU (trainer local)")}
        changes["sources"] = {**cfg.sources, "settings": settings}
    cfg = dataclasses.replace(cfg, **changes)
    validate(cfg)
    return cfg


def demo_config(argv: Sequence[str], out: Path) -> TrainConfig:
    """The config `trainer local ARGV --out OUT` trains with (the harness benchmark runs it under torchrun too)."""
    return make_config(_parser().parse_args([*argv, "--out", str(out)]), out)


def run_folder(args: argparse.Namespace) -> Path:
    """--out, else --storage-path / --run-name, else runs/demo-<time>: the demo's files go there too."""
    out = getattr(args, "out", None)
    if out is None:
        out = Path(getattr(args, "storage_path", "runs")) / (getattr(args, "run_name", None)
                                                            or time.strftime("demo-%Y%m%d-%H%M%S"))
    return Path(out).expanduser().absolute()


def uses_demo_data(cfg: TrainConfig, out: Path) -> bool:
    return cfg.dataset == str(out / DEMO_DATA / "train.jsonl")


def prepare_assets(out: Path, seed: int, *, model: bool = True, data: bool = True) -> tuple[Path, list[dict]]:
    """Tiny random-init model and the generated train / held-out data, written into the run folder."""
    eval_rows: list[dict] = []
    if data:
        train_rows, eval_rows = demo.make_dataset(seed=seed)
        demo.write_jsonl(train_rows, out / DEMO_DATA / "train.jsonl")
        demo.write_jsonl(eval_rows, out / DEMO_DATA / "heldout.jsonl")
    return (demo.write_init_model(out / DEMO_MODEL, seed=seed) if model else out / DEMO_MODEL), eval_rows


def _dashboard_port(preferred: int = 8265) -> int:
    """Ray's usual dashboard port when it is free here, else any free one."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free local port for the Ray dashboard")


@contextlib.contextmanager
def own_cluster(num_cpus: int) -> Iterator:
    """A new local Ray cluster, whatever else runs here: `address="local"` never joins one, and
    RAY_ADDRESS (read by Ray's own helpers too) is hidden while it runs."""
    import ray

    saved = os.environ.pop("RAY_ADDRESS", None)
    # One CPU node cannot be preempted: Ray Train's preemption watcher would only print an
    # internal error-level line (its actor's restart policy) into the demo's output.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # Ray gives each dashboard module 30 s to start; a busy laptop or CI machine can need more.
    os.environ.setdefault("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", "180")
    # The dashboard serves the State API that Ray Train's placement-group cleaner polls to learn whether
    # the run's controller lives. Left to itself the cleaner finds "the" cluster through
    # /tmp/ray/ray_current_cluster, which names whatever `ray start` ran last: another live cluster
    # (where the controller is unknown, so the cleaner removes this run's placement group) or a dead one
    # (its thread dies with a traceback). RAY_API_SERVER_ADDRESS points every process of the run here.
    port = _dashboard_port()
    try:
        yield ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_port=port,
                       runtime_env={"env_vars": {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{port}"}},
                       logging_level="WARNING")
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def _evaluate(path: Path | str, rows: list[dict]) -> float:
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
    out = run_folder(args)
    cfg = make_config(args, out)  # validate the flags before writing anything
    where = location_problem(str(out))
    if where:
        raise ConfigError([f"--out {out}: {where}"])
    if args.address:
        check_reachable(args.address)

    _quiet_libraries()
    info, init_model, eval_rows = _prepare(cfg, out)
    before = _evaluate(init_model, eval_rows) if eval_rows else None
    if before is not None:
        print(f"[2/5] held-out exact match before training: {before:.1%} ({len(eval_rows)} examples)", flush=True)
    else:
        print("[2/5] no held-out set (not the demo's data): skipping exact match", flush=True)

    error, t_train = _train_on_a_cluster(args.address, cfg, info)
    train_s = time.perf_counter() - t_train  # the cluster is down again: the CPUs are free for the evaluation
    if error:
        print(f"error: training failed: {error}", file=sys.stderr)
        return EXIT_FAILED

    model_dir = Path(cfg.run_uri) / "model"
    after = _evaluate(model_dir, eval_rows) if eval_rows and cfg.export else None
    if after is not None:
        print(f"[4/5] held-out exact match after training: {after:.1%}", flush=True)
    else:
        print("[4/5] trained", flush=True)
    print("[5/5] done in {:.0f} s (training job {:.0f} s)".format(time.perf_counter() - t_start, train_s))
    if after is not None:
        for prompt, want, got in _samples(model_dir, eval_rows):
            print(f"      {prompt!r:>24} -> {got!r} (expected {want!r})")
    exact = [f"  exact match   {before:.1%} -> {after:.1%} on {len(eval_rows)} held-out prompts"] if after is not None \
        else []
    print("\n" + "\n".join(line for line in exact + _summary(cfg, model_dir) if line))
    return EXIT_OK


def _prepare(cfg: TrainConfig, out: Path) -> tuple[dict, Path | str, list[dict]]:
    """Step 1: the demo's model and data where the run uses them, then the pre-flight (the preflight's info,
    the model trained from, the held-out rows). A refused pre-flight removes a folder this step created."""
    demo_model, demo_data = cfg.model == str(out / DEMO_MODEL), uses_demo_data(cfg, out)
    what = " and ".join(w for w, on in (("the tiny Qwen2 model", demo_model), ("the instruction data", demo_data)) if on)
    print(f"[1/5] preparing {what or 'the run'} in {out}", flush=True)
    created = not out.exists()
    init_model, eval_rows = prepare_assets(out, cfg.seed, model=demo_model, data=demo_data)
    if not demo_model:  # the user's own model (a folder or a hub id) is what the held-out set evaluates first
        init_model = Path(cfg.model).expanduser() if Path(cfg.model).expanduser().exists() else cfg.model
    try:
        info = preflight(cfg, data_later=True)  # the data is prepared on the cluster, once it is up
    except UserError:
        if created:  # nothing half-created: the demo's files go again with the folder they were made in
            shutil.rmtree(out, ignore_errors=True)
        raise
    print_notes(info)
    return info, init_model, eval_rows


def _train_on_a_cluster(address: str | None, cfg: TrainConfig, info: dict) -> tuple[str | None, float]:
    """Step 3: the training job on the cluster at `address`, else on a local one of its own.

    Its error (None when it succeeded) and the perf_counter time it started at."""
    import ray

    with contextlib.ExitStack() as stack:
        if address:
            ctx = None  # a driver already connected (a test's session cluster) stays connected
            if not ray.is_initialized():
                ctx = connect(address, logging_level="WARNING")
                stack.callback(ray.shutdown)
            where = f"the Ray cluster at {address}"
        else:
            ctx = stack.enter_context(own_cluster(max(2, cfg.num_workers)))
            where = "a local Ray cluster of its own"
        dashboard = f"http://{ctx.dashboard_url}" if getattr(ctx, "dashboard_url", None) else "n/a"
        print(f"[3/5] training on {where} (dashboard {dashboard}): {cfg.num_workers} CPU workers (gloo), "
              f"{cfg.steps or f'{cfg.epochs or 1} epoch(s) of'} steps, global batch {cfg.global_batch_size} x "
              f"{cfg.seq_len} tokens", flush=True)
        t_train = time.perf_counter()
        try:
            result = train(cfg, check=False, quiet=True, found=info)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - Ray raises the workers' error from fit()
            return str(e), t_train
    return result.error or None, t_train


def _summary(cfg: TrainConfig, model_dir: Path) -> list[str]:
    """Where the run's results are: loss, throughput, the run folder's metrics, checkpoints and model."""
    run = Path(cfg.run_uri)
    metrics = read_metrics(run / "metrics.jsonl")
    checkpoints = ckpt.names(run)
    return [
        f"  loss          {metrics[0]['loss']:.3f} (step {metrics[0]['step']}) -> {metrics[-1]['loss']:.3f} "
        f"(step {metrics[-1]['step']})",
        f"  throughput    {metrics[-1]['tokens_per_s']:.0f} tokens/s",
        f"  run folder    {run}",
        f"  metrics       {run / 'metrics.jsonl'}",
        f"  tensorboard   tensorboard --logdir {run / 'tensorboard'}" if "tensorboard" in cfg.reporters else "",
        f"  checkpoints   {', '.join(checkpoints) or 'none'}",
        f"  model         {model_dir}   (AutoModelForCausalLM.from_pretrained)" if cfg.export else "",
        f"  data          {cfg.dataset}",
    ]
