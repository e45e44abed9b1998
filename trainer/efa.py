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
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from facts import ray as ray_facts
from facts.errors import EXIT_NO_PROOF, EXIT_OK, EXIT_SOCKETS, UserError

__all__ = [
    "Transport",
    "Evidence",
    "RankVerdict",
    "NodeVerdict",
    "EfaReport",
    "EfaCheckError",
    "EfaFallbackError",
    "EfaEvidenceMissingError",
    "LogFileError",
    "MissingLog",
    "analyze_lines",
    "analyze_logs",
    "verdict_lines",
    "exit_code",
    "likely_causes",
    "enforce_efa",
    "nccl_debug_file_pattern",
    "nccl_debug_env",
    "make_debug_file_dir",
    "why_absent",
    "NCCL_LOG_DIR",
    "SETUP_HOOK",
    "expand_nccl_debug_file",
    "check_own_rank",
    "main",
]


class Transport(StrEnum):
    """How a rank's (or node's) NCCL traffic left the node."""

    EFA = "EFA"
    SOCKET = "SOCKET"
    SHM_ONLY = "SHM_ONLY"
    UNKNOWN = "UNKNOWN"


# Worst first: one socket rank makes the node a socket node.
_SEVERITY = {Transport.SOCKET: 0, Transport.EFA: 1, Transport.SHM_ONLY: 2, Transport.UNKNOWN: 3}


class EfaCheckError(RuntimeError):
    """Base class: the EFA proof failed."""


class EfaFallbackError(EfaCheckError):
    """EFA was required but at least one rank uses TCP sockets."""

    def __init__(self, message: str, ranks: Sequence[RankVerdict]):
        super().__init__(message)
        self.ranks = tuple(ranks)


class EfaEvidenceMissingError(EfaCheckError):
    """EFA was required but the log holds no NCCL transport line to prove it."""


class LogFileError(UserError, ValueError):
    """A log path given by the user cannot be read."""


@dataclass(frozen=True)
class Evidence:
    """One log line that contributed to a verdict, with where it came from."""

    source: str
    line_no: int
    text: str

    @property
    def message(self) -> str:
        """The NCCL message without the host:pid:tid [dev] prefix."""
        m = _PREFIX.search(self.text)
        return m.group("msg").strip() if m else self.text.strip()

    def __str__(self) -> str:
        return f"{self.source}:{self.line_no}: {self.text}"


@dataclass(frozen=True)
class RankVerdict:
    """The transport of one NCCL process (one training rank)."""

    host: str
    pid: int | None
    cuda_device: int | None
    rank: int | None
    n_ranks: int | None
    n_nodes: int | None
    transport: Transport
    network: str | None
    provider: str | None
    ofi_version: str | None
    nccl_version: str | None
    evidence: tuple[Evidence, ...]
    sources: tuple[str, ...]

    @property
    def label(self) -> str:
        where = [f"host {self.host}"] if self.rank is not None else []
        if self.pid is not None:
            where.append(f"pid {self.pid}")
        if self.cuda_device is not None:
            where.append(f"cuda:{self.cuda_device}")
        head = f"rank {self.rank}" if self.rank is not None else f"host {self.host}"
        return f"{head} ({', '.join(where)})" if where else head


@dataclass(frozen=True)
class NodeVerdict:
    """The transport of one host: the worst verdict among its ranks."""

    host: str
    transport: Transport
    ranks: tuple[RankVerdict, ...]

    @property
    def deciding(self) -> tuple[RankVerdict, ...]:
        return tuple(r for r in self.ranks if r.transport == self.transport)

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        for r in self.deciding:
            if r.evidence:
                return r.evidence
        return ()

    def _first(self, attr: str) -> str | None:
        return next((getattr(r, attr) for r in self.deciding if getattr(r, attr)), None)

    @property
    def network(self) -> str | None:
        return self._first("network")

    @property
    def provider(self) -> str | None:
        return self._first("provider")

    @property
    def ofi_version(self) -> str | None:
        return self._first("ofi_version")


@dataclass(frozen=True)
class MissingLog:
    """A rank whose own NCCL debug file is not there: which file was expected, and why it is absent."""

    host: str
    pid: int
    path: str
    pattern: str
    reason: str

    def __str__(self) -> str:
        return (f"host {self.host} pid {self.pid}: expected NCCL debug file '{self.path}' "
                f"(NCCL_DEBUG_FILE={self.pattern}): {self.reason}")


