"""The per-worker training function that Ray Train runs on every rank.

    setup: inputs (once per node) -> model (sharded, trainer.loop.parallel) -> optimizer/schedule
           -> micro-batch that fits (trainer.loop.memory) -> resume (trainer.loop.checkpointer)
    loop:  data -> step -> metrics every --log-every -> checkpoint when due or preempted
    end:   Hugging Face export (trainer.run_folder.export)

`train_func` is the Ray entry point; `run` holds the loop and receives Ray only through
`reporter`, `preemption` and the run storage, so the loop reads top to bottom.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist

from trainer.config.flags import TrainConfig
from trainer.data.distributed import open_prepared
from trainer.data.packing import DataSpec, PackedData, prepare
from trainer.data.packing import summary as data_summary
from trainer.loop import memory, optim
from trainer.loop.behaviour import documents_per_row
from trainer.loop.checkpointer import Checkpointer, Reporter, report_to_ray
from trainer.loop.monitor import Monitor
from trainer.loop.parallel import WorkerEnv, setup_parallel, transport_check
from trainer.loop.step import DEFAULT_LOSS, check_loss_path, eval_loss, resolve_loss, train_step
from trainer.model.build import build_model
from trainer.model.sources import load_tokenizer, resolve_model_path, set_eos_token
from trainer.run_folder import record as run_record
from trainer.run_folder.export import export_hf
from trainer.run_folder.resume import INPUTS_KEY
from trainer.storage import Storage

log = logging.getLogger("trainer")

CHAT_TEMPLATE_KEY = "chat_template_text"  # train_loop_config key: --chat-template's text, read by the driver
# train_loop_config key: the driver's verdict on packing (trainer.loop.behaviour), "" when documents share rows
ONE_PER_ROW_KEY = "documents_one_per_row"
PREPARED_KEY = "prepared_data"  # train_loop_config key: the cluster's preparation keys (trainer.data.distributed)
MEMORY_PLAN_KEY = "memory_plan"  # train_loop_config key: the pre-flight's prediction (trainer.jobs.plan.run_prediction)
DATA_COUNTS = ("records", "documents", "rows", "truncated", "dropped", "drop_reasons", "too_long", "longest_tokens",
               "longest_record", "packed_rows", "one_per_row")


class InjectedFailure(RuntimeError):
    """Raised by --fail-at-step to exercise Ray Train's restart-from-checkpoint path."""


class Inputs(NamedTuple):
    model_path: Path  # a local folder: the node's cache for hub and s3:// models
    tokenizer: Any
    data: PackedData
    eval_data: PackedData | None = None  # the held-out rows (--eval-every / --eval-on-start)


