"""The policy pack as the Pulumi CLI runs it: `python -m pulumi.policy` in policy/, spoken to over gRPC.

The CLI cannot be installed here; this drives the same analyzer protocol it uses for
`pulumi preview --policy-pack policy`: GetAnalyzerInfo, Configure, Analyze (one
resource, inputs), AnalyzeStack (all resources, outputs and property dependencies).
"""
from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policy import model, pack, rules

from .conftest import REPO, evaluate, pack_config

UNKNOWN = UNKNOWN_STRING_VALUE  # how the engine marshals a value it does not know yet
DIGEST = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def analyzer():
    proc = subprocess.Popen([sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "."], cwd=REPO / "policy",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ""})
    try:
        line = proc.stdout.readline().decode().strip()
        assert line.isdigit(), f"the pack did not print its port: {line!r} {proc.stderr.read1().decode()}"
        channel = grpc.insecure_channel(f"127.0.0.1:{line}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def struct(props: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(props)
    return s


def configure(stub, **policy_config) -> None:
    stub.Configure(analyzer_pb2.ConfigureAnalyzerRequest(policyConfig={
        name: analyzer_pb2.PolicyConfig(enforcementLevel=analyzer_pb2.MANDATORY, properties=struct(props))
        for name, props in policy_config.items()}))


def analyze(stub, typ: str, props: dict) -> list:
    request = analyzer_pb2.AnalyzeRequest(type=typ, properties=struct(props), urn=f"urn:pulumi:dev::p::{typ}::r", name="r")
    return list(stub.Analyze(request).diagnostics)


def stack_request(resources: list[model.Resource]) -> analyzer_pb2.AnalyzeStackRequest:
    """Outputs as the engine sends them: the physical ID among them (bridged providers output `id`)."""
    return analyzer_pb2.AnalyzeStackRequest(resources=[analyzer_pb2.AnalyzerResource(
        type=r.type, name=r.name, urn=r.urn, properties=struct({**r.props, **({"id": r.id} if r.id else {})}),
        propertyDependencies={k: analyzer_pb2.AnalyzerPropertyDependencies(urns=list(v)) for k, v in r.deps.items()},
    ) for r in resources])


def test_pack_files_describe_a_python_pack_with_its_own_pinned_virtualenv():
    spec = yaml.safe_load((REPO / "policy" / "PulumiPolicy.yaml").read_text())
    assert spec["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": "venv"}}
    assert spec["description"] and spec["version"]
    pins = [line for line in (REPO / "policy" / "requirements.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert "pulumi-policy==1.21.0" in pins and all("==" in p for p in pins)


def test_analyzer_info_lists_every_rule_mandatory_with_config_schemas(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == pack.PACK_NAME
    assert [p.name for p in info.policies] == [r.name for r in rules.RULES]
    assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}
    by_name = {p.name: p for p in info.policies}
    assert by_name["max-gpu-nodes"].policy_type == analyzer_pb2.POLICY_TYPE_STACK
    assert by_name["images-by-digest"].policy_type == analyzer_pb2.POLICY_TYPE_RESOURCE
    schema = by_name["max-gpu-nodes"].configSchema.properties["maxGpuNodes"]
    assert schema["type"] == "integer" and schema["default"] == rules.DEFAULT_MAX_GPU_NODES
    assert list(by_name["ray-not-exposed"].configSchema.properties["rayNamespaces"]["default"]) == ["ray"]


def test_analyze_reports_a_violation_as_mandatory_and_passes_a_compliant_resource(analyzer):
    good = {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1, "httpEndpoint": "enabled"}}
    assert analyze(analyzer, model.LAUNCH_TEMPLATE, good) == []
    bad = {"metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 1}}
    (diag,) = analyze(analyzer, model.LAUNCH_TEMPLATE, bad)
    assert diag.policyName == "imdsv2-required" and diag.enforcementLevel == analyzer_pb2.MANDATORY
    assert "httpTokens is 'optional'" in diag.message and diag.policyPackName == pack.PACK_NAME


def test_unknown_image_during_preview_is_advisory_but_a_known_exposure_still_blocks(analyzer):
    cluster = {"metadata": {"namespace": "ray"}, "spec": {"headGroupSpec": {
        "serviceType": "LoadBalancer",
        "template": {"spec": {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                              "containers": [{"name": "ray-head", "image": UNKNOWN, "securityContext": {
                                  "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}}}}
    diags = {d.policyName: d for d in analyze(analyzer, "kubernetes:ray.io/v1:RayCluster", cluster)}
    assert set(diags) == {"images-by-digest", "ray-not-exposed"}
    assert diags["images-by-digest"].enforcementLevel == analyzer_pb2.ADVISORY
    assert "can't run policy 'images-by-digest'" in diags["images-by-digest"].message
    assert diags["ray-not-exposed"].enforcementLevel == analyzer_pb2.MANDATORY
    cluster["spec"]["headGroupSpec"]["serviceType"] = "ClusterIP"
    cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = DIGEST
    assert analyze(analyzer, "kubernetes:ray.io/v1:RayCluster", cluster) == []


def first_preview_efa_stack(with_egress: bool) -> list[model.Resource]:
    """A fresh stack's preview: no IDs yet, references only known through property dependencies."""
    sg = model.Resource(model.SECURITY_GROUP, "gpu-efa", {"vpcId": UNKNOWN, "id": UNKNOWN}, "urn:sg")
    lt = model.Resource(model.LAUNCH_TEMPLATE, "gpu-lt", {"networkInterfaces": [
        {"interfaceType": "efa", "deviceIndex": 0, "securityGroups": [UNKNOWN, UNKNOWN]}]},
        "urn:lt", deps={"networkInterfaces": ["urn:cluster", "urn:sg"]})
    refs = {"securityGroupId": ["urn:sg"], "referencedSecurityGroupId": ["urn:sg"]}
    rule_props = {"securityGroupId": UNKNOWN, "referencedSecurityGroupId": UNKNOWN, "ipProtocol": "-1"}
    stack = [sg, lt, model.Resource(model.VPC_INGRESS, "in", rule_props, "urn:in", deps=refs)]
    if with_egress:
        stack.append(model.Resource(model.VPC_EGRESS, "out", rule_props, "urn:out", deps=refs))
    return stack


def test_analyze_stack_resolves_efa_groups_through_property_dependencies(analyzer):
    assert list(analyzer.AnalyzeStack(stack_request(first_preview_efa_stack(True))).diagnostics) == []
    (diag,) = analyzer.AnalyzeStack(stack_request(first_preview_efa_stack(False))).diagnostics
    assert diag.policyName == "efa-security-group-self-rules" and diag.urn == "urn:sg"
    assert "lacks the all-traffic egress rule" in diag.message


def test_configured_gpu_cap_applies_to_the_whole_mocked_program(analyzer, plans):
    resources = plans["dev"].stack_resources()
    assert evaluate(plans["dev"], pack_config("dev"))["max-gpu-nodes"] == []
    try:
        configure(analyzer, **{"max-gpu-nodes": {"maxGpuNodes": 1}})
        (diag,) = analyzer.AnalyzeStack(stack_request(resources)).diagnostics
        assert diag.policyName == "max-gpu-nodes"
        assert "can run 2 GPU nodes (gpu-ng: 2), more than maxGpuNodes=1" in diag.message
        configure(analyzer, **{"max-gpu-nodes": {"maxGpuNodes": "two"}})
        with pytest.raises(grpc.RpcError, match="max-gpu-nodes.maxGpuNodes: 'two' is not a whole number"):
            analyzer.AnalyzeStack(stack_request(resources))
    finally:
        configure(analyzer)
    assert list(analyzer.AnalyzeStack(stack_request(resources)).diagnostics) == []


def test_plain_unwraps_the_sdk_proxy_and_marks_unknowns():
    from pulumi_policy.proxy import UnknownValueError, unknown_checking_proxy
    props = unknown_checking_proxy({"a": [1, {"b": UNKNOWN}], "c": "x"})
    with pytest.raises(UnknownValueError):
        props["a"][1]["b"]
    assert pack.plain(props) == {"a": [1, {"b": model.UNKNOWN}], "c": "x"}
