"""trainer.efa against realistic NCCL_DEBUG=INFO logs (markers verbatim from facts.md section 3)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from facts import errors
from tests.guards import nonempty
from trainer import efa
from trainer.__main__ import main as trainer_main
from trainer.efa import Transport

REPO = Path(__file__).resolve().parents[1]

NODE_A = "ip-10-0-1-23"
NODE_B = "ip-10-0-1-57"
BUS = ["38000", "3a000", "3c000", "3e000"]
GPUS_PER_NODE = 4


def _ts(line: str) -> str:
    # NCCL timestamps WARN lines by default.
    return f"[2026-11-30 16:02:11] {line}"


def rank_log(host: str, pid: int, rank: int, *, net: str = "efa", n_nodes: int = 2,
             bare_socket_line: bool = False) -> list[str]:
    """The NCCL 2.29.7 INFO lines one rank prints (ring over n_nodes x 4 GPUs).

    net: "efa" (aws-ofi-nccl 1.20.0, provider efa), "socket" (plugin failed, TCP),
    "no-plugin" (plugin library not found), "sockets-provider" (libfabric over TCP).
    """
    dev = rank % GPUS_PER_NODE
    tid = pid + 41
    ip = host[3:].replace("-", ".")
    n_ranks = n_nodes * GPUS_PER_NODE
    p = f"{host}:{pid}:{pid} [{dev}] NCCL INFO "
    t = f"{host}:{pid}:{tid} [{dev}] NCCL INFO "
    w = f"{host}:{pid}:{tid} [{dev}] int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):353 NCCL WARN "
    lines = [
        p + f"Bootstrap: Using eth0:{ip}<0>",
        p + "cudaDriverVersion 13000",
        p + "NCCL version 2.29.7+cuda13.0",
        p + "NCCL_SOCKET_IFNAME set by environment to eth0",
        p + "NCCL_NET_PLUGIN set by environment to ofi",
    ]
    if net in ("efa", "sockets-provider"):
        provider = "efa" if net == "efa" else "sockets"
        lines += [
            t + "NET/Plugin: Loaded net plugin Libfabric (v10)",
            t + "NET/OFI Initializing aws-ofi-nccl 1.20.0",
            t + "NET/OFI Using Libfabric version 2.3",
            t + "NET/OFI Using CUDA driver version 13000 with runtime 13000",
            t + "NET/OFI Configuring AWS-specific options",
        ]
        if bare_socket_line:
            lines.append(t + f"NET/Socket : Using [0]eth0:{ip}<0>")
        lines += [
            t + f"NET/OFI Selected provider is {provider}, fabric is {provider} (found 1 nics)",
            t + "Using network Libfabric",
        ]
        net_name = "Libfabric"
    elif net == "socket":
        # aws-ofi-nccl 1.20.0 (src/nccl_ofi_net.cpp, nccl_ofi_rdma.cpp): each protocol reports
        # "No eligible providers" as INFO, then the plugin gives up; NCCL 2.29 moves on to IB, then Socket.
        lines += [
            t + "NET/Plugin: Loaded net plugin Libfabric (v10)",
            t + "NET/OFI Initializing aws-ofi-nccl 1.20.0",
            t + "NET/OFI No eligible providers were found",
            t + "NET/OFI No eligible providers were found",
            _ts(w + "NET/OFI Unable to find a protocol that worked.  Failing initialization."),
            _ts(w + "NET/OFI aws-ofi-nccl initialization failed"),
            t + "Failed to initialize NET plugin Libfabric",
            t + "NET/IB : No device found.",
            t + f"NET/Socket : Using [0]eth0:{ip}<0>",
            t + "Initialized NET plugin Socket",
            t + "Assigned NET plugin Socket to comm",
            t + "Using network Socket",
        ]
        net_name = "Socket"
    elif net == "no-plugin":
        lines += [
            t + "NET/Plugin: Could not find: ofi libnccl-net-ofi.so. Using internal network plugin.",
            t + "NET/IB : No device found.",
            t + f"NET/Socket : Using [0]eth0:{ip}<0>",
            t + "Using network Socket",
        ]
        net_name = "Socket"
    else:
        raise AssertionError(net)
    lines += [
        t + f"ncclCommInitRankConfig comm 0x55d3c9a0 rank {rank} nranks {n_ranks} cudaDev {dev} nvmlDev {dev} "
            f"busId {BUS[dev]} commId 0x8c1f2e3d4b5a6978 - Init START",
        t + f"comm 0x55d3c9a0 rank {rank} nRanks {n_ranks} nNodes {n_nodes} localRanks {GPUS_PER_NODE} "
            f"localRank {dev} MNNVL 0",
    ]
    prev, nxt = (rank - 1) % n_ranks, (rank + 1) % n_ranks
    for ch in ("00", "01"):
        if prev // GPUS_PER_NODE != rank // GPUS_PER_NODE:
            lines.append(t + f"Channel {ch}/0 : {prev}[{prev % 4}] -> {rank}[{dev}] [receive] via NET/{net_name}/0")
        if nxt // GPUS_PER_NODE != rank // GPUS_PER_NODE:
            lines.append(t + f"Channel {ch}/0 : {rank}[{dev}] -> {nxt}[{nxt % 4}] [send] via NET/{net_name}/0")
        elif n_ranks > 1:
            via = "P2P/IPC" if ch == "00" else "SHM/direct/direct"
            lines.append(t + f"Channel {ch}/0 : {rank}[{dev}] -> {nxt}[{nxt % 4}] via {via}")
    lines += [
        t + "Connected all rings, use ring PXN 0 GDR 0",
        t + f"ncclCommInitRankConfig comm 0x55d3c9a0 rank {rank} nranks {n_ranks} cudaDev {dev} nvmlDev {dev} "
            f"busId {BUS[dev]} commId 0x8c1f2e3d4b5a6978 - Init COMPLETE",
    ]
    return lines


def node_log(host: str, first_rank: int, **kw) -> list[str]:
    """Four ranks of one node interleaved, as they land in one Ray worker log."""
    per_rank = [rank_log(host, 4200 + r, r, **kw) for r in range(first_rank, first_rank + GPUS_PER_NODE)]
    return [line for group in zip(*per_rank, strict=False) for line in group]  # as long as the shortest rank log


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = trainer_main(["efa-check", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- CLI: the cases the lead asked for --------------------------------------------------

def test_pure_efa_two_nodes_exit_0(tmp_path, capsys):
    a = write(tmp_path / "worker-a.out", node_log(NODE_A, 0))
    b = write(tmp_path / "worker-b.out", node_log(NODE_B, 4))
    code, out, _ = run_cli(capsys, str(a), str(b))
    assert code == errors.EXIT_OK == 0
    lines = out.splitlines()
    assert lines[0] == (f'EFA check: node {NODE_A}: EFA (libfabric, provider efa, aws-ofi-nccl 1.20.0; ranks 0-3)'
                        ' — evidence: "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)" (+2 more)')
    assert lines[1].startswith(f"EFA check: node {NODE_B}: EFA (libfabric, provider efa, aws-ofi-nccl 1.20.0; "
                               "ranks 4-7)")
    assert "PASS" in lines[-1]


def test_socket_fallback_exit_5_with_causes(tmp_path, capsys):
    a = write(tmp_path / "worker-a.out", node_log(NODE_A, 0, net="socket"))
    b = write(tmp_path / "worker-b.out", node_log(NODE_B, 4, net="socket"))
    code, out, _ = run_cli(capsys, str(a), str(b))
    assert code == errors.EXIT_SOCKETS == 5
    assert f"EFA check: node {NODE_A}: SOCKET (fell back to TCP, network Socket; ranks 0-3)" in out
    assert f"EFA check: node {NODE_B}: SOCKET" in out
    assert f"FAIL — TCP socket fallback on node(s) {NODE_A}, {NODE_B}" in out
    assert "vpc.amazonaws.com/efa" in out and "self-referencing" in out


def test_bare_net_socket_line_next_to_ofi_selection_is_efa(tmp_path, capsys):
    log = write(tmp_path / "ray.out", node_log(NODE_A, 0, bare_socket_line=True)
                + node_log(NODE_B, 4, bare_socket_line=True))
    assert "NET/Socket : Using [0]eth0:10.0.1.23<0>" in log.read_text()
    code, out, _ = run_cli(capsys, str(log))
    assert code == 0
    assert "SOCKET" not in out
    report = efa.analyze_logs([log])
    assert {r.transport for r in report.ranks} == {Transport.EFA}


def test_bare_net_socket_line_alone_proves_nothing(tmp_path, capsys):
    log = write(tmp_path / "one.log", [f"{NODE_A}:4200:4241 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.23<0>"])
    code, out, _ = run_cli(capsys, str(log))
    assert code == errors.EXIT_NO_PROOF
    assert f"node {NODE_A}: UNKNOWN (no NCCL transport lines; 1 process)" in out


def test_no_transport_lines_exit_4(tmp_path, capsys):
    lines = [
        "2026-11-30 16:02:01,123\tINFO worker.py:1234 -- Started training worker",
        f"{NODE_A}:4200:4200 [0] NCCL INFO Bootstrap: Using eth0:10.0.1.23<0>",
        f"{NODE_A}:4200:4200 [0] NCCL INFO cudaDriverVersion 13000",
        f"{NODE_A}:4200:4200 [0] NCCL INFO NCCL version 2.29.7+cuda13.0",
        "loss=2.3412 step=1",
    ]
    log = write(tmp_path / "worker.out", lines)
    code, out, _ = run_cli(capsys, str(log))
    assert code == errors.EXIT_NO_PROOF == 4
    assert f"EFA check: node {NODE_A}: UNKNOWN" in out
    assert "NCCL_DEBUG=INFO" in out


def test_log_without_any_nccl_line_exit_4(tmp_path, capsys):
    log = write(tmp_path / "job.log", ["Job submitted", "loss=2.3412 step=1"])
    code, out, _ = run_cli(capsys, str(log))
    assert code == 4
    assert "no NCCL transport lines" in out


def test_mixed_efa_and_socket_names_the_socket_node_exit_5(tmp_path, capsys):
    a = write(tmp_path / "worker-a.out", node_log(NODE_A, 0))
    b = write(tmp_path / "worker-b.out", node_log(NODE_B, 4, net="socket"))
    code, out, _ = run_cli(capsys, str(a), str(b))
    assert code == 5
    lines = out.splitlines()
    assert lines[0].startswith(f"EFA check: node {NODE_A}: EFA (")
    assert lines[1].startswith(f"EFA check: node {NODE_B}: SOCKET (")
    assert 'evidence: "Using network Socket"' in lines[1]
    assert f"fallback on node(s) {NODE_B}." in out and f"node(s) {NODE_A}" not in out


def test_missing_file_exit_2_names_it_and_prints_no_verdict(tmp_path, capsys):
    good = write(tmp_path / "worker-a.out", node_log(NODE_A, 0))
    missing = tmp_path / "nccl.ip-10-0-1-57.4204.log"
    code, out, err = run_cli(capsys, str(good), str(missing))
    assert code == errors.EXIT_USAGE == 2
    assert out == ""
    assert str(missing) in err and "does not exist" in err


def test_empty_directory_exit_2(tmp_path, capsys):
    empty = tmp_path / "logs"
    empty.mkdir()
    code, out, err = run_cli(capsys, str(empty))
    assert code == 2 and out == ""
    assert str(empty) in err and "holds no files" in err


def test_directory_of_per_rank_files(tmp_path, capsys):
    logs = tmp_path / "nccl"
    logs.mkdir()
    for r in range(8):
        host = NODE_A if r < 4 else NODE_B
        write(logs / f"nccl.{host}.{4200 + r}.log", rank_log(host, 4200 + r, r))
    code, out, _ = run_cli(capsys, "--per-rank", str(logs))
    assert code == 0
    assert out.count(": EFA (libfabric") == 2 + 8
    assert f"  rank 5 (host {NODE_B}, pid 4205, cuda:1): EFA" in out


def test_usage_errors_and_help(capsys):
    code, _, err = run_cli(capsys)
    assert code == 2 and "LOGFILE" in err
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    assert "python -m trainer efa-check" in out
    assert "SHM_ONLY" in out and "prove nothing about EFA" in out
    for c in ("0  EFA", "5  a fallback", "4  no proof", "2  usage error"):
        assert c in out


def test_single_node_is_shm_only_exit_4(tmp_path, capsys):
    # No OFI plugin on a one-node run: NCCL still prints "Using network Socket", but nothing crosses a network.
    log = write(tmp_path / "single.out", node_log(NODE_A, 0, net="no-plugin", n_nodes=1))
    assert "Using network Socket" in log.read_text()
    code, out, _ = run_cli(capsys, str(log))
    assert code == 4
    assert f"node {NODE_A}: SHM_ONLY (intra-node P2P/SHM only, no network traffic; ranks 0-3)" in out
    assert "single-node" in out


def test_logs_piped_in_on_stdin_get_the_same_verdicts(tmp_path):
    lines = node_log(NODE_A, 0) + node_log(NODE_B, 4, net="socket")
    proc = subprocess.run([sys.executable, "-m", "trainer", "efa-check", "-"], cwd=REPO, input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == errors.EXIT_SOCKETS, proc.stderr
    assert f"node {NODE_A}: EFA (" in proc.stdout and f"fallback on node(s) {NODE_B}." in proc.stdout


def test_command_runs_in_a_fresh_interpreter(tmp_path):
    log = write(tmp_path / "mixed.out", node_log(NODE_A, 0) + node_log(NODE_B, 4, net="no-plugin"))
    proc = subprocess.run([sys.executable, "-m", "trainer", "efa-check", str(log)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5, proc.stderr
    assert f"node {NODE_B}: SOCKET" in proc.stdout
    assert "NCCL_NET_PLUGIN" in proc.stdout


# --- parser details ------------------------------------------------------------------

def test_per_rank_verdicts_keep_rank_pid_device_and_evidence(tmp_path):
    log = write(tmp_path / "ray.out", node_log(NODE_A, 0) + node_log(NODE_B, 4))
    report = efa.analyze_logs([log])
    assert [(r.host, r.rank, r.pid, r.cuda_device) for r in report.ranks] == [
        (NODE_A if r < 4 else NODE_B, r, 4200 + r, r % 4) for r in range(8)]
    assert all(r.n_ranks == 8 and r.n_nodes == 2 for r in report.ranks)
    assert all(r.nccl_version == "2.29.7+cuda13.0" and r.ofi_version == "1.20.0" for r in report.ranks)
    # Rank 1's ring neighbours are both local (P2P/SHM channels only): nNodes 2 still puts it on the network.
    rank1 = report.ranks[1]
    assert rank1.transport is Transport.EFA
    text = log.read_text().splitlines()
    for ev in nonempty(rank1.evidence, "evidence lines of rank 1"):
        assert text[ev.line_no - 1] == ev.text and ev.source == str(log)
    assert [e.message for e in rank1.evidence] == [
        "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)", "Using network Libfabric"]
    rank3 = report.ranks[3]
    assert rank3.evidence[-1].message == "Channel 00/0 : 3[3] -> 4[0] [send] via NET/Libfabric/0"
    assert [n.host for n in report.nodes] == [NODE_A, NODE_B]


def test_fallback_evidence_includes_ofi_warnings(tmp_path):
    report = efa.analyze_lines(rank_log(NODE_B, 4204, 4, net="socket"), source="nccl.log")
    (r,) = report.ranks
    assert r.transport is Transport.SOCKET
    messages = [e.message for e in r.evidence]
    assert messages[0] == "Using network Socket" and "Assigned NET plugin Socket to comm" in messages
    assert "NET/OFI No eligible providers were found" not in messages  # an INFO on the way, not the failure
    assert "NET/OFI Unable to find a protocol that worked.  Failing initialization." in messages
    assert "NET/OFI aws-ofi-nccl initialization failed" in messages
    assert "Failed to initialize NET plugin Libfabric" in messages
    assert any("via NET/Socket/0" in m for m in messages)


def test_ofi_init_failure_alone_is_a_fallback():
    lines = [f"[2026-11-30 16:02:11] {NODE_A}:4200:4241 [0] int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):353 "
             "NCCL WARN NET/OFI aws-ofi-nccl initialization failed"]
    (r,) = efa.analyze_lines(lines).ranks
    assert (r.host, r.pid, r.cuda_device, r.transport) == (NODE_A, 4200, 0, Transport.SOCKET)


def test_libfabric_over_sockets_provider_is_not_efa():
    report = efa.analyze_lines(rank_log(NODE_A, 4203, 3, net="sockets-provider"))
    (r,) = report.ranks
    assert r.transport is Transport.SOCKET and r.provider == "sockets" and r.network == "Libfabric"


def test_aws_libfabric_network_name_is_efa():
    lines = [f"{NODE_A}:4200:4241 [0] NCCL INFO Using network AWS Libfabric",
             f"{NODE_A}:4200:4241 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0"]
    (r,) = efa.analyze_lines(lines).ranks
    assert r.transport is Transport.EFA and r.network == "AWS Libfabric" and r.rank == 0


def test_ray_prefixed_ansi_lines_and_unprefixed_version_line():
    esc = "\x1b[36m(RayTrainWorker pid=4200, ip=10.0.1.23)\x1b[0m "
    lines = ["NCCL version 2.29.7+cuda13.0"] + [esc + line for line in rank_log(NODE_A, 4200, 0)]
    (r,) = efa.analyze_lines(lines).ranks
    assert (r.host, r.pid, r.rank, r.transport) == (NODE_A, 4200, 0, Transport.EFA)
    assert r.nccl_version == "2.29.7+cuda13.0"
    assert not any("\x1b" in e.text for e in r.evidence)


def test_same_process_split_over_two_files_is_one_rank(tmp_path):
    lines = rank_log(NODE_A, 4200, 0)
    head = write(tmp_path / "worker.out", lines[:12])
    tail = write(tmp_path / f"nccl.{NODE_A}.4200.log", lines[12:])
    (r,) = efa.analyze_logs([head, tail]).ranks
    assert r.transport is Transport.EFA and r.rank == 0
    assert r.sources == (str(head), str(tail))


def test_one_socket_rank_makes_its_node_socket():
    lines = rank_log(NODE_A, 4200, 0) + rank_log(NODE_A, 4203, 3, net="socket")
    report = efa.analyze_lines(lines)
    (node,) = [n for n in report.nodes if n.host == NODE_A]
    assert node.transport is Transport.SOCKET
    assert [r.rank for r in node.deciding] == [3]
    assert report.transport is Transport.SOCKET and efa.exit_code(report) == errors.EXIT_SOCKETS


# --- require_efa ------------------------------------------------------------------------

def test_require_efa_raises_naming_the_causes(tmp_path):
    log = write(tmp_path / f"nccl.{NODE_B}.4204.log", rank_log(NODE_B, 4204, 4, net="socket"))
    report = efa.analyze_logs([log])
    with pytest.raises(efa.EfaFallbackError) as exc:
        efa.enforce_efa(report.ranks, require_efa=True)
    msg = str(exc.value)
    assert f"rank 4 (host {NODE_B}, pid 4204, cuda:0)" in msg
    assert str(log) in msg and "Using network Socket" in msg
    assert "security group" in msg and "self-referencing" in msg
    assert "INBOUND" in msg and "OUTBOUND" in msg
    assert "device plugin is not advertising vpc.amazonaws.com/efa" in msg
    assert "worker pod does not request vpc.amazonaws.com/efa" in msg
    assert "aws-ofi-nccl plugin was not found" in msg
    assert "NCCL_NET_PLUGIN" in msg and "LD_LIBRARY_PATH" in msg
    assert [r.rank for r in exc.value.ranks] == [4]


def test_require_efa_puts_the_plugin_cause_first_when_the_plugin_is_missing():
    ranks = efa.analyze_lines(rank_log(NODE_B, 4204, 4, net="no-plugin")).ranks
    with pytest.raises(efa.EfaFallbackError) as exc:
        efa.enforce_efa(ranks, require_efa=True)
    causes = str(exc.value).split("Likely causes:")[1]
    assert causes.index("aws-ofi-nccl plugin was not found") < causes.index("security group")


def test_require_efa_false_reports_without_raising():
    ranks = efa.analyze_lines(rank_log(NODE_A, 4200, 0, net="socket")).ranks
    bad = efa.enforce_efa(ranks, require_efa=False)
    assert [r.rank for r in bad] == [0]


def test_require_efa_passes_on_efa_and_on_single_node():
    assert efa.enforce_efa(efa.analyze_lines(node_log(NODE_A, 0)).ranks, require_efa=True) == []
    single = efa.analyze_lines(node_log(NODE_A, 0, net="no-plugin", n_nodes=1)).ranks
    assert {r.transport for r in single} == {Transport.SHM_ONLY}
    assert efa.enforce_efa(single, require_efa=True) == []


def test_require_efa_without_transport_lines_raises():
    ranks = efa.analyze_lines([f"{NODE_A}:4200:4200 [0] NCCL INFO NCCL version 2.29.7+cuda13.0"], "x.log").ranks
    with pytest.raises(efa.EfaEvidenceMissingError, match="NCCL_DEBUG=INFO"):
        efa.enforce_efa(ranks, require_efa=True)
    with pytest.raises(efa.EfaEvidenceMissingError):
        efa.enforce_efa([], require_efa=True)


# --- per-rank NCCL_DEBUG_FILE ----------------------------------------------------------------

def test_debug_env_and_expansion_follow_nccl(tmp_path):
    env = efa.nccl_debug_env(tmp_path)
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == f"{tmp_path}/nccl.%h.%p.log" == efa.nccl_debug_file_pattern(tmp_path)
    assert efa.expand_nccl_debug_file(env["NCCL_DEBUG_FILE"], hostname=NODE_A, pid=42) == \
        tmp_path / f"nccl.{NODE_A}.42.log"
    assert str(efa.expand_nccl_debug_file("/l/%h-%p-%%-%x-%", hostname="h", pid=7)) == "/l/h-7-%-%x-%"


def test_expansion_uses_hostname_as_nccl_prints_it(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "ip-10-0-1-23.us-west-2.compute.internal")
    assert str(efa.expand_nccl_debug_file("/l/%h.%p", pid=1)) == "/l/ip-10-0-1-23.1"


def test_check_own_rank_reads_this_processes_file(tmp_path):
    env = efa.nccl_debug_env(tmp_path)
    own = efa.expand_nccl_debug_file(env["NCCL_DEBUG_FILE"])
    assert own.name == f"nccl.{efa.nccl_hostname()}.{os.getpid()}.log"
    write(own, rank_log(NODE_A, os.getpid(), 2))
    report = efa.check_own_rank(require_efa=True, environ=env)
    assert [(r.rank, r.transport) for r in report.ranks] == [(2, Transport.EFA)]

    write(own, rank_log(NODE_A, os.getpid(), 2, net="socket"))
    with pytest.raises(efa.EfaFallbackError, match="self-referencing"):
        efa.check_own_rank(require_efa=True, environ=env)
    assert efa.check_own_rank(require_efa=False, environ=env).transport is Transport.SOCKET


def test_check_own_rank_without_debug_file(tmp_path):
    with pytest.raises(efa.EfaEvidenceMissingError, match="NCCL_DEBUG_FILE is not set"):
        efa.check_own_rank(require_efa=True, environ={})
    assert efa.check_own_rank(require_efa=False, environ={}).ranks == ()
    env = efa.nccl_debug_env(tmp_path / "never-written")
    with pytest.raises(efa.EfaEvidenceMissingError, match="does not exist"):
        efa.check_own_rank(require_efa=True, environ=env)


# --- the in-job check: every rank reads its own file, verdicts are gathered ---------

def _own_file(tmp_path: Path, lines: list[str]) -> dict:
    """This process plays one rank: its NCCL_DEBUG_FILE, expanded as NCCL would."""
    env = efa.nccl_debug_env(tmp_path)
    write(efa.expand_nccl_debug_file(env["NCCL_DEBUG_FILE"]), lines)
    return env


def _other_node(host: str, first_rank: int, **kw):
    """What another host's rank shares in the all-gather: its host, its verdicts, its missing files."""
    return (host, efa.analyze_lines(node_log(host, first_rank, **kw)).ranks, ())


