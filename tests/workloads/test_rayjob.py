"""`trainer submit --stack NAME --rayjob --dry-run`: the RayJob, against KubeRay v1.7.0's CRD and operator rules.

The dry run reads the stack offline (`python -m deploy.stack_outputs`, the program under mocks); its
rayClusterSpec must be the stack's own RayCluster spec (one builder, workloads.raycluster.spec). The
operator's rules are ValidateRayJobMetadata and ValidateRayJobSpec of
ray-operator/controllers/ray/utils/validation.go at tag v1.7.0, transcribed below rule by rule (those a
manifest of this project can meet); each is shown to refuse a manifest that breaks it, and the flags that
would make such a manifest are refused by `submit` first, with the flag named.
"""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from facts import outputs as names
from tests import upstream
from tests.conftest import no_unknown_fields
from tests.guards import nonempty
from trainer.submit import rayjob

REPO = Path(__file__).resolve().parents[2]
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
FLAGS = ["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset", "s3://data-bucket/chat.jsonl", "--run-name", "sft-1",
         "--max-hours", "2", "--max-wait", "30", "--retries", "2", "--steps", "100"]


@pytest.fixture(scope="module")
def rayjob_schema() -> jsonschema.Validator:
    crd = yaml.load(upstream.path("ray.io_rayjobs.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(no_unknown_fields(v1["schema"]["openAPIV3Schema"]))


@pytest.fixture(scope="module")
def dry_run():
    proc = subprocess.run([sys.executable, "-m", "trainer", "submit", "--stack", "dev", "--rayjob", "--dry-run", *FLAGS],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return yaml.safe_load(proc.stdout), proc.stderr


# --- KubeRay v1.7.0, utils/validation.go ------------------------------------------------------------------

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # k8s.io/apimachinery IsDNS1035Label


def _yaml_problem(text: str) -> bool:
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        return True
    return False


def _selector_mode(spec: dict) -> bool:
    return bool(spec.get("clusterSelector"))


# (broken when, the operator's message), in validation.go's order; `m` is metadata, `s` the spec.
RULES = [
    (lambda m, s: len(m["name"]) > 47,  # MaxRayJobNameLength = MaxRayClusterNameLength (53) - 6
     "RayJob name should be no more than 47 characters"),
    (lambda m, s: not DNS1035.match(m["name"]) or len(m["name"]) > 63, "RayJob name should be a valid DNS1035 label"),
    (lambda m, s: s.get("suspend") and not s.get("shutdownAfterJobFinishes"),
     "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"),
    (lambda m, s: s.get("ttlSecondsAfterFinished", 0) < 0, "TTLSecondsAfterFinished must be a non-negative integer"),
    (lambda m, s: not s.get("shutdownAfterJobFinishes") and s.get("ttlSecondsAfterFinished", 0) > 0,
     "a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished"),
    (lambda m, s: s.get("rayClusterSpec") is None and not _selector_mode(s),
     "one of RayClusterSpec or ClusterSelector must be set"),
    (lambda m, s: _selector_mode(s) and not s["clusterSelector"].get("ray.io/cluster"),
     "cluster name in ClusterSelector should not be empty"),
    (lambda m, s: _selector_mode(s) and s.get("submissionMode") == "SidecarMode",
     "ClusterSelector is not supported in SidecarMode"),
    (lambda m, s: _selector_mode(s) and (s.get("backoffLimit") or 0) > 0,
     "BackoffLimit is incompatible with ClusterSelector mode"),
    (lambda m, s: s.get("submissionMode") == "InteractiveMode" and (s.get("backoffLimit") or 0) > 0,
     "BackoffLimit is incompatible with InteractiveMode"),
    (lambda m, s: ((s.get("rayClusterSpec") or {}).get("authOptions") or {}).get("enableK8sTokenAuth"),
     "K8s token auth mode is currently not supported for RayJob"),
    (lambda m, s: _yaml_problem(s.get("runtimeEnvYAML", "")), "runtimeEnvYAML is not valid YAML"),
    (lambda m, s: s.get("activeDeadlineSeconds", 1) <= 0, "activeDeadlineSeconds must be a positive integer"),
    (lambda m, s: s.get("preRunningDeadlineSeconds", 1) <= 0, "preRunningDeadlineSeconds must be a positive integer"),
    (lambda m, s: s.get("backoffLimit", 0) < 0, "backoffLimit must be a positive integer"),
]


def operator_problems(job: dict) -> list[str]:
    """ValidateRayJobMetadata + ValidateRayJobSpec (v1.7.0) on what this project's RayJobs can contain."""
    return [message for broken, message in RULES if broken(job["metadata"], job["spec"])]


# --- the manifest ---------------------------------------------------------------------------------------

def test_the_dry_run_prints_a_rayjob_the_crd_and_the_operator_accept_with_the_caps_from_the_flags(
        dry_run, rayjob_schema, dev_run):
    job, stderr = dry_run
    assert sorted(rayjob_schema.iter_errors(job), key=str) == []
    assert operator_problems(job) == []
    spec = job["spec"]
    assert (job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == ("RayJob", "sft-1", "ray")
    assert spec["activeDeadlineSeconds"] == 2 * 3600 and spec["preRunningDeadlineSeconds"] == 30 * 60
    assert spec["backoffLimit"] == 2 and spec["submissionMode"] == "HTTPMode"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == rayjob.DEFAULT_TTL_S
    assert spec["entrypointNumCpus"] == 1  # the head advertises no CPUs: the driver runs on a worker's node
    # its own cluster: exactly the stack's RayCluster spec (one builder), as the stack exports it
    (stack_cluster,) = dev_run.of_type(RAYCLUSTER)
    assert spec["rayClusterSpec"] == json.loads(json.dumps(stack_cluster.inputs["spec"]))
    assert spec["rayClusterSpec"] == dev_run.outputs[names.RAY_JOB_CLUSTER_SPEC]
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    bucket = dev_run.outputs[names.CHECKPOINT_BUCKET_URI]
    assert re.fullmatch(re.escape(f"{bucket}/_packages/") + "[0-9a-f]{64}\\.zip", env["working_dir"]), env
    assert env["working_dir"] in stderr and "nothing created" in stderr
    assert env["env_vars"]["NCCL_DEBUG"] == "INFO"  # a GPU job: the EFA proof's settings travel with it
    assert "-m trainer train --config job.yaml" in spec["entrypoint"]


def test_on_the_stacks_raycluster_the_rayjob_selects_it_and_neither_retries_nor_deletes(rayjob_schema, dev_run):
    job = rayjob.manifest(name="on-stack", namespace="ray", entrypoint="python -c pass",
                          runtime_env={"working_dir": "s3://b/_packages/x.zip"},
                          caps=rayjob.Caps(max_hours=1.5), cluster=dev_run.outputs[names.RAY_CLUSTER_NAME])
    assert sorted(rayjob_schema.iter_errors(job), key=str) == [] and operator_problems(job) == []
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "raytrain"}
    assert {"backoffLimit", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "rayClusterSpec"}.isdisjoint(job["spec"])
    assert job["spec"]["activeDeadlineSeconds"] == 5400
    assert "retries a RayJob only with a cluster of its own" in rayjob.Caps(retries=1).problems(rayjob.STACK)[0]


BREAKS = [  # (what breaks the rule in a good manifest, the operator's message)
    (lambda j: j["metadata"].update(name="a" * 48), "no more than 47 characters"),
    (lambda j: j["metadata"].update(name="My_Run"), "valid DNS1035 label"),
    (lambda j: j["spec"].update(ttlSecondsAfterFinished=-1), "non-negative"),
    (lambda j: j["spec"].update(shutdownAfterJobFinishes=False), "cannot have TTLSecondsAfterFinished"),
    (lambda j: j["spec"].update(suspend=True, shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=0),
     "not allowed to be suspended"),
    (lambda j: j["spec"].pop("rayClusterSpec"), "one of RayClusterSpec or ClusterSelector"),
    (lambda j: j["spec"].update(clusterSelector={"ray.io/cluster": "raytrain"}), "incompatible with ClusterSelector"),
    (lambda j: j["spec"].update(clusterSelector={"ray.io/cluster": ""}, backoffLimit=0), "should not be empty"),
    (lambda j: j["spec"].update(submissionMode="InteractiveMode"), "incompatible with InteractiveMode"),
    (lambda j: j["spec"]["rayClusterSpec"]["authOptions"].update(enableK8sTokenAuth=True), "K8s token auth"),
    (lambda j: j["spec"].update(runtimeEnvYAML="a: [b"), "not valid YAML"),
    (lambda j: j["spec"].update(activeDeadlineSeconds=0), "activeDeadlineSeconds must be a positive"),
    (lambda j: j["spec"].update(preRunningDeadlineSeconds=-5), "preRunningDeadlineSeconds must be a positive"),
    (lambda j: j["spec"].update(backoffLimit=-1), "backoffLimit must be a positive"),
]


def test_each_operator_rule_refuses_a_manifest_that_breaks_it(dry_run):
    good, _ = dry_run
    for breaking, message in nonempty(BREAKS, "rules"):
        job = copy.deepcopy(good)
        breaking(job)
        assert any(message in p for p in operator_problems(job)), (message, operator_problems(job))


@pytest.mark.parametrize("argv, error", [
    (["--run-name", "My_Run"], "--run-name My_Run: a RayJob is named after its run"),
    (["--run-name", "a" * 48], "at most 47 lowercase letters"),
    (["--max-hours", "0"], "--max-hours 0: must be positive"),
    (["--max-wait", "-1"], "--max-wait -1: must be positive"),
    (["--retries", "-1"], "--retries -1: must be 0 or more"),
    (["--ttl", "-1"], "--ttl -1: must be 0 or more"),
    (["--rayjob", "stack", "--retries", "1"], "--retries 1: KubeRay retries a RayJob only with a cluster of its own"),
])
def test_flags_that_would_break_an_operator_rule_are_refused_naming_the_flag(argv, error, capsys):
    """Refused before the stack is read (a stack of that name need not exist) and before anything is created."""
    from trainer.__main__ import main as trainer

    code = trainer(["submit", "--stack", "no-such-stack", "--rayjob", "--dry-run", *FLAGS[:4], *argv])
    err = capsys.readouterr().err
    assert code == 2 and error in err and "Traceback" not in err, err[-2000:]
    assert err.strip().startswith("error:")


def test_rayjob_mode_needs_a_stack_and_a_dry_run_needs_rayjob(capsys):
    from trainer.__main__ import main as trainer

    assert trainer(["submit", "--address", "http://127.0.0.1:1", "--rayjob", *FLAGS[:4]]) == 2
    assert "pass --stack NAME (not --address)" in capsys.readouterr().err
    assert trainer(["submit", "--stack", "dev", "--dry-run", *FLAGS[:4]]) == 2
    assert "--dry-run prints a RayJob: add --rayjob" in capsys.readouterr().err
