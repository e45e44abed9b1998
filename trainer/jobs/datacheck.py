"""`python -m trainer data`: see what the model will learn before paying for GPUs.

Reads, renders, masks and packs the dataset exactly as the job will (the same flags,
tokenizer, chat template and --train-on), then prints the counts (records, tokens, trained
tokens, dropped and truncated records and why, packing fill, steps per epoch) and shows N
rendered records with the trained tokens marked.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from trainer.config.flags import ConfigError
from trainer.config.load import add_arguments, from_args
from trainer.data import sources
from trainer.data.formats import Renderer
from trainer.data.packing import DataError, DataSpec, examples, pack_dataset, summary
from trainer.jobs.launch import preflight

OPEN, CLOSE = "⟦", "⟧"


def marked(tokenizer, ids: Sequence[int], mask: Sequence[bool]) -> str:
    """The rendered record with each run of trained tokens between OPEN and CLOSE."""
    out: list[str] = []
    run: list[int] = []
    state = None
    for token, trained in [*zip(ids, mask, strict=True), (None, None)]:
        if trained != state and run:
            text = tokenizer.decode(run)
            out.append(f"{OPEN}{text}{CLOSE}" if state else text)
            run = []
        state = trained
        if token is not None:
            run.append(token)
    return "".join(out)


def report(cfg, tokenizer, show: int = 0, storage_fs=None, meta: dict | None = None) -> dict:
    """Counts of the whole dataset as the job packs it (`meta`: the packed data's, when the pre-flight
    packed it already), and the first `show` records rendered."""

    spec = DataSpec.from_config(cfg)
    source = sources.resolve(spec.dataset, config=spec.config, split=spec.split, storage_fs=storage_fs,
                             cache_dir=cfg.resolved_cache_dir)
    ds = sources.open_dataset(source, cache_dir=cfg.resolved_cache_dir)
    if meta is None:
        stats = pack_dataset(ds, spec, tokenizer, cfg.seq_len)
        meta = {**stats.__dict__, "fill": stats.fill, "records": len(ds)}
    renderer = Renderer(tokenizer, cfg.train_on)
    shown = [marked(tokenizer, *renderer.encode(ex))
             for ex in examples(ds.select(range(min(show, len(ds)))), spec.dataset, spec.text_field)]
    return {"records": len(ds), "tokens": meta["tokens"], "trained_tokens": meta["trained_tokens"],
            "documents": meta["documents"], "dropped": meta["dropped"], "drop_reasons": meta["drop_reasons"],
            "truncated": meta["truncated"], "rows": meta["rows"], "fill": meta["fill"], "seq_len": cfg.seq_len,
            "packed_tokens": meta["real_tokens"], "packed_trained_tokens": meta["loss_tokens"],
            "steps_per_epoch": meta["rows"] // cfg.global_batch_size, "global_batch_size": cfg.global_batch_size,
            "notes": summary({**meta, "records": len(ds), "seq_len": cfg.seq_len}, cfg.overlong), "examples": shown}


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
    lines += [f"note             {note}" for note in r.get("notes", [])]
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

    if show < 0:
        raise ConfigError([f"--show {show}: must be 0 or more"])
    cfg = from_args(args)
    info = preflight(cfg, for_run=False)  # `trainer data` writes no run
    try:
        result = report(cfg, info["tokenizer"], show, meta=info.get("data"))
    except DataError as e:
        raise ConfigError([f"--dataset: {e}"]) from None
    print(render_report(result))
    return 0
