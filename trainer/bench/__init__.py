"""Throughput benchmarks, one JSON line per setup (trainer.bench.setups has the two setups they compare).

    python -m trainer.bench [--model-shape qwen2.5-1.5b|small|tiny|FOLDER|config.json] [...]
                                             the trainer's step vs transformers' Trainer (throughput)
    python -m trainer.bench padding [...]    packed trainer vs Trainer with per-batch padding (useful tokens/s)
    python -m trainer.bench comm --instance-type g6.12xlarge --nodes 2    communication estimate per step
    python -m trainer.bench harness [...]    the same training under Ray and under torchrun (CPU)
    python -m trainer.bench tokenize [...]   records -> (ids, mask) per core, µs per token (trainer.bench.tokenize)
    python -m trainer.bench data [...]       preparing a chat dataset: single process vs the Ray path

The shape is a named one (Qwen2 configs) or any model's config: a folder with config.json or the
file itself (only the config is read). Random init and random tokens: nothing is downloaded. It
needs only torch and transformers (the Trainer baseline also needs accelerate, which `pip install
transformers[torch]` brings; without it that line is an error naming the fix and the trainer's own
line still runs); Liger is used when installed. Imports neither ray nor datasets (the harness
imports ray only when it runs).
"""

from __future__ import annotations

import importlib
from typing import Sequence

from facts import errors

# the first argument -> the module whose `main(argv)` runs; anything else is the throughput benchmark's flags
COMMANDS = {"padding": "trainer.bench.padding", "comm": "trainer.bench.comm", "harness": "trainer.bench.harness",
            "tokenize": "trainer.bench.tokenize", "data": "trainer.bench.data"}
WORKER = "harness-worker"  # one torchrun rank of the harness, started by the harness itself
DATA_WORKER = "data-worker"  # one preparation of the data benchmark in a fresh process


def _dispatch(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == WORKER:
        return importlib.import_module("trainer.bench.harness").worker_main(argv[1:])
    if argv and argv[0] == DATA_WORKER:
        return importlib.import_module("trainer.bench.data").worker_main(argv[1:])
    if argv and argv[0] in COMMANDS:
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    return importlib.import_module("trainer.bench.throughput").main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.bench` and `python -m trainer bench`: a bad option prints `error: ...` and exits 2."""
    return errors.run(_dispatch, argv)
