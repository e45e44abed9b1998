"""`python -m trainer data`: see what the model will learn before paying for GPUs.

Reads, renders, masks and packs the dataset exactly as the job will (the same flags,
tokenizer, chat template and --train-on), then prints the counts (records, tokens, trained
tokens, dropped and truncated records and why, packing fill, steps per epoch) and shows N
rendered records with the trained tokens marked.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from trainer.config import ConfigError, add_arguments, from_args

OPEN, CLOSE = "⟦", "⟧"


def marked(tokenizer, ids: Sequence[int], mask: Sequence[bool]) -> str:
    """The rendered record with each run of trained tokens between OPEN and CLOSE."""
    out: list[str] = []
    run: list[int] = []
    state = None
    for token, trained in [*zip(ids, mask), (None, None)]:
        if trained != state and run:
            text = tokenizer.decode(run)
            out.append(f"{OPEN}{text}{CLOSE}" if state else text)
            run = []
        state = trained
        if token is not None:
            run.append(token)
    return "".join(out)


def report(cfg, tokenizer, show: int = 0, storage_fs=None) -> dict:
    """Counts of the whole dataset as the job packs it, and the first `show` records rendered."""
    from trainer import sources
    from trainer.data import DataSpec, examples, pack_dataset
    from trainer.formats import Renderer

    spec = DataSpec.from_config(cfg)
    source = sources.resolve(spec.dataset, config=spec.config, split=spec.split, storage_fs=storage_fs,
                             cache_dir=cfg.resolved_cache_dir)
    ds = sources.open_dataset(source, cache_dir=cfg.resolved_cache_dir)
    _, stats = pack_dataset(ds, spec, tokenizer, cfg.seq_len)
    renderer = Renderer(tokenizer, cfg.train_on)
    shown = [marked(tokenizer, *renderer.encode(ex))
             for ex in examples(ds.select(range(min(show, len(ds)))), spec.dataset, spec.text_field)]
    return {"records": len(ds), "tokens": stats.tokens, "trained_tokens": stats.trained_tokens,
            "documents": stats.documents, "dropped": stats.dropped, "drop_reasons": stats.drop_reasons,
            "truncated": stats.truncated, "rows": stats.rows, "fill": stats.fill, "seq_len": cfg.seq_len,
            "packed_tokens": stats.real_tokens, "packed_trained_tokens": stats.loss_tokens,
            "steps_per_epoch": stats.rows // cfg.global_batch_size, "global_batch_size": cfg.global_batch_size,
            "examples": shown}


def render_report(r: dict) -> str:
    lines = [
        f"records          {r['records']:,}",
        f"tokens           {r['tokens']:,} rendered, {r['trained_tokens']:,} of them trained "
        f"({r['trained_tokens'] / max(1, r['tokens']):.1%})",
        f"kept             {r['documents']:,} records; {r['truncated']:,} truncated to --seq-len {r['seq_len']}",
        f"dropped          {r['dropped']:,}" + "".join(f"\n                   {n:,} {why}"
                                                    for why, n in r["drop_reasons"].items()),
        f"packed           {r['rows']:,} rows of {r['seq_len']} tokens, {r['fill']:.1%} full "
        f"({r['packed_trained_tokens']:,} trained tokens)",
        f"steps per epoch  {r['steps_per_epoch']:,} at --global-batch-size {r['global_batch_size']}",
    ]
    if r["steps_per_epoch"] < 1:
        lines.append("                   fewer rows than one global batch: lower --global-batch-size or add data")
    for i, text in enumerate(r["examples"]):
        lines += ["", f"--- record {i} (trained tokens between {OPEN} and {CLOSE}) ---", text]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer data",
        description="Validate a dataset the way the job will, print its counts, and show rendered records "
                    "with the trained tokens marked. Takes the training flags (--dataset, --model, --seq-len, "
                    "--train-on, --chat-template, ...).")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="show the first N records rendered")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    show = args.__dict__.pop("show")
    from trainer.data import DataError
    from trainer.launch import preflight

    try:
        if show < 0:
            raise ConfigError([f"--show {show}: must be 0 or more"])
        cfg = from_args(args)
        tokenizer = preflight(cfg)["tokenizer"]
        result = report(cfg, tokenizer, show)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"error: --dataset: {e}", file=sys.stderr)
        return 2
    print(render_report(result))
    return 0
