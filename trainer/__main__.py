"""`python -m trainer <command>`: one entry point, commands imported only when used."""

from __future__ import annotations

import importlib
import sys

# command -> (module, function taking argv and returning an exit code)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "local": ("trainer.local", "main", "fine-tune a tiny model on a local CPU Ray cluster (start here)"),
    "data": ("trainer.datacheck", "main", "validate a dataset as the job will: counts and rendered examples"),
    "train": ("trainer.launch", "main", "run a training job on a running Ray cluster"),
    "submit": ("trainer.submit", "main", "submit a run to a Ray cluster as a Ray job and follow it"),
    "status": ("trainer.submit", "status_main", "show a submitted run's status"),
    "logs": ("trainer.submit", "logs_main", "stream a submitted run's logs"),
    "stop": ("trainer.submit", "stop_main", "stop a submitted run"),
    "efa-check": ("trainer.efa", "main", "decide from NCCL debug logs whether collectives used EFA"),
    "nccl-bench": ("trainer.submit", "bench_main", "all-reduce bandwidth across every worker, as a Ray job"),
}


def usage() -> str:
    lines = ["usage: python -m trainer <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "python -m trainer <command> --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    from trainer.errors import cli

    module, func, _ = COMMANDS[name]
    return cli(getattr(importlib.import_module(module), func))(rest)


if __name__ == "__main__":
    sys.exit(main())