def test_gathered_efa_on_two_nodes_is_required_and_passes(tmp_path):
    env = _own_file(tmp_path, rank_log(NODE_A, os.getpid(), 0))
    report, required = efa.gather_report(lambda own: [own, _other_node(NODE_B, 4)], environ=env)
    assert required is True  # auto: the job spans two hosts
    assert efa.enforce_efa(report.ranks, required) == []
    lines = efa.verdict_lines(report)
    assert len(lines) == 2 and all(": EFA" in line for line in lines)


def test_gathered_socket_rank_fails_every_rank_with_the_causes(tmp_path):
    env = _own_file(tmp_path, rank_log(NODE_A, os.getpid(), 0))
    report, required = efa.gather_report(lambda own: [own, _other_node(NODE_B, 4, net="socket")], environ=env)
    with pytest.raises(efa.EfaFallbackError) as info:
        efa.enforce_efa(report.ranks, required)
    message = str(info.value)
    assert NODE_B in message and "vpc.amazonaws.com/efa" in message and "security group" in message


def test_one_node_jobs_only_report_unless_asked(tmp_path):
    env = _own_file(tmp_path, rank_log(NODE_A, os.getpid(), 0, net="socket"))
    report, required = efa.gather_report(lambda own: [own], environ=env)
    assert required is False and len(efa.enforce_efa(report.ranks, required)) == 1
    _, forced = efa.gather_report(lambda own: [own], environ={**env, "TRAINER_REQUIRE_EFA": "1"})
    assert forced is True


