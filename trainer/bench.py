"""Throughput benchmarks, one JSON line per setup.

    python -m trainer.bench [--model-shape qwen2.5-1.5b|small|tiny|FOLDER|config.json] [...]
                                             the trainer's step vs transformers' Trainer
    python -m trainer.bench padding [...]    packed trainer vs Trainer with per-batch padding (useful tokens/s)
    python -m trainer.bench comm --instance-type g6.12xlarge --nodes 2    communication estimate per step
    python -m trainer.bench harness [...]    the same training under Ray and under torchrun (CPU)

The first runs, in one process and on the same model shape, global batch and sequence
length: a bf16 matmul to measure the device's peak, transformers' Trainer (bf16=True,
the baseline), then the trainer's own step (trainer.model + trainer.step, exactly what
the Ray loop runs). The shape is a named one (Qwen2 configs) or any model's config: a
folder with config.json or the file itself (only the config is read). Random init and
random tokens: nothing is downloaded. It needs only
torch and transformers (the Trainer baseline also needs accelerate, which `pip install
transformers[torch]` brings; without it that line is an error naming the fix and the
trainer's own line still runs); Liger is used when installed.
Imports neither ray nor datasets (the harness imports ray only when it runs).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from trainer import flops as flops_lib
from trainer.step import IGNORE_INDEX

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6),
    # Matmul-bound like Qwen2.5-1.5B at 2048 (attention ~11% of the FLOPs) yet fast enough for a CPU.
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
}
SETUPS = ("hf_trainer", "trainer")


class BenchError(ValueError):
    """A bad benchmark option, named with the fix."""


def _gpu() -> bool:
    return torch.cuda.is_available()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if _gpu() else torch.device("cpu")


def _sync() -> None:
    if _gpu():
        torch.cuda.synchronize()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def emit(record: dict[str, Any], out: Any = None) -> dict[str, Any]:
    print(json.dumps(record), flush=True, file=out or sys.stdout)
    return record


def emit_error(setup: str, error: Exception, **fields: Any) -> dict[str, Any]:
    """The line of a setup that failed: the others still run."""
    return emit({"setup": setup, **fields, "error": f"{type(error).__name__}: {str(error)[:500]}"})


def model_config(shape: str):
    """A named shape (Qwen2), or the config of a model folder / config.json file (any architecture)."""
    from transformers import AutoConfig, Qwen2Config

    if shape in SHAPES:
        return Qwen2Config(**SHAPES[shape], use_cache=False)
    path = Path(shape).expanduser()
    if not (path.is_file() or (path / "config.json").is_file()):
        raise BenchError(f"--model-shape {shape!r}: not a named shape ({', '.join(SHAPES)}) nor a model folder "
                         f"with config.json or a config .json file; pass one of those")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - a foreign or broken JSON file: name it
        raise BenchError(f"--model-shape {shape!r}: not a transformers model config ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    config.use_cache = False
    return config


def write_config(shape: str, folder: Path) -> Path:
    """A config-only model folder: build_model(random_init=True) gives it the config's initialisation."""
    model_config(shape).save_pretrained(str(folder))
    return folder


def _reset_memory() -> None:
    gc.collect()
    if _gpu():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_memory_gib() -> tuple[float, str]:
    from trainer.metrics import peak_memory_gb

    return peak_memory_gb(_device()), "cuda_max_allocated" if _gpu() else "host_max_rss_process"


