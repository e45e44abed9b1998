"""Which cluster: a Pulumi stack's outputs (facts.outputs names them) and its kubeconfig, or flags."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from facts import outputs as stack_outputs
from facts import ray as ray_facts
from facts.errors import UserError


class SubmitError(UserError, RuntimeError):
    """A problem reaching or using the cluster, explained for the user."""


@dataclass(frozen=True)
class Target:
    """How to reach a Ray head: an address, or a Kubernetes service to port-forward to."""

    address: str | None
    namespace: str
    service: str
    raycluster: str
    kubeconfig: str | None = None


def run_command(cmd: list[str], what: str, env: dict | None = None, timeout: float = 60) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise SubmitError(f"{what}: `{cmd[0]}` is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what}: `{shlex.join(cmd)}` did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SubmitError(f"{what}: `{shlex.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@contextlib.contextmanager
def stack_target(stack: str) -> Iterator[tuple[Target, dict]]:
    """Namespace, head service and kubeconfig from `pulumi stack output`, and all the outputs.

    The kubeconfig is a secret: it lives in a 0600 temporary file only while the block runs, and is
    removed however the block ends (bad input found later included).
    """
    raw = run_command(["pulumi", "stack", "output", "--json", "--show-secrets", "--stack", stack], f"--stack {stack}")
    try:
        outputs = json.loads(raw)
    except ValueError:
        raise SubmitError(f"--stack {stack}: `pulumi stack output --json` did not print JSON") from None
    missing = [k for k in stack_outputs.REQUIRED_BY_SUBMIT if k not in outputs]
    if missing:
        raise SubmitError(f"--stack {stack}: the stack has no output {', '.join(missing)}; run `pulumi up` first")
    fd, path = tempfile.mkstemp(prefix="kubeconfig-", suffix=".json")  # created 0600
    try:
        config = outputs[stack_outputs.KUBECONFIG]
        with os.fdopen(fd, "w") as kubeconfig:
            kubeconfig.write(config if isinstance(config, str) else json.dumps(config))
        yield Target(None, outputs[stack_outputs.RAY_NAMESPACE], outputs[stack_outputs.RAY_HEAD_SERVICE],
                     outputs.get(stack_outputs.RAY_CLUSTER_NAME, ray_facts.CLUSTER_NAME), path), outputs
    finally:
        Path(path).unlink(missing_ok=True)


def kubectl(target: Target) -> list[str]:
    return ["kubectl", *(["--kubeconfig", target.kubeconfig] if target.kubeconfig else []), "-n", target.namespace]


@dataclass(frozen=True)
class GpuPool:
    """A GPU node pool of the stack that carries Ray workers, as its nodePools output describes it."""

    name: str
    instance_type: str
    max_nodes: int
    gpus_per_node: int
    labelled: bool  # its worker group advertises facts.ray.pool_labels(name), so a label selector finds it
    disk_gib: int | None = None  # each node's root volume; None: a stack deployed before the output named it

    @property
    def gpus(self) -> int:
        return self.max_nodes * self.gpus_per_node


def gpu_pools(outputs: dict) -> list[GpuPool]:
    """The stack's GPU pools with Ray workers; a stack without the nodePools output has gpuNodeType/Count's one."""
    found = outputs.get(stack_outputs.NODE_POOLS)
    if found is None:
        row = catalog_row(outputs.get(stack_outputs.GPU_NODE_TYPE))
        count = outputs.get(stack_outputs.GPU_NODE_COUNT)
        return [GpuPool("gpu", row.name, int(count), row.gpus, False)] if row and count is not None else []
    return [GpuPool(name, pool[stack_outputs.POOL_INSTANCE_TYPE], int(pool[stack_outputs.POOL_MAX_SIZE]),
                    int(pool[stack_outputs.POOL_GPUS_PER_NODE]),
                    pool.get(stack_outputs.POOL_RAY_LABELS) == ray_facts.pool_labels(name),
                    pool.get(stack_outputs.POOL_DISK_SIZE_GIB))
            for name, pool in found.items()
            if pool.get(stack_outputs.POOL_GPUS_PER_NODE) and pool.get(stack_outputs.POOL_RAY_WORKER_GROUP)]


def choose_pool(outputs: dict, name: str | None) -> GpuPool | None:
    """The pool `--pool NAME` names; without it the stack's only GPU pool. None: the stack has none (or no outputs).

    With several GPU pools a job's workers could land on any of them, or across them: the flag is
    required then. A named pool pins the workers (TrainConfig.pool, a label selector), so it must
    advertise its Ray label; the only GPU pool needs no pinning, a GPU worker has nowhere else to go.
    """
    pools = gpu_pools(outputs)
    names = ", ".join(p.name for p in pools)
    if name is None:
        if len(pools) > 1:
            raise SubmitError(f"--pool: the stack has {len(pools)} GPU node pools ({names}); its workers could land on "
                              f"any of them, so name the one to train on, e.g. --pool {pools[0].name}")
        return pools[0] if pools else None
    if not outputs:
        return None  # --address: the cluster's own worker groups carry (or lack) the label
    chosen = next((p for p in pools if p.name == name), None)
    if chosen is None:
        raise SubmitError(f"--pool {name}: the stack has no GPU node pool of that name (with Ray workers); "
                          + (f"use one of: {names}" if pools else "it has none: drop --pool"))
    if not chosen.labelled:
        raise SubmitError(f"--pool {name}: the stack's Ray worker groups carry no pool labels yet (deployed by an "
                          f"older version of this program); run `pulumi up` to add them, then submit again")
    return chosen


def stack_defaults(outputs: dict, pool: GpuPool | None = None) -> dict | None:
    """What `submit --stack` trains on unless flags say otherwise: every GPU of the pool, its type, the bucket."""
    defaults: dict = {}
    if stack_outputs.CHECKPOINT_BUCKET_URI in outputs:
        defaults["storage_path"] = outputs[stack_outputs.CHECKPOINT_BUCKET_URI]
    if pool is not None and pool.gpus:
        defaults.update(device="gpu", num_workers=pool.gpus, instance_type=pool.instance_type,
                        node_disk_gib=pool.disk_gib)
    return defaults or None


def catalog_row(instance_type: str | None):
    """The instance type's catalog row (facts.catalog); None when no type is known."""
    from facts.catalog import GPU_TYPES

    if not instance_type:
        return None
    if instance_type not in GPU_TYPES:
        raise SubmitError(f"--instance-type {instance_type}: not in the instance catalog; use one of {', '.join(GPU_TYPES)}")
    return GPU_TYPES[instance_type]
