"""The offline plan command and the Pulumi program's own environment."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy import plan
from tests.stacks import read_stack_file

REPO = Path(__file__).resolve().parents[2]


def test_plan_command_prints_resources_cost_and_writes_files(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "deploy.plan", "--stack", "dev", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "placeholders" in proc.stdout and "pulumi preview" in proc.stdout
    assert "aws:eks.NodeGroup" in proc.stdout and "gpu-ng" in proc.stdout
    assert "total" in proc.stdout and "$    9.60" in proc.stdout
    data = json.loads((tmp_path / "resources.json").read_text())
    types = {r["type"] for r in data["resources"]}
    assert {"aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup", "aws:ec2/launchTemplate:LaunchTemplate"} <= types
    assert data["outputs"]["kubeconfig"] == "[secret]"
    assert "placeholders" in data["notice"]


def test_invalid_stack_exits_2_with_only_the_errors(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": {
        "aws:region": "us-east-1", "raytrain-eks:gpuNodeCount": 0, "raytrain-eks:gpuNodeTyp": "x"}}))
    monkeypatch.setattr(plan, "REPO_ROOT", tmp_path)
    assert plan.main(["--stack", "bad", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "raytrain-eks:gpuNodeCount" in captured.err and "did you mean raytrain-eks:gpuNodeType" in captured.err
    assert "raytrain-eks:apiAccessCidrs" in captured.err
    assert not (tmp_path / "out").exists()


def test_an_image_without_a_registry_host_is_a_config_error_not_a_traceback(tmp_path):
    """`myregistry/ray:2.58` passed the configuration and then failed in the image pin with a traceback."""
    stack = tmp_path / "Pulumi.img.yaml"
    stack.write_text(yaml.safe_dump({"config": {"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"],
                                                "raytrain-eks:dlcImage": "myregistry/ray:2.58"}}))
    code = ("import pathlib, sys; from deploy import plan; "
            f"plan.REPO_ROOT = pathlib.Path({str(tmp_path)!r}); sys.exit(plan.main(['--stack', 'img']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.startswith("error: invalid stack configuration (1 problem(s)):")
    assert "raytrain-eks:dlcImage: 'myregistry/ray:2.58' does not start with a registry host" in proc.stderr
    assert "(Pulumi.img.yaml line " in proc.stderr  # the line of the key


def test_unknown_stack_names_the_known_ones(capsys):
    assert plan.main(["--stack", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Pulumi.nope.yaml not found" in err and "dev" in err


def test_secure_values_are_not_read_as_plain_text(tmp_path):
    (tmp_path / "Pulumi.s.yaml").write_text(yaml.safe_dump({"config": {"raytrain-eks:x": {"secure": "AAAA"}}}))
    assert read_stack_file("s", tmp_path) == {"raytrain-eks:x": "[secret]"}


def test_pulumi_program_does_not_need_torch():
    code = ("import sys, deploy.program, deploy.plan, deploy.offline; "
            "from deploy import offline; offline.run({'aws:region': 'us-east-1', "
            "'raytrain-eks:apiAccessCidrs': ['203.0.113.10/32']}); "
            "bad = [m for m in ('torch', 'ray', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    requirements = [line for line in (REPO / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert not [line for line in requirements if line.startswith(("torch", "ray", "transformers"))]


def _plan(tmp_path, monkeypatch, capsys, **config) -> str:
    (tmp_path / "Pulumi.c.yaml").write_text(yaml.safe_dump({"config": {
        "aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"],
        **{f"raytrain-eks:{k}": v for k, v in config.items()}}}))
    monkeypatch.setattr(plan, "REPO_ROOT", tmp_path)
    assert plan.main(["--stack", "c"]) == 0
    return capsys.readouterr().out


def test_a_costly_plan_warns_with_the_daily_cost_and_the_quota(tmp_path, monkeypatch, capsys):
    out = _plan(tmp_path, monkeypatch, capsys, gpuNodeType="p5.48xlarge", gpuNodeCount=64)
    assert "this stack costs about $84,584 per day ($3,524.32/hour)" in out
    assert 'It needs 12288 vCPUs of "Running On-Demand P instances" (L-417A185B)' in out
    quiet = _plan(tmp_path, monkeypatch, capsys, gpuNodeType="p5.48xlarge", gpuNodeCount=64, costWarningPerDay=100000)
    assert "this stack costs about" not in quiet


def test_a_spot_estimate_says_what_it_is(tmp_path, monkeypatch, capsys):
    out = _plan(tmp_path, monkeypatch, capsys, capacityType="SPOT", placementGroup=False)
    assert "GPU nodes: SPOT priced at the On-Demand list price, an upper bound" in out
    assert "cost estimate: SPOT priced at the On-Demand list price" in out


def test_p5e_price_is_marked_as_an_estimate(tmp_path, monkeypatch, capsys):
    out = _plan(tmp_path, monkeypatch, capsys, gpuNodeType="p5e.48xlarge")
    assert "estimate: AWS publishes no us-east-1 On-Demand price for p5e.48xlarge" in out


def test_usage_based_charges_are_named_not_hidden(tmp_path, monkeypatch, capsys):
    out = _plan(tmp_path, monkeypatch, capsys)
    assert "gpuRootVolumes" in out and "natPublicIpv4" in out
    assert "Not included, billed by use: NAT gateway data processing $0.045/GB" in out
    assert "control-plane logs $0.50/GB ingested" in out


def test_a_reservation_plans_offline_as_if_it_matched(tmp_path, monkeypatch, capsys):
    out = _plan(tmp_path, monkeypatch, capsys, capacityReservationId="cr-0123456789abcdef0",
                availabilityZone="us-east-1c")
    assert ("offline: capacity reservation cr-0123456789abcdef0 is assumed to hold 2 x g6.12xlarge in "
            "us-east-1c; `pulumi preview` reads the real one") in out


@pytest.mark.parametrize("config, says", [
    ({"raytrain-eks:nodePools": {"gpu": {"instanceType": "g6.12xlarge"}}}, "raytrain-eks:nodePools: no pool named system"),
    ({"raytrain-eks:nodePools": "not a map"}, "raytrain-eks:nodePools: 'not a map' is not a dict"),
    ({"raytrain-eks:dlcImage": "ray"}, "raytrain-eks:dlcImage: 'ray' names no registry"),
    ({"raytrain-eks:gpuNodeCount": [1, 2]}, "raytrain-eks:gpuNodeCount: [1, 2] is not a whole number"),
])
def test_user_input_never_ends_in_a_traceback(tmp_path, config, says):
    """The plan as a user runs it: exit 2, `error: ...` naming the key, nothing on stdout, no traceback."""
    (tmp_path / "Pulumi.x.yaml").write_text(yaml.safe_dump({"config": {
        "aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"], **config}}))
    code = ("import pathlib, sys; from deploy import plan; "
            f"plan.REPO_ROOT = pathlib.Path({str(tmp_path)!r}); sys.exit(plan.main(['--stack', 'x']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr and says in proc.stderr


def test_an_out_that_is_a_file_is_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert plan.main(["--stack", "dev", "--out", str(tmp_path / "taken")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--out" in captured.err and "a file, not a folder" in captured.err


# --- the idle-cost hint speaks the stack file's own keys ------------------------------------------------

def _idle_hints(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if "bill while idle too" in line]


def _pools_with(**changes) -> dict:
    """The node-pools stack of docs/configuration.md (tests/examples.py), with some pools' settings replaced."""
    from tests.examples import documented_stack

    pools = documented_stack("pools")["raytrain-eks:nodePools"]
    return {name: changes.get(name, settings) for name, settings in pools.items()}


