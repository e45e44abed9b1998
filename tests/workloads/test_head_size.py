"""The Ray head's resources as docs/rayjob.md states them.

The table under the marker is what this code computes for each shipped stack: the head pod's size
(workloads.raycluster.head_size of the system node type). The job's driver there holds no dataset (the
data pass runs as Ray tasks on the workers' CPUs: trainer.data.distributed, tests/trainer/test_prepare_shards.py).
"""
from __future__ import annotations

from tests.guards import nonempty
from tests.test_readme import generated_table
from workloads.raycluster import head_size

from .conftest import settings

MARKER = "<!-- head table: tests/workloads/test_head_size.py -->\n"
STACKS = ("dev", "p5")


def head_table() -> str:
    rows = ["| stack | system node | Ray head pod |", "|---|---|---|"]
    for stack in nonempty(STACKS, "stacks"):
        cfg = settings(stack)
        size = head_size(cfg.head_instance)
        rows.append(f"| {stack} | {cfg.head_instance.name} | {size.cpu} CPU, {size.memory_gib} GiB |")
    return "\n".join(rows)


def test_the_docs_state_the_heads_resources_as_the_code_builds_them():
    assert generated_table("rayjob.md", MARKER) == head_table(), "paste head_table() under the marker"
