"""The per-worker training function that Ray Train runs on every rank.

    setup: device + mesh -> model (sharded) -> optimizer/schedule -> micro-batch size -> resume
    loop:  data -> step -> metrics every log_every -> checkpoint every checkpoint_every
    end:   final checkpoint -> Hugging Face export

`train_func` is the Ray entry point; `run` holds the loop and receives Ray only through
`reporter` and the run storage, so the loop reads top to bottom.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainer import checkpoint as ckpt
from trainer import flops as flops_lib
from trainer import record as run_record
from trainer.config import ConfigError, TrainConfig
from trainer.data import DataSpec, PackedData, prepare
from trainer.data import summary as data_summary
from trainer.metrics import (EVENTS_FILE, METRICS_FILE, MLFLOW_DIR, TENSORBOARD_DIR, IntervalTracker, MetricsWriter,
                             RayReportBudget)
from trainer.model import (build_model, build_optimizer, build_scheduler, enable_activation_checkpointing,
                           load_tokenizer, resolve_model_path)
from trainer.resume import INPUTS_KEY
from trainer.step import StepHealth, TrainingDiverged, check_loss_path, choose_micro_batch, resolve_loss, train_step
from trainer.storage import Storage

log = logging.getLogger("trainer")

CHAT_TEMPLATE_KEY = "chat_template_text"  # train_loop_config key: --chat-template's text, read by the driver
DATA_COUNTS = ("records", "documents", "rows", "truncated", "dropped", "drop_reasons", "too_long", "longest_tokens",
               "longest_record")
LOSS = "auto"  # train_step's loss, also the one the micro-batch probe runs (they must use the same memory)


class InjectedFailure(RuntimeError):
    """Raised by --fail-at-step to exercise Ray Train's restart-from-checkpoint path."""


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: Any
    local_world_size: int = 1  # ranks on this rank's host (they share its memory)


def setup_parallel(cfg: TrainConfig, rank: int, world_size: int, local_rank: int,
                   device: torch.device | None = None) -> WorkerEnv:
    """Device and FSDP mesh over the process group Ray Train created (NCCL on GPU, gloo on CPU).

    Full sharding: a 1-D mesh over every rank. Hybrid sharding: a 2-D (replicate, shard)
    mesh, sharded inside a node and replicated across nodes, nodes told apart by the
    ranks' hostnames (trainer.model.plan_sharding; --sharding auto weighs the estimate).
    """
    import socket

    from torch.distributed.device_mesh import init_device_mesh

    from trainer.model import plan_sharding, read_model_config

    if cfg.use_gpu:
        device = device or torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    hosts: list = [None] * world_size
    if dist.is_initialized() and world_size > 1:
        dist.all_gather_object(hosts, socket.gethostname())
    else:
        hosts = [socket.gethostname()] * world_size
    params = None
    if cfg.instance_type:  # only the communication estimate needs the model's size
        try:
            params = flops_lib.parameter_count(read_model_config(cfg.model))
        except Exception:  # noqa: BLE001 - the estimate is then per 1B parameters
            pass
    # With --micro-batch-size auto the micro-batch is chosen only after the model is sharded, so the
    # estimate counts 1 micro-batch per step: the fewest, i.e. the least full-sharding traffic (hybrid
    # is then taken only where it wins even so).
    micro_batches = 1 if cfg.micro_batch_auto else cfg.grad_accum_steps
    try:
        plan = plan_sharding(cfg.sharding, world_size, hosts, shard_size=cfg.shard_size,
                             instance_type=cfg.instance_type, micro_batches=micro_batches, params=params,
                             param_bytes=2 if cfg.use_gpu else 4)
    except ValueError as e:  # the workers' placement does not fit the sharding asked for: a user error
        raise ConfigError([f"--sharding {cfg.sharding} / --shard-size {cfg.shard_size}: {e}"]) from None
    mesh = init_device_mesh(device.type, plan.mesh_shape, mesh_dim_names=plan.mesh_dim_names)
    if rank == 0:
        log.info("sharding: %s, mesh %s over %d node(s) (%s)", plan.kind,
                 " x ".join(f"{n}={k}" for n, k in zip(plan.mesh_dim_names, plan.mesh_shape)), plan.nodes, plan.reason)
    return WorkerEnv(rank, world_size, local_rank, device, mesh, local_world_size=hosts.count(hosts[rank]))