def run(cfg: TrainConfig, env: WorkerEnv, storage: Storage, *, latest_checkpoint: str | None = None,
        reporter: Reporter | None = None, preemption: Callable[[], Any] | None = None,
        chat_template: str | None = None, inputs: dict | None = None, one_per_row: str | None = None,
        memory_plan: dict | None = None, prepared: dict | None = None) -> dict:
    """Train to the configured number of steps; returns the last logged metrics.

    `preemption` (ray.train.get_preemption_info under Ray) is asked at logging steps (trainer.loop.checkpointer);
    `chat_template` (the text of --chat-template, read by the driver) replaces the tokenizer's; `inputs`
    (the driver's trainer.run_folder.resume.inputs) go into run.json; `one_per_row` is the driver's packing verdict
    (measured here when None); `memory_plan` (the pre-flight's prediction) goes into run.json, and beside it the
    measured peak of every logging step; `prepared` names the shards the driver had the cluster prepare.
    """
    torch.manual_seed(cfg.seed)
    model_path, tokenizer, data, eval_data = fetch_inputs(cfg, storage, chat_template, one_per_row, prepared)
    steps, gb = cfg.total_steps(data.steps_per_epoch(cfg.global_batch_size)), cfg.global_batch_size
    data.step_rows(0, gb, cfg.seed)  # fails early if the data is smaller than one batch
    model = build_model(model_path, device=env.device, use_gpu=cfg.use_gpu, mesh=env.mesh,
                        attn_implementation=cfg.attn_implementation,
                        activation_checkpointing=cfg.activation_checkpointing, seed=cfg.seed, random_init=cfg.random_init,
                        lora=cfg.lora, qlora=cfg.method == "qlora", offload=cfg.offload == "cpu")
    check_loss_path(model, resolve_loss(DEFAULT_LOSS, env.device), env.device,  # before the memory probe measures it
                    collectives=env.collectives)
    optimizer, scheduler = optim.for_run(model, cfg, steps)
    fit = memory.resolve_micro_batch(cfg, model, optimizer, env)  # before resume: the optimizer holds no state yet
    checkpointer = Checkpointer(cfg, storage, model, optimizer, scheduler, data, steps, rank=env.rank,
                                reporter=reporter, preemption=preemption)
    start = checkpointer.resume(latest_checkpoint)
    monitor = Monitor(cfg, env, storage, model, start=start, total_steps=steps)
    record = announce(cfg, env, storage, monitor, data, fit, start, steps, checkpointer.resumed_path, inputs,
                      memory_plan)
    evaluations: list[dict] = []

    def evaluate(step: int) -> dict:
        result = {"step": step, **eval_loss(model, eval_data.eval_batches(
            rank=env.rank, world_size=env.world_size, batch=cfg.eval_batch_size or fit["micro_batch_size"]),
            device=env.device, collectives=env.collectives)}
        evaluations.append(result)
        run_record.record_eval(storage, record, evaluations)
        return {k: v for k, v in result.items() if k != "step"}

    if cfg.eval_on_start:
        monitor.log_eval(start, evaluate(start))
    last: dict = {}
    for step in range(start, steps):
        t0 = time.perf_counter()
        batches = data.micro_batches(step, rank=env.rank, world_size=env.world_size, global_batch=gb,
                                     micro_batch=fit["micro_batch_size"], seed=cfg.seed)
        data_wait, done = time.perf_counter() - t0, step + 1
        if done == cfg.fail_at_step and not checkpointer.resumed_from:
            raise InjectedFailure(f"--fail-at-step {cfg.fail_at_step}: injected failure (testing aid)")
        out = train_step(model, optimizer, scheduler, batches, device=env.device, collectives=env.collectives,
                         grad_clip=cfg.grad_clip)
        monitor.add(done, out, data_wait)
        if step == start:
            transport_check(cfg, env)
        save_now = checkpointer.due(done)
        eval_now = bool(cfg.eval_every) and done % cfg.eval_every == 0 or \
            cfg.eval_each_epoch and done % data.steps_per_epoch(gb) == 0 or cfg.keep_best and save_now
        log_now = done % cfg.log_every == 0 or done == steps or eval_now
        if step == start or log_now or save_now:  # never log, save or export an unhealthy model
            monitor.check_health(done)
        if log_now:
            last = monitor.log(done, epoch=data.position(done, gb)["epoch"], vote=checkpointer.report_wanted(),
                               extra=evaluate(done) if eval_now else None)
            run_record.record_memory(storage, record, done, last["peak_mem_gb"], env.device.type)
            if not save_now:
                monitor.exclude(checkpointer.report(last, agreed=monitor.voted))
                save_now = checkpointer.preempted(done, monitor)
        if save_now:
            monitor.exclude(checkpointer.save(done, last, monitor))
    if cfg.keep_best:
        best = checkpointer.restore_best(monitor)
        run_record.record_best(storage, record, best)
        last = {**last, "best_checkpoint": best} if best else last
    if cfg.export:
        card = run_record.model_card(record, last, steps, data.tokens_through(steps, gb, cfg.seed)) if env.rank == 0 \
            else None
        monitor.event("export", step=steps, path=export_hf(storage, model, tokenizer, source=model_path, card=card,
                                                              eos_token=cfg.eos_token, lora=cfg.lora))
    monitor.close()
    return last