def test_the_idle_hint_of_a_node_pools_stack_names_the_pools_own_keys(tmp_path, monkeypatch, capsys):
    """The documented stack: l40s scales to zero, gpu keeps its 2 nodes. The hint names gpu's keys, not the shorthand
    (refused with nodePools), and following it gives a stack that plans without a hint."""
    out = _plan(tmp_path, monkeypatch, capsys, nodePools=_pools_with())
    assert _idle_hints(out) == [
        "The GPU nodes of pool gpu bill while idle too: set raytrain-eks:nodePools.gpu.scaleToZero to true and "
        "raytrain-eks:nodePools.gpu.maxSize to 2 in place of raytrain-eks:nodePools.gpu.desiredSize, or "
        "`pulumi destroy`."]
    assert "raytrain-eks:scaleToZero" not in out
    followed = _plan(tmp_path, monkeypatch, capsys, nodePools=_pools_with(
        gpu={"instanceType": "g6.12xlarge", "scaleToZero": True, "maxSize": 2}))
    assert _idle_hints(followed) == []


def test_a_node_pools_stack_without_a_scaled_pool_gets_one_fix_per_gpu_pool(tmp_path, monkeypatch, capsys):
    out = _plan(tmp_path, monkeypatch, capsys, nodePools=_pools_with(
        l40s={"instanceType": "g6e.12xlarge", "desiredSize": 1}))
    assert _idle_hints(out) == [
        "The GPU nodes bill while idle too: set raytrain-eks:nodePools.gpu.scaleToZero to true and "
        "raytrain-eks:nodePools.gpu.maxSize to 2 in place of raytrain-eks:nodePools.gpu.desiredSize; set "
        "raytrain-eks:nodePools.l40s.scaleToZero to true and raytrain-eks:nodePools.l40s.maxSize to 1 in place of "
        "raytrain-eks:nodePools.l40s.desiredSize, or `pulumi destroy`."]
    assert "raytrain-eks:scaleToZero" not in out


