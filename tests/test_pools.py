"""A job lands on the node pool it names, followed through the real parts: the README's node-pools stack planned
offline, its `nodePools` output read by `trainer submit --stack`, the ScalingConfig the job builds, and the
RayCluster whose worker groups must answer that ScalingConfig's label selector, as KubeRay v1.7.0's CRD and
Ray 2.58's autoscaler read them. tests/trainer/test_pools.py shows Ray placing workers by the label."""
from __future__ import annotations

import argparse

import pytest

from deploy import offline
from facts import ray as ray_facts
from tests.examples import documented_stack
from trainer.config.load import from_args
from trainer.jobs import launch
from trainer.submit.target import SubmitError, choose_pool, stack_defaults

RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
FLAGS = {"model": "Qwen/Qwen2.5-1.5B", "dataset": "s3://ckpt/data/train.jsonl", "config": None}


@pytest.fixture(scope="module")
def pools_run() -> offline.PlanResult:
    return offline.run(documented_stack("pools"), stack="pools")


def submitted(outputs: dict, pool: str | None):
    """The ScalingConfig of the job `trainer submit --stack pools [--pool POOL]` sends."""
    named = {"pool": pool} if pool else {}
    cfg = from_args(argparse.Namespace(**FLAGS, **named), stack_defaults(outputs, choose_pool(outputs, pool)))
    return cfg, launch.scaling_config(cfg)


def test_every_worker_group_advertises_its_pool_where_kuberay_and_ray_read_it(pools_run, strict_raycluster_schema):
    manifest = offline.plain(pools_run.one(RAYCLUSTER).inputs)
    strict_raycluster_schema.validate(manifest)  # KubeRay v1.7.0's CRD has workerGroupSpecs[].labels
    groups = {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}
    assert {name: g["labels"] for name, g in groups.items()} == {
        f"{pool}-workers": {ray_facts.POOL_LABEL: pool} for pool in ("gpu", "l40s", "data")}
    # KubeRay v1.7.0 refuses labels in rayStartParams (validateRayGroupLabels); the head needs none.
    assert not any("labels" in g["rayStartParams"] for g in groups.values())
    assert "labels" not in manifest["spec"]["headGroupSpec"]
    outputs = pools_run.outputs["nodePools"]
    assert {name: p["rayLabels"] for name, p in outputs.items()} == {
        "system": {}, "gpu": {ray_facts.POOL_LABEL: "gpu"}, "l40s": {ray_facts.POOL_LABEL: "l40s"},
        "data": {ray_facts.POOL_LABEL: "data"}}


def test_submit_to_the_two_gpu_pool_stack_needs_a_pool_and_lists_them(pools_run):
    with pytest.raises(SubmitError, match=r"the stack has 2 GPU node pools \(gpu, l40s\)"):
        submitted(pools_run.outputs, None)
    with pytest.raises(SubmitError, match="--pool h100: .*use one of: gpu, l40s"):
        submitted(pools_run.outputs, "h100")


@pytest.mark.parametrize("pool, workers, instance_type", [("gpu", 8, "g6.12xlarge"), ("l40s", 8, "g6e.12xlarge")])
def test_the_jobs_selector_matches_exactly_its_pools_worker_group(pools_run, pool, workers, instance_type):
    """As Ray 2.58's autoscaler sees the RayCluster (the scale-to-zero l40s group included), one group answers."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cfg, scaling = submitted(pools_run.outputs, pool)
    assert (cfg.num_workers, cfg.instance_type, cfg.device) == (workers, instance_type, "gpu")
    node_types = _derive_autoscaling_config_from_ray_cr(offline.plain(pools_run.one(RAYCLUSTER).inputs))[
        "available_node_types"]
    matching = [name for name, node in node_types.items()
                if all(node["labels"].get(k) == v for k, v in scaling.label_selector.items())]
    assert matching == [f"{pool}-workers"]
    assert node_types[matching[0]]["resources"]["GPU"] * node_types[matching[0]]["max_workers"] == workers


def test_a_one_gpu_pool_stack_needs_no_flag_and_pins_when_named():
    result = offline.run({"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"]}, stack="dev")
    cfg, scaling = submitted(result.outputs, None)
    assert (cfg.pool, cfg.num_workers, scaling.label_selector) == (None, 8, None)
    cfg, scaling = submitted(result.outputs, "gpu")
    assert (cfg.pool, cfg.num_workers, scaling.label_selector) == ("gpu", 8, {ray_facts.POOL_LABEL: "gpu"})
    (group,) = offline.plain(result.one(RAYCLUSTER).inputs)["spec"]["workerGroupSpecs"]
    assert group["labels"] == scaling.label_selector