@dataclass(frozen=True)
class EfaReport:
    ranks: tuple[RankVerdict, ...]
    nodes: tuple[NodeVerdict, ...] = field(init=False)
    missing: tuple[MissingLog, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", _group_nodes(self.ranks))

    @property
    def transport(self) -> Transport:
        return _worst(n.transport for n in self.nodes)

    def node(self, host: str) -> NodeVerdict:
        for n in self.nodes:
            if n.host == host:
                return n
        raise KeyError(f"no NCCL lines from host {host!r}; hosts seen: {[n.host for n in self.nodes]}")


# --- parsing ------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# host:pid:tid [cudaDev] ... NCCL INFO|WARN msg  (WARN lines carry file:line (func) before NCCL;
# Ray prefixes "(RayTrainWorker pid=.., ip=..)", NCCL may prefix a timestamp.)
_PREFIX = re.compile(
    r"(?P<host>[^\s:\[\]()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]"
    r"(?:[^\n]*?)? ?NCCL (?P<level>INFO|WARN|TRACE|CALL)\b ?(?P<msg>.*)$"
)
_BARE = re.compile(r"\bNCCL (?:INFO|WARN)\b ?(?P<msg>.*)$")

_SELECTED_PROVIDER = re.compile(r"NET/OFI Selected provider is (?P<prov>[^\s,]+)", re.I)
_USING_NETWORK = re.compile(r"\b(?:Using network (?P<net>.+?)|Assigned NET plugin (?P<assigned>.+?) to comm)\s*$")
_VIA_NET = re.compile(r"\bvia NET/(?P<net>[^/]+)/")
_VIA_LOCAL = re.compile(r"\bvia (?:P2P|SHM)/")
_CHANNEL = re.compile(r"\b(?:Channel|Ring) \d+(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-fA-F]+\])? -> "
                      r"(?P<dst>\d+)(?:\[[0-9a-fA-F]+\])?(?P<recv> \[receive\])?")
_OFI_VERSION = re.compile(r"NET/OFI Initializing aws-ofi-nccl (?P<ver>\S+)")
_NCCL_VERSION = re.compile(r"\bNCCL version (?P<ver>\S+)")
_COMM_RANK = re.compile(r"\brank (?P<rank>\d+) nranks (?P<nranks>\d+)", re.I)
_N_NODES = re.compile(r"\bnNodes (?P<n>\d+)")
_OFI_FAILED = re.compile(
    r"aws-ofi-nccl initialization failed"
    r"|NET/OFI Initializing plugin failed"
    r"|NET/OFI Only EFA provider is supported"
    r"|NET/OFI Unable to find a protocol that worked"
    r"|NET/Plugin ?: ?(?:dlerror=.*?)?(?:Could not find|No plugin found)"
    r"|Failed to initialize NET plugin (?:AWS Libfabric|Libfabric|OFI)\b",
    re.I,
)

_LIBFABRIC_NETS = {"libfabric", "aws libfabric", "ofi"}


def _is_libfabric(net: str) -> bool:
    return net.strip().lower() in _LIBFABRIC_NETS


def _is_efa_provider(provider: str) -> bool:
    """'efa', or a layered libfabric provider on top of it ('efa;ofi_rxr' before aws-ofi-nccl v1.0.1)."""
    return provider.split(";", 1)[0].strip().lower() == "efa"


@dataclass
class _Proc:
    """Mutable accumulator for one (host, pid)."""

    host: str
    pid: int | None
    cuda_device: int | None = None
    comm_rank: int | None = None
    comm_size: int = 0
    channel_rank: int | None = None
    n_nodes: int | None = None
    network: str | None = None
    provider: str | None = None
    ofi_version: str | None = None
    nccl_version: str | None = None
    efa: dict[str, Evidence] = field(default_factory=dict)
    sock: dict[str, Evidence] = field(default_factory=dict)
    failed: dict[str, Evidence] = field(default_factory=dict)
    net_channel: bool = False
    local: dict[str, Evidence] = field(default_factory=dict)
    nodes_line: Evidence | None = None
    sources: dict[str, None] = field(default_factory=dict)


def _feed(proc: _Proc, msg: str, ev: Evidence) -> None:
    """Record what one NCCL message says about this process's transport."""
    proc.sources.setdefault(ev.source)
    if m := _NCCL_VERSION.search(msg):
        proc.nccl_version = proc.nccl_version or m.group("ver")
    if m := _OFI_VERSION.search(msg):
        proc.ofi_version = proc.ofi_version or m.group("ver")
    if m := _COMM_RANK.search(msg):
        size = int(m.group("nranks"))
        if size > proc.comm_size:
            proc.comm_rank, proc.comm_size = int(m.group("rank")), size
    if m := _N_NODES.search(msg):
        n = int(m.group("n"))
        if proc.n_nodes is None or n > proc.n_nodes:
            proc.n_nodes, proc.nodes_line = n, ev
    if m := _SELECTED_PROVIDER.search(msg):
        prov = m.group("prov")
        proc.provider = proc.provider or prov
        (proc.efa if _is_efa_provider(prov) else proc.sock).setdefault("provider", ev)
    if m := _USING_NETWORK.search(msg):
        net, key = (m.group("net"), "network") if m.group("net") else (m.group("assigned"), "assigned")
        proc.network = proc.network or net
        if _is_libfabric(net):
            proc.efa.setdefault(key, ev)
        elif net.lower() == "socket":
            proc.sock.setdefault(key, ev)
    if m := _CHANNEL.search(msg):
        rank = m.group("dst") if m.group("recv") else m.group("src")
        proc.channel_rank = int(rank) if proc.channel_rank is None else proc.channel_rank
    if m := _VIA_NET.search(msg):
        proc.net_channel = True
        net = m.group("net")
        proc.network = proc.network or net
        if _is_libfabric(net):
            proc.efa.setdefault("channel", ev)
        elif net.lower() == "socket":
            proc.sock.setdefault("channel", ev)
    elif _VIA_LOCAL.search(msg):
        proc.local.setdefault("channel", ev)
    if m := _OFI_FAILED.search(msg):
        proc.failed.setdefault(m.group(0).lower(), ev)


_EVIDENCE_ORDER = ("provider", "network", "channel", "assigned")


def _ordered(found: dict[str, Evidence]) -> tuple[Evidence, ...]:
    """The best-known markers first (provider selection, "Using network"), whatever order NCCL printed them in."""
    return tuple(found[k] for k in sorted(found, key=_EVIDENCE_ORDER.index))


def _decide(proc: _Proc) -> tuple[Transport, tuple[Evidence, ...]]:
    """Socket evidence beats EFA evidence: a false alarm is cheaper than a false pass."""
    if proc.n_nodes is not None:
        multi_node: bool | None = proc.n_nodes > 1
    elif proc.net_channel or proc.local:
        multi_node = proc.net_channel
    else:
        multi_node = None
    if multi_node is False:
        # One-node communicators never touch the network, whatever net NCCL loaded.
        ev = tuple(e for e in (proc.nodes_line, *proc.local.values()) if e is not None)
        return Transport.SHM_ONLY, ev
    if proc.sock:
        return Transport.SOCKET, (*_ordered(proc.sock), *proc.failed.values())
    if proc.efa:
        return Transport.EFA, _ordered(proc.efa)
    if proc.failed:
        return Transport.SOCKET, tuple(proc.failed.values())
    return Transport.UNKNOWN, ()


def _freeze(proc: _Proc) -> RankVerdict:
    transport, evidence = _decide(proc)
    return RankVerdict(
        host=proc.host,
        pid=proc.pid,
        cuda_device=proc.cuda_device,
        rank=proc.comm_rank if proc.comm_rank is not None else proc.channel_rank,
        n_ranks=proc.comm_size or None,
        n_nodes=proc.n_nodes,
        transport=transport,
        network=proc.network,
        provider=proc.provider,
        ofi_version=proc.ofi_version,
        nccl_version=proc.nccl_version,
        evidence=evidence,
        sources=tuple(proc.sources),
    )


def _scan(lines: Iterable[str], source: str, procs: dict[tuple[str, int | None], _Proc]) -> None:
    """Add one file's NCCL lines to procs; unprefixed lines go to the nearest prefixed process."""
    pending: list[tuple[str, Evidence]] = []
    current: _Proc | None = None
    for no, raw in enumerate(lines, 1):
        line = _ANSI.sub("", raw).rstrip("\r\n")
        if "NCCL" not in line and "NET/" not in line:
            continue
        ev = Evidence(source, no, line.strip())
        if m := _PREFIX.search(line):
            key = (m.group("host"), int(m.group("pid")))
            current = procs.get(key)
            if current is None:
                current = procs[key] = _Proc(host=key[0], pid=key[1])
            if current.cuda_device is None:
                current.cuda_device = int(m.group("dev"))
            for msg, pev in pending:
                _feed(current, msg, pev)
            pending.clear()
            _feed(current, m.group("msg"), ev)
            continue
        bare = _BARE.search(line)
        msg = bare.group("msg") if bare else line
        if current is not None:
            _feed(current, msg, ev)
        else:
            pending.append((msg, ev))
    if pending:
        key = (f"unknown-host({Path(source).name})", None)
        proc = procs.setdefault(key, _Proc(host=key[0], pid=None))
        for msg, pev in pending:
            _feed(proc, msg, pev)


def _worst(transports: Iterable[Transport]) -> Transport:
    return min(transports, key=_SEVERITY.__getitem__, default=Transport.UNKNOWN)


def _group_nodes(ranks: Sequence[RankVerdict]) -> tuple[NodeVerdict, ...]:
    by_host: dict[str, list[RankVerdict]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r)
    return tuple(
        NodeVerdict(host=h, transport=_worst(r.transport for r in rs), ranks=tuple(rs))
        for h, rs in sorted(by_host.items())
    )


def _sort_key(r: RankVerdict) -> tuple:
    return (r.host, r.rank if r.rank is not None else 1 << 30, r.pid or 0)


def analyze_lines(lines: Iterable[str], source: str = "<log>") -> EfaReport:
    """Verdicts from the lines of one log (any mix of hosts and ranks)."""
    procs: dict[tuple[str, int | None], _Proc] = {}
    _scan(lines, source, procs)
    return EfaReport(tuple(sorted((_freeze(p) for p in procs.values()), key=_sort_key)))


def _expand_paths(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Every file to read; directories are searched recursively (Ray session log dirs)."""
    if not paths:
        raise LogFileError("no log file given: pass NCCL_DEBUG_FILE outputs or Ray worker logs")
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file())
            if not found:
                raise LogFileError(f"log directory '{p}' holds no files: pass the directory with the "
                                   "NCCL logs (for example /tmp/ray/session_latest/logs)")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        elif p.exists():
            raise LogFileError(f"log file '{p}' is not a regular file: pass a text log file or a directory")
        else:
            raise LogFileError(f"log file '{p}' does not exist: check the path (NCCL expands %h and %p "
                               "in NCCL_DEBUG_FILE, so look for the expanded names)")
    for f in files:
        if not os.access(f, os.R_OK):
            raise LogFileError(f"log file '{f}' is not readable: fix its permissions or copy it")
    return files


def analyze_logs(paths: Sequence[str | os.PathLike[str]]) -> EfaReport:
    """Verdicts from log files (or directories of them); lines of one process may span files.

    Every path is checked before any is parsed, so a bad path fails before any output.
    """
    files = _expand_paths(paths)
    procs: dict[tuple[str, int | None], _Proc] = {}
    for f in files:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                _scan(fh, str(f), procs)
        except OSError as e:
            raise LogFileError(f"cannot read log file '{f}': {e.strerror or e}") from e
    return EfaReport(tuple(sorted((_freeze(p) for p in procs.values()), key=_sort_key)))


# --- reporting ----------------------------------------------------------------------

def _rank_span(ranks: Sequence[RankVerdict]) -> str:
    known = sorted({r.rank for r in ranks if r.rank is not None})
    if len(known) != len(ranks) or not known:
        return f"{len(ranks)} process{'es' if len(ranks) != 1 else ''}"
    if len(known) == 1:
        return f"rank {known[0]}"
    if known == list(range(known[0], known[-1] + 1)):
        return f"ranks {known[0]}-{known[-1]}"
    return "ranks " + ",".join(map(str, known))


def _details(transport: Transport, network: str | None, provider: str | None,
             ofi_version: str | None) -> list[str]:
    if transport is Transport.EFA:
        parts = ["libfabric"]
        if provider:
            parts.append(f"provider {provider}")
        if ofi_version:
            parts.append(f"aws-ofi-nccl {ofi_version}")
        return parts
    if transport is Transport.SOCKET:
        parts = ["fell back to TCP"]
        if network:
            parts.append(f"network {network}")
        if provider:
            parts.append(f"provider {provider}")
        return parts
    if transport is Transport.SHM_ONLY:
        return ["intra-node P2P/SHM only, no network traffic"]
    return ["no NCCL transport lines"]


def _line(prefix: str, transport: Transport, details: list[str], evidence: Sequence[Evidence]) -> str:
    text = f"{prefix}: {transport.value} ({', '.join(details)})"
    if evidence:
        text += f' — evidence: "{evidence[0].message}"'
        if len(evidence) > 1:
            text += f" (+{len(evidence) - 1} more)"
    return text


def verdict_lines(report: EfaReport, per_rank: bool = False) -> list[str]:
    """One human line per node (and per rank when asked)."""
    out = []
    for node in report.nodes:
        details = _details(node.transport, node.network, node.provider, node.ofi_version)
        details[-1] += f"; {_rank_span(node.ranks)}"
        out.append(_line(f"EFA check: node {node.host}", node.transport, details, node.evidence))
        if per_rank:
            for r in node.ranks:
                out.append(_line(f"  {r.label}", r.transport,
                                 _details(r.transport, r.network, r.provider, r.ofi_version), r.evidence))
    out.extend(f"EFA check: no NCCL log from {m}" for m in report.missing)
    return out


def exit_code(report: EfaReport) -> int:
    """EFA on every node with network traffic (0), a socket fallback anywhere (5), no proof (4)."""
    transports = {n.transport for n in report.nodes}
    if Transport.SOCKET in transports:
        return EXIT_SOCKETS
    if Transport.EFA in transports:
        return EXIT_OK
    return EXIT_NO_PROOF


_CAUSES = {
    "sg": ("the EFA security group is missing its self-referencing rules: it must allow ALL traffic "
           "INBOUND from itself and OUTBOUND to itself (the outbound self rule is the one usually "
           "missing; 0.0.0.0/0 egress does not cover it; its usual symptom is 'Unresponsive receiver' or a hang)"),
    "device_plugin": ("the EFA device plugin is not advertising vpc.amazonaws.com/efa on the node "
                      "(kubectl describe node: Allocatable vpc.amazonaws.com/efa must be >= 1; check the "
                      "aws-efa-k8s-device-plugin pods and their tolerations)"),
    "pod_request": ("the worker pod does not request vpc.amazonaws.com/efa in its resources, so no EFA "
                    "device is mounted into it"),
    "plugin": ("the aws-ofi-nccl plugin was not found: NCCL_NET_PLUGIN must name it (ofi) and "
               "LD_LIBRARY_PATH must contain the directory holding libnccl-net-ofi.so "
               "(look for 'NET/Plugin: Could not find' in the log)"),
}


def likely_causes(ranks: Sequence[RankVerdict]) -> list[str]:
    """All known causes of a socket fallback, the ones the evidence points at first."""
    text = " ".join(e.text.lower() for r in ranks for e in r.evidence)
    order = ["sg", "device_plugin", "pod_request", "plugin"]
    if "net/plugin" in text:
        order = ["plugin", "sg", "device_plugin", "pod_request"]
    elif "no eligible providers" in text or "provider is" in text:
        order = ["device_plugin", "pod_request", "sg", "plugin"]
    return [_CAUSES[k] for k in order]


def _fallback_message(bad: Sequence[RankVerdict], total: int) -> str:
    lines = [f"EFA is required but NCCL fell back to TCP sockets on {len(bad)} of {total} rank(s):"]
    for r in bad:
        ev = r.evidence[0] if r.evidence else None
        where = f' — evidence: "{ev.message}" ({ev.source}:{ev.line_no})' if ev else ""
        lines.append(f"  {r.label}{where}")
    lines.append("Likely causes:")
    lines.extend(f"  - {c}" for c in likely_causes(bad))
    lines.append("To train over TCP anyway, set require_efa to false (the AWS sample measured EFA 2.06x "
                 "faster than TCP for the same job).")
    return "\n".join(lines)


def _no_evidence_message(unknown: Sequence[RankVerdict], missing: Sequence[MissingLog], total: int) -> str:
    lines = [f"EFA is required but {len(unknown) + len(missing)} of {total} rank(s) left no proof of their "
             "transport:"]
    lines.extend(f"  {m}" for m in missing)
    for r in unknown:
        where = f" in {', '.join(r.sources)}" if r.sources else ""
        lines.append(f"  {r.label}: no NCCL transport line{where}; set NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS covering "
                     "INIT and NET) and run the check after the first collective")
    lines.append("`python -m trainer submit` sets all of this up (see trainer.efa.nccl_debug_env); to train "
                 "without the proof, set require_efa to false (--no-require-efa).")
    return "\n".join(lines)


def enforce_efa(verdicts: Sequence[RankVerdict], require_efa: bool,
                missing: Sequence[MissingLog] = ()) -> list[RankVerdict]:
    """Return the ranks on sockets; with require_efa, raise instead of returning any.

    With require_efa every rank must prove its transport: a rank whose debug file is missing
    (`missing`) or holds no transport line raises EfaEvidenceMissingError, naming the file and
    why. SHM_ONLY ranks pass: a one-node communicator has no network to put on EFA.
    """
    bad = [r for r in verdicts if r.transport is Transport.SOCKET]
    if not require_efa:
        return bad
    if bad:
        raise EfaFallbackError(_fallback_message(bad, len(verdicts) + len(missing)), bad)
    unknown = [r for r in verdicts if r.transport is Transport.UNKNOWN]
    if missing or unknown or not verdicts:
        if not verdicts and not missing:
            raise EfaEvidenceMissingError(
                "EFA is required but no rank's NCCL log was found: set NCCL_DEBUG=INFO and NCCL_DEBUG_FILE "
                "(trainer.efa.nccl_debug_env) in the worker environment before the process group is created")
        raise EfaEvidenceMissingError(_no_evidence_message(unknown, missing, len(verdicts) + len(missing)))
    return bad


# --- per-rank debug files -------------------------------------------------------------

# On the /tmp/ray volume of every Ray pod; the RayCluster mounts a volume exactly here as well.
NCCL_LOG_DIR = ray_facts.NCCL_LOG_DIR
# Ray's runtime_env worker_process_setup_hook: runs in every worker process of a job before any
# task or actor code, so before NCCL's first call whatever order Ray starts things in.
SETUP_HOOK = "trainer.efa.make_debug_file_dir"


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


def _nccl_hostname() -> str:
    """The host name as NCCL prints it: cut at the first dot, '%' and '/' replaced by '-'."""
    name = socket.gethostname().split(".", 1)[0]
    return name.replace("%", "-").replace("/", "-")


def expand_nccl_debug_file(pattern: str, hostname: str | None = None, pid: int | None = None) -> Path:
    """The file NCCL writes for NCCL_DEBUG_FILE=pattern: %h host, %p pid, %% a percent sign."""
    host = _nccl_hostname() if hostname is None else hostname
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
        missing = MissingLog(_nccl_hostname(), os.getpid(), str(path), pattern, why_absent(path, env))
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
    everyone = gather((_nccl_hostname(), own.ranks, own.missing))
    hosts = {host for host, _, _ in everyone}
    report = EfaReport(tuple(r for _, ranks, _ in everyone for r in ranks),
                       missing=tuple(m for _, _, missing in everyone for m in missing))
    return report, require_setting(env.get(REQUIRE_EFA_ENV), len(hosts))


# --- command line -------------------------------------------------------------------

_HELP = """\
Reads NCCL_DEBUG=INFO output (NCCL_DEBUG_FILE files, Ray worker logs, or directories of
them such as /tmp/ray/session_latest/logs) and prints one verdict per node.

Verdicts: EFA (aws-ofi-nccl with provider efa), SOCKET (NCCL fell back to TCP),
SHM_ONLY (one-node communicators: P2P/SHM inside the node, no network at all),
UNKNOWN (no NCCL transport line). A bare "NET/Socket : Using [0]eth0" line is not a
fallback: NCCL prints it even when aws-ofi-nccl is selected.

exit codes (the README's table, `python -m facts.errors`):
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
    p.add_argument("logs", nargs="+", metavar="LOGFILE", help="NCCL log file or directory of log files")
    p.add_argument("--per-rank", action="store_true", help="also print one line per rank")
    return p


def main(argv: list[str]) -> int:
    """``python -m trainer efa-check LOGFILE...``; returns the exit code (a bad log path raises LogFileError)."""
    args = _parser().parse_args(argv)
    report = analyze_logs(args.logs)
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

