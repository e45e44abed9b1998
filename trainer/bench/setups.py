"""The two timed setups every benchmark compares, on one device, in one process.

`run_trainer` is the trainer's own model setup and step (exactly what the Ray loop runs);
`run_hf_trainer` is transformers' Trainer, the baseline. Both time the steps after warm-up and
report tokens, seconds and peak memory; each benchmark turns those into its own rates. Each
benchmark prints one JSON line per setup (`emit`); a setup that fails prints an error line and
the others still run.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainer.bench.shapes import BenchError, write_config
from trainer.config.flags import TrainConfig
from trainer.config.trl import training_arguments
from trainer.loop.step import IGNORE_INDEX

# What both setups step with: the trainer's declared defaults (learning rate, weight decay, AdamW's betas and
# epsilon, clipping, seed), handed to transformers' Trainer through each flag's TrainingArguments key.
OPTIMIZER = TrainConfig()
BASELINE_SETTINGS = ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "grad_clip", "seed")


def baseline_optimizer_arguments() -> dict[str, Any]:
    """TrainingArguments keywords that make the baseline's optimizer the trainer's (OPTIMIZER)."""
    return training_arguments(OPTIMIZER, BASELINE_SETTINGS)


def on_gpu() -> bool:
    return torch.cuda.is_available()


def bench_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu() else torch.device("cpu")


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def emit(record: dict[str, Any], out: Any = None) -> dict[str, Any]:
    print(json.dumps(record), flush=True, file=out or sys.stdout)
    return record


def emit_error(setup: str, error: Exception, **fields: Any) -> dict[str, Any]:
    """The line of a setup that failed: the others still run."""
    return emit({"setup": setup, **fields, "error": f"{type(error).__name__}: {str(error)[:500]}"})



def reset_memory() -> None:
    gc.collect()
    if on_gpu():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib() -> tuple[float, str]:
    from trainer.loop.metrics import peak_memory_gb

    return peak_memory_gb(bench_device()), "cuda_max_allocated" if on_gpu() else "host_max_rss_process"


def ensure_process_group() -> None:
    """A one-rank group on a fresh port (never an inherited MASTER_PORT, which may be taken)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu() else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)


def random_rows(vocab: int, rows: int, seq_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tokens as the data layer hands them over: one document per row, labels pre-shifted."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq_len), generator=g)
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = IGNORE_INDEX
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(seq_len).expand(rows, seq_len).clone(),
            "real_tokens": torch.full((rows,), seq_len, dtype=torch.int32)}


def split_rows(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    n = batch["input_ids"].shape[0]
    return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, n, size)]


def adapter_arguments(args) -> dict[str, Any]:
    """build_model's lora/qlora arguments for --method (rank --lora-rank, alpha twice it, no dropout)."""
    method = getattr(args, "method", "full")
    if method == "full":
        return {}
    return {"lora": {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank, "dropout": 0.0},
            "qlora": method == "qlora"}


def run_trainer(steps_fn: Callable[[int], list[dict]], *, args, rows_per_step: int,
                tokens_per_step: Callable[[list[dict]], int], attn: str | None = None) -> dict[str, Any]:
    """The trainer's model setup (random init of --model-shape) and step, timed after warm-up."""
    from trainer.loop.memory import choose_micro_batch
    from trainer.loop.optim import adamw_arguments, build_optimizer
    from trainer.loop.parallel import ONE_PROCESS
    from trainer.loop.step import check_loss_path, resolve_loss, train_step
    from trainer.model.build import build_model

    ensure_process_group()
    device = bench_device()
    gpu = device.type == "cuda"
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("fsdp",))
    with tempfile.TemporaryDirectory() as folder:
        model = build_model(write_config(args.model_shape, Path(folder)), device=device, use_gpu=gpu, mesh=mesh,
                            attn_implementation=attn or args.attn, kernels=args.kernels, compile=args.compile,
                            random_init=True, **adapter_arguments(args))
    optimizer = build_optimizer(model, fused=gpu, **adamw_arguments(OPTIMIZER))
    # the loss that gives the model's own
    loss = check_loss_path(model, resolve_loss(args.loss, device), device, collectives=ONE_PROCESS)
    if args.micro_batch_size == "auto":
        fit = choose_micro_batch(model, optimizer, rows=rows_per_step, seq_len=args.seq_len, device=device,
                                 collectives=ONE_PROCESS, loss=loss)
        micro = fit["micro_batch_size"]
    else:
        micro, fit = int(args.micro_batch_size), None
    reset_memory()
    tokens = 0
    t0 = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync()
            t0 = time.perf_counter()
        batches = steps_fn(step)
        rows = [mb for b in batches for mb in split_rows(b, micro)]
        out = train_step(model, optimizer, None, rows, device=device, collectives=ONE_PROCESS,
                         grad_clip=OPTIMIZER.grad_clip, loss=loss)
        if step >= args.warmup:
            tokens += tokens_per_step(batches)
    float(out.loss)  # waits for the device
    sync()
    seconds = time.perf_counter() - t0
    mem, mem_kind = peak_memory_gib()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del model, optimizer
    return {"seconds": seconds, "trainable_params": trainable, "tokens": tokens, "micro_batch_size": micro,
            "grad_accum": rows_per_step // micro,
            "loss_impl": loss, "liger_kernels": args.kernels != "none" and gpu and liger_kernels(),
            "compile": args.compile, "peak_mem_gib": round(mem, 2), "peak_mem_kind": mem_kind,
            "micro_batch_fit": fit, "last_loss": round(float(out.loss), 4)}


