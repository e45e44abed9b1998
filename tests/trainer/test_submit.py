"""`python -m trainer submit|status|logs|stop|nccl-bench` against the session's real Ray cluster.

The cluster runs with RAY_AUTH_MODE=token. What cannot run here, kubectl and the Pulumi
CLI, is replaced by small fake executables on PATH: the fake `kubectl port-forward`
really forwards TCP to the local dashboard, so the port-forward path is exercised end to
end, token discovery from the RayCluster's Secret included.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.trainer.test_s3_storage import BUCKET, KEY, REGION, SECRET, s3  # noqa: F401 - s3: moto's server
from trainer.loop.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["--steps", "4", "--global-batch-size", "8", "--micro-batch-size", "2", "--seq-len", "128",
         "--num-workers", "2", "--device", "cpu", "--log-every", "2", "--no-progress"]


def cli(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def without_token(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}


@pytest.fixture(scope="module")
def job_args(demo_assets, trainer_cache, tmp_path_factory):
    storage = tmp_path_factory.mktemp("submitted-runs")
    return storage, ["--model", str(demo_assets["model"]), "--dataset", str(demo_assets["train"]),
                     "--storage-path", str(storage), "--env", f"TRAINER_CACHE={trainer_cache}", *TRAIN]


SHIPPED_TEMPLATE = "{# shipped with the job #}"


@pytest.fixture(scope="module")
def succeeded(ray_cluster, job_args, tmp_path_factory):
    """No --storage-path: the run goes where the cluster's CHECKPOINT_URI says, as on the RayCluster's head."""
    from trainer import demo

    storage, args = job_args
    at = args.index("--storage-path")
    args = [*args[:at], *args[at + 2:], "--env", f"CHECKPOINT_URI={storage}"]
    template = tmp_path_factory.mktemp("template") / "chat.jinja"  # a local file: it travels with the job
    template.write_text(SHIPPED_TEMPLATE + demo.CHAT_TEMPLATE)
    proc = cli("submit", "--address", ray_cluster.dashboard_url, "--run-name", "submit-ok", *args,
               "--chat-template", str(template), env=ray_cluster.client_env())
    return proc, storage / "submit-ok"


def test_the_job_stores_where_the_raycluster_head_says():
    """The head's env of the real RayCluster manifest is what the job's driver reads its default storage from."""
    from tests.workloads.test_raycluster import CHECKPOINTS, build, env_of, head_of
    from trainer.jobs import launch

    _, _, head = head_of(build())
    assert launch.storage_default(env_of(head)) == {"storage_path": CHECKPOINTS}
    assert launch.storage_default({}) is None


def test_a_job_sent_without_storage_to_a_plain_cluster_stores_in_an_absolute_folder_on_the_head(tmp_path):
    """`submit --address` without storage sets facts.ray.NODE_RUNS_ENV; the job expands it on the head (Ray Train
    refuses relative paths: "URI has empty scheme"); the head's CHECKPOINT_URI still wins over it."""
    from facts import ray as ray_facts
    from trainer.jobs import launch

    on_node = {ray_facts.NODE_RUNS_ENV: ray_facts.NODE_RUNS_DIR, "HOME": str(tmp_path)}
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp_path)  # expanduser reads the process's HOME, as the job's driver does
    try:
        assert launch.storage_default(on_node) == {"storage_path": str(tmp_path / "trainer-runs")}
    finally:
        os.environ["HOME"] = old_home
    assert launch.storage_default({**on_node, "CHECKPOINT_URI": "s3://b/runs"}) == {"storage_path": "s3://b/runs"}


def test_a_relative_storage_path_becomes_absolute_and_uris_stay_as_they_are(tmp_path, monkeypatch):
    from trainer.config.flags import TrainConfig
    from trainer.config.load import absolute_storage

    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(model="m", dataset="d.jsonl")
    assert cfg.storage_path == "runs"
    assert absolute_storage(cfg).storage_path == str(tmp_path / "runs")
    assert absolute_storage(cfg).run_uri == str(tmp_path / "runs" / cfg.resolved_run_name)
    for kept in ("s3://b/runs", "file:///x/runs", str(tmp_path / "abs")):
        same = TrainConfig(model="m", dataset="d.jsonl", storage_path=kept)
        assert absolute_storage(same) is same


