"""`python -m trainer.bench padding`: useful (non-padding) tokens/s of packed rows against per-batch padding.

The dataset is a deterministic, long-tailed instruction set (random tokens with realistic prompt
and response lengths); the trainer packs it into full rows, transformers' Trainer pads each
micro-batch to its longest document, as DataCollatorWithPadding does.
"""

from __future__ import annotations

import argparse
import math
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist

from trainer.bench.setups import device_name, emit, emit_error, on_gpu, run_hf_trainer, run_trainer, useful_rate
from trainer.bench.shapes import BenchError, model_config
from trainer.loop.step import IGNORE_INDEX


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
    for p, r in zip(prompt, response, strict=True):
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


def main(argv: Sequence[str]) -> int:
    from trainer.data.packing import pack

    gpu = on_gpu()
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
    config = model_config(args.model_shape)
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
        raise BenchError(f"--documents {args.documents} pack into {rows} rows, fewer than the {need} the steps need; "
                         f"raise --documents or lower --steps/--global-batch-size")

    def step_rows(step: int) -> list[dict]:
        lo = step * args.global_batch_size
        return [{k: v[lo:lo + args.global_batch_size] for k, v in packed.items()}]

    docs_per_step = args.global_batch_size * stats.documents / stats.rows
    grad_accum = args.hf_grad_accum or max(1, round(docs_per_step / args.hf_micro_batch_size))
    common = {"model_shape": args.model_shape, "device": device_name(), "seq_len": args.seq_len}
    shapes: list[tuple[int, int]] = []  # (padded, real) tokens of every Trainer micro-batch

    def real_tokens(b: dict) -> int:
        shapes.append((int(b["input_ids"].numel()), int(b["attention_mask"].sum())))
        return shapes[-1][1]

    padded = None
    try:
        res = run_hf_trainer(config, PaddedDocs(docs), args=args, micro_batch=args.hf_micro_batch_size,
                             grad_accum=grad_accum, collator=pad_to_longest, tokens_of=real_tokens)
        padded = emit({"setup": "hf_trainer_padded", **common, **useful_rate(res),
                       "documents_per_step": args.hf_micro_batch_size * grad_accum,
                       "padding_fraction": round(1 - sum(r for _, r in shapes) / sum(p for p, _ in shapes), 4)})
    except Exception as e:  # noqa: BLE001 - report the baseline's failure and still measure the packed runs
        emit_error("hf_trainer_padded", e)
    packed_runs = []
    attns = args.attn.split(",")
    for attn in attns:
        try:
            res = run_trainer(step_rows, args=args, rows_per_step=args.global_batch_size, attn=attn,
                              tokens_per_step=lambda bs: sum(int(b["real_tokens"].sum()) for b in bs))
            packed_runs.append(emit({
                "setup": "trainer_packed", **common, "attn": attn, **useful_rate(res),
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


