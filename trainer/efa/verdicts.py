"""What the proof is made of: a rank's, a node's and a whole report's transport, with the evidence lines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

# host:pid:tid [cudaDev] ... NCCL INFO|WARN msg  (WARN lines carry file:line (func) before NCCL;
# Ray prefixes "(RayTrainWorker pid=.., ip=..)", NCCL may prefix a timestamp.)
PREFIX = re.compile(
    r"(?P<host>[^\s:\[\]()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]"
    r"(?:[^\n]*?)? ?NCCL (?P<level>INFO|WARN|TRACE|CALL)\b ?(?P<msg>.*)$"
)


class Transport(StrEnum):
    """How a rank's (or node's) NCCL traffic left the node."""

    EFA = "EFA"
    SOCKET = "SOCKET"
    SHM_ONLY = "SHM_ONLY"
    UNKNOWN = "UNKNOWN"


# Worst first: one socket rank makes the node a socket node.
SEVERITY = {Transport.SOCKET: 0, Transport.EFA: 1, Transport.SHM_ONLY: 2, Transport.UNKNOWN: 3}


class EfaCheckError(RuntimeError):
    """Base class: the EFA proof failed."""


class EfaFallbackError(EfaCheckError):
    """EFA was required but at least one rank uses TCP sockets."""

    def __init__(self, message: str, ranks: Sequence[RankVerdict]):
        super().__init__(message)
        self.ranks = tuple(ranks)


class EfaEvidenceMissingError(EfaCheckError):
    """EFA was required but the log holds no NCCL transport line to prove it."""


@dataclass(frozen=True)
class Evidence:
    """One log line that contributed to a verdict, with where it came from."""

    source: str
    line_no: int
    text: str

    @property
    def message(self) -> str:
        """The NCCL message without the host:pid:tid [dev] prefix."""
        m = PREFIX.search(self.text)
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
        object.__setattr__(self, "nodes", group_nodes(self.ranks))

    @property
    def transport(self) -> Transport:
        return worst(n.transport for n in self.nodes)


def worst(transports: Iterable[Transport]) -> Transport:
    return min(transports, key=SEVERITY.__getitem__, default=Transport.UNKNOWN)


def group_nodes(ranks: Sequence[RankVerdict]) -> tuple[NodeVerdict, ...]:
    by_host: dict[str, list[RankVerdict]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r)
    return tuple(
        NodeVerdict(host=h, transport=worst(r.transport for r in rs), ranks=tuple(rs))
        for h, rs in sorted(by_host.items())
    )