def test_a_folder_on_the_head_is_refused_for_a_cluster_of_several_nodes():
    from trainer.jobs.cluster import shared_storage_problem

    assert shared_storage_problem(1, False, "/home/ray/trainer-runs/x") is None
    for nodes, grows, why in ((3, False, "it has 3 nodes"), (1, True, "its autoscaler can add nodes")):
        problem = shared_storage_problem(nodes, grows, "/home/ray/trainer-runs/x")
        assert why in problem and "--storage-path s3://" in problem and "/home/ray/trainer-runs/x" in problem


def test_the_session_cluster_is_one_node_so_submit_accepts_no_storage(ray_cluster):
    """The check `submit --address` makes before submitting, against the real State API of a `ray start` cluster."""
    from ray.job_submission import JobSubmissionClient

    from trainer.submit.cli import check_nodes_share_storage

    check_nodes_share_storage(JobSubmissionClient(ray_cluster.dashboard_url), "~/trainer-runs")  # raises if not


def test_a_submitted_job_streams_its_logs_and_succeeds(succeeded):
    proc, run = succeeded
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Submitted run submit-ok" in proc.stdout and "the cluster's CHECKPOINT_URI/submit-ok" in proc.stdout
    assert "done: run folder" in proc.stdout  # the job's own output, streamed back
    assert "Run submit-ok: SUCCEEDED" in proc.stderr
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [2, 4]
    assert (run / "model" / "config.json").is_file()
    # the workers trained with the --chat-template file, which the exported tokenizer keeps
    assert (run / "model" / "chat_template.jinja").read_text().startswith(SHIPPED_TEMPLATE)