def transport_check(cfg: TrainConfig, env: WorkerEnv) -> None:
    """Hook after the first collectives: verifies the inter-node transport (NCCL over EFA).

    No-op on CPU/gloo. On GPUs every rank reads its own NCCL_DEBUG_FILE (set by
    `trainer submit`), the verdicts are gathered, rank 0 logs one line per node, and with
    EFA required (TRAINER_REQUIRE_EFA, by default when the job spans nodes) every rank
    raises if any rank fell back to TCP sockets, so the job fails in its first step.
    """
    if not cfg.use_gpu:
        return
    from trainer import efa

    def gather(obj):
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, obj)
        return everyone

    report, required = efa.gather_report(gather)
    if env.rank == 0:
        for line in efa.verdict_lines(report) or ["EFA check: no NCCL transport lines (NCCL_DEBUG_FILE not set?)"]:
            log.info(line)
    efa.enforce_efa(report.ranks, required, missing=report.missing)


def run(cfg: TrainConfig, env: WorkerEnv, storage: Storage, *,
        latest_checkpoint: str | None = None,
        reporter: Callable[[dict, str | None], None] | None = None,
        preemption: Callable[[], Any] | None = None, chat_template: str | None = None,
        inputs: dict | None = None) -> dict:
    """Train to the configured number of steps; returns the last logged metrics.

    `preemption` (ray.train.get_preemption_info under Ray) is asked at every logging step,
    on every rank (it is a barrier); once it reports a node about to be reclaimed, a
    checkpoint is saved right away, so the restart loses at most those steps. `chat_template`
    (the text of --chat-template, read by the driver) replaces the tokenizer's; `inputs` (the
    driver's trainer.resume.inputs) go into run.json.
    """
    rank0 = env.rank == 0
    cache_dir = cfg.resolved_cache_dir
    torch.manual_seed(cfg.seed)

    # -- model, tokenizer, data (downloaded / tokenized once per node)
    # s3:// inputs go through the run storage's filesystem when that is remote (same endpoint/credentials)
    remote_fs = None if storage.is_local else storage.fs
    model_path = resolve_model_path(cfg.model, cache_dir, storage_fs=remote_fs)
    tokenizer = load_tokenizer(resolve_model_path(cfg.tokenizer, cache_dir, storage_fs=remote_fs)
                               if cfg.tokenizer else model_path)
    if chat_template:
        tokenizer.chat_template = chat_template
    data: PackedData = prepare(DataSpec.from_config(cfg), tokenizer=tokenizer, seq_len=cfg.seq_len,
                               cache_dir=cache_dir, storage_fs=remote_fs)
    steps = cfg.total_steps(data.steps_per_epoch(cfg.global_batch_size))
    data.step_rows(0, cfg.global_batch_size, cfg.seed)  # fails early if the data is smaller than one batch

    model = build_model(model_path, device=env.device, use_gpu=cfg.use_gpu, mesh=env.mesh,
                        attn_implementation=cfg.attn_implementation,
                        activation_checkpointing=cfg.activation_checkpointing, seed=cfg.seed,
                        random_init=cfg.random_init)
    check_loss_path(model, resolve_loss(LOSS, env.device), env.device)  # before the micro-batch probe measures it
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=cfg.use_gpu)
    scheduler = build_scheduler(optimizer, warmup=cfg.warmup_for(steps), total=steps,
                                schedule=cfg.schedule, min_ratio=cfg.min_lr_ratio)
    fit = resolve_micro_batch(cfg, model, optimizer, env)  # before resume: the optimizer holds no state yet
    micro = fit["micro_batch_size"]

    # -- resume
    start = 0
    resume_from = ckpt.resume_point(storage, latest_checkpoint)
    if resume_from:
        state = ckpt.load(storage, resume_from, model, optimizer, scheduler)
        start = state["step"]
        if rank0:
            log.info("resumed from %s at step %d", storage.path(resume_from), start)
            if state.get("data_fingerprint") not in (None, data.fingerprint):
                log.warning("the packed data differs from the checkpoint's (dataset, tokenizer or --seq-len "
                            "changed): the data order after step %d is not the original run's", start)

    # -- metrics
    metrics_dir = _metrics_dir(cfg, storage, rank0)
    # Inside Ray Train the logger reaches the driver once; a print would arrive twice (Ray's print patch).
    emit = log.info if log.isEnabledFor(logging.INFO) and log.hasHandlers() else None
    writer = MetricsWriter(metrics_dir, enabled=rank0, start_step=start, total_steps=steps,
                           progress=cfg.progress, emit=emit, reporters=cfg.reporters,
                           run_name=cfg.resolved_run_name, config=cfg.to_dict())
    ray_budget = RayReportBudget()
    fpt = flops_lib.flops_per_token(model.config, cfg.seq_len)
    tracker = IntervalTracker(env.device, fpt, flops_lib.device_peak_flops(cfg.peak_tflops), env.world_size)
    notes = data_summary(data.meta, cfg.overlong)
    writer.event("resume" if resume_from else "start", step=start, world_size=env.world_size,
                 checkpoint=storage.path(resume_from) if resume_from else None, total_steps=steps,
                 micro_batch_size=micro, grad_accum_steps=cfg.grad_accum_for(micro), micro_batch=fit,
                 data={k: data.meta.get(k) for k in DATA_COUNTS}, data_notes=notes)
    record = run_record.write_run_record(storage, cfg, device=env.device, rank=env.rank, world_size=env.world_size,
                                         data_meta=data.meta, data_key=data.fingerprint, start_step=start,
                                         total_steps=steps, inputs=inputs)
    if rank0:
        for note in notes:
            log.warning("data: %s", note)
        log.info("training %s for %d steps (start %d): %d workers x %d micro-batches x %d sequences of %d tokens",
                 cfg.model, steps, start, env.world_size, cfg.grad_accum_for(micro), micro, cfg.seq_len)

    last: dict = {}
    saved_for_preemption = False
    health = StepHealth(env.device)
    for step in range(start, steps):
        t0 = time.perf_counter()
        batches = data.micro_batches(step, rank=env.rank, world_size=env.world_size,
                                     global_batch=cfg.global_batch_size, micro_batch=micro, seed=cfg.seed)
        data_wait = time.perf_counter() - t0
        if cfg.fail_at_step and step + 1 == cfg.fail_at_step and not resume_from:
            raise InjectedFailure(f"--fail-at-step {cfg.fail_at_step}: injected failure (testing aid)")

        out = train_step(model, optimizer, scheduler, batches, device=env.device, grad_clip=cfg.grad_clip,
                         loss=LOSS)
        done = step + 1
        if step == start:
            transport_check(cfg, env)
        tracker.add(out, data_wait)
        health.add(done, out)

        log_now = done % cfg.log_every == 0 or done == steps
        save_now = (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == steps
        if step == start or log_now or save_now:  # never log, save or export an unhealthy model
            _check_health(health, writer, storage, metrics_dir, rank0, done)
        if log_now:
            last = {**tracker.summarize(done, vote=rank0 and ray_budget.wanted()),
                    "epoch": data.position(done, cfg.global_batch_size)["epoch"]}
            writer.log(last)
            if reporter and tracker.vote and not save_now:  # a barrier: only when rank 0 found it cheap
                ray_budget.timed(lambda: reporter(last, None))
                tracker.exclude(ray_budget.cost)
        if log_now and preemption and not (save_now or saved_for_preemption):
            notice = preemption()
            if notice is not None:
                save_now = saved_for_preemption = True
                _record_preemption_notice(writer, rank0, done, notice)
        if save_now:
            t_save = time.perf_counter()
            try:
                path = ckpt.save(storage, done, model, optimizer, scheduler,
                                 data.position(done, cfg.global_batch_size),
                                 extra={"data_fingerprint": data.fingerprint, "total_steps": steps},
                                 keep=cfg.num_to_keep)
            except ckpt.CheckpointError as e:
                _record_failed_save(writer, storage, metrics_dir, rank0, done, e)
                raise
            writer.event("checkpoint", step=done, path=path)
            if rank0 and not storage.is_local:
                _upload_metrics(storage, metrics_dir)
            if reporter:  # ray.train.report is a barrier: with checkpoints, and at logging steps where cheap
                ray_budget.timed(lambda: reporter({**last, "checkpoint_step": done}, path))
            tracker.exclude(time.perf_counter() - t_save)

    if cfg.export:
        card = run_record.model_card(record, last, steps, data.tokens_through(steps, cfg.global_batch_size, cfg.seed)) \
            if rank0 else None
        exported = ckpt.export_hf(storage, model, tokenizer, source=model_path, card=card)
        writer.event("export", step=steps, path=exported)
    writer.close()
    if rank0 and not storage.is_local:
        _upload_metrics(storage, metrics_dir)
    return last


def resolve_micro_batch(cfg: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        env: WorkerEnv) -> dict:
    """The micro-batch this run uses and how it was found (recorded in the start/resume event).

    `auto`: the largest divisor of this rank's rows per step that fits, measured on a GPU and
    estimated on a CPU from the host memory shared by this host's ranks; every rank calls it
    (the probes and the minimum across ranks are collectives). When not even one sequence
    fits, activation checkpointing is turned on (memory forces it) and the fit found again.
    """
    if not cfg.micro_batch_auto:
        return {"micro_batch_size": int(cfg.micro_batch_size), "source": "configured"}

    def choose() -> dict:
        fit = choose_micro_batch(model, optimizer, rows=cfg.global_batch_size // env.world_size,
                                 seq_len=cfg.seq_len, device=env.device, loss=LOSS,
                                 ranks_per_host=env.local_world_size)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in fit.items()}

    fit = choose()
    if not fit["fits"] and not fit["activation_checkpointing"]:
        needed = fit["fixed_gib"] + fit["per_row_gib"]
        enable_activation_checkpointing(model)
        fit = {**choose(), "activation_checkpointing_reason":
               f"one sequence needs {needed:.2f} GiB without it, the budget is {fit['budget_gib']:.2f} GiB"}
        if env.rank == 0:
            log.warning("activation checkpointing turned on: %s", fit["activation_checkpointing_reason"])
    if env.rank == 0:
        log.info("micro-batch: %d sequences (auto, %s: %.4f GiB per sequence + %.4f GiB fixed, budget %.2f GiB "
                 "per rank, %d rank(s) on this host)", fit["micro_batch_size"], fit["source"], fit["per_row_gib"],
                 fit["fixed_gib"], fit["budget_gib"], fit["ranks_per_host"])
        if not fit["fits"]:
            log.warning("one sequence of %d tokens may not fit even with activation checkpointing (%.2f GiB "
                        "needed, %.2f GiB budget): lower --seq-len, or add workers to shard the model further",
                        cfg.seq_len, fit["fixed_gib"] + fit["per_row_gib"], fit["budget_gib"])
    return fit


