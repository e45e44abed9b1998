"""The shared facts: one image grammar, one taint in three spellings, the resources a node offers,
and that the package needs nothing but the standard library."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from facts import catalog, images, nodes, resources

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


# --- image references ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, parts", [
    ("public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
     ("public.ecr.aws", "deep-learning-containers/ray", "train-ml-cuda-v1.1", None)),
    (f"127.0.0.1:5000/team/ray@{DIGEST}", ("127.0.0.1:5000", "team/ray", None, DIGEST)),
    (f"registry.k8s.io/autoscaling/cluster-autoscaler:v1.36.1@{DIGEST}",
     ("registry.k8s.io", "autoscaling/cluster-autoscaler", "v1.36.1", DIGEST)),
    ("localhost/a__b/c-d.e:1", ("localhost", "a__b/c-d.e", "1", None)),
])
def test_references_parse_into_their_parts(text, parts):
    ref = images.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == parts
    assert str(ref) == text


@pytest.mark.parametrize("text, says", [
    ("myregistry/ray:2.58", "'myregistry' has no dot or port, so a container runtime would read it as a Docker Hub "
                            "namespace (docker.io/myregistry/ray:2.58)"),
    ("ray:2.58.0", "names no registry"),
    ("public.ecr.aws/ray", "neither a tag nor a digest"),
    ("public.ecr.aws/ray@sha256:abc", "is not sha256:<64 lowercase hex>"),
    ("public.ecr.aws/Deep/ray:1", "is not a valid repository name"),
    ("public.ecr.aws/a--/ray:1", "is not a valid repository name"),
    ("public.ecr.aws/ray:-x", "is not a valid tag"),
])
def test_bad_references_say_which_part_and_how_to_write_it(text, says):
    with pytest.raises(images.ImageError) as err:
        images.parse(text)
    assert says in str(err.value) and images.FORMS in str(err.value)


def test_pods_may_imply_the_registry_but_this_project_never_writes_one_that_way():
    assert images.is_pinned(f"busybox@{DIGEST}")  # a pod spec: the runtime implies docker.io
    assert images.problem(f"busybox@{DIGEST}") is not None  # a stack setting: refused
    assert not images.is_pinned("busybox:1.36") and not images.is_pinned(f"busybox@{DIGEST[:-1]}")


def test_a_chart_tag_may_carry_its_digest():
    assert images.split_tag(f"v1.36.1@{DIGEST}") == ("v1.36.1", DIGEST)
    assert images.split_tag("v1.36.1") == ("v1.36.1", None)
    with pytest.raises(images.ImageError, match="sha256:<64 lowercase hex>"):
        images.split_tag("v1.36.1@sha256:abc")


# --- taints and labels -----------------------------------------------------------------------------

def test_one_taint_in_the_three_spellings_its_consumers_read():
    taint = nodes.Taint("nvidia.com/gpu", "true", "NoSchedule")
    assert taint.node_group() == {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
    assert taint.toleration() == {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    assert taint.autoscaler_tag() == ("k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu", "true:NoSchedule")
    assert nodes.Taint("dedicated", "data", "NO_EXECUTE") == nodes.Taint("dedicated", "data", "NoExecute")
    with pytest.raises(ValueError, match="not one of NoSchedule, PreferNoSchedule, NoExecute"):
        nodes.Taint("a", "b", "Never")


@pytest.mark.parametrize("key, value, ok", [
    ("role", "gpu-worker", True), ("nvidia.com/gpu.present", "true", True), ("role", "", True),
    ("role", "x" * 64, False), ("-role", "x", False), ("bad key", "x", False), ("role", "a b", False),
])
def test_node_labels_follow_kubernetes_rules(key, value, ok):
    assert (nodes.label_problem(key, value) is None) is ok


# --- what a node offers -------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted({*catalog.GPU_TYPES, *catalog.CPU_TYPES}))
def test_extended_resources_follow_the_catalog(name):
    row = catalog.instance_type(name)
    offered = resources.extended(row)
    assert offered.get(resources.GPU) == (str(row.gpus) if row.gpus else None)
    assert offered.get(resources.EFA) == (str(row.efa_interfaces) if row.efa_interfaces else None)
    assert offered.get(resources.HUGEPAGES_2MI) == row.hugepages_2mi


def test_gpu_families_and_quota_families():
    assert catalog.is_gpu_type("g4dn.xlarge") and catalog.is_gpu_type("p5.48xlarge") and catalog.is_gpu_type("g5g.2xlarge")
    assert not catalog.is_gpu_type("m7i.xlarge")
    assert [catalog.quota_family(t) for t in ("p5.48xlarge", "g6.12xlarge", "m7i.xlarge")] == ["P", "G", "standard"]


# --- standard library only (tests/test_layout.py reads the imports) ---------------------------------

def test_it_runs_on_a_bare_interpreter():
    """As in a policy pack's or a job's environment: no site-packages at all."""
    code = "import facts.catalog, facts.images, facts.nodes, facts.ray, facts.outputs, facts.errors, facts.resources"
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": sysconfig.get_path("scripts") or "/usr/bin"})
    assert proc.returncode == 0, proc.stderr