def test_the_entrypoint_runs_the_first_python_that_has_ray_and_torch(tmp_path):
    from trainer.submit.job import entrypoint

    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python", "python3"):  # a system python without torch first on PATH, as on a bare `ray start`
        (fake / name).write_text("#!/bin/sh\nexit 1\n")
        (fake / name).chmod(0o755)
    command = entrypoint(["-c", "import sys, torch; print(sys.executable)"])
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{fake}{os.pathsep}/usr/bin{os.pathsep}/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == sys.executable
    (fake / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # one that has them: it wins
    proc = subprocess.run(["sh", "-c", entrypoint(["-c", "print('ran')"])], capture_output=True, text=True,
                          timeout=120, env={"PATH": f"{fake}{os.pathsep}/usr/bin{os.pathsep}/bin"})
    assert proc.stdout.strip() == "ran"
    (fake / "python").write_text("#!/bin/sh\nexit 1\n")
    nothing = entrypoint(["-c", "pass"]).replace(shlex.quote(sys.executable), "/nonexistent/python")
    proc = subprocess.run(["sh", "-c", nothing], capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{fake}{os.pathsep}/usr/bin{os.pathsep}/bin"})
    assert proc.returncode == 127 and "no python with ray and torch" in proc.stderr


def test_ray_address_is_the_default_dashboard_address(ray_cluster, succeeded):
    env = {**ray_cluster.client_env(), "RAY_ADDRESS": ray_cluster.dashboard_url}
    proc = cli("status", "submit-ok", env=env)
    assert proc.returncode == 0 and "SUCCEEDED" in proc.stderr, proc.stderr


def test_status_and_logs_of_a_finished_run(ray_cluster, succeeded):
    status = cli("status", "submit-ok", "--address", ray_cluster.dashboard_url, env=ray_cluster.client_env())
    assert status.returncode == 0 and "SUCCEEDED" in status.stderr
    logs = cli("logs", "submit-ok", "--address", ray_cluster.dashboard_url, env=ray_cluster.client_env())
    assert logs.returncode == 0 and "done: run folder" in logs.stdout
    missing = cli("status", "no-such-run", "--address", ray_cluster.dashboard_url, env=ray_cluster.client_env())
    assert missing.returncode == 2 and "no run named 'no-such-run'" in missing.stderr


def test_a_missing_token_is_named_as_the_cause(ray_cluster):
    proc = cli("status", "submit-ok", "--address", ray_cluster.dashboard_url, env=without_token(ray_cluster.client_env()))
    assert proc.returncode == 2
    assert "requires a token: set RAY_AUTH_TOKEN" in proc.stderr


def test_a_wrong_token_is_named_as_the_cause(ray_cluster):
    env = {**ray_cluster.client_env(), "RAY_AUTH_TOKEN": "not-the-token"}
    proc = cli("status", "submit-ok", "--address", ray_cluster.dashboard_url, env=env)
    assert proc.returncode == 2
    assert "rejected the token: RAY_AUTH_TOKEN is wrong" in proc.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_address_fails_fast_with_the_address(ray_cluster):
    address = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    proc = cli("status", "x", "--address", address, env=ray_cluster.client_env(), timeout=120)
    assert proc.returncode == 2 and f"cannot reach the Ray dashboard at {address}" in proc.stderr
    assert time.monotonic() - started < 60  # a guard against hanging, not a speed target


def test_a_silent_server_times_out_within_the_bound(ray_cluster):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = cli("status", "x", "--address", address, "--timeout", "2", env=ray_cluster.client_env(), timeout=120)
    assert proc.returncode == 2 and "within 2 s" in proc.stderr


def test_bad_training_flags_fail_before_anything_is_submitted(ray_cluster, job_args):
    _, args = job_args
    proc = cli("submit", "--address", ray_cluster.dashboard_url, "--run-name", "never",
               *args, "--global-batch-size", "7", env=ray_cluster.client_env())
    assert proc.returncode == 2 and "--global-batch-size" in proc.stderr
    assert "Submitted" not in proc.stdout


# --- kubectl port-forward and pulumi stack outputs, through fake executables ------------

FAKE_KUBECTL = '''\
#!{python}
"""Fake kubectl: port-forward proxies to $FAKE_DASHBOARD; get raycluster/secrets print JSON."""
import base64, json, os, socket, sys, threading

args = sys.argv[1:]
with open(os.environ["FAKE_KUBECTL_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if "port-forward" in args:
    local = int(args[args.index("port-forward") + 2].split(":")[0])
    host, port = os.environ["FAKE_DASHBOARD"].rsplit(":", 1)
    with open(os.environ["FAKE_KUBECTL_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))

    def pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    server = socket.create_server(("127.0.0.1", local))
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection((host, int(port)))
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
elif "rayjob" in args or "create" in args:  # RayJobs: one JSON file each in $FAKE_RAYJOBS, as the API server keeps them
    jobs = os.environ["FAKE_RAYJOBS"]
    if "create" in args:
        body = json.load(open(args[args.index("-f") + 1]))
        path = os.path.join(jobs, body["metadata"]["name"] + ".json")
        if os.path.exists(path):
            sys.exit("Error from server (AlreadyExists)")
        json.dump(body, open(path, "w"))
    else:
        path = os.path.join(jobs, args[args.index("rayjob") + 1] + ".json")
        if "get" in args and os.path.exists(path):
            print(open(path).read())
        elif "delete" in args and os.path.exists(path):
            os.remove(path)
elif args[-4:-2] == ["get", "raycluster"] or "raycluster" in args:
    print(json.dumps({{"spec": {{"authOptions": {{"mode": "token"}}}}}}))
elif "secrets" in args:
    token = base64.b64encode(os.environ["FAKE_TOKEN"].encode()).decode()
    print(json.dumps({{"items": [
        {{"metadata": {{"name": "unrelated"}}, "data": {{"auth_token": "eA=="}}}},
        {{"metadata": {{"name": "raytrain-x", "ownerReferences": [{{"kind": "RayCluster", "name": "raytrain"}}]}},
          "data": {{"auth_token": token}}}}]}}))
else:
    sys.exit("fake kubectl: unexpected " + " ".join(args))
'''

FAKE_PULUMI = '''\
#!{python}
import json, os, sys
with open(os.environ["FAKE_PULUMI_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
print(open(os.environ["FAKE_PULUMI_OUTPUTS"]).read())
'''


@pytest.fixture
def fake_tools(ray_cluster, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("kubectl", FAKE_KUBECTL), ("pulumi", FAKE_PULUMI)):
        path = bin_dir / name
        path.write_text(textwrap.dedent(text).format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"rayNamespace": "ray", "rayHeadService": "raytrain-head-svc",
                                   "rayClusterName": "raytrain", "kubeconfig": '{"apiVersion": "v1"}',
                                   "gpuNodeType": "g6.12xlarge", "gpuNodeCount": 2}))
    env = {**without_token(ray_cluster.client_env()),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_DASHBOARD": ray_cluster.dashboard_url.removeprefix("http://"),
           "FAKE_TOKEN": ray_cluster.token,
           "FAKE_KUBECTL_LOG": str(tmp_path / "kubectl.log"),
           "FAKE_KUBECTL_PIDFILE": str(tmp_path / "kubectl.pid"),
           "FAKE_PULUMI_LOG": str(tmp_path / "pulumi.log"),
           "FAKE_PULUMI_OUTPUTS": str(outputs),
           "FAKE_RAYJOBS": str(tmp_path)}
    return env, tmp_path


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat_file = Path(f"/proc/{pid}/stat")
    return not (stat_file.exists() and stat_file.read_text().split()[2] == "Z")


