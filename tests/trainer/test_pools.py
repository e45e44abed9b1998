"""`--pool`: the node pool a job's workers run on, from the stack's outputs to Ray Train's placement.

With two GPU pools a job's workers could land on either pool, or across both: `submit --stack`
refuses to guess, sizes the job from the pool it is given and pins the workers there through
Ray Train's ScalingConfig.label_selector, which each pool's worker group answers with its Ray
label (tests/test_pools.py follows the real program's outputs and RayCluster through the same path).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from facts import ray as ray_facts
from trainer.config.flags import ConfigError, TrainConfig
from trainer.config.load import from_args
from trainer.jobs import launch
from trainer.submit.cli import check_capacity_of_pool
from trainer.submit.target import SubmitError, choose_pool, gpu_pools, stack_defaults

from .conftest import LOCAL_POOL

REPO = Path(__file__).resolve().parents[2]
BASE = {"model": "Qwen/Qwen2.5-1.5B", "dataset": "s3://ckpt/data/train.jsonl", "config": None}


def pool(instance_type: str, nodes: int, gpus: int, name: str, *, workers: bool = True) -> dict:
    """One entry of the nodePools output, as deploy.program.pool_outputs writes it."""
    return {"instanceType": instance_type, "minSize": nodes, "maxSize": nodes, "gpusPerNode": gpus,
            "scaleToZero": False, "rayWorkerGroup": f"{name}-workers" if workers else None,
            "rayLabels": ray_facts.pool_labels(name) if workers else {}}


TWO_GPU_POOLS = {"checkpointBucketUri": "s3://ckpt/runs", "gpuNodeType": "g6.12xlarge", "gpuNodeCount": 2,
                 "nodePools": {"system": pool("m7i.xlarge", 1, 0, "system", workers=False),
                               "gpu": pool("g6.12xlarge", 2, 4, "gpu"),
                               "l40s": {**pool("g6e.12xlarge", 4, 4, "l40s"), "minSize": 0, "scaleToZero": True},
                               "data": pool("m7i.4xlarge", 2, 0, "data")}}
ONE_GPU_POOL = {**TWO_GPU_POOLS, "nodePools": {k: v for k, v in TWO_GPU_POOLS["nodePools"].items() if k != "l40s"}}


def job_config(outputs: dict, pool_name: str | None = None, **flags) -> TrainConfig:
    """What `submit --stack [--pool NAME] [flags]` trains with (cli.main: the pool, then the defaults, then flags)."""
    named = {"pool": pool_name} if pool_name else {}
    return from_args(argparse.Namespace(**BASE, **named, **flags), stack_defaults(outputs, choose_pool(outputs, pool_name)))


def test_a_stack_with_two_gpu_pools_refuses_to_guess_and_names_them():
    with pytest.raises(SubmitError, match=r"--pool: the stack has 2 GPU node pools \(gpu, l40s\).*e\.g\. --pool gpu"):
        choose_pool(TWO_GPU_POOLS, None)
    with pytest.raises(SubmitError, match=r"--pool a100: the stack has no GPU node pool of that name.*gpu, l40s"):
        choose_pool(TWO_GPU_POOLS, "a100")
    with pytest.raises(SubmitError, match="--pool data: .*use one of: gpu, l40s"):  # a CPU pool trains no GPU job
        choose_pool(TWO_GPU_POOLS, "data")


def test_the_named_pool_sizes_the_job_and_pins_ray_trains_workers_to_it():
    from ray.train import ScalingConfig

    cfg = job_config(TWO_GPU_POOLS, "l40s")
    assert (cfg.device, cfg.num_workers, cfg.instance_type, cfg.pool) == ("gpu", 16, "g6e.12xlarge", "l40s")
    assert cfg.storage_path == "s3://ckpt/runs"
    scaling = launch.scaling_config(cfg)
    assert type(scaling) is ScalingConfig  # Ray Train's own (v2), as TorchTrainer gets it
    assert (scaling.num_workers, scaling.use_gpu) == (16, True)
    assert scaling.label_selector == {ray_facts.POOL_LABEL: "l40s"} == TWO_GPU_POOLS["nodePools"]["l40s"]["rayLabels"]
    assert scaling._label_selector_per_worker(16) == [{ray_facts.POOL_LABEL: "l40s"}] * 16  # what the controller asks
    # The selector travels in the job's configuration (job.yaml) and comes back the same on the cluster.
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))).pool == "l40s"
    gpu = job_config(TWO_GPU_POOLS, "gpu", num_workers=4)
    assert (gpu.num_workers, gpu.instance_type, launch.scaling_config(gpu).label_selector) == (
        4, "g6.12xlarge", {ray_facts.POOL_LABEL: "gpu"})


def test_build_trainer_hands_the_selector_to_torch_trainer(tmp_path):
    trainer = launch.build_trainer(dataclasses.replace(job_config(TWO_GPU_POOLS, "gpu"), storage_path=str(tmp_path)))
    assert trainer.scaling_config.label_selector == {ray_facts.POOL_LABEL: "gpu"}


def test_a_stack_with_one_gpu_pool_needs_no_flag():
    """Sized from its only GPU pool, where a GPU worker lands anyway: pinned only when named (a stack upgraded in
    place keeps worker pods without the label until they are recreated, see docs/configuration.md, Node pools)."""
    cfg = job_config(ONE_GPU_POOL)
    assert (cfg.num_workers, cfg.instance_type, cfg.pool) == (8, "g6.12xlarge", None)  # 2 nodes x 4 L4
    assert launch.scaling_config(cfg).label_selector is None
    named = job_config(ONE_GPU_POOL, "gpu")
    assert named == dataclasses.replace(cfg, pool="gpu")
    assert launch.scaling_config(named).label_selector == {ray_facts.POOL_LABEL: "gpu"}


def test_a_stack_from_before_pool_labels_is_sized_but_not_pinned():
    """Outputs of an older deploy: no labels on the worker groups, so a selector would never be satisfied."""
    legacy = {"checkpointBucketUri": "s3://ckpt/runs", "gpuNodeType": "g6.12xlarge", "gpuNodeCount": 2}
    cfg = job_config(legacy)
    assert (cfg.device, cfg.num_workers, cfg.pool) == ("gpu", 8, None)
    assert launch.scaling_config(cfg).label_selector is None
    unlabelled = {**ONE_GPU_POOL, "nodePools": {"gpu": {**ONE_GPU_POOL["nodePools"]["gpu"], "rayLabels": {}}}}
    assert job_config(unlabelled).pool is None
    with pytest.raises(SubmitError, match="--pool gpu: the stack's Ray worker groups carry no pool labels.*pulumi up"):
        choose_pool(legacy, "gpu")


def test_a_run_without_a_pool_sets_no_selector():
    from trainer.jobs import local

    assert launch.scaling_config(TrainConfig(model="m", dataset="d")).label_selector is None
    assert stack_defaults({}, choose_pool({}, None)) is None  # --address: nothing from a stack
    assert choose_pool({}, "gpu") is None  # --address --pool: the cluster's labels decide, nothing to check here
    assert local.demo_config(["--workers", "2"], Path("unused")).pool is None


def test_more_workers_than_the_pool_holds_are_refused_naming_the_pool():
    from trainer.jobs.cluster import ClusterError

    cfg = job_config(TWO_GPU_POOLS, "gpu", num_workers=16)
    with pytest.raises(ClusterError, match=r"asks for 16 GPUs; node pool gpu has 8 at most \(2 x g6.12xlarge\)"):
        check_capacity_of_pool(cfg, choose_pool(TWO_GPU_POOLS, "gpu"))
    check_capacity_of_pool(job_config(TWO_GPU_POOLS, "l40s", num_workers=16), choose_pool(TWO_GPU_POOLS, "l40s"))


def test_a_pool_name_that_is_no_label_value_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"--pool \(pool\) = 'in\(gpu\)': not a node pool name"):
        from_args(argparse.Namespace(**BASE, pool="in(gpu)"))


def test_gpu_pools_are_those_with_gpus_and_ray_workers():
    assert [(p.name, p.gpus, p.labelled) for p in gpu_pools(TWO_GPU_POOLS)] == [("gpu", 8, True), ("l40s", 16, True)]


FAKE_PULUMI = '''\
#!{python}
import os
print(open(os.environ["FAKE_PULUMI_OUTPUTS"]).read())
'''


@pytest.mark.parametrize("extra, says", [
    ([], "error: --pool: the stack has 2 GPU node pools (gpu, l40s)"),
    (["--pool", "a100"], "error: --pool a100: the stack has no GPU node pool of that name (with Ray workers); "
                         "use one of: gpu, l40s"),
])
def test_submit_to_a_two_pool_stack_without_a_known_pool_exits_2_naming_the_pools(tmp_path, extra, says):
    bin_dir, scratch = tmp_path / "bin", tmp_path / "scratch"
    bin_dir.mkdir()
    scratch.mkdir()
    fake = bin_dir / "pulumi"
    fake.write_text(textwrap.dedent(FAKE_PULUMI).format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**TWO_GPU_POOLS, "rayNamespace": "ray", "rayHeadService": "raytrain-head-svc",
                                   "kubeconfig": '{"apiVersion": "v1"}'}))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_PULUMI_OUTPUTS": str(outputs),
           "TMPDIR": str(scratch)}
    proc = subprocess.run([sys.executable, "-m", "trainer", "submit", "--stack", "two", "--model", BASE["model"],
                           "--dataset", BASE["dataset"], *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and list(scratch.iterdir()) == []  # the kubeconfig is gone too


# --- on a real Ray cluster: the session's one node is in pool LOCAL_POOL -------------------------------

def test_ray_train_reserves_pinned_workers_only_on_nodes_of_that_pool(ray_cluster):
    """Ray 2.58 honours the selector: the placement group Ray Train reserves its workers with (worker_group.py)
    is placed on the node labelled LOCAL_POOL, and stays pending for a pool no node belongs to.

    That a run pinned this way then trains is shown by every fault-tolerance run (tests/trainer/
    reference_runs.py selects LOCAL_POOL).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    cfg = TrainConfig(model="m", dataset="d", num_workers=2, pool=LOCAL_POOL)

    def reserve(config: TrainConfig):
        scaling = launch.scaling_config(config)  # as Ray Train's worker group reserves it
        return placement_group([scaling._resources_per_worker_not_none] * config.num_workers,
                               strategy=scaling.placement_strategy,
                               bundle_label_selector=scaling._label_selector_per_worker(config.num_workers))

    here, elsewhere = reserve(cfg), reserve(dataclasses.replace(cfg, pool="gpu"))
    try:
        assert here.wait(60)
        assert not elsewhere.wait(5)
        assert ray.util.placement_group_table(elsewhere)["state"] == "PENDING"
    finally:
        remove_placement_group(here)
        remove_placement_group(elsewhere)


