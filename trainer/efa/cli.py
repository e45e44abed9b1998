"""`python -m trainer efa-check LOGFILE...`: one verdict per node, and the exit code
(docs/troubleshooting.md, Exit codes)."""

from __future__ import annotations

import argparse
import sys

from facts.errors import EXIT_OK, EXIT_SOCKETS
from trainer.efa.parse import analyze_lines, analyze_logs
from trainer.efa.report import exit_code, likely_causes, verdict_lines
from trainer.efa.verdicts import Transport

_HELP = """\
Reads NCCL_DEBUG=INFO output (NCCL_DEBUG_FILE files, Ray worker logs, or directories of
them such as /tmp/ray/session_latest/logs; `-` reads standard input, e.g. from `kubectl
logs`) and prints one verdict per node.

Verdicts: EFA (aws-ofi-nccl with provider efa), SOCKET (NCCL fell back to TCP),
SHM_ONLY (one-node communicators: P2P/SHM inside the node, no network at all),
UNKNOWN (no NCCL transport line). A bare "NET/Socket : Using [0]eth0" line is not a
fallback: NCCL prints it even when aws-ofi-nccl is selected.

exit codes (docs/troubleshooting.md, Exit codes; `python -m facts.errors`):
  0  EFA on every node that shows network traffic
  5  a fallback to sockets on at least one node (that node is named)
  4  no proof either way: no NCCL transport line, or single-node (SHM_ONLY) logs only,
     which prove nothing about EFA; run with NCCL_DEBUG=INFO on two or more nodes
  2  usage error: no, missing or unreadable log file
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer efa-check",
        description="Prove from NCCL debug logs that collectives used EFA.",
        epilog=_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("logs", nargs="+", metavar="LOGFILE", help="NCCL log file or directory of log files; - for stdin")
    p.add_argument("--per-rank", action="store_true", help="also print one line per rank")
    return p


def main(argv: list[str]) -> int:
    """``python -m trainer efa-check LOGFILE...``; returns the exit code (a bad log path raises LogFileError)."""
    args = _parser().parse_args(argv)
    report = analyze_lines(sys.stdin, "<stdin>") if args.logs == ["-"] else analyze_logs(args.logs)
    for line in verdict_lines(report, per_rank=args.per_rank):
        print(line)
    code = exit_code(report)
    if code == EXIT_SOCKETS:
        bad = [n.host for n in report.nodes if n.transport is Transport.SOCKET]
        print(f"EFA check: FAIL — TCP socket fallback on node(s) {', '.join(bad)}. Likely causes:")
        for cause in likely_causes([r for n in report.nodes for r in n.ranks if r.transport is Transport.SOCKET]):
            print(f"  - {cause}")
    elif code == EXIT_OK:
        efa = sum(n.transport is Transport.EFA for n in report.nodes)
        print(f"EFA check: PASS — EFA on {efa} node(s) with network traffic")
    elif report.transport is Transport.SHM_ONLY:
        print("EFA check: NO PROOF — single-node logs only (P2P/SHM, no network): they prove nothing "
              "about EFA; run on two or more nodes")
    else:
        print("EFA check: NO PROOF — no NCCL transport lines in "
              f"{', '.join(args.logs)}: were they written with NCCL_DEBUG=INFO?")
    return code
