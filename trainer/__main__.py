"""`python -m trainer <command>` and the `trainer` console script: the one entry point of every command.

Each command's module is imported only when it runs, and every command runs through the one
wrapper of facts.errors: a user error prints as `error: ...` and exits with its code
(docs/troubleshooting.md, Exit codes).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from facts import errors


@dataclass(frozen=True)
class Command:
    module: str
    function: str  # takes the arguments after the command's name, returns an exit code
    help: str
    listed: bool = True  # False: run by the project itself (a job's entry point), not by users


COMMANDS: dict[str, Command] = {
    "local": Command("trainer.jobs.local", "main", "fine-tune a tiny model on a local CPU Ray cluster (start here)"),
    "data": Command("trainer.jobs.datacheck", "main", "validate a dataset as the job will: counts and rendered examples"),
    "train": Command("trainer.jobs.launch", "main", "run a training job on a running Ray cluster"),
    "submit": Command("trainer.submit.cli", "main", "submit a run to a Ray cluster as a Ray job and follow it"),
    "status": Command("trainer.submit.cli", "status_main", "show a submitted run's status"),
    "logs": Command("trainer.submit.cli", "logs_main", "stream a submitted run's logs"),
    "stop": Command("trainer.submit.cli", "stop_main", "stop a submitted run"),
    "efa-check": Command("trainer.efa.cli", "main", "decide from NCCL debug logs whether collectives used EFA"),
    "nccl-bench": Command("trainer.submit.cli", "bench_main", "all-reduce bandwidth across every worker, as a Ray job"),
    "bench": Command("trainer.bench", "main", "throughput benchmarks: the step against transformers' Trainer, "
                                              "padding, communication, Ray against torchrun"),
    "plan": Command("trainer.submit.cli", "plan_main", "memory per GPU, sharding, tokens/s and cost of each method "
                                                       "(full, lora, qlora) on a target, before the GPU hour"),
    "flags": Command("trainer.config.flags", "main", "print the table of training flags (docs/training.md)"),
    "nccl-bench-job": Command("trainer.efa.nccl_bench", "main", "the nccl-bench job on the cluster", listed=False),
}


def usage() -> str:
    lines = ["usage: python -m trainer <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {c.help}" for name, c in COMMANDS.items() if c.listed]
    lines += ["", "python -m trainer <command> --help shows a command's options."]
    return "\n".join(lines)


def dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return errors.EXIT_OK if argv else errors.EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        raise errors.UserError(f"unknown command {name!r}\n\n{usage()}")
    command = COMMANDS[name]
    return getattr(importlib.import_module(command.module), command.function)(rest)


def main(argv: list[str] | None = None) -> int:
    return errors.run(dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
