"""Every policy over the resources of the mocked program, for every stack file, as is and with one flaw put in."""
from __future__ import annotations

import copy

import pytest

from deploy import offline
from policy import model, rules

from . import rule_named
from .conftest import STACKS, Plan, evaluate, pack_config, plan_stack

RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"


def test_the_stacks_under_test_are_the_stack_files():
    assert {"dev", "p5"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_passes_every_policy_with_its_config(plans, stack):
    plan = plans[stack]
    found = evaluate(plan, pack_config(stack))
    assert found == {rule.name: [] for rule in rules.RULES}
    # not vacuous: the things the rules look at are in the plan
    (gpu_lt,) = [r for r in plan.of_type(model.LAUNCH_TEMPLATE) if r.inputs.get("networkInterfaces")]
    assert {i["interfaceType"] for i in gpu_lt.inputs["networkInterfaces"]} <= {"efa", "efa-only"}
    assert plan.of_type(model.EKS_CLUSTER) and plan.of_type(model.VPC_EGRESS) and plan.of_type(model.HELM_RELEASE)
    (ray,) = plan.of_type(RAY_CLUSTER)
    assert ray.inputs["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_config_names_real_policies_with_valid_settings(stack):
    config = pack_config(stack)
    assert set(config) <= {r.name for r in rules.RULES}
    for name, settings in config.items():
        rule_named(name).config(settings)


def only(found: dict[str, list], rule: str) -> list:
    """The findings of `rule`, after checking that no other rule found anything."""
    assert {name: f for name, f in found.items() if f and name != rule} == {}
    assert found[rule], f"{rule} found nothing"
    return found[rule]


def flawed(plan: Plan, typ: str, name: str | None, change) -> Plan:
    """A copy of the plan with `change(inputs_and_outputs)` applied to one resource."""
    recorded = copy.deepcopy(plan.recorded)
    (target,) = [r for r in recorded if r.type == typ and (name is None or r.name == name)]
    change(target.inputs)
    change(target.outputs)
    return Plan(plan.stack, recorded, plan.ids)


def test_imds_v1_on_the_gpu_launch_template(plans):
    plan = flawed(plans["dev"], model.LAUNCH_TEMPLATE, "gpu-lt",
                  lambda p: p["metadataOptions"].update(httpTokens="optional"))
    ((name, message),) = only(evaluate(plan, pack_config("dev")), "imdsv2-required")
    assert name == "gpu-lt" and "httpTokens is 'optional'" in message


def test_public_ip_on_the_efa_interface(plans):
    plan = flawed(plans["p5"], model.LAUNCH_TEMPLATE, "gpu-lt",
                  lambda p: p["networkInterfaces"][5].update(associatePublicIpAddress="true"))
    ((name, message),) = only(evaluate(plan, pack_config("p5")), "no-public-ip-on-nodes")
    assert "networkInterfaces[5]" in message


def test_endpoint_open_to_the_world(plans):
    """The stack config refuses 0.0.0.0/0 already; the policy is the second line for edits that bypass it."""
    plan = flawed(plans["dev"], model.EKS_CLUSTER, None,
                  lambda p: p["vpcConfig"].update(publicAccessCidrs=["0.0.0.0/0"]))
    ((_, message),) = only(evaluate(plan, pack_config("dev")), "eks-endpoint-restricted")
    assert "0.0.0.0/0" in message


def test_ray_head_service_made_public(plans):
    plan = flawed(plans["dev"], RAY_CLUSTER, None,
                  lambda p: p["spec"]["headGroupSpec"].update(serviceType="LoadBalancer"))
    ((name, message),) = only(evaluate(plan, pack_config("dev")), "ray-not-exposed")
    assert "headGroupSpec.serviceType is LoadBalancer" in message


def test_a_load_balancer_added_to_the_ray_namespace(plans):
    namespace = plans["dev"].of_type(RAY_CLUSTER)[0].inputs["metadata"]["namespace"]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dashboard", "namespace": namespace},
           "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "targetPort": 8265}],
                    "selector": {"ray.io/node-type": "head"}}}
    extra = offline.Recorded(model.SERVICE, "dashboard", svc, svc)
    ((name, _),) = only(evaluate(plans["dev"], pack_config("dev"), extra=[extra]), "ray-not-exposed")
    assert name == "dashboard"


def test_ray_image_by_tag(plans):
    def retag(p):
        for c in p["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]:
            c["image"] = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    plan = flawed(plans["dev"], RAY_CLUSTER, None, retag)
    ((_, message),) = only(evaluate(plan, pack_config("dev")), "images-by-digest")
    assert "spec.workerGroupSpecs[0].template.spec.containers[0]" in message


def test_efa_group_without_its_outbound_self_rule(plans):
    plan = plans["dev"]
    keep = [i for i, r in enumerate(plan.recorded) if r.type != model.VPC_EGRESS]
    broken = Plan(plan.stack, [plan.recorded[i] for i in keep], [plan.ids[i] for i in keep])
    (violation,) = only(evaluate(broken, pack_config("dev")), "efa-security-group-self-rules")
    assert "lacks the all-traffic egress rule" in violation.message


def test_node_group_subnet_that_maps_public_ips(plans):
    plan = plans["dev"]
    (gpu,) = [r for r in plan.of_type(model.NODE_GROUP) if r.name == "gpu-ng"]
    subnet_id = gpu.inputs["subnetIds"][0]
    (name,) = [r.name for r, rid in zip(plan.recorded, plan.ids, strict=True) if rid == subnet_id and r.type == model.SUBNET]
    broken = flawed(plan, model.SUBNET, name, lambda p: p.update(mapPublicIpOnLaunch=True))
    violations = only(evaluate(broken, pack_config("dev")), "nodes-in-private-subnets")
    # the GPU AZ's private subnet also carries the system nodes
    assert sorted(v.message.split()[2] for v in violations) == ["gpu-ng", "system-ng"]
    assert all(f"uses subnet {name}, which maps public IPs" in v.message for v in violations)


@pytest.mark.parametrize("stack, count", [("dev", 5), ("p5", 3)])
def test_more_gpu_nodes_than_the_stack_allows(stack, count):
    cap = pack_config(stack)["max-gpu-nodes"]["maxGpuNodes"]
    assert count == cap + 1
    (violation,) = only(evaluate(plan_stack(stack, gpuNodeCount=count), pack_config(stack)), "max-gpu-nodes")
    assert f"can run {count} GPU nodes (gpu-ng: {count}), more than maxGpuNodes={cap}" in violation.message


def test_scale_to_zero_passes_and_is_capped_by_its_maximum_not_its_desired_size():
    plan = plan_stack("dev", scaleToZero=True)
    (gpu,) = [r for r in plan.of_type(model.NODE_GROUP) if r.name == "gpu-ng"]
    assert gpu.inputs["scalingConfig"]["desiredSize"] == 0
    assert evaluate(plan, pack_config("dev")) == {rule.name: [] for rule in rules.RULES}
    (violation,) = only(evaluate(plan_stack("dev", scaleToZero=True, gpuNodeCount=5), pack_config("dev")),
                        "max-gpu-nodes")
    assert "can run 5 GPU nodes (gpu-ng: 5)" in violation.message


def test_the_cloudwatch_monitoring_option_passes_every_policy():
    """`monitoring: cloudwatch` adds an add-on and an IRSA role: nothing in it may trip the pack."""
    plan = plan_stack("dev", monitoring="cloudwatch")
    assert [r for r in plan.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "amazon-cloudwatch-observability"]
    assert evaluate(plan, pack_config("dev")) == {rule.name: [] for rule in rules.RULES}