def _check_health(health: StepHealth, writer: MetricsWriter, storage: Storage, metrics_dir: Path, rank0: bool,
                  step: int) -> None:
    """Raises TrainingDiverged naming the first step with a NaN/Inf loss or an all-zero gradient; the event log says so."""
    try:
        health.check()
    except TrainingDiverged as e:
        writer.event("stopped", step=step, error=str(e))
        if rank0:
            log.error("%s", e)
            if not storage.is_local:
                _upload_metrics(storage, metrics_dir)
        raise


def _record_preemption_notice(writer: MetricsWriter, rank0: bool, step: int, notice: Any) -> None:
    """`notice`: a ray.train.PreemptionInfo."""
    ranks, deadline_ms = notice.preempted_ranks, notice.deadline_ms
    writer.event("preemption_notice", step=step, ranks=ranks, deadline_ms=deadline_ms)
    if rank0:
        left = f", {deadline_ms / 1000 - time.time():.0f} s left" if deadline_ms else ""
        log.warning("node(s) of rank(s) %s about to be reclaimed%s: saving a checkpoint at step %d", ranks, left, step)


def _metrics_dir(cfg: TrainConfig, storage: Storage, rank0: bool) -> Path:
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


def _record_failed_save(writer: MetricsWriter, storage: Storage, metrics_dir: Path, rank0: bool, step: int,
                        error: Exception) -> None:
    """The run's event log names the failed save and why, even when the run then stops.

    Every rank waits for rank 0 to store the log: Ray stops the whole worker group as soon
    as one rank's error reaches it.
    """
    writer.event("checkpoint_failed", step=step, error=str(error))
    if rank0:
        log.error("%s", error)
        if not storage.is_local:
            try:
                _upload_metrics(storage, metrics_dir)
            except Exception as upload_error:  # noqa: BLE001 - the storage may be what is failing
                log.error("could not upload the event log after the failed save either: %s", upload_error)
    if dist.is_initialized():
        try:
            dist.barrier()
        except Exception as barrier_error:  # noqa: BLE001 - the save's error is the one to raise
            log.warning("ranks did not meet after the failed save: %s", barrier_error)


