"""Reading NCCL_DEBUG=INFO logs: each rank's markers, decided into a verdict (the markers: trainer.efa)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from facts.errors import UserError
from trainer.efa.verdicts import PREFIX, EfaReport, Evidence, RankVerdict, Transport


class LogFileError(UserError, ValueError):
    """A log path given by the user cannot be read."""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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
    for pattern, record in _MARKERS:
        if m := pattern.search(msg):
            record(proc, m, ev)
    if _VIA_LOCAL.search(msg) and not _VIA_NET.search(msg):
        proc.local.setdefault("channel", ev)


def _nccl_version(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    proc.nccl_version = proc.nccl_version or m.group("ver")


def _ofi_version(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    proc.ofi_version = proc.ofi_version or m.group("ver")


def _comm_rank(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    size = int(m.group("nranks"))
    if size > proc.comm_size:
        proc.comm_rank, proc.comm_size = int(m.group("rank")), size


def _n_nodes(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    n = int(m.group("n"))
    if proc.n_nodes is None or n > proc.n_nodes:
        proc.n_nodes, proc.nodes_line = n, ev


def _provider(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    prov = m.group("prov")
    proc.provider = proc.provider or prov
    (proc.efa if _is_efa_provider(prov) else proc.sock).setdefault("provider", ev)


def _network(proc: _Proc, net: str, key: str, ev: Evidence) -> None:
    """A network NCCL names: EFA evidence for libfabric, socket evidence for Socket, the first one kept."""
    proc.network = proc.network or net
    if _is_libfabric(net):
        proc.efa.setdefault(key, ev)
    elif net.lower() == "socket":
        proc.sock.setdefault(key, ev)


def _using_network(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    net, key = (m.group("net"), "network") if m.group("net") else (m.group("assigned"), "assigned")
    _network(proc, net, key, ev)


def _channel(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    rank = m.group("dst") if m.group("recv") else m.group("src")
    proc.channel_rank = int(rank) if proc.channel_rank is None else proc.channel_rank


def _via_net(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    proc.net_channel = True
    _network(proc, m.group("net"), "channel", ev)


def _ofi_failed(proc: _Proc, m: re.Match, ev: Evidence) -> None:
    proc.failed.setdefault(m.group(0).lower(), ev)


# each marker NCCL prints and what it records, in this order (a network named first is the one kept)
_MARKERS = ((_NCCL_VERSION, _nccl_version), (_OFI_VERSION, _ofi_version), (_COMM_RANK, _comm_rank),
            (_N_NODES, _n_nodes),
            (_SELECTED_PROVIDER, _provider), (_USING_NETWORK, _using_network), (_CHANNEL, _channel),
            (_VIA_NET, _via_net), (_OFI_FAILED, _ofi_failed))


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
        if m := PREFIX.search(line):
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
