"""The mocked program's resources as the policy pack sees them (deploy.offline, no Pulumi CLI)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy import offline
from policy import model, rules
from tests.stacks import read_stack_file

REPO = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in REPO.glob("Pulumi.*.yaml"))


class IdRecordingMocks(offline.RecordingMocks):
    """Also keeps the physical ID the mock hands out, which stack rules resolve references with."""

    def __init__(self, region: str):
        super().__init__(region)
        self.ids: list[str] = []

    def new_resource(self, args):
        rid, outputs = super().new_resource(args)
        self.ids.append(rid)
        return [rid, outputs]


@dataclass
class Plan:
    stack: str
    recorded: list[offline.Recorded]
    ids: list[str]

    def stack_resources(self) -> list[model.Resource]:
        """What AnalyzeStack sees: outputs, with the IDs the engine assigned."""
        return [model.Resource(r.type, r.name, r.outputs, f"urn:pulumi:{self.stack}::raytrain-eks::{r.type}::{r.name}", rid)
                for r, rid in zip(self.recorded, self.ids, strict=True)]

    def of_type(self, typ: str) -> list[offline.Recorded]:
        return [r for r in self.recorded if r.type == typ]


def plan_stack(stack: str, **overrides: Any) -> Plan:
    """Run the program with Pulumi.<stack>.yaml plus `key=value` overrides (keys without the project prefix)."""
    raw = read_stack_file(stack, REPO)
    raw.update({f"raytrain-eks:{k}": v for k, v in overrides.items()})
    mocks = IdRecordingMocks(str(raw.get("aws:region", "us-east-1")))
    result = offline.run(raw, stack=stack, mocks=mocks)
    return Plan(stack, result.resources, mocks.ids)


def pack_config(stack: str) -> dict[str, Any]:
    """The policy pack config the preview workflow passes for this stack (policy/config/<stack>.json)."""
    return json.loads((REPO / "policy" / "config" / f"{stack}.json").read_text())


def evaluate(plan: Plan, config: dict[str, Any], *, extra: list[offline.Recorded] = ()) -> dict[str, list]:
    """Every policy over the plan: resource rules on each resource's inputs (as Analyze gets them),
    stack rules on all outputs (as AnalyzeStack gets them)."""
    recorded = [*plan.recorded, *extra]
    stack = plan.stack_resources() + [model.Resource(r.type, r.name, r.outputs, f"urn:extra::{r.name}") for r in extra]
    found: dict[str, list] = {}
    for rule in rules.RULES:
        if rule.kind == "resource":
            found[rule.name] = [(r.name, m) for r in recorded for m in rule.check((r.type, r.inputs), config.get(rule.name))]
        else:
            found[rule.name] = rule.check(stack, config.get(rule.name))
    return found


@pytest.fixture(scope="session")
def plans() -> dict[str, Plan]:
    return {stack: plan_stack(stack) for stack in STACKS}


def first_preview(resources: list[model.Resource]) -> list[model.Resource]:
    """The same stack as a first `pulumi preview` shows it: no resource has an ID yet, every property
    holding one is unknown, and the engine's property dependencies say which resource it came from."""
    urns_by_id: dict[str, list[str]] = {}
    for r in resources:
        urns_by_id.setdefault(r.id, []).append(r.urn)

    def hide(value: Any, deps: set[str]) -> Any:
        if isinstance(value, str) and value in urns_by_id:
            deps.update(urns_by_id[value])
            return model.UNKNOWN
        if isinstance(value, dict):
            return {k: hide(v, deps) for k, v in value.items()}
        if isinstance(value, list):
            return [hide(v, deps) for v in value]
        return value

    previewed = []
    for r in resources:
        props, deps = {}, {}
        for key, value in r.props.items():
            found: set[str] = set()
            props[key] = hide(value, found)
            if found:
                deps[key] = tuple(sorted(found))
        previewed.append(model.Resource(r.type, r.name, props, r.urn, None, deps))
    return previewed