def _upload_metrics(storage: Storage, folder: Path) -> None:
    for name in (METRICS_FILE, EVENTS_FILE):
        if (folder / name).is_file():
            storage.upload_file(folder / name, name)
    for name in (TENSORBOARD_DIR, MLFLOW_DIR):
        if (folder / name).is_dir():
            storage.upload_dir(folder / name, name)


def _quiet_ray_reports() -> None:
    """Ray Train logs every report with its metrics at INFO under a file-path logger name."""
    try:
        from ray.train.v2._internal.execution import context as ray_context

        ray_context.logger.setLevel(logging.WARNING)
    except (ImportError, AttributeError):
        pass


def train_func(config: dict) -> None:
    """Ray Train entry point (one call per worker)."""
    import ray.train

    log.setLevel(logging.INFO)  # Ray Train's root handlers forward it to the driver (print would be doubled)
    logging.getLogger("huggingface_hub").setLevel(logging.WARNING)
    if os.environ.get("TRAINER_QUIET_RAY") == "1":
        _quiet_ray_reports()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    config = dict(config)
    chat_template = config.pop(CHAT_TEMPLATE_KEY, None)
    inputs = config.pop(INPUTS_KEY, None)
    cfg = TrainConfig.from_dict(config)
    ctx = ray.train.get_context()
    device = None
    if cfg.use_gpu:
        import ray.train.torch

        device = ray.train.torch.get_device()  # the GPU Ray assigned to this worker
    env = setup_parallel(cfg, ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(), device)
    ray_storage = ctx.get_storage()
    storage = Storage(ray_storage.storage_filesystem, ray_storage.experiment_fs_path)
    latest = ray.train.get_checkpoint()

    def reporter(metrics: dict, checkpoint_path: str | None) -> None:
        ckpt.report_to_ray(metrics, checkpoint_path, storage)

    run(cfg, env, storage, latest_checkpoint=latest.path if latest else None, reporter=reporter,
        preemption=ray.train.get_preemption_info, chat_template=chat_template, inputs=inputs)
    if dist.is_initialized():
        dist.barrier()
