"""Rules that only `pulumi up` used to find, after the EKS cluster exists: now refused at config load.

Each limit is read from what AWS or Kubernetes ship (botocore's EKS model for label and taint lengths,
EKS's documented access-list limit, IAM's case-insensitive tag keys, the namespaces every cluster has).
"""
from __future__ import annotations

import botocore.session
import pytest

from deploy import config
from deploy.config import ConfigError, load
from workloads import charts

GOOD = {"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"]}
POOLS = {"system": {"instanceType": "m7i.xlarge"}, "gpu": {"instanceType": "g6.12xlarge", "desiredSize": 2}}


def problems_for(**overrides) -> list[str]:
    raw = {**GOOD, **{f"raytrain-eks:{k}": v for k, v in overrides.items()}}
    with pytest.raises(ConfigError) as info:
        load(raw, stack="dev")
    return info.value.problems


def gpu_pool(**settings) -> dict:
    return {"nodePools": {**POOLS, "gpu": {**POOLS["gpu"], **settings}}}


def eks_shape(name: str) -> dict:
    return botocore.session.get_session().get_service_model("eks").shape_for(name).metadata


def test_a_label_key_eks_finds_too_long_is_refused():
    high = eks_shape("labelKey")["max"]
    key = "example.com/" + "a" * (high - len("example.com/") + 1)  # a valid Kubernetes key: its name is < 63
    (problem,) = problems_for(**gpu_pool(labels={key: "x"}))
    assert "raytrain-eks:nodePools.gpu.labels" in problem and key in problem and f"1 to {high}" in problem


def test_an_empty_label_value_is_refused():
    assert eks_shape("labelValue")["min"] == 1  # Kubernetes takes "", EKS does not
    (problem,) = problems_for(**gpu_pool(labels={"team": ""}))
    assert "'team'" in problem and "empty" in problem


@pytest.mark.parametrize("key", ["node.kubernetes.io/lifecycle", "k8s.io/owner", "eks.amazonaws.com/team"])
def test_a_label_in_a_reserved_namespace_is_refused(key):
    (problem,) = problems_for(**gpu_pool(labels={key: "x"}))
    assert key in problem and "reserve" in problem and "example.com/" in problem


def test_a_taint_key_eks_finds_too_long_is_refused():
    high = eks_shape("taintKey")["max"]
    key = "example.com/" + "t" * (high - len("example.com/") + 1)
    (problem,) = problems_for(**gpu_pool(taints=[{"key": key, "value": "x", "effect": "NoSchedule"}]))
    assert "raytrain-eks:nodePools.gpu.taints" in problem and f"1 to {high}" in problem


def test_more_taints_than_a_node_group_takes_are_refused():
    taints = [{"key": f"k{i}", "value": "v", "effect": "NoSchedule"} for i in range(51)]
    (problem,) = problems_for(**gpu_pool(taints=taints))
    assert "51 taints" in problem and "at most 50" in problem


def test_more_public_access_cidrs_than_eks_takes_are_refused():
    cidrs = [f"203.0.113.{i}/32" for i in range(1, 42)]
    (problem,) = problems_for(apiAccessCidrs=cidrs)
    assert "raytrain-eks:apiAccessCidrs" in problem and "41 CIDRs" in problem and "at most 40" in problem


@pytest.mark.parametrize(("tags", "other"), [({"Project": "ml"}, "'project'"), ({"NAME": "x"}, "'Name'"),
                                             ({"team": "a", "Team": "b"}, "'team'")])
def test_tag_keys_that_differ_only_in_case_are_refused(tags, other):
    (problem,) = problems_for(tags=tags)
    assert "raytrain-eks:tags" in problem and other in problem and "case" in problem


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kube-public", "kube-node-lease", "kuberay-system"])
def test_a_ray_namespace_that_already_exists_is_refused(namespace):
    (problem,) = problems_for(rayNamespace=namespace)
    assert "raytrain-eks:rayNamespace" in problem and repr(namespace) in problem


def test_the_operator_namespace_is_the_charts():
    assert config.OPERATOR_NAMESPACE == charts.OPERATOR_NAMESPACE


def test_the_defaults_still_load():
    load({**GOOD, "raytrain-eks:tags": {"team": "ml"}}, stack="dev")
    load({**GOOD, **{f"raytrain-eks:{k}": v for k, v in gpu_pool(labels={"example.com/team": "ml"}).items()}},
         stack="dev")
