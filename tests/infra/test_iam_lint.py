"""Every IAM document of the plan (inline, bucket, trust, endpoint) passes parliament, a real IAM linter with
AWS's action catalog, and least privilege stays true."""
from __future__ import annotations

import importlib.resources
import json
import re
import sys
import types

import pytest

from infra import iam
from tests.guards import nonempty

OIDC_SOURCE = re.compile(r"^UNKNOWN_FEDERATION_SOURCE: arn:aws:iam::\d{12}:oidc-provider/oidc\.eks\.[a-z0-9-]+\."
                         r"amazonaws\.com/id/\w+$")


def _parliament():
    """parliament 1.6.4 finds its data files through pkg_resources.resource_filename, which setuptools >= 81 no
    longer ships; that one function is all it uses, so it is provided from importlib.resources."""
    if "pkg_resources" not in sys.modules:
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = types.ModuleType("pkg_resources")
            shim.resource_filename = lambda package, name: str(importlib.resources.files(package) / name)
            sys.modules["pkg_resources"] = shim
    import parliament

    return parliament


def documents(result) -> list[tuple[str, str, dict]]:
    """(resource, field, document) for every policy document the plan declares."""
    fields = {"assumeRolePolicy": "trust", "policy": "policy"}
    found = []
    for r in result.resources:
        if r.type.startswith("aws:"):
            for key, kind in fields.items():
                if isinstance(r.inputs.get(key), str) and r.inputs[key].lstrip().startswith("{"):
                    found.append((f"{r.type} {r.name}", kind, json.loads(r.inputs[key])))
    return found


def findings(document: dict, kind: str) -> list[str]:
    policy = _parliament().analyze_policy_string(json.dumps(document))
    issues = [f"{f.issue}: {f.detail}" for f in policy.findings]
    if kind == "trust":
        # A trust policy has no Resource by IAM's grammar, and parliament 1.6.4 knows SAML providers but not IAM
        # OIDC providers (the IRSA pattern): those two findings are the linter's gaps, anything else counts.
        issues = [i for i in issues if i != "MALFORMED: Statement contains neither Resource nor NotResource"
                  and not OIDC_SOURCE.match(i)]
    return issues


@pytest.fixture(scope="module")
def scale_to_zero_plan():
    from .conftest import run_stack

    return run_stack(scaleToZero=True)


def test_the_plan_declares_every_kind_of_document(scale_to_zero_plan):
    names = {name.split(" ")[1] for name, _, _ in documents(scale_to_zero_plan)}
    assert {"cluster-cluster-role", "cluster-node-role", "checkpoints-irsa", "checkpoints-irsa-s3",
            "checkpoints-tls-only", "cluster-autoscaler-irsa", "cluster-autoscaler-irsa-scaling", "net-s3"} <= names


def test_every_document_passes_parliament(scale_to_zero_plan):
    problems = [f"{name} ({kind}): {issue}" for name, kind, doc in documents(scale_to_zero_plan)
                for issue in findings(doc, kind)]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("document,issue", [
    ({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "*"}]},
     "UNKNOWN_ACTION"),
    ({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                                              "Resource": "arn:aws:s3:::bucket"}]}, "RESOURCE_MISMATCH"),
    ({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:DescribeInstances",
                                              "Resource": "*", "Condition": {"StringEquals": {"aws:Bogus": "x"}}}]},
     "UNKNOWN_CONDITION_FOR_ACTION"),
])
def test_parliament_catches_a_planted_mistake(document, issue):
    """The linter runs for real: a mistake of each kind is found."""
    assert any(f.startswith(issue) for f in findings(document, "policy")), findings(document, "policy")


def _resources(document: dict) -> set[str]:
    return {r for s in document["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}


def test_the_bucket_role_reaches_one_bucket_only(scale_to_zero_plan):
    (doc,) = [d for name, _, d in documents(scale_to_zero_plan) if name.endswith("checkpoints-irsa-s3")]
    bucket = scale_to_zero_plan.one("aws:s3/bucket:Bucket").outputs["arn"]
    assert _resources(doc) == {bucket, f"{bucket}/*"}


def test_the_cluster_autoscaler_writes_only_under_its_tag_condition(scale_to_zero_plan):
    (doc,) = [d for name, _, d in documents(scale_to_zero_plan) if name.endswith("cluster-autoscaler-irsa-scaling")]
    for statement in nonempty(doc["Statement"], "statements of the scaling policy"):
        writes = [a for a in statement["Action"] if not a.split(":")[1].startswith(("Describe", "Get"))]
        if writes:
            condition = statement["Condition"]["StringEquals"]
            assert condition["aws:ResourceTag/k8s.io/cluster-autoscaler/raytrain-eks-dev"] == "owned", statement


def test_the_s3_endpoint_lets_through_this_account_and_awss_own_buckets_only(scale_to_zero_plan):
    endpoint = scale_to_zero_plan.one("aws:ec2/vpcEndpoint:VpcEndpoint")
    doc = json.loads(endpoint.inputs["policy"])
    own, aws_owned = doc["Statement"]
    assert own["Condition"] == {"StringEquals": {"aws:ResourceAccount": "123456789012"}}
    assert "s3:*" not in own["Action"] and aws_owned["Action"] == "s3:GetObject"
    assert _resources({"Statement": [aws_owned]}) == {"arn:aws:s3:::prod-us-east-1-starport-layer-bucket/*",
                                     "arn:aws:s3:::al2023-repos-us-east-1-*/*"}
    assert endpoint.inputs["vpcEndpointType"] == "Gateway" and endpoint.inputs["serviceName"] == "com.amazonaws.us-east-1.s3"
    assert endpoint.inputs["routeTableIds"] == ["net-private-id"]
    assert iam.S3_DATA_ACTIONS == tuple(own["Action"])


def test_a_trust_policy_from_an_unknown_source_still_fails():
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRoleWithWebIdentity",
                                                     "Principal": {"Federated": "arn:aws:iam::123456789012:user/x"}}]}
    assert any(f.startswith("UNKNOWN_FEDERATION_SOURCE") for f in findings(trust, "trust"))