def fetch_inputs(cfg: TrainConfig, storage: Storage, chat_template: str | None,
                 one_per_row: str | None = None, prepared: dict | None = None) -> Inputs:
    """Model, tokenizer and packed data: the shards the cluster prepared (`prepared`: their keys, in the run
    storage's parent), else tokenized here once per node into its cache (a run started without the driver's pass).

    s3:// inputs go through the run storage's filesystem when that is remote (same endpoint and credentials).
    """
    from transformers import AutoConfig

    cache_dir, remote_fs = cfg.resolved_cache_dir, None if storage.is_local else storage.fs
    model_path = resolve_model_path(cfg.model, cache_dir, storage_fs=remote_fs, revision=cfg.model_revision)
    tokenizer = load_tokenizer(resolve_model_path(cfg.tokenizer, cache_dir, storage_fs=remote_fs)
                               if cfg.tokenizer else model_path)
    if chat_template:
        tokenizer.chat_template = chat_template
    set_eos_token(tokenizer, cfg.eos_token)
    if prepared:  # packed by the cluster with the driver's packing verdict
        data = open_prepared(storage.parent(), prepared["train"], cache_dir)
        eval_data = open_prepared(storage.parent(), prepared["eval"], cache_dir) if cfg.evaluates else None
        return Inputs(model_path, tokenizer, data, eval_data)
    if one_per_row is None:  # no driver's verdict (a run started without its pre-flight): measured here
        one_per_row = documents_per_row(AutoConfig.from_pretrained(str(model_path)), cfg.attn_implementation)
    data = prepare(DataSpec.from_config(cfg, one_per_row), tokenizer=tokenizer, seq_len=cfg.seq_len,
                   cache_dir=cache_dir, storage_fs=remote_fs)
    eval_data = prepare(DataSpec.eval_from_config(cfg, one_per_row), tokenizer=tokenizer, seq_len=cfg.seq_len,
                        cache_dir=cache_dir, storage_fs=remote_fs) if cfg.evaluates else None
    return Inputs(model_path, tokenizer, data, eval_data)


def announce(cfg: TrainConfig, env: WorkerEnv, storage: Storage, monitor: Monitor, data: PackedData, fit: dict,
             start: int, steps: int, resumed: str | None, inputs: dict | None, memory_plan: dict | None = None) -> dict:
    """The start (or resume) event, run.json and the first log lines; returns the run record."""
    micro = fit["micro_batch_size"]
    notes = data_summary(data.meta, cfg.overlong)
    monitor.event("resume" if resumed else "start", step=start, world_size=env.world_size, checkpoint=resumed,
                  total_steps=steps, micro_batch_size=micro, grad_accum_steps=cfg.grad_accum_for(micro),
                  micro_batch=fit, data={k: data.meta.get(k) for k in DATA_COUNTS}, data_notes=notes)
    record = run_record.write_run_record(storage, cfg, device=env.device, rank=env.rank, world_size=env.world_size,
                                         data_meta=data.meta, data_key=data.fingerprint, start_step=start,
                                         total_steps=steps, inputs=inputs, memory_plan=memory_plan)
    if env.rank == 0:
        for note in notes:
            log.warning("data: %s", note)
        log.info("training %s for %d steps (start %d): %d workers x %d micro-batches x %d sequences of %d tokens",
                 cfg.model, steps, start, env.world_size, cfg.grad_accum_for(micro), micro, cfg.seq_len)
    return record


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

    from trainer.loop import user_errors

    user_errors.on_worker()  # a UserError is named by the driver, once; Ray's log of it with a traceback is dropped
    log.setLevel(logging.INFO)  # Ray Train's root handlers forward it to the driver (print would be doubled)
    logging.getLogger("huggingface_hub").setLevel(logging.WARNING)
    if os.environ.get("TRAINER_QUIET_RAY") == "1":
        _quiet_ray_reports()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    config = dict(config)
    chat_template = config.pop(CHAT_TEMPLATE_KEY, None)
    inputs = config.pop(INPUTS_KEY, None)
    one_per_row = config.pop(ONE_PER_ROW_KEY, None)
    memory_plan = config.pop(MEMORY_PLAN_KEY, None)
    prepared = config.pop(PREPARED_KEY, None)
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
        report_to_ray(metrics, checkpoint_path, storage)

    run(cfg, env, storage, latest_checkpoint=latest.path if latest else None, reporter=reporter,
        preemption=ray.train.get_preemption_info, chat_template=chat_template, inputs=inputs, one_per_row=one_per_row,
        memory_plan=memory_plan, prepared=prepared)
    if dist.is_initialized():
        dist.barrier()
