"""The Ray head's resources as docs/rayjob.md states them, and the driver's memory check that guards them.

The table under the marker is what this code computes for each shipped stack: the head pod's size
(workloads.raycluster.head_size of the system node type) and the dataset the job's driver can pack there
(facts.resources: 0.5 GB + 21.6 B per token at the pre-flight's peak).
"""
from __future__ import annotations

from facts.resources import DATASET_BYTES_PER_TOKEN, driver_peak_bytes, tokens_that_fit
from tests.guards import nonempty
from tests.test_readme import generated_table
from trainer.jobs.cluster import dataset_bytes, driver_memory_problem, memory_limit_bytes
from workloads.raycluster import head_size

from .conftest import settings

MARKER = "<!-- head table: tests/workloads/test_head_size.py -->\n"
STACKS = ("dev", "p5")


def head_table() -> str:
    rows = ["| stack | system node | Ray head pod | dataset its driver can pack (tokens) |", "|---|---|---|---|"]
    for stack in nonempty(STACKS, "stacks"):
        cfg = settings(stack)
        size = head_size(cfg.head_instance)
        fits = tokens_that_fit(size.memory_gib * 2**30)
        rows.append(f"| {stack} | {cfg.head_instance.name} | {size.cpu} CPU, {size.memory_gib} GiB "
                    f"| about {fits / 1e9:.2f}B (~{fits * DATASET_BYTES_PER_TOKEN / 1e9:.1f} GB of JSONL) |")
    return "\n".join(rows)


def test_the_docs_state_the_heads_resources_as_the_code_builds_them():
    assert generated_table("rayjob.md", MARKER) == head_table(), "paste head_table() under the marker"


def test_a_dataset_the_heads_memory_cannot_pack_is_refused_before_the_pre_flight(tmp_path):
    head = head_size(settings("dev").head_instance).memory_gib * 2**30
    fits = tokens_that_fit(head)
    assert driver_peak_bytes(fits) <= head < driver_peak_bytes(fits + 1000)
    small = int(0.9 * fits * DATASET_BYTES_PER_TOKEN)
    assert driver_memory_problem(small, head, "s3://b/d.jsonl") is None
    problem = driver_memory_problem(int(1.2 * fits * DATASET_BYTES_PER_TOKEN), head, "s3://b/d.jsonl")
    assert "--dataset s3://b/d.jsonl" in problem and "Submit with --rayjob" in problem and "8.0 GiB" in problem
    assert driver_memory_problem(None, head, "Qwen/data") is None and driver_memory_problem(10**12, None, "d") is None


def test_the_dataset_size_and_the_containers_limit_are_read_from_the_real_files(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(b"x" * 1000)
    (tmp_path / "data" / "b.jsonl").write_bytes(b"y" * 500)
    assert dataset_bytes(str(tmp_path / "data" / "a.jsonl")) == 1000
    assert dataset_bytes(str(tmp_path / "data")) == 1500
    assert dataset_bytes("Qwen/some-hub-dataset") is None
    v2, v1, none = tmp_path / "memory.max", tmp_path / "limit_in_bytes", tmp_path / "unlimited"
    v2.write_text("8589934592\n")
    v1.write_text(str(2**63 - 4096))  # cgroup v1's "no limit"
    none.write_text("max\n")
    assert memory_limit_bytes((str(v2),)) == 8 * 2**30
    assert memory_limit_bytes((str(tmp_path / "absent"), str(v2))) == 8 * 2**30
    assert memory_limit_bytes((str(v1),)) is None and memory_limit_bytes((str(none),)) is None
    assert memory_limit_bytes() is None or memory_limit_bytes() > 0  # this machine: a number or no limit