def test_require_setting_values():
    assert efa.require_setting(None, 2) and not efa.require_setting("auto", 1)
    assert efa.require_setting("1", 1) and not efa.require_setting("0", 8)
    with pytest.raises(ValueError, match="TRAINER_REQUIRE_EFA='maybe'"):
        efa.require_setting("maybe", 2)


# --- the wording of other releases (read from aws/aws-ofi-nccl and NVIDIA/nccl at each tag) ----------

def _prefixed(host: str, pid: int, dev: int, messages: list[str]) -> list[str]:
    return [f"{host}:{pid}:{pid + 41} [{dev}] NCCL INFO {m}" for m in messages]


# (what, messages of one rank of a two-node job, expected transport). Each message is verbatim
# from the format strings at the named tags; only the values are filled in.
RELEASE_LOGS = [
    ("aws-ofi-nccl v0.9.2 + NCCL 2.4.8: layered EFA provider name, Ring lines, no 'Using network'", [
        "NET/OFI Selected Provider is efa;ofi_rxr",
        "NET/Socket : Using [0]eth0:10.0.1.23<0>",
        "Ring 00 : 3 -> 4 [send] via NET/AWS Libfabric/0",
        "Ring 00 : 7 -> 0 [receive] via NET/AWS Libfabric/0",
    ], Transport.EFA),
    ("aws-ofi-nccl v1.6.0 + NCCL 2.10.3: 'Selected Provider' with nics, hex bus ids", [
        "NET/OFI Using aws-ofi-nccl 1.6.0",
        "NET/OFI Selected Provider is efa (found 4 nics)",
        "NET/Socket : Using [0]eth0:10.0.1.23<0>",
        "Using network AWS Libfabric",
        "comm 0x55d3c9a0 rank 3 nranks 8 cudaDev 3 busId 3e000 - Init START",
        "Channel 00 : 3[3e000] -> 4[10000] [send] via NET/AWS Libfabric/0/GDRDMA",
    ], Transport.EFA),
    ("aws-ofi-nccl v1.7.4-aws + NCCL 2.18.5: plugin v6 loaded, benign CollNet symbol lookups", [
        "NET/Plugin: Failed to find ncclCollNetPlugin_v6 symbol.",
        "NET/Plugin: Loaded net plugin AWS Libfabric (v6)",
        "NET/OFI Initializing aws-ofi-nccl 1.7.4-aws",
        "NET/OFI Selected Provider is efa (found 1 nics)",
        "Using network AWS Libfabric",
        "Channel 00/0 : 3[3] -> 4[0] [send] via NET/AWS Libfabric/0",
    ], Transport.EFA),
    ("aws-ofi-nccl v1.13.0 + NCCL 2.21.5 with NCCL_NET=OFI: the plugin calls itself OFI", [
        "NET/Plugin: Loaded net plugin OFI (v8)",
        "NET/OFI Initializing aws-ofi-nccl 1.13.0",
        "NET/OFI Selected Provider is efa (found 1 nics)",
        "Using network OFI",
        "Channel 00/0 : 3[3] -> 4[0] [send] via NET/OFI/0",
    ], Transport.EFA),
    ("aws-ofi-nccl v1.20.0 + NCCL 2.29.7 on g6 (no GPUDirect RDMA): RDMA finds no provider, SENDRECV does", [
        "NET/OFI Initializing aws-ofi-nccl 1.20.0",
        "NET/OFI No eligible providers were found",
        "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)",
        "NET/OFI Using transport protocol SENDRECV",
        "Initialized NET plugin Libfabric",
        "Assigned NET plugin Libfabric to comm",
        "Bootstrap: Using eth0:10.0.1.23<0>",
        "NET/Socket : Using [0]eth0:10.0.1.23<0>",
        "Using network Libfabric",
        "comm 0x55d3c9a0 rank 3 nRanks 8 nNodes 2 localRanks 4 localRank 3 MNNVL 0",
    ], Transport.EFA),
    ("aws-ofi-nccl v1.20.0 + NCCL 2.29.7 on p5: libfabric 2's efa-direct fabric", [
        "NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)",
        "Using network Libfabric",
        "Channel 00/0 : 7[7] -> 8[0] [send] via NET/Libfabric/0/GDRDMA",
    ], Transport.EFA),
    ("NCCL 2.10.3 without the plugin: 'NET/Plugin : No plugin found'", [
        "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        "NET/IB : No device found.",
        "NET/Socket : Using [0]eth0:10.0.1.23<0>",
        "Using network Socket",
    ], Transport.SOCKET),
    ("NCCL 2.19.4 without the plugin: dlerror in the same line", [
        "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory "
        "No plugin found (libnccl-net.so), using internal implementation",
        "Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0",
    ], Transport.SOCKET),
    ("NCCL 2.29.7, aws-ofi-nccl failed to initialise: only the plugin failure (log cut before 'Using network')", [
        "NET/OFI Initializing aws-ofi-nccl 1.20.0",
        "Failed to initialize NET plugin Libfabric",
    ], Transport.SOCKET),
    ("aws-ofi-nccl over libfabric's TCP provider: OFI, but not EFA", [
        "NET/OFI Selected provider is tcp;ofi_rxm, fabric is TCP-IP (found 1 nics)",
        "Using network Libfabric",
    ], Transport.SOCKET),
]


