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


def stack_gpus(outputs: dict, instance_type: str | None = None) -> int | None:
    """Every GPU of the stack: GPU nodes x GPUs per node of its instance type (None when unknown)."""
    row = catalog_row(instance_type or outputs.get(stack_outputs.GPU_NODE_TYPE))
    count = outputs.get(stack_outputs.GPU_NODE_COUNT)
    return row.gpus * int(count) if row and count is not None else None


def stack_defaults(outputs: dict) -> dict | None:
    """What `submit --stack` trains on unless flags say otherwise: every GPU of the stack, its bucket."""
    defaults: dict = {}
    if stack_outputs.CHECKPOINT_BUCKET_URI in outputs:
        defaults["storage_path"] = outputs[stack_outputs.CHECKPOINT_BUCKET_URI]
    gpus = stack_gpus(outputs)
    if gpus:
        defaults.update(device="gpu", num_workers=gpus)
    return defaults or None


def catalog_row(instance_type: str | None):
    """The instance type's catalog row (facts.catalog); None when no type is known."""
    from facts.catalog import GPU_TYPES

    if not instance_type:
        return None
    if instance_type not in GPU_TYPES:
        raise SubmitError(f"--instance-type {instance_type}: not in the instance catalog; use one of {', '.join(GPU_TYPES)}")
    return GPU_TYPES[instance_type]
