"""`python -m trainer.bench`: tokens/s of the trainer's step against transformers' Trainer.

In one process and on the same model shape, global batch and sequence length: a bf16 matmul
measures the device's peak, then transformers' Trainer (bf16=True, the baseline), then the
trainer's own step. Random init and random tokens: nothing is downloaded.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import torch
import torch.distributed as dist

from trainer.bench.setups import (
    RandomRows,
    device_name,
    emit,
    emit_error,
    on_gpu,
    random_rows,
    reset_memory,
    run_hf_trainer,
    run_trainer,
    transformers_version,
)
from trainer.bench.shapes import SETUPS, SHAPES, BenchError, model_config
from trainer.jobs.plan import step_flops
from trainer.model import flops as flops_lib
from trainer.model.footprint import DEFAULT_LORA_RANK, METHODS


def _parser(prog: str = "python -m trainer.bench") -> argparse.ArgumentParser:
    gpu = on_gpu()
    p = argparse.ArgumentParser(prog=prog, description="Tokens/s of the trainer's step against transformers' Trainer.")
    p.add_argument("--model-shape", default="qwen2.5-1.5b" if gpu else "tiny",
                   help=f"one of {', '.join(SHAPES)}, or a model folder / config.json (random init of its config)")
    p.add_argument("--seq-len", type=int, default=2048 if gpu else 128)
    p.add_argument("--global-batch-size", type=int, default=64 if gpu else 8, help="sequences per optimizer step")
    p.add_argument("--micro-batch-size", default="auto", help="trainer micro-batch: auto (largest that fits) or N")
    p.add_argument("--hf-micro-batch-size", type=int, default=8 if gpu else 2,
                   help="Trainer micro-batch (accumulates to the same global batch)")
    p.add_argument("--steps", type=int, default=10 if gpu else 3, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3 if gpu else 1, help="untimed optimizer steps first")
    p.add_argument("--setups", default=None, help=f"comma-separated, from {', '.join(SETUPS)} (default: both; with "
                                                  f"--method qlora the trainer only: the baseline has no 4-bit "
                                                  f"weights without bitsandbytes)")
    p.add_argument("--method", default="full", choices=METHODS,
                   help="what trains: full, lora (peft's LoRA on every linear of the blocks; the baseline is "
                        "transformers' Trainer on peft's get_peft_model, as TRL's SFTTrainer builds it) or qlora "
                        "(the trainer's LoRA on a torchao NF4 base)")
    p.add_argument("--lora-rank", type=int, default=DEFAULT_LORA_RANK, help="LoRA rank (alpha: twice the rank)")
    p.add_argument("--loss", default="auto", help="trainer loss: auto, chunked, liger or plain")
    p.add_argument("--kernels", default="auto", help="trainer kernels: auto (Liger on GPU if installed), liger, none")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (trainer)")
    p.add_argument("--attn", default="sdpa", help="trainer attention implementation")
    p.add_argument("--attn-baseline", default="sdpa", help="Trainer attention implementation")
    p.add_argument("--peak-tflops", type=float, default=None, help="datasheet peak override (default: by GPU name)")
    p.add_argument("--matmul-size", type=int, default=None,
                   help="side of the square matmul that measures the peak (default: 8192 on a GPU, 2048 on a CPU, "
                        "the smallest that reaches it; smaller measures faster and lower)")
    return p


def _check(args) -> None:
    model_config(args.model_shape)
    if args.setups is None:
        args.setups = "trainer" if args.method == "qlora" else ",".join(SETUPS)
    if args.method == "qlora" and "hf_trainer" in args.setups.split(","):
        raise BenchError("--method qlora --setups hf_trainer: transformers' Trainer has no 4-bit base without "
                         "bitsandbytes, which this project does not use; use --setups trainer")
    if args.lora_rank < 1:
        raise BenchError(f"--lora-rank = {args.lora_rank}: must be at least 1")
    for name in ("seq_len", "global_batch_size", "hf_micro_batch_size", "steps"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be at least 1")
    if args.warmup < 0:
        raise BenchError(f"--warmup = {args.warmup}: must be 0 or more")
    if args.matmul_size is not None and args.matmul_size < 1:
        raise BenchError(f"--matmul-size = {args.matmul_size}: must be at least 1 (or left out for the default)")
    if args.micro_batch_size != "auto":
        if not str(args.micro_batch_size).isdigit() or int(args.micro_batch_size) < 1 \
                or args.global_batch_size % int(args.micro_batch_size):
            raise BenchError(f"--micro-batch-size {args.micro_batch_size!r}: use auto or a positive divisor of "
                             f"--global-batch-size {args.global_batch_size}")
    if args.global_batch_size % args.hf_micro_batch_size:
        raise BenchError(f"--hf-micro-batch-size {args.hf_micro_batch_size} must divide --global-batch-size "
                         f"{args.global_batch_size}")
    unknown = [s for s in args.setups.split(",") if s not in SETUPS]
    if unknown:
        raise BenchError(f"--setups: unknown {', '.join(unknown)}; use a comma-separated list of {', '.join(SETUPS)}")


def significant(x: float, digits: int = 4) -> float:
    """Rounded to `digits` significant figures: a CPU's peak is a few hundredths of a TFLOP/s, a ratio may be 0.01."""
    return float(f"{x:.{digits}g}")