@pytest.mark.parametrize("what, messages, expected", RELEASE_LOGS, ids=[r[0].split(":")[0] for r in RELEASE_LOGS])
def test_log_wording_of_each_release(what, messages, expected):
    lines = _prefixed(NODE_A, 4203, 3, messages)
    (rank,) = efa.analyze_lines(lines, "worker.out").ranks
    assert rank.transport is expected, (what, rank.evidence)
    if expected is Transport.EFA:
        assert efa.enforce_efa([rank], require_efa=True) == []


def test_bootstrap_socket_lines_alone_are_no_verdict():
    """Bootstrap and the NET/Socket interface line are printed whatever network carries the data."""
    lines = _prefixed(NODE_A, 4200, 0, ["Bootstrap: Using eth0:10.0.1.23<0>", "Bootstrap : Using eth0:10.0.1.23<0>",
                                       "NET/Socket : Using [0]eth0:10.0.1.23<0>"])
    (rank,) = efa.analyze_lines(lines).ranks
    assert rank.transport is Transport.UNKNOWN


def test_the_layered_provider_name_is_reported_as_efa():
    (rank,) = efa.analyze_lines(_prefixed(NODE_A, 1, 0, RELEASE_LOGS[0][1])).ranks
    assert rank.provider == "efa;ofi_rxr" and rank.network == "AWS Libfabric"
    assert rank.rank == 3  # from 'Ring 00 : 3 -> 4 [send]'


