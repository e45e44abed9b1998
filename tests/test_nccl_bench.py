"""The all-reduce benchmark: nccl-tests' arithmetic, and a real gloo process group."""
from __future__ import annotations

import os
import socket
from itertools import pairwise

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.guards import nonempty
from trainer.efa import nccl_bench


def test_message_sizes_span_8_bytes_to_1_gib():
    sizes = nccl_bench.message_sizes()
    assert sizes[0] == 8 and sizes[-1] == 1 << 30 and len(sizes) == 28
    assert all(b == 2 * a for a, b in nonempty(pairwise(sizes), "message sizes"))
    with pytest.raises(ValueError, match="min"):
        nccl_bench.message_sizes(2, 8)


def test_bus_bandwidth_matches_nccl_tests():
    assert nccl_bench.bus_bandwidth(10.0, 8) == pytest.approx(17.5)  # 2 * 7/8
    assert nccl_bench.bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    r = nccl_bench.row(1 << 30, 0.5, 16)
    assert r.algbw_gbs == pytest.approx((1 << 30) / 0.5 / 1e9) and r.count == (1 << 30) // 4


def test_verdict_compares_with_the_catalog_network_only_across_nodes():
    rows = [nccl_bench.row(1 << 30, (1 << 30) / 4e9, 8)]  # algbw 4 GB/s, busbw 7 GB/s
    multi = nccl_bench.verdict(rows, nodes=2, network_gbps=40, instance_type="g6.12xlarge")
    assert "7.000 GB/s" in multi and "5.0 GB/s" in multi and "140%" in multi and "g6.12xlarge" in multi
    assert "nothing to compare" in nccl_bench.verdict(rows, nodes=1, network_gbps=40, instance_type="g6.12xlarge")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch
    rows = nccl_bench.measure([8, 1024, 65536], warmup=1, iters=2, device=torch.device("cpu"))
    out.put((rank, [r.size_bytes for r in rows], [r.time_us for r in rows]))
    dist.destroy_process_group()


def test_measure_runs_real_all_reduces_over_gloo():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    (_, sizes0, times0), (_, sizes1, times1) = results
    assert sizes0 == sizes1 == [8, 1024, 65536]
    assert times0 == times1 and all(t > 0 for t in nonempty(times0, "timings"))  # every rank reports the slowest rank's time
