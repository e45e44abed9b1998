"""What typical changes do to a running stack, as the update diff (deploy.update_diff) judges them.

    python -m deploy.change_table

Plans the dev stack (Kubernetes 1.34, an image pinned by digest) and each change of it offline, and
prints one Markdown row per change: what is replaced (and why), updated, created or deleted, and what
a reviewer must see. docs/operations.md holds the output; tests/deploy/test_change_table.py keeps it so.
The KubeRay row reads kuberay-operator 1.6.0's chart archive (workloads.crds); where none is stored,
`python -m tests.charts DIR` derives a stand-in from 1.7.0's and RAYTRAIN_CHARTS=DIR points to it, as
the tests do.
"""
from __future__ import annotations

import json
from functools import cache
from typing import Any

from deploy import offline, plan, stack_file, update_diff

DIGEST = "763104351884.dkr.ecr.us-east-1.amazonaws.com/ray@sha256:"
KEY = "raytrain-eks:"
POOLS = {"system": {"instanceType": "m7i.xlarge"}, "gpu": {"instanceType": "g6.12xlarge", "desiredSize": 2}}


def base() -> dict[str, Any]:
    stack = stack_file.read(plan.stack_path("dev"))
    return {**stack.config, f"{KEY}kubernetesVersion": "1.34", f"{KEY}dlcImage": DIGEST + "ab" * 32}


def pools_base() -> dict[str, Any]:
    shorthand = {k: v for k, v in base().items() if k not in (f"{KEY}gpuNodeType", f"{KEY}gpuNodeCount")}
    return {**shorthand, f"{KEY}nodePools": POOLS}


# (what changes, the stack it changes, the keys set)
CHANGES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("a tag value", "dev", {"tags": {"environment": "staging"}}),
    ("node count 2 -> 3", "dev", {"gpuNodeCount": 3}),
    ("GPU type", "dev", {"gpuNodeType": "g6e.12xlarge"}),
    ("Kubernetes version +1", "dev", {"kubernetesVersion": "1.35"}),
    ("Kubernetes version +2", "dev", {"kubernetesVersion": "1.36"}),
    ("DLC digest", "dev", {"dlcImage": DIGEST + "cd" * 32}),
    ("DLC digest, scaleToZero stack", "scaled", {"dlcImage": DIGEST + "cd" * 32}),
    ("worker env (ncclDebug)", "dev", {"ncclDebug": "WARN"}),
    ("a pool's zone", "pools", {"nodePools": {**POOLS, "gpu": {**POOLS["gpu"], "availabilityZone": "us-east-1c"}}}),
    ("a new pool", "pools", {"nodePools": {**POOLS, "data": {"instanceType": "m7i.4xlarge", "desiredSize": 1}}}),
    ("a renamed pool", "pools", {"nodePools": {"system": POOLS["system"], "train": POOLS["gpu"]}}),
    ("cluster rename", "dev", {"clusterName": "raytrain-renamed"}),
    ("KubeRay version", "dev", {"kuberayVersion": "1.6.0"}),
)


def stack(kind: str) -> dict[str, Any]:
    if kind == "pools":
        return {**pools_base(), f"{KEY}nodePools": {**POOLS, "gpu": {**POOLS["gpu"], "availabilityZone": "us-east-1a"}}}
    return {**base(), **({f"{KEY}scaleToZero": True} if kind == "scaled" else {})}


@cache
def _records(frozen: str) -> tuple[dict, ...]:
    return tuple(plan.records(offline.run(json.loads(frozen), stack="dev")))


def planned(config: dict) -> list[dict]:
    return list(_records(json.dumps(config, sort_keys=True)))


def judged(kind: str, keys: dict[str, Any]) -> update_diff.Diff:
    before = stack(kind)
    return update_diff.compare(planned(before), planned({**before, **{KEY + k: v for k, v in keys.items()}}))


def _names(changes: list[update_diff.Change], *, why: bool = False, most: int = 4) -> str:
    shown = [f"{c.name} ({', '.join(c.forcing)})" if why and c.forcing else c.name for c in changes]
    if not shown:
        return "-"
    return ", ".join(shown) if len(shown) <= most else f"{len(shown)} resources"


def row(label: str, kind: str, keys: dict[str, Any]) -> str:
    d = judged(kind, keys)
    real = [c for c in d.changes if not c.type.startswith("raytrain:")]
    by = {v: [c for c in real if c.verdict == v] for v in update_diff.VERDICTS}
    review = "; ".join(d.review) or "-"
    keys_text = ", ".join(f"`{k}`" for k in keys)
    made = " / ".join(x for x in (_names(by["create"]) if by["create"] else "",
                                  "deleted " + _names(by["delete"]) if by["delete"] else "") if x) or "-"
    return (f"| {label} | {keys_text} | {_names(by['replace'], why=True)} | {_names(by['update'])} | {made} | "
            f"{review} |")


def markdown_table() -> str:
    lines = ["| change | stack keys | replaced (forced by) | updated in place | created / deleted | review |",
             "|---|---|---|---|---|---|"]
    lines += [row(label, kind, keys) for label, kind, keys in CHANGES]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
