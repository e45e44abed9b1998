"""The instance catalog holds every figure the program sizes from, with its source."""
from __future__ import annotations

import pytest

from facts import catalog
from tests.guards import nonempty


@pytest.mark.parametrize("name", sorted(catalog.GPU_TYPES))
def test_every_gpu_row_is_complete(name):
    """A row added to the catalog is checked here without touching this file."""
    row = catalog.GPU_TYPES[name]
    assert row.gpus in (4, 8) and row.gpu_model.startswith("NVIDIA ")
    assert row.gpu_memory_gib > 0 and row.gpu_bf16_tflops > 0
    assert row.vcpus >= 48 and row.memory_gib >= 192
    assert row.efa_interfaces >= 1 and row.efa
    assert row.network_gbps >= 40 and row.price_per_hour > 0
    assert row.hugepages_2mi == "5120Mi"
    assert any("pricing" in s for s in row.sources) and any("efa" in s.lower() for s in row.sources)


def test_gpudirect_rdma_only_on_p_series():
    assert {n for n, r in catalog.GPU_TYPES.items() if r.gpudirect_rdma} == {"p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge"}
    assert not catalog.GPU_TYPES["g6.12xlarge"].nvlink


def test_reference_figures():
    g6 = catalog.GPU_TYPES["g6.12xlarge"]
    assert (g6.gpus, g6.gpu_memory_gib, g6.vcpus, g6.memory_gib, g6.network_gbps) == (4, 22.35, 48, 192, 40)
    assert catalog.GPU_TYPES["p5.48xlarge"].efa_interfaces == 32


def test_intra_node_bandwidth_is_nvlinks_where_the_gpus_have_it_else_pcies():
    """What the communication estimate weighs hybrid sharding with: NVLink by chip, PCIe on L4/L40S/A10G."""
    rows = catalog.GPU_TYPES
    assert {n: r.intra_node_gbytes_per_s for n, r in rows.items() if not r.nvlink} == {
        n: catalog.PCIE_GBYTES_PER_S for n, r in rows.items() if not r.nvlink}
    assert (rows["p4d.24xlarge"].intra_node_gbytes_per_s, rows["p5.48xlarge"].intra_node_gbytes_per_s) == (300.0, 450.0)
    nvlinked = nonempty((r for r in rows.values() if r.nvlink), "GPU types with NVLink")
    assert all(r.intra_node_gbytes_per_s > catalog.PCIE_GBYTES_PER_S for r in nvlinked)


def test_non_efa_types_are_not_supported():
    assert not catalog.NON_EFA_GPU_TYPES & set(catalog.GPU_TYPES)


@pytest.mark.parametrize("name", sorted(catalog.CPU_TYPES))
def test_every_cpu_row_is_complete(name):
    row = catalog.CPU_TYPES[name]
    assert row.vcpus >= 2 and row.memory_gib >= 8 and row.price_per_hour > 0
    assert (row.gpus, row.efa_interfaces, row.hugepages_2mi) == (0, 0, None)
    assert any("pricing" in s for s in row.sources)


def test_the_types_the_shipped_stacks_and_the_docs_use_are_there():
    assert {"g6.12xlarge", "g6e.12xlarge", "p5.48xlarge"} <= set(catalog.GPU_TYPES)
    assert {"m7i.xlarge", "m7i.4xlarge"} <= set(catalog.CPU_TYPES)