def test_port_forward_path_reads_the_token_from_the_raycluster_secret_and_closes(fake_tools, succeeded):
    env, tmp = fake_tools
    proc = cli("status", "submit-ok", "--namespace", "ray", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "SUCCEEDED" in proc.stderr
    calls = _calls(tmp / "kubectl.log")
    forward = next(c for c in calls if "port-forward" in c)
    assert forward[:3] == ["-n", "ray", "port-forward"] and forward[3] == "svc/raytrain-head-svc"
    assert forward[4].endswith(":8265") and forward[-2:] == ["--address", "127.0.0.1"]
    assert any("secrets" in c for c in calls)
    time.sleep(0.5)
    assert not _alive(int((tmp / "kubectl.pid").read_text()))  # the port-forward is closed afterwards


def test_status_logs_and_stop_of_a_rayjob_show_its_attempt_and_follow_its_current_ray_job(fake_tools, succeeded):
    """A RayJob as KubeRay reports it after a failed first attempt and a second that succeeded on its cluster
    (here the session's, through the fake port-forward): `status` shows the attempt, `logs` streams that
    attempt's Ray job, `stop` deletes the RayJob through the Kubernetes API."""
    env, tmp = fake_tools
    (tmp / "submit-ok.json").write_text(json.dumps({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "submit-ok", "namespace": "ray"},
        "spec": {"entrypoint": "python -m trainer train", "backoffLimit": 2},
        "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "failed": 1, "succeeded": 1,
                   "rayClusterName": "raytrain", "jobId": "submit-ok"}}))
    status = cli("status", "submit-ok", "--rayjob", "--namespace", "ray", env=env, timeout=120)
    assert status.returncode == 0, status.stderr
    assert ("RayJob submit-ok: Complete, Ray job SUCCEEDED, attempt 2 of 3, 1 failed, cluster raytrain, "
            "job id submit-ok") in status.stderr
    logs = cli("logs", "submit-ok", "--rayjob", "--namespace", "ray", env=env, timeout=120)
    assert logs.returncode == 0, logs.stderr[-2000:]
    assert "done: run folder" in logs.stdout and "attempt 2 of 3" in logs.stderr
    forward = next(c for c in _calls(tmp / "kubectl.log") if "port-forward" in c)
    assert forward[3] == "svc/raytrain-head-svc"  # the head of the cluster the RayJob's status names
    stop = cli("stop", "submit-ok", "--rayjob", "--namespace", "ray", env=env, timeout=120)
    assert stop.returncode == 0 and "deleted" in stop.stdout, stop.stderr
    assert ["-n", "ray", "delete", "rayjob", "submit-ok", "--ignore-not-found", "--wait=true"] in _calls(tmp / "kubectl.log")
    gone = cli("status", "submit-ok", "--rayjob", "--namespace", "ray", env=env, timeout=120)
    assert gone.returncode == 2 and "no RayJob named 'submit-ok'" in gone.stderr