def test_the_tuner_and_profiler_not_found_lines_are_not_a_fallback():
    lines = _prefixed(NODE_A, 1, 0, ["TUNER/Plugin: Could not find: libnccl-tuner.so. Using internal tuner plugin.",
                                     "PROFILER/Plugin: Could not find: libnccl-profiler.so.",
                                     "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)",
                                     "Using network Libfabric"])
    (rank,) = efa.analyze_lines(lines).ranks
    assert rank.transport is Transport.EFA


# --- the debug file's directory, and why a file is missing --------------------------------------------

def test_the_setup_hook_creates_the_debug_file_directory(tmp_path):
    env = efa.nccl_debug_env(tmp_path / "fresh" / "ray" / "nccl")
    assert efa.make_debug_file_dir(env) == tmp_path / "fresh" / "ray" / "nccl"
    assert (tmp_path / "fresh" / "ray" / "nccl").is_dir()
    assert efa.make_debug_file_dir({}) is None
    assert efa.SETUP_HOOK == f"{efa.make_debug_file_dir.__module__}.{efa.make_debug_file_dir.__name__}"


def test_the_setup_hook_never_kills_the_worker(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert efa.make_debug_file_dir(efa.nccl_debug_env(blocker / "nccl")) is None
    assert f"cannot create {blocker / 'nccl'}" in capsys.readouterr().err


def test_a_missing_directory_is_named_with_the_reason(tmp_path):
    env = efa.nccl_debug_env(tmp_path / "never-made")
    with pytest.raises(efa.EfaEvidenceMissingError) as err:
        efa.check_own_rank(require_efa=True, environ=env)
    message = str(err.value)
    expected = efa.expand_nccl_debug_file(env["NCCL_DEBUG_FILE"])
    assert f"expected NCCL debug file '{expected}'" in message
    assert f"its directory '{tmp_path / 'never-made'}' does not exist and NCCL creates no directories" in message
    assert "stdout" in message and efa.SETUP_HOOK in message


def test_an_unwritable_directory_is_named_with_the_reason(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    if os.access(folder, os.W_OK):  # root writes anywhere: answer as the kernel would for the Ray user
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != folder)
    report = efa.check_own_rank(require_efa=False, environ=efa.nccl_debug_env(folder))
    assert "is not writable by uid" in report.missing[0].reason


def test_a_quiet_nccl_debug_level_is_named_as_the_reason(tmp_path):
    env = {**efa.nccl_debug_env(tmp_path), "NCCL_DEBUG": "WARN"}
    (missing,) = efa.check_own_rank(require_efa=False, environ=env).missing
    assert "NCCL_DEBUG is WARN" in missing.reason and "set NCCL_DEBUG=INFO" in missing.reason
    (missing,) = efa.check_own_rank(require_efa=False, environ=efa.nccl_debug_env(tmp_path)).missing
    assert "no NCCL communicator has been created in this process yet" in missing.reason


def test_a_missing_file_on_one_host_fails_the_required_check_naming_it(tmp_path):
    """EFA on one node proves nothing about the other: every rank must show its transport."""
    env = efa.nccl_debug_env(tmp_path / "absent")
    report, required = efa.gather_report(lambda own: [own, _other_node(NODE_B, 4)], environ=env)
    assert required is True and len(report.missing) == 1
    assert any(line.startswith("EFA check: no NCCL log from host") for line in efa.verdict_lines(report))
    with pytest.raises(efa.EfaEvidenceMissingError) as err:
        efa.enforce_efa(report.ranks, required, missing=report.missing)
    assert "1 of 5 rank(s) left no proof" in str(err.value)
    assert "does not exist and NCCL creates no directories" in str(err.value)
    assert efa.enforce_efa(report.ranks, False, missing=report.missing) == []