def test_the_shorthand_hint_and_a_reservations_hint(tmp_path, monkeypatch, capsys):
    assert _idle_hints(_plan(tmp_path, monkeypatch, capsys)) == [
        "The GPU nodes bill while idle too: set raytrain-eks:scaleToZero to true (raytrain-eks:gpuNodeCount becomes "
        "the maximum), or `pulumi destroy`."]
    assert _idle_hints(_plan(tmp_path, monkeypatch, capsys, scaleToZero=True)) == []
    # scaleToZero is refused with a reservation (it bills anyway): the hint does not send the user there.
    reserved = _plan(tmp_path, monkeypatch, capsys, capacityReservationId="cr-0123456789abcdef0",
                     availabilityZone="us-east-1c")
    assert _idle_hints(reserved) == [
        "The GPU nodes bill while idle too (the capacity reservation of gpu bills whether its instances run or not): "
        "`pulumi destroy` stops that."]


def test_a_scale_to_zero_setting_without_a_scaled_pool_names_the_key_the_stack_file_takes():
    from deploy.config import ConfigError, load

    base = {"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"],
            "raytrain-eks:gpuIdleTimeoutMinutes": 5}
    with pytest.raises(ConfigError) as info:
        load({**base, "raytrain-eks:nodePools": _pools_with(l40s={"instanceType": "g6e.12xlarge"})}, stack="c")
    assert info.value.problems == [
        "raytrain-eks:gpuIdleTimeoutMinutes: has no effect unless a pool of raytrain-eks:nodePools scales to zero "
        "(its scaleToZero: true, with maxSize); set that or remove gpuIdleTimeoutMinutes"]
    assert load({**base, "raytrain-eks:nodePools": _pools_with()}, stack="c").gpu_idle_timeout_minutes == 5
    with pytest.raises(ConfigError, match=r"unless raytrain-eks:scaleToZero is true; set that or remove"):
        load(base, stack="c")
    assert load({**base, "raytrain-eks:scaleToZero": True}, stack="c").scale_to_zero


def test_the_plan_refuses_a_stack_whose_requests_aws_would_refuse(tmp_path, monkeypatch, capsys):
    """The conformance checker (deploy.aws_requests, botocore's models) runs on the user's own stack too."""
    from deploy import aws_requests

    (tmp_path / "Pulumi.mine.yaml").write_text(yaml.safe_dump({"config": {
        "aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"]}}))
    monkeypatch.setattr(plan, "REPO_ROOT", tmp_path)
    assert plan.main(["--stack", "mine"]) == 0
    capsys.readouterr()
    original = aws_requests.MAPPINGS["aws:eks/cluster:Cluster"]

    def too_long_name(inputs, name, tags):  # what a checker-visible mistake looks like: a name over EKS's limit
        return original({**inputs, "name": "c" * 101}, name, tags)

    monkeypatch.setitem(aws_requests.MAPPINGS, "aws:eks/cluster:Cluster", too_long_name)
    assert plan.main(["--stack", "mine"]) == 2
    err = capsys.readouterr().err
    assert "AWS would refuse these requests" in err and "aws:eks/cluster:Cluster cluster-eks: eks CreateCluster" in err