def test_a_pool_no_node_of_a_fixed_cluster_is_in_fails_at_once_instead_of_waiting(ray_cluster):
    """`train --pool` on a cluster that cannot grow: the pool's nodes are counted, and a pool without nodes named."""
    from trainer.jobs.cluster import ClusterError, check_capacity, pool_resources

    check_capacity(2, False, LOCAL_POOL)
    with pytest.raises(ClusterError, match=r"--pool gpu: no node of this Ray cluster is in that pool \(Ray label "
                                           r"raytrain.io/pool=gpu\) and it cannot grow"):
        check_capacity(2, False, "gpu")
    with pytest.raises(ClusterError, match=r"asks for 100 CPU .*; pool local of the Ray cluster has 8 CPU"):
        check_capacity(100, False, LOCAL_POOL)
    nodes = [{"Alive": True, "Labels": {ray_facts.POOL_LABEL: "gpu"}, "Resources": {"CPU": 40.0, "GPU": 4.0}},
             {"Alive": True, "Labels": {ray_facts.POOL_LABEL: "gpu"}, "Resources": {"CPU": 40.0, "GPU": 4.0}},
             {"Alive": False, "Labels": {ray_facts.POOL_LABEL: "gpu"}, "Resources": {"GPU": 4.0}},
             {"Alive": True, "Labels": {ray_facts.POOL_LABEL: "l40s"}, "Resources": {"GPU": 4.0}}]
    assert pool_resources(nodes, "gpu") == {"CPU": 80.0, "GPU": 8.0} and pool_resources(nodes, "a100") is None
