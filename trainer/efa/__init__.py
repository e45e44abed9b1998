"""Prove from NCCL's own debug log whether collectives crossed nodes over EFA.

NCCL picks its network once per communicator and falls back to TCP sockets silently
when the aws-ofi-nccl plugin or the EFA device is missing; the job still trains, about
2x slower. The only proof is in the NCCL_DEBUG=INFO output, so this module reads it.

Pure Python on purpose: it runs on a laptop against copied logs, inside a training
rank after its first collectives, and from ``python -m trainer efa-check``.

The markers follow the wording of the sources across releases, not one log at hand:

- aws-ofi-nccl (src/nccl_ofi_net.c*, nccl_ofi_api.c*): "Selected Provider is %s" (v0.9-v1.4),
  "... (found %d nics)" (v1.6-v1.13), "Selected provider is %s, fabric is %s (found %d nics)"
  (v1.14+). Before v1.0.1 libfabric's EFA provider was layered, so the name was "efa;ofi_rxr".
  "No eligible providers were found" is an INFO of v1.16+ printed when one protocol (RDMA) finds
  no provider before the next (SENDRECV) is tried: not a failure on its own. A real failure ends in
  "Unable to find a protocol that worked" (v1.13+) or "aws-ofi-nccl initialization failed".
  The plugin is named "AWS Libfabric" (all releases), "Libfabric" (v1.13+) or "OFI" (NCCL_NET=OFI).
- NCCL (src/init.cc, transport/net.cc, plugin/net.cc): "Using network %s" (2.7+), "Assigned NET
  plugin %s to comm" (2.27+), "Channel %02d[/%d] : r[busId|dev] -> r[..] via NET/%s/%d" (busId in
  hex before 2.18), "Ring %02d : a -> b via NET/%s" (2.4). The plugin missing: "NET/Plugin : No
  plugin found" (2.7-2.21), "NET/Plugin: Could not find: ... Using internal network plugin" (2.23+);
  its init failing: "Failed to initialize NET plugin %s" (2.27+). "NET/Socket : Using [0]eth0" and
  "Bootstrap : Using eth0" are printed for the bootstrap network whatever carries the data.
- NCCL_DEBUG_FILE (src/debug.cc): expanded (%h host cut at the first '.', %p pid) and opened with
  fopen(path, "w") only when NCCL_DEBUG is above VERSION; no directory is created, and when fopen
  fails the output goes to stdout.

The package, one concern per module: `verdicts` (what a rank, a node, a report is), `parse`
(the log markers), `report` (verdict lines, exit codes, the in-job enforcement), `in_job`
(per-rank debug files, the setup hook, the gather across ranks), `cli` (`efa-check`).
"""

from trainer.efa.in_job import (
                                NCCL_LOG_DIR,
                                REQUIRE_EFA_ENV,
                                SETUP_HOOK,
                                check_own_rank,
                                debug_file_dir,
                                expand_nccl_debug_file,
                                gather_report,
                                make_debug_file_dir,
                                nccl_debug_env,
                                nccl_debug_file_pattern,
                                nccl_hostname,
                                require_setting,
                                why_absent,
)
from trainer.efa.parse import LogFileError, analyze_lines, analyze_logs
from trainer.efa.report import enforce_efa, exit_code, likely_causes, verdict_lines
from trainer.efa.verdicts import (
                                EfaCheckError,
                                EfaEvidenceMissingError,
                                EfaFallbackError,
                                EfaReport,
                                Evidence,
                                MissingLog,
                                NodeVerdict,
                                RankVerdict,
                                Transport,
)

__all__ = [
    "Transport", "Evidence", "RankVerdict", "NodeVerdict", "EfaReport", "MissingLog", "EfaCheckError", "EfaFallbackError",
    "EfaEvidenceMissingError", "LogFileError", "analyze_lines", "analyze_logs", "verdict_lines", "exit_code",
    "likely_causes", "enforce_efa", "nccl_debug_file_pattern", "nccl_debug_env", "debug_file_dir",
    "make_debug_file_dir", "nccl_hostname", "expand_nccl_debug_file", "why_absent", "check_own_rank", "NCCL_LOG_DIR",
    "SETUP_HOOK", "REQUIRE_EFA_ENV", "require_setting", "gather_report",
]
