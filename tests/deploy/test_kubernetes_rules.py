"""pulumi-kubernetes' replace rules as the update diff applies them, read from the provider's own Go source.

The vendored diff.go is checked to be the upstream file byte for byte (its git blob id at tag v4.32.0),
and each verdict below is pinned against an excerpt of that upstream text, not a table restated here.
"""
from __future__ import annotations

import hashlib

import pytest

from deploy import kubernetes_rules, update_diff
from deploy.change_table import planned
from tests.guards import nonempty
from tests.stacks import read_stack_file

# git rev-parse v4.32.0:provider/pkg/provider/diff.go in github.com/pulumi/pulumi-kubernetes (the same at
# the stored snapshot's HEAD, 2026-07-01); helm_release.go and provider.go blobs as excerpts.go names them.
DIFF_GO_BLOB = "f999acc30e81bd25a2f6035d401ea129b313dfef"
EXCERPTS = {  # upstream text -> what the reader must make of it
    '\t\t"Service": properties{\n\t\t\t".spec.clusterIP",\n\t\t},':
        ("kubernetes:core/v1:Service", "spec.clusterIP"),
    ('var deployment = append(\n\tproperties{\n\t\t".spec.selector",\n\t},\n'
     '\tlabelSelectorForceNewProperties(".spec.selector")...,'):
        ("kubernetes:apps/v1:Deployment", "spec.selector.matchLabels"),
    '\t\t\t"DaemonSet":   daemonset,':
        ("kubernetes:apps/v1:DaemonSet", "spec.selector"),
    '\t\t"v1beta1": _kinds{"PodDisruptionBudget": podDisruptionBudget},':
        ("kubernetes:policy/v1beta1:PodDisruptionBudget", "spec"),
    '\t\t\t\tprops = append(props, properties{".type", ".stringData", ".data"}...)':
        ("kubernetes:core/v1:Secret", "stringData"),
    '\t\tforceNewFields := []string{".name", ".namespace"}':
        ("kubernetes:helm.sh/v3:Release", "namespace"),
}


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_vendored_diff_go_is_the_upstream_file():
    assert git_blob(kubernetes_rules.DIFF_GO.read_bytes()) == DIFF_GO_BLOB


@pytest.mark.parametrize("excerpt", sorted(EXCERPTS), ids=lambda e: EXCERPTS[e][0].split(":")[-1])
def test_each_rule_comes_from_the_upstream_text(excerpt):
    typ, path = EXCERPTS[excerpt]
    source = kubernetes_rules.DIFF_GO.read_text() + kubernetes_rules.EXCERPTS_GO.read_text()
    assert excerpt in source
    assert path in update_diff.type_rules(typ)["force_new"]


def test_what_the_source_does_not_list_is_updated_in_place():
    """policy/v1 has no entry (only v1beta1's PDB is replaced on spec); CRDs and custom resources only on identity."""
    for typ in ("kubernetes:policy/v1:PodDisruptionBudget", "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition",
                "kubernetes:ray.io/v1:RayCluster", "kubernetes:networking.k8s.io/v1:NetworkPolicy"):
        assert kubernetes_rules.force_new(typ) == ["metadata.name", "metadata.namespace"], typ
    assert "spec.template" not in kubernetes_rules.force_new("kubernetes:apps/v1:Deployment")
    assert "spec.template" in kubernetes_rules.force_new("kubernetes:batch/v1:Job")
    assert kubernetes_rules.force_new("kubernetes:core/v1:NamespacePatch") == ["metadata.name", "metadata.namespace"]


def test_every_kubernetes_type_the_program_declares_is_read_from_the_source():
    stack = {**read_stack_file("dev"), "raytrain-eks:kubernetesVersion": "1.34", "raytrain-eks:scaleToZero": True}
    declared = {r["type"] for r in planned(stack) if r["type"].startswith("kubernetes:")}
    for typ in nonempty(sorted(declared), "Kubernetes types the program declares"):
        assert update_diff.type_rules(typ)["force_new"][:2] in (["metadata.name", "metadata.namespace"],
                                                                ["name", "namespace"]), typ


def record(typ: str, name: str, inputs: dict) -> dict:
    return {"type": typ, "name": name, "urn": f"urn:pulumi:dev::p::{typ}::{name}", "inputs": inputs, "options": {}}


@pytest.mark.parametrize("typ, before, after, verdict, forcing", [
    ("kubernetes:core/v1:Service", {"spec": {"clusterIP": "10.0.0.1"}}, {"spec": {"clusterIP": "10.0.0.2"}},
     "replace", ["spec.clusterIP"]),
    ("kubernetes:core/v1:Service", {"spec": {"ports": [{"port": 80}]}}, {"spec": {"ports": [{"port": 81}]}},
     "update", []),
    ("kubernetes:apps/v1:Deployment", {"spec": {"selector": {"matchLabels": {"a": "1"}}}},
     {"spec": {"selector": {"matchLabels": {"a": "2"}}}}, "replace", ["spec.selector", "spec.selector.matchLabels"]),
    ("kubernetes:apps/v1:Deployment", {"spec": {"template": {"spec": {"containers": [{"image": "a"}]}}}},
     {"spec": {"template": {"spec": {"containers": [{"image": "b"}]}}}}, "update", []),
    ("kubernetes:policy/v1:PodDisruptionBudget", {"spec": {"maxUnavailable": 1}}, {"spec": {"maxUnavailable": 0}},
     "update", []),
    ("kubernetes:helm.sh/v3:Release", {"namespace": "a", "version": "1"}, {"namespace": "b", "version": "1"},
     "replace", ["namespace"]),
    ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", {"metadata": {"name": "x.ray.io"}, "spec": {"v": 1}},
     {"metadata": {"name": "x.ray.io"}, "spec": {"v": 2}}, "update", []),
])
def test_the_update_diff_judges_kubernetes_objects_by_those_rules(typ, before, after, verdict, forcing):
    d = update_diff.compare([record(typ, "r", before)], [record(typ, "r", after)])
    change = d.of(typ, "r")
    assert (change.verdict, change.forcing) == (verdict, forcing)


def test_a_source_this_reader_does_not_know_fails_loudly():
    reader = kubernetes_rules._Reader(kubernetes_rules._tokens('var forceNew = _groups{"apps": somethingElse(1)}'))
    with pytest.raises(kubernetes_rules.RuleSourceError, match="no var somethingElse|cannot read"):
        reader.value("forceNew")