def _ensure_process_group() -> None:
    """A one-rank group on a fresh port (never an inherited MASTER_PORT, which may be taken)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if _gpu() else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}",
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


# ---------------------------------------------------------------- setups

def run_trainer(steps_fn: Callable[[int], list[dict]], *, args, rows_per_step: int,
                tokens_per_step: Callable[[list[dict]], int], attn: str | None = None) -> dict[str, Any]:
    """The trainer's model setup (random init of --model-shape) and step, timed after warm-up."""
    from trainer.model import build_model, build_optimizer
    from trainer.step import check_loss_path, choose_micro_batch, resolve_loss, train_step

    _ensure_process_group()
    device = _device()
    gpu = device.type == "cuda"
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("fsdp",))
    with tempfile.TemporaryDirectory() as folder:
        model = build_model(write_config(args.model_shape, Path(folder)), device=device, use_gpu=gpu, mesh=mesh,
                            attn_implementation=attn or args.attn, kernels=args.kernels, compile=args.compile,
                            random_init=True)
    optimizer = build_optimizer(model, lr=1e-5, weight_decay=0.0, fused=gpu)
    loss = check_loss_path(model, resolve_loss(args.loss, device), device)  # the one giving the model's own loss
    if args.micro_batch_size == "auto":
        fit = choose_micro_batch(model, optimizer, rows=rows_per_step, seq_len=args.seq_len, device=device, loss=loss)
        micro = fit["micro_batch_size"]
    else:
        micro, fit = int(args.micro_batch_size), None
    _reset_memory()
    tokens = 0
    t0 = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            _sync()
            t0 = time.perf_counter()
        batches = steps_fn(step)
        rows = [mb for b in batches for mb in split_rows(b, micro)]
        out = train_step(model, optimizer, None, rows, device=device, loss=loss)
        if step >= args.warmup:
            tokens += tokens_per_step(batches)
    float(out.loss)  # waits for the device
    _sync()
    seconds = time.perf_counter() - t0
    mem, mem_kind = _peak_memory_gib()
    del model, optimizer
    return {"seconds": seconds, "tokens": tokens, "micro_batch_size": micro, "grad_accum": rows_per_step // micro,
            "loss_impl": loss, "liger_kernels": args.kernels != "none" and gpu and _liger_kernels(),
            "compile": args.compile, "peak_mem_gib": round(mem, 2), "peak_mem_kind": mem_kind,
            "micro_batch_fit": fit, "last_loss": round(float(out.loss), 4)}


def _useful_rate(result: dict[str, Any]) -> dict[str, Any]:
    """A run's numbers with its token count and seconds turned into useful (non-padding) tokens/s."""
    out = dict(result)
    out["useful_tokens_per_s"] = round(out.pop("tokens") / out.pop("seconds"), 1)
    return out


def _liger_kernels() -> bool:
    from trainer.model import liger_kernels_available

    return liger_kernels_available()


def run_hf_trainer(config, dataset, *, args, micro_batch: int, grad_accum: int, collator=None,
                   tokens_of: Callable[[dict], int]) -> dict[str, Any]:
    """transformers' Trainer (bf16=True on GPU, fp32 master weights, fused AdamW), timed after warm-up."""
    if importlib.util.find_spec("accelerate") is None:
        raise BenchError("transformers' Trainer needs the accelerate package, which is not installed: "
                         "pip install 'accelerate>=1.1.0' (or run without the baseline: --setups trainer)")
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    gpu = _gpu()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn_baseline, dtype=torch.float32)
    marks: list[float] = []
    fetched: list[int] = []  # tokens of every micro-batch, in the order the Trainer consumes them

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if state.global_step == args.warmup and not marks:
                _sync()
                marks.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup + args.steps:
                _sync()
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
            max_steps=args.warmup + args.steps, bf16=gpu, use_cpu=not gpu, learning_rate=1e-5,
            optim="adamw_torch_fused" if gpu else "adamw_torch", logging_steps=10**6, save_strategy="no",
            report_to=[], disable_tqdm=True, dataloader_num_workers=0, seed=0, lr_scheduler_type="constant")
        trainer = Trainer(model=model, args=targs, train_dataset=dataset,
                          data_collator=Count(collator or default_data_collator), callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # its dict lines would interleave with the JSON lines
        trainer.train()
    mem, mem_kind = _peak_memory_gib()
    del trainer, model
    if len(marks) != 2:
        raise RuntimeError("the Trainer ran fewer steps than warm-up + timed steps")
    timed = fetched[args.warmup * grad_accum:(args.warmup + args.steps) * grad_accum]
    return {"seconds": marks[1] - marks[0], "tokens": sum(timed), "micro_batch_size": micro_batch,
            "grad_accum": grad_accum, "peak_mem_gib": round(mem, 2), "peak_mem_kind": mem_kind}


class RandomRows(torch.utils.data.Dataset):
    def __init__(self, vocab: int, n: int, seq_len: int):
        self.vocab, self.n, self.seq_len = vocab, n, seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}  # the model shifts labels itself


