"""Fixtures that run the Pulumi program in-process under mocks (deploy.offline)."""
from __future__ import annotations

import pytest

from deploy import offline

BASE = {
    "aws:region": "us-east-1",
    "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"],
}


def run_stack(stack: str = "dev", mocks: offline.RecordingMocks | None = None, **overrides) -> offline.PlanResult:
    """Run the program with BASE plus `key=value` overrides (keys without the project prefix)."""
    raw = dict(BASE)
    for key, value in overrides.items():
        raw[key if ":" in key else f"raytrain-eks:{key}"] = value
    return offline.run(raw, stack=stack, mocks=mocks)


@pytest.fixture(scope="session")
def dev() -> offline.PlanResult:
    return run_stack(tags={"team": "ml"}, adminRoleArns=["arn:aws:iam::123456789012:role/Admin"])


@pytest.fixture(scope="session")
def p5() -> offline.PlanResult:
    return run_stack(stack="p5", gpuNodeType="p5.48xlarge", gpuNodeCount=2)