def useful_rate(result: dict[str, Any]) -> dict[str, Any]:
    """A run's numbers with its token count and seconds turned into useful (non-padding) tokens/s."""
    out = dict(result)
    out["useful_tokens_per_s"] = round(out.pop("tokens") / out.pop("seconds"), 1)
    return out


def liger_kernels() -> bool:
    from trainer.model.build import liger_kernels_available

    return liger_kernels_available()


def run_hf_trainer(config, dataset, *, args, micro_batch: int, grad_accum: int, collator=None,
                   tokens_of: Callable[[dict], int]) -> dict[str, Any]:
    """transformers' Trainer (bf16=True on GPU, fp32 master weights, fused AdamW), timed after warm-up."""
    if importlib.util.find_spec("accelerate") is None:
        raise BenchError("transformers' Trainer needs the accelerate package, which is not installed: "
                         "pip install 'accelerate>=1.1.0' (or run without the baseline: --setups trainer)")
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    gpu = on_gpu()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn_baseline, dtype=torch.float32)
    if getattr(args, "method", "full") == "lora":  # as TRL's SFTTrainer wraps the model for use_peft
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=args.lora_rank, lora_alpha=2.0 * args.lora_rank,
                                                           lora_dropout=0.0, target_modules="all-linear",
                                                           task_type="CAUSAL_LM"))
    marks: list[float] = []
    fetched: list[int] = []  # tokens of every micro-batch, in the order the Trainer consumes them

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if state.global_step == args.warmup and not marks:
                sync()
                marks.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup + args.steps:
                sync()
                marks.append(time.perf_counter())

    class Count:
        """Records each micro-batch's tokens (wraps the collator; batches are prefetched, so count by order)."""

        def __init__(self, inner):
            self.inner = inner

        def __call__(self, features):
            batch = self.inner(features)
            fetched.append(tokens_of(batch))
            return batch

    from transformers import default_data_collator

    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=micro_batch, gradient_accumulation_steps=grad_accum,
            max_steps=args.warmup + args.steps, bf16=gpu, use_cpu=not gpu,
            optim="adamw_torch_fused" if gpu else "adamw_torch", logging_steps=10**6, save_strategy="no",
            report_to=[], disable_tqdm=True, dataloader_num_workers=0, lr_scheduler_type="constant",
            **baseline_optimizer_arguments())
        trainer = Trainer(model=model, args=targs, train_dataset=dataset,
                          data_collator=Count(collator or default_data_collator), callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # its dict lines would interleave with the JSON lines
        trainer.train()
    mem, mem_kind = peak_memory_gib()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del trainer, model
    if len(marks) != 2:
        raise RuntimeError("the Trainer ran fewer steps than warm-up + timed steps")
    timed = fetched[args.warmup * grad_accum:(args.warmup + args.steps) * grad_accum]
    return {"seconds": marks[1] - marks[0], "tokens": sum(timed), "trainable_params": trainable, "micro_batch_size": micro_batch,
            "grad_accum": grad_accum, "peak_mem_gib": round(mem, 2), "peak_mem_kind": mem_kind}


class RandomRows(torch.utils.data.Dataset):
    def __init__(self, vocab: int, n: int, seq_len: int):
        self.vocab, self.n, self.seq_len = vocab, n, seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}  # the model shifts labels itself


def device_name() -> str:
    return torch.cuda.get_device_name() if on_gpu() else "cpu"


def transformers_version() -> str:
    import transformers

    return transformers.__version__
