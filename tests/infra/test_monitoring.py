"""The `monitoring` stack key: `cloudwatch` adds the amazon-cloudwatch-observability add-on with a role only its
agent can assume; `none` (the default) adds nothing; anything else is refused naming the key. Its request
against botocore's EKS model is checked with every other resource in test_conformance (the `cloudwatch`
variant)."""
from __future__ import annotations

import json

import pytest

from deploy import config
from infra import monitoring

from .conftest import BASE, run_stack

ADDON = "aws:eks/addon:Addon"
ROLE = "aws:iam/role:Role"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"


@pytest.fixture(scope="module")
def cloudwatch():
    return run_stack("dev", monitoring="cloudwatch")


def test_cloudwatch_installs_the_observability_add_on_with_its_own_irsa_role(cloudwatch):
    (addon,) = [a for a in cloudwatch.of_type(ADDON) if a.inputs["addonName"] == monitoring.ADDON]
    role = cloudwatch.one(ROLE, "cloudwatch-irsa")
    assert addon.inputs["serviceAccountRoleArn"] == role.outputs["arn"]
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    subjects = [v for cond in statement["Condition"].values() for k, v in cond.items() if k.endswith(":sub")]
    assert subjects == ["system:serviceaccount:amazon-cloudwatch:cloudwatch-agent"]  # the agent only
    attachment = cloudwatch.one(ATTACHMENT, "cloudwatch-policy")
    assert attachment.inputs["policyArn"] == "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"
    deps = cloudwatch.registrations[cloudwatch.urn(ADDON, "cloudwatch-addon")].dependencies
    nodegroups = cloudwatch.urns(lambda r: r.type == "aws:eks/nodeGroup:NodeGroup")
    assert nodegroups and set(nodegroups) <= deps  # its DaemonSets need nodes


def test_no_monitoring_by_default(dev):
    assert config.KEYS["monitoring"].default == "none"
    assert monitoring.ADDON not in [a.inputs["addonName"] for a in dev.of_type(ADDON)]
    assert [r for r in dev.of_type(ROLE) if r.name == "cloudwatch-irsa"] == []


def test_an_unknown_monitoring_value_is_refused_naming_the_key():
    with pytest.raises(config.ConfigError) as err:
        config.load({**BASE, "raytrain-eks:monitoring": "grafana"}, stack="dev")
    assert any("monitoring" in p and "'grafana' is not supported; use one of none, cloudwatch" in p
               for p in err.value.problems), err.value.problems


def test_the_plans_cost_table_names_what_cloudwatch_bills_by_use():
    from deploy.plan import render_cost
    from infra.cost import hourly_cost

    cfg = config.load({**BASE, "raytrain-eks:monitoring": "cloudwatch"}, stack="dev")
    with_it = render_cost(hourly_cost(cfg.node_pools), pools=cfg.node_pools, monitoring=cfg.monitoring)
    without = render_cost(hourly_cost(cfg.node_pools), pools=cfg.node_pools)
    assert "CloudWatch Container Insights (monitoring: cloudwatch) per observation" in with_it
    assert "Container Insights" not in without
