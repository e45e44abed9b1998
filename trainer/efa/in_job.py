"""Inside the job: per-rank NCCL debug files, their folder made by the Ray worker setup hook, the gathered proof."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from facts import ray as ray_facts
from trainer.efa.parse import analyze_logs
from trainer.efa.report import enforce_efa
from trainer.efa.verdicts import EfaEvidenceMissingError, EfaReport, MissingLog

# On the /tmp/ray volume of every Ray pod; the RayCluster mounts a volume exactly here as well.
NCCL_LOG_DIR = ray_facts.NCCL_LOG_DIR


# Ray's runtime_env worker_process_setup_hook: runs in every worker process of a job before any
# task or actor code, so before NCCL's first call whatever order Ray starts things in.
SETUP_HOOK = "trainer.efa.in_job.make_debug_file_dir"


def nccl_debug_file_pattern(log_dir: str | os.PathLike[str]) -> str:
    """NCCL_DEBUG_FILE value giving each process its own file (NCCL expands %h and %p)."""
    return str(Path(log_dir) / "nccl.%h.%p.log")


def nccl_debug_env(log_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Environment that makes NCCL write the lines this module reads, one file per rank.

    NCCL_DEBUG must be INFO: the transport lines ("Using network", "Selected provider is") are INFO.
    """
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
            "NCCL_DEBUG_FILE": nccl_debug_file_pattern(log_dir)}


def debug_file_dir(pattern: str) -> Path:
    """The directory NCCL will open its debug file in (the pattern's own directory part never holds %h/%p here)."""
    return expand_nccl_debug_file(pattern).parent


def make_debug_file_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """Create the directory of NCCL_DEBUG_FILE: NCCL creates none and falls back to stdout without it.

    The Ray worker setup hook (SETUP_HOOK). Never raises: a worker must not die over a log
    folder; if the folder cannot be made, the EFA check says which and why.
    """
    env = os.environ if environ is None else environ
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    folder = debug_file_dir(pattern)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"trainer.efa: cannot create {folder} for NCCL_DEBUG_FILE={pattern}: {err.strerror or err}",
              file=sys.stderr)
        return None
    return folder


def nccl_hostname() -> str:
    """The host name as NCCL prints it: cut at the first dot, '%' and '/' replaced by '-'."""
    name = socket.gethostname().split(".", 1)[0]
    return name.replace("%", "-").replace("/", "-")


def expand_nccl_debug_file(pattern: str, hostname: str | None = None, pid: int | None = None) -> Path:
    """The file NCCL writes for NCCL_DEBUG_FILE=pattern: %h host, %p pid, %% a percent sign."""
    host = nccl_hostname() if hostname is None else hostname
    pid = os.getpid() if pid is None else pid
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c != "%" or i + 1 >= len(pattern):
            out.append(c)
            i += 1
            continue
        nxt = pattern[i + 1]
        out.append({"%": "%", "h": host, "p": str(pid)}.get(nxt, "%" + nxt))
        i += 2
    return Path("".join(out))


def why_absent(path: Path, env: Mapping[str, str]) -> str:
    """Why NCCL left no debug file at `path`, from what can be checked in this process."""
    folder = path.parent
    stdout = ("NCCL then writes its debug output to stdout instead (NCCL src/debug.cc), which lands in this "
              "worker's Ray log (/tmp/ray/session_latest/logs/worker-*.out), not where the check reads")
    if not folder.is_dir():
        return (f"its directory '{folder}' does not exist and NCCL creates no directories; {stdout}. Create it "
                f"before NCCL's first call: `trainer submit` does, with the Ray worker setup hook {SETUP_HOOK}, "
                "and the RayCluster mounts a volume there")
    if not os.access(folder, os.W_OK | os.X_OK):
        return (f"its directory '{folder}' is not writable by uid {os.getuid()}, so NCCL could not create the "
                f"file; {stdout}. Make the directory writable for the Ray worker's user")
    level = (env.get("NCCL_DEBUG") or "").strip().upper()
    if level not in ("INFO", "TRACE"):
        return (f"NCCL_DEBUG is {level or 'not set'}; NCCL opens NCCL_DEBUG_FILE only above VERSION and writes "
                "its transport lines only at INFO: set NCCL_DEBUG=INFO before the process group is created")
    return ("no NCCL communicator has been created in this process yet (NCCL opens the file at its first "
            "call), or NCCL_DEBUG_FILE changed after NCCL had started (it reads it once); run the check after "
            "the first collective, in the process that ran it")


def check_own_rank(require_efa: bool, environ: Mapping[str, str] | None = None) -> EfaReport:
    """Check the calling rank's own NCCL_DEBUG_FILE; call after the first collectives.

    A missing file is reported in EfaReport.missing with the reason; with require_efa it raises.
    """
    env = os.environ if environ is None else environ
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern:
        if require_efa:
            raise EfaEvidenceMissingError(
                "EFA is required but NCCL_DEBUG_FILE is not set in this rank's environment: set the "
                "variables from trainer.efa.nccl_debug_env(log_dir) before the process group is created")
        return EfaReport(())
    path = expand_nccl_debug_file(pattern)
    if not path.is_file():
        missing = MissingLog(nccl_hostname(), os.getpid(), str(path), pattern, why_absent(path, env))
        if require_efa:
            raise EfaEvidenceMissingError(f"EFA is required but there is no proof from this rank: {missing}")
        return EfaReport((), missing=(missing,))
    report = analyze_logs([path])
    enforce_efa(report.ranks, require_efa)
    return report


REQUIRE_EFA_ENV = "TRAINER_REQUIRE_EFA"


def require_setting(value: str | None, nodes: int) -> bool:
    """TRAINER_REQUIRE_EFA: 1 or 0, or auto (the default): required when the job spans nodes."""
    text = (value or "auto").strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    if text == "auto":
        return nodes > 1
    raise ValueError(f"{REQUIRE_EFA_ENV}={value!r}: use 1 (require EFA), 0 (only report) or auto")


def gather_report(gather: Callable[[Any], list], environ: Mapping[str, str] | None = None) -> tuple[EfaReport, bool]:
    """Every rank, after the first collectives: read its own NCCL log, share the verdicts, decide.

    `gather` is an all-gather of one picklable object across ranks (torch.distributed's
    all_gather_object). Returns the report over all ranks (missing files included) and whether
    EFA is required, the same on every rank, so every rank raises together in enforce_efa.
    """
    env = os.environ if environ is None else environ
    own = check_own_rank(require_efa=False, environ=env)
    everyone = gather((nccl_hostname(), own.ranks, own.missing))
    hosts = {host for host, _, _ in everyone}
    report = EfaReport(tuple(r for _, ranks, _ in everyone for r in ranks),
                       missing=tuple(m for _, _, missing in everyone for m in missing))
    return report, require_setting(env.get(REQUIRE_EFA_ENV), len(hosts))