# ---------------------------------------------------------------- throughput (the default command)

def _throughput_parser(prog: str = "python -m trainer.bench") -> argparse.ArgumentParser:
    gpu = _gpu()
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
    p.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, from {', '.join(SETUPS)}")
    p.add_argument("--loss", default="auto", help="trainer loss: auto, chunked, liger or plain")
    p.add_argument("--kernels", default="auto", help="trainer kernels: auto (Liger on GPU if installed), liger, none")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (trainer)")
    p.add_argument("--attn", default="sdpa", help="trainer attention implementation")
    p.add_argument("--attn-baseline", default="sdpa", help="Trainer attention implementation")
    p.add_argument("--peak-tflops", type=float, default=None, help="datasheet peak override (default: by GPU name)")
    return p


def _check(args) -> None:
    model_config(args.model_shape)
    for name in ("seq_len", "global_batch_size", "hf_micro_batch_size", "steps"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be at least 1")
    if args.warmup < 0:
        raise BenchError(f"--warmup = {args.warmup}: must be 0 or more")
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


def _record(setup: str, result: dict, *, args, fpt: float, peak: dict, datasheet: float | None,
            config=None) -> dict:
    tps = result.pop("tokens") / result.pop("seconds")
    shape = {} if config is None else {"model_type": config.model_type, "params": flops_lib.parameter_count(config),
                                       "matmul_params_per_token": flops_lib.matmul_params(config)}
    return {"setup": setup, "model_shape": args.model_shape, **shape, "device": _device_name(), "torch": torch.__version__,
            "transformers": _transformers_version(), "seq_len": args.seq_len,
            "global_batch_size": args.global_batch_size, "steps": args.steps, "warmup": args.warmup,
            "tokens_per_s": round(tps, 1), "gflop_per_token": round(fpt / 1e9, 4),
            "mfu_measured_peak": round(tps * fpt / peak["flops"], 4),
            "mfu_datasheet_peak": round(tps * fpt / datasheet, 4) if datasheet else None,
            "measured_peak_tflops": round(peak["flops"] / 1e12, 2),
            "datasheet_peak_tflops": round(datasheet / 1e12, 1) if datasheet else None, **result}


def _device_name() -> str:
    return torch.cuda.get_device_name() if _gpu() else "cpu"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def throughput_main(argv: Sequence[str]) -> int:
    args = _throughput_parser().parse_args(list(argv))
    try:
        _check(args)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if _gpu():
        torch.backends.cuda.matmul.allow_tf32 = True
    config = model_config(args.model_shape)
    fpt = flops_lib.flops_per_token(config, args.seq_len)
    peak = flops_lib.measure_matmul_peak()
    datasheet = flops_lib.device_peak_flops(args.peak_tflops)
    emit({"setup": "matmul_peak", "device": _device_name(), "dtype": peak["dtype"], "size": peak["size"],
          "measured_peak_tflops": round(peak["flops"] / 1e12, 2),
          "datasheet_peak_tflops": round(datasheet / 1e12, 1) if datasheet else None})
    results = {}
    setups = args.setups.split(",")
    for setup in [s for s in SETUPS if s in setups]:  # the baseline first, as in the anchor
        _reset_memory()
        try:
            if setup == "hf_trainer":
                n = args.global_batch_size * (args.warmup + args.steps + 1)
                res = run_hf_trainer(config, RandomRows(config.vocab_size, n, args.seq_len), args=args,
                                     micro_batch=args.hf_micro_batch_size,
                                     grad_accum=args.global_batch_size // args.hf_micro_batch_size,
                                     tokens_of=lambda b: int(b["input_ids"].numel()))
            else:
                batch = random_rows(config.vocab_size, args.global_batch_size, args.seq_len)
                res = run_trainer(lambda step: [batch], args=args, rows_per_step=args.global_batch_size,
                                  tokens_per_step=lambda bs: sum(int(b["input_ids"].numel()) for b in bs))
            results[setup] = emit(_record(setup, res, args=args, fpt=fpt, peak=peak, datasheet=datasheet,
                                          config=config))
        except Exception as e:  # noqa: BLE001 - report and keep the other setups going
            emit_error(setup, e)
    if "hf_trainer" in results and "trainer" in results:
        emit({"setup": "summary", "speedup_vs_hf_trainer":
              round(results["trainer"]["tokens_per_s"] / results["hf_trainer"]["tokens_per_s"], 3),
              "trainer_tokens_per_s": results["trainer"]["tokens_per_s"],
              "hf_trainer_tokens_per_s": results["hf_trainer"]["tokens_per_s"]})
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if results and all(s in results for s in setups) else 1


# ---------------------------------------------------------------- padding waste

def instruction_lengths(n: int, seq_len: int, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt, response) token counts with the long-tailed spread of instruction data.

    Log-normal prompts (median seq_len/24) and responses (median seq_len/10), each with
    sigma 0.9, as in chat/instruction sets; documents longer than seq_len are cut.
    At seq_len 2048: median document about 300 tokens, 90th percentile about 1000.
    """
    rng = np.random.default_rng(seed)
    prompt = np.maximum(4, rng.lognormal(math.log(seq_len / 24), 0.9, n)).astype(int)
    response = np.maximum(4, rng.lognormal(math.log(seq_len / 10), 0.9, n)).astype(int)
    out = []
    for p, r in zip(prompt, response):
        p = int(min(p, seq_len // 2))
        out.append((p, int(min(r, seq_len - p))))
    return out


def instruction_documents(n: int, seq_len: int, vocab: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids and response masks of a deterministic variable-length instruction dataset."""
    rng = np.random.default_rng(seed + 1)
    docs = []
    for p, r in instruction_lengths(n, seq_len, seed):
        ids = rng.integers(3, vocab, p + r).astype(np.int32)
        docs.append((ids, np.r_[np.zeros(p, bool), np.ones(r, bool)]))
    return docs


class PaddedDocs(torch.utils.data.Dataset):
    def __init__(self, docs):
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, mask = self.docs[i]
        ids = torch.from_numpy(ids.astype(np.int64))
        return {"input_ids": ids, "labels": torch.where(torch.from_numpy(mask), ids, IGNORE_INDEX)}


def pad_to_longest(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-batch padding, as DataCollatorWithPadding / DataCollatorForSeq2Seq do."""
    longest = max(len(f["input_ids"]) for f in features)
    out = {"input_ids": torch.zeros(len(features), longest, dtype=torch.long),
           "labels": torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long),
           "attention_mask": torch.zeros(len(features), longest, dtype=torch.long)}
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        out["input_ids"][i, :n], out["labels"][i, :n], out["attention_mask"][i, :n] = f["input_ids"], f["labels"], 1
    return out


def padding_main(argv: Sequence[str]) -> int:
    from trainer.data import pack

    gpu = _gpu()
    p = argparse.ArgumentParser(prog="python -m trainer.bench padding",
                                description="Useful (non-padding) tokens/s: packed trainer vs Trainer with "
                                            "per-batch padding, on a variable-length instruction dataset.")
    p.add_argument("--model-shape", default="qwen2.5-1.5b" if gpu else "tiny")
    p.add_argument("--seq-len", type=int, default=2048 if gpu else 512)
    p.add_argument("--documents", type=int, default=20000 if gpu else 1500)
    p.add_argument("--global-batch-size", type=int, default=32 if gpu else 8, help="packed rows per trainer step")
    p.add_argument("--micro-batch-size", default="auto")
    p.add_argument("--hf-micro-batch-size", type=int, default=8, help="documents per Trainer micro-batch")
    p.add_argument("--hf-grad-accum", type=int, default=0,
                   help="Trainer micro-batches per step (0: as many documents per step as the packed rows hold)")
    p.add_argument("--steps", type=int, default=8 if gpu else 4)
    p.add_argument("--warmup", type=int, default=2 if gpu else 1)
    p.add_argument("--attn", default="flex_attention,sdpa" if gpu else "sdpa",
                   help="trainer attention for packed rows, comma-separated: each is measured (all take the "
                        "document mask from the position ids; FlexAttention skips the masked-out blocks)")
    p.add_argument("--attn-baseline", default="sdpa")
    p.add_argument("--loss", default="auto")
    p.add_argument("--kernels", default="auto")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(list(argv))
    try:
        config = model_config(args.model_shape)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    docs = instruction_documents(args.documents, args.seq_len, config.vocab_size, args.seed)
    lengths = np.array([len(d[0]) for d in docs])
    emit({"setup": "dataset", "documents": len(docs), "seq_len": args.seq_len,
          "length_p10": int(np.percentile(lengths, 10)), "length_median": int(np.median(lengths)),
          "length_p90": int(np.percentile(lengths, 90)), "length_max": int(lengths.max()),
          "mean_length": round(float(lengths.mean()), 1)})
    arrays, stats = pack(docs, args.seq_len, pad_id=0)
    packed = {k: torch.from_numpy(np.asarray(v, dtype=np.int64 if v.ndim == 2 else np.int32)) for k, v in arrays.items()}
    rows = packed["input_ids"].shape[0]
    need = args.global_batch_size * (args.warmup + args.steps)
    if rows < need:
        print(f"error: --documents {args.documents} pack into {rows} rows, fewer than the {need} the steps need; "
              f"raise --documents or lower --steps/--global-batch-size", file=sys.stderr)
        return 2

    def step_rows(step: int) -> list[dict]:
        lo = step * args.global_batch_size
        return [{k: v[lo:lo + args.global_batch_size] for k, v in packed.items()}]

    docs_per_step = args.global_batch_size * stats.documents / stats.rows
    grad_accum = args.hf_grad_accum or max(1, round(docs_per_step / args.hf_micro_batch_size))
    common = {"model_shape": args.model_shape, "device": _device_name(), "seq_len": args.seq_len}
    shapes: list[tuple[int, int]] = []  # (padded, real) tokens of every Trainer micro-batch

    def real_tokens(b: dict) -> int:
        shapes.append((int(b["input_ids"].numel()), int(b["attention_mask"].sum())))
        return shapes[-1][1]

    padded = None
    try:
        res = run_hf_trainer(config, PaddedDocs(docs), args=args, micro_batch=args.hf_micro_batch_size,
                             grad_accum=grad_accum, collator=pad_to_longest, tokens_of=real_tokens)
        padded = emit({"setup": "hf_trainer_padded", **common, **_useful_rate(res),
                       "documents_per_step": args.hf_micro_batch_size * grad_accum,
                       "padding_fraction": round(1 - sum(r for _, r in shapes) / sum(p for p, _ in shapes), 4)})
    except Exception as e:  # noqa: BLE001
        emit_error("hf_trainer_padded", e)
    packed_runs = []
    attns = args.attn.split(",")
    for attn in attns:
        try:
            res = run_trainer(step_rows, args=args, rows_per_step=args.global_batch_size, attn=attn,
                              tokens_per_step=lambda bs: sum(int(b["real_tokens"].sum()) for b in bs))
            packed_runs.append(emit({
                "setup": "trainer_packed", **common, "attn": attn, **_useful_rate(res),
                "packing_efficiency": round(stats.real_tokens / (stats.rows * args.seq_len), 4),
                "documents_per_step": round(docs_per_step, 1)}))
        except Exception as e:  # noqa: BLE001 - e.g. FlexAttention failing to compile: the others still run
            emit_error("trainer_packed", e, attn=attn)
    best = max(packed_runs, key=lambda r: r["useful_tokens_per_s"], default=None)
    if padded and best:
        emit({"setup": "summary", "best_packed_attn": best["attn"],
              "useful_tokens_ratio_packed_vs_padded": round(
                  best["useful_tokens_per_s"] / padded["useful_tokens_per_s"], 3)})
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if padded and len(packed_runs) == len(attns) else 1


# ---------------------------------------------------------------- communication estimate

def comm_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench comm",
                                description="Communication per step of full vs hybrid sharding for a topology.")
    p.add_argument("--instance-type", default="g6.12xlarge")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--model-shape", default="qwen2.5-1.5b")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per rank per optimizer step")
    args = p.parse_args(list(argv))
    try:
        net = flops_lib.instance_network(args.instance_type)
        config = model_config(args.model_shape)
        if args.nodes < 1 or args.micro_batches < 1:
            raise BenchError("--nodes and --micro-batches must be at least 1")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params = flops_lib.parameter_count(config)
    est = flops_lib.comm_estimate(params, nodes=args.nodes, gpus_per_node=net["gpus_per_node"],
                                  network_gbps=net["network_gbps"],
                                  intra_node_gbytes_per_s=net["intra_node_gbytes_per_s"],
                                  micro_batches=args.micro_batches)
    chosen = flops_lib.choose_sharding(est, args.nodes)
    emit({"setup": "comm_estimate", **net, "nodes": args.nodes, "params": params, "micro_batches": args.micro_batches,
          "full_s_per_step": round(est["full"]["seconds"], 3), "hybrid_s_per_step": round(est["hybrid"]["seconds"], 3),
          "all_gather_gib": round(est["full"]["all_gather_bytes"] / 2**30, 3),
          "reduce_scatter_gib": round(est["full"]["reduce_scatter_bytes"] / 2**30, 3),
          "full_network_gib_per_step": round(est["full"]["bytes_over_network"] / 2**30, 2),
          "hybrid_network_gib_per_step": round(est["hybrid"]["bytes_over_network"] / 2**30, 2),
          "default_sharding": chosen})
    print(flops_lib.format_estimate(est, nodes=args.nodes, gpus_per_node=net["gpus_per_node"],
                                    instance_type=args.instance_type, network_gbps=net["network_gbps"],
                                    chosen=chosen), file=sys.stderr)
    return 0


# ---------------------------------------------------------------- harness: Ray vs torchrun (CPU)

def steady_tokens_per_s(metrics: list[dict], skip: int) -> float:
    """Mean tokens/s of the logged intervals after the first `skip` (start-up and warm-up)."""
    rows = [r["tokens_per_s"] for r in metrics[skip:]]
    if not rows:
        raise ValueError(f"only {len(metrics)} logged intervals; log more often or run more steps")
    return float(sum(rows) / len(rows))


def _harness_config(out: Path, args):
    from trainer import local

    largs = local._parser().parse_args(["--workers", str(args.workers), "--steps", str(args.steps),
                                        "--global-batch-size", str(args.global_batch_size),
                                        "--seq-len", str(args.seq_len), "--log-every", str(args.log_every),
                                        "--checkpoint-every", "0", "--max-failures", "0", "--no-progress",
                                        "--out", str(out)])
    local.prepare_assets(out, seed=0)
    import dataclasses

    return dataclasses.replace(local.make_config(largs, out), export=False)


def harness_worker_main(argv: Sequence[str]) -> int:
    """One torchrun rank: the loop's own setup and run, storage in a local folder."""
    from trainer.config import TrainConfig
    from trainer.loop import run, setup_parallel
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


def harness_main(argv: Sequence[str]) -> int:
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
    from trainer.metrics import read_metrics

    root = Path(args.out or tempfile.mkdtemp(prefix="harness-")).absolute()
    results = {}
    for path in args.paths.split(","):
        out = root / path
        cfg = _harness_config(out, args)
        t0 = time.perf_counter()
        if path == "ray":
            import ray

            from trainer.launch import train

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
                   "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                   "-m", "trainer.bench", "harness-worker", json.dumps(cfg.to_dict())]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(
                Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", "")})
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


COMMANDS = {"padding": padding_main, "comm": comm_main, "harness": harness_main,
            "harness-worker": harness_worker_main}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return throughput_main(argv)


if __name__ == "__main__":
    sys.exit(main())
