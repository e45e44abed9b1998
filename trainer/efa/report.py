"""What the verdicts mean to a user: one line per node, the exit code, the likely causes, the in-job check."""

from __future__ import annotations

from collections.abc import Sequence

from facts.errors import EXIT_NO_PROOF, EXIT_OK, EXIT_SOCKETS
from trainer.efa.verdicts import (
    EfaEvidenceMissingError,
    EfaFallbackError,
    EfaReport,
    Evidence,
    MissingLog,
    RankVerdict,
    Transport,
)


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
    named = {Transport.EFA: ("libfabric", (("provider", provider), ("aws-ofi-nccl", ofi_version))),
             Transport.SOCKET: ("fell back to TCP", (("network", network), ("provider", provider)))}
    if transport in named:
        first, facts_ = named[transport]
        return [first, *(f"{name} {value}" for name, value in facts_ if value)]
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