def test_a_rayjob_is_created_once_and_a_finished_one_is_replaced_while_a_running_one_is_refused(fake_tools):
    """Creation through the Kubernetes API (kubectl create -f), the resubmission rule of plain jobs kept."""
    from trainer.submit import rayjob
    from trainer.submit.rayjob_commands import replace_finished
    from trainer.submit.target import SubmitError, Target

    env, tmp = fake_tools
    target = Target(None, "ray", "raytrain-head-svc", "raytrain")
    body = rayjob.manifest(name="again", namespace="ray", entrypoint="python -c pass", runtime_env={},
                           caps=rayjob.Caps(retries=1), cluster_spec={"headGroupSpec": {}})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        replace_finished(target, "again")  # none yet: nothing to do
        rayjob.create(target, body)
        assert json.loads((tmp / "again.json").read_text()) == body
        running = {**body, "status": {"jobDeploymentStatus": "Running"}}
        (tmp / "again.json").write_text(json.dumps(running))
        with pytest.raises(SubmitError, match="RayJob again exists and is Running"):
            replace_finished(target, "again")
        (tmp / "again.json").write_text(json.dumps({**body, "status": {"jobDeploymentStatus": "Failed"}}))
        replace_finished(target, "again")
        assert not (tmp / "again.json").exists()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_stack_outputs_name_the_service_and_kubeconfig(fake_tools, succeeded):
    env, tmp = fake_tools
    proc = cli("status", "submit-ok", "--stack", "dev", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _calls(tmp / "pulumi.log") == [["stack", "output", "--json", "--show-secrets", "--stack", "dev"]]
    forward = next(c for c in _calls(tmp / "kubectl.log") if "port-forward" in c)
    kubeconfig = forward[forward.index("--kubeconfig") + 1]
    assert not Path(kubeconfig).exists()  # the secret kubeconfig does not outlive the command


def test_local_inputs_are_refused_for_a_port_forwarded_cluster(fake_tools, job_args):
    env, tmp = fake_tools
    _, args = job_args
    scratch = tmp / "scratch"  # where tempfile puts the kubeconfig (TMPDIR)
    scratch.mkdir()
    proc = cli("submit", "--stack", "dev", "--run-name", "remote", *args, env={**env, "TMPDIR": str(scratch)},
               timeout=120)
    assert proc.returncode == 2
    assert "--dataset" in proc.stderr and "cluster cannot read" in proc.stderr
    assert list(scratch.iterdir()) == []  # the secret kubeconfig is removed on the refusal path too


@pytest.mark.parametrize("argv, error", [
    (["submit", "--model", "m", "--dataset", "s3://b/d.jsonl", "--storage-path", "s3://b/runs", "--device", "gpu",
      "--env", "NCCL_DEBUG=WARN"], "--env NCCL_DEBUG=WARN"),
    (["nccl-bench", "--instance-type", "m7i.large"], "--instance-type m7i.large: not in the instance catalog"),
])
def test_every_refusal_removes_the_stacks_kubeconfig(fake_tools, argv, error):
    env, tmp = fake_tools
    scratch = tmp / "scratch"
    scratch.mkdir()
    proc = cli(*argv, "--stack", "dev", env={**env, "TMPDIR": str(scratch)}, timeout=120)
    assert proc.returncode == 2 and error in proc.stderr, proc.stderr
    assert list(scratch.iterdir()) == []


def test_submit_with_a_stack_trains_on_every_gpu_of_the_stack_unless_flags_say_otherwise():
    import argparse

    from trainer.config.load import from_args
    from trainer.submit.target import choose_pool, stack_defaults

    outputs = {"gpuNodeType": "g6.12xlarge", "gpuNodeCount": 2, "checkpointBucketUri": "s3://ckpt/runs"}
    defaults = stack_defaults(outputs, choose_pool(outputs, None))  # the one GPU pool (tests/trainer/test_pools.py)
    base = {"model": "Qwen/Qwen2.5-1.5B", "dataset": "s3://ckpt/data/train.jsonl", "config": None}
    cfg = from_args(argparse.Namespace(**base), defaults)
    assert (cfg.device, cfg.num_workers, cfg.storage_path) == ("gpu", 8, "s3://ckpt/runs")  # 2 nodes x 4 L4
    cfg = from_args(argparse.Namespace(**base, num_workers=4, device="cpu"), defaults)
    assert (cfg.device, cfg.num_workers) == ("cpu", 4)
    assert stack_defaults({"checkpointBucketUri": "s3://b"}) == {"storage_path": "s3://b"}


def test_nccl_bench_runs_as_a_job_over_gloo(ray_cluster):
    proc = cli("nccl-bench", "--address", ray_cluster.dashboard_url, "--device", "cpu", "--workers", "2",
               "--max-bytes", "4096", "--iters", "2", "--warmup", "1", "--instance-type", "g6.12xlarge",
               env=ray_cluster.client_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "algbw (GB/s)" in proc.stdout and "busbw (GB/s)" in proc.stdout
    row = re.compile(r"(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$")  # after Ray's "(RayTrainWorker ...)" prefix
    sizes = [int(m.group(1)) for m in map(row.search, proc.stdout.splitlines()) if m]
    assert sizes[:10] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert "2 ranks on 1 node(s), backend gloo" in proc.stdout


# --- the NCCL debug file's directory (GPU jobs) -----------------------------------------------------

PROBE = '''
import os, sys
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from trainer import efa

def where():
    return os.getpid(), str(efa.debug_file_dir(os.environ["NCCL_DEBUG_FILE"])), \\
        efa.debug_file_dir(os.environ["NCCL_DEBUG_FILE"]).is_dir()

def train_fn(_):
    pid, folder, exists = where()
    print(f"PROBE train-worker pid={pid} dir={folder} exists={exists}", flush=True)
    assert exists, folder

ray.init()
pid, folder, exists = ray.get(ray.remote(where).remote())
print(f"PROBE task pid={pid} dir={folder} exists={exists}", flush=True)
TorchTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2),
             run_config=RunConfig(name="nccl-dir-probe", storage_path=sys.argv[1])).fit()
print("PROBE done", flush=True)
'''


def test_a_gpu_jobs_nccl_debug_file_directory_exists_in_every_worker_before_nccl_starts(ray_cluster, tmp_path):
    """The job as `submit` sets it up for a GPU run, on a fresh, empty /tmp/ray-like folder.

    NCCL opens NCCL_DEBUG_FILE with fopen at its first call and creates no directory (NCCL
    src/debug.cc): without the folder, the output goes to stdout and the EFA check finds nothing.
    Ray runs the job's worker_process_setup_hook in every worker process before the worker's main
    loop (ray/_private/workers/default_worker.py), so before any task, actor constructor or Ray
    Train's process-group setup, where NCCL starts. Fails on a runtime_env without the hook.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    from trainer import efa
    from trainer.config import load as config
    from trainer.submit import job as submit

    ray_tmp = tmp_path / "ray"  # what the pod's empty /tmp/ray volume is at start
    ray_tmp.mkdir()
    cfg = config.parse(["--model", "m", "--dataset", "d.jsonl", "--device", "gpu"])
    env = submit.job_environment(cfg, None, {}, log_dir=str(ray_tmp / "nccl"))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == f"{ray_tmp}/nccl/nccl.%h.%p.log"
    working_dir = submit.stage_package(tmp_path / "job")
    (working_dir / "probe.py").write_text(PROBE)
    spec = submit.runtime_env(working_dir, [], env)
    assert spec["worker_process_setup_hook"] == efa.SETUP_HOOK
    assert not (ray_tmp / "nccl").exists()

    client = JobSubmissionClient(ray_cluster.dashboard_url)
    job = submit.submit_when_ready(client, entrypoint=submit.entrypoint(["probe.py", str(tmp_path / "runs")]),
                                   runtime_env=spec, submission_id="nccl-dir-probe")  # the python with ray, as jobs
    deadline = time.monotonic() + 300
    while not client.get_job_status(job).is_terminal() and time.monotonic() < deadline:
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, logs[-3000:]
    probes = re.findall(r"PROBE (task|train-worker) pid=(\d+) dir=(\S+) exists=(\w+)", logs)
    assert {kind for kind, *_ in probes} == {"task", "train-worker"}
    assert len({pid for kind, pid, *_ in probes if kind == "train-worker"}) == 2
    assert all(folder == str(ray_tmp / "nccl") and exists == "True" for _, _, folder, exists in probes), probes


def test_lowering_nccl_debug_needs_the_efa_check_off():
    from trainer.config import load as config
    from trainer.submit import job as submit

    cfg = config.parse(["--model", "m", "--dataset", "d.jsonl", "--device", "gpu"])
    with pytest.raises(submit.SubmitError, match=r"--env NCCL_DEBUG=WARN: the EFA check reads NCCL's INFO lines"):
        submit.job_environment(cfg, None, {"NCCL_DEBUG": "WARN"})
    assert submit.job_environment(cfg, False, {"NCCL_DEBUG": "WARN"})["NCCL_DEBUG"] == "WARN"
    assert submit.job_environment(cfg, True, {"NCCL_DEBUG": "TRACE"})["NCCL_DEBUG"] == "TRACE"
    cpu = config.parse(["--model", "m", "--dataset", "d.jsonl", "--device", "cpu"])
    assert submit.job_environment(cpu, None, {}) == {}
    assert "worker_process_setup_hook" not in submit.runtime_env(Path("."), [], {})


def test_submit_rayjob_uploads_the_package_and_creates_the_rayjob_through_the_kubernetes_api(
        s3, demo_assets, trainer_cache, tmp_path):  # noqa: F811 - the moto fixture imported above
    """The whole `submit --stack dev --rayjob` path with only the APIs mocked: the stack's outputs from a fake
    `pulumi` (the offline plan's, with the bucket on moto's S3), the Kubernetes API behind a fake `kubectl`,
    S3 as moto's server (pyarrow reaches it through AWS_ENDPOINT_URL_S3). The pre-flight reads the model and
    data from that bucket; the package lands under _packages/ by its sha256 and unpacks to what the job runs."""
    import io
    import zipfile

    import boto3
    import yaml

    from deploy import offline
    from tests.stacks import read_stack_file
    from trainer.submit import rayjob

    run = offline.run(read_stack_file("dev", REPO), stack="dev")  # what deploy.stack_outputs prints
    offline_outputs = json.loads(json.dumps({k: offline.plain(v) for k, v in run.outputs.items()}, default=str))
    env_s3 = {"AWS_ENDPOINT_URL_S3": f"http://{s3.endpoint}", "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
              "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}
    client = boto3.client("s3", endpoint_url=f"http://{s3.endpoint}", aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name=REGION)
    for path in Path(demo_assets["model"]).iterdir():
        client.upload_file(str(path), BUCKET, f"models/tiny/{path.name}")
    client.upload_file(str(demo_assets["train"]), BUCKET, "data/train.jsonl")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("kubectl", FAKE_KUBECTL), ("pulumi", FAKE_PULUMI)):
        (bin_dir / name).write_text(textwrap.dedent(text).format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    outputs = {**offline_outputs, "checkpointBucketUri": f"s3://{BUCKET}/runs", "kubeconfig": '{"apiVersion": "v1"}'}
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    env = {**os.environ, **env_s3, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_KUBECTL_LOG": str(tmp_path / "kubectl.log"), "FAKE_PULUMI_LOG": str(tmp_path / "pulumi.log"),
           "FAKE_PULUMI_OUTPUTS": str(tmp_path / "outputs.json"), "FAKE_RAYJOBS": str(tmp_path),
           "TRAINER_CACHE": str(trainer_cache)}
    proc = cli("submit", "--stack", "dev", "--rayjob", "--model", f"s3://{BUCKET}/models/tiny", "--dataset",
               f"s3://{BUCKET}/data/train.jsonl", "--run-name", "e2e", "--max-hours", "1", "--retries", "1",
               "--seq-len", "128", "--global-batch-size", "8", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Created RayJob e2e in namespace ray" in proc.stdout and "status e2e --stack dev --rayjob" in proc.stdout
    job = json.loads((tmp_path / "e2e.json").read_text())  # what the API server was given
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (1, 3600)
    assert spec["rayClusterSpec"] == offline_outputs["rayJobClusterSpec"]
    working_dir = yaml.safe_load(spec["runtimeEnvYAML"])["working_dir"]
    key = working_dir.removeprefix(f"s3://{BUCKET}/")
    assert key.startswith(f"runs/{rayjob.PACKAGES}/") and key.endswith(".zip")
    data = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert key == f"runs/{rayjob.PACKAGES}/{hashlib.sha256(data).hexdigest()}.zip"
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert {"job/job.yaml", "job/trainer/__main__.py", "job/facts/ray.py"} <= set(names)
    config = yaml.safe_load(zipfile.ZipFile(io.BytesIO(data)).read("job/job.yaml"))
    assert config["storage_path"] == f"s3://{BUCKET}/runs" and config["run_name"] == "e2e"
    creates = [c for c in _calls(tmp_path / "kubectl.log") if "create" in c]
    assert len(creates) == 1 and creates[0][:2] == ["--kubeconfig", creates[0][1]]