def _record(setup: str, result: dict, *, args, fpt: float, peak: dict, datasheet: float | None,
            config=None) -> dict:
    tps = result.pop("tokens") / result.pop("seconds")
    shape = {} if config is None else {"model_type": config.model_type, "params": flops_lib.parameter_count(config),
                                       "matmul_params_per_token": flops_lib.matmul_params(config)}
    return {"setup": setup, "model_shape": args.model_shape, "method": args.method, **shape, "device": device_name(),
            "torch": torch.__version__,
            "transformers": transformers_version(), "seq_len": args.seq_len,
            "global_batch_size": args.global_batch_size, "steps": args.steps, "warmup": args.warmup,
            "tokens_per_s": round(tps, 1), "gflop_per_token": round(fpt / 1e9, 4),
            "mfu_measured_peak": round(tps * fpt / peak["flops"], 4),
            "mfu_datasheet_peak": round(tps * fpt / datasheet, 4) if datasheet else None,
            "measured_peak_tflops": significant(peak["flops"] / 1e12),
            "datasheet_peak_tflops": round(datasheet / 1e12, 1) if datasheet else None, **result}


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    _check(args)
    if on_gpu():
        torch.backends.cuda.matmul.allow_tf32 = True
    config = model_config(args.model_shape)
    fpt = flops_lib.flops_per_token(config, args.seq_len)
    peak = flops_lib.measure_matmul_peak(size=args.matmul_size)
    datasheet = flops_lib.device_peak_flops(args.peak_tflops)
    emit({"setup": "matmul_peak", "device": device_name(), "dtype": peak["dtype"], "size": peak["size"],
          "measured_peak_tflops": significant(peak["flops"] / 1e12),
          "datasheet_peak_tflops": round(datasheet / 1e12, 1) if datasheet else None})
    results = {}
    setups = args.setups.split(",")
    for setup in [s for s in SETUPS if s in setups]:  # the baseline first, as in the anchor
        reset_memory()
        try:
            if setup == "hf_trainer":
                n = args.global_batch_size * (args.warmup + args.steps + 1)
                res = run_hf_trainer(config, RandomRows(config.vocab_size, n, args.seq_len), args=args,
                                     micro_batch=args.hf_micro_batch_size,
                                     grad_accum=args.global_batch_size // args.hf_micro_batch_size,
                                     tokens_of=lambda b: int(b["input_ids"].numel()))
            else:
                batch = random_rows(config.vocab_size, args.global_batch_size, args.seq_len)
                res = run_trainer(lambda step, batch=batch: [batch], args=args, rows_per_step=args.global_batch_size,
                                  tokens_per_step=lambda bs: sum(int(b["input_ids"].numel()) for b in bs))
            used = fpt if args.method == "full" else step_flops(config, args.method, args.seq_len,
                                                                  res["trainable_params"], checkpointed=False)
            results[setup] = emit(_record(setup, res, args=args, fpt=used, peak=peak, datasheet=datasheet,
                                          config=config))
        except Exception as e:  # noqa: BLE001 - report and keep the other setups going
            emit_error(setup, e)
    if "hf_trainer" in results and "trainer" in results:
        emit({"setup": "summary", "speedup_vs_hf_trainer":
              significant(results["trainer"]["tokens_per_s"] / results["hf_trainer"]["tokens_per_s"]),
              "trainer_tokens_per_s": results["trainer"]["tokens_per_s"],
              "hf_trainer_tokens_per_s": results["hf_trainer"]["tokens_per_s"]})
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if results and all(s in results for s in setups) else 1


